"""The command lines against a real process cluster: dledger-cluster (NameServer + broker group),
mqadmin, dledger-broker's config errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from dledger.apps.cluster import is_running
from tests.broker.procs import REPO, ProcCluster


def run(*args: str, env: dict[str, str] | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout_s, cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def test_broker_bad_config_exits_2(tmp_path: Any) -> None:
    bad = tmp_path / "b.conf"
    bad.write_text("brokerName=RaftNode00\ndLegerGroup=RaftNode00\n")
    r = run("broker.server", "-c", str(bad))
    assert r.returncode == 2 and "dLegerPeers" in r.stderr
    with open(os.path.join(REPO, "conf", "broker-n0.conf")) as f:
        good = f.read()
    bad.write_text(good.replace("brokerName=RaftNode00", "brokerName=Other"))
    r = run("broker.server", "-c", str(bad))
    assert r.returncode == 2 and "brokerName" in r.stderr
    bad.write_text(good + "\nnoSuchKey=1\n")
    r = run("broker.server", "-c", str(bad))
    assert r.returncode == 2 and "noSuchKey" in r.stderr
    assert run("broker.server").returncode == 2  # -c is required


@pytest.mark.slow
def test_cluster_up_status_mqadmin_start_down(tmp_path: Any) -> None:
    c = ProcCluster(str(tmp_path), namesrv=2)
    try:
        up = c.up()
        kinds = sorted(p["kind"] for p in up["processes"])
        assert kinds == ["broker", "broker", "broker", "namesrv", "namesrv"]
        st = run("dledger.apps.cluster", "status", "--dir", str(tmp_path), "--json")
        assert st.returncode == 0, st.stderr
        rows = json.loads(st.stdout)["processes"]
        for row in rows:
            assert row["alive"] and row["pid"] > 0 and row["http_port"] > 0
        brokers = [r for r in rows if r["kind"] == "broker"]
        assert sorted(r["role"] for r in brokers) == ["FOLLOWER", "FOLLOWER", "LEADER"]
        assert len({r["term"] for r in brokers}) == 1
        env = c.env
        cl = run("broker.tools.mqadmin", "clusterList", "--json", env=env)
        assert cl.returncode == 0, cl.stderr
        assert "RaftNode00" in cl.stdout
        assert run("broker.tools.mqadmin", "updateTopic", "-c", "DefaultCluster", "-t", "CliT", "-r", "2", "-w", "2",
                   env=env).returncode == 0
        sent = run("broker.tools.mqadmin", "sendMessage", "-t", "CliT", "-p", "hi there", "-k", "k1", "--json", env=env)
        assert sent.returncode == 0, sent.stderr
        got = run("broker.tools.mqadmin", "queryMsgByKey", "-t", "CliT", "-k", "k1", "--json", env=env)
        assert got.returncode == 0, got.stderr
        assert "hi there" in got.stdout or "aGkgdGhlcmU=" in got.stdout, got.stdout
        missing = run("broker.tools.mqadmin", "topicRoute", "-t", "NoSuchTopic", env=env)
        assert missing.returncode == 1 and "TOPIC_NOT_EXIST" in missing.stderr
        assert run("broker.tools.mqadmin", "topicRoute", "-t", "bad topic!", env=env).returncode == 2
        # kill a follower, `start` brings exactly it back
        follower = next(p for p in c.brokers() if p.name == next(r["name"] for r in brokers if r["role"] == "FOLLOWER"))
        c.kill9(follower)
        again = c.restart(follower)
        assert again.pid != follower.pid
        st = run("dledger.apps.cluster", "status", "--dir", str(tmp_path), "--json")
        assert all(r["alive"] for r in json.loads(st.stdout)["processes"])
    finally:
        c.down()
    assert not any(is_running(p) for p in c.processes())
