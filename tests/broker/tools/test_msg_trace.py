"""Message trace end to end on the in-process cluster (two broker groups, ACL on): producers and
push consumers with ``enable_msg_trace`` write their records to RMQ_SYS_TRACE_TOPIC, and
``mqadmin queryMsgTraceById`` shows the message's send (with the leader that stored it) and one
consumption per group; without trace nothing is written; a failed consumption shows as failed,
and its redelivery from the retry topic with its retry count, under the original msgId."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from broker.client import Message, MessageExt, Producer, PushConsumer, SendResult
from broker.client.admin import Admin
from broker.client.trace import TRACE_TOPIC_DEFAULT, decode_records
from broker.client.trace_query import query_msg_trace
from tests.acl_fixtures import ADMIN, PRODUCER, TRACER
from tests.broker.inproc_cluster import InProcBrokerCluster
from tests.broker.tools.conftest import ClusterFactory, Mqadmin
from tests.dledger.harness import wait_until

FAST_LEVELS = " ".join(["1s"] * 18)  # every retry level 1 s
FAST: dict[str, Any] = {
    "suspend_ms": 400,
    "rebalance_interval_s": 0.5,
    "commit_interval_s": 0.2,
    "heartbeat_interval_s": 0.2,
    "consume_from": "FIRST",
    "shutdown_timeout_s": 2.0,
}

Make = Callable[..., PushConsumer]


@pytest.fixture
async def cluster(make_cluster: ClusterFactory) -> InProcBrokerCluster:
    c = await make_cluster(broker_props={"messageDelayLevel": FAST_LEVELS})
    await c.create_topic("T", 2)
    return c


@pytest.fixture
async def consumers(cluster: InProcBrokerCluster) -> AsyncIterator[Make]:
    made: list[PushConsumer] = []

    def make(group: str, listener: Callable[[list[MessageExt], Any], Any], **kwargs: Any) -> PushConsumer:
        c = PushConsumer(group, cluster.namesrv_addr, credentials=TRACER, **{**FAST, **kwargs})
        c.subscribe("T")
        c.register_listener(listener)
        made.append(c)
        return c

    yield make
    for c in made:
        await c.shutdown()


def collector(into: list[MessageExt], status: Callable[[MessageExt], str] = lambda _m: "CONSUME_SUCCESS") -> Any:
    def listener(msgs: list[MessageExt], _ctx: Any) -> str:
        into.extend(msgs)
        return status(msgs[0])

    return listener


async def send_one(cluster: InProcBrokerCluster, body: bytes, *, trace: bool) -> SendResult:
    async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER, enable_msg_trace=trace) as p:
        return await p.send(Message("T", body, tags="TagA", keys="order-1"))
    # leaving the block flushes the trace records (shutdown writes what is queued)


async def trace_of(mqadmin: Mqadmin, msg_id: str, expect: Callable[[list[dict[str, Any]]], bool]) -> Any:
    """The --json timeline once ``expect(events)`` holds (trace writes are asynchronous)."""
    got: dict[str, Any] = {}

    async def ready() -> bool:
        run = await mqadmin("queryMsgTraceById", "-i", msg_id, "--json")
        got["run"] = run
        return run.rc == 0 and expect(run.json()["events"])

    await wait_until(ready, 30, f"the trace of {msg_id}")
    return got["run"].json()


async def test_send_and_consume_show_in_the_trace_with_the_store_host(
    cluster: InProcBrokerCluster, consumers: Make, mqadmin: Mqadmin
) -> None:
    result = await send_one(cluster, b"traced", trace=True)
    seen_a: list[MessageExt] = []
    seen_b: list[MessageExt] = []
    for group, seen in (("cgA", seen_a), ("cgB", seen_b)):
        await consumers(group, collector(seen), enable_msg_trace=True).start()
    await wait_until(lambda: seen_a and seen_b, 30, "both groups consumed the message")

    def complete(events: list[dict[str, Any]]) -> bool:
        return len(events) >= 3

    doc = await trace_of(mqadmin, result.msg_id, complete)
    events = doc["events"]
    assert [(e["type"], e["group"]) for e in events] == [("Pub", "pg"), ("Sub", "cgA"), ("Sub", "cgB")]
    pub = events[0]
    broker_name = result.message_queue.broker_name
    leader = next(g for g in cluster.groups if g.name == broker_name).leader()
    assert leader is not None
    assert pub["store_host"] == leader.addr
    assert (pub["broker_name"], pub["queue_id"], pub["queue_offset"]) == (
        broker_name, result.message_queue.queue_id, result.queue_offset,
    )
    assert (pub["status"], pub["success"], pub["msg_id"], pub["unique_id"]) == (
        "SEND_OK", True, result.msg_id, result.unique_id,
    )
    assert (pub["tags"], pub["keys"], pub["topic"]) == ("TagA", ["order-1"], "T")
    for sub in events[1:]:
        assert (sub["success"], sub["status"], sub["retry_times"], sub["msg_id"]) == (
            True, "CONSUME_SUCCESS", 0, result.msg_id,
        )
        assert sub["cost_ms"] >= 0 and sub["time_ms"] >= pub["time_ms"] - 60_000
    # By unique id too, and as a table.
    run = await mqadmin("queryMsgTraceById", "-i", result.unique_id)
    assert run.rc == 0, run.err
    lines = run.out.splitlines()
    assert any(line.startswith("#Type") for line in lines)
    rows = [line.split()[:2] for line in lines if line.startswith(("Pub ", "Sub "))]
    assert rows == [["Pub", "pg"], ["Sub", "cgA"], ["Sub", "cgB"]]
    assert leader.addr in run.out


async def test_without_trace_nothing_is_written(
    cluster: InProcBrokerCluster, consumers: Make, mqadmin: Mqadmin
) -> None:
    plain = await send_one(cluster, b"plain", trace=False)
    seen: list[MessageExt] = []
    await consumers("cgA", collector(seen)).start()
    await wait_until(lambda: seen, 30, "the message consumed")
    run = await mqadmin("queryMsgTraceById", "-i", plain.msg_id)
    assert run.rc == 1 and "TOPIC_NOT_EXIST" in run.err, (run.out, run.err)  # the trace topic was never made
    # A traced send afterwards creates the trace topic; still nothing of the untraced message in it.
    traced = await send_one(cluster, b"traced", trace=True)
    await trace_of(mqadmin, traced.msg_id, lambda events: len(events) == 1)
    run = await mqadmin("queryMsgTraceById", "-i", plain.msg_id)
    assert run.rc == 1 and "MESSAGE_NOT_FOUND" in run.err, (run.out, run.err)
    async with Admin(cluster.namesrv_addr, credentials=ADMIN) as admin:
        route = await admin.topic_route(TRACE_TOPIC_DEFAULT)
        msgs = []
        for bd in route.broker_datas:
            for q in range(8):
                try:
                    m = await admin.query_msg_by_offset(TRACE_TOPIC_DEFAULT, bd.broker_name, q, 0)
                except Exception:
                    continue
                msgs.append(m)
    records = [r for m in msgs for r in decode_records(m.body)]
    assert [(r.type, r.msg_id) for r in records] == [("Pub", traced.msg_id)]


async def test_a_failed_consumption_and_its_retry_show_status_and_retry_times(
    cluster: InProcBrokerCluster, consumers: Make, mqadmin: Mqadmin
) -> None:
    result = await send_one(cluster, b"fails once", trace=True)
    seen: list[MessageExt] = []
    await consumers(
        "cgR", collector(seen, lambda m: "CONSUME_SUCCESS" if m.reconsume_times else "RECONSUME_LATER"),
        enable_msg_trace=True,
    ).start()
    await wait_until(lambda: len(seen) >= 2, 30, "the message consumed again from the retry topic")

    doc = await trace_of(mqadmin, result.msg_id, lambda events: len(events) >= 3)
    subs = [(e["group"], e["success"], e["status"], e["retry_times"], e["msg_id"]) for e in doc["events"][1:]]
    assert subs == [
        ("cgR", False, "RECONSUME_LATER", 0, result.msg_id),
        ("cgR", True, "CONSUME_SUCCESS", 1, result.msg_id),  # the retry copy, under the original msgId
    ]
    run = await mqadmin("queryMsgTraceById", "-i", result.msg_id)
    assert "failed (RECONSUME_LATER)" in run.out


async def test_trace_topic_enable_makes_every_leader_create_the_trace_topic(make_cluster: ClusterFactory) -> None:
    """RocketMQ's traceTopicEnable: each group's leader creates the trace topic (one queue), so
    traces work with autoCreateTopicEnable off; without it a traced send's records have nowhere
    to go (dropped and counted, the send itself unharmed)."""
    props = {"traceTopicEnable": "true", "autoCreateTopicEnable": "false", "messageDelayLevel": FAST_LEVELS}
    cluster = await make_cluster(broker_props=props)
    await cluster.create_topic("T", 2)
    async with Admin(cluster.namesrv_addr, credentials=ADMIN) as admin:

        async def created() -> bool:
            route = await admin.topic_route(TRACE_TOPIC_DEFAULT)
            return sorted((q.broker_name, q.read_queue_nums, q.write_queue_nums) for q in route.queue_datas) == [
                ("RaftNode00", 1, 1), ("RaftNode01", 1, 1),
            ]

        await wait_until(created, 30, "the trace topic on both groups")
        result = await send_one(cluster, b"traced", trace=True)

        async def traced() -> bool:
            return len((await query_msg_trace(admin, result.msg_id)).sends) == 1

        await wait_until(traced, 30, "the send's trace")


async def test_a_trace_topic_nobody_created_drops_records_and_never_fails_the_send(
    make_cluster: ClusterFactory,
) -> None:
    cluster = await make_cluster(broker_props={"autoCreateTopicEnable": "false"})
    await cluster.create_topic("T", 2)
    async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER, enable_msg_trace=True,
                        send_timeout_s=1.0) as p:
        result = await p.send(Message("T", b"x"))
        assert p.trace is not None
        trace = p.trace
    assert result.msg_id
    assert (trace.appended, trace.written, trace.failed + trace.dropped) == (1, 0, 1)


async def test_query_msg_trace_by_id_refuses_bad_input(mqadmin: Mqadmin) -> None:
    run = await mqadmin("queryMsgTraceById", "-i", "two words")
    assert run.rc == 2 and "INVALID_KEYS" in run.err, (run.out, run.err)
    run = await mqadmin("queryMsgTraceById", "-i", "RaftNode00:0000000000000000", "-t", "bad topic!")
    assert run.rc == 2 and "INVALID_TOPIC" in run.err, (run.out, run.err)
    run = await mqadmin("queryMsgTraceById")
    assert run.rc == 2
