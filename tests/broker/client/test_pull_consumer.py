"""The pull consumer against real broker groups on the in-process log: queues, pulls (statuses, long
poll, tags), offsets kept remotely for its group, timestamp search, and reads from a follower when
the leader is down."""

from __future__ import annotations

import asyncio
import time

from broker.client import MessageQueue, PullConsumer, PullStatus
from tests.acl_fixtures import CONSUMER
from tests.broker.client.conftest import ClusterFactory
from tests.broker.inproc_cluster import WAIT_S
from tests.dledger.harness import wait_until


async def after_ms(ms: int) -> None:
    """Until the wall clock (which stamps stored messages) has passed ``ms``."""
    await wait_until(lambda: time.time_ns() // 1_000_000 > ms, WAIT_S, f"the wall clock to pass {ms}")


async def test_pull_consumer_end_to_end(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=2, topics={"T": 2})
    g = cluster.group("RaftNode01")
    await g.put("T", 1, 3, tags="a")
    async with PullConsumer("pc", cluster.namesrv_addr, credentials=CONSUMER) as pc:
        mqs = await pc.fetch_message_queues("T")
        assert mqs == sorted(MessageQueue("T", n, q) for n in ("RaftNode00", "RaftNode01") for q in range(2))
        mq = MessageQueue("T", "RaftNode01", 1)
        await after_ms((await g.messages("T", 1))[-1]["store_ts"])
        await g.put("T", 1, 2, tags="b")
        res = await pc.pull(mq, 0, max_count=4)
        assert res.status is PullStatus.FOUND and res.next_offset == 4 and res.max_offset == 5
        assert [m.queue_offset for m in res.messages] == [0, 1, 2, 3]
        assert res.messages[0].broker_name == "RaftNode01" and res.messages[0].tags == "a"
        res = await pc.pull(mq, 0, tags="b")
        assert [m.tags for m in res.messages] == ["b", "b"] and res.next_offset == 5
        assert (await pc.pull(mq, 5)).status is PullStatus.NO_NEW_MSG
        assert (await pc.pull(mq, 9)).status is PullStatus.OFFSET_OVERFLOW

        leader = g.replicas[0]
        waiting = asyncio.ensure_future(pc.pull(mq, 5, suspend_ms=30_000))
        await wait_until(
            lambda: any(s.body.get("offset") == 5 for s in leader.tap.seen("/v1/pull")),
            WAIT_S, "the long poll to reach the leader",
        )
        await after_ms((await g.messages("T", 1))[-1]["store_ts"])
        await g.put("T", 1, 1)
        res = await asyncio.wait_for(waiting, WAIT_S)  # woken by the arrival, not by its 30 s hold
        assert res.status is PullStatus.FOUND and [m.queue_offset for m in res.messages] == [5]

        assert await pc.fetch_consume_offset(mq) is None
        pc.update_consume_offset(mq, 6)
        assert await pc.fetch_consume_offset(mq, from_store=False) == 6
        assert await pc.commit() == 1
        assert g.offset("pc", "T", 1) == 6
        assert await pc.fetch_consume_offset(mq) == 6
        assert (await pc.min_offset(mq), await pc.max_offset(mq)) == (0, 6)
        stamps = [m["store_ts"] for m in await g.messages("T", 1)]  # three sends: three store times
        assert stamps[0] == stamps[2] < stamps[3] == stamps[4] < stamps[5], stamps
        assert await pc.search_offset(mq, 0) == 0
        assert await pc.search_offset(mq, stamps[0] + 1) == 3
        assert await pc.search_offset(mq, stamps[3]) == 3
        assert await pc.search_offset(mq, stamps[5]) == 5
        assert await pc.search_offset(mq, 10**13) == 6
        pc.update_consume_offset(mq, 2)  # the broker keeps offsets monotonic
        await pc.commit()
        assert g.offset("pc", "T", 1) == 6


async def test_pull_reads_from_a_follower_and_commits_follow_not_leader(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 1})
    g = cluster.groups[0]
    n0, n2 = g.replicas[0], g.replicas[2]
    await g.put("T", 0, 3)
    await g.wait_replicated()  # the followers learn the commit with the next append, or ~2 ms later
    mq = MessageQueue("T", g.name, 0)
    async with PullConsumer("pc", cluster.namesrv_addr, credentials=CONSUMER) as pc:
        await pc.fetch_message_queues("T")
        for ns in cluster.namesrvs:  # from now on the routes keep naming n0 as the leader
            ns.refuse_registrations(g.name)
        await g.kill("n0")
        res = await pc.pull(mq, 0)
        assert res.status is PullStatus.FOUND and len(res.messages) == 3
        assert any(r.tap.seen("/v1/pull") for r in g.replicas[1:])
        await g.transfer("n2", registered=False)  # n2 leads; the routes still say n0
        await g.start("n0")
        await wait_until(lambda: n0.broker.node.leader_id == "n2", WAIT_S, "n0 to follow n2")
        pc.update_consume_offset(mq, 3)
        assert await pc.commit() == 1  # n0 answered NOT_LEADER naming n2
        assert g.offset("pc", "T", 0) == 3
        assert len(n0.tap.seen("/v1/offsets", "POST")) == 1
        assert len(n2.tap.seen("/v1/offsets", "POST")) == 1


async def test_follower_reads_ask_a_follower_then_the_leader_past_the_followers_end(
    make_cluster: ClusterFactory,
) -> None:
    """``read_from_followers``: a pull goes to a follower; an offset the followers have not applied
    yet (OFFSET_OVERFLOW there) is asked of the leader, whose answer is the one returned."""
    cluster = await make_cluster(n_groups=1, topics={"T": 1})
    g = cluster.group("RaftNode00")
    await g.put("T", 0, 3)
    await g.wait_replicated()
    leader, followers = g.replicas[0], g.replicas[1:]
    async with PullConsumer("pcf", cluster.namesrv_addr, credentials=CONSUMER, read_from_followers=True) as pc:
        mq = MessageQueue("T", "RaftNode00", 0)
        res = await pc.pull(mq, 0, max_count=8)
        assert res.status is PullStatus.FOUND and [m.queue_offset for m in res.messages] == [0, 1, 2]
        assert leader.tap.seen("/v1/pull") == [] and sum(len(f.tap.seen("/v1/pull")) for f in followers) == 1
        res = await pc.pull(mq, 7)  # past everyone's end: every follower, then the leader, says so
        assert res.status is PullStatus.OFFSET_OVERFLOW
        assert len(leader.tap.seen("/v1/pull")) == 1 and sum(len(f.tap.seen("/v1/pull")) for f in followers) == 3
