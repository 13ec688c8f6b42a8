"""``mqadmin`` statistics commands (RocketMQ parity, issue 16): statsAll (lag and in/out TPS per topic and
group, from the leaders' Prometheus ``/metrics``, read by ``scrape_metrics``, which the dashboard shares)
and clusterRT (send round trips to every group leader). Named in the command table, ``mqadmin_commands.py``."""

from __future__ import annotations

import argparse
import asyncio
import math

from broker.client.admin import Admin
from broker.client.admin_checks import (
    answers_checked,
    check_name,
    check_topic,
)
from broker.client.admin_records import InvalidArgument
from broker.client.transport import ClientError
from broker.protocol.frames import Op
from broker.tools.mqadmin_format import (
    Output,
    format_table,
)
from dledger.clock import process_clock

CLUSTER_RT_AMOUNT_MAX = 1000
METRICS_BYTES_MAX = 16 << 20


async def scrape_metrics(admin: Admin, addr: str, timeout_s: float) -> dict[str, list[tuple[dict[str, str], float]]]:
    import aiohttp  # here, not at the top: every other mqadmin command starts without it (issue 28)
    from prometheus_client.parser import text_string_to_metric_families

    url = f"{admin.transport.scheme}://{addr}/metrics"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:
            async with http.get(url, ssl=admin.transport.ssl_context or False) as resp:
                if resp.status != 200:
                    raise ClientError("BAD_ANSWER", f"/metrics answered HTTP {resp.status}", addr=addr)
                raw = await resp.content.read(METRICS_BYTES_MAX + 1)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ClientError("CONNECT_FAILED", str(exc) or type(exc).__name__, addr=addr) from None
    if len(raw) > METRICS_BYTES_MAX:
        raise ClientError("BAD_ANSWER", f"/metrics answered more than {METRICS_BYTES_MAX} bytes", addr=addr)
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for fam in text_string_to_metric_families(raw.decode("utf-8", "replace")):
            for s in fam.samples:
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except ValueError as exc:
        raise ClientError("BAD_ANSWER", f"/metrics is not Prometheus text: {exc}", addr=addr) from None
    return out


@answers_checked
async def run_stats_all(admin: Admin, args: argparse.Namespace) -> Output:
    """Per topic and consumer group: lag, in/out TPS (the leaders' ``/metrics``, last 10 s)."""
    groups = await admin.all_groups()
    leaders = [(bd.broker_name, bd.leader_addr) for bd in groups if bd.leader_addr]
    scraped = await asyncio.gather(*(scrape_metrics(admin, a, args.timeout) for _n, a in leaders))
    in_tps: dict[str, float] = {}
    out_tps: dict[tuple[str, str], float] = {}
    lag: dict[tuple[str, str], float] = {}
    for samples in scraped:
        for lab, v in samples.get("rocketmq_producer_tps", []):
            in_tps[lab["topic"]] = in_tps.get(lab["topic"], 0.0) + v
        for lab, v in samples.get("rocketmq_consumer_tps", []):
            if lab.get("group"):
                key = (lab["topic"], lab["group"])
                out_tps[key] = out_tps.get(key, 0.0) + v
        for lab, v in samples.get("rocketmq_group_diff", []):
            key = (lab["topic"], lab["group"])
            lag[key] = lag.get(key, 0.0) + v
        for lab, _v in samples.get("rocketmq_producer_offset", []):
            in_tps.setdefault(lab["topic"], 0.0)
    rows = []
    if args.topic is not None and args.topic not in in_tps:
        await _require_topic(admin, args.topic)  # no figures yet for a topic that exists: an empty table
    topics = sorted(t for t in in_tps if args.topic in (None, t))
    for topic in topics:
        tgroups = sorted({g for t, g in (*lag, *out_tps) if t == topic})
        if not tgroups:
            rows.append({"topic": topic, "group": None, "accumulation": None, "in_tps": in_tps[topic], "out_tps": None})
        for g in tgroups:
            rows.append(
                {
                    "topic": topic,
                    "group": g,
                    # None: no broker holds offsets of the group on the topic (a broadcasting group,
                    # whose consumers keep their own): its lag is unknown, not 0
                    "accumulation": int(lag[(topic, g)]) if (topic, g) in lag else None,
                    "in_tps": in_tps[topic],
                    "out_tps": out_tps.get((topic, g), 0.0),
                }
            )
    table = format_table(
        ["Topic", "Consumer Group", "Accumulation", "InTPS", "OutTPS"],
        [
            (
                r["topic"],
                r["group"],
                r["accumulation"],
                f"{r['in_tps']:.2f}",
                None if r["out_tps"] is None else f"{r['out_tps']:.2f}",
            )
            for r in rows
        ],
    )
    return Output({"stats": rows}, table)


async def _require_topic(admin: Admin, topic: str) -> None:
    """``-t`` naming a topic no NameServer routes is bad input (exit 2), not an empty table."""
    try:
        await admin.topic_route(check_topic(topic))
    except ClientError as exc:
        if exc.code == "TOPIC_NOT_EXIST":
            raise InvalidArgument("TOPIC_NOT_EXIST", f"-t {topic}: no such topic ({exc.message})") from None
        raise


async def run_cluster_rt(admin: Admin, args: argparse.Namespace) -> Output:
    """Send ``-a`` small messages to every group leader of the cluster (topic ``-t``), one at a
    time, and report the round trip per group (RocketMQ's clusterRT)."""
    if not 1 <= args.amount <= CLUSTER_RT_AMOUNT_MAX:
        raise InvalidArgument("BAD_REQUEST", f"-a amount must be in [1, {CLUSTER_RT_AMOUNT_MAX}]")
    topic = check_topic(args.topic)
    if args.cluster is not None:
        groups = await admin.cluster_groups(check_name(args.cluster, "cluster"))
    else:
        groups = await admin.all_groups()
    clock = process_clock()
    body = {"topic": topic, "queue_id": 0, "messages": [{"body": b"x" * args.size}]}
    rows = []
    for bd in groups:
        rts: list[float] = []
        errors = 0
        last_error = None
        for _ in range(args.amount):
            started = clock.monotonic()
            try:
                await admin.operation(bd, Op.SEND, body)
            except ClientError as exc:
                errors += 1
                last_error = f"{exc.code}: {exc.message}"
                continue
            rts.append((clock.monotonic() - started) * 1000)
        rows.append(
            {
                "cluster": bd.cluster,
                "broker_name": bd.broker_name,
                "sent": len(rts),
                "failed": errors,
                "rt_avg_ms": round(sum(rts) / len(rts), 3) if rts else None,
                "rt_max_ms": round(max(rts), 3) if rts else None,
                "rt_p99_ms": round(sorted(rts)[max(0, math.ceil(len(rts) * 0.99) - 1)], 3) if rts else None,
                "error": last_error,
            }
        )
    table = format_table(
        ["Cluster Name", "Broker Name", "RT(ms) avg", "RT(ms) p99", "RT(ms) max", "Sent", "Failed"],
        [(r["cluster"], r["broker_name"], r["rt_avg_ms"], r["rt_p99_ms"], r["rt_max_ms"], r["sent"], r["failed"])
         for r in rows],
    )
    failed = [r for r in rows if r["failed"]]
    if failed:
        detail = "; ".join(f"{r['broker_name']}: {r['error']}" for r in failed)
        return Output({"results": rows}, f"{table}\n\nErrors: {detail}", exit_code=1)
    return Output({"results": rows}, table)
