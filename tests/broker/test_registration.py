"""Brokers and NameServers: expiry of a silent broker, a restarted NameServer relearns every route
within one heartbeat interval, role changes reach every NameServer."""

from __future__ import annotations

import asyncio
from typing import Any

from broker.client.transport import ClientError, Transport
from tests.broker.harness import BrokerCluster, NameServer
from tests.dledger.harness import wait_until


async def _addrs(t: Transport, ns: str) -> dict[str, str]:
    try:
        c = await t.call(ns, "GET", "/v1/clusters", params={"v": 1})
    except ClientError:
        return {}
    b = c["brokers"].get("RaftNode00")
    return {str(k): v for k, v in b["broker_addrs"].items()} if b else {}


async def test_expiry_restart_and_role_changes(tmp_path: Any) -> None:
    # a broker silent for 1.5 s is expired (scan every 200 ms); brokers heartbeat every 0.5 s
    c = BrokerCluster(str(tmp_path), namesrv_count=2, namesrv_idle_ms=1500, namesrv_scan_ms=200,
                      registerNameServerPeriod=500)
    t = Transport(timeout_s=2.0)
    await c.start()
    try:
        leader = await c.wait_writable()
        for ns in c.namesrvs:
            async def three(ns: NameServer = ns) -> bool:
                a = await _addrs(t, ns.addr)
                return len(a) == 3 and a.get("0") == leader.cfg.address
            await wait_until(three, 5, f"3 brokers at {ns.addr}, leader as id 0")
        # a follower crashes (no unregister): both NameServers expire it
        follower_id = next(nid for nid, b in c.brokers.items() if b is not leader)
        gone = c.addr(follower_id)
        await c.stop_broker(follower_id, crash=True)
        for ns in c.namesrvs:
            async def expired(ns: NameServer = ns) -> bool:
                return gone not in (await _addrs(t, ns.addr)).values()
            await wait_until(expired, 5, f"{gone} expired at {ns.addr}")
        # a NameServer restarts empty and has the routes again within one heartbeat interval (0.5 s)
        await c.namesrvs[0].stop()
        fresh = NameServer(c.namesrvs[0].cfg.listen_port)
        c.namesrvs[0] = fresh
        await fresh.start()
        loop = asyncio.get_running_loop()
        began = loop.time()
        await wait_until(lambda: _has(t, fresh.addr, leader.cfg.address), 3, "routes at the restarted NameServer")
        assert loop.time() - began < 1.5
        # the follower comes back and re-registers under its own id
        await c.start_broker(follower_id)
        await wait_until(lambda: _has(t, fresh.addr, gone), 3, "the restarted follower registered")
    finally:
        await t.close()
        await c.stop()


async def _has(t: Transport, ns: str, addr: str) -> bool:
    return addr in (await _addrs(t, ns)).values()
