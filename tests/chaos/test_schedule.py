"""Fault schedules (pure)."""

from __future__ import annotations

import itertools
import random

import pytest

from chaos.schedule import build_schedule, window_at


def test_windows_alternate_fault_and_heal_and_cover_the_duration() -> None:
    ws = build_schedule(["kill-leader", "partition-leader", "latency"], 30, 600)
    assert len(ws) == 20
    assert [w.fault for w in ws[:6]] == ["kill-leader", None, "partition-leader", None, "latency", None]
    assert ws[6].fault == "kill-leader"  # cycles
    assert all(w.length_s == 30 for w in ws)
    assert all(a.end_s == b.start_s for a, b in itertools.pairwise(ws))
    assert ws[0].start_s == 0 and ws[-1].end_s == 600


def test_a_remainder_that_cannot_hold_a_pair_stays_quiet() -> None:
    ws = build_schedule(["kill-leader"], 10, 55)
    assert [w.fault for w in ws] == ["kill-leader", None, "kill-leader", None, None]
    assert ws[-1].start_s == 40 and ws[-1].end_s == 55


def test_random_order_is_seeded() -> None:
    faults = ["a", "b", "c", "d"]
    one = build_schedule(faults, 1, 40, order="random", rng=random.Random(5))
    two = build_schedule(faults, 1, 40, order="random", rng=random.Random(5))
    assert one == two
    assert {w.fault for w in one if w.fault} <= set(faults)
    assert len({w.fault for w in one if w.fault}) > 1


def test_bad_schedules_are_refused() -> None:
    with pytest.raises(ValueError):
        build_schedule([], 10, 100)
    with pytest.raises(ValueError):
        build_schedule(["x"], 0, 100)
    with pytest.raises(ValueError, match="shorter than one fault and one heal"):
        build_schedule(["x"], 30, 59)
    with pytest.raises(ValueError):
        build_schedule(["x"], 1, 10, order="shuffled")


def test_window_at() -> None:
    ws = build_schedule(["x"], 5, 20)
    assert window_at(ws, 0).fault == "x"  # type: ignore[union-attr]
    assert window_at(ws, 5).fault is None  # type: ignore[union-attr]
    assert window_at(ws, 12.5).fault == "x"  # type: ignore[union-attr]
    assert window_at(ws, 20) is None


def test_what_a_schedule_needs_of_the_workload_and_the_warning_when_it_falls_short() -> None:
    """Issue 28, evidence 4: a run on a loaded host managed ~11 sends/s and nothing said so."""
    from chaos.runner import workload_rate
    from chaos.schedule import needed_ack_rate

    assert needed_ack_rate(10) == 10.0 and needed_ack_rate(4) == 25.0 and needed_ack_rate(30) == 10.0
    windows = [{"fault": "crash-all", "start_s": 0.0, "acked": 3}]
    slow = workload_rate(1100, 100.0, 200.0, needed_ack_rate(4), windows)
    assert slow["achieved_ok_per_s"] == 11.0 and slow["needed_ok_per_s"] == 25.0
    assert slow["acked_in_fault_windows"] == windows
    below, share = slow["warnings"]
    assert "11.0 acknowledged sends/s" in below and "25/s the fault mix needs" in below
    assert "of the 200/s asked" in share
    fine = workload_rate(19_000, 100.0, 200.0, needed_ack_rate(10), [])
    assert fine["achieved_ok_per_s"] == 190.0 and fine["warnings"] == []
    assert workload_rate(1500, 100.0, None, 10.0, [])["warnings"] == []  # as fast as acknowledged: no ask
