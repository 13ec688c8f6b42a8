"""The wire tier's plumbing: the two targets (our ``dledger-cluster`` or the Apache RocketMQ 5.3.1 reference),
and runners for the official clients' programs (Java 4.9.8 / 5.3.1, Go) and the official mqadmin 4.9.8.

Everything the programs need was built by ``.ci/setup.sh`` (tests/wire/java/target, tests/wire/.build); a
missing build fails the test with the command to run, never skips it."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import shlex
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

WIRE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(WIRE))
JAVA_DIR = os.path.join(WIRE, "java")
GO_BIN = os.path.join(WIRE, ".build", "wirego")
CLIENTS = {"4.9.8": "rmq4", "5.3.1": "rmq5"}
ADMIN_PROFILE = "admin4"
MQADMIN_MAIN = "org.apache.rocketmq.tools.command.MQAdminStartup"


def _reference_ctl() -> str:
    """The reference's ctl.sh: WIRE_RMQ_CTL, else shared/bench/rocketmq beside the checkout (CI: ../shared) or
    beside its parent (a worktree under wt/)."""
    if os.environ.get("WIRE_RMQ_CTL"):
        return os.environ["WIRE_RMQ_CTL"]
    for up in (os.path.dirname(REPO), os.path.dirname(os.path.dirname(REPO))):
        path = os.path.join(up, "shared", "bench", "rocketmq", "ctl.sh")
        if os.path.isfile(path):
            return path
    return os.path.join(os.path.dirname(REPO), "shared", "bench", "rocketmq", "ctl.sh")


RMQ_CTL = _reference_ctl()
RMQ_NAMESRV = "127.0.0.1:19876"

LOGBACK_TOOLS = """<configuration>
  <appender name="STDERR" class="ch.qos.logback.core.ConsoleAppender">
    <target>System.err</target>
    <encoder><pattern>%d{HH:mm:ss.SSS} %-5level %logger{20} - %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="STDERR"/></root>
</configuration>
"""


def fresh(name: str) -> str:
    """A topic or group name unique to this run ([a-zA-Z0-9_-], well under 127 characters)."""
    return f"w{secrets.token_hex(4)}_{name.replace('-', '_')}"


def build_hint() -> str:
    return ("the wire tier's programs are not built: run `bash .ci/setup.sh` "
            "(it builds tests/wire/java and tests/wire/go)")


def java_classpath(profile: str) -> str:
    cp_file = os.path.join(JAVA_DIR, "target", f"{profile}.cp")
    classes = os.path.join(JAVA_DIR, "target", profile, "classes")
    assert os.path.isfile(cp_file) and os.path.isdir(classes), build_hint()
    with open(cp_file) as f:
        return classes + os.pathsep + f.read().strip()


def port_open(addr: str, timeout_s: float = 1.0) -> bool:
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


# ------------------------------------------------------------------------------------------------ probe

def acl_signature(ext: dict[str, str], body: bytes, secret_key: str) -> str:
    """AclClientRPCHook's signature (NOTES.md section 10): Base64(HMAC-SHA1(sk, values sorted by key + body))."""
    content = "".join(v for k, v in sorted(ext.items()) if k != "Signature").encode() + body
    return base64.b64encode(hmac.new(secret_key.encode(), content, hashlib.sha1).digest()).decode()


def remoting_call(addr: str, code: int, credentials: tuple[str, str] | None,
                  timeout_s: float = 5.0) -> tuple[bool, str, bytes]:
    """One request ``code`` in RocketMQ's remoting framing, JSON header, signed when ACL is on, as the 4.9.8
    client sends it. (True, summary, body) when a response frame with the same opaque comes back (any code)."""
    ext: dict[str, str] = {}
    if credentials:
        ext["AccessKey"] = credentials[0]
        ext["Signature"] = acl_signature(ext, b"", credentials[1])
    opaque = 7
    header = json.dumps({"code": code, "extFields": ext, "flag": 0, "language": "JAVA", "opaque": opaque,
                         "serializeTypeCurrentRPC": "JSON", "version": 409}, separators=(",", ":")).encode()
    frame = struct.pack("!ii", 4 + len(header), len(header)) + header
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(frame)

            def read(n: int) -> bytes:
                buf = b""
                while len(buf) < n:
                    chunk = sock.recv(n - len(buf))
                    if not chunk:
                        raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
                    buf += chunk
                return buf

            first = read(4)
            (length,) = struct.unpack("!i", first)
            if not 4 <= length <= 16 << 20:
                try:
                    more = sock.recv(60)
                except OSError:
                    more = b""
                return False, f"not a remoting frame: it answered {first + more!r}", b""
            rest = read(length)
            (ori,) = struct.unpack("!i", rest[:4])
            hlen = ori & 0xFFFFFF
            body = rest[4 + hlen:]
            if (ori >> 24) & 0xFF != 0:
                return True, "answered with a ROCKETMQ (binary) header", body
            h = json.loads(rest[4:4 + hlen])
            if h.get("opaque") != opaque or not int(h.get("flag", 0)) & 1:
                return False, f"answer is not the response to opaque {opaque}: {h}", b""
            return True, f"response code {h.get('code')} remark {h.get('remark')!r}", body
    except (OSError, ValueError, struct.error, ConnectionError) as e:
        return False, f"{type(e).__name__}: {e}", b""


def remoting_probe(namesrv: str, credentials: tuple[str, str] | None) -> tuple[bool, str]:
    """GET_BROKER_CLUSTER_INFO (106) to the NameServer, then GET_BROKER_RUNTIME_INFO (28) to every broker address
    its answer lists (the brokerAddrs values, read with a pattern since fastjson writes unquoted integer keys).
    True when every one of them answered with a remoting response frame."""
    ok, why, body = remoting_call(namesrv, 106, credentials)
    if not ok:
        return False, f"NameServer {namesrv}: {why}"
    addrs = sorted(set(re.findall(r'"(\d{1,3}(?:\.\d{1,3}){3}:\d{1,5})"', body.decode("utf-8", "replace"))))
    if not addrs:
        return False, f"NameServer {namesrv}: {why}, but no broker address in its cluster info: {body[:300]!r}"
    for addr in addrs:
        ok, why_b, _ = remoting_call(addr, 28, credentials)
        if not ok:
            return False, f"NameServer {namesrv} answers ({why}); broker {addr}: {why_b}"
    return True, f"NameServer {namesrv} and brokers {', '.join(addrs)} answer remoting"


def require_remoting(target: Target) -> None:
    """Fails the calling test at once when the target's NameServer or a broker did not answer the remoting probe
    (so the tier fails in seconds, not after every client's time-outs, while the server side lacks the protocol)."""
    ok, why = target.extra.get("probe", (True, ""))
    assert ok, f"[{target.label()}] the target does not answer RocketMQ remoting: {why}"


# ------------------------------------------------------------------------------------------------ targets

@dataclass
class Target:
    """Where the clients go: a NameServer address, the cluster's name, credentials when ACL is on, and shell
    commands that kill the group's leader and restart it (for the Java/Go programs' --kill-cmd/--restart-cmd)."""

    name: str
    namesrv: str
    cluster: str
    group: str                      # the broker group (brokerName)
    workdir: str
    credentials: tuple[str, str] | None = None
    kill_cmd: str = ""
    restart_cmd: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def acl(self) -> bool:
        return self.credentials is not None

    def label(self) -> str:
        return f"{self.name} acl={'on' if self.acl else 'off'}"


def leader_cli(*args: str) -> str:
    """The command line of tests/wire/leader.py (what --kill-cmd / --restart-cmd run)."""
    return " ".join(shlex.quote(a) for a in (sys.executable, os.path.join(WIRE, "leader.py"), *args))


class OursCluster:
    """``dledger-cluster up`` (a NameServer + one 3-replica group) in a temp dir, ACL on or off; ended by PID.

    The clients are given ``127.0.0.1:<port>`` where port is the NameServer's ``remoting_port`` from
    ``status --json`` when it reports one, else its HTTP port plus WIRE_OURS_NAMESRV_PORT_OFFSET (default 0:
    the remoting protocol on the NameServer's own port, told apart from HTTP by its first bytes)."""

    def __init__(self, root: str, *, acl: bool, seed: int):
        import random

        rng = random.Random(seed)
        self.root = root
        self.acl = acl
        self.raft_base = rng.randrange(20000, 23000)
        self.http_base = rng.randrange(23100, 26000)
        self.ns_base = rng.randrange(26100, 29000)

    def up(self) -> Target:
        args = [sys.executable, "-m", "dledger.apps.cluster", "up", "--dir", self.root, "--json",
                "--raft-port", str(self.raft_base), "--http-port", str(self.http_base),
                "--namesrv", "1", "--namesrv-port", str(self.ns_base),
                # check-backs within seconds (RocketMQ's defaults: 6 s, then every 30-60 s)
                "--set", "transactionTimeOut=2000", "--set", "transactionCheckInterval=1000"]
        if not self.acl:
            args.append("--no-acl")
        r = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=REPO)
        if r.returncode != 0:
            self.down()
            raise AssertionError(f"dledger-cluster up failed ({r.returncode}): {r.stderr[-3000:]}")
        status = json.loads(r.stdout)
        ns = next(p for p in status["processes"] if p["kind"] == "namesrv")
        port = ns.get("remoting_port") or ns["http_port"] + int(os.environ.get("WIRE_OURS_NAMESRV_PORT_OFFSET", "0"))
        group = next(p["group"] for p in status["processes"] if p["kind"] == "broker")
        creds = None
        if self.acl:
            import yaml

            with open(os.path.join(self.root, "admin-credentials.yml")) as f:
                doc = yaml.safe_load(f)
            creds = (str(doc["accessKey"]), str(doc["secretKey"]))
        state = os.path.join(self.root, "wire-killed.txt")
        return Target(
            name="ours", namesrv=f"{ns['host']}:{port}", cluster="DefaultCluster", group=group, workdir=self.root,
            credentials=creds,
            extra={"http_namesrv": f"{ns['host']}:{ns['http_port']}",
                   "credentials_file": os.path.join(self.root, "admin-credentials.yml")},
            kill_cmd=leader_cli("kill", "--ours", self.root, "--state", state),
            restart_cmd=leader_cli("restart", "--ours", self.root, "--state", state),
        )

    def down(self) -> None:
        subprocess.run([sys.executable, "-m", "dledger.apps.cluster", "down", "--dir", self.root],
                       capture_output=True, text=True, timeout=60, cwd=REPO)


class ReferenceCluster:
    """Apache RocketMQ 5.3.1 in DLedger mode (../shared/bench/rocketmq/ctl.sh): reused when its NameServer
    already answers, else started here (``up --clean``) and stopped again (``down``) at the end."""

    def __init__(self, root: str):
        self.root = root
        self.started = False

    def up(self) -> Target:
        assert os.path.isfile(RMQ_CTL), f"no reference RocketMQ at {RMQ_CTL} (set WIRE_RMQ_CTL)"
        if not port_open(RMQ_NAMESRV):
            r = subprocess.run([RMQ_CTL, "up", "--clean"], capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, f"ctl.sh up failed: {r.stderr[-3000:]}"
            self.started = True
        state = os.path.join(self.root, "wire-killed.txt")
        return Target(
            name="rocketmq", namesrv=RMQ_NAMESRV, cluster="RmqBench", group="RaftNode00", workdir=self.root,
            kill_cmd=leader_cli("kill", "--rocketmq", RMQ_CTL, "--state", state),
            restart_cmd=leader_cli("restart", "--rocketmq", RMQ_CTL, "--state", state),
        )

    def down(self) -> None:
        if self.started:
            subprocess.run([RMQ_CTL, "down"], capture_output=True, text=True, timeout=300)


def create_topic(target: Target, topic: str, home: str, queues: int = 4) -> None:
    """A fresh topic for one scenario, made with the target's own tools so that the scenario depends only on
    the client under test: our ``mqadmin`` (HTTP) for ours, the official mqadmin 4.9.8 for the reference."""
    if target.name == "ours":
        env = dict(os.environ, NAMESRV_ADDR=target.extra["http_namesrv"])
        if target.credentials:
            env["DLEDGER_CREDENTIALS_FILE"] = target.extra["credentials_file"]
        tool = os.path.join(os.path.dirname(sys.executable), "mqadmin")
        r = subprocess.run([tool, "updateTopic", "-c", target.cluster, "-t", topic, "-r", str(queues), "-w",
                            str(queues)], capture_output=True, text=True, env=env, timeout=60, cwd=REPO)
        assert r.returncode == 0, f"our mqadmin updateTopic {topic} failed: {r.stdout}{r.stderr}"

        def routed() -> tuple[bool, str]:
            q = subprocess.run([tool, "topicRoute", "-t", topic], capture_output=True, text=True, env=env,
                               timeout=60, cwd=REPO)
            return q.returncode == 0, q.stdout + q.stderr

        wait_for(f"the route of {topic} in our NameServer", 30, routed)
        return
    out = mqadmin(target, mqadmin_home(home, target), "updateTopic", "-c", target.cluster, "-t", topic,
                  "-r", str(queues), "-w", str(queues))
    assert "success" in out.stdout and not out.exceptions(), str(out)


# ------------------------------------------------------------------------------------------------ runners

@dataclass
class Run:
    result: dict[str, Any]
    stderr: str
    returncode: int
    wall_s: float

    def why(self) -> str:
        return f"{self.result.get('reason')}\n--- stderr (tail)\n{self.stderr[-4000:]}"


def _parse_last_json(stdout: str) -> dict[str, Any]:
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return dict(json.loads(line))
            except json.JSONDecodeError:
                continue
    return {"ok": False, "reason": f"no JSON result line on stdout: {stdout[-2000:]!r}"}


def java_cmd(profile: str, main: str, home: str, heap: str = "512m") -> list[str]:
    return ["java", "-Xms64m", f"-Xmx{heap}", "-XX:+UseSerialGC", f"-Duser.home={home}",
            f"-Drocketmq.client.logRoot={home}/logs", "-cp", java_classpath(profile), main]


def scenario_args(target: Target, topic: str, group: str, *, timeout_s: int, count: int | None = None,
                  kill: bool = False, poll_ms: int | None = None, vip: bool | None = None) -> list[str]:
    a = ["--namesrv", target.namesrv, "--topic", topic, "--group", group, "--timeout", str(timeout_s)]
    if target.credentials:
        a += ["--ak", target.credentials[0], "--sk", target.credentials[1]]
    if os.environ.get("WIRE_TLS") == "1":
        a.append("--tls")
    if count is not None:
        a += ["--count", str(count)]
    if kill:
        a += ["--kill-cmd", target.kill_cmd, "--restart-cmd", target.restart_cmd]
    if poll_ms is not None:
        a += ["--poll-ms", str(poll_ms)]
    if vip is not None:
        a += ["--vip", "true" if vip else "false"]
    return a


def run_java(client: str, scenario: str, target: Target, home: str, **kw: Any) -> Run:
    """One scenario with the official Java client ``client`` (4.9.8 or 5.3.1); its one JSON line."""
    timeout_s = int(kw.pop("timeout_s", 120))
    topic = kw.pop("topic")
    group = kw.pop("group")
    cmd = [*java_cmd(CLIENTS[client], "wire.Scenarios", home), scenario,
           *scenario_args(target, topic, group, timeout_s=timeout_s, **kw)]
    return _run(cmd, timeout_s + 60)


def run_go(scenario: str, target: Target, home: str, *, topic: str, group: str, timeout_s: int = 120,
           count: int | None = None, kill: bool = False) -> Run:
    assert os.access(GO_BIN, os.X_OK), build_hint()
    cmd = [GO_BIN, "-scenario", scenario, "-namesrv", target.namesrv, "-topic", topic, "-group", group,
           "-timeout", str(timeout_s)]
    if target.credentials:
        cmd += ["-ak", target.credentials[0], "-sk", target.credentials[1]]
    if count is not None:
        cmd += ["-count", str(count)]
    if kill:
        cmd += ["-kill-cmd", target.kill_cmd, "-restart-cmd", target.restart_cmd]
    env = dict(os.environ, HOME=home)
    return _run(cmd, timeout_s + 60, env=env)


def _run(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> Run:
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return Run({"ok": False, "reason": f"did not finish in {timeout_s} s"}, err, -9, time.monotonic() - t0)
    res = _parse_last_json(out)
    if p.returncode != 0 and res.get("ok"):
        res = {"ok": False, "reason": f"exit {p.returncode} with ok=true"}
    return Run(res, err, p.returncode, time.monotonic() - t0)


class Held:
    """The Java ``hold`` scenario as a live producer + consumer for the mqadmin tests (ended by closing stdin,
    killed by PID if it does not end)."""

    def __init__(self, client: str, target: Target, home: str, topic: str, group: str, timeout_s: int = 240):
        cmd = [*java_cmd(CLIENTS[client], "wire.Scenarios", home), "hold",
               *scenario_args(target, topic, group, timeout_s=timeout_s)]
        self.errf = open(os.path.join(home, f"hold-{group}.err"), "w+")  # noqa: SIM115 (closed in close())
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errf, text=True,
                                  start_new_session=True)
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        self.ready: dict[str, Any] = _parse_last_json(line) if line.strip() else {"ok": False, "reason": "hold ended"}
        if not self.ready.get("ready"):
            rest = self.p.stdout.read()
            self.close()
            raise AssertionError(f"hold scenario failed to start: {_parse_last_json(line + rest)} {self.stderr_tail()}")

    def status(self) -> dict[str, Any]:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write("status\n")
        self.p.stdin.flush()
        return _parse_last_json(self.p.stdout.readline())

    def stderr_tail(self) -> str:
        self.errf.flush()
        self.errf.seek(0)
        return self.errf.read()[-3000:]

    def close(self) -> dict[str, Any]:
        res: dict[str, Any] = {}
        try:
            if self.p.stdin:
                self.p.stdin.close()
            out = self.p.stdout.read() if self.p.stdout else ""
            self.p.wait(timeout=30)
            res = _parse_last_json(out)
        except (subprocess.TimeoutExpired, OSError, ValueError):
            pass
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
        if self.p.stdout:
            self.p.stdout.close()
        self.errf.close()
        return res


# ------------------------------------------------------------------------------------------------ mqadmin

def mqadmin_home(root: str, target: Target) -> str:
    """ROCKETMQ_HOME for mqadmin 4.9.8: conf/logback_tools.xml (it refuses to run without one) and, when ACL is
    on, conf/tools.yml with accessKey/secretKey, which MQAdminStartup reads (AclUtils.getAclRPCHook)."""
    home = os.path.join(root, "mqadmin-home")
    os.makedirs(os.path.join(home, "conf"), exist_ok=True)
    with open(os.path.join(home, "conf", "logback_tools.xml"), "w") as f:
        f.write(LOGBACK_TOOLS)
    tools = os.path.join(home, "conf", "tools.yml")
    if target.credentials:
        fd = os.open(tools, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"accessKey: {target.credentials[0]}\nsecretKey: {target.credentials[1]}\n")
    elif os.path.exists(tools):
        os.remove(tools)
    return home


@dataclass
class AdminOut:
    args: list[str]
    stdout: str
    stderr: str
    wall_s: float

    @property
    def text(self) -> str:
        return self.stdout + self.stderr

    def exceptions(self) -> list[str]:
        """Java exceptions it printed (MQAdminStartup catches them and exits 0 anyway)."""
        pattern = r"^(?:Caused by: |Exception in thread \S+ )?((?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error)\b.*)$"
        return re.findall(pattern, self.text, re.M)

    def __str__(self) -> str:
        return (f"mqadmin {' '.join(self.args)} ({self.wall_s:.1f} s)\n{self.stdout[-3000:]}\n"
                f"--- stderr\n{self.stderr[-3000:]}")


def mqadmin(target: Target, home: str, *args: str, timeout_s: float = 60) -> AdminOut:
    """The official mqadmin (rocketmq-tools 4.9.8), with -n pointing at the target."""
    cmd = ["java", "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", f"-Duser.home={home}",
           f"-Drocketmq.home.dir={home}", f"-Drocketmq.client.logRoot={home}/logs",
           "-cp", java_classpath(ADMIN_PROFILE), MQADMIN_MAIN, *args, "-n", target.namesrv]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    return AdminOut(list(args), r.stdout, r.stderr, time.monotonic() - t0)


def parse_table(text: str, header_start: str) -> list[list[str]]:
    """Rows (whitespace-split) of the table whose header line starts with ``header_start``."""
    rows: list[list[str]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(header_start):
            for row in lines[i + 1:]:
                if not row.strip() or row.startswith("#"):
                    break
                rows.append(row.split())
            break
    return rows


def parse_kv(text: str, sep: str) -> dict[str, str]:
    """``key SEP value`` lines (brokerStatus: ':', getBrokerConfig: '=')."""
    kv: dict[str, str] = {}
    for line in text.splitlines():
        if sep in line and not line.startswith(("=", "#", "\t", " at ")):
            k, v = line.split(sep, 1)
            if k.strip() and " " not in k.strip():
                kv[k.strip()] = v.strip()
    return kv


def wait_for(what: str, timeout_s: float, fn: Any, interval_s: float = 0.5) -> Any:
    """Calls ``fn() -> (done, value)`` until done; returns value, or fails with ``what`` and the last value at
    the deadline (a condition with a deadline, polled)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, value = fn()
        if done:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out ({timeout_s} s) waiting for {what}; last:\n{value}")
        time.sleep(interval_s)
