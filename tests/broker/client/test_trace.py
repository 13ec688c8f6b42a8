"""Message trace without a cluster: the record codec, packing records into trace messages, the
dispatcher's batching and drop-when-full on a hand-driven clock (no sleeps), and narrowing the
records of one message for ``queryMsgTraceById``."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import pytest

from broker.client.message import (
    ConsumeStatus,
    Message,
    MessageExt,
    MessageQueue,
    SendItem,
    SendResult,
    SendStatus,
)
from broker.client.trace import (
    TRACE_KEYS_PER_MESSAGE,
    TRACE_SEND_BYTES_MAX,
    TRACE_SEND_MESSAGES_MAX,
    TraceCodecError,
    TraceDispatcher,
    TraceRecord,
    TraceType,
    consume_records,
    decode_records,
    encode_records,
    record_to_dict,
    send_batches,
    send_records,
    trace_messages,
)
from broker.client.trace_query import TraceTimeline, select_records, timeline_json, timeline_rows
from broker.client.transport import ClientError
from broker.protocol.properties import PROP_ORIGIN_MESSAGE_ID
from tests.dledger.harness import wait_until


def rec(i: int, type_: TraceType = TraceType.PUB, **kw: Any) -> TraceRecord:
    base: dict[str, Any] = {
        "type": type_, "group": "pg", "time_ms": 1_700_000_000_000 + i, "cost_ms": 3, "success": True,
        "status": "SEND_OK", "msg_id": f"RaftNode00:{i:016X}", "unique_id": f"U{i:04d}", "topic": "T",
    }
    base.update(kw)
    return TraceRecord(**base)


def test_record_codec_round_trip() -> None:
    records = [
        rec(1, tags="TagA", keys=("k1", "k2"), broker_name="RaftNode00", store_host="127.0.0.1:10911",
            queue_id=2, queue_offset=41, client_host="10.0.0.1", body_length=5),
        rec(2, TraceType.SUB, group="cg", success=False, status="RECONSUME_LATER", retry_times=3,
            keys=("ü-key",)),
    ]
    assert decode_records(encode_records(records)) == records


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"\xff\xfe",
        json.dumps({"v": 2, "records": []}).encode(),
        json.dumps({"records": []}).encode(),
        json.dumps({"v": 1, "records": {}}).encode(),
        json.dumps({"v": 1, "records": [{"type": "Pub"}]}).encode(),
        json.dumps({"v": 1, "records": [{**record_to_dict(rec(1)), "x": 1}]}).encode(),
        json.dumps({"v": 1, "records": [{**record_to_dict(rec(1)), "type": "Zz"}]}).encode(),
        json.dumps({"v": 1, "records": [{**record_to_dict(rec(1)), "time_ms": "soon"}]}).encode(),
        json.dumps({"v": 1, "records": [{}] * 1025}).encode(),
    ],
)
def test_bad_trace_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(TraceCodecError):
        decode_records(body)


def test_trace_messages_carry_the_traced_ids_as_keys_within_the_brokers_key_limit() -> None:
    records = [rec(i) for i in range(40)]  # two keys each: 16 records per message
    packed = trace_messages("RMQ_SYS_TRACE_TOPIC", records)
    assert [n for _, n in packed] == [16, 16, 8]
    got: list[TraceRecord] = []
    for msg, n in packed:
        assert msg.topic == "RMQ_SYS_TRACE_TOPIC"
        assert len(msg.keys) <= TRACE_KEYS_PER_MESSAGE
        inside = decode_records(msg.body)
        assert len(inside) == n
        assert set(msg.keys) == {k for r in inside for k in (r.msg_id, r.unique_id)}
        got += inside
    assert got == records
    # The send and the consumption of one message share their keys: one message holds both.
    same = [rec(1), *(rec(1, TraceType.SUB, group=f"cg{g}") for g in range(30))]
    assert [n for _, n in trace_messages("X", same)] == [len(same)]


def test_trace_sends_stay_within_a_batch_sends_limits() -> None:
    big = [rec(i, keys=tuple(f"{'k' * 250}{j}" for j in range(30))) for i in range(400)]  # ~8 KB each
    packed = trace_messages("X", big)
    sends = send_batches(packed)
    assert [n for part in sends for _, n in part] == [n for _, n in packed]  # all of them, in order
    for part in sends:
        assert len(part) <= TRACE_SEND_MESSAGES_MAX
        assert sum(len(m.body) for m, _ in part) <= TRACE_SEND_BYTES_MAX
    assert len(sends) > 1


def test_send_and_consume_records() -> None:
    mq = MessageQueue("T", "RaftNode01", 3)
    msgs = [Message("T", b"abc", tags="TagA", keys="k1 k2", unique_id="U1"), Message("T", b"d", unique_id="U2")]
    result = SendResult(SendStatus.SEND_OK, "RaftNode01:00000000000000AA", "U1", mq, 7, 1, (
        SendItem("RaftNode01:00000000000000AA", "U1", 7, 170), SendItem("RaftNode01:00000000000000CC", "U2", 8, 204),
    ))
    pub = send_records("pg", msgs, result, time_ms=5, cost_ms=2, store_host="127.0.0.1:1", client_host="h")
    assert [(r.msg_id, r.unique_id, r.queue_offset, r.keys, r.body_length) for r in pub] == [
        ("RaftNode01:00000000000000AA", "U1", 7, ("k1", "k2"), 3),
        ("RaftNode01:00000000000000CC", "U2", 8, (), 1),
    ]
    assert all(r.store_host == "127.0.0.1:1" and r.broker_name == "RaftNode01" and r.queue_id == 3 for r in pub)
    first = MessageExt("T", 3, 7, "RaftNode01:00000000000000AA", "U1", "TagA", ("k1",), {}, b"abc", 1, "h", 2,
                       170, 90, "RaftNode01")
    retried = dataclasses.replace(first, topic="T", msg_id="RaftNode01:00000000000001FF", reconsume_times=2,
                                  properties={PROP_ORIGIN_MESSAGE_ID: first.msg_id})
    sub = consume_records("cg", [first, retried], ConsumeStatus.RECONSUME_LATER, time_ms=9, cost_ms=4,
                          client_host="c1")
    assert [(r.msg_id, r.retry_times, r.success, r.status) for r in sub] == [
        (first.msg_id, 0, False, "RECONSUME_LATER"), (first.msg_id, 2, False, "RECONSUME_LATER"),
    ]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Sink:
    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[Message]] = []
        self.fail = fail
        self.gate: asyncio.Event | None = None
        self.started = self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def send_batch(self, msgs: Sequence[Message]) -> Any:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise ClientError("TIMEOUT", "no answer")
        self.batches.append(list(msgs))

    async def shutdown(self) -> None:
        self.stopped = True

    def records(self) -> list[TraceRecord]:
        return [r for batch in self.batches for m in batch for r in decode_records(m.body)]


async def test_dispatcher_flushes_by_count_and_by_age() -> None:
    clock, sink = Clock(), Sink()
    d = TraceDispatcher(sink, queue_max=100, batch_max=10, flush_interval_ms=500, clock=clock)
    d._accepting = True  # as start() leaves it, without the background task: this test drives it
    d.append(rec(i) for i in range(3))
    assert d.flush_wait_s(clock()) == pytest.approx(0.5)
    assert await d.flush_due() == 0  # too young, too few
    clock.now += 0.499
    assert await d.flush_due() == 0
    clock.now += 0.001
    assert await d.flush_due() == 3  # the oldest waited flush_interval
    d.append(rec(i) for i in range(3, 28))  # 25: two full batches due at once, 5 wait
    assert d.flush_wait_s(clock()) == 0
    assert await d.flush_due() == 20
    assert d.queued == 5
    clock.now += 0.5
    assert await d.flush_due() == 5
    assert [r.msg_id for r in sink.records()] == [rec(i).msg_id for i in range(28)]
    assert (d.appended, d.written, d.dropped, d.failed) == (28, 28, 0, 0)


async def test_dispatcher_drops_when_full_and_never_waits() -> None:
    clock, sink = Clock(), Sink()
    d = TraceDispatcher(sink, queue_max=5, batch_max=5, flush_interval_ms=500, clock=clock)
    d.append([rec(0)])
    assert d.dropped == 1  # not started: nothing is queued
    d._accepting = True
    d.append(rec(i) for i in range(8))
    assert (d.queued, d.dropped) == (5, 4)
    sink.fail = True
    assert await d.flush_due() == 5  # a failed write drops the batch, counted
    assert (d.queued, d.failed, d.written) == (0, 5, 0)


async def test_dispatcher_background_task_writes_and_shutdown_flushes() -> None:
    """The background task wakes when a batch is full; shutdown writes the rest and stops the sink.
    The sink holds the first write until the test releases it: appends meanwhile never wait."""
    sink = Sink()
    sink.gate = asyncio.Event()
    d = TraceDispatcher(sink, queue_max=50, batch_max=10, flush_interval_ms=60_000)
    await d.start()
    assert sink.started
    d.append(rec(i) for i in range(10))  # a full batch: written at once (no 60 s wait)
    await wait_until(lambda: d.queued == 0, 10, "the task to take the full batch")  # held at the gate
    d.append(rec(i) for i in range(10, 13))
    assert d.queued == 3
    sink.gate.set()
    await d.shutdown()
    assert sink.stopped
    assert [r.msg_id for r in sink.records()] == [rec(i).msg_id for i in range(13)]
    d.append([rec(99)])
    assert d.dropped == 1


def test_select_records_orders_a_timeline_and_skips_foreign_bodies() -> None:
    mid = rec(1).msg_id
    sub_b = rec(1, TraceType.SUB, group="cgB", time_ms=30)
    sub_a2 = rec(1, TraceType.SUB, group="cgA", time_ms=20, retry_times=1)
    sub_a1 = rec(1, TraceType.SUB, group="cgA", time_ms=10, success=False, status="RECONSUME_LATER")
    bodies = [encode_records([sub_b, rec(2), sub_a2]), b"something else", encode_records([sub_a1, rec(1)]),
              encode_records([rec(1)])]  # the send twice (a retried trace write): shown once
    records, unreadable = select_records(mid, bodies)
    assert records == [rec(1), sub_a1, sub_a2, sub_b]
    assert unreadable == 1
    assert select_records("U0001", bodies)[0] == records  # by unique id too
    t = TraceTimeline(mid, "RMQ_SYS_TRACE_TOPIC", tuple(records), unreadable)
    assert [e["type"] for e in timeline_json(t)["events"]] == ["Pub", "Sub", "Sub", "Sub"]
    assert [row[5] for row in timeline_rows(t)] == ["SEND_OK", "failed (RECONSUME_LATER)", "success", "success"]
