"""``chaos rolling-restart`` (issue 27, part 3): the pure parts, then the drill against real processes —
a roll of two groups on this checkout, and an upgrade from the previous release (.ci/previous-release)
through a mixed group, NameServers included, audited."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from typing import Any

import pytest

from chaos.fleet_base import send_gaps
from chaos.rolling import judge, roll_order
from chaos.target import Member

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def send(producer: str, invoke_ms: int, complete_ms: int, outcome: str = "ok") -> dict[str, Any]:
    return {"producer": producer, "invoke_us": invoke_ms * 1000, "complete_us": complete_ms * 1000,
            "outcome": outcome}


def test_send_gaps_are_the_longest_wait_between_two_acks_per_producer() -> None:
    sends = [send("p0", 0, 10), send("p0", 10, 30), send("p0", 30, 900, "unknown"), send("p0", 900, 1500),
             send("p0", 1500, 1510), send("p1", 0, 5), send("p1", 5, 400)]
    gaps = send_gaps(sends)
    assert gaps["producers"]["p0"] == {"acked": 4, "not_acked": 1, "gap_ms": 1470.0, "gap_end_us": 1_500_000,
                                       "max_ack_ms": 600.0}
    assert gaps["producers"]["p1"]["gap_ms"] == 395.0
    assert gaps["worst_gap_ms"] == 1470.0 and gaps["worst_ack_ms"] == 600.0 and gaps["not_acked"] == 1
    assert send_gaps([]) == {"producers": {}, "worst_gap_ms": 0.0, "worst_ack_ms": 0.0, "not_acked": 0}


def test_roll_order_and_targets() -> None:
    ms = [Member(f"G-n{i}", "G", f"n{i}", f"h:{i}") for i in range(3)]
    assert [m.name for m in roll_order(ms, "G-n0")] == ["G-n1", "G-n2", "G-n0"]
    assert [m.name for m in roll_order(ms, None)] == ["G-n0", "G-n1", "G-n2"]
    steps = [{"was_leader": False, "term_steps": 0, "handed_over": False},
             {"was_leader": True, "term_steps": 1, "handed_over": True},
             {"was_leader": False, "kind": "namesrv", "term_steps": 0, "handed_over": False}]
    ok = judge(steps, send_gaps([send("p0", 0, 10), send("p0", 10, 900)]), 0)
    assert ok["targets_met"] and ok["namesrv_restarts"] == 1 and ok["handed_over"] == 1
    two = judge([*steps, {"was_leader": True, "term_steps": 2, "handed_over": True}], send_gaps([]), 0)
    assert not two["targets"]["one_change_per_leader_stop"]
    moved = judge([{"was_leader": False, "term_steps": 1, "handed_over": False}], send_gaps([]), 0)
    assert not moved["targets"]["one_change_per_leader_stop"]  # a follower's restart must not cost an election
    slow = judge(steps, send_gaps([send("p0", 0, 10), send("p0", 10, 1200)]), 0)
    assert slow["targets"] == {"no_acknowledged_lost": True, "one_change_per_leader_stop": True,
                               "no_send_failed": True, "gap_within_1s": False}
    assert not judge(steps, send_gaps([send("p0", 0, 10, "fail")]), 3)["targets_met"]


def previous_release() -> str:
    with open(os.path.join(REPO, ".ci", "previous-release")) as f:
        return next(line.strip() for line in f if line.strip() and not line.startswith("#"))


def rolling(run_dir: str, *args: str, timeout_s: float = 900) -> tuple[int, dict[str, Any]]:
    seed = random.randrange(1 << 30)
    base = random.Random(seed).randrange(20000, 27000, 100)
    print(f"seed {seed}, port base {base}")
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "rolling-restart", "--dir", run_dir, "--port-base",
                        str(base), "--seed", str(seed), *args], capture_output=True, text=True, timeout=timeout_s,
                       cwd=REPO)
    print(r.stdout[-4000:], r.stderr[-4000:])
    with open(os.path.join(run_dir, "run.json")) as f:
        return r.returncode, json.load(f)


@pytest.mark.slow
def test_rolling_restart_of_two_groups_hands_over_and_loses_nothing(tmp_path: Any) -> None:
    rc, run = rolling(str(tmp_path / "run"), "--groups", "2", "--steady", "1", "--no-audit")
    s = run["rolling_summary"]
    print("worst send gap", s["worst_gap_ms"], "ms; slowest ack", s["worst_ack_ms"], "ms (not asserted: timing)")
    assert run["status"] == "done"
    assert s["restarts"] == 6 and s["leader_restarts"] == 2
    assert s["handed_over"] == 2, run["steps"]  # each stopped leader handed over on SIGTERM
    assert s["term_steps_max_per_leader_stop"] == 1 and s["term_steps_max_per_follower_stop"] == 0, run["steps"]
    assert s["lost"] == 0 and s["sends_not_acked"] == 0, run["send_gaps"]
    assert run["quick_check"]["acknowledged"] > 500
    assert rc in (0, 1) and (rc == 0) == s["targets_met"]  # 1 only for a missed gap target on a loaded host


@pytest.mark.slow
@pytest.mark.timeout(900)  # the drill (~90 s) and its Spark audit (~190 s on the loaded 2-core machine)
def test_upgrade_from_the_previous_release_through_a_mixed_group(tmp_path: Any) -> None:
    rel = previous_release()
    rc, run = rolling(str(tmp_path / "run"), "--groups", "1", "--namesrv", "2", "--roll-namesrv", "--steady", "1",
                      "--upgrade-from", rel)
    s = run["rolling_summary"]
    assert run["upgrade"]["from_commit"] == rel and run["status"] == "done"
    assert [st["code"] for st in run["steps"]] == ["new"] * 5  # 2 NameServers, then 3 replicas
    assert s["namesrv_restarts"] == 2 and s["leader_restarts"] == 1 and s["handed_over"] == 1, run["steps"]
    assert s["term_steps_max_per_follower_stop"] == 0, run["steps"]
    assert s["lost"] == 0 and s["sends_not_acked"] == 0, run["send_gaps"]
    assert run["audit"]["ran"] and run["audit"]["exit_code"] == 0
    print("term steps of the old leader's hand-over:", s["term_steps_max_per_leader_stop"],
          "(a release before issue 27 does not hold appends while transferring)")
    assert rc in (0, 1)
