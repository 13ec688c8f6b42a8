"""What faults and drills act on: a small interface over the replicas of a cluster, and its
implementation for local processes (a directory written by ``dledger-cluster up`` or by a chaos run).

    Target                       local processes (now)          docker compose (later)
    kill(m)                      SIGKILL the pid                docker kill
    kill_all(ms)                 SIGKILL every pid at once      docker kill (one command)
    freeze(ms) / thaw(ms)        SIGSTOP / SIGCONT, all at once docker pause / unpause
    start(m)                     start the recorded command     docker start
    suspend(m) / resume(m)       SIGSTOP / SIGCONT              docker pause / unpause
    lose_unsynced(m)             cut files to fsynced sizes     (not supported)
    synced_sizes(m)              its synced-size table          (not supported)
    set_env(m, env)              environment of the next starts (not supported)
    data_path(m), set_aside(m)   the data dir; move it away     (not supported)
    network                      Toxiproxy proxies (or None)    docker network disconnect

``status(m)`` reads a replica's ``GET /v1/status`` on its own client port (never through a proxy,
so faults on client links do not blind the tools). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from broker.client.transport import ClientError, Transport, cluster_credentials
from chaos.layout import ProxySpec, data_dir
from chaos.unsynced import LossReport, lose_unsynced, read_table
from dledger.apps.cluster import STATE_FILE, ProcessInfo, is_running
from dledger.waiting import wait_until

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATUS_TIMEOUT_S = 1.0


class NotSupported(Exception):
    """The target cannot do this (e.g. page-cache loss in containers)."""


@dataclasses.dataclass(frozen=True)
class Member:
    name: str  # "RaftNode00-n1"
    group: str
    node_id: str
    control_addr: str  # host:port of its client API, reached directly


class Network(Protocol):
    """Links between clients and replicas and between replicas."""

    def links(self, group: str) -> list[ProxySpec]: ...
    async def cut(self, links: Sequence[ProxySpec]) -> None: ...
    async def restore(self, links: Sequence[ProxySpec]) -> None: ...
    async def add_toxic(self, links: Sequence[ProxySpec], toxic_type: str, attributes: dict[str, int]) -> None: ...
    async def remove_toxics(self, links: Sequence[ProxySpec]) -> None: ...
    async def heal_all(self) -> None: ...


class Target(Protocol):
    namesrv_addr: str
    network: Network | None

    def members(self) -> list[Member]: ...
    def is_running(self, m: Member) -> bool: ...
    async def kill(self, m: Member) -> None: ...
    async def kill_all(self, ms: Sequence[Member]) -> None: ...
    async def freeze(self, ms: Sequence[Member]) -> None: ...
    async def thaw(self, ms: Sequence[Member]) -> None: ...
    async def start(self, m: Member) -> None: ...
    async def suspend(self, m: Member) -> None: ...
    async def resume(self, m: Member) -> None: ...
    async def lose_unsynced(self, m: Member) -> LossReport: ...
    def synced_sizes(self, m: Member) -> dict[tuple[int, int], int]: ...
    async def status(self, m: Member) -> dict[str, Any] | None: ...
    def set_env(self, m: Member, env: dict[str, str] | None) -> None: ...
    def data_path(self, m: Member) -> str: ...
    async def set_aside(self, m: Member, dest: str) -> None: ...


def groups_of(members: Sequence[Member]) -> dict[str, list[Member]]:
    out: dict[str, list[Member]] = {}
    for m in members:
        out.setdefault(m.group, []).append(m)
    return out


def leader_of(statuses: dict[str, dict[str, Any] | None]) -> str | None:
    """The member that says it leads at the highest term, or None (pure)."""
    best: tuple[int, str] | None = None
    for name, st in statuses.items():
        if st and st.get("role") == "LEADER":
            term = int(st.get("term") or 0)
            if best is None or term > best[0]:
                best = (term, name)
    return best[1] if best else None


async def group_statuses(target: Target, members: Sequence[Member]) -> dict[str, dict[str, Any] | None]:
    results = await asyncio.gather(*(target.status(m) for m in members))
    return {m.name: st for m, st in zip(members, results, strict=True)}


async def find_leader(target: Target, members: Sequence[Member], *, writable: bool = False) -> str | None:
    statuses = await group_statuses(target, members)
    if writable:
        statuses = {k: v for k, v in statuses.items() if v and v.get("writable")}
    return leader_of(statuses)


async def wait_for(cond: Callable[[], Any], timeout_s: float, what: str, step_s: float = 0.02) -> Any:
    """Poll ``cond`` (sync or async) until it returns something truthy; TimeoutError after
    ``timeout_s`` (``dledger.waiting``; an error raised by ``cond`` propagates)."""
    return await wait_until(cond, timeout_s, what, step_s, tolerate_errors=False)


class LocalTarget:
    """Replicas as local processes recorded in ``<cluster_dir>/cluster.json``.

    ``restart`` says how a stopped replica comes back: ``"launch"`` starts it through
    ``chaos.launch`` with its synced-size table (clusters a chaos run started), ``"cluster"`` runs
    ``dledger-cluster start --dir DIR NAME`` (any cluster from ``dledger-cluster up``).
    """

    def __init__(
        self,
        cluster_dir: str,
        *,
        restart: str = "cluster",
        network: Network | None = None,
        broker_env: dict[str, str] | None = None,
    ):
        assert restart in ("launch", "cluster")
        self.dir = os.path.abspath(cluster_dir)
        self.restart_mode = restart
        self.network = network
        self.broker_env = dict(broker_env or {})  # every broker start (test plants)
        self._member_env: dict[str, dict[str, str]] = {}  # one member's next starts (clock skew)
        self._loaded: tuple[tuple[int, int, int], list[ProcessInfo]] | None = None
        self.credentials = cluster_credentials(self.dir)  # the cluster's admin account, if ACL is on
        self.transport = Transport(timeout_s=STATUS_TIMEOUT_S, credentials=self.credentials)
        procs = self._load()
        if not any(p.kind == "broker" for p in procs):
            raise ValueError(f"{self.dir}/{STATE_FILE} records no broker")
        self.namesrv_addr = ";".join(f"{p.host}:{p.http_port}" for p in procs if p.kind == "namesrv")

    # -- the recorded processes ----------------------------------------------------------------
    def _load(self) -> list[ProcessInfo]:
        """The recorded processes, parsed again only when the file changed (a gated crash looks
        every few milliseconds)."""
        path = os.path.join(self.dir, STATE_FILE)
        st = os.stat(path)
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if self._loaded is None or self._loaded[0] != key:
            with open(path) as f:
                self._loaded = (key, [ProcessInfo(**p) for p in json.load(f)["processes"]])
        return [dataclasses.replace(p) for p in self._loaded[1]]

    def _save(self, procs: list[ProcessInfo]) -> None:
        path = os.path.join(self.dir, STATE_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump({"processes": [dataclasses.asdict(p) for p in procs]}, f, indent=2)
        os.replace(path + ".tmp", path)

    def process(self, m: Member) -> ProcessInfo:
        return next(p for p in self._load() if p.name == m.name)

    def members(self) -> list[Member]:
        return [
            Member(p.name, p.group, p.node_id, f"{p.host}:{p.http_port}")
            for p in self._load() if p.kind == "broker"
        ]

    def table_path(self, m: Member) -> str:
        return os.path.join(self.dir, "synced", f"{m.name}.table")

    def is_running(self, m: Member) -> bool:
        return is_running(self.process(m))

    # -- faults ----------------------------------------------------------------------------------
    async def kill(self, m: Member) -> None:
        p = self.process(m)
        if not is_running(p):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)
        await wait_for(lambda: not self._alive_reaped(p), 10, f"{m.name} (pid {p.pid}) to die")

    async def kill_all(self, ms: Sequence[Member]) -> None:
        """SIGKILL every one of ``ms`` in one loop of kill(2) (microseconds apart: one instant for
        the crash fault, so none of them writes or syncs anything after another one died), then wait
        until all are gone."""
        procs = {p.name: p for p in self._load()}
        victims = [procs[m.name] for m in ms if is_running(procs[m.name])]
        for p in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        for p in victims:
            await self._wait_dead(p)

    async def _wait_dead(self, p: ProcessInfo) -> None:
        await wait_for(lambda: not self._alive_reaped(p), 10, f"{p.name} (pid {p.pid}) to die")

    async def freeze(self, ms: Sequence[Member]) -> None:
        """SIGSTOP every one of ``ms`` in one loop: their state (files, synced-size tables) stays as it
        was at that instant until ``thaw`` or ``kill_all``."""
        self._signal_all(ms, signal.SIGSTOP)

    async def thaw(self, ms: Sequence[Member]) -> None:
        self._signal_all(ms, signal.SIGCONT)

    def _signal_all(self, ms: Sequence[Member], sig: signal.Signals) -> None:
        procs = {p.name: p for p in self._load()}
        pids = [procs[m.name].pid for m in ms if is_running(procs[m.name])]
        for pid in pids:  # one loop: the signals land microseconds apart
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _alive_reaped(self, p: ProcessInfo) -> bool:
        reap(p.pid)  # our own children become zombies until reaped; others are reaped by their parent
        return is_running(p)

    async def start(self, m: Member) -> None:
        if self.is_running(m):
            return
        if self.restart_mode == "cluster":
            r = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "dledger.apps.cluster", "start", "--dir", self.dir, m.name],
                capture_output=True, text=True, timeout=60, cwd=REPO,
            )
            if r.returncode != 0:
                raise RuntimeError(f"dledger-cluster start {m.name} failed: {r.stderr.strip()[-500:]}")
            return
        procs = self._load()
        p = next(q for q in procs if q.name == m.name)
        p.pid = launch_broker(p, self.table_path(m), {**self.broker_env, **self._member_env.get(m.name, {})})
        self._save(procs)

    def set_env(self, m: Member, env: dict[str, str] | None) -> None:
        """Extra environment for ``m``'s next starts (None: back to the cluster's)."""
        if self.restart_mode != "launch":
            raise NotSupported("a start environment needs replicas started by a chaos run (chaos.launch)")
        if env:
            self._member_env[m.name] = dict(env)
        else:
            self._member_env.pop(m.name, None)

    def data_path(self, m: Member) -> str:
        return data_dir(self.process(m), self.dir)

    async def set_aside(self, m: Member, dest: str) -> None:
        """Move a stopped replica's data directory to ``dest``: it starts again empty and catches up
        from the leader (an operator replacing a damaged disk)."""
        if self.is_running(m):
            raise RuntimeError(f"{m.name} is running: stop it before moving its data")
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        await asyncio.to_thread(os.replace, self.data_path(m), dest)

    async def suspend(self, m: Member) -> None:
        p = self.process(m)
        if is_running(p):
            os.kill(p.pid, signal.SIGSTOP)

    async def resume(self, m: Member) -> None:
        p = self.process(m)
        if is_running(p):
            os.kill(p.pid, signal.SIGCONT)

    async def lose_unsynced(self, m: Member) -> LossReport:
        if self.restart_mode != "launch":
            raise NotSupported("page-cache loss needs replicas started by a chaos run (chaos.launch)")
        if self.is_running(m):
            raise RuntimeError(f"{m.name} is running: kill it before cutting its files")
        p = self.process(m)
        return await asyncio.to_thread(lose_unsynced, data_dir(p, self.dir), self.table_path(m))

    def synced_sizes(self, m: Member) -> dict[tuple[int, int], int]:
        """What ``m`` had fsynced, per (device, inode), as its synced-size table says now."""
        if self.restart_mode != "launch":
            raise NotSupported("synced sizes need replicas started by a chaos run (chaos.launch)")
        return read_table(self.table_path(m))

    async def status(self, m: Member) -> dict[str, Any] | None:
        try:
            st = await self.transport.call(m.control_addr, "GET", "/v1/status", timeout_s=STATUS_TIMEOUT_S)
        except ClientError:
            return None
        return dict(st) if isinstance(st, dict) else None

    def resume_all(self) -> None:
        """SIGCONT every recorded broker (before stopping a cluster: a stopped process ignores SIGTERM)."""
        for p in self._load():
            if p.kind == "broker" and is_running(p):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)

    async def close(self) -> None:
        await self.transport.close()


# Children this process started, kept so that they are reaped (and not reported by Popen's
# destructor as "still running"); everything is still stopped by PID.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def spawn(cmd: list[str], log_path: str, env: dict[str, str] | None = None) -> int:
    """Start ``cmd`` detached (own session), output appended to ``log_path``; returns its pid."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "ab") as logf:
        child = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, close_fds=True, cwd=REPO, env=env)
    _CHILDREN[child.pid] = child
    return child.pid


def reap(pid: int) -> None:
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        del _CHILDREN[pid]


def launch_broker(p: ProcessInfo, table_path: str, extra_env: dict[str, str] | None = None) -> int:
    """Start a broker through ``chaos.launch`` (fsync sizes recorded in ``table_path``), with
    ``extra_env`` on top of this process's environment."""
    assert p.kind == "broker"
    os.makedirs(os.path.dirname(table_path), exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
           **(extra_env or {})}
    return spawn([sys.executable, "-m", "chaos.launch", "--synced-table", table_path,
                  "broker.server.broker_server", "-c", p.conf],
                 p.log, env)


def start_namesrv(p: ProcessInfo) -> int:
    assert p.kind == "namesrv"
    return spawn([sys.executable, "-m", "namesrv.server", "-c", p.conf], p.log)
