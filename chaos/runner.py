"""``chaos run``: a local cluster behind Toxiproxy, a workload recording its history, alternating
fault and heal windows, a recovery period, a final drain, run.json, then the Spark audit.

    up ─▶ topic ─▶ workload ─▶ [fault │ heal] × n ─▶ quiet ─▶ recovery ─▶ stop producers
       ─▶ consumers settle ─▶ drain ─▶ replica status ─▶ down ─▶ audit (exit code = the audit's)

Every process the run starts is ended by PID in ``finally`` (after healing the network and
continuing suspended replicas), whatever happened. The run directory is docs/CHAOS.md's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import random
import subprocess
import sys
import time
from typing import Any

from broker.tools.progress import StatusLine, format_eta
from chaos import plants as plant_registry
from chaos.faults import SKEW_DEFAULT, Fault, FaultContext, make_fault
from chaos.history import HISTORY_VERSION, FaultRecord, JsonlWriter, now_us, read_jsonl
from chaos.layout import Ports, data_dir
from chaos.local import LocalChaosCluster
from chaos.sampler import Sampler
from chaos.schedule import (
    ACK_RATE_FLOOR,
    ACKS_PER_FAULT_WINDOW,
    Window,
    build_schedule,
    needed_ack_rate,
    window_at,
)
from chaos.target import LocalTarget, find_leader, groups_of, wait_for
from chaos.workload import (
    CONSUMER_GROUP,
    RETRY_GROUP,
    Workload,
    WorkloadConfig,
    create_topic,
    drain,
    drain_dlq,
    quick_check,
)

TOOL_VERSION = "0.1.0"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class RunOptions:
    run_dir: str
    faults: tuple[str, ...]
    interval_s: float = 30.0
    duration_s: float = 600.0
    recovery_s: float = 30.0
    settle_s: float = 60.0  # after producers stop: how long consumers get to receive every ack
    workload: WorkloadConfig = dataclasses.field(default_factory=WorkloadConfig)
    groups: int = 1
    port_base: int = 15000
    flush: str = "sync"
    seed: int = 0
    order: str = "cycle"
    fixed_node: str = "n0"
    toxic_params: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    extra: dict[str, str] = dataclasses.field(default_factory=dict)
    progress_s: float = 5.0
    audit: bool = True
    toxiproxy_server: str | None = None
    plants: tuple[str, ...] = ()  # chaos.plants names: deliberate defects (sensitivity tests only)
    sample_interval_s: float = 0.25
    skew: tuple[float, float] = SKEW_DEFAULT
    audit_args: tuple[str, ...] = ()
    crash_gate: str | None = None  # chaos.faults.CRASH_GATES: crash faults wait for unsynced acks


def crash_wait_s(interval_s: float) -> float:
    """How long a gated crash may wait for its precondition within its window: all of it but the last
    second (half of it for windows under 2 s), so the victims are down a while before the heal."""
    return max(interval_s - 1.0, interval_s / 2)


def audit_available() -> bool:
    try:
        return importlib.util.find_spec("spark_jobs.audit") is not None
    except ModuleNotFoundError:
        return False


def git_commit() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=5)
        if r.returncode == 0:
            return r.stdout.strip()
    return None


def progress_line(elapsed_s: float, fault: str | None, window: Window | None, rate: float,
                  counts: dict[str, Any], leaders: dict[str, str | None], total_s: float | None = None) -> str:
    where = f"{fault} ({max(0.0, window.end_s - elapsed_s):.0f}s left)" if fault and window else "no fault"
    lead = " ".join(f"{g}={n.rsplit('-', 1)[-1] if n else '-'}" for g, n in sorted(leaders.items()))
    eta = f" | ETA {format_eta(total_s - elapsed_s)}" if total_s is not None else ""
    return (f"[{elapsed_s:6.0f}s] {where:<32} | sends/s {rate:6.1f} | acks {counts['ok']} | "
            f"fail {counts['fail']} | unknown {counts['unknown']} | receipts {counts['receipts']} | leader {lead}"
            f"{eta}")


class Run:
    def __init__(self, opts: RunOptions, out: Any = sys.stdout):
        self.opts = opts
        self.out = out
        self.dir = os.path.abspath(opts.run_dir)
        self.rng = random.Random(opts.seed)
        self.schedule = build_schedule(opts.faults, opts.interval_s, opts.duration_s, order=opts.order,
                                       rng=random.Random(opts.seed))
        self.info: dict[str, Any] = {}
        self.current: tuple[str, Window] | None = None
        self.status = StatusLine(out)  # a live line on a terminal (rate, ETA); inert otherwise

    def say(self, text: str) -> None:
        self.status.println(text)

    def write_run_json(self) -> None:
        path = os.path.join(self.dir, "run.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.info, f, indent=2, default=str)
        os.replace(path + ".tmp", path)

    async def execute(self) -> int:
        o = self.opts
        if os.path.isdir(self.dir) and os.listdir(self.dir):
            raise RuntimeError(f"{self.dir} is not empty: every run needs a new directory")
        os.makedirs(os.path.join(self.dir, "history"), exist_ok=True)
        planted = plant_registry.lookup(list(o.plants))
        cluster = LocalChaosCluster(self.dir, ports=Ports(o.port_base), groups=o.groups, flush=o.flush,
                                    extra=o.extra, toxiproxy_binary=o.toxiproxy_server,
                                    broker_env=plant_registry.broker_env(planted))
        self.info = {
            "version": 1, "history_version": HISTORY_VERSION, "tool": "chaos run", "tool_version": TOOL_VERSION,
            "git_commit": git_commit(), "start_us": now_us(), "end_us": None, "status": "running",
            "options": _jsonable(dataclasses.asdict(o)), "seed": o.seed,
            "topics": [{"topic": o.workload.topic, "queues": o.workload.queues}],
            "cluster_dir": "cluster", "layout": cluster.layout.to_json(),
            "schedule": [dataclasses.asdict(w) for w in self.schedule],
            "plants": [{"name": p.name, "side": p.side, "spec": p.spec, "defect": p.defect} for p in planted],
        }
        self.write_run_json()
        self.say(f"chaos run: {self.dir} (seed {o.seed}); faults {', '.join(o.faults)}; "
                 f"{len(self.schedule)} windows of {o.interval_s:g} s, recovery {o.recovery_s:g} s")
        if planted:
            self.say("TEST PLANTS (deliberate defects): " + ", ".join(f"{p.name} ({p.side})" for p in planted))
            plant_registry.apply_client(planted)
        log_handler = _log_to(os.path.join(self.dir, "chaos.log"))
        faults_log = JsonlWriter(os.path.join(self.dir, "faults.jsonl"))
        target: LocalTarget | None = None
        workload: Workload | None = None
        sampler: Sampler | None = None
        try:
            await asyncio.to_thread(cluster.up)
            target = cluster.target()
            self.info["namesrv_addr"] = target.namesrv_addr
            await create_topic(target, o.workload.topic, o.workload.queues)
            sampler = Sampler(target, JsonlWriter(os.path.join(self.dir, "history", "samples.jsonl")),
                              group=CONSUMER_GROUP, topic=o.workload.topic, interval_s=o.sample_interval_s)
            sampler.start()
            self.info["sampler"] = {"group": CONSUMER_GROUP, "topic": o.workload.topic,
                                    "interval_s": o.sample_interval_s}
            workload = Workload(os.path.join(self.dir, "history"), target.namesrv_addr, o.workload,
                                random.Random(o.seed + 1))
            await workload.start()
            c = workload.counters
            await wait_for(lambda: c.ok >= o.workload.producers, 60, "the first acknowledged sends", 0.05)
            self.say(f"cluster up, topic {o.workload.topic} ({o.workload.queues} queues), "
                     f"{o.workload.producers} producers, {o.workload.consumers} consumers; acks flowing")
            ctx = FaultContext(target, faults_log, self.rng, fixed_node=o.fixed_node, toxic_params=o.toxic_params,
                               workload=workload, skew=o.skew,
                               damaged_dir=os.path.join(self.dir, "cluster", "damaged"),
                               crash_gate=o.crash_gate, crash_wait_s=crash_wait_s(o.interval_s))
            await self._play(ctx, target, workload)
            await self._wind_down(target, workload)
        finally:
            if workload is not None:
                await workload.close()
            if sampler is not None:
                await sampler.stop()
                sampler.out.close()
                self.info["sampler"] = {**self.info.get("sampler", {}), "samples": sampler.samples}
            if planted:
                plant_registry.unplant_all()
            if target is not None:
                if target.network is not None:
                    with contextlib.suppress(Exception):
                        await target.network.heal_all()
                target.resume_all()
                await target.close()
            await asyncio.to_thread(cluster.down)
            faults_log.close()
            logging.getLogger().removeHandler(log_handler)
            log_handler.close()
            self.info["end_us"] = now_us()
            self.info["status"] = "done" if "replicas" in self.info else "failed"
            self.write_run_json()
        return self.finish()

    async def _play(self, ctx: FaultContext, target: LocalTarget, workload: Workload) -> None:
        """The schedule's windows, then everything healed, then the recovery period."""
        t0 = time.monotonic()
        c = workload.counters
        acked_at_start = c.ok
        acked_in: list[dict[str, Any]] = []  # per fault window: acknowledgements while it was on
        progress = asyncio.create_task(self._progress(t0, workload, target))
        active: Fault | None = None
        try:
            for w in self.schedule:
                await _sleep_until(t0 + w.start_s)
                if w.fault is not None:
                    active = make_fault(w.fault)
                    self.current = (w.fault, w)
                    ctx.taken = set()  # nodes hit within this window (a composite's later parts avoid them)
                    before = c.ok
                    await active.apply(ctx)
                    await _sleep_until(t0 + w.end_s)
                    await active.heal(ctx)
                    acked_in.append({"fault": w.fault, "start_s": w.start_s, "acked": c.ok - before})
                    active, self.current = None, None
            await _sleep_until(t0 + self.opts.duration_s)
            self.info["unexpected_exits"] = await self._restore_everything(target, ctx.log)
            self.say(f"schedule done; recovery {self.opts.recovery_s:g} s")
            await asyncio.sleep(self.opts.recovery_s)
            self._rate_report(c.ok - acked_at_start, time.monotonic() - t0, acked_in)
        finally:
            if active is not None:  # an error or Ctrl-C inside a fault window
                with contextlib.suppress(Exception):
                    await active.heal(ctx)
            progress.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress

    def _rate_report(self, acked: int, elapsed_s: float, acked_in: list[dict[str, Any]]) -> None:
        """run.json ``workload_rate``, and a warning when the workload was slower than the schedule
        needs (``chaos.schedule.needed_ack_rate``) or than the rate it was given."""
        o = self.opts
        report = workload_rate(acked, elapsed_s, o.workload.producers * o.workload.rate or None,
                               needed_ack_rate(o.interval_s), acked_in)
        self.info["workload_rate"] = report
        self.say(f"workload: {report['achieved_ok_per_s']} acknowledged sends/s over the schedule and recovery "
                 f"(asked {report['offered_per_s'] or 'as fast as acknowledged'}; the fault mix needs "
                 f">= {report['needed_ok_per_s']}/s)")
        for w in report["warnings"]:
            self.say(f"WARNING: {w}")

    async def _wind_down(self, target: LocalTarget, workload: Workload) -> None:
        """Producers stop, consumers settle, every queue is drained, replica statuses recorded."""
        o = self.opts
        await workload.stop_producers()
        workload.flush()
        await self._settle(workload)
        await workload.stop_consumers()
        with JsonlWriter(os.path.join(self.dir, "history", "drain.jsonl")) as dw:
            drained = await drain(target, o.workload.topic, o.workload.queues, dw)
        self.info["drain_errors"] = drained.errors
        self.say(f"drained {drained.messages} messages" + "".join(f"\nWARNING: drain: {e}" for e in drained.errors))
        if workload.retry_consumers:
            with JsonlWriter(os.path.join(self.dir, "history", "dlq.jsonl")) as qw:
                dlq = await drain_dlq(target, RETRY_GROUP, qw)
            self.info["retry"] = {"group": RETRY_GROUP, "max_reconsume_times": o.workload.max_reconsume_times,
                                  "dlq_messages": dlq.messages}
            self.info["drain_errors"] = drained.errors + dlq.errors
            self.say(f"read {dlq.messages} messages from the DLQ of {RETRY_GROUP}"
                     + "".join(f"\nWARNING: DLQ read: {e}" for e in dlq.errors))
        self.info["replicas"] = await self._replica_status(target)
        self.info["counts"] = {**workload.counters.snapshot(), "drained": drained.messages}

    def finish(self) -> int:
        check = quick_check(_history(self.dir, "sends-"), _history(self.dir, "drain"))
        self.info["quick_check"] = check
        self.say(f"quick check: {check['acknowledged']} acknowledged, {check['acknowledged_lost']} missing from "
                 f"the drain; {check['stored_unique']} unique ids stored ({check['stored_twice_or_more']} "
                 f"stored more than once); unknown outcomes stored {check['unknown_stored']}, "
                 f"not stored {check['unknown_not_stored']}")
        if not self.opts.audit:
            self.info["audit"] = {"ran": False}
            self.write_run_json()
            return 1 if check["acknowledged_lost"] else 0
        if not audit_available():
            self.info["audit"] = {"ran": False, "error": "spark_jobs.audit is not installed"}
            self.write_run_json()
            self.say("chaos run: the audit (spark_jobs.audit) is not installed; run it later with "
                     f"`python -m spark_jobs.audit {self.dir}`, or pass --no-audit")
            return 2
        self.say(f"audit: python -m spark_jobs.audit {self.dir}")
        started = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "spark_jobs.audit", self.dir, *self.opts.audit_args], cwd=REPO,
                           check=False)
        self.info["audit"] = {"ran": True, "exit_code": r.returncode, "took_s": round(time.monotonic() - started, 1)}
        self.write_run_json()
        self.say(f"audit exit code {r.returncode} ({'clean' if r.returncode == 0 else 'lost or diverged'})")
        return r.returncode

    async def _progress(self, t0: float, workload: Workload, target: LocalTarget) -> None:
        """A plain line every ``progress_s``; on a terminal also a live line every second (elapsed /
        schedule + recovery, ETA, current fault, sends/s, acks), kept below the plain lines."""
        total_s = self.opts.duration_s + self.opts.recovery_s
        last_sends, last_t = workload.counters.sends, time.monotonic()
        live_sends, live_t = last_sends, last_t
        next_line = last_t + self.opts.progress_s
        try:
            while True:
                tick = 1.0 if self.status.live else self.opts.progress_s
                await asyncio.sleep(max(0.0, min(next_line, time.monotonic() + tick) - time.monotonic()))
                now = time.monotonic()
                c = workload.counters
                fault, w = self.current if self.current else (None, None)
                if now >= next_line:
                    rate = (c.sends - last_sends) / max(now - last_t, 1e-6)
                    last_sends, last_t = c.sends, now
                    next_line = now + self.opts.progress_s
                    leaders = {g: await find_leader(target, ms) for g, ms in groups_of(target.members()).items()}
                    self.say(progress_line(now - t0, fault, w or window_at(self.schedule, now - t0), rate,
                                           c.snapshot(), leaders, total_s))
                    workload.flush()
                if self.status.live:
                    rate = (c.sends - live_sends) / max(now - live_t, 1e-6)
                    live_sends, live_t = c.sends, now
                    self.status.update(
                        f"chaos run {format_eta(now - t0)} / {format_eta(total_s)} | ETA "
                        f"{format_eta(total_s - (now - t0))} | {fault or 'no fault'} | sends/s {rate:.0f} | "
                        f"acks {c.ok} | fail {c.fail} | unknown {c.unknown}"
                    )
        finally:
            self.status.close()

    async def _restore_everything(self, target: LocalTarget, log: JsonlWriter) -> list[str]:
        """After the schedule: every link healed, every replica running and continued. Replicas found
        dead here died on their own (not by a fault): they are started again and reported."""
        if target.network is not None:
            await target.network.heal_all()
        target.resume_all()
        dead = [m for m in target.members() if not target.is_running(m)]
        for m in dead:
            await target.start(m)
        if dead:
            names = [m.name for m in dead]
            self.say(f"WARNING: replicas exited on their own during the run: {', '.join(names)} (restarted)")
            log.write(FaultRecord(now_us(), "unexpected-exit", "heal", tuple(names), {"restarted": True}))
            log.flush()
        return [m.name for m in dead]

    async def _settle(self, workload: Workload) -> None:
        """Give consumers time to receive every acknowledged message (bounded by settle_s)."""
        c = workload.counters
        deadline = time.monotonic() + self.opts.settle_s
        retries = bool(workload.retry_consumers)
        while time.monotonic() < deadline and not (c.acked <= c.received and (not retries or c.retries_settled())):
            await asyncio.sleep(0.2)
        missing = len(c.acked - c.received)
        self.say(f"consumers: {len(c.received)} unique ids received; {missing} acknowledged not received yet")
        if retries:
            self.say(f"retry group: {len(c.retry_received)} unique ids received, {c.retry_failed} failed deliveries, "
                     f"{c.retry_to_dlq} sent to the DLQ; {len(c.retry_pending)} failed ids still pending, "
                     f"{len(c.acked - c.retry_received)} acknowledged not received yet")

    async def _replica_status(self, target: LocalTarget) -> list[dict[str, Any]]:
        rows = []
        for m in target.members():
            st = await target.status(m) or {}
            p = target.process(m)
            rows.append({
                "name": m.name, "group": m.group, "node_id": m.node_id, "pid": p.pid,
                "alive": target.is_running(m), "data_dir": os.path.relpath(data_dir(p, target.dir), self.dir),
                **{k: st.get(k) for k in ("role", "term", "leader_id", "commit_index", "applied_index",
                                          "first_index", "last_index", "writable", "cluster_id")},
            })
        return rows


OFFERED_SHARE_MIN = 0.5  # below half the asked rate, the machine (or the cluster) held the workload back


def workload_rate(acked: int, elapsed_s: float, offered_per_s: float | None, needed_per_s: float,
                  acked_in: list[dict[str, Any]]) -> dict[str, Any]:
    """What the workload achieved against what the schedule needs (pure; run.json ``workload_rate``)."""
    achieved = round(acked / elapsed_s, 1) if elapsed_s > 0 else 0.0
    warnings = []
    if achieved < needed_per_s:
        warnings.append(
            f"the workload achieved {achieved} acknowledged sends/s, below the {needed_per_s:g}/s the fault mix "
            f"needs ({ACKS_PER_FAULT_WINDOW} per fault window, at least {ACK_RATE_FLOOR:g}/s): faults may pass "
            "without the traffic that would show their effect (a busy machine? fewer --producers, a longer "
            "--interval, or a quieter host)")
    if offered_per_s and achieved < OFFERED_SHARE_MIN * offered_per_s:
        warnings.append(f"the workload achieved {achieved} acknowledged sends/s of the {offered_per_s:g}/s asked")
    return {"achieved_ok_per_s": achieved, "acked": acked, "elapsed_s": round(elapsed_s, 1),
            "offered_per_s": offered_per_s, "needed_ok_per_s": round(needed_per_s, 1),
            "acked_in_fault_windows": acked_in, "warnings": warnings}


def _log_to(path: str) -> logging.Handler:
    """Every log record of this process (the SDK's retries and warnings included) goes to the run's
    chaos.log; the console keeps the progress lines."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
        for h in root.handlers:
            if h is not handler and h.level == logging.NOTSET:
                h.setLevel(logging.ERROR)
    return handler


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


def _history(run_dir: str, prefix: str) -> Any:
    hist = os.path.join(run_dir, "history")
    for name in sorted(os.listdir(hist)) if os.path.isdir(hist) else []:
        if name.startswith(prefix) and name.endswith(".jsonl"):
            yield from read_jsonl(os.path.join(hist, name))


def _jsonable(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _jsonable(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [_jsonable(v) for v in d]
    return d
