"""A local cluster of OS processes (NameServers + 3-replica broker groups) via ``dledger-cluster``,
ended by PID when the test finishes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from typing import Any

from broker.protocol.auth import Credentials, load_credentials
from dledger.apps.cluster import ADMIN_CREDENTIALS_FILE, ProcessInfo, is_running, stop_process

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ProcCluster:
    def __init__(
        self,
        root: str,
        *,
        namesrv: int = 1,
        groups: int = 1,
        extra: dict[str, str] | None = None,
        seed: int | None = None,
        clock_skew: bool = False,
    ):
        self.root = root
        rng = random.Random(seed)
        # bases whose derived ports are very likely free (ephemeral range starts at 32768)
        self.raft_base = rng.randrange(20000, 23000)
        self.http_base = rng.randrange(23100, 26000)
        self.ns_base = rng.randrange(26100, 29000)
        self.namesrv_count = namesrv
        self.groups = groups
        self.extra = extra or {}
        self.clock_skew = clock_skew

    def up(self, timeout_s: float = 90) -> dict[str, Any]:
        args = [
            sys.executable, "-m", "dledger.apps.cluster", "up", "--dir", self.root,
            "--raft-port", str(self.raft_base), "--http-port", str(self.http_base),
            "--namesrv", str(self.namesrv_count), "--namesrv-port", str(self.ns_base), "--json",
            "--groups", str(self.groups),
        ]
        for k, v in self.extra.items():
            args += ["--set", f"{k}={v}"]
        if self.clock_skew:
            args.append("--clock-skew")
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)
        if r.returncode != 0:
            raise AssertionError(f"cluster up failed ({r.returncode}): {r.stderr[-2000:]}\n{self.logs_tail()}")
        return dict(json.loads(r.stdout))

    @property
    def credentials(self) -> Credentials:
        return load_credentials(os.path.join(self.root, ADMIN_CREDENTIALS_FILE))

    @property
    def env(self) -> dict[str, str]:
        """For tools run against this cluster: where it is, and its admin credentials (ACL is on)."""
        return {"NAMESRV_ADDR": self.namesrv_addr,
                "DLEDGER_CREDENTIALS_FILE": os.path.join(self.root, ADMIN_CREDENTIALS_FILE)}

    @property
    def namesrv_addr(self) -> str:
        return ";".join(f"127.0.0.1:{self.ns_base + k}" for k in range(self.namesrv_count))

    def processes(self) -> list[ProcessInfo]:
        with open(os.path.join(self.root, "cluster.json")) as f:
            return [ProcessInfo(**p) for p in json.load(f)["processes"]]

    def brokers(self) -> list[ProcessInfo]:
        return [p for p in self.processes() if p.kind == "broker"]

    def addr(self, p: ProcessInfo) -> str:
        return f"{p.host}:{p.http_port}"

    def kill9(self, p: ProcessInfo) -> None:
        assert is_running(p), f"{p.name} is not running"
        os.kill(p.pid, signal.SIGKILL)

    def restart(self, p: ProcessInfo) -> ProcessInfo:
        """``dledger-cluster start --dir ROOT NAME``: what an operator runs after a drill."""
        r = subprocess.run(
            [sys.executable, "-m", "dledger.apps.cluster", "start", "--dir", self.root, p.name],
            capture_output=True, text=True, timeout=30, cwd=REPO,
        )
        assert r.returncode == 0, r.stderr
        return next(q for q in self.processes() if q.name == p.name)

    def cluster(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        """``dledger-cluster ARGS --dir ROOT`` (stop, kill, restart, add-group, status ...)."""
        return subprocess.run([sys.executable, "-m", "dledger.apps.cluster", *args, "--dir", self.root],
                              capture_output=True, text=True, timeout=timeout_s, cwd=REPO)

    def status(self) -> dict[str, Any]:
        """``dledger-cluster status --json``: every process's row and every group's summary."""
        return dict(json.loads(self.cluster("status", "--json").stdout))

    def mqadmin(self, *args: str, check: bool = True, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        """The project's ``mqadmin ARGS`` against this cluster (its NameServer and admin account);
        ``check``: the command must exit 0."""
        r = subprocess.run([sys.executable, "-m", "broker.tools.mqadmin", *args], capture_output=True, text=True,
                           timeout=timeout_s, cwd=REPO, env={**os.environ, **self.env})
        if check:
            assert r.returncode == 0, r.stderr
        return r

    def down(self) -> None:
        try:
            procs = self.processes()
        except FileNotFoundError:
            return
        for p in procs:
            stop_process(p, timeout_s=5)

    def logs_tail(self, n: int = 3000) -> str:
        out = []
        logs = os.path.join(self.root, "logs")
        if os.path.isdir(logs):
            for name in sorted(os.listdir(logs)):
                with open(os.path.join(logs, name), errors="replace") as f:
                    out.append(f"--- {name}\n{f.read()[-n:]}")
        return "\n".join(out)
