"""The broker's and the client's per-request work made cheaper (issue 26, 32 senders): each fast path
gives exactly what the plain code it replaced gives — the same series, the same bytes, the same
answers."""

from __future__ import annotations

import asyncio
import random
import types
from typing import Any

import pytest
from prometheus_client import generate_latest

from broker.client.autobatch import AutoBatcher
from broker.client.message import MessageQueue, SendItem, SendResult, SendStatus, send_result_from_answer
from broker.client.transport import ClientError
from broker.server import metrics as metrics_mod
from broker.server.metrics import OTHER, BrokerMetrics, RateWindow
from broker.store.dedup import DedupWindow, SendDeduper
from dledger.clock import ManualClock


def _metrics(clock: ManualClock, limit: int) -> BrokerMetrics:
    cfg = types.SimpleNamespace(cluster="C", broker_name="B", dledger=types.SimpleNamespace(self_id="n0"))
    m = BrokerMetrics(types.SimpleNamespace(cfg=cfg, clock=clock))
    m._topics = metrics_mod._Bounded(limit)
    m.producer_rate = RateWindow(clock, keys_max=limit)
    return m


def _sent_plain(m: BrokerMetrics, topic: str, count: int, nbytes: int, seconds: float) -> None:
    """``BrokerMetrics.sent`` as it was: every series looked up by its labels on every call."""
    t = m._topics.admit(topic, OTHER)
    m.messages_in.labels(**m.base, topic=t).inc(count)
    m.throughput_in.labels(**m.base, topic=t).inc(nbytes)
    m.send_latency.labels(**m.base, topic=t).observe(seconds)
    m.producer_rate.add(m.producer_rate.key(t, OTHER), count)


def _series(m: BrokerMetrics) -> list[bytes]:
    """The exposition's lines but the ``_created`` ones (the wall time a child was made)."""
    return [line for line in generate_latest(m.registry).splitlines() if b"_created" not in line]


def test_sent_with_cached_children_equals_the_plain_lookups() -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rnd = random.Random(seed)
    clock_a, clock_b = ManualClock(), ManualClock()
    fast, plain = _metrics(clock_a, 4), _metrics(clock_b, 4)
    topics = [f"T{i}" for i in range(9)]  # past the bound: later topics count under OTHER
    for _ in range(600):
        topic = rnd.choice(topics)
        count, nbytes, seconds = rnd.randint(1, 64), rnd.randint(0, 1 << 20), rnd.random() / 50
        fast.sent(topic, count, nbytes, seconds)
        _sent_plain(plain, topic, count, nbytes, seconds)
        step = rnd.random() * 0.7
        clock_a.advance(step)
        clock_b.advance(step)
    assert _series(fast) == _series(plain)
    assert fast.producer_rate.rates() == plain.producer_rate.rates()
    assert OTHER in fast.producer_rate.rates()
    assert len(fast._sent_children) <= 5  # the bound's topics and OTHER


def _result_plain(answer: Any, mq: MessageQueue, index: int | None = None) -> SendResult:
    """``send_result_from_answer`` as it was: the dataclasses' own constructors, a list per answer."""
    try:
        raw = answer["results"]
        queue_id = answer.get("queue_id", mq.queue_id)
        if index is not None:
            one = raw[index]
            raw = (one,)
            queue_id = one.get("queue_id", queue_id)
        results = [
            SendItem(str(r["msg_id"]), str(r["unique_id"]), int(r["queue_offset"]), int(r.get("position", -1)))
            for r in raw
        ]
        broker = answer.get("broker_name", mq.broker_name)
        if type(queue_id) is int and queue_id == mq.queue_id and broker == mq.broker_name:
            stored_mq = mq
        else:
            stored_mq = MessageQueue(mq.topic, str(broker), int(queue_id))
        status = answer.get("status", "SEND_OK")
        first = results[0]
        return SendResult(
            status=SendStatus(status), msg_id=first.msg_id, unique_id=first.unique_id, message_queue=stored_mq,
            queue_offset=first.queue_offset, store_ts=int(answer.get("store_ts", 0)), items=tuple(results),
        )
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise ClientError("BAD_ANSWER", f"unexpected send answer: {exc!r}") from None


def _outcome(f: Any, *args: Any) -> Any:
    try:
        r = f(*args)
    except ClientError as exc:
        return ("error", exc.code, exc.message)
    return ("ok", r, repr(r), hash(r), r.__dict__, [i.__dict__ for i in r.items])


def test_send_result_from_answer_equals_the_dataclass_constructors() -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rnd = random.Random(seed)
    mq = MessageQueue("T", "B", 1)

    def result(i: int) -> Any:
        r: dict[str, Any] = {"msg_id": f"B:{i:016X}", "unique_id": f"{i:032X}", "queue_offset": i}
        if rnd.random() < 0.8:
            r["position"] = i * 1000
        if rnd.random() < 0.5:
            r["queue_id"] = rnd.choice([1, 2, "1"])
        if rnd.random() < 0.03:
            r[rnd.choice(["msg_id", "unique_id", "queue_offset"])] = rnd.choice([None, "x", [1]])
        if rnd.random() < 0.02:
            del r["msg_id"]
        return r if rnd.random() > 0.01 else "not a map"

    seen = set()
    for _ in range(3000):
        answer: Any = {"results": [result(i) for i in range(rnd.randint(0, 5))]}
        choices: list[tuple[str, list[Any]]] = [
            ("status", ["SEND_OK", "FLUSH_DISK_TIMEOUT", "NOPE"]), ("queue_id", [1, 3, "x"]),
            ("broker_name", ["B", "C"]), ("store_ts", [7, "8", None]),
        ]
        for key, values in choices:
            if rnd.random() < 0.5:
                answer[key] = rnd.choice(values)
        if rnd.random() < 0.02:
            answer = rnd.choice([{}, [], {"results": {0: {}}}, {"results": None}])
        for index in [None, *range(-1, 6)]:
            got, want = _outcome(send_result_from_answer, answer, mq, index), _outcome(_result_plain, answer, mq, index)
            assert got == want, (answer, index)
            seen.add(got[0])
    assert seen == {"ok", "error"}


async def test_in_flight_attempts_per_topic_wait_and_leave_nothing_behind() -> None:
    """Overlapping attempts of one unique id (a retry racing its first attempt), other topics and a
    failed append: a waiter waits for every attempt holding its ids, and the per-topic maps are
    empty once all attempts ended (memory bounded by what is in flight)."""
    d = SendDeduper(DedupWindow())
    gates = {name: asyncio.get_running_loop().create_future() for name in ("a", "b", "c")}

    def append(name: str) -> Any:
        async def run() -> str:
            await gates[name]
            return name
        return run

    a = asyncio.ensure_future(d.appending("T", ["u1", "u2", "u2"], append("a")))
    b = asyncio.ensure_future(d.appending("T", ["u2", "u3"], append("b")))  # takes u2 over from a
    c = asyncio.ensure_future(d.appending("U", ["u1"], append("c")))
    await asyncio.sleep(0)
    w1 = asyncio.ensure_future(d.wait_in_flight("T", ["u1"], 30.0))
    w2 = asyncio.ensure_future(d.wait_in_flight("T", ["u2"], 30.0))
    w9 = asyncio.ensure_future(d.wait_in_flight("T", ["u9"], 30.0))
    await asyncio.sleep(0)
    assert w9.done() and not w1.done() and not w2.done()
    gates["a"].set_result(None)
    assert await a == "a"
    await asyncio.wait_for(w1, 1.0)
    await asyncio.sleep(0)
    assert not w2.done()  # u2 is b's now
    assert set(d._in_flight) == {"T", "U"} and set(d._in_flight["T"]) == {"u2", "u3"}
    gates["b"].set_exception(TimeoutError())
    with pytest.raises(TimeoutError):
        await b
    await asyncio.wait_for(w2, 1.0)
    assert set(d._in_flight) == {"U"}
    gates["c"].set_result(None)
    assert await c == "c"
    assert d._in_flight == {}
    # b's ids were remembered after its unknown outcome; w2 then found the log applied and forgot u2
    assert set(d._uncertain) == {("T", "u3")}


async def test_autobatch_callers_time_out_at_their_own_deadlines_with_one_timer_per_batch() -> None:
    """One batch, callers with deadlines in any order: each caller whose deadline passes while the
    batch is unanswered gets its own TIMEOUT, the others their results once it is answered; the
    batch's timer is gone afterwards."""
    loop = asyncio.get_running_loop()
    release: asyncio.Future[None] = loop.create_future()

    async def send_items(mq: MessageQueue, items: list[dict[str, Any]], deadline: float) -> Any:
        await release
        return {"status": "SEND_OK", "broker_name": "B", "queue_id": mq.queue_id, "store_ts": 1,
                "results": [{"msg_id": f"B:{i:016X}", "unique_id": it["unique_id"], "queue_offset": i,
                             "position": i} for i, it in enumerate(items)]}

    ab = AutoBatcher(send_items, max_count=8)
    mq = MessageQueue("T", "B", 0)
    now = loop.time()
    offsets = [10.0, 0.05, 10.0, 0.02, 0.05, 10.0]  # the short ones in no particular order
    calls = [asyncio.ensure_future(ab.send(mq, {"body": b"x", "unique_id": f"u{i}"}, now + off))
             for i, off in enumerate(offsets)]
    short = [c for c, off in zip(calls, offsets, strict=True) if off < 1]
    await asyncio.wait_for(asyncio.wait(short), 5.0)
    for c in short:
        exc = c.exception()
        assert isinstance(exc, ClientError) and exc.code == "TIMEOUT"
    assert not any(c.done() for c, off in zip(calls, offsets, strict=True) if off > 1)
    release.set_result(None)
    results = await asyncio.wait_for(asyncio.gather(*(c for c, off in zip(calls, offsets, strict=True) if off > 1)),
                                     5.0)
    assert [r.unique_id for r in results] == ["u0", "u2", "u5"]
    await ab.close()
    assert ab.batches == 1 and ab.messages == len(offsets)  # one request for all of them
    assert not ab._open and not ab._tasks
