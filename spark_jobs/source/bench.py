"""``python -m spark_jobs.source.bench``: load N messages into a 3-replica group, then time a batch
read of the topic through the ``dledger-mq`` data source into a DataFrame count.

    python -m spark_jobs.source.bench --messages 1000000 --json          # a private local cluster
    python -m spark_jobs.source.bench --namesrv 127.0.0.1:9876 --messages 200000

Without ``--namesrv`` it starts its own NameServer and group (``dledger-cluster up`` on free
ports, in a temporary directory; ACL on) and ends them by PID afterwards; the load and the read
use the admin account ``up`` wrote. With ``--namesrv``, ``--credentials FILE`` / ``--tls-ca FILE``
go to the SDK clients and, as ``credentialsFile`` / ``tlsCaFile``, to the data source; without
them both take the environment (``DLEDGER_CREDENTIALS_FILE``, ...). The topic is new (``--queues``
queues); bodies are random bytes of ``--size``. Before timing, every replica must hold every
message (the followers serve the read). Each ``--repeat`` run is one ``df.count()``, planning
included; the figure is messages counted per second of that call. Exit 1 when a count differs
from what the replicas hold.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from typing import Any
from urllib.parse import quote

from broker.client import Message, Producer
from broker.client.admin import Admin
from broker.client.transport import ClientError, Transport, add_security_arguments, security_kwargs
from spark_jobs.source.localcluster import LocalCluster

BATCH_BYTES_MAX = 1 << 20


async def load(
    namesrv: str,
    topic: str,
    messages: int,
    size: int,
    queues: int,
    in_flight: int,
    cluster: str = "DefaultCluster",
    security: dict[str, Any] | None = None,
) -> float:
    """Create ``topic`` and send ``messages`` bodies of ``size`` bytes; returns the seconds taken.
    ``security``: the SDK clients' ``credentials=``/``tls=`` (none: the environment's)."""
    security = security or {}
    async with Admin(namesrv, **security) as admin:
        await admin.update_topic(topic, cluster=cluster, read_queue_nums=queues, write_queue_nums=queues)
        deadline = time.monotonic() + 30
        while True:  # the route follows the topic within a second (re-registration)
            try:
                await admin.topic_route(topic)
                break
            except ClientError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
    body = os.urandom(size)
    per_batch = max(1, min(1024, BATCH_BYTES_MAX // size))
    started = time.monotonic()
    async with Producer("dledger_mq_bench", namesrv, **security) as producer:
        sem = asyncio.Semaphore(in_flight)

        async def send(first: int) -> None:
            count = min(per_batch, messages - first)
            async with sem:
                await producer.send_batch([Message(topic, body, tags="bench") for _ in range(count)])

        await asyncio.gather(*(send(i) for i in range(0, messages, per_batch)))
    return time.monotonic() - started


async def replica_totals(
    namesrv: str, topic: str, security: dict[str, Any] | None = None
) -> dict[str, dict[str, int]]:
    """Per group, the messages of ``topic`` each replica holds (sum of its queues' max offsets)."""
    transport = Transport(5.0, **(security or {}))
    try:
        async with Admin(namesrv, transport) as admin:
            route = await admin.topic_route(topic)
            out: dict[str, dict[str, int]] = {}
            for bd in route.broker_datas:
                for addr in bd.broker_addrs.values():
                    st = await transport.call(addr, "GET", f"/v1/topics/{quote(topic, safe='')}/status")
                    out.setdefault(bd.broker_name, {})[addr] = sum(int(q["max_offset"]) for q in st["queues"])
            return out
    finally:
        await transport.close()


async def wait_replicated(
    namesrv: str, topic: str, messages: int, timeout_s: float, security: dict[str, Any] | None = None
) -> int:
    """Waits until every replica of every group holds the same as its peers, ``messages`` (or
    more: a retried send may be stored twice) over all groups; returns that total."""
    deadline = time.monotonic() + timeout_s
    while True:
        groups = await replica_totals(namesrv, topic, security)
        agreed = [set(g.values()) for g in groups.values()]
        if all(len(g) == 3 for g in groups.values()) and all(len(a) == 1 for a in agreed):
            total = sum(a.pop() for a in agreed)
            if total >= messages:
                return total
        if time.monotonic() > deadline:
            raise RuntimeError(f"replicas did not converge within {timeout_s} s: {groups}")
        await asyncio.sleep(0.2)


def time_reads(namesrv: str, topic: str, master: str, repeat: int, options: dict[str, str]) -> list[dict[str, Any]]:
    from spark_jobs.session import get_session
    from spark_jobs.source import register

    spark = get_session(master, app_name="dledger-mq-bench")
    register(spark)
    runs = []
    try:
        for _ in range(repeat):
            reader = spark.read.format("dledger-mq").option("namesrv", namesrv).option("topic", topic)
            for k, v in options.items():
                reader = reader.option(k, v)
            started = time.monotonic()
            count = reader.load().count()
            seconds = time.monotonic() - started
            runs.append({"count": count, "seconds": round(seconds, 3), "msgs_per_s": round(count / seconds)})
    finally:
        spark.stop()
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spark_jobs.source.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    p.add_argument("--queues", type=int, default=8)
    p.add_argument("--namesrv", help="an existing cluster's NameServers (default: start a private one)")
    p.add_argument("--topic", help="default: a new topic name")
    p.add_argument("--cluster", default="DefaultCluster", help="cluster to create the topic in")
    p.add_argument("--master", default="local[*]")
    p.add_argument("--repeat", type=int, default=3, help="timed reads (default 3)")
    p.add_argument("--in-flight", type=int, default=8, help="concurrent batch sends while loading")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="data source option")
    p.add_argument("--json", action="store_true", help="one JSON summary on stdout")
    add_security_arguments(p)
    args = p.parse_args(argv)
    if args.messages < 1 or args.size < 1 or not 1 <= args.queues <= 1024 or args.repeat < 1:
        p.error("--messages, --size, --repeat must be >= 1 and --queues in 1..1024")
    try:
        options = dict(kv.split("=", 1) for kv in args.option)
    except ValueError:
        p.error("--option takes KEY=VALUE")
    if args.namesrv is None and (args.credentials or args.tls_ca):
        p.error("--credentials and --tls-ca are for a cluster given with --namesrv")
    try:
        security = security_kwargs(args)
    except ValueError as exc:  # CredentialsError: a file that cannot be used
        p.error(str(exc))
    if args.credentials:
        options.setdefault("credentialsFile", os.path.abspath(args.credentials))
    if args.tls_ca:
        options.setdefault("tlsCaFile", os.path.abspath(args.tls_ca))
    topic = args.topic or f"bench_{int(time.time())}"
    cluster: LocalCluster | None = None
    tmp: tempfile.TemporaryDirectory[str] | None = None
    try:
        namesrv = args.namesrv
        if namesrv is None:
            tmp = tempfile.TemporaryDirectory(prefix="dledger-mq-bench-")
            cluster = LocalCluster(os.path.join(tmp.name, "cluster"), flush="async")
            print(f"starting a local cluster in {tmp.name}", file=sys.stderr)
            cluster.up()
            namesrv = cluster.namesrv_addr
            security = {"credentials": cluster.credentials}
            options.setdefault("credentialsFile", cluster.credentials_file)
        print(f"loading {args.messages} x {args.size} B into {topic}", file=sys.stderr)
        load_s = asyncio.run(
            load(namesrv, topic, args.messages, args.size, args.queues, args.in_flight, args.cluster, security)
        )
        held = asyncio.run(wait_replicated(namesrv, topic, args.messages, 120, security))
        print(f"loaded in {load_s:.1f} s; the replicas hold {held}; reading", file=sys.stderr)
        runs = time_reads(namesrv, topic, args.master, args.repeat, options)
    finally:
        if cluster is not None:
            cluster.down()
        if tmp is not None:
            tmp.cleanup()
    summary = {
        "messages": args.messages,
        "held": held,
        "size": args.size,
        "queues": args.queues,
        "master": args.master,
        "cpu_count": os.cpu_count(),
        "load_seconds": round(load_s, 3),
        "load_msgs_per_s": round(args.messages / load_s),
        "runs": runs,
        "best_msgs_per_s": max(r["msgs_per_s"] for r in runs),
        "options": {k: "***" if k.lower() == "secretkey" else v for k, v in options.items()},
    }
    if args.json:
        print(json.dumps(summary))
    else:
        for i, r in enumerate(runs):
            print(f"run {i + 1}: {r['count']} rows in {r['seconds']} s = {r['msgs_per_s']} msgs/s")
        print(f"best: {summary['best_msgs_per_s']} msgs/s")
    return 0 if all(r["count"] == held for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
