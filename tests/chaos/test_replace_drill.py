"""``chaos replace`` (issue 27, part 4) against real processes: a follower killed and replaced under
load through a Raft membership change, the old leader killed afterwards, then the Spark audit over
the run's history (the membership change under faults): clean, 0 acknowledged lost."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from typing import Any

import pytest

from chaos.target import REPO


@pytest.mark.slow
@pytest.mark.timeout(900)  # the drill (~15 s) and its Spark audit (~40 s quiet, minutes on a loaded machine)
def test_replace_under_load_then_lose_the_old_leader_audits_clean(tmp_path: Any) -> None:
    seed = random.randrange(1 << 30)
    base = random.Random(seed).randrange(20000, 27000, 100)
    print(f"seed {seed}, port base {base}")
    run_dir = str(tmp_path / "run")
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "replace", "--dir", run_dir, "--port-base", str(base),
                        "--seed", str(seed), "--steady", "1"], capture_output=True, text=True, timeout=850, cwd=REPO)
    print(r.stdout[-4000:], r.stderr[-4000:])
    with open(os.path.join(run_dir, "run.json")) as f:
        run = json.load(f)
    s = run["replace_summary"]
    assert run["status"] == "done" and run["audit"]["exit_code"] == 0
    assert s["lost"] == 0 and all(s["targets"].values()), s
    dead_id = s["replaced"]["replaced"].rsplit("-", 1)[1]
    assert set(s["replaced"]["membership"]["voters"]) == ({"n0", "n1", "n2"} - {dead_id}) | {s["replaced"]["peer_id"]}
    assert run["quick_check"]["acknowledged"] > 100
    assert r.returncode == 0
