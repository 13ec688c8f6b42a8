"""``chaos drill``: kill -9 the leader round after round under load and time the failover.

Per round, from the moment of the kill:
- ``route_ms``: until the NameServer names a new leader of the group (a new broker-id-0 address in
  ``GET /v1/clusters``): what a client that looks routes up sees;
- ``first_ack_ms``: until the first acknowledged send that the *new* leader stored (its store time
  is after the kill; an answer of the old leader still in flight does not count);
- ``lost``: messages acknowledged so far that are not in the group's queues when read back from the
  leader after the round (the killed replica restarted and caught up first).
Then median and max over the rounds. Exit code 0 when nothing was lost, 1 otherwise.

The target is ``chaos.target.Target``: a cluster from ``dledger-cluster up --dir DIR`` (killed by
PID from cluster.json, restarted with ``dledger-cluster start``) or, without ``--dir``, a private
cluster in a temporary directory on the chaos port layout (stopped at the end).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from broker.client import ClientError, Message, Producer
from broker.client.transport import FROM_ENV, NamesrvClient, Transport
from broker.tools.progress import StatusLine, format_eta
from chaos.layout import Ports
from chaos.target import REPO, LocalTarget, Member, Target, find_leader, groups_of, wait_for
from chaos.workload import create_topic, read_queue, writable_leader

FIRST_ACK_MEDIAN_TARGET_MS = 1500
FIRST_ACK_MAX_TARGET_MS = 3000


@dataclasses.dataclass(frozen=True)
class DrillOptions:
    rounds: int = 10
    dir: str | None = None
    producers: int = 4
    rate: float = 0.0  # sends/s per producer; 0: as fast as acknowledged
    steady_s: float = 2.0
    topic: str = "ChaosDrill"
    queues: int = 8
    group: str | None = None  # default: the first group
    port_base: int = 15000
    keep: bool = False


@dataclasses.dataclass
class Acks:
    """Acknowledged sends of the drilled group: unique id -> (monotonic ack time, store time ms)."""

    by_uid: dict[str, tuple[float, int]] = dataclasses.field(default_factory=dict)
    errors: dict[str, int] = dataclasses.field(default_factory=dict)

    def first_after(self, wall_ms: float) -> float | None:
        times = [t for t, store_ms in list(self.by_uid.values()) if store_ms >= wall_ms]
        return min(times) if times else None


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and max of the round figures, lost total, and whether the targets were met (pure)."""
    ack = [r["first_ack_ms"] for r in rounds]
    route = [r["route_ms"] for r in rounds]
    out = {
        "rounds": len(rounds),
        "first_ack_ms_median": round(statistics.median(ack), 1),
        "first_ack_ms_max": round(max(ack), 1),
        "route_ms_median": round(statistics.median(route), 1),
        "route_ms_max": round(max(route), 1),
        "lost": sum(r["lost"] for r in rounds),
    }
    out["targets_met"] = (out["first_ack_ms_median"] <= FIRST_ACK_MEDIAN_TARGET_MS
                          and out["first_ack_ms_max"] <= FIRST_ACK_MAX_TARGET_MS)
    return out


async def registered_leader(ns: NamesrvClient, group: str) -> str | None:
    try:
        info = await ns.clusters(timeout_s=1.0)
    except ClientError:
        return None
    bd = info.brokers.get(group)
    return bd.leader_addr if bd is not None else None


def drill_status(round_no: int, rounds: int, phase: str, acks: int, elapsed_s: float,
                 round_s: list[float]) -> str:
    """``drill round 2/5 | 00:41 | ETA 01:02 | <phase> | acks 1234`` (ETA from the mean finished round)."""
    eta = ""
    if round_s:
        mean = sum(round_s) / len(round_s)
        eta = f" | ETA {format_eta(max(0.0, mean * rounds - elapsed_s))}"
    return f"drill round {round_no}/{rounds} | {format_eta(elapsed_s)}{eta} | {phase} | acks {acks}"


class Drill:
    def __init__(self, opts: DrillOptions, target: Target, out: Any = sys.stdout, as_json: bool = False):
        self.opts, self.target, self.out, self.as_json = opts, target, out, as_json
        groups = groups_of(target.members())
        self.group = opts.group or sorted(groups)[0]
        if self.group not in groups:
            raise ValueError(f"no group {self.group!r}; groups: {', '.join(sorted(groups))}")
        self.members = groups[self.group]
        self.acks = Acks()
        self.stop = asyncio.Event()
        self.credentials = getattr(target, "credentials", FROM_ENV)  # a local cluster's admin account
        self.transport = Transport(timeout_s=5.0, credentials=self.credentials)
        # On a terminal (not --json): a live line (round, phase, acks, ETA) below the round lines.
        self.status = StatusLine(out, live=False if as_json else None)
        self.phase = "starting"
        self.round_no = 0
        self.round_s: list[float] = []  # durations of the finished rounds (for the ETA)

    def say(self, text: str) -> None:
        if not self.as_json:
            self.status.println(text)

    async def show_progress(self) -> None:
        started = time.monotonic()
        try:
            while True:
                await asyncio.sleep(1.0)
                self.status.update(drill_status(self.round_no, self.opts.rounds, self.phase, len(self.acks.by_uid),
                                                time.monotonic() - started, self.round_s))
        finally:
            self.status.close()

    async def produce(self, i: int) -> None:
        p = Producer(f"chaos_drill_p{i}", self.target.namesrv_addr, credentials=self.credentials)
        await p.start()
        n = 0
        try:
            while not self.stop.is_set():
                n += 1
                try:
                    r = await p.send(Message(self.opts.topic, f"drill-{i}-{n}".encode()))
                except ClientError as exc:
                    self.acks.errors[exc.code] = self.acks.errors.get(exc.code, 0) + 1
                    await asyncio.sleep(0.01)
                    continue
                if r.message_queue.broker_name == self.group:
                    self.acks.by_uid[r.unique_id] = (time.monotonic(), r.store_ts)
                if self.opts.rate > 0:
                    await asyncio.sleep(1 / self.opts.rate)
        finally:
            await p.shutdown()

    async def run(self) -> dict[str, Any]:
        await create_topic(self.target, self.opts.topic, self.opts.queues)
        tasks = [asyncio.create_task(self.produce(i)) for i in range(self.opts.producers)]
        progress = asyncio.create_task(self.show_progress()) if self.status.live else None
        rounds: list[dict[str, Any]] = []
        try:
            for r in range(1, self.opts.rounds + 1):
                self.round_no = r
                t0 = time.monotonic()
                rounds.append(await self.round(r))
                self.round_s.append(time.monotonic() - t0)
        finally:
            if progress is not None:
                progress.cancel()
                await asyncio.gather(progress, return_exceptions=True)
            self.stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.transport.close()
        summary = summarize(rounds)
        result = {"group": self.group, "producers": self.opts.producers, "acknowledged": len(self.acks.by_uid),
                  "send_errors": self.acks.errors, "rounds": rounds, "summary": summary}
        self.say(
            f"first ack after kill -9: median {summary['first_ack_ms_median']:.0f} ms, max "
            f"{summary['first_ack_ms_max']:.0f} ms (target {FIRST_ACK_MEDIAN_TARGET_MS} / "
            f"{FIRST_ACK_MAX_TARGET_MS} ms: {'met' if summary['targets_met'] else 'MISSED'}); new leader at the "
            f"NameServer: median {summary['route_ms_median']:.0f} ms, max {summary['route_ms_max']:.0f} ms; "
            f"lost {summary['lost']} of {len(self.acks.by_uid)} acknowledged; send errors {self.acks.errors or 'none'}"
        )
        return result

    async def round(self, r: int) -> dict[str, Any]:
        self.phase = "waiting for a writable leader and acks"
        await self.ready()
        self.phase = "steady load"
        await asyncio.sleep(self.opts.steady_s)
        leader = await writable_leader(self.target, self.members, 30)
        old_status = await self.target.status(leader) or {}
        ns = NamesrvClient(self.target.namesrv_addr, self.transport)
        old_addr = old_status.get("address")
        route_seen: list[float] = []

        async def new_route() -> str | None:
            addr = await registered_leader(ns, self.group)
            if addr and addr != old_addr:
                route_seen.append(time.monotonic())
                return addr
            return None

        self.phase = f"killed {leader.name}: waiting for the new leader's first ack"
        killed_at = time.monotonic()
        route_task = asyncio.create_task(wait_for(new_route, 30, "a new leader at the NameServer", 0.01))
        await self.target.kill(leader)
        # Count only messages stored after the kill had surely taken effect (``docker kill`` takes a
        # while to return, and the old leader stores meanwhile); time from before the kill command:
        # the figure errs on the slow side.
        dead_wall_ms = time.time() * 1000
        await wait_for(lambda: self.acks.first_after(dead_wall_ms), 30, "an ack from the new leader", 0.005)
        first_ack = self.acks.first_after(dead_wall_ms)
        assert first_ack is not None
        await route_task
        route_ms = round((route_seen[0] - killed_at) * 1000, 1)
        new = await writable_leader(self.target, self.members, 30)
        new_status = await self.target.status(new) or {}
        self.phase = f"restarting {leader.name}, waiting until it caught up"
        await self.target.start(leader)
        await self.caught_up(leader)
        self.phase = "checking that no acknowledged message is lost"
        lost = await self.lost()
        row = {
            "round": r, "killed": leader.name, "killed_term": old_status.get("term"), "new_leader": new.name,
            "new_term": new_status.get("term"), "route_ms": route_ms,
            "first_ack_ms": round((first_ack - killed_at) * 1000, 1), "lost": lost,
        }
        self.say(f"round {r}: killed {row['killed']} (term {row['killed_term']}) -> {row['new_leader']} "
                 f"(term {row['new_term']}); new leader at the NameServer after {row['route_ms']:.0f} ms; "
                 f"first ack after {row['first_ack_ms']:.0f} ms; lost {lost}")
        return row

    async def ready(self) -> None:
        """Every replica running, a writable leader registered at the NameServer, and acks flowing."""
        for m in self.members:
            if not self.target.is_running(m):
                await self.target.start(m)
        leader = await writable_leader(self.target, self.members, 30)
        addr = (await self.target.status(leader) or {}).get("address")
        ns = NamesrvClient(self.target.namesrv_addr, self.transport)

        async def registered() -> bool:
            return addr is not None and await registered_leader(ns, self.group) == addr

        await wait_for(registered, 10, f"{leader.name} registered as leader at the NameServer", 0.05)
        before = len(self.acks.by_uid)
        await wait_for(lambda: len(self.acks.by_uid) > before, 30, "acknowledged sends", 0.01)

    async def caught_up(self, m: Member, timeout_s: float = 60.0) -> None:
        async def done() -> bool:
            st = await self.target.status(m)
            lead = await find_leader(self.target, self.members, writable=True)
            if st is None or lead is None:
                return False
            lst = await self.target.status(next(x for x in self.members if x.name == lead)) or {}
            return int(st.get("applied_index") or 0) >= int(lst.get("commit_index") or 0) - 50

        await wait_for(done, timeout_s, f"{m.name} to catch up", 0.1)

    async def lost(self) -> int:
        acked = set(self.acks.by_uid)
        leader = await writable_leader(self.target, self.members, 30)
        stored: set[str] = set()
        for qid in range(self.opts.queues):
            async for batch in read_queue(self.transport, leader.control_addr, self.opts.topic, qid):
                stored.update(m["unique_id"] for m in batch)
        return len(acked - stored)


class DrillError(Exception):
    """The drill cannot start: --dir names no cluster."""


def _cluster_cmd(cluster_dir: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dledger.apps.cluster", *args, "--dir", cluster_dir],
                          capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


async def run_drill(opts: DrillOptions, *, as_json: bool = False, out: Any = sys.stdout) -> int:
    own = opts.dir is None
    cluster_dir = os.path.abspath(opts.dir) if opts.dir else tempfile.mkdtemp(prefix="chaos-drill-")
    if own:
        ports = Ports(opts.port_base)
        up = _cluster_cmd(cluster_dir, "up", "--namesrv-port", str(ports.namesrv), "--raft-port", str(ports.raft),
                          "--http-port", str(ports.http), "--wait", "60")
        if up.returncode != 0:
            _cluster_cmd(cluster_dir, "down")
            raise RuntimeError(f"the drill's cluster did not start: {up.stderr.strip()[-800:]}")
        if not as_json:
            print(f"chaos drill: private cluster in {cluster_dir}", file=out, flush=True)
    elif not os.path.exists(os.path.join(cluster_dir, "cluster.json")):
        raise DrillError(f"no cluster recorded in {cluster_dir} (start one with `dledger-cluster up --dir "
                         f"{cluster_dir}`, or leave out --dir for a private one)")
    target = LocalTarget(cluster_dir, restart="cluster")
    result: dict[str, Any] | None = None
    try:
        result = await Drill(opts, target, out, as_json).run()
    finally:
        await target.close()
        if own and not opts.keep:
            with contextlib.suppress(subprocess.SubprocessError):
                _cluster_cmd(cluster_dir, "down", timeout_s=60)
            if result is not None and result["summary"]["lost"] == 0:
                shutil.rmtree(cluster_dir, ignore_errors=True)  # kept (with its logs) when something failed
    result["cluster_dir"] = cluster_dir
    if as_json:
        print(json.dumps(result, indent=2), file=out, flush=True)
    return 0 if result["summary"]["lost"] == 0 else 1
