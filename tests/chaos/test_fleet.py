"""``chaos grow-shrink`` (issue 27, part 2) against real processes: a group added under load and the
topic extended onto it, then the oldest group retired (wipeWritePerm, drained to zero lag, removed)
with every acknowledged message consumed — the run's own check and the Spark audit over its history
and every replica's log, the retired group's included."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from typing import Any

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
@pytest.mark.timeout(900)  # the drill (~60 s) and its Spark audit (~190 s on the loaded 2-core machine)
def test_grow_then_retire_a_group_under_load(tmp_path: Any) -> None:
    seed = random.randrange(1 << 30)
    base = random.Random(seed).randrange(20000, 27000, 100)
    print(f"seed {seed}, port base {base}")
    run_dir = str(tmp_path / "run")
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "grow-shrink", "--dir", run_dir, "--groups", "2",
                        "--steady", "2", "--port-base", str(base), "--seed", str(seed)],
                       capture_output=True, text=True, timeout=840, cwd=REPO)
    print(r.stdout[-4000:], r.stderr[-4000:])
    with open(os.path.join(run_dir, "run.json")) as f:
        run = json.load(f)
    gs = run["grow_shrink"]
    assert run["status"] == "done", r.stderr[-2000:]
    assert gs["added"]["group"] == "RaftNode02" and gs["retired"]["group"] == "RaftNode00"
    assert gs["retired"]["messages"] > 0  # the retired group had taken writes, every one consumed
    assert run["quick_check"]["acknowledged"] > 500 and run["quick_check"]["acknowledged_lost"] == 0
    # the retired group left the cluster (its data stays for the audit); the added one is live
    assert sorted({row["group"] for row in run["replicas"]}) == ["RaftNode01", "RaftNode02"]
    assert os.path.isdir(os.path.join(run_dir, "cluster", "data", "RaftNode00", "dledger-n0"))
    assert run["audit"]["ran"] and run["audit"]["exit_code"] == 0
    with open(os.path.join(run_dir, "audit", "summary.json")) as f:
        summary = json.load(f)
    print(json.dumps(summary.get("counts", summary), default=str)[:2000])
    assert r.returncode == 0
