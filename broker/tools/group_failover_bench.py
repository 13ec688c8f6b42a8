"""``mq-bench group-failover``: does a leader kill in one broker group disturb the other groups?

It runs its own local cluster of ``--groups`` groups (``dledger-cluster up`` in a temporary
directory, ports chosen by flags), creates the topic on every group's leader, and keeps
``--producers`` synchronous producers per group sending, each pinned to its group's queues (so a
send's latency is its group's alone: no retry moves it to another group). Per round: a steady
phase (the baseline), then SIGKILL of the victim group's leader; the *failover window* runs from the
kill until the victim group acknowledged a send stored by its new leader, plus ``--after-s``. Then the
killed replica is restarted (``dledger-cluster start``) and caught up before the next round.

Reported per round and over all rounds: the other groups' send latency p50/p99/max in the steady
phases and in the failover windows (sends *completed* inside the window), their failed sends, and the
victim's first ack after the kill. Every figure depends on the machine (on 2 cores the groups share
the CPU, so the victim's election and catch-up cost the others CPU time): run it on a quiet machine.
``--json`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from broker.client.transport import FROM_ENV, ClientError, Transport
from broker.protocol.auth import load_credentials
from broker.tools.cli import add_local_cluster_arguments
from broker.tools.failover_bench import cluster_command, cluster_processes, wait_for
from dledger.apps.cluster import ADMIN_CREDENTIALS_FILE
from dledger.apps.stats import LatencyHistogram


@dataclass
class Sends:
    """Every completed send of one group: (completion time on this process's monotonic clock, latency
    ms, ok, store time ms)."""

    rows: list[tuple[float, float, bool, int]] = field(default_factory=list)

    def window(self, start: float, end: float) -> tuple[LatencyHistogram, int]:
        """Latencies of the sends acknowledged in [start, end), and the failures completed there."""
        h, failed = LatencyHistogram(), 0
        for done, ms, ok, _store in self.rows:
            if start <= done < end:
                if ok:
                    h.record_ms(ms)
                else:
                    failed += 1
        return h, failed

    def first_ack_after(self, wall_ms: float) -> float | None:
        """The first completion of a send the group stored after ``wall_ms`` (a new leader's)."""
        times = [done for done, _ms, ok, store in self.rows if ok and store >= wall_ms]
        return min(times) if times else None


def figures(h: LatencyHistogram, failed: int) -> dict[str, Any]:
    return {"sends": h.count, "failed": failed, "p50_ms": round(h.percentile_ms(50), 2),
            "p99_ms": round(h.percentile_ms(99), 2), "max_ms": round(h.max_ms(), 2)}


async def _status(t: Transport, p: dict[str, Any]) -> dict[str, Any] | None:
    try:
        st = await t.call(f"{p['host']}:{p['http_port']}", "GET", "/v1/status", timeout_s=0.5)
    except ClientError:
        return None
    return dict(st) if isinstance(st, dict) else None


async def _writable(t: Transport, args: argparse.Namespace, group: str) -> dict[str, Any] | None:
    for p in cluster_processes(args):
        if p["kind"] == "broker" and p["group"] == group:
            st = await _status(t, p)
            if st is not None and st.get("writable"):
                return {**p, "status": st}
    return None


async def run_group_failover(args: argparse.Namespace) -> int:
    from broker.client import Message, MessageQueue, Producer

    own_dir = args.dir is None
    if own_dir:
        args.dir = tempfile.mkdtemp(prefix="mq-bench-group-failover-")
    up = cluster_command(
        args, "up", "--groups", str(args.groups), "--raft-port", str(args.raft_port), "--http-port",
        str(args.http_port), "--namesrv-port", str(args.namesrv_port), "--wait", "60",
    )
    if up.returncode != 0:
        print(f"mq-bench group-failover: the cluster did not start: {up.stderr.strip()[-500:]}", file=sys.stderr)
        cluster_command(args, "down")
        return 1
    namesrv = f"127.0.0.1:{args.namesrv_port}"
    creds_file = os.path.join(args.dir, ADMIN_CREDENTIALS_FILE)
    creds: Any = load_credentials(creds_file) if os.path.exists(creds_file) else FROM_ENV
    t = Transport(timeout_s=2.0, credentials=creds)
    groups = [f"RaftNode{g:02d}" for g in range(args.groups)]
    victim = groups[0]
    sends = {g: Sends() for g in groups}
    stop = asyncio.Event()
    producers: list[Any] = []
    tasks: list[asyncio.Task[None]] = []
    rounds: list[dict[str, Any]] = []
    bounds: list[tuple[float, float, float]] = []
    say = (lambda _text: None) if args.json else (lambda text: print(text, flush=True))
    try:
        for g in groups:
            leader = await wait_for(lambda g=g: _writable(t, args, g), 30, f"a writable leader of {g}")
            await t.call(f"{leader['host']}:{leader['http_port']}", "POST", "/v1/topics",
                         {"topic": args.topic, "read_queue_nums": args.queues, "write_queue_nums": args.queues})

        async def produce(p: Any, g: str, i: int) -> None:
            n = 0
            rows = sends[g].rows
            while not stop.is_set():
                mq = MessageQueue(args.topic, g, (i + n) % args.queues)
                n += 1
                started = time.monotonic()
                try:
                    r = await p.send(Message(args.topic, b"x" * args.size), queue=mq)
                    done = time.monotonic()
                    rows.append((done, (done - started) * 1000, True, r.store_ts))
                except ClientError:
                    done = time.monotonic()
                    rows.append((done, (done - started) * 1000, False, 0))
                    await asyncio.sleep(0.01)

        for g in groups:
            for i in range(args.producers):
                p = Producer(f"gfo_{g}_{i}", namesrv, credentials=creds)
                await p.start()
                producers.append(p)
                tasks.append(asyncio.create_task(produce(p, g, i)))
        await asyncio.sleep(args.warmup_s)
        for r in range(1, args.rounds + 1):
            steady_start = time.monotonic()
            await asyncio.sleep(args.steady_s)
            leader = await wait_for(lambda: _writable(t, args, victim), 30, f"a writable leader of {victim}")
            killed_at, killed_wall_ms = time.monotonic(), time.time() * 1000
            os.kill(leader["pid"], signal.SIGKILL)
            first = await wait_for(lambda: _true(sends[victim].first_ack_after(killed_wall_ms)), 60,  # noqa: B023
                                f"an ack from {victim}'s new leader")
            end = first + args.after_s
            await asyncio.sleep(max(0.0, end - time.monotonic()))
            row: dict[str, Any] = {"round": r, "killed": leader["name"],
                                   "victim_first_ack_ms": round((first - killed_at) * 1000, 1),
                                   "window_s": round(end - killed_at, 2), "others": {}}
            for g in groups[1:]:
                base_h, base_f = sends[g].window(steady_start, killed_at)
                win_h, win_f = sends[g].window(killed_at, end)
                row["others"][g] = {"steady": figures(base_h, base_f), "failover": figures(win_h, win_f)}
            rounds.append(row)
            bounds.append((steady_start, killed_at, end))
            say(f"round {r}: killed {row['killed']}; {victim}'s first ack after {row['victim_first_ack_ms']:.0f} ms; "
                + "; ".join(f"{g} p99 steady {o['steady']['p99_ms']:.1f} ms -> failover "
                            f"{o['failover']['p99_ms']:.1f} ms (max {o['failover']['max_ms']:.0f} ms, "
                            f"failed {o['failover']['failed']})" for g, o in row["others"].items()))
            restart = cluster_command(args, "start", leader["name"])
            if restart.returncode != 0:
                raise RuntimeError(f"restart of {leader['name']} failed: {restart.stderr}")
            await wait_for(lambda: _caught_up(t, args, leader), 90, "the restarted replica")  # noqa: B023
        summary = summarize(rounds, bounds, groups[1:], sends)
        if args.json:
            print(json.dumps({"groups": args.groups, "producers_per_group": args.producers, "rounds": rounds,
                              "summary": summary}, indent=2))
        else:
            o = summary["others"]
            print(f"other groups over {len(rounds)} rounds: send p99 steady {o['steady']['p99_ms']:.1f} ms, during "
                  f"{victim}'s failover {o['failover']['p99_ms']:.1f} ms (max {o['failover']['max_ms']:.0f} ms, "
                  f"failed {o['failover']['failed']}); {victim}'s first ack after the kill: median "
                  f"{summary['victim_first_ack_ms_median']:.0f} ms")
        return 0
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in producers:
            with contextlib.suppress(Exception):
                await p.shutdown()
        await t.close()
        if not args.keep:
            cluster_command(args, "down")


def summarize(rounds: list[dict[str, Any]], bounds: list[tuple[float, float, float]], others: list[str],
              sends: dict[str, Sends]) -> dict[str, Any]:
    """The other groups' figures over every round's steady phase and failover window together;
    ``bounds`` per round: (steady start, kill, window end)."""
    steady, window = LatencyHistogram(), LatencyHistogram()
    steady_failed = window_failed = 0
    for start, kill, end in bounds:
        for g in others:
            h, f = sends[g].window(start, kill)
            steady.merge(h)
            steady_failed += f
            h, f = sends[g].window(kill, end)
            window.merge(h)
            window_failed += f
    firsts = sorted(r["victim_first_ack_ms"] for r in rounds)
    return {"others": {"steady": figures(steady, steady_failed), "failover": figures(window, window_failed)},
            "victim_first_ack_ms_median": firsts[len(firsts) // 2] if firsts else 0.0}


async def _true(value: float | None) -> float | None:
    return value


async def _caught_up(t: Transport, args: argparse.Namespace, p: dict[str, Any]) -> bool:
    st = await _status(t, p)
    leader = await _writable(t, args, p["group"])
    return st is not None and leader is not None and st["applied_index"] >= leader["status"]["commit_index"] - 50


def add_parser(sub: Any, positive: Any) -> None:
    p = sub.add_parser("group-failover",
                       help="kill -9 one group's leader under load; the other groups' send latency meanwhile")
    p.add_argument("--groups", type=positive(int, 9), default=3, help="broker groups (default 3)")
    p.add_argument("--rounds", type=positive(int, 100), default=3)
    p.add_argument("--producers", type=positive(int, 64), default=4, help="sync producers per group (default 4)")
    p.add_argument("--queues", type=positive(int, 64), default=4, help="queues per group (default 4)")
    p.add_argument("--size", type=positive(int, 1 << 20), default=128, help="body bytes (default 128)")
    p.add_argument("--warmup-s", dest="warmup_s", type=positive(float), default=3.0)
    p.add_argument("--steady-s", dest="steady_s", type=positive(float), default=10.0,
                   help="seconds of load before each kill: the baseline (default 10)")
    p.add_argument("--after-s", dest="after_s", type=positive(float), default=2.0,
                   help="the failover window lasts until the victim's first new ack plus this (default 2)")
    add_local_cluster_arguments(
        p, positive, topic="GroupFailoverBench", raft_port=43911, http_port=13911, namesrv_port=19886
    )
