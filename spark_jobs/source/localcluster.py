"""A private local cluster for the benchmark and the tests: ``dledger-cluster up`` on free ports.

``dledger-cluster`` derives every port from three bases (Raft ``b + 100 g + i``, HTTP
``h + 100 g + 10 i``, NameServers ``n + k``); the bases are drawn at random and kept only when
every derived port can be bound on 127.0.0.1 right now, so concurrent clusters of other users of
the machine are not hit. ``down()`` ends exactly the processes ``up`` recorded, by PID.

ACL is on (``dledger-cluster up``'s default): ``up`` writes ROOT/admin-credentials.yml (0600), the
account the benchmark and the tests use (``credentials``, and ``source_options()`` for the data
source). Its generated ACL has no reader account, only the admin and one account per group.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from typing import Any

from broker.protocol.auth import Credentials, load_credentials
from dledger.apps.cluster import ADMIN_CREDENTIALS_FILE, ProcessInfo, is_running, stop_process

HOST = "127.0.0.1"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def port_free(port: int, host: str = HOST) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_bases(groups: int, namesrv: int, rng: random.Random, tries: int = 200) -> tuple[int, int, int]:
    """(raft base, http base, namesrv base) whose derived ports are all free (below the
    ephemeral range, which starts at 32768 on Linux)."""
    for _ in range(tries):
        raft = rng.randrange(20000, 23000)
        http = rng.randrange(23100, 26000)
        ns = rng.randrange(26100, 29000)
        ports = [raft + 100 * g + i for g in range(groups) for i in range(3)]
        ports += [http + 100 * g + 10 * i for g in range(groups) for i in range(3)]
        ports += [ns + k for k in range(namesrv)]
        if len(set(ports)) == len(ports) and all(port_free(p) for p in ports):
            return raft, http, ns
    raise RuntimeError("found no free port bases for a local cluster")


class LocalCluster:
    def __init__(
        self,
        root: str,
        *,
        groups: int = 1,
        namesrv: int = 1,
        props: dict[str, str] | None = None,
        flush: str = "sync",
        seed: int | None = None,
    ):
        self.flush = flush
        self.root = os.path.abspath(root)
        self.groups = groups
        self.namesrv_count = namesrv
        self.props = dict(props or {})
        self.raft_base, self.http_base, self.ns_base = pick_bases(groups, namesrv, random.Random(seed))

    @property
    def namesrv_addr(self) -> str:
        return ";".join(f"{HOST}:{self.ns_base + k}" for k in range(self.namesrv_count))

    @property
    def credentials_file(self) -> str:
        """The admin account ``up`` wrote (the cluster runs with ACL)."""
        return os.path.join(self.root, ADMIN_CREDENTIALS_FILE)

    @property
    def credentials(self) -> Credentials:
        return load_credentials(self.credentials_file)

    def source_options(self) -> dict[str, str]:
        """The ``dledger-mq`` options that reach this cluster: its NameServers and admin account."""
        return {"namesrv": self.namesrv_addr, "credentialsFile": self.credentials_file}

    def up(self, timeout_s: float = 120.0) -> dict[str, Any]:
        args = [
            sys.executable, "-m", "dledger.apps.cluster", "up", "--dir", self.root,
            "--groups", str(self.groups), "--namesrv", str(self.namesrv_count),
            "--raft-port", str(self.raft_base), "--http-port", str(self.http_base),
            "--namesrv-port", str(self.ns_base), "--flush", self.flush, "--wait", str(min(timeout_s, 60.0)), "--json",
        ]  # fmt: skip
        for k, v in sorted(self.props.items()):
            args += ["--set", f"{k}={v}"]
        try:
            r = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)
        except subprocess.TimeoutExpired:
            self.down()
            raise
        if r.returncode != 0:
            self.down()
            raise RuntimeError(f"dledger-cluster up failed ({r.returncode}): {r.stderr[-2000:]}")
        if not os.path.exists(self.credentials_file):
            self.down()
            raise RuntimeError(f"dledger-cluster up wrote no {self.credentials_file}: is ACL off?")
        return dict(json.loads(r.stdout))

    def processes(self) -> list[ProcessInfo]:
        try:
            with open(os.path.join(self.root, "cluster.json")) as f:
                return [ProcessInfo(**p) for p in json.load(f)["processes"]]
        except FileNotFoundError:
            return []

    def brokers(self, group: str | None = None) -> list[ProcessInfo]:
        return [p for p in self.processes() if p.kind == "broker" and (group is None or p.group == group)]

    @staticmethod
    def addr(p: ProcessInfo) -> str:
        return f"{p.host}:{p.http_port}"

    def start(self, p: ProcessInfo) -> ProcessInfo:
        """``dledger-cluster start``: restart a recorded process that is not running."""
        r = subprocess.run(
            [sys.executable, "-m", "dledger.apps.cluster", "start", "--dir", self.root, p.name],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"dledger-cluster start {p.name} failed: {r.stderr[-2000:]}")
        return next(q for q in self.processes() if q.name == p.name)

    def down(self) -> None:
        for p in self.processes():
            stop_process(p, timeout_s=10)

    def running(self) -> list[ProcessInfo]:
        return [p for p in self.processes() if is_running(p)]
