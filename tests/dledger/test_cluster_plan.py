"""``dledger-cluster``'s plan (pure) and its per-process / per-group commands' usage errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Any

import yaml

from dledger.apps.cluster import STATE_FILE, group_summaries
from dledger.apps.cluster_plan import (
    GROUPS_MAX,
    NAMESRV_MAX,
    ClusterSettings,
    acl_with_group,
    group_name,
    group_number,
    make_acl,
    plan,
    plan_group,
    port_clashes,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dledger.apps.cluster", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


def test_every_group_and_namesrv_gets_ports_of_its_own() -> None:
    procs = [p for p, _ in plan("/r", GROUPS_MAX, "127.0.0.1", 40911, 10911, "sync", {}, kind="broker",
                                namesrv=NAMESRV_MAX, acl=make_acl("/r", GROUPS_MAX))]
    assert port_clashes(procs) == []
    assert len([p for p in procs if p.kind == "broker"]) == 3 * GROUPS_MAX
    assert sorted({p.group for p in procs if p.kind == "broker"}) == [group_name(g) for g in range(GROUPS_MAX)]
    # the binary port (client + 1) is counted: a client base one below another group's collides
    clash = [p for p, _ in plan("/r", 2, "127.0.0.1", 40911, 10911, "sync", {}, kind="broker", namesrv=1,
                                namesrv_base=10912)]
    assert any("10912" in c for c in port_clashes(clash))


def test_every_broker_names_every_namesrv_and_its_group_account() -> None:
    acl = make_acl("/r", 3)
    planned = plan("/r", 3, "127.0.0.1", 40911, 10911, "sync", {}, kind="broker", namesrv=2, acl=acl)
    texts = {p.name: dict(line.split("=", 1) for line in t.splitlines() if "=" in line and not line.startswith("#"))
             for p, t in planned if p.kind == "broker"}
    assert {t["namesrvAddr"] for t in texts.values()} == {"127.0.0.1:9876;127.0.0.1:9877"}
    for name, t in texts.items():
        group = name.rsplit("-", 1)[0]
        assert t["brokerAccessKey"] == acl.brokers[group][0] and t["dLegerGroup"] == group
    passwords = {name.rsplit("-", 1)[0]: t["dLegerPeerPassword"] for name, t in texts.items()}
    assert len(set(passwords.values())) == 3  # one peer password per group


def test_add_group_plans_the_next_number_and_a_new_account() -> None:
    s = ClusterSettings(namesrv=2, extra={"defaultTopicQueueNums": "8"})
    assert ClusterSettings.from_json(json.loads(json.dumps(s.to_json()))) == s
    procs = plan_group("/r", s, 3, password="pw", acl_path="/r/conf/plain_acl.yml", broker_keys=("k", "s"))
    assert [p.name for p, _ in procs] == ["RaftNode03-n0", "RaftNode03-n1", "RaftNode03-n2"]
    assert [p.raft_port for p, _ in procs] == [41211, 41212, 41213]
    assert [p.http_port for p, _ in procs] == [11211, 11221, 11231]
    assert all("defaultTopicQueueNums=8" in t and "namesrvAddr=127.0.0.1:9876;127.0.0.1:9877" in t for _, t in procs)
    assert group_number("RaftNode03") == 3 and group_number("Other") is None
    text = make_acl("/r", 1).text()
    grown = yaml.safe_load(acl_with_group(text, "RaftNode01", ("RaftNode01-broker", "secret")))
    assert [a.get("brokerNames") for a in grown["accounts"]][-2:] == [["RaftNode00"], ["RaftNode01"]]
    try:
        acl_with_group(text, "RaftNode00", ("x", "y"))
    except ValueError as exc:
        assert "already" in str(exc)
    else:
        raise AssertionError("a second account for one group was accepted")


def test_group_summaries() -> None:
    def row(name: str, role: str | None, term: int | None, leader: str | None, writable: bool = False,
            alive: bool = True) -> dict[str, Any]:
        group, node = name.rsplit("-", 1)
        return {"name": name, "group": group, "node_id": node, "kind": "broker", "role": role, "term": term,
                "leader_id": leader, "writable": writable, "alive": alive}

    rows = [row("RaftNode00-n0", "LEADER", 3, "n0", True), row("RaftNode00-n1", "FOLLOWER", 3, "n0"),
            row("RaftNode00-n2", "FOLLOWER", 3, "n0"), row("RaftNode01-n0", None, None, None, alive=False),
            row("RaftNode01-n1", "CANDIDATE", 5, None), row("RaftNode01-n2", "FOLLOWER", 4, None)]
    out = {g["group"]: g for g in group_summaries(rows)}
    assert out["RaftNode00"] == {"group": "RaftNode00", "leader": "RaftNode00-n0", "term": 3, "writable": True,
                                 "alive": 3, "replicas": 3, "healthy": True}
    assert out["RaftNode01"]["leader"] is None and not out["RaftNode01"]["healthy"]
    assert out["RaftNode01"]["alive"] == 2 and out["RaftNode01"]["term"] == 5


def test_per_process_and_group_commands_refuse_bad_usage(tmp_path: Any) -> None:
    assert "no cluster" in cluster("stop", "--dir", str(tmp_path), "RaftNode00-n0").stderr
    procs = [{"name": "RaftNode00-n0", "group": "RaftNode00", "node_id": "n0", "pid": 0, "conf": "/nope.conf",
              "host": "127.0.0.1", "raft_port": 1, "http_port": 2, "log": str(tmp_path / "l"), "kind": "broker"}]
    (tmp_path / STATE_FILE).write_text(json.dumps({"processes": procs}))  # an older cluster.json: no settings
    r = cluster("kill", "--dir", str(tmp_path), "RaftNode09-n0")
    assert r.returncode == 2 and "unknown process name" in r.stderr and "RaftNode00-n0" in r.stderr
    r = cluster("add-group", "--dir", str(tmp_path))
    assert r.returncode == 2 and "no settings" in r.stderr
    r = cluster("remove-group", "--dir", str(tmp_path), "RaftNode00")
    assert r.returncode == 2 and "only group" in r.stderr
    r = cluster("remove-group", "--dir", str(tmp_path), "RaftNode05")
    assert r.returncode == 2 and "no group" in r.stderr
    r = cluster("start", "--dir", str(tmp_path), "--code-dir", str(tmp_path), "RaftNode00-n0")
    assert r.returncode == 2 and "not a dledger-mq source tree" in r.stderr
    try:  # n0's Raft port would be its own binary port (client + 1)
        r = cluster("up", "--dir", str(tmp_path / "x"), "--raft-port", "10912", "--http-port", "10911", "--wait", "1")
    finally:
        if (tmp_path / "x" / STATE_FILE).exists():  # it started something: stop it by PID
            cluster("down", "--dir", str(tmp_path / "x"))
    assert r.returncode == 2 and "clashes" in r.stderr


def test_up_refuses_ports_something_listens_on(tmp_path: Any) -> None:
    """A cluster left running on the same ports (a failed drill's NameServer) would take the new
    cluster's registrations and routes: ``up`` refuses, naming the port."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        try:
            r = cluster("up", "--dir", str(tmp_path / "c"), "--namesrv-port", str(port), "--raft-port", "1111",
                        "--http-port", "2222", "--wait", "1")
        finally:
            if (tmp_path / "c" / STATE_FILE).exists():
                cluster("down", "--dir", str(tmp_path / "c"))
    assert r.returncode == 2 and f"127.0.0.1:{port} (namesrv-0)" in r.stderr, r.stderr
