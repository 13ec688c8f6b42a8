"""Test harness: dledger groups in this process (threads) or as OS processes, on 127.0.0.1.

Nothing here sleeps to synchronise: ``wait_until`` polls a condition against a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import msgpack

from dledger import waiting
from dledger.apps.checkpoint import ApplyCheckpoint
from dledger.clock import Clock
from dledger.node import DLedgerNode, RaftSettings

HOST = "127.0.0.1"
PASSWORD = "test-password-123"


# Ports tests listen on: below the kernel's ephemeral range (32768..60999 here), so no outgoing
# connection and no port-0 listener can be handed one of them while a test restarts its owner
# (a broker restarted after a peer's port-0 bind took its raft port: BindError), and apart from the
# chaos runs' port bases (20000..27999).
PORT_RANGES = ((10000, 20000), (28000, 32768))


class StubHooks:
    """``NodeHooks`` (dledger/syncobj_patch.py) for a DLedgerSyncObj driven by hand, without a
    ReplicaCore: every answer leaves at once, the node counts its whole log, no retention floor."""

    def ack_ready(self, node: Any, next_index: int) -> bool:
        return True

    def self_match_index(self) -> int:
        return 10**18

    def on_install_anchor(self, anchor_index: int) -> None:
        pass

    def retention_floor(self) -> int:
        return 0

    def on_leader_floor(self, floor: int) -> None:
        pass


def free_ports(n: int, host: str = HOST) -> list[int]:
    rng = random.Random()
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            lo, hi = rng.choice(PORT_RANGES)
            s = socket.socket()
            try:
                s.bind((host, rng.randrange(lo, hi)))
            except OSError:
                s.close()
                continue
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


async def wait_until(
    cond: Callable[[], Any] | Callable[[], Awaitable[Any]], timeout_s: float, what: str, step_s: float = 0.02
) -> Any:
    """``dledger.waiting.wait_until`` failing the test (AssertionError) at the deadline; errors of
    ``cond`` count as "not yet" (conditions may race with failover)."""
    return await waiting.wait_until(cond, timeout_s, what, step_s, error=AssertionError)


def settings_for(root: str, ids: list[str], ports: list[int], self_id: str, **overrides: Any) -> RaftSettings:
    peers = {pid: f"{HOST}:{port}" for pid, port in zip(ids, ports, strict=True)}
    base = RaftSettings(
        group="TestGroup",
        self_id=self_id,
        peers=peers,
        data_dir=os.path.join(root, self_id),
        password=PASSWORD,
        election_min_ms=300,
        election_max_ms=600,
        heartbeat_ms=30,
        stepdown_ms=1200,
        connection_timeout_ms=1500,
        connection_retry_ms=200,
    )
    return replace(base, **overrides)


@dataclass
class InProcCluster:
    """Three DLedgerNodes sharing this process and event loop (each has its own tick thread)."""

    root: str
    ids: list[str] = field(default_factory=lambda: ["n0", "n1", "n2"])
    overrides: dict[str, Any] = field(default_factory=dict)
    nodes: dict[str, DLedgerNode] = field(default_factory=dict)
    checkpoints: dict[str, ApplyCheckpoint] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)
    disk_used: dict[str, float] = field(default_factory=dict)  # per node, what the disk reports
    per_node: dict[str, dict[str, Any]] = field(default_factory=dict)  # extra overrides per node id
    clocks: dict[str, Clock] = field(default_factory=dict)  # per node id; the process clock otherwise

    def __post_init__(self) -> None:
        self.ports = free_ports(len(self.ids))
        self.disk_used = dict.fromkeys(self.ids, 0.10)

    def settings(self, node_id: str) -> RaftSettings:
        return settings_for(
            self.root, self.ids, self.ports, node_id, **{**self.overrides, **self.per_node.get(node_id, {})}
        )

    async def start_node(self, node_id: str) -> DLedgerNode:
        s = self.settings(node_id)
        cp = ApplyCheckpoint(os.path.join(s.data_dir, "meta", "apply_checkpoint"))
        node = DLedgerNode(
            s, cp, clock=self.clocks.get(node_id), disk_used_ratio=lambda _path: self.disk_used[node_id]
        )
        await node.start()
        self.nodes[node_id] = node
        self.checkpoints[node_id] = cp
        return node

    async def stop_node(self, node_id: str) -> None:
        node = self.nodes.pop(node_id)
        await node.stop()
        self.checkpoints.pop(node_id).close()

    async def start(self) -> None:
        for nid in self.ids:
            await self.start_node(nid)

    async def stop(self) -> None:
        for nid in list(self.nodes):
            await self.stop_node(nid)

    async def leader(self, timeout_s: float = 10.0) -> DLedgerNode:
        def find() -> DLedgerNode | None:
            leaders = [n for n in self.nodes.values() if n.role == "LEADER"]
            if len(leaders) != 1:
                return None
            lid = leaders[0].settings.self_id
            return leaders[0] if all(n.leader_id == lid for n in self.nodes.values()) else None

        return await wait_until(find, timeout_s, "one leader known to every node")  # type: ignore[no-any-return]

    def followers(self, leader: DLedgerNode) -> list[DLedgerNode]:
        return [n for n in self.nodes.values() if n is not leader]


# -- multi-process groups ------------------------------------------------------------------------
@dataclass
class NodeProcess:
    node_id: str
    conf: str
    http_port: int
    raft_port: int
    log: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class ProcessCluster:
    """A 3-node group of ``python -m dledger.apps.node_server`` processes, ended by PID."""

    def __init__(
        self, root: str, extra: dict[str, str] | None = None, ids: tuple[str, ...] = ("n0", "n1", "n2")
    ):
        self.root = root
        ports = free_ports(2 * len(ids))
        self.nodes: dict[str, NodeProcess] = {}
        peers = ";".join(f"{nid}-{HOST}:{ports[i]}" for i, nid in enumerate(ids))
        os.makedirs(os.path.join(root, "conf"), exist_ok=True)
        os.makedirs(os.path.join(root, "logs"), exist_ok=True)
        for i, nid in enumerate(ids):
            conf = os.path.join(root, "conf", f"{nid}.conf")
            lines = {
                "dLegerGroup": "RaftNode00",
                "dLegerPeers": peers,
                "dLegerSelfId": nid,
                "storePathRootDir": os.path.join(root, "data"),
                "listenPort": str(ports[len(ids) + i]),
                "brokerIP1": HOST,
                "dLegerPeerPassword": PASSWORD,
                "dLegerElectionTimeoutMinMs": "300",
                "dLegerElectionTimeoutMaxMs": "600",
                "dLegerHeartbeatIntervalMs": "50",
                **(extra or {}),
            }
            with open(conf, "w") as f:
                f.write("".join(f"{k}={v}\n" for k, v in lines.items()))
            self.nodes[nid] = NodeProcess(
                nid, conf, ports[len(ids) + i], ports[i], os.path.join(root, "logs", f"{nid}.log")
            )
        self.session: aiohttp.ClientSession | None = None

    def data_dir(self, node_id: str) -> str:
        return os.path.join(self.root, "data", f"dledger-{node_id}")

    def start_node(self, node_id: str) -> None:
        n = self.nodes[node_id]
        with open(n.log, "ab") as logf:
            n.proc = subprocess.Popen(
                [sys.executable, "-m", "dledger.apps.node_server", "-c", n.conf],
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def kill(self, node_id: str, sig: int = signal.SIGKILL) -> None:
        n = self.nodes[node_id]
        if n.alive():
            os.kill(n.pid, sig)
            n.proc.wait(10)  # type: ignore[union-attr]

    async def __aenter__(self) -> ProcessCluster:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        for nid in self.nodes:
            self.start_node(nid)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for _nid, n in self.nodes.items():
            if n.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(n.pid, signal.SIGTERM)
        for n in self.nodes.values():
            if n.proc is not None:
                try:
                    n.proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.kill(n.pid, signal.SIGKILL)
                    n.proc.wait(10)
        if self.session is not None:
            await self.session.close()

    def dump_logs(self) -> str:
        out = []
        for n in self.nodes.values():
            with contextlib.suppress(FileNotFoundError), open(n.log, errors="replace") as f:
                out.append(f"--- {n.node_id} ---\n" + f.read()[-4000:])
        return "\n".join(out)

    async def status(self, node_id: str) -> dict[str, Any]:
        assert self.session is not None
        n = self.nodes[node_id]
        async with self.session.get(f"http://{HOST}:{n.http_port}/v1/status") as r:
            return await r.json()  # type: ignore[no-any-return]

    async def leader(self, timeout_s: float = 15.0, exclude: set[str] | None = None) -> str:
        exclude = exclude or set()

        async def find() -> str | None:
            dead = [
                nid
                for nid, n in self.nodes.items()
                if n.proc is not None and not n.alive() and nid not in exclude
            ]
            if dead:
                raise AssertionError(f"node(s) {dead} exited:\n{self.dump_logs()}")
            seen = {}
            for nid, n in self.nodes.items():
                if nid in exclude or not n.alive():
                    continue
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    seen[nid] = await self.status(nid)
            leaders = [nid for nid, st in seen.items() if st["role"] == "LEADER"]
            if len(leaders) == 1 and all(st["leader_id"] == leaders[0] for st in seen.values()):
                return leaders[0]
            return None

        return await wait_until(find, timeout_s, "a leader known to every live node", step_s=0.05)  # type: ignore[no-any-return]

    async def append(
        self, node_id: str, bodies: list[bytes], timeout_ms: int = 3000
    ) -> tuple[int, dict[str, Any]]:
        assert self.session is not None
        n = self.nodes[node_id]
        async with self.session.post(
            f"http://{HOST}:{n.http_port}/v1/append",
            data=msgpack.packb({"bodies": bodies, "timeout_ms": timeout_ms}),
        ) as r:
            raw = await r.read()
            if r.content_type == "application/x-msgpack":
                return r.status, msgpack.unpackb(raw)
            return r.status, (await r.json() if raw else {})

    async def chain(self, node_id: str, first: int, last: int) -> list[int]:
        assert self.session is not None
        n = self.nodes[node_id]
        async with self.session.get(
            f"http://{HOST}:{n.http_port}/v1/chain", params={"from": first, "to": last}
        ) as r:
            data = await r.json()
            assert data["from"] == first, data
            return data["crcs"]  # type: ignore[no-any-return]

    async def state(self, node_id: str) -> dict[str, Any]:
        assert self.session is not None
        n = self.nodes[node_id]
        async with self.session.get(f"http://{HOST}:{n.http_port}/v1/state") as r:
            return await r.json()  # type: ignore[no-any-return]
