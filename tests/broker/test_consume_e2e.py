"""The SDK against a real (in-process) broker group: clustering with rebalance, broadcasting, tag
filtering, orderly consumption."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.client import HashKeySelector, Message, Producer, PushConsumer
from broker.client.transport import Transport
from tests.broker.harness import BrokerCluster
from tests.dledger.harness import wait_until


@pytest.fixture
async def cluster(tmp_path: Any) -> AsyncIterator[BrokerCluster]:
    c = BrokerCluster(str(tmp_path))
    await c.start()
    try:
        yield c
    finally:
        await c.stop()


async def _topic(c: BrokerCluster, topic: str, queues: int) -> None:
    leader = await c.wait_writable()
    t = Transport()
    try:
        await t.call(leader.cfg.address, "POST", "/v1/topics",
                     {"topic": topic, "read_queue_nums": queues, "write_queue_nums": queues})
        ns = c.namesrvs[0].addr

        async def routed() -> bool:
            r = await t.call(ns, "GET", f"/v1/routes/{topic}", params={"v": 1})
            return bool(r["queue_datas"] and r["queue_datas"][0]["write_queue_nums"] == queues)

        await wait_until(routed, 5, f"route of {topic}")
    finally:
        await t.close()


async def _produce(c: BrokerCluster, topic: str, n: int, batch: int = 50, **kw: Any) -> list[bytes]:
    bodies = [b"m-%06d" % i for i in range(n)]
    async with Producer("e2e_pg", c.namesrv_addr) as p:
        for i in range(0, n, batch):
            await p.send_batch([Message(topic, b, **kw) for b in bodies[i:i + batch]])
    return bodies


async def test_10000_messages_over_8_queues_three_clustering_consumers(cluster: BrokerCluster) -> None:
    await _topic(cluster, "E2E", 8)
    got: dict[str, collections.Counter[bytes]] = {}
    consumers = []

    def make(name: str) -> PushConsumer:
        got[name] = collections.Counter()

        def listener(msgs: list[Any], ctx: Any) -> str:
            for m in msgs:
                got[name][m.body] += 1
            return "CONSUME_SUCCESS"

        pc = PushConsumer("e2e_group", cluster.namesrv_addr, consume_from="FIRST", client_id=name,
                          rebalance_interval_s=1, heartbeat_interval_s=0.5, commit_interval_s=0.5,
                          suspend_ms=1000)
        pc.subscribe("E2E")
        pc.register_listener(listener)
        return pc

    try:
        first = make("c1")
        await first.start()
        consumers.append(first)
        await wait_until(lambda: len(first.assigned_queues()) == 8, 10, "c1 owns all 8 queues")
        bodies = await _produce(cluster, "E2E", 10_000, batch=100)
        for name in ("c2", "c3"):
            pc = make(name)
            await pc.start()
            consumers.append(pc)
        # rebalance: 8 queues over 3 consumers -> 3/3/2, each queue owned by exactly one
        def balanced() -> bool:
            sizes = sorted(len(pc.assigned_queues()) for pc in consumers)
            owned = [q for pc in consumers for q in pc.assigned_queues()]
            return sizes == [2, 3, 3] and len(set(owned)) == 8

        await wait_until(balanced, 15, "8 queues rebalanced over 3 consumers")
        total: collections.Counter[bytes] = collections.Counter()
        await wait_until(lambda: set().union(*got.values()) >= set(bodies), 60, "all 10,000 consumed")
        for cnt in got.values():
            total.update(cnt)
        assert set(total) == set(bodies)
        # c1 leaves: its queues move to the others
        await consumers[0].shutdown()
        rest = consumers[1:]
        await wait_until(lambda: sorted(len(pc.assigned_queues()) for pc in rest) == [4, 4], 15, "c1's queues moved")
    finally:
        for pc in consumers:
            await pc.shutdown()


async def test_broadcasting_every_consumer_gets_everything(cluster: BrokerCluster, tmp_path: Any) -> None:
    await _topic(cluster, "BC", 4)
    got: list[set[bytes]] = [set(), set()]
    consumers = []
    try:
        for i in range(2):
            def listener(msgs: list[Any], ctx: Any, i: int = i) -> str:
                got[i].update(m.body for m in msgs)
                return "CONSUME_SUCCESS"

            pc = PushConsumer("bc_group", cluster.namesrv_addr, message_model="BROADCASTING", consume_from="FIRST",
                              client_id=f"b{i}", offset_dir=str(tmp_path / f"off{i}"), suspend_ms=1000)
            pc.subscribe("BC")
            pc.register_listener(listener)
            await pc.start()
            consumers.append(pc)
        bodies = await _produce(cluster, "BC", 500, batch=50)
        await wait_until(lambda: got[0] >= set(bodies) and got[1] >= set(bodies), 30, "both got all 500")
    finally:
        for pc in consumers:
            await pc.shutdown()


async def test_tag_filter(cluster: BrokerCluster) -> None:
    await _topic(cluster, "TG", 2)
    async with Producer("tg_pg", cluster.namesrv_addr) as p:
        for i in range(60):
            await p.send(Message("TG", b"%d" % i, tags="TagA" if i % 3 == 0 else "TagB"))
    got: list[Any] = []

    def listener(msgs: list[Any], ctx: Any) -> str:
        got.extend(msgs)
        return "CONSUME_SUCCESS"

    pc = PushConsumer("tg_group", cluster.namesrv_addr, consume_from="FIRST", suspend_ms=1000)
    pc.subscribe("TG", "TagA")
    pc.register_listener(listener)
    await pc.start()
    try:
        await wait_until(lambda: len(got) >= 20, 15, "20 TagA messages")
        await asyncio.sleep(0.3)  # a wrong message would arrive with the right ones
        assert len(got) == 20 and all(m.tags == "TagA" for m in got)
    finally:
        await pc.shutdown()


async def test_orderly_consumption_keeps_per_queue_order(cluster: BrokerCluster) -> None:
    await _topic(cluster, "ORD", 4)
    keys = [f"order-{k}" for k in range(8)]
    async with Producer("ord_pg", cluster.namesrv_addr) as p:
        sel = HashKeySelector()
        for i in range(40):
            for k in keys:
                await p.send(Message("ORD", f"{k}:{i}".encode(), keys=[k]), selector=sel, arg=k)
    seen: dict[str, list[int]] = collections.defaultdict(list)
    per_queue: dict[int, list[int]] = collections.defaultdict(list)
    active: set[int] = set()
    overlap: list[int] = []

    async def listener(msgs: list[Any], ctx: Any) -> str:
        q = ctx.message_queue.queue_id
        if q in active:
            overlap.append(q)
        active.add(q)
        for m in msgs:
            k, i = m.body.decode().split(":")
            seen[k].append(int(i))
            per_queue[q].append(m.queue_offset)
        await asyncio.sleep(0)
        active.discard(q)
        return "CONSUME_SUCCESS"

    pc = PushConsumer("ord_group", cluster.namesrv_addr, consume_from="FIRST", orderly=True, suspend_ms=1000)
    pc.subscribe("ORD")
    pc.register_listener(listener)
    await pc.start()
    try:
        await wait_until(lambda: sum(len(v) for v in seen.values()) >= 320, 30, "320 ordered messages")
        for k in keys:
            assert seen[k] == list(range(40)), k
        for q, offsets in per_queue.items():
            assert offsets == sorted(offsets), q
        assert not overlap, "orderly: one batch at a time per queue"
    finally:
        await pc.shutdown()
