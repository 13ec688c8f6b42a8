"""The binary protocol between OS processes (``dledger-cluster``, ACL on): routes advertise every
replica's binary port; 400 concurrent sends of 4 auto-batching producers are all stored, each at its
own offset, in fewer append requests than messages, all of them over the binary port (the leader's
status counts them), and read back by a pull consumer."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from broker.client import Message, MessageQueue, Producer, PullConsumer, PullStatus
from broker.client.transport import ClientError, Transport
from tests.broker.procs import ProcCluster
from tests.dledger.harness import wait_until

pytestmark = pytest.mark.slow


async def test_sdk_over_the_binary_protocol_between_processes(tmp_path: Any) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    c = ProcCluster(str(tmp_path), seed=seed)
    c.up()
    t = Transport(timeout_s=3.0, credentials=c.credentials, protocol="http")
    try:
        async def leader() -> Any:
            for p in c.brokers():
                try:
                    if (await t.call(c.addr(p), "GET", "/v1/status", timeout_s=1.0)).get("writable"):
                        return p
                except ClientError:
                    continue
            return None

        lp = await wait_until(leader, 30, "a writable leader")
        await t.call(c.addr(lp), "POST", "/v1/topics", {"topic": "RB", "read_queue_nums": 2, "write_queue_nums": 2})

        async def advertised() -> bool:
            route = await t.call(c.namesrv_addr.split(";")[0], "GET", "/v1/routes/RB", params={"v": 1})
            bd = route["broker_datas"][0]
            return len(bd["broker_addrs"]) == 3 and set(bd.get("remoting_addrs", {})) == set(bd["broker_addrs"])

        await wait_until(advertised, 30, "every replica's binary port in the route")

        async def counts() -> tuple[int, int]:
            """(send requests the leader served, requests its binary port served)"""
            st = await t.call(c.addr(lp), "GET", "/v1/status")
            return int(st["send"]["send_requests"]), int(st["remoting"]["requests"])

        producers = [Producer(f"rb{i}", c.namesrv_addr, credentials=c.credentials) for i in range(4)]
        for p in producers:
            await p.start()
        try:
            results = await asyncio.gather(*(
                producers[i % 4].send(Message("RB", f"m{i}".encode())) for i in range(400)))
        finally:
            for p in producers:
                await p.shutdown()
        by_queue: dict[int, set[int]] = {}
        for r in results:
            by_queue.setdefault(r.message_queue.queue_id, set()).add(r.queue_offset)
        assert sum(len(v) for v in by_queue.values()) == 400  # 400 distinct (queue, offset) pairs
        sends, binary = await counts()
        assert 1 <= sends < 400  # batched: fewer append requests than messages
        assert binary >= sends  # every one of them came over the binary port
        got: set[bytes] = set()
        async with PullConsumer("rbc", c.namesrv_addr, credentials=c.credentials) as pc:
            await pc.fetch_message_queues("RB")
            for q in range(2):
                offset = 0
                while True:
                    res = await pc.pull(MessageQueue("RB", lp.group, q), offset, max_count=256)
                    if res.status is not PullStatus.FOUND:
                        break
                    got |= {m.body for m in res.messages}
                    offset = res.next_offset
        assert got == {f"m{i}".encode() for i in range(400)}
    finally:
        await t.close()
        c.down()
