"""Issue 14 item 3: deleting and re-creating a topic under a running push consumer must not lose
messages. Every topic has an *epoch* (the Raft log position of the command that created it, kept in
the replicated metadata); pull answers, topic status and offset reads carry it, and a consumer that
sees a newer epoch restarts that broker group's queues of the topic from the new queues' minimum
(dropping the offsets it held for the old ones). A plain OFFSET_OVERFLOW with the same epoch is a
replica behind and is waited out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.client import Message, MessageExt, MessageQueue, Producer, PushConsumer, queue_worker
from broker.store.metadata import Metadata
from tests.acl_fixtures import CONSUMER, PRODUCER
from tests.broker.inproc_cluster import InProcBrokerCluster
from tests.dledger.harness import wait_until


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[InProcBrokerCluster]:
    baseline = InProcBrokerCluster.baseline()
    c = await InProcBrokerCluster.start(str(tmp_path / "cluster"))
    try:
        yield c
    finally:
        await c.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)


def test_metadata_gives_every_creation_a_new_epoch_and_fences_commits() -> None:
    md = Metadata()
    put = {"op": "topic.put", "topic": "T", "read_queue_nums": 2, "write_queue_nums": 2, "perm": 6}
    md.apply(put, position=100)
    assert md.topic_epoch("T") == 100
    md.apply({**put, "perm": 4}, position=200)  # an update is not a new topic
    assert md.topic_epoch("T") == 100
    commit = {"op": "offset.commit", "group": "g", "topic": "T", "offsets": {0: 5}}
    assert md.apply({**commit, "topic_epoch": 100})["updated"] == 1
    md.apply({"op": "topic.delete", "topic": "T"}, position=300)
    assert md.topic_epoch("T") is None
    md.apply(put, position=400)
    assert md.topic_epoch("T") == 400
    refused = md.apply({**commit, "topic_epoch": 100})
    assert refused["refused"] == "TOPIC_RECREATED" and refused["topic_epoch"] == 400
    assert md.group_offsets("g", "T") == {}
    again = Metadata.from_snapshot(md.to_snapshot())
    assert again.topic_epoch("T") == 400


async def _delete_and_create(cluster: InProcBrokerCluster, topic: str, queue_nums: int) -> None:
    for g in cluster.groups:
        leader = g.leader() or await g.wait_leader(registered=False)
        await cluster.call(leader.addr, "DELETE", f"/v1/topics/{topic}")
    await cluster.create_topic(topic, queue_nums)


async def test_a_topic_deleted_and_created_again_under_a_push_consumer_loses_nothing(
    cluster: InProcBrokerCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failed before the fix: the worker of a queue whose offset (2) was past the new queue's max
    answered OFFSET_OVERFLOW and moved to the leader's max (skipping what was stored meanwhile); one
    whose offset was below the new max read on from its old offset (skipping the new queue's first
    messages); and the old offsets were committed onto the new topic."""
    monkeypatch.setattr(queue_worker, "OVERFLOW_RESET_AFTER_S", 0.5, raising=False)  # the old give-up
    await cluster.create_topic("T", 4)
    bodies: list[bytes] = []

    def listener(msgs: list[MessageExt], _ctx: Any) -> str:
        bodies.extend(m.body for m in msgs)
        return "CONSUME_SUCCESS"

    consumer = PushConsumer("cg", cluster.namesrv_addr, credentials=CONSUMER, consume_from="FIRST",
                            suspend_ms=300, rebalance_interval_s=2, commit_interval_s=0.3,
                            heartbeat_interval_s=1)
    consumer.subscribe("T")
    consumer.register_listener(listener)
    broker = cluster.groups[0].name
    try:
        await consumer.start()
        async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER) as p:
            for i in range(12):  # 3 per queue: every worker reaches offset 3
                await p.send(Message("T", f"old{i}".encode()), queue=MessageQueue("T", broker, i % 4))
        await wait_until(lambda: len(bodies) >= 12, 30, "the first twelve messages")
        await wait_until(lambda: cluster.groups[0].offsets("cg", "T") == dict.fromkeys(range(4), 3), 30, "commits")

        await _delete_and_create(cluster, "T", 4)
        sent = []
        async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER) as p:
            for i in range(10):  # queue 0 gets 4 (past the old offset 3), queue 3 gets 1
                body = f"new{i}".encode()
                qid = min(i, 3) if i < 4 else 0 if i < 7 else 1 + (i - 7) % 3
                await p.send(Message("T", body), queue=MessageQueue("T", broker, qid))
                sent.append(body)
        try:
            await wait_until(lambda: set(sent) <= set(bodies), 30, "every message sent after the re-creation")
        except AssertionError:
            raise AssertionError(f"never delivered: {sorted(set(sent) - set(bodies))}") from None
        expected = {q: cluster.groups[0].max_offset("T", q) for q in range(4)}
        await wait_until(lambda: cluster.groups[0].offsets("cg", "T") == expected, 30, f"committed offsets {expected}")
    finally:
        await consumer.shutdown()
    new_seen = [b for b in bodies if b.startswith(b"new")]
    assert sorted(new_seen) == sorted(sent), "each new message once (no rebalance happened)"


async def test_a_stale_epoch_commit_is_refused(cluster: InProcBrokerCluster) -> None:
    await cluster.create_topic("T", 1)
    leader = cluster.groups[0].leader()
    assert leader is not None
    got = await cluster.call(leader.addr, "GET", "/v1/offsets", params={"group": "g", "topic": "T"})
    old = int(got["topic_epoch"])
    await _delete_and_create(cluster, "T", 1)
    leader = cluster.groups[0].leader()
    assert leader is not None
    status = await cluster.call(leader.addr, "GET", "/v1/topics/T/status")
    assert int(status["topic_epoch"]) > old
    with pytest.raises(Exception, match="TOPIC_RECREATED"):
        await cluster.call(leader.addr, "POST", "/v1/offsets",
                           {"group": "g", "topic": "T", "offsets": {"0": 7}, "topic_epoch": old})
    assert cluster.groups[0].offsets("g", "T") == {}


async def test_a_broadcasting_consumer_restarts_a_re_created_topic_at_its_minimum(
    cluster: InProcBrokerCluster, tmp_path: Path
) -> None:
    """Broadcasting keeps offsets locally (no broker fencing): the pull answers' epoch alone makes the
    consumer drop them and start the new queues at their minimum."""
    await cluster.create_topic("B", 2)
    broker = cluster.groups[0].name
    bodies: list[bytes] = []
    consumer = PushConsumer("bg", cluster.namesrv_addr, credentials=CONSUMER, consume_from="FIRST",
                            message_model="BROADCASTING", offset_dir=str(tmp_path / "offsets"),
                            suspend_ms=300, rebalance_interval_s=1, commit_interval_s=0.3)
    consumer.subscribe("B")
    consumer.register_listener(lambda msgs, _ctx: bodies.extend(m.body for m in msgs) or "CONSUME_SUCCESS")
    try:
        await consumer.start()
        async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER) as p:
            for i in range(6):
                await p.send(Message("B", f"old{i}".encode()), queue=MessageQueue("B", broker, i % 2))
        await wait_until(lambda: len(bodies) >= 6, 30, "the old messages")
        await _delete_and_create(cluster, "B", 2)
        sent = []
        async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER) as p:
            for i in range(5):
                sent.append(f"new{i}".encode())
                await p.send(Message("B", sent[-1]), queue=MessageQueue("B", broker, 0))
        try:
            await wait_until(lambda: set(sent) <= set(bodies), 30, "the new messages")
        except AssertionError:
            raise AssertionError(f"never delivered: {sorted(set(sent) - set(bodies))}") from None
    finally:
        await consumer.shutdown()
