"""``mq-bench failover``: kill -9 the leader under load, round after round, and time the recovery.

It runs its own local cluster (``dledger-cluster up`` in a temporary directory, ports chosen by
flags so it never touches a cluster you run), keeps ``--producers`` sync producers sending, and
each round: finds the writable leader, SIGKILLs it, records how long until (a) the first
acknowledged send after the kill and (b) a replica reports itself writable, restarts the killed
replica (``dledger-cluster start``) and waits until it caught up. At the end it reads every queue
back and counts acknowledged messages that are missing (must be 0). Prints per round and a summary
(median/max); ``--json`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from broker.client.transport import FROM_ENV, ClientError, Transport
from broker.protocol.auth import load_credentials
from broker.protocol.frames import Op
from broker.tools.cli import add_local_cluster_arguments
from dledger.apps.cluster import ADMIN_CREDENTIALS_FILE


def cluster_command(args: argparse.Namespace, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dledger.apps.cluster", *cmd, "--dir", args.dir],
        capture_output=True, text=True, timeout=120,
    )


def cluster_processes(args: argparse.Namespace) -> list[dict[str, Any]]:
    with open(os.path.join(args.dir, "cluster.json")) as f:
        return list(json.load(f)["processes"])


async def _leader(t: Transport, args: argparse.Namespace) -> dict[str, Any] | None:
    for p in cluster_processes(args):
        if p["kind"] != "broker":
            continue
        try:
            st = await t.call(f"{p['host']}:{p['http_port']}", "GET", "/v1/status", timeout_s=0.5)
        except ClientError:
            continue
        if st.get("writable"):
            return {**p, "status": st}
    return None


async def wait_for(cond: Any, timeout_s: float, what: str) -> Any:
    """The first truthy value of the coroutine function ``cond``, polled every 20 ms, or TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await cond()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise TimeoutError(f"timed out waiting for {what}")


async def run_failover(args: argparse.Namespace) -> int:
    from broker.client import Message, Producer

    own_dir = args.dir is None
    if own_dir:
        args.dir = tempfile.mkdtemp(prefix="mq-bench-failover-")
    up = cluster_command(
        args, "up", "--raft-port", str(args.raft_port), "--http-port", str(args.http_port),
        "--namesrv-port", str(args.namesrv_port), "--wait", "30",
    )
    if up.returncode != 0:
        print(f"mq-bench failover: the cluster did not start: {up.stderr.strip()[-500:]}", file=sys.stderr)
        cluster_command(args, "down")
        return 1
    namesrv = f"127.0.0.1:{args.namesrv_port}"
    # The cluster's ACL admin account (dledger-cluster up writes it); the environment's otherwise.
    creds_file = os.path.join(args.dir, ADMIN_CREDENTIALS_FILE)
    creds: Any = load_credentials(creds_file) if os.path.exists(creds_file) else FROM_ENV
    t = Transport(timeout_s=2.0, credentials=creds)
    producers = [Producer(f"failover_pg{i}", namesrv, credentials=creds) for i in range(args.producers)]
    acked: dict[bytes, float] = {}
    stored_ms: dict[bytes, int] = {}  # the broker's store time: tells old-leader acks from new ones
    errors: dict[str, int] = {}
    stop = asyncio.Event()
    rounds: list[dict[str, Any]] = []
    try:
        leader = await wait_for(lambda: _leader(t, args), 30, "a writable leader")
        await t.call(f"{leader['host']}:{leader['http_port']}", "POST", "/v1/topics",
                     {"topic": args.topic, "read_queue_nums": 8, "write_queue_nums": 8})
        for p in producers:
            await p.start()

        async def produce(p: Any, i: int) -> None:
            n = 0
            while not stop.is_set():
                body = f"{i}-{n}".encode()
                n += 1
                try:
                    result = await p.send(Message(args.topic, body))
                    acked[body] = time.monotonic()
                    stored_ms[body] = result.store_ts
                except ClientError as exc:
                    errors[exc.code] = errors.get(exc.code, 0) + 1
                    await asyncio.sleep(0.01)
                if args.rate_per_producer:
                    await asyncio.sleep(1 / args.rate_per_producer)

        tasks = [asyncio.create_task(produce(p, i)) for i, p in enumerate(producers)]
        for r in range(args.rounds):
            await asyncio.sleep(args.steady_s)
            leader = await wait_for(lambda: _leader(t, args), 30, "a writable leader")
            killed_at = time.monotonic()
            killed_wall_ms = time.time() * 1000
            os.kill(leader["pid"], signal.SIGKILL)
            new = await wait_for(
                lambda: _leader(t, args), 30, "a new writable leader"
            )
            writable_s = time.monotonic() - killed_at
            # The first send the *new* leader stored and acknowledged (an answer of the old leader
            # still in flight at the kill does not count).
            def after_kill() -> list[float]:
                return [acked[b] for b, ms in list(stored_ms.items()) if ms >= killed_wall_ms]  # noqa: B023

            await wait_for(lambda: _true(bool(after_kill())), 30, "an acknowledged send")
            first_ack_s = min(after_kill()) - killed_at
            row = {
                "round": r + 1,
                "killed": leader["name"],
                "new_leader": new["name"],
                "first_ack_ms": round(first_ack_s * 1000, 1),
                "new_leader_writable_ms": round(writable_s * 1000, 1),
            }
            rounds.append(row)
            if not args.json:
                print(
                    f"round {row['round']}: killed {row['killed']} -> {row['new_leader']}; first ack after "
                    f"{row['first_ack_ms']:.0f} ms; new leader writable after {row['new_leader_writable_ms']:.0f} ms",
                    flush=True,
                )
            restart = cluster_command(args, "start", leader["name"])
            if restart.returncode != 0:
                raise RuntimeError(f"restart of {leader['name']} failed: {restart.stderr}")
            await wait_for(lambda: _caught_up(t, args, leader["name"]), 60, "the restarted replica")  # noqa: B023
        stop.set()
        await asyncio.gather(*tasks)
        missing = await _missing(t, args, set(acked))
        ack_ms = [row["first_ack_ms"] for row in rounds]
        summary = {
            "rounds": rounds,
            "producers": args.producers,
            "first_ack_ms_median": statistics.median(ack_ms),
            "first_ack_ms_max": max(ack_ms),
            "new_leader_writable_ms_median": statistics.median(r["new_leader_writable_ms"] for r in rounds),
            "acknowledged": len(acked),
            "acknowledged_missing": missing,
            "send_errors": errors,
        }
        if args.json:
            print(json.dumps(summary, indent=2))
        else:
            print(
                f"first ack after kill -9: median {summary['first_ack_ms_median']:.0f} ms, max "
                f"{summary['first_ack_ms_max']:.0f} ms over {len(rounds)} rounds; acknowledged {len(acked)}, "
                f"missing {missing}; send errors {errors or 'none'}"
            )
        return 0 if missing == 0 else 1
    finally:
        stop.set()
        for p in producers:
            await p.shutdown()
        await t.close()
        if not args.keep:
            cluster_command(args, "down")


async def _true(value: bool) -> bool:
    return value


async def _caught_up(t: Transport, args: argparse.Namespace, name: str) -> bool:
    p = next(p for p in cluster_processes(args) if p["name"] == name)
    try:
        st = await t.call(f"{p['host']}:{p['http_port']}", "GET", "/v1/status", timeout_s=0.5)
    except ClientError:
        return False
    leader = await _leader(t, args)
    return leader is not None and st["applied_index"] >= leader["status"]["commit_index"] - 50


async def _missing(t: Transport, args: argparse.Namespace, acked: set[bytes]) -> int:
    leader = await wait_for(lambda: _leader(t, args), 30, "a writable leader")
    addr = f"{leader['host']}:{leader['http_port']}"
    stored: set[bytes] = set()
    for qid in range(8):
        offset = 0
        while True:
            r = await t.operation(addr, Op.PULL,
                                  {"topic": args.topic, "queue_id": qid, "offset": offset, "max_count": 1024})
            if r["status"] != "FOUND":
                break
            stored.update(m["body"] for m in r["messages"])
            offset = r["next_offset"]
    return len(acked - stored)


def add_parser(sub: Any, positive: Any) -> None:
    p = sub.add_parser("failover", help="kill -9 the leader of a private local cluster under load, N rounds")
    p.add_argument("--rounds", type=positive(int, 100), default=5)
    p.add_argument("--producers", type=positive(int, 64), default=4)
    p.add_argument("--rate-per-producer", dest="rate_per_producer", type=positive(float), default=None,
                   help="sends/s per producer (default: as fast as acknowledged)")
    p.add_argument("--steady-s", dest="steady_s", type=positive(float), default=2.0,
                   help="seconds of steady load before each kill (default 2)")
    add_local_cluster_arguments(
        p, positive, topic="FailoverBench", raft_port=41911, http_port=11911, namesrv_port=19876
    )
