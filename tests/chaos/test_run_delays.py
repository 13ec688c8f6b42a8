"""A short ``chaos run`` with delayed sends and a failing retry group (issue 14): kill-leader
windows, then the audit, which must pass with delayed, retried and dead-lettered messages present."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from chaos.history import read_jsonl
from chaos.workload import fail_plan

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_delays_and_retries_survive_kill_leader_and_pass_the_audit(tmp_path: Any) -> None:
    seed = random.randrange(1 << 30)
    base = random.Random(seed).randrange(20000, 27000, 100)
    run_dir = str(tmp_path / "run")
    cmd = [sys.executable, "-m", "chaos.cli", "run", "--dir", run_dir, "--faults", "kill-leader",
           "--interval", "20", "--duration", "40", "--recovery", "10", "--settle", "120", "--rate", "20",
           "--delayed-share", "0.2", "--fail-share", "0.1", "--seed", str(seed), "--port-base", str(base),
           "--progress", "10"]
    print(f"seed {seed}: {' '.join(cmd)}")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    print(r.stdout[-4000:], r.stderr[-4000:])
    with open(os.path.join(run_dir, "run.json")) as f:
        run = json.load(f)
    assert run["audit"]["ran"] and run["audit"]["exit_code"] == 0, r.stdout[-3000:]
    assert r.returncode == 0
    assert run["history_version"] == 4 and run["retry"]["max_reconsume_times"] == 2
    with open(os.path.join(run_dir, "audit", "summary.json")) as f:
        summary = json.load(f)
    counts = summary["counts"]
    for check in ("delayed_lost", "delivered_early", "delayed_twice", "retry_lost", "dlq_mismatch", "lost",
                  "unseen", "ack_offset_mismatch", "inconsistent_offsets"):
        assert counts[check] == 0, (check, summary["findings"][check]["sample"])
    # not vacuous: delayed messages (both kinds) delivered, retries through %RETRY%, messages in the DLQ
    delays, retries = summary["delays"], summary["retries"]
    assert delays["by_level"] > 0 and delays["by_deliver_time"] > 0
    assert delays["delivered"] == delays["acknowledged"]
    assert delays["lateness_all_ms"]["count"] == delays["acknowledged"]
    assert retries["via_retry_topic"] > 0 and retries["consumed_after_retry"] > 0
    assert retries["in_dlq"] > 0 and retries["in_dlq"] == retries["expected_in_dlq"]
    # the DLQ holds exactly the ids the plan fails every time (every acknowledged one of them)
    hist = os.path.join(run_dir, "history")
    sends = [s for i in range(4) for s in read_jsonl(os.path.join(hist, f"sends-p{i}.jsonl"))]
    always = {s["unique_id"] for s in sends if s["outcome"] == "ok" and fail_plan(s["unique_id"], 0.1) == "always"}
    dlq = Counter(d["unique_id"] for d in read_jsonl(os.path.join(hist, "dlq.jsonl")))
    assert set(dlq) == always
    assert {d["reconsume_times"] for d in read_jsonl(os.path.join(hist, "dlq.jsonl"))} == {2}
    with open(os.path.join(run_dir, "audit", "report.html")) as f:
        html = f.read()
    assert "Delayed messages" in html and "Retry group and DLQ" in html and "dlq_mismatch" in html
