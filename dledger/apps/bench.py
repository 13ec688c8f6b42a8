"""``python -m dledger.apps.bench``: figures for a 3-process dledger group on this machine.

Cases (each prints a line; ``--json`` prints one JSON document at the end):
  throughput   committed appends/s and messages/s for 100 B and 1 KiB bodies, single (1 body per
               append, many in flight) and batched (many bodies per append)
  latency      commit latency p50/p99/max at a fixed offered rate (default 2,000 msgs/s, 1 KiB):
               as the client sees it (HTTP round trip included) and as the leader measures it
               (append enqueued -> commit index covers it)
  rss          RSS of every node after N stored messages (default 1,000,000 x 1 KiB)
  failover     kill -9 of the leader -> next acknowledged append, several rounds: median and max
  stock        the same throughput load on stock pysyncobj 0.3.17 (memory journal), and the ratio

Latencies are measured by the client (HTTP round trip included), so they are upper bounds of the
log's own commit latency. Everything runs on 127.0.0.1; the client shares the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgpack

from dledger.apps import cluster as local_cluster
from dledger.apps.stats import LatencyHistogram


@dataclass
class Target:
    """One group under test: where its nodes answer HTTP, and how to kill/restart them."""

    name: str
    http: dict[str, tuple[str, int]]
    procs: dict[str, Any] = field(default_factory=dict)
    restart: Any = None

    def pid(self, node: str) -> int:
        p = self.procs[node]
        return int(p.pid)


async def find_leader(session: aiohttp.ClientSession, target: Target, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for node, (host, port) in target.http.items():
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                async with session.get(
                    f"http://{host}:{port}/v1/status", timeout=aiohttp.ClientTimeout(total=0.5)
                ) as r:
                    st = await r.json()
                    if st.get("role") == "LEADER":
                        return node
        await asyncio.sleep(0.02)
    raise RuntimeError(f"{target.name}: no leader within {timeout_s} s")


class Load:
    """Closed-loop load: ``concurrency`` workers, each with one append in flight."""

    def __init__(self, session: aiohttp.ClientSession, target: Target, body_bytes: int, per_append: int):
        self.session = session
        self.target = target
        body = os.urandom(body_bytes)
        self.payload = msgpack.packb({"bodies": [body] * per_append, "timeout_ms": 5000})
        self.per_append = per_append
        self.appends = 0
        self.errors = 0
        self.error_codes: dict[str, int] = {}
        self.latencies = LatencyHistogram()
        self.leader: str | None = None

    async def _post(self) -> bool:
        if self.leader is None:
            self.leader = await find_leader(self.session, self.target)
        host, port = self.target.http[self.leader]
        t0 = time.perf_counter()
        code = "OK"
        try:
            async with self.session.post(f"http://{host}:{port}/v1/append", data=self.payload) as r:
                raw = await r.read()
                if r.status != 200:
                    try:
                        code = json.loads(raw).get("code", str(r.status))
                    except ValueError:
                        code = str(r.status)
        except (TimeoutError, aiohttp.ClientError) as exc:
            code = type(exc).__name__
        if code == "OK":
            self.appends += 1
            self.latencies.record_s(time.perf_counter() - t0)
            return True
        self.errors += 1
        self.error_codes[code] = self.error_codes.get(code, 0) + 1
        self.leader = None
        return False

    async def closed_loop(self, concurrency: int, duration_s: float) -> float:
        end = time.monotonic() + duration_s

        async def worker() -> None:
            while time.monotonic() < end:
                await self._post()

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.monotonic() - t0

    async def open_loop(self, rate_per_s: float, duration_s: float) -> None:
        interval = 1.0 / rate_per_s
        start = time.monotonic()
        tasks = set()
        n = 0
        while True:
            due = start + n * interval
            now = time.monotonic()
            if due - start >= duration_s:
                break
            if due > now:
                await asyncio.sleep(due - now)
            task = asyncio.ensure_future(self._post())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
        if tasks:
            await asyncio.gather(*tasks)


async def case_throughput(
    session: aiohttp.ClientSession,
    target: Target,
    body_bytes: int,
    per_append: int,
    concurrency: int,
    duration_s: float,
) -> dict[str, Any]:
    load = Load(session, target, body_bytes, per_append)
    await load.closed_loop(min(4, concurrency), 1.0)  # warm-up
    load = Load(session, target, body_bytes, per_append)
    elapsed = await load.closed_loop(concurrency, duration_s)
    return {
        "case": f"{target.name} {'batched' if per_append > 1 else 'single'} {body_bytes} B",
        "body_bytes": body_bytes,
        "bodies_per_append": per_append,
        "in_flight": concurrency,
        "appends_per_s": round(load.appends / elapsed, 1),
        "msgs_per_s": round(load.appends * per_append / elapsed, 1),
        "latency_ms_p50": round(load.latencies.percentile_ms(50), 2),
        "latency_ms_p99": round(load.latencies.percentile_ms(99), 2),
        "errors": load.errors,
        "error_codes": load.error_codes,
    }


async def case_latency(
    session: aiohttp.ClientSession, target: Target, rate: float, duration_s: float, body_bytes: int = 1024
) -> dict[str, Any]:
    load = Load(session, target, body_bytes, 1)
    await load.closed_loop(2, 1.0)
    load = Load(session, target, body_bytes, 1)
    leader = await find_leader(session, target)
    host, port = target.http[leader]
    server_side: dict[str, Any] = {}
    with contextlib.suppress(aiohttp.ClientError):
        async with session.post(f"http://{host}:{port}/v1/metrics/reset") as r:
            await r.read()
    await load.open_loop(rate, duration_s)
    with contextlib.suppress(aiohttp.ClientError, ValueError):
        async with session.get(f"http://{host}:{port}/v1/status") as r:
            server_side = (await r.json()).get("commit_latency_ms", {})
    return {
        "case": f"{target.name} commit latency at {rate:.0f} msgs/s ({body_bytes} B, single)",
        "offered_msgs_per_s": rate,
        "achieved_msgs_per_s": round(load.appends / duration_s, 1),
        "latency_ms_p50": round(load.latencies.percentile_ms(50), 2),
        "latency_ms_p99": round(load.latencies.percentile_ms(99), 2),
        "latency_ms_max": round(load.latencies.max_ms(), 2),
        "leader_commit_latency_ms": server_side,
        "errors": load.errors,
        "error_codes": load.error_codes,
    }


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def case_rss(session: aiohttp.ClientSession, target: Target, messages: int) -> dict[str, Any]:
    per_append = 64
    load = Load(session, target, 1024, per_append)
    before = {n: round(rss_mb(target.pid(n)), 1) for n in target.http}
    appends_needed = (messages + per_append - 1) // per_append
    t0 = time.monotonic()

    async def worker() -> None:
        while load.appends < appends_needed:
            await load._post()

    await asyncio.gather(*(worker() for _ in range(16)))
    elapsed = time.monotonic() - t0
    after = {n: round(rss_mb(target.pid(n)), 1) for n in target.http}
    return {
        "case": f"{target.name} RSS after {load.appends * per_append} x 1 KiB messages",
        "messages": load.appends * per_append,
        "msgs_per_s": round(load.appends * per_append / elapsed, 1),
        "rss_mb_before": before,
        "rss_mb_after": after,
        "rss_mb_max": max(after.values()),
    }


async def case_failover(session: aiohttp.ClientSession, target: Target, rounds: int) -> dict[str, Any]:
    times_ms: list[float] = []
    for _ in range(rounds):
        leader = await find_leader(session, target)
        load = Load(session, target, 1024, 1)
        load.leader = leader
        await load.closed_loop(4, 0.5)
        os.kill(target.pid(leader), signal.SIGKILL)
        killed_at = time.perf_counter()
        target.procs[leader].wait()
        load.leader = None
        done = asyncio.Event()
        first_ack: list[float] = []

        async def prober(
            load: Load = load, done: asyncio.Event = done, first_ack: list[float] = first_ack
        ) -> None:
            while not done.is_set():
                if await load._post():
                    first_ack.append(time.perf_counter())
                    done.set()
                else:
                    await asyncio.sleep(0.005)

        await asyncio.wait_for(asyncio.gather(*(prober() for _ in range(4))), 30)
        times_ms.append((min(first_ack) - killed_at) * 1000)
        target.restart(leader)
        await wait_all_up(session, target)
    return {
        "case": f"{target.name} failover: kill -9 leader -> next acknowledged append",
        "rounds": rounds,
        "ms": [round(t, 1) for t in times_ms],
        "ms_median": round(statistics.median(times_ms), 1),
        "ms_max": round(max(times_ms), 1),
    }


async def wait_all_up(session: aiohttp.ClientSession, target: Target, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        statuses = []
        for host, port in target.http.values():
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                async with session.get(
                    f"http://{host}:{port}/v1/status", timeout=aiohttp.ClientTimeout(total=0.5)
                ) as r:
                    statuses.append(await r.json())
        if len(statuses) == len(target.http):
            leaders = [s for s in statuses if s["role"] == "LEADER"]
            commits = [s["commit_index"] for s in statuses]
            if (
                len(leaders) == 1
                and max(commits) - min(commits) <= 0
                and all(s.get("leader_id") for s in statuses)
            ):
                return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{target.name}: the group did not settle within {timeout_s} s")


def start_dledger(root: str, flush: str) -> Target:
    raft_base = random.randint(42000, 52000)
    http_base = raft_base + 1000
    planned = local_cluster.plan(root, 1, "127.0.0.1", raft_base, http_base, flush, {})
    os.makedirs(os.path.join(root, "conf"), exist_ok=True)
    target = Target("dledger", {})

    def start(node: str) -> None:
        info = next(i for i, _ in planned if i.node_id == node)
        with open(info.log, "ab") as logf:
            target.procs[node] = subprocess.Popen(
                [sys.executable, "-m", "dledger.apps.node_server", "-c", info.conf, "--log-level", "WARNING"],
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    for info, text in planned:
        with open(info.conf, "w") as f:
            f.write(text)
        os.makedirs(os.path.dirname(info.log), exist_ok=True)
        target.http[info.node_id] = (info.host, info.http_port)
        start(info.node_id)
    target.restart = start
    return target


def start_stock(root: str) -> Target:
    base = random.randint(52001, 60000)
    raft = [f"127.0.0.1:{base + i}" for i in range(3)]
    target = Target("stock-pysyncobj", {})
    os.makedirs(os.path.join(root, "stock"), exist_ok=True)

    def start(node: str) -> None:
        i = int(node[1:])
        with open(os.path.join(root, "stock", f"{node}.log"), "ab") as logf:
            target.procs[node] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dledger.apps.stock_reference",
                    "--self",
                    raft[i],
                    "--peers",
                    ",".join(a for a in raft if a != raft[i]),
                    "--http",
                    str(base + 100 + i),
                ],
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    for i in range(3):
        target.http[f"n{i}"] = ("127.0.0.1", base + 100 + i)
        start(f"n{i}")
    target.restart = start
    return target


def stop_target(target: Target) -> None:
    for p in target.procs.values():
        if p.poll() is None:
            p.terminate()
    for p in target.procs.values():
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    root = args.dir or tempfile.mkdtemp(prefix="dledger-bench-")
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}, "cases": []}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10)) as session:

        def emit(r: dict[str, Any]) -> None:
            results["cases"].append(r)
            if not args.json:
                print(json.dumps(r), flush=True)

        target = start_dledger(os.path.join(root, "dledger"), args.flush)
        try:
            await wait_all_up(session, target)
            for body in (100, 1024):
                emit(await case_throughput(session, target, body, 1, args.single_in_flight, args.duration))
                emit(
                    await case_throughput(
                        session, target, body, args.batch, args.batch_in_flight, args.duration
                    )
                )
            emit(await case_latency(session, target, args.rate, args.duration))
            if args.failover_rounds:
                emit(await case_failover(session, target, args.failover_rounds))
            if args.rss_messages:
                await wait_all_up(session, target)
                emit(await case_rss(session, target, args.rss_messages))
        finally:
            stop_target(target)
        if not args.skip_stock:
            stock = start_stock(root)
            try:
                await wait_all_up(session, stock)
                ours = {
                    c["case"].split(" ", 1)[1]: c
                    for c in results["cases"]
                    if c["case"].startswith("dledger ")
                }
                for per_append, in_flight in ((1, args.single_in_flight), (args.batch, args.batch_in_flight)):
                    r = await case_throughput(session, stock, 1024, per_append, in_flight, args.duration)
                    mine = ours.get(r["case"].split(" ", 1)[1])
                    if mine is not None and r["msgs_per_s"]:
                        r["dledger_ratio"] = round(mine["msgs_per_s"] / r["msgs_per_s"], 2)
                    emit(r)
            finally:
                stop_target(stock)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dledger.apps.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document at the end")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per throughput/latency case")
    parser.add_argument("--batch", type=int, default=64, help="bodies per append in the batched cases")
    parser.add_argument("--batch-in-flight", type=int, default=16)
    parser.add_argument("--single-in-flight", type=int, default=128)
    parser.add_argument("--rate", type=float, default=2000.0, help="offered msgs/s for the latency case")
    parser.add_argument("--failover-rounds", type=int, default=5)
    parser.add_argument("--rss-messages", type=int, default=1_000_000)
    parser.add_argument("--flush", choices=["sync", "async"], default="sync")
    parser.add_argument("--skip-stock", action="store_true")
    parser.add_argument("--dir", help="work directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    if args.duration <= 0 or args.batch < 1 or args.rate <= 0 or args.failover_rounds < 0:
        print("dledger.apps.bench: durations, batch and rate must be positive", file=sys.stderr)
        return 2
    results = asyncio.run(run(args))
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
