"""The message store after restarts: nothing applied twice, queues rebuilt from the log when lost."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

from broker.client.transport import Transport
from tests.broker.harness import IDS, BrokerCluster
from tests.dledger.harness import wait_until


async def _send(t: Transport, addr: str, topic: str, qid: int, n: int, tag: str = "") -> list[int]:
    r = await t.call(addr, "POST", "/v1/send", {"topic": topic, "queue_id": qid, "messages": [
        {"body": b"m%d" % i, "tags": tag, "keys": [f"key{i}"]} for i in range(n)]})
    return [x["queue_offset"] for x in r["results"]]


async def _queue_state(t: Transport, addr: str, topic: str, qid: int) -> list[bytes]:
    out: list[bytes] = []
    offset = 0
    while True:
        p = await t.call(addr, "POST", "/v1/pull", {"topic": topic, "queue_id": qid, "offset": offset,
                                                  "max_count": 1024})
        if p["status"] != "FOUND":
            return out
        out += [m["body"] for m in p["messages"]]
        offset = p["next_offset"]


@pytest.mark.parametrize("damage", ["none", "wipe_queues", "wipe_snapshot", "wipe_index"])
async def test_restart_keeps_offsets_and_rebuilds_what_is_lost(tmp_path: Any, damage: str) -> None:
    c = BrokerCluster(str(tmp_path))
    t = Transport(timeout_s=5.0)
    await c.start()
    try:
        leader = c.writable_leader()
        assert leader is not None
        await t.call(leader.cfg.address, "POST", "/v1/topics", {"topic": "R", "read_queue_nums": 2,
                                                               "write_queue_nums": 2})
        assert await _send(t, leader.cfg.address, "R", 0, 50) == list(range(50))
        assert await _send(t, leader.cfg.address, "R", 1, 5) == list(range(5))
        await t.call(leader.cfg.address, "POST", "/v1/offsets", {"group": "g", "topic": "R", "offsets": {"0": 20}})
        for nid in IDS:
            b = c.brokers[nid]
            await wait_until(lambda b=b: b.node.applied_index >= leader.node.commit_index, 5, f"{nid} applied")
        for nid in IDS:
            await c.stop_broker(nid)
        for nid in IDS:
            store_dir = c.config(nid).store_dir
            if damage == "wipe_queues":
                shutil.rmtree(os.path.join(store_dir, "consumequeue"))
            elif damage == "wipe_snapshot":
                os.remove(os.path.join(store_dir, "snapshot"))
            elif damage == "wipe_index":
                for f in os.listdir(os.path.join(store_dir, "index")):
                    with open(os.path.join(store_dir, "index", f), "r+b") as fh:
                        fh.write(b"garbage!")
        for nid in IDS:
            await c.start_broker(nid)
        leader = await c.wait_writable()
        for nid in IDS:
            addr = c.addr(nid)

            async def full(addr: str = addr) -> bool:
                return len(await _queue_state(t, addr, "R", 0)) == 50

            await wait_until(full, 10, f"queue R/0 on {nid}")
            assert await _queue_state(t, addr, "R", 0) == [b"m%d" % i for i in range(50)]
            assert await _queue_state(t, addr, "R", 1) == [b"m%d" % i for i in range(5)]
            o = await t.call(addr, "GET", "/v1/offsets", params={"group": "g", "topic": "R"})
            assert o["offsets"] == {"0": 20}
            q = await t.call(addr, "GET", "/v1/msg/key", params={"topic": "R", "key": "key7"})
            assert [m["queue_offset"] for m in q["messages"]] == [7]
        # offsets continue where they were: nothing applied twice, nothing skipped
        assert await _send(t, leader.cfg.address, "R", 0, 3) == [50, 51, 52]
    finally:
        await t.close()
        await c.stop()
