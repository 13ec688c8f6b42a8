"""The official mqadmin (rocketmq-tools 4.9.8, ``MQAdminStartup``), unmodified, against the NameServer of a
real ``dledger-cluster up`` (ACL on): clusterList, topicList, topicRoute, getNamesrvConfig, the KV config
with and without the admin's ``AclClientRPCHook`` credentials, and a leader kill seen in clusterList.
Its output is parsed and checked (MQAdminStartup prints exceptions and exits 0 anyway).

The brokers may still speak HTTP only: these commands read the NameServer, except clusterList's per-broker
runtime figures (GET_BROKER_RUNTIME_INFO to each broker), which it prints as empty when a broker does not
answer them. The classpath comes from the wire tier's build (``.ci/setup.sh``: ``mvn -Padmin4`` ->
tests/wire/java/target/admin4.cp), or from ``WIRE_ADMIN4_CP`` (a file holding a classpath)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.broker.procs import REPO, ProcCluster

pytestmark = pytest.mark.slow

MQADMIN_MAIN = "org.apache.rocketmq.tools.command.MQAdminStartup"
LOGBACK = """<configuration>
  <appender name="STDERR" class="ch.qos.logback.core.ConsoleAppender">
    <target>System.err</target><encoder><pattern>%-5level %logger{20} - %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="STDERR"/></root>
</configuration>
"""


def admin_classpath() -> str:
    path = os.environ.get("WIRE_ADMIN4_CP") or os.path.join(REPO, "tests", "wire", "java", "target", "admin4.cp")
    assert os.path.isfile(path), (f"no rocketmq-tools 4.9.8 classpath at {path}: run `bash .ci/setup.sh` (it builds "
                                  "the wire tier's Java programs) or set WIRE_ADMIN4_CP to a classpath file")
    assert shutil.which("java"), "no java on PATH: run `bash .ci/setup.sh`"
    with open(path) as f:
        return f.read().strip()


def mqadmin_home(root: str, credentials: tuple[str, str] | None) -> str:
    """ROCKETMQ_HOME: conf/logback_tools.xml, and conf/tools.yml (the AclClientRPCHook's account) if given."""
    home = os.path.join(root, "mqadmin-home")
    os.makedirs(os.path.join(home, "conf"), exist_ok=True)
    with open(os.path.join(home, "conf", "logback_tools.xml"), "w") as f:
        f.write(LOGBACK)
    tools = os.path.join(home, "conf", "tools.yml")
    if credentials is not None:
        fd = os.open(tools, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"accessKey: {credentials[0]}\nsecretKey: {credentials[1]}\n")
    elif os.path.exists(tools):
        os.remove(tools)
    return home


def mqadmin(cp: str, home: str, namesrv: str, *args: str) -> str:
    r = subprocess.run(
        ["java", "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", f"-Duser.home={home}", f"-Drocketmq.home.dir={home}",
         f"-Drocketmq.client.logRoot={home}/logs", "-cp", cp, MQADMIN_MAIN, *args, "-n", namesrv],
        capture_output=True, text=True, timeout=120, env={**os.environ, "ROCKETMQ_HOME": home})
    return r.stdout + "\n--- stderr\n" + r.stderr


def table(text: str, header: str) -> list[list[str]]:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(header):
            return [row.split() for row in lines[i + 1:] if row.strip() and not row.startswith(("#", "---"))
                    and not row.startswith(("\t", "java.", "org.", "Caused"))]
    raise AssertionError(f"no table {header!r} in:\n{text[-3000:]}")


def cluster_rows(text: str) -> dict[str, str]:
    """clusterList: BID -> address of RaftNode00's rows."""
    return {row[2]: row[3] for row in table(text, "#Cluster Name") if row[:2] == ["DefaultCluster", "RaftNode00"]}


def wait_for(what: str, timeout_s: float, fn: Any) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        done, value = fn()
        if done:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s; last:\n{value}"


def ours(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**os.environ, **env})


def test_official_mqadmin_against_the_namesrv(tmp_path: Any) -> None:
    cp = admin_classpath()
    c = ProcCluster(str(tmp_path / "cluster"))
    try:
        c.up()
        ns = c.namesrv_addr
        creds = c.credentials
        admin_home = mqadmin_home(str(tmp_path / "admin"), (creds.access_key, creds.secret_key))
        anon_home = mqadmin_home(str(tmp_path / "anon"), None)
        st = json.loads(ours("dledger.apps.cluster", "status", "--dir", c.root, "--json", env={}).stdout)
        brokers = [r for r in st["processes"] if r["kind"] == "broker"]
        leader = next(f"{r['host']}:{r['http_port']}" for r in brokers if r["role"] == "LEADER")
        # a follower registers under its place in dLegerPeers + 1 (RocketMQ's DLedger broker ids)
        expected = {("0" if r["role"] == "LEADER" else str(i + 1)): f"{r['host']}:{r['http_port']}"
                    for i, r in enumerate(brokers)}

        # clusterList: every replica, the leader as BID 0
        rows = wait_for("three replicas in clusterList", 30, lambda: (
            len(cluster_rows(out := mqadmin(cp, admin_home, ns, "clusterList"))) == 3, out))
        assert cluster_rows(mqadmin(cp, admin_home, ns, "clusterList")) == expected, rows

        # a topic made with our own tool is in topicList and topicRoute
        made = ours("broker.tools.mqadmin", "updateTopic", "-c", "DefaultCluster", "-t", "WireTopic", "-r", "4",
                    "-w", "4", env=c.env)
        assert made.returncode == 0, made.stderr
        listed = wait_for("WireTopic in topicList", 40, lambda: (
            "WireTopic" in (out := mqadmin(cp, anon_home, ns, "topicList")).split(), out))
        assert "TBW102" in listed.split()  # the template topic of auto-created topics
        route = mqadmin(cp, anon_home, ns, "topicRoute", "-t", "WireTopic")
        assert re.search(rf'"brokerAddrs":\{{\s*0:"{re.escape(leader)}"', route), route
        assert '"brokerName":"RaftNode00"' in route and '"cluster":"DefaultCluster"' in route, route
        assert re.search(r'"perm":6,\s*"readQueueNums":4,\s*"topicSysFlag":0,\s*"writeQueueNums":4', route), route
        missing = mqadmin(cp, anon_home, ns, "topicRoute", "-t", "NoSuchTopic")
        assert "CODE: 17" in missing and "No topic route info in name server for the topic: NoSuchTopic" in missing

        # getNamesrvConfig
        conf = mqadmin(cp, anon_home, ns, "getNamesrvConfig")
        kv = {m[0]: m[1] for m in re.findall(r"^(\w+)\s+=\s+(\S*)$", conf, re.M)}
        assert kv.get("listenPort") == ns.rsplit(":", 1)[1] and kv.get("aclEnable") == "true", conf
        assert kv.get("remotingAclV1") == "accept" and kv.get("tlsEnable") == "false", conf

        # the KV config: the admin's signature may write, nobody else
        out = mqadmin(cp, admin_home, ns, "updateKvConfig", "-s", "WIRE", "-k", "k1", "-v", "v1")
        assert "create or update kv config to namespace success." in out, out
        out = mqadmin(cp, anon_home, ns, "updateKvConfig", "-s", "WIRE", "-k", "k2", "-v", "v2")
        assert "CODE: 16" in out and "NO_CREDENTIALS" in out, out
        out = mqadmin(cp, admin_home, ns, "updateOrderConf", "-t", "WireTopic", "-m", "put", "-v", "RaftNode00:4")
        assert "update orderConf success." in out, out
        out = mqadmin(cp, anon_home, ns, "updateOrderConf", "-t", "WireTopic", "-m", "get")
        assert "orderConf=[RaftNode00:4]" in out, out
        out = mqadmin(cp, admin_home, ns, "deleteKvConfig", "-s", "WIRE", "-k", "k1")
        assert "delete kv config from namespace success." in out, out

        # the leader killed: another replica is BID 0 in clusterList
        victim = next(p for p in c.brokers() if f"{p.host}:{p.http_port}" == leader)
        c.kill9(victim)
        after = wait_for("a new leader as BID 0", 60, lambda: (
            cluster_rows(out := mqadmin(cp, admin_home, ns, "clusterList")).get("0") not in (None, leader), out))
        assert cluster_rows(after)["0"] in expected.values()
    finally:
        c.down()
