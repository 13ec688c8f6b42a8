"""A full disk on a real file system (issue 27 part 5): the drill in disk_full_drill.py runs with
n0's data directory on a 4 MiB tmpfs mounted in a private user and mount namespace
(``unshare --user --map-root-user --mount``: no root needed where unprivileged user namespaces are
allowed). The kernel's own ENOSPC, not an injected one."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TMPFS_BYTES = 4 << 20


def _unshare_prefix() -> list[str]:
    return ["unshare", "--user", "--map-root-user", "--mount"]


def _can_mount_tmpfs(tmp_path: Path) -> str | None:
    """None when a private tmpfs can be mounted here, else why not."""
    if shutil.which("unshare") is None:
        return "no unshare(1) on this machine"
    probe = tmp_path / "probe"
    probe.mkdir()
    cmd = f"mount -t tmpfs -o size=64k tmpfs {shlex.quote(str(probe))}"
    r = subprocess.run([*_unshare_prefix(), "sh", "-c", cmd], capture_output=True, text=True, timeout=30)
    return None if r.returncode == 0 else f"cannot mount a tmpfs in a user namespace: {r.stderr.strip()}"


@pytest.mark.slow
def test_a_replica_on_a_full_tmpfs_refuses_steps_down_and_resumes(tmp_path: Path) -> None:
    why = _can_mount_tmpfs(tmp_path)
    if why is not None:
        pytest.skip(why)  # said, not silent: this test needs a real small file system
    root = tmp_path / "group"
    (root / "n0").mkdir(parents=True)
    script = (
        f"mount -t tmpfs -o size={TMPFS_BYTES} tmpfs {shlex.quote(str(root / 'n0'))} && "
        f"exec {shlex.quote(sys.executable)} -m tests.dledger.disk_full_drill {shlex.quote(str(root))}"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [*_unshare_prefix(), "sh", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 0, f"drill failed (exit {r.returncode}):\n{r.stderr[-4000:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print(json.dumps(out, indent=1))
    assert out["acked_until_full"] > 0 and "no room" in out["refusal"]
    assert out["chain_crc_equal"] and out["n0_fatal"] is None
    assert out["reopened_entries"] >= out["caught_up_to"]
