"""The fleet drills' pure figures (chaos/fleet_base.py): the other groups' latency during a group's
failover windows, from a history."""

from __future__ import annotations

import json
from typing import Any

from chaos.fleet_base import other_groups_during, read_faults


def send(broker: str | None, invoke_ms: int, complete_ms: int, outcome: str = "ok") -> dict[str, Any]:
    return {"broker": broker, "invoke_us": invoke_ms * 1000, "complete_us": complete_ms * 1000, "outcome": outcome}


def test_other_groups_latency_inside_and_outside_the_windows() -> None:
    sends = [send("G1", 0, 10), send("G2", 0, 20), send("G0", 0, 5),  # outside
             send("G1", 100, 180), send("G0", 100, 3100), send("G2", 150, 160),  # inside [100, 200)
             send(None, 120, 190, "unknown"), send("G0", 130, 199, "fail"), send("G1", 250, 260)]
    out = other_groups_during(sends, [(100_000, 200_000)], "G0")
    assert out["windows"] == 1
    assert out["steady"] == {"acked": 3, "not_acked": 0, "p50_ms": 10.0, "p99_ms": 20.0, "max_ms": 20.0}
    assert out["failover"] == {"acked": 2, "not_acked": 1, "p50_ms": 10.0, "p99_ms": 80.0, "max_ms": 80.0}


def test_read_faults_pairs_apply_and_heal(tmp_path: Any) -> None:
    lines = [{"time_us": 1, "fault": "k", "action": "apply"}, {"time_us": 2, "fault": "x", "action": "apply"},
             {"time_us": 3, "fault": "k", "action": "heal"}, {"time_us": 5, "fault": "k", "action": "apply"},
             {"time_us": 9, "fault": "k", "action": "heal"}]
    (tmp_path / "faults.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert read_faults(str(tmp_path), "k") == [(1, 3), (5, 9)]
    assert read_faults(str(tmp_path / "none"), "k") == []


def test_check_counts_duplicates_in_the_drain_only(tmp_path: Any) -> None:
    """An id a consumer received and the final drain read again is not stored twice; one the drain
    read twice is."""
    from chaos.fleet_base import FleetOptions, FleetRun

    hist = tmp_path / "history"
    hist.mkdir()

    def write(name: str, rows: list[dict[str, Any]]) -> None:
        (hist / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    write("sends-p0.jsonl", [{"unique_id": u, "outcome": "ok"} for u in ("a", "b", "c")])
    write("receipts-c0.jsonl", [{"unique_id": "a"}, {"unique_id": "b"}])
    write("drain.jsonl", [{"unique_id": "b"}, {"unique_id": "c"}, {"unique_id": "c"}])
    check = FleetRun(FleetOptions(run_dir=str(tmp_path)), "test").check()
    assert check["acknowledged"] == 3 and check["acknowledged_lost"] == 0
    assert check["stored_twice_or_more"] == 1  # c, not b
