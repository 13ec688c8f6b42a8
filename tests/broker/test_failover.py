"""kill -9 of the leader while 4 producers send: producers recover without a restart, every
acknowledged message is consumed at least once, no consumer offset moves backwards (OS processes)."""

from __future__ import annotations

import asyncio
import collections
import random
import time
from typing import Any

import pytest

from broker.client import Message, Producer, PushConsumer
from broker.client.transport import ClientError, Transport
from tests.broker.procs import ProcCluster
from tests.dledger.harness import wait_until

pytestmark = pytest.mark.slow


async def _writable_leader(t: Transport, c: ProcCluster) -> tuple[Any, dict[str, Any]] | None:
    for p in c.brokers():
        try:
            st = await t.call(c.addr(p), "GET", "/v1/status", timeout_s=1.0)
        except ClientError:
            continue
        if st.get("writable"):
            return p, st
    return None


async def test_kill9_leader_with_four_producers_loses_nothing(tmp_path: Any) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    c = ProcCluster(str(tmp_path), seed=seed)
    c.up()
    t = Transport(timeout_s=3.0, credentials=c.credentials)
    producers: list[Producer] = []
    consumer: PushConsumer | None = None
    try:
        found = await wait_until(lambda: _writable_leader(t, c), 20, "a writable leader")
        leader_proc, _ = found
        await t.call(c.addr(leader_proc), "POST", "/v1/topics",
                     {"topic": "FO", "read_queue_nums": 8, "write_queue_nums": 8})
        received: dict[bytes, int] = collections.Counter()

        def listener(msgs: list[Any], ctx: Any) -> str:
            for m in msgs:
                received[m.body] += 1
            return "CONSUME_SUCCESS"

        consumer = PushConsumer("fo_group", c.namesrv_addr, consume_from="FIRST", commit_interval_s=0.5,
                                suspend_ms=2000, rebalance_interval_s=2, heartbeat_interval_s=1,
                                credentials=c.credentials)
        consumer.subscribe("FO", "*")
        consumer.register_listener(listener)
        await consumer.start()

        producers = [Producer(f"fo_pg{i}", c.namesrv_addr, credentials=c.credentials) for i in range(4)]
        for p in producers:
            await p.start()
        acked: dict[bytes, float] = {}
        stored_ms: dict[bytes, int] = {}
        errors: collections.Counter[str] = collections.Counter()
        stop = asyncio.Event()

        async def produce(p: Producer, i: int) -> None:
            n = 0
            while not stop.is_set():
                body = f"p{i}-{n}".encode()
                n += 1
                try:
                    r = await p.send(Message("FO", body))
                    acked[body] = time.monotonic()
                    stored_ms[body] = r.store_ts
                except ClientError as exc:
                    errors[exc.code] += 1
                    await asyncio.sleep(0.05)

        offsets_seen: dict[int, int] = {}
        backwards: list[str] = []

        async def watch_offsets() -> None:
            while not stop.is_set():
                found = await _writable_leader(t, c)
                if found is not None:
                    try:
                        o = await t.call(c.addr(found[0]), "GET", "/v1/offsets",
                                         params={"group": "fo_group", "topic": "FO"}, timeout_s=1.0)
                    except ClientError:
                        o = {"offsets": {}}
                    for q, off in o["offsets"].items():
                        if off < offsets_seen.get(int(q), 0):
                            backwards.append(f"queue {q}: {offsets_seen[int(q)]} -> {off} at {found[0].name}")
                        offsets_seen[int(q)] = max(off, offsets_seen.get(int(q), 0))
                await asyncio.sleep(0.1)

        tasks = [asyncio.create_task(produce(p, i)) for i, p in enumerate(producers)]
        watcher = asyncio.create_task(watch_offsets())
        await wait_until(lambda: len(acked) >= 600, 30, "600 acknowledged sends before the kill")
        await wait_until(lambda: len(offsets_seen) > 0, 10, "committed consumer offsets before the kill")
        found = await _writable_leader(t, c)
        assert found is not None
        leader_proc = found[0]
        killed_at = time.monotonic()
        killed_wall_ms = time.time() * 1000
        c.kill9(leader_proc)
        print(f"killed {leader_proc.name} pid {leader_proc.pid}")
        def new_leader_acks() -> list[float]:  # acks of messages the new leader stored
            return [acked[b] for b, ms in list(stored_ms.items()) if ms >= killed_wall_ms]

        await wait_until(new_leader_acks, 20, "an ack from the new leader")
        first_ack_s = min(new_leader_acks()) - killed_at
        in_flight_acks = sum(1 for ts in acked.values() if killed_at < ts < killed_at + 0.05)
        before = len(acked)
        await wait_until(lambda: len(acked) >= before + 600, 30, "600 more acknowledged sends")
        stop.set()
        await asyncio.gather(*tasks, watcher)
        print(f"first ack {first_ack_s * 1000:.0f} ms after kill -9 ({in_flight_acks} within 50 ms); "
              f"acked {len(acked)}; errors {dict(errors)}")

        await wait_until(lambda: all(b in received for b in acked), 60, "every acknowledged message consumed")
        assert not backwards, backwards
        new_leader = await _writable_leader(t, c)
        assert new_leader is not None and new_leader[0].name != leader_proc.name
        # producers and the consumer recovered without a restart; the killed replica rejoins
        c.restart(leader_proc)
        await wait_until(lambda: _caught_up(t, c, leader_proc), 30, "the restarted replica caught up")
    finally:
        for p in producers:
            await p.shutdown()
        if consumer is not None:
            await consumer.shutdown()
        await t.close()
        c.down()


async def _caught_up(t: Transport, c: ProcCluster, p: Any) -> bool:
    try:
        st = await t.call(c.addr(p), "GET", "/v1/status", timeout_s=1.0)
    except ClientError:
        return False
    leader = await _writable_leader(t, c)
    return leader is not None and st["applied_index"] >= leader[1]["commit_index"] - 5
