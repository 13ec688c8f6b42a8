"""What the fleet drills share (``chaos rolling-restart``, ``chaos grow-shrink``; docs/CHAOS.md): a
cluster of several groups started by ``dledger-cluster`` under RUN_DIR/cluster, the chaos workload
and sampler recording their histories, operations logged into faults.jsonl, the wind-down (producers
stop, consumers settle, every queue of every live group drained), run.json and the Spark audit.

The run directory has the layout of ``chaos run`` (docs/CHAOS.md), so ``python -m spark_jobs.audit``
reads it: history/, faults.jsonl, run.json, cluster/data/<group>/dledger-<id>/ — a retired group's
data stays there too, and its messages count as consumed only through the consumers' receipts.

Every process the drill starts is a ``dledger-cluster`` process, ended by ``down`` (by PID) in
``finally``; the workload's clients are closed there too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import subprocess
import sys
import time
from typing import Any

from chaos.history import HISTORY_VERSION, FaultRecord, JsonlWriter, now_us, read_jsonl
from chaos.layout import DEFAULT_PORT_BASE, Ports
from chaos.sampler import Sampler
from chaos.target import REPO, LocalTarget, Member, find_leader, groups_of, wait_for
from chaos.workload import CONSUMER_GROUP, Workload, WorkloadConfig, create_topic, drain, quick_check
from dledger.apps.stats import LatencyHistogram

CLUSTER_SUBDIR = "cluster"


@dataclasses.dataclass(frozen=True)
class FleetOptions:
    run_dir: str
    groups: int = 2
    namesrv: int = 1
    port_base: int = DEFAULT_PORT_BASE
    producers: int = 4
    consumers: int = 2
    rate: float = 50.0  # sends/s per producer
    topic: str = "FleetTopic"
    queues: int = 8
    settle_s: float = 60.0
    audit: bool = True
    seed: int = 0
    code_dir: str | None = None  # the cluster starts from this tree (an older release); None: this one
    extra: dict[str, str] = dataclasses.field(default_factory=dict)
    route_refresh_s: float = 5.0  # the producers' route refresh (RocketMQ's pollNameServerInterval: 30 s)


def add_load_arguments(p: Any, bounded: Any, *, consumers_min: int, steady_s: float, between: str) -> None:
    """The load every fleet drill runs under: producers, consumers, their rate, the steady time
    between two steps (``between``: what a step is, for the help)."""
    p.add_argument("--producers", type=bounded(int, 1, 64), default=4)
    p.add_argument("--consumers", type=bounded(int, consumers_min, 64), default=2)
    p.add_argument("--rate", type=bounded(float, 1, 100000), default=50.0, help="sends/s per producer (50)")
    p.add_argument("--steady", type=bounded(float, 0, 600), default=steady_s,
                   help=f"seconds of load between {between} ({steady_s:g})")


def add_run_arguments(p: Any, port_base: Any) -> None:
    """Where a fleet drill's ports start, its seed, and whether the Spark audit runs."""
    p.add_argument("--port-base", type=port_base, default=DEFAULT_PORT_BASE)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-audit", action="store_true", help="skip the Spark audit")


def cluster_cmd(cluster_dir: str, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    """``dledger-cluster ARGS --dir CLUSTER_DIR`` (blocking: run it in a thread)."""
    return subprocess.run([sys.executable, "-m", "dledger.apps.cluster", *args, "--dir", cluster_dir],
                          capture_output=True, text=True, timeout=timeout_s, cwd=REPO, check=False)


class FleetRun:
    """One drill's cluster, workload and records; the drill drives ``execute``'s middle part."""

    def __init__(self, opts: FleetOptions, tool: str, out: Any = sys.stdout):
        self.opts = opts
        self.tool = tool
        self.out = out
        self.dir = os.path.abspath(opts.run_dir)
        self.cluster_dir = os.path.join(self.dir, CLUSTER_SUBDIR)
        self.info: dict[str, Any] = {}
        self.target: LocalTarget | None = None
        self.workload: Workload | None = None
        self.sampler: Sampler | None = None
        self.faults: JsonlWriter | None = None
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", file=self.out, flush=True)

    def write_run_json(self) -> None:
        path = os.path.join(self.dir, "run.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.info, f, indent=2, default=str)
        os.replace(path + ".tmp", path)

    def fault(self, name: str, action: str, targets: tuple[str, ...], detail: dict[str, Any] | None = None) -> None:
        assert self.faults is not None and action in ("apply", "heal")
        self.faults.write(FaultRecord(now_us(), name, action, targets, dict(detail or {})))  # type: ignore[arg-type]
        self.faults.flush()

    async def cluster(self, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
        r = await asyncio.to_thread(cluster_cmd, self.cluster_dir, *args, timeout_s=timeout_s)
        if r.returncode != 0:
            raise RuntimeError(f"dledger-cluster {' '.join(args)} failed ({r.returncode}): "
                               f"{(r.stderr or r.stdout).strip()[-1500:]}")
        return r

    # -- phases ----------------------------------------------------------------------------------
    def prepare(self) -> None:
        """The run directory: new or empty (every run needs its own)."""
        if os.path.isdir(self.dir) and os.listdir(self.dir):
            raise RuntimeError(f"{self.dir} is not empty: every run needs a new directory")
        os.makedirs(os.path.join(self.dir, "history"), exist_ok=True)

    async def start(self, extra_info: dict[str, Any]) -> None:
        """Cluster up, topic on every group, sampler, workload; returns once acks flow (``prepare`` first)."""
        o = self.opts
        ports = Ports(o.port_base)
        self.info = {
            "version": 1, "history_version": HISTORY_VERSION, "tool": self.tool, "start_us": now_us(),
            "end_us": None, "status": "running", "seed": o.seed,
            "options": {k: v for k, v in dataclasses.asdict(o).items()},
            "topics": [{"topic": o.topic, "queues": o.queues}], "cluster_dir": CLUSTER_SUBDIR, **extra_info,
        }
        self.write_run_json()
        self.faults = JsonlWriter(os.path.join(self.dir, "faults.jsonl"))
        args = ["up", "--groups", str(o.groups), "--namesrv", str(o.namesrv), "--namesrv-port", str(ports.namesrv),
                "--raft-port", str(ports.raft), "--http-port", str(ports.http), "--wait", "90", "--json"]
        for k, v in o.extra.items():
            args += ["--set", f"{k}={v}"]
        if o.code_dir:
            args += ["--code-dir", o.code_dir]
        try:
            await self.cluster(*args, timeout_s=300)
        except RuntimeError:
            await asyncio.to_thread(cluster_cmd, self.cluster_dir, "down")
            raise
        self.target = LocalTarget(self.cluster_dir, restart="cluster")
        # ACL is on: every client of this process (workload, sampler, tools) signs as the cluster's admin
        os.environ["DLEDGER_CREDENTIALS_FILE"] = os.path.join(self.cluster_dir, "admin-credentials.yml")
        self.info["namesrv_addr"] = self.target.namesrv_addr
        await create_topic(self.target, o.topic, o.queues)
        self.sampler = Sampler(self.target, JsonlWriter(os.path.join(self.dir, "history", "samples.jsonl")),
                               group=CONSUMER_GROUP, topic=o.topic, interval_s=0.25)
        self.sampler.start()
        self.info["sampler"] = {"group": CONSUMER_GROUP, "topic": o.topic, "interval_s": 0.25}
        cfg = WorkloadConfig(topic=o.topic, queues=o.queues, producers=o.producers, keyed=o.producers // 2,
                             consumers=o.consumers, rate=o.rate)
        self.workload = Workload(os.path.join(self.dir, "history"), self.target.namesrv_addr, cfg,
                                 random.Random(o.seed + 1))
        for p in self.workload.producers:  # a retired group's routes go stale no later than this
            p.producer.route_refresh_interval_s = o.route_refresh_s
        await self.workload.start()
        c = self.workload.counters
        await wait_for(lambda: c.ok >= o.producers, 60, "the first acknowledged sends", 0.05)
        self.say(f"cluster up ({o.groups} groups), topic {o.topic} ({o.queues} queues per group), "
                 f"{o.producers} producers at {o.rate:g}/s each, {o.consumers} consumers; acks flowing")

    async def group_state(self) -> dict[str, dict[str, Any]]:
        """Per group: the member that leads (highest term) and the highest term any member reports."""
        assert self.target is not None
        out = {}
        for group, members in sorted(groups_of(self.target.members()).items()):
            statuses = await asyncio.gather(*(self.target.status(m) for m in members))
            terms = [int(st.get("term") or 0) for st in statuses if st]
            out[group] = {"leader": await find_leader(self.target, members, writable=True),
                          "term": max(terms, default=0)}
        return out

    async def caught_up(self, m: Member, timeout_s: float = 90.0) -> None:
        """``m`` answers, its group has a writable leader, and ``m`` applied near the leader's commit."""
        assert self.target is not None
        target = self.target
        members = [x for x in target.members() if x.group == m.group]

        async def done() -> bool:
            st = await target.status(m)
            lead = await find_leader(target, members, writable=True)
            if st is None or lead is None:
                return False
            lst = await target.status(next(x for x in members if x.name == lead)) or {}
            return int(st.get("applied_index") or 0) >= int(lst.get("commit_index") or 0) - 50

        await wait_for(done, timeout_s, f"{m.name} to catch up", 0.1)

    async def wind_down(self) -> None:
        """Producers stop, consumers settle (bounded), every live group's queues are drained."""
        assert self.workload is not None and self.target is not None
        w, o = self.workload, self.opts
        await w.stop_producers()
        w.flush()
        c = w.counters
        deadline = time.monotonic() + o.settle_s
        while time.monotonic() < deadline and not c.acked <= c.received:
            await asyncio.sleep(0.2)
        self.say(f"consumers: {len(c.received)} unique ids received; {len(c.acked - c.received)} acknowledged "
                 "not received yet")
        await w.stop_consumers()
        with JsonlWriter(os.path.join(self.dir, "history", "drain.jsonl")) as dw:
            drained = await drain(self.target, o.topic, o.queues, dw)
        self.info["drain_errors"] = drained.errors
        self.say(f"drained {drained.messages} messages from the live groups"
                 + "".join(f"\nWARNING: drain: {e}" for e in drained.errors))
        rows = []
        for m in self.target.members():
            st = await self.target.status(m) or {}
            rows.append({"name": m.name, "group": m.group, "node_id": m.node_id,
                         "data_dir": os.path.join(CLUSTER_SUBDIR, "data", m.group, f"dledger-{m.node_id}"),
                         **{k: st.get(k) for k in ("role", "term", "leader_id", "commit_index", "applied_index",
                                                   "first_index", "last_index", "writable",
                                                   "cluster_id")}})
        self.info["replicas"] = rows
        self.info["counts"] = {**c.snapshot(), "drained": drained.messages}

    async def close(self) -> None:
        """Clients closed, every process ``dledger-cluster`` recorded stopped (by PID)."""
        if self.workload is not None:
            await self.workload.close()
            self.workload = None
        if self.sampler is not None:
            await self.sampler.stop()
            self.sampler.out.close()
            self.info.setdefault("sampler", {})["samples"] = self.sampler.samples
            self.sampler = None
        if self.target is not None:
            await self.target.close()
            self.target = None
        if os.path.exists(os.path.join(self.cluster_dir, "cluster.json")):
            await asyncio.to_thread(cluster_cmd, self.cluster_dir, "down")
        if self.faults is not None:
            self.faults.close()
            self.faults = None
        self.info["end_us"] = now_us()
        self.write_run_json()

    def check(self) -> dict[str, Any]:
        """The run's own look (spark_jobs.audit is the authority): acknowledged sends missing from the
        drain *and* from every receipt (a retired group is not drained: its consumers' receipts count)."""
        hist = os.path.join(self.dir, "history")
        sends = [r for name in sorted(os.listdir(hist)) if name.startswith("sends-")
                 for r in read_jsonl(os.path.join(hist, name))]
        seen = [r for name in sorted(os.listdir(hist)) if name.startswith(("receipts-", "drain"))
                for r in read_jsonl(os.path.join(hist, name))]
        check = quick_check(sends, seen)
        # duplicates in the drain alone (an id both received and drained is seen twice, not stored twice)
        drained = [r for name in sorted(os.listdir(hist)) if name.startswith("drain")
                   for r in read_jsonl(os.path.join(hist, name))]
        check["stored_twice_or_more"] = quick_check(sends, drained)["stored_twice_or_more"]
        self.info["quick_check"] = check
        return check

    def audit(self) -> int:
        if not self.opts.audit:
            self.info["audit"] = {"ran": False}
            return 0
        self.say(f"audit: python -m spark_jobs.audit {self.dir}")
        started = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "spark_jobs.audit", self.dir], cwd=REPO, check=False)
        self.info["audit"] = {"ran": True, "exit_code": r.returncode, "took_s": round(time.monotonic() - started, 1)}
        self.say(f"audit exit code {r.returncode} ({'clean' if r.returncode == 0 else 'lost or diverged'})")
        return r.returncode


def send_gaps(sends: list[dict[str, Any]]) -> dict[str, Any]:
    """From send lines (``chaos.history.SendRecord`` dicts): per producer the longest time without an
    acknowledgement between two acknowledged sends (``gap_ms``, and when it ended), the slowest
    acknowledged send (``max_ack_ms``), the sends not acknowledged; and the worst of each (pure).

    A producer sends one message at a time, so the gap between two acks is what an application
    waiting on its sends sees: a send that fails or stalls during a restart widens it."""
    by_producer: dict[str, list[dict[str, Any]]] = {}
    for s in sends:
        by_producer.setdefault(str(s["producer"]), []).append(s)
    producers: dict[str, dict[str, Any]] = {}
    worst_gap_ms = worst_ack_ms = 0.0
    for name, rows in sorted(by_producer.items()):
        rows.sort(key=lambda r: (r["invoke_us"], r["complete_us"]))
        acks = [r for r in rows if r["outcome"] == "ok"]
        gap_us, gap_end_us, prev = 0, None, None
        for r in acks:
            if prev is not None and r["complete_us"] - prev > gap_us:
                gap_us, gap_end_us = r["complete_us"] - prev, r["complete_us"]
            prev = r["complete_us"]
        gap_ms = round(gap_us / 1000, 1)
        ack_ms = round(max((r["complete_us"] - r["invoke_us"] for r in acks), default=0) / 1000, 1)
        worst_gap_ms, worst_ack_ms = max(worst_gap_ms, gap_ms), max(worst_ack_ms, ack_ms)
        producers[name] = {"acked": len(acks), "not_acked": len(rows) - len(acks), "gap_ms": gap_ms,
                           "gap_end_us": gap_end_us, "max_ack_ms": ack_ms}
    return {"producers": producers, "worst_gap_ms": worst_gap_ms, "worst_ack_ms": worst_ack_ms,
            "not_acked": sum(int(p["not_acked"]) for p in producers.values())}


def read_sends(run_dir: str) -> list[dict[str, Any]]:
    hist = os.path.join(run_dir, "history")
    return [r for name in sorted(os.listdir(hist)) if name.startswith("sends-")
            for r in read_jsonl(os.path.join(hist, name))]


def read_faults(run_dir: str, fault: str) -> list[tuple[int, int]]:
    """(apply, heal) times in µs of one fault's windows in RUN_DIR/faults.jsonl, in order."""
    path = os.path.join(run_dir, "faults.jsonl")
    opened: list[int] = []
    out = []
    for r in read_jsonl(path) if os.path.isfile(path) else []:
        if r.get("fault") != fault:
            continue
        if r["action"] == "apply":
            opened.append(int(r["time_us"]))
        elif opened:
            out.append((opened.pop(0), int(r["time_us"])))
    return out


def other_groups_during(sends: list[dict[str, Any]], windows: list[tuple[int, int]], victim: str) -> dict[str, Any]:
    """Send latency of the groups other than ``victim``, for sends completed inside the fault
    ``windows`` (µs) and outside them; sends not acknowledged are counted by where they completed,
    in the window when their group is unknown (pure). A sync producer spreading over groups waits on
    the victim's stalled sends too, but each send's own latency is its group's."""
    inside, outside = LatencyHistogram(), LatencyHistogram()
    failed_in = failed_out = 0
    for s in sends:
        during = any(a <= s["complete_us"] < b for a, b in windows)
        if s["outcome"] != "ok":
            if s.get("broker") != victim:
                failed_in, failed_out = failed_in + during, failed_out + (not during)
            continue
        if s.get("broker") == victim:
            continue
        (inside if during else outside).record_us(s["complete_us"] - s["invoke_us"])

    def figures(h: LatencyHistogram, failed: int) -> dict[str, Any]:
        return {"acked": h.count, "not_acked": failed, "p50_ms": round(h.percentile_ms(50), 1),
                "p99_ms": round(h.percentile_ms(99), 1), "max_ms": round(h.max_ms(), 1)}

    return {"victim": victim, "windows": len(windows), "steady": figures(outside, failed_out),
            "failover": figures(inside, failed_in)}
