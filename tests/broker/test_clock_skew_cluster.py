"""One clock, as OS processes: each replica of a broker group runs on a clock of its own (hours
apart, both directions, drifting +-500 ppm against each other and against the system clocks).

What the clock issue saw on a host up for two hours was an idle group electing a new leader every
0.8 s. Here the group stays idle for 30 s and must hold its leader with heartbeats at their period,
and the leader's retention must still count both followers as live.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from broker.client.transport import Transport
from tests.broker.procs import ProcCluster

pytestmark = pytest.mark.slow


async def test_skewed_process_clocks_keep_one_leader_for_30_s_idle(tmp_path: Any) -> None:
    c = ProcCluster(str(tmp_path), clock_skew=True, extra={"retentionCheckIntervalMs": "500"})
    t = Transport(timeout_s=3.0, credentials=None)
    try:
        c.up()
        skews = {p.node_id: p.clock_skew for p in c.brokers()}
        assert len(set(skews.values())) == 3 and all(skews.values()), skews

        async def statuses() -> dict[str, Any]:
            return {p.node_id: await t.call(c.addr(p), "GET", "/v1/status") for p in c.brokers()}

        before = await statuses()
        end = time.monotonic() + 30
        while time.monotonic() < end:
            await asyncio.sleep(1.0)  # pacing of the observation, not synchronisation
        after = await statuses()
        leader = next(n for n, st in after.items() if st["role"] == "LEADER")
        for n, st in after.items():
            assert st["term"] == before[n]["term"], f"{n}: term moved {before[n]['term']} -> {st['term']}"
            assert st["leader_id"] == leader
            assert st["raft"]["elections"] == before[n]["raft"]["elections"], st["raft"]
            assert st["raft"]["prevotes_started"] == before[n]["raft"]["prevotes_started"], st["raft"]
            if n != leader:
                # heartbeats every 50 ms on the followers' own clocks; a clock mix showed 300+ ms
                assert st["raft"]["max_append_gap_ms"] < 250, st["raft"]
        assert after[leader]["raft"]["live_followers"] == 2
    finally:
        await t.close()
        c.down()
