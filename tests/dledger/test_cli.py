"""The command lines: bad input exits 2 with a message; dledger-cluster up/status/down works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.dledger.harness import free_ports


def run(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout_s)


def test_node_with_missing_config_exits_2() -> None:
    r = run("dledger.apps.node_server", "-c", "/nonexistent/dledger.conf")
    assert r.returncode == 2 and "/nonexistent/dledger.conf" in r.stderr


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("flushDiskTyp=SYNC_FLUSH", "flushDiskTyp"),
        ("dLegerSelfId=n9", "dLegerSelfId"),
        ("listenPort=abc", "listenPort"),
    ],
)
def test_node_with_bad_config_names_the_key(tmp_path: Any, line: str, key: str) -> None:
    conf = tmp_path / "bad.conf"
    base = {
        "dLegerGroup": "G",
        "dLegerPeers": "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913",
        "dLegerSelfId": "n0",
        "storePathRootDir": str(tmp_path),
        "dLegerPeerPassword": "secret-password",
    }
    k, v = line.split("=", 1)
    base[k] = v
    conf.write_text("".join(f"{a}={b}\n" for a, b in base.items()))
    r = run("dledger.apps.node_server", "-c", str(conf))
    assert r.returncode == 2, r.stderr
    assert key in r.stderr and str(conf) in r.stderr


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "node1.example"])
def test_node_refuses_to_serve_its_unauthenticated_api_beyond_loopback(tmp_path: Any, host: str) -> None:
    """Issue 23, finding 7: a bare dledger-node accepted append, read and leadership transfer from
    anyone who reached its port. Its API has no authentication, so it binds to loopback only: any
    other ``brokerIP1`` stops the start (before: it served on 0.0.0.0)."""
    from dledger.apps.node_server import is_loopback

    conf = tmp_path / "open.conf"
    p = free_ports(4)
    conf.write_text(
        "dLegerGroup=G\n"
        f"dLegerPeers=n0-127.0.0.1:{p[0]};n1-127.0.0.1:{p[1]};n2-127.0.0.1:{p[2]}\n"
        f"dLegerSelfId=n0\nstorePathRootDir={tmp_path}\ndLegerPeerPassword=secret-password\n"
        f"listenPort={p[3]}\nbrokerIP1={host}\n"
    )
    r = run("dledger.apps.node_server", "-c", str(conf), timeout_s=30)
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])
    assert "loopback" in r.stderr and "no authentication" in r.stderr
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.9.9.9", "::1", "[::1]", "localhost", "LOCALHOST"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "10.1.2.3", "::", "node1.example", "127.0.0.1.evil"))


def test_cluster_usage_errors_exit_2(tmp_path: Any) -> None:
    assert run("dledger.apps.cluster", "up", "--dir", str(tmp_path), "--groups", "0").returncode == 2
    r = run("dledger.apps.cluster", "status", "--dir", str(tmp_path / "none"))
    assert r.returncode == 2 and "no cluster" in r.stderr
    assert run("dledger.apps.cluster", "frobnicate").returncode == 2


@pytest.mark.slow
def test_cluster_up_status_down(tmp_path: Any) -> None:
    raft, http = free_ports(1)[0], free_ports(1)[0]
    # pick bases whose derived ports (+0..2, +0/10/20) are very likely free: retry once if not
    raft_base, http_base = 20000 + raft % 10000, 30000 + http % 10000
    args = ["--dir", str(tmp_path), "--raft-port", str(raft_base), "--http-port", str(http_base), "--kind", "node"]
    try:
        up = run("dledger.apps.cluster", "up", *args, "--json", timeout_s=90)
        assert up.returncode == 0, up.stdout + up.stderr
        rows = json.loads(up.stdout)["processes"]
        assert sorted(r["role"] for r in rows) == ["FOLLOWER", "FOLLOWER", "LEADER"]
        assert all(r["alive"] and r["pid"] > 0 for r in rows)
        again = run("dledger.apps.cluster", "up", *args)
        assert again.returncode == 2 and "already running" in again.stderr
        st = run("dledger.apps.cluster", "status", "--dir", str(tmp_path), "--json")
        assert st.returncode == 0 and len(json.loads(st.stdout)["processes"]) == 3
        table = run("dledger.apps.cluster", "status", "--dir", str(tmp_path))
        assert "LEADER" in table.stdout and "RaftNode00-n0" in table.stdout
    finally:
        down = run("dledger.apps.cluster", "down", "--dir", str(tmp_path))
    assert down.returncode == 0
    pids = [r["pid"] for r in json.loads((tmp_path / "cluster.json").read_text())["processes"]]
    assert not any(os.path.exists(f"/proc/{pid}") and _is_live(pid) for pid in pids)


def _is_live(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"
