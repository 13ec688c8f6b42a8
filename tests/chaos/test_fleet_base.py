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
