"""The push consumer against real broker groups on the in-process log: concurrent and orderly
consumption, offsets that never pass an unconsumed message, tag filters, clustering rebalance,
broadcasting, start positions, follower fallback and flow control."""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from broker.client import (
    ConsumeContext,
    MessageExt,
    MessageQueue,
    PushConsumer,
    allocate_averagely,
)
from broker.client.offset_store import read_offset_file
from broker.client.transport import ClientError
from broker.protocol.auth import Credentials
from tests.acl_fixtures import CONSUMER
from tests.broker.client.conftest import ClusterFactory
from tests.broker.inproc_cluster import WAIT_S, InProcBrokerCluster, Seen
from tests.dledger.harness import wait_until

SEED = 1234
FAST: dict[str, Any] = {
    "suspend_ms": 400,
    "rebalance_interval_s": 0.5,
    "commit_interval_s": 0.1,
    "heartbeat_interval_s": 0.1,
    "redeliver_backoff_s": (0.02, 0.05),
    "orderly_retry_s": 0.02,
    "consume_from": "FIRST",
    "shutdown_timeout_s": 1.0,
}

Make = Callable[..., PushConsumer]


@pytest.fixture
async def consumers() -> AsyncIterator[Make]:
    made: list[PushConsumer] = []

    def make(cluster: InProcBrokerCluster, group: str = "cg", **kwargs: Any) -> PushConsumer:
        c = PushConsumer(group, cluster.namesrv_addr, **{"credentials": CONSUMER, **FAST, **kwargs})
        made.append(c)
        return c

    yield make
    for c in made:
        await c.shutdown()


def all_queues(cluster: InProcBrokerCluster, topic: str, queue_nums: int) -> list[MessageQueue]:
    return sorted(MessageQueue(topic, g.name, q) for g in cluster.groups for q in range(queue_nums))


async def members(cluster: InProcBrokerCluster, group: str) -> dict[str, set[str]]:
    """Each live replica's members of consumer ``group`` (heartbeats are per replica)."""
    out = {}
    for g in cluster.groups:
        for r in g.replicas:
            if r.alive:
                got = await cluster.call(r.addr, "GET", f"/v1/groups/{group}/consumers")
                out[r.tap.name] = set(got["client_ids"])
    return out


async def after_ms(ms: int) -> None:
    """Until the wall clock (which stamps stored messages) has passed ``ms``."""
    await wait_until(lambda: time.time_ns() // 1_000_000 > ms, WAIT_S, f"the wall clock to pass {ms}")


async def test_concurrent_delivers_everything_and_commits_only_consumed(
    make_cluster: ClusterFactory, consumers: Make
) -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    # RECONSUME_LATER sends a message back through %RETRY%cg (delay level 3 + reconsume times): 1 s here
    cluster = await make_cluster(n_groups=2, topics={"T": 4}, broker_props={"messageDelayLevel": " ".join(["1s"] * 18)})
    for g in cluster.groups:
        for q in range(4):
            await g.put("T", q, 20)
    consumed: set[tuple[str, int, int]] = set()
    key_of: dict[str, tuple[str, int, int]] = {}
    handed_back: set[tuple[str, int, int]] = set()  # failed: sent back to %RETRY%cg, then committed past
    attempts: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    violations: list[str] = []
    commits: dict[tuple[str, int], list[int]] = defaultdict(list)
    for g in cluster.groups:

        def hook(seen: Seen, name: str = g.name) -> None:  # as each commit arrives at a replica
            if seen.path != "/v1/offsets" or seen.method != "POST" or seen.body["topic"] != "T":
                return
            for qid_text, off in seen.body["offsets"].items():
                qid = int(qid_text)
                commits[(name, qid)].append(off)
                missing = [o for o in range(off) if (name, qid, o) not in consumed | handed_back]
                if missing:
                    violations.append(f"{name}:{qid} committed {off} before consuming {missing[:5]}")

        for r in g.replicas:
            r.tap.observe(hook)

    async def listener(msgs: list[MessageExt], ctx: ConsumeContext) -> str:
        assert ctx.group == "cg" and not ctx.orderly
        await asyncio.sleep(rng.random() * 0.004)  # finish out of order
        m = msgs[0]
        if m.reconsume_times == 0:
            key = key_of[m.msg_id] = (m.broker_name, m.queue_id, m.queue_offset)
        else:  # a copy from the retry topic: the original's place
            assert m.topic == "T" and m.message_queue.topic == "T"
            key = key_of[m.properties["ORIGIN_MESSAGE_ID"]]
        attempts[key].append(m.reconsume_times)
        if key[2] % 7 == 3 and m.reconsume_times == 0:
            handed_back.add(key)
            return "RECONSUME_LATER"
        if key[2] % 11 == 5 and m.reconsume_times < 2:
            handed_back.add(key)
            raise RuntimeError("listener bug")
        consumed.add(key)
        return "CONSUME_SUCCESS"

    c = consumers(cluster, max_concurrency=8)
    c.subscribe("T")
    c.register_listener(listener)
    await c.start()
    for g in cluster.groups:  # more while it runs: long polls wake up
        for q in range(4):
            await g.put("T", q, 5)
    await wait_until(lambda: len(consumed) == 200, WAIT_S, "all 200 consumed")
    await wait_until(
        lambda: all(g.offset("cg", "T", q) == 25 for g in cluster.groups for q in range(4)),
        WAIT_S, "offsets committed to the end",
    )
    assert violations == []
    for key, offs in commits.items():
        assert offs == sorted(offs), f"commits of {key} went backwards: {offs}"
    assert attempts[("RaftNode00", 0, 3)] == [0, 1]  # RECONSUME_LATER: redelivered once
    assert attempts[("RaftNode00", 0, 5)] == [0, 1, 2]  # exceptions count as RECONSUME_LATER
    stats = c.stats()
    assert stats.consumed == 200 and stats.reconsumed > 0
    queues = {mq: qs for mq, qs in stats.queues.items() if mq.topic == "T"}
    assert set(queues) == set(all_queues(cluster, "T", 4))
    assert all(qs.committable_offset == 25 and qs.in_flight == 0 for qs in queues.values())


async def test_batches_of_several_messages(make_cluster: ClusterFactory, consumers: Make) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 2})
    await cluster.groups[0].put("T", 0, 30)
    sizes: list[int] = []

    def listener(msgs: list[MessageExt], ctx: ConsumeContext) -> str:  # a sync listener: a thread
        sizes.append(len(msgs))
        return "CONSUME_SUCCESS"

    c = consumers(cluster, consume_batch_max=8, pull_batch_size=16)
    c.subscribe("T")
    c.register_listener(listener)
    await c.start()
    await wait_until(lambda: sum(sizes) == 30, WAIT_S, "30 consumed")
    assert max(sizes) == 8


async def test_orderly_consumes_each_queue_in_order(make_cluster: ClusterFactory, consumers: Make) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 4})
    g = cluster.groups[0]
    for q in range(4):
        await g.put("T", q, 30)
    calls: dict[int, list[list[int]]] = defaultdict(list)
    done: dict[int, list[int]] = defaultdict(list)
    active: dict[int, int] = defaultdict(int)
    overlap: list[int] = []
    failed_once: set[int] = set()

    async def listener(msgs: list[MessageExt], ctx: ConsumeContext) -> str:
        qid = ctx.message_queue.queue_id
        active[qid] += 1
        if active[qid] > 1:
            overlap.append(qid)
        calls[qid].append([m.queue_offset for m in msgs])
        await asyncio.sleep(0)
        active[qid] -= 1
        if 10 in (m.queue_offset for m in msgs) and qid not in failed_once:
            failed_once.add(qid)
            return "RECONSUME_LATER"
        done[qid].extend(m.queue_offset for m in msgs)
        return "CONSUME_SUCCESS"

    c = consumers(cluster, orderly=True, consume_batch_max=3, max_concurrency=4)
    c.subscribe("T")
    c.register_listener(listener)
    await c.start()
    await wait_until(lambda: all(len(done[q]) == 30 for q in range(4)), WAIT_S, "every queue consumed")
    assert overlap == []
    for q in range(4):
        assert done[q] == list(range(30))
        expected_next, failed = 0, False
        for batch in calls[q]:  # every call starts where the last success ended: a retry repeats it
            assert batch[0] == expected_next, (q, calls[q])
            assert batch == list(range(batch[0], batch[0] + len(batch)))
            if 10 in batch and not failed:
                failed = True  # RECONSUME_LATER: the same batch comes again
            else:
                expected_next = batch[-1] + 1
        assert sum(1 for b in calls[q] if 10 in b) == 2  # failed once, retried once


async def test_tag_filter_is_passed_to_the_broker(make_cluster: ClusterFactory, consumers: Make) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 1})
    g = cluster.groups[0]
    for i in range(12):
        await g.put("T", 0, 1, tags="abc"[i % 3])
    await g.put("T", 0, 5, tags="c")  # a tail nobody wants: the offset still moves past it
    got: list[str] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeContext) -> str:
        got.extend(m.tags for m in msgs)
        return "CONSUME_SUCCESS"

    c = consumers(cluster)
    c.subscribe("T", "b || a")
    c.register_listener(listener)
    await c.start()
    await wait_until(lambda: g.offset("cg", "T", 0) == 17, WAIT_S, "offset past the filtered tail")
    assert sorted(got) == ["a"] * 4 + ["b"] * 4
    pulls = [s.body for r in g.replicas for s in r.tap.seen("/v1/pull")]
    assert pulls and {p["tags"] for p in pulls} == {"a||b"}
    assert {p["consumer_group"] for p in pulls} == {"cg"}


async def test_clustering_rebalance_moves_queues_of_a_leaving_consumer(
    make_cluster: ClusterFactory, consumers: Make
) -> None:
    cluster = await make_cluster(n_groups=2, topics={"T": 4})
    everything = all_queues(cluster, "T", 4)
    seen: dict[str, set[str]] = defaultdict(set)

    def listener_for(cid: str) -> Callable[[list[MessageExt], ConsumeContext], Any]:
        async def listener(msgs: list[MessageExt], ctx: ConsumeContext) -> str:
            seen[cid].update(m.unique_id for m in msgs)
            return "CONSUME_SUCCESS"

        return listener

    cs = {cid: consumers(cluster, client_id=cid) for cid in ("c1", "c2", "c3")}
    for cid, c in cs.items():
        c.subscribe("T")
        c.register_listener(listener_for(cid))
    await asyncio.gather(*(c.start() for c in cs.values()))

    def converged(members: list[str]) -> bool:
        shares = [cs[m].assigned_queues() for m in members]
        return all(
            shares[i] == allocate_averagely(m, everything, sorted(members)) for i, m in enumerate(members)
        )

    await wait_until(lambda: converged(["c1", "c2", "c3"]), WAIT_S, "3 consumers converged")
    assert sorted(len(cs[m].assigned_queues()) for m in cs) == [2, 3, 3]
    seen_by = await members(cluster, "cg")  # heartbeats reach every replica of every group
    assert len(seen_by) == 6 and all({"c1", "c2", "c3"} <= ids for ids in seen_by.values()), seen_by
    for g in cluster.groups:
        for q in range(4):
            await g.put("T", q, 5, prefix="first")
    stored = {m["unique_id"] for g in cluster.groups for q in range(4) for m in await g.messages("T", q)}
    assert len(stored) == 40
    await wait_until(lambda: set().union(*seen.values()) == stored, WAIT_S, "first wave consumed")

    await cs["c2"].shutdown()
    seen_by = await members(cluster, "cg")
    assert all("c2" not in ids for ids in seen_by.values()), seen_by  # unregistered
    await wait_until(lambda: converged(["c1", "c3"]), WAIT_S, "2 consumers converged")
    assert sorted(cs["c1"].assigned_queues() + cs["c3"].assigned_queues()) == everything
    for g in cluster.groups:
        for q in range(4):
            await g.put("T", q, 5, prefix="second")
    stored = {m["unique_id"] for g in cluster.groups for q in range(4) for m in await g.messages("T", q)}
    assert len(stored) == 80
    await wait_until(lambda: seen["c1"] | seen["c3"] | seen["c2"] == stored, WAIT_S, "second wave consumed")
    await wait_until(
        lambda: all(g.offset("cg", "T", q) == 10 for g in cluster.groups for q in range(4)),
        WAIT_S, "every queue committed",
    )


async def test_broadcasting_every_consumer_gets_everything(
    make_cluster: ClusterFactory, consumers: Make, tmp_path: Path
) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 4})
    g = cluster.groups[0]
    for q in range(4):
        await g.put("T", q, 5)
    got: dict[str, list[str]] = defaultdict(list)

    def listener_for(name: str) -> Callable[[list[MessageExt], ConsumeContext], str]:
        def listener(msgs: list[MessageExt], ctx: ConsumeContext) -> str:
            got[name].extend(m.body.decode() for m in msgs)
            return "CONSUME_SUCCESS"

        return listener

    cs = {}
    for name in ("b1", "b2"):
        c = consumers(cluster, message_model="BROADCASTING", offset_dir=str(tmp_path / name))
        c.subscribe("T")
        c.register_listener(listener_for(name))
        cs[name] = c
    await asyncio.gather(*(c.start() for c in cs.values()))
    await wait_until(lambda: len(got["b1"]) == 20 and len(got["b2"]) == 20, WAIT_S, "both got all 20")
    assert sorted(got["b1"]) == sorted(got["b2"])
    assert all(c.assigned_queues() == all_queues(cluster, "T", 4) for c in cs.values())
    await asyncio.gather(*(c.shutdown() for c in cs.values()))
    assert cluster.all_requests("/v1/offsets", "POST") == []  # broadcasting keeps offsets locally
    assert g.offsets("cg", "T") == {}
    for name in ("b1", "b2"):
        offsets = read_offset_file(str(tmp_path / name / "cg" / "offsets.json"))
        assert offsets == {mq: 5 for mq in all_queues(cluster, "T", 4)}

    again = consumers(cluster, message_model="BROADCASTING", offset_dir=str(tmp_path / "b1"))
    again.subscribe("T")
    again.register_listener(listener_for("again"))
    await again.start()
    await g.put("T", 2, 3, prefix="new")
    await wait_until(lambda: len(got["again"]) == 3, WAIT_S, "only the new messages")
    assert sorted(got["again"]) == ["new-2-5", "new-2-6", "new-2-7"]


async def test_start_positions_and_resuming_from_the_committed_offset(
    make_cluster: ClusterFactory, consumers: Make
) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 1})
    g = cluster.groups[0]
    old = await g.put("T", 0, 4, prefix="old")
    old_ts = (await g.messages("T", 0))[-1]["store_ts"]
    await after_ms(old_ts)
    await g.put("T", 0, 4, prefix="new")  # stored at a later millisecond than the old ones
    assert len(old) == 4
    got: dict[str, list[bytes]] = defaultdict(list)

    def listener_for(name: str) -> Callable[[list[MessageExt], ConsumeContext], str]:
        def listener(msgs: list[MessageExt], ctx: ConsumeContext) -> str:
            got[name].extend(m.body for m in msgs)
            return "CONSUME_SUCCESS"

        return listener

    by_ts = consumers(cluster, group="g-ts", consume_from="TIMESTAMP", consume_timestamp_ms=old_ts + 1)
    last = consumers(cluster, group="g-last", consume_from="LAST")
    for name, c in (("ts", by_ts), ("last", last)):
        c.subscribe("T")
        c.register_listener(listener_for(name))
        await c.start()
    await wait_until(lambda: len(got["ts"]) == 4, WAIT_S, "the messages after the timestamp")
    assert all(b.startswith(b"new") for b in got["ts"])
    await wait_until(lambda: g.offset("g-last", "T", 0) == 8, WAIT_S, "LAST pinned at the max offset")
    await g.put("T", 0, 2, prefix="later")
    await wait_until(lambda: len(got["last"]) == 2 and len(got["ts"]) == 6, WAIT_S, "the later messages")
    await by_ts.shutdown()
    assert g.offset("g-ts", "T", 0) == 10

    resumed = consumers(cluster, group="g-ts", consume_from="FIRST")  # a committed offset wins
    resumed.subscribe("T")
    resumed.register_listener(listener_for("resumed"))
    await resumed.start()
    await g.put("T", 0, 1, prefix="fresh")
    await wait_until(lambda: len(got["resumed"]) == 1, WAIT_S, "only the fresh message")
    assert got["resumed"] == [b"fresh-0-10"]


async def test_pulls_fall_back_to_a_follower_when_the_leader_is_down(
    make_cluster: ClusterFactory, consumers: Make
) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 2})
    g = cluster.groups[0]
    await g.put("T", 0, 6)
    await g.put("T", 1, 6)
    await g.wait_replicated()
    g.cut("n1", "n2")  # the survivors cannot elect anyone: the group stays without a leader
    await g.kill("n0")  # the routes still name it as the leader
    route = await cluster.route("T")
    assert route is not None and route["broker_datas"][0]["broker_addrs"]["0"] == g.replicas[0].addr
    got: list[str] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeContext) -> str:
        got.extend(m.unique_id for m in msgs)
        return "CONSUME_SUCCESS"

    c = consumers(cluster)
    c.subscribe("T")
    c.register_listener(listener)
    await c.start()
    await wait_until(lambda: len(got) == 12, WAIT_S, "all read from followers")
    assert all(r.broker.node.role != "LEADER" for r in g.replicas[1:])
    follower_pulls = [s for r in g.replicas[1:] for s in r.tap.seen("/v1/pull")]
    assert follower_pulls


async def test_follower_reads_keep_pulls_off_the_leader_and_deliver_everything(
    make_cluster: ClusterFactory, consumers: Make
) -> None:
    """``read_from_followers`` (issue 13, item 4): every queue pulls from a follower (committed data
    only), the queues spread over both followers, the leader serves no pull, and everything sent
    (before and while consuming) is delivered."""
    cluster = await make_cluster(n_groups=1, topics={"T": 4})
    g = cluster.groups[0]
    for q in range(4):
        await g.put("T", q, 5)
    got: set[str] = set()

    async def listener(msgs: list[MessageExt], ctx: ConsumeContext) -> str:
        got.update(m.unique_id for m in msgs)
        return "CONSUME_SUCCESS"

    c = consumers(cluster, read_from_followers=True)
    c.subscribe("T")
    c.register_listener(listener)
    await c.start()
    await wait_until(lambda: len(got) == 20, WAIT_S, "the first 20 from followers")
    for q in range(4):
        await g.put("T", q, 5)  # long polls held on followers wake as their replicas apply
    await wait_until(lambda: len(got) == 40, WAIT_S, "all 40 from followers")
    leader = next(r for r in g.replicas if r.broker.node.role == "LEADER")
    assert leader.tap.seen("/v1/pull") == []
    by_follower = {r.tap.name: len(r.tap.seen("/v1/pull")) for r in g.replicas if r is not leader}
    assert all(n > 0 for n in by_follower.values()), by_follower


async def test_flow_control_bounds_messages_in_flight(make_cluster: ClusterFactory, consumers: Make) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 1})
    g = cluster.groups[0]
    await g.put("T", 0, 60)
    gate = asyncio.Event()
    seen: list[int] = []

    async def listener(msgs: list[MessageExt], ctx: ConsumeContext) -> str:
        seen.append(msgs[0].queue_offset)
        await gate.wait()
        return "CONSUME_SUCCESS"

    c = consumers(cluster, pull_threshold_msgs=5, pull_batch_size=4, max_concurrency=50)
    c.subscribe("T")
    c.register_listener(listener)
    await c.start()
    mq = MessageQueue("T", g.name, 0)
    await wait_until(lambda: c.stats().queues[mq].in_flight >= 5, WAIT_S, "the threshold reached")
    assert c.stats().queues[mq].in_flight <= 5 - 1 + 4
    assert max(seen) < 8
    gate.set()
    await wait_until(lambda: g.offset("cg", "T", 0) == 60, WAIT_S, "everything after the gate opened")


# -- a fail-fast start (issue 28, papercut 4) ---------------------------------------------------------
async def test_fail_fast_start_raises_the_code_of_a_wrong_secret_and_leaves_nothing_running(
    make_cluster: ClusterFactory, consumers: Make
) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 2})
    for model in ("CLUSTERING", "BROADCASTING"):
        c = consumers(cluster, message_model=model, credentials=Credentials(CONSUMER.access_key, "wrong-secret-000"))
        c.subscribe("T")
        c.register_listener(lambda msgs, ctx: "CONSUME_SUCCESS")
        with pytest.raises(ClientError) as caught:
            await c.start(fail_fast=True)
        assert caught.value.code == "SIGNATURE_INVALID", caught.value
        assert c.assigned_queues() == [] and not c._loops, "nothing left running after a failed start"
    # the default start returns and keeps retrying in the background (RocketMQ's behaviour)
    lenient = consumers(cluster, credentials=Credentials(CONSUMER.access_key, "wrong-secret-000"))
    lenient.subscribe("T")
    lenient.register_listener(lambda msgs, ctx: "CONSUME_SUCCESS")
    await lenient.start()
    assert lenient.assigned_queues() == []


async def test_fail_fast_start_raises_for_an_unreachable_namesrv_and_a_missing_topic(
    make_cluster: ClusterFactory, consumers: Make
) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 2})
    c = PushConsumer("cg", "127.0.0.1:1", credentials=CONSUMER, **FAST)
    c.subscribe("T")
    c.register_listener(lambda msgs, ctx: "CONSUME_SUCCESS")
    with pytest.raises(ClientError) as caught:
        await c.start(fail_fast=True)
    assert caught.value.code == "CONNECT_FAILED", caught.value
    missing = consumers(cluster)
    missing.subscribe("NoSuchTopic")
    missing.register_listener(lambda msgs, ctx: "CONSUME_SUCCESS")
    with pytest.raises(ClientError) as caught:
        await missing.start(fail_fast=True)
    assert caught.value.code == "TOPIC_NOT_EXIST", caught.value


async def test_fail_fast_start_of_a_good_consumer_has_its_queues_when_it_returns(
    make_cluster: ClusterFactory, consumers: Make
) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 2})
    await cluster.groups[0].put("T", 0, 3)
    got: list[str] = []
    c = consumers(cluster)
    c.subscribe("T")
    c.register_listener(lambda msgs, ctx: got.extend(m.body.decode() for m in msgs) or "CONSUME_SUCCESS")
    await c.start(fail_fast=True)
    assert c.assigned_queues() == all_queues(cluster, "T", 2)
    await wait_until(lambda: len(got) == 3, WAIT_S, "the three messages")
