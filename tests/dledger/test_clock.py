"""One clock: pysyncobj and dledger read the same clock, whatever the host's clocks do.

The regression: pysyncobj compared its deadlines against CLOCK_MONOTONIC_RAW while dledger wrote
some of them from CLOCK_MONOTONIC; the two drift apart on a running host, and an idle group
re-elected every 0.8 s. Here each node runs on a clock hours away from the system clocks (and
from each other), running fast or slow: any deadline still written from one clock and compared
against another would be off by hours, not by a fraction of a second.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dledger import clock as dl_clock
from dledger.clock import ManualClock, SkewedClock, parse_skew
from tests.dledger.harness import InProcCluster, wait_until


def test_skewed_clock_moves_both_faces_together() -> None:
    base = ManualClock(monotonic_s=100.0, wall_s=1_700_000_000.0)
    fast = SkewedClock(3600.0, drift_ppm=100_000, base=base)  # +1 h, 10 % fast
    assert fast.monotonic() == pytest.approx(3700.0)
    assert fast.wall() == pytest.approx(1_700_003_600.0)
    base.advance(10.0)
    assert fast.monotonic() == pytest.approx(3711.0)
    assert fast.wall() == pytest.approx(1_700_003_611.0)


def test_skewed_clock_refuses_negative_readings() -> None:
    with pytest.raises(ValueError, match="negative"):
        SkewedClock(-200.0, base=ManualClock(monotonic_s=100.0))


def test_parse_skew() -> None:
    assert parse_skew("7").offset_s == 7.0
    clock = parse_skew("3600,-250")
    assert (clock.offset_s, clock.drift_ppm) == (3600.0, -250.0)
    for bad in ("", "x", "1,2,3", "1,200000"):
        with pytest.raises(ValueError):
            parse_skew(bad)


def test_pysyncobj_reads_the_thread_clock() -> None:
    import pysyncobj.syncobj
    import pysyncobj.tcp_connection
    import pysyncobj.transport

    dl_clock.bind_pysyncobj()
    manual = ManualClock(monotonic_s=12345.0)
    dl_clock.use(manual)
    try:
        for module in (pysyncobj.syncobj, pysyncobj.tcp_connection, pysyncobj.transport):
            assert module.monotonicTime() == 12345.0  # type: ignore[attr-defined]
    finally:
        dl_clock.use(dl_clock.process_clock())


async def test_idle_group_on_skewed_clocks_keeps_its_leader(tmp_path: Path) -> None:
    # Offsets in both directions, hours apart, and drifting apart at +-500 ppm.
    behind_s = -min(60.0, time.monotonic() / 2)
    cluster = InProcCluster(str(tmp_path))
    cluster.clocks = {
        "n0": SkewedClock(7200.0, drift_ppm=500),
        "n1": SkewedClock(behind_s, drift_ppm=-500),
        "n2": SkewedClock(3 * 3600.0 + 7.0),
    }
    cluster.overrides = {"heartbeat_ms": 50, "retention_check_ms": 200}
    await cluster.start()
    try:
        leader = await cluster.leader()
        await leader.append([b"x"])
        before = {nid: await n.status() for nid, n in cluster.nodes.items()}
        observe_s = 3.0
        end = time.monotonic() + observe_s
        await wait_until(lambda: time.monotonic() > end, observe_s + 1, "the observation window")
        after = {nid: await n.status() for nid, n in cluster.nodes.items()}
        for nid in cluster.ids:
            assert after[nid]["term"] == before[nid]["term"], f"{nid} saw an election"
            assert after[nid]["leader_id"] == leader.settings.self_id
        for follower in cluster.followers(leader):
            st_before = before[follower.settings.self_id]
            st = after[follower.settings.self_id]
            received = st["counters"]["appends_received"] - st_before["counters"]["appends_received"]
            # One append every 50 ms: ~60 in 3 s; a clock mix would give a handful (or thousands).
            assert 30 <= received <= 200, (follower.settings.self_id, received)
            assert st["max_append_gap_ms"] < 300, st["max_append_gap_ms"]
        assert after[leader.settings.self_id]["live_followers"] == 2
    finally:
        await cluster.stop()
