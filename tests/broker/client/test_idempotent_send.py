"""The idempotent producer (broker/store/dedup.py): a retried send whose first attempt was stored is stored
once and answered with the first result — after a lost answer, concurrently, after a failover and
after a restart of the whole group. The lost answer is the Tap's ``lose_answer``: the real broker
stores the message, the client gets SEND_TIMEOUT."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from broker.client import Message, Producer
from tests.acl_fixtures import PRODUCER
from tests.broker.client.conftest import ClusterFactory
from tests.broker.inproc_cluster import WAIT_S, Group, InProcBrokerCluster
from tests.dledger.harness import wait_until

SEED = 20_261_123
UID = "0A0B0C0D0E0F10111213141516171819"


def stored(cluster: InProcBrokerCluster, topic: str, queues: int) -> int:
    return sum(g.max_offset(topic, q) for g in cluster.groups for q in range(queues))


def send_body(topic: str, queue_id: int, unique_id: str = UID, body: bytes = b"once") -> dict[str, Any]:
    return {"topic": topic, "queue_id": queue_id, "messages": [{"body": body, "unique_id": unique_id}]}


async def test_a_retry_after_a_lost_answer_is_stored_once(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=2, topics={"T": 4})
    for g in cluster.groups:  # whichever group the first attempt goes to loses its answer
        g.replicas[0].tap.lose_answer("/v1/send")
    async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER, rng=random.Random(SEED)) as p:
        result = await p.send(Message("T", b"exactly once"))
    sends = [s for s in cluster.journal if s.path == "/v1/send"]
    assert len(sends) == 2, "the first attempt, then one retry"
    assert sends[0].server == sends[1].server  # the retry went where the first may be stored
    assert stored(cluster, "T", 4) == 1
    g = cluster.group(result.message_queue.broker_name)
    (only,) = await g.messages("T", result.message_queue.queue_id)
    assert (only["msg_id"], only["queue_offset"], only["unique_id"]) == (
        result.msg_id, result.queue_offset, result.unique_id,
    )


async def test_without_idempotence_the_retry_is_stored_twice(make_cluster: ClusterFactory) -> None:
    """The same scenario with the window bypassed (another group): what the window prevents."""
    cluster = await make_cluster(n_groups=2, topics={"T": 4})
    for g in cluster.groups:
        g.replicas[0].tap.lose_answer("/v1/send")
    p = Producer("pg", cluster.namesrv_addr, credentials=PRODUCER, rng=random.Random(SEED), enable_idempotence=False)
    async with p:
        await p.send(Message("T", b"twice"))
    assert stored(cluster, "T", 4) == 2


async def test_the_window_answers_in_one_group_concurrently_and_in_batches(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 2})
    g = cluster.groups[0]
    leader = g.replicas[0]
    first = await cluster.call(leader.addr, "POST", "/v1/send", send_body("T", 0))
    again = await cluster.call(leader.addr, "POST", "/v1/send", send_body("T", 1, body=b"other queue, same id"))
    assert again["results"][0]["msg_id"] == first["results"][0]["msg_id"]
    assert again["results"][0]["queue_offset"] == first["results"][0]["queue_offset"] == 0
    assert again["queue_id"] == 0 and again["store_ts"] == first["store_ts"]
    assert stored(cluster, "T", 2) == 1

    uid2 = "1" * 32
    answers = await asyncio.gather(
        *[cluster.call(leader.addr, "POST", "/v1/send", send_body("T", 0, uid2)) for _ in range(4)]
    )
    assert len({a["results"][0]["msg_id"] for a in answers}) == 1
    assert stored(cluster, "T", 2) == 2

    batch = {
        "topic": "T",
        "queue_id": 1,
        "messages": [{"body": b"a", "unique_id": UID}, {"body": b"b", "unique_id": "2" * 32}],
    }
    mixed = await cluster.call(leader.addr, "POST", "/v1/send", batch)
    assert mixed["results"][0]["msg_id"] == first["results"][0]["msg_id"] and mixed["results"][0]["duplicate"]
    assert mixed["results"][1]["queue_offset"] == 0 and "duplicate" not in mixed["results"][1]
    assert stored(cluster, "T", 2) == 3
    # a different topic is a different message
    await cluster.call(leader.addr, "POST", "/v1/send", {**send_body("T", 0), "topic": "U"})
    assert g.max_offset("U", 0) == 1


async def _same_answer_from(cluster: InProcBrokerCluster, g: Group, first: dict[str, Any]) -> None:
    leader = g.leader() or await g.wait_leader(registered=False)
    again = await cluster.call(leader.addr, "POST", "/v1/send", send_body("T", 0))
    assert again["results"][0]["msg_id"] == first["results"][0]["msg_id"]
    assert again["results"][0]["queue_offset"] == first["results"][0]["queue_offset"]
    assert stored(cluster, "T", 1) == 1


async def test_the_window_survives_failover_and_a_restart_of_the_group(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 1})
    g = cluster.groups[0]
    first = await cluster.call(g.replicas[0].addr, "POST", "/v1/send", send_body("T", 0))
    await g.wait_replicated()
    await g.transfer("n1", registered=False)
    await _same_answer_from(cluster, g, first)

    await g.kill("n1")  # a crash of the leader: n0 or n2 takes over
    await wait_until(lambda: g.leader() is not None and g.leader() is not g.replica("n1"), WAIT_S, "a new leader")
    await _same_answer_from(cluster, g, first)
    await g.start("n1")

    for r in g.replicas:  # the whole group down and up: the window comes back from snapshot + log
        await g.stop(r.nid)
    for r in g.replicas:
        await g.start(r.nid)
    await g.wait_leader(registered=False)
    for r in g.replicas:
        assert r.broker.store.dedup.lookup("T", UID) is not None, r
    await _same_answer_from(cluster, g, first)


async def test_a_retried_delayed_send_is_stored_once(make_cluster: ClusterFactory) -> None:
    """A delayed message is stored in the schedule topic, not in the topic it was sent to: the
    window must know it under the topic the producer sent to, or a retried delayed send is stored
    (and later delivered) twice. (Found when merging issues 14 and 15: it was.)"""
    from broker.protocol.properties import SCHEDULE_TOPIC

    cluster = await make_cluster(n_groups=1, topics={"T": 2})
    leader = cluster.groups[0].replicas[0]
    body = {"topic": "T", "queue_id": 0,
            "messages": [{"body": b"later", "unique_id": UID, "properties": {"DELAY": "18"}}]}
    first = await cluster.call(leader.addr, "POST", "/v1/send", body)
    again = await cluster.call(leader.addr, "POST", "/v1/send", body)  # the producer's retry
    assert again["results"][0]["msg_id"] == first["results"][0]["msg_id"]
    g = cluster.groups[0]
    pending = sum(g.max_offset(SCHEDULE_TOPIC, q) for q in range(20))
    assert pending == 1, f"{pending} copies waiting in {SCHEDULE_TOPIC}"
