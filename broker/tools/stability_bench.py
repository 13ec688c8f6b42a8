"""``mq-bench stability``: how often does leadership move when nothing is wrong? (target: never)

It runs its own local cluster (``dledger-cluster up`` in a temporary directory, ports chosen by
flags), then watches every broker's Raft counters and term through an idle phase and through a
phase of load that keeps the machine busy (sync producers sending as fast as they are acknowledged
and a push consumer reading), and reports elections (candidacies), pre-votes started, term changes
and leader changes per phase and per hour, with the largest heartbeat gap a follower saw.
``--clock-skew`` runs every replica on a clock of its own (hours apart, drifting): the one-clock rule
under test. Prints a summary; ``--json`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from typing import Any

from broker.client.transport import ClientError, Transport
from broker.protocol.auth import load_credentials
from broker.tools.cli import add_local_cluster_arguments
from broker.tools.failover_bench import cluster_command, cluster_processes
from dledger.apps.cluster import ADMIN_CREDENTIALS_FILE


async def _sample(t: Transport, brokers: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for p in brokers:
        try:
            st = await t.call(f"{p['host']}:{p['http_port']}", "GET", "/v1/status", timeout_s=1.0)
        except ClientError:
            continue
        out[p["name"]] = st
    return out


class Watch:
    """Samples every broker's status and keeps what a phase needs (counters, terms, leaders)."""

    def __init__(self) -> None:
        self.samples = 0
        self.first: dict[str, dict[str, Any]] = {}
        self.last: dict[str, dict[str, Any]] = {}
        self.leaders: list[str | None] = []
        self.max_gap_ms = 0.0
        self.terms: set[int] = set()

    def add(self, sample: dict[str, dict[str, Any]]) -> None:
        self.samples += 1
        for name, st in sample.items():
            self.first.setdefault(name, st)
            self.last[name] = st
            self.terms.add(int(st["term"]))
            if st["role"] != "LEADER":
                self.max_gap_ms = max(self.max_gap_ms, float(st["raft"]["max_append_gap_ms"]))
        leaders = sorted({st["leader_id"] for st in sample.values() if st.get("leader_id")})
        leader = leaders[0] if len(leaders) == 1 else None
        if not self.leaders or self.leaders[-1] != leader:
            self.leaders.append(leader)

    def delta(self, key: str) -> int:
        return sum(
            int(self.last[n]["raft"][key]) - int(self.first[n]["raft"][key])
            for n in self.last
            if n in self.first
        )

    def summary(self, seconds: float) -> dict[str, Any]:
        per_hour = 3600.0 / seconds if seconds > 0 else 0.0
        elections = self.delta("elections")
        return {
            "seconds": round(seconds, 1),
            "samples": self.samples,
            "elections": elections,
            "elections_per_hour": round(elections * per_hour, 1),
            "prevotes_started": self.delta("prevotes_started"),
            "stepdowns": self.delta("stepdowns"),
            "terms_seen": sorted(self.terms),
            "leader_changes": max(0, len([x for x in self.leaders if x is not None]) - 1),
            "max_heartbeat_gap_ms": round(self.max_gap_ms, 1),
        }


async def _watch(t: Transport, brokers: list[dict[str, Any]], watch: Watch, stop: asyncio.Event) -> None:
    while not stop.is_set():
        watch.add(await _sample(t, brokers))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


async def _load(namesrv: str, creds: Any, args: argparse.Namespace, stop: asyncio.Event) -> dict[str, int]:
    from broker.client import Message, Producer, PushConsumer

    counts = {"sent": 0, "failed": 0, "consumed": 0}
    body = os.urandom(1024)
    async with Producer("stability_bench", namesrv, credentials=creds) as producer:

        async def sender() -> None:
            while not stop.is_set():
                try:
                    await producer.send(Message(args.topic, body))
                    counts["sent"] += 1
                except Exception:
                    counts["failed"] += 1

        def listener(msgs: Any, _ctx: Any) -> str:
            counts["consumed"] += len(msgs)
            return "CONSUME_SUCCESS"

        consumer = PushConsumer("stability_bench_c", namesrv, consume_from="LAST", credentials=creds)
        consumer.subscribe(args.topic, "*")
        consumer.register_listener(listener)
        await consumer.start()
        try:
            await asyncio.gather(*(sender() for _ in range(args.producers)))
        finally:
            await consumer.shutdown()
    return counts


async def run_stability(args: argparse.Namespace) -> int:
    from broker.client.admin import Admin

    own_dir = args.dir is None
    if own_dir:
        args.dir = tempfile.mkdtemp(prefix="mq-bench-stability-")
    cmd = ["up", "--raft-port", str(args.raft_port), "--http-port", str(args.http_port)]
    cmd += ["--namesrv-port", str(args.namesrv_port), "--wait", "30"]
    if args.clock_skew:
        cmd.append("--clock-skew")
    up = cluster_command(args, *cmd)
    if up.returncode != 0:
        print(f"mq-bench stability: the cluster did not start: {up.stderr.strip()[-500:]}", file=sys.stderr)
        cluster_command(args, "down")
        return 1
    namesrv = f"127.0.0.1:{args.namesrv_port}"
    creds = load_credentials(os.path.join(args.dir, ADMIN_CREDENTIALS_FILE))
    brokers = [p for p in cluster_processes(args) if p["kind"] == "broker"]
    result: dict[str, Any] = {"clock_skew": args.clock_skew, "producers": args.producers}
    t = Transport(3.0, credentials=creds)
    try:
        async with Admin(namesrv, credentials=creds) as admin:
            await admin.update_topic(args.topic, cluster="DefaultCluster", read_queue_nums=8, write_queue_nums=8)
        for phase, seconds in (("idle", args.idle_s), ("load", args.load_s)):
            if seconds <= 0:
                continue
            watch, stop = Watch(), asyncio.Event()
            watcher = asyncio.create_task(_watch(t, brokers, watch, stop))
            load = asyncio.create_task(_load(namesrv, creds, args, stop)) if phase == "load" else None
            started = time.monotonic()
            print(f"mq-bench stability: {phase} for {seconds:.0f} s ...", file=sys.stderr)
            await asyncio.sleep(seconds)
            stop.set()
            elapsed = time.monotonic() - started
            counts = await load if load is not None else None
            await watcher
            result[phase] = watch.summary(elapsed)
            if counts is not None:
                result[phase].update(counts, msgs_per_s=round(counts["sent"] / elapsed, 1))
    finally:
        await t.close()
        if not args.keep:
            cluster_command(args, "down")
            if own_dir:
                import shutil

                shutil.rmtree(args.dir, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        for phase in ("idle", "load"):
            if phase in result:
                r = result[phase]
                extra = f", {r['msgs_per_s']} msgs/s" if "msgs_per_s" in r else ""
                print(
                    f"{phase}: {r['seconds']} s, elections {r['elections']} ({r['elections_per_hour']}/h), "
                    f"pre-votes {r['prevotes_started']}, leader changes {r['leader_changes']}, "
                    f"terms {r['terms_seen']}, "
                    f"max heartbeat gap {r['max_heartbeat_gap_ms']} ms{extra}"
                )
    return 0


def add_parser(sub: Any, positive: Any) -> None:
    p = sub.add_parser("stability", help="elections with no fault: idle and under load, in a private cluster")
    p.add_argument("--idle-s", dest="idle_s", type=float, default=60.0)
    p.add_argument("--load-s", dest="load_s", type=float, default=60.0)
    p.add_argument("--producers", type=positive(int, 256), default=32)
    p.add_argument(
        "--clock-skew", dest="clock_skew", action="store_true", help="every replica on its own skewed clock"
    )
    add_local_cluster_arguments(
        p, positive, topic="StabilityBench", raft_port=42911, http_port=12911, namesrv_port=29876
    )
