"""The pull consumer: queues, pulls (statuses, long poll, tags), offsets kept remotely for its
group, timestamp search, and reads from a follower when the leader is down."""

from __future__ import annotations

import asyncio
import time

from broker.client import MessageQueue, PullConsumer, PullStatus
from tests.broker.client.conftest import ClusterFactory


async def test_pull_consumer_end_to_end(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=2, topics={"T": 2})
    g = cluster.group("RaftNode01")
    g.put("T", 1, 3, tags="a")
    g.put("T", 1, 2, tags="b")
    async with PullConsumer("pc", cluster.namesrv_addr) as pc:
        mqs = await pc.fetch_message_queues("T")
        assert mqs == sorted(MessageQueue("T", n, q) for n in ("RaftNode00", "RaftNode01") for q in range(2))
        mq = MessageQueue("T", "RaftNode01", 1)
        res = await pc.pull(mq, 0, max_count=4)
        assert res.status is PullStatus.FOUND and res.next_offset == 4 and res.max_offset == 5
        assert [m.queue_offset for m in res.messages] == [0, 1, 2, 3]
        assert res.messages[0].broker_name == "RaftNode01" and res.messages[0].tags == "a"
        res = await pc.pull(mq, 0, tags="b")
        assert [m.tags for m in res.messages] == ["b", "b"] and res.next_offset == 5
        assert (await pc.pull(mq, 5)).status is PullStatus.NO_NEW_MSG
        assert (await pc.pull(mq, 9)).status is PullStatus.OFFSET_OVERFLOW

        started = time.monotonic()
        waiting = asyncio.ensure_future(pc.pull(mq, 5, suspend_ms=5000))
        await asyncio.sleep(0)
        g.put("T", 1, 1)
        res = await waiting
        assert res.status is PullStatus.FOUND and time.monotonic() - started < 4  # woken, not timed out

        assert await pc.fetch_consume_offset(mq) is None
        pc.update_consume_offset(mq, 6)
        assert await pc.fetch_consume_offset(mq, from_store=False) == 6
        assert await pc.commit() == 1
        assert g.offsets[("pc", "T", 1)] == 6
        assert await pc.fetch_consume_offset(mq) == 6
        assert (await pc.min_offset(mq), await pc.max_offset(mq)) == (0, 6)
        for i, m in enumerate(g.queue("T", 1)):
            m["store_ts"] = 1000 * i
        assert await pc.search_offset(mq, 2500) == 3
        assert await pc.search_offset(mq, 10**13) == 6
        pc.update_consume_offset(mq, 2)  # the broker keeps offsets monotonic
        await pc.commit()
        assert g.offsets[("pc", "T", 1)] == 6


async def test_pull_reads_from_a_follower_and_commits_follow_not_leader(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 1})
    g = cluster.groups[0]
    g.put("T", 0, 3)
    mq = MessageQueue("T", g.name, 0)
    async with PullConsumer("pc", cluster.namesrv_addr) as pc:
        await pc.fetch_message_queues("T")
        await g.replicas[0].stop()
        res = await pc.pull(mq, 0)
        assert res.status is PullStatus.FOUND and len(res.messages) == 3
        assert any(p == "/v1/pull" for r in g.replicas[1:] for p, _ in r.requests)
        g.leader_index = 2  # replica 2 leads; the routes still say replica 0
        cluster.namesrv.stale_leader[g.name] = g.replicas[0].addr
        await g.replicas[0].restart()
        pc.update_consume_offset(mq, 3)
        assert await pc.commit() == 1  # replica 0 answered NOT_LEADER naming replica 2
        assert g.offsets[("pc", "T", 0)] == 3
        assert [p for p, _ in g.replicas[2].requests if p == "/v1/offsets"] == ["/v1/offsets"]
