"""More ``mqadmin`` commands, for parity with RocketMQ's (issue 16): deleteSubGroup,
consumerConnection, producerConnection, topicClusterList, allocateMQ, wipeWritePerm, addWritePerm, getNamesrvConfig,
updateNamesrvConfig, getBrokerConfig, updateBrokerConfig, cleanExpiredCQ, printMsg; statsAll and clusterRT live in
``mqadmin_stats.py``. Same conventions as ``broker/tools/mqadmin.py`` (tables or ``--json``; exit 1 for cluster
errors, 2 for usage), all named in its command table (``mqadmin_commands.py``)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any

from broker.client.admin import Admin
from broker.client.admin_checks import (
    answers_checked,
    check_addr,
    check_group,
    check_name,
    check_stored_group,
    check_topic,
    path_part,
)
from broker.client.admin_records import FanOutError, InvalidArgument, MessageView, Outcome
from broker.client.allocate import allocate_averagely
from broker.client.transport import ClientError
from broker.protocol.routes import BrokerData
from broker.tools.mqadmin_cluster import group_members
from broker.tools.mqadmin_format import (
    Output,
    body_text,
    format_table,
    format_ts,
    render_message_table,
    render_outcomes,
    to_jsonable,
)
from broker.tools.mqadmin_messages import pull_range

PRINT_MSG_MAX = 100_000



# -- subscription groups and consumers --------------------------------------------------------------
@answers_checked
async def run_delete_sub_group(admin: Admin, args: argparse.Namespace) -> Output:
    group = check_stored_group(args.group)  # an older release's 121..255-char group can be removed
    path = f"/v1/groups/{path_part(group)}"
    if (args.cluster is None) == (args.broker_addr is None):
        raise InvalidArgument("BAD_REQUEST", "give exactly one of a cluster (-c) or a broker address (-b)")
    if args.broker_addr is not None:
        addr = check_addr(args.broker_addr)
        try:
            ans, landed = await admin.write_addr(addr, "DELETE", path, None)
        except ClientError as exc:
            raise FanOutError(
                [Outcome("broker", addr, exc.addr or addr, False, exc.code, exc.message, exc.status)]
            ) from None
        outcomes = [Outcome("broker", addr, landed, True, "OK", answer=ans)]
    else:
        groups = await admin.cluster_groups(check_name(args.cluster, "cluster"))
        outcomes = await admin.fan_out_groups(groups, lambda bd: admin.write(bd, "DELETE", path, None))
        if not all(o.ok for o in outcomes):
            raise FanOutError(outcomes)
    text = render_outcomes(outcomes, (("Deleted", "deleted"),))
    return Output({"group": group, "results": to_jsonable(outcomes)}, text)


@answers_checked
async def run_consumer_connection(admin: Admin, args: argparse.Namespace) -> Output:
    group = check_group(args.group)
    members = await group_members(admin, group)
    if not members:
        raise ClientError("CONSUMER_NOT_ONLINE", f"no consumer of group {group} is online at any broker", status=404)
    by_client: dict[str, dict[str, Any]] = {}
    for broker, m in members:
        row = by_client.setdefault(
            str(m.get("client_id")),
            {"client_id": m.get("client_id"), "model": m.get("model"), "topics": set(), "brokers": set()},
        )
        row["topics"].update(m.get("topics") or ())
        row["brokers"].add(broker)
    rows = [
        {**r, "topics": sorted(r["topics"]), "brokers": sorted(r["brokers"])}
        for _cid, r in sorted(by_client.items())
    ]
    table = format_table(
        ["#", "ClientId", "Model", "Topics", "Brokers"],
        [
            (i + 1, r["client_id"], r["model"], ",".join(r["topics"]), ",".join(r["brokers"]))
            for i, r in enumerate(rows)
        ],
    )
    models = sorted({str(r["model"]) for r in rows})
    text = f"{table}\n\nConsumeType: CONSUME_PASSIVELY\nMessageModel: {'/'.join(models)}"
    return Output({"group": group, "connections": rows}, text)


@answers_checked
async def run_producer_connection(admin: Admin, args: argparse.Namespace) -> Output:
    """Producers of the group that sent (to ``-t`` if given) lately, as each replica saw them."""
    group = check_group(args.group)
    topic = check_topic(args.topic) if args.topic else None
    path = f"/v1/producers/{path_part(group)}"
    targets = [(bd.broker_name, a) for bd in await admin.all_groups() for _bid, a in sorted(bd.broker_addrs.items())]
    answers = await asyncio.gather(*(admin.transport.call(a, "GET", path) for _n, a in targets), return_exceptions=True)
    rows = []
    for (name, addr), ans in zip(targets, answers, strict=True):
        if isinstance(ans, BaseException):
            if isinstance(ans, ClientError) and not ans.status:
                continue  # an unreachable replica: the others still answer
            raise ans
        for c in ans.get("connections") or []:
            if topic is None or topic in (c.get("topics") or ()):
                rows.append({"broker_name": name, "broker_addr": addr, **dict(c)})
    if not rows:
        on = f" to topic {topic}" if topic else ""
        raise ClientError("PRODUCER_NOT_ONLINE", f"no producer of group {group} sent{on} lately", status=404)
    table = format_table(
        ["#", "ClientAddr", "Broker Name", "Broker Addr", "Topics", "Sends", "Last Send (ms ago)"],
        [(i + 1, r["client_addr"], r["broker_name"], r["broker_addr"], ",".join(r.get("topics") or ()),
          r.get("sends"), r.get("idle_ms")) for i, r in enumerate(rows)],
    )
    return Output({"group": group, "connections": rows}, table)


# -- topics ------------------------------------------------------------------------------------------
@answers_checked
async def run_topic_cluster_list(admin: Admin, args: argparse.Namespace) -> Output:
    route = await admin.topic_route(args.topic)
    clusters = sorted({b.cluster for b in route.broker_datas if b.cluster})
    return Output({"topic": args.topic, "clusters": clusters}, "\n".join(clusters))


@answers_checked
async def run_allocate_mq(admin: Admin, args: argparse.Namespace) -> Output:
    """RocketMQ's averagely strategy, as consumers of a clustering group split the topic's queues."""
    ips = [ip.strip() for ip in args.ip_list.split(",") if ip.strip()]
    if not ips or len(ips) > 1024 or len(set(ips)) != len(ips):
        raise InvalidArgument("BAD_REQUEST", "-i takes 1..1024 distinct client ids separated by commas")
    route = await admin.topic_route(args.topic)
    queues = sorted((q.broker_name, qid) for q in route.queue_datas for qid in range(q.read_queue_nums))
    cids = sorted(ips)
    result = {cid: allocate_averagely(cid, queues, cids) for cid in ips}
    rows = [(cid, b, q) for cid in ips for b, q in result[cid]]
    data = {
        "topic": args.topic,
        "result": {cid: [{"broker_name": b, "queue_id": q} for b, q in mqs] for cid, mqs in result.items()},
    }
    return Output(data, format_table(["Client", "Broker Name", "QID"], rows))


# -- write permission at the NameServers ------------------------------------------------------------
@answers_checked
async def _set_write_perm(admin: Admin, broker_name: str, write: bool) -> Output:
    name = check_name(broker_name, "broker")
    body = {"v": 1, "broker_name": name, "write": write}
    outcomes = []
    for addr in admin.namesrv.addrs:
        try:
            ans = await admin.transport.call(addr, "POST", "/v1/brokers/perm", body)
            outcomes.append(Outcome("namesrv", addr, addr, True, "OK", answer=ans))
        except ClientError as exc:
            outcomes.append(Outcome("namesrv", addr, exc.addr or addr, False, exc.code, exc.message, exc.status))
    verb = "add" if write else "wipe"
    lines = [
        f"{verb} write perm of broker[{name}] in namesrv[{o.addr}] "
        + (f"OK, {(o.answer or {}).get('topics')}" if o.ok else f"Failed: {o.code}: {o.message}")
        for o in outcomes
    ]
    if not all(o.ok for o in outcomes):
        raise FanOutError(outcomes)
    return Output({"broker_name": name, "write": write, "results": to_jsonable(outcomes)}, "\n".join(lines))


async def run_wipe_write_perm(admin: Admin, args: argparse.Namespace) -> Output:
    return await _set_write_perm(admin, args.broker_name, False)


async def run_add_write_perm(admin: Admin, args: argparse.Namespace) -> Output:
    return await _set_write_perm(admin, args.broker_name, True)


# -- configuration ----------------------------------------------------------------------------------
def render_config(sections: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """RocketMQ's layout: a ``====addr====`` header, then ``key = value`` lines."""
    out = []
    for addr, cfg in sections:
        out.append(f"============{addr}============")
        out += [f"{k:<40}= {v}" for k, v in sorted(cfg.items())]
    return "\n".join(out)


@answers_checked
async def run_get_namesrv_config(admin: Admin, args: argparse.Namespace) -> Output:
    sections = []
    for addr in admin.namesrv.addrs:
        st = await admin.transport.call(addr, "GET", "/v1/status", params={"v": 1})
        cfg = st.get("config") if isinstance(st, dict) else None
        if not isinstance(cfg, dict):
            raise ClientError("NOT_A_NAMESRV", f"{addr} answered no NameServer configuration", addr=addr)
        sections.append((addr, {str(k): v for k, v in cfg.items()}))
    return Output(dict(sections), render_config(sections))


@answers_checked
async def run_update_namesrv_config(admin: Admin, args: argparse.Namespace) -> Output:
    """Every NameServer of -n, in memory until it restarts (edit its config file to keep it)."""
    body = {"v": 1, "key": args.key, "value": args.value}
    done = []
    for addr in admin.namesrv.addrs:
        try:
            ans = await admin.transport.call(addr, "POST", "/v1/config", body)
        except ClientError as exc:
            if exc.code in ("NOT_UPDATABLE", "BAD_PARAMETER", "BAD_REQUEST"):
                raise InvalidArgument(exc.code, exc.message) from None
            raise
        done.append((addr, ans.get("value")))
    text = "\n".join(f"update name server config success![{addr}]\n{args.key} : {value}" for addr, value in done)
    return Output({"key": args.key, "results": [{"addr": a, "value": v} for a, v in done]}, text)


async def _replica_addrs(admin: Admin, args: argparse.Namespace) -> list[str]:
    """-b: that one replica; -c: every replica of every group of the cluster (a follower may lead next)."""
    if (args.cluster is None) == (args.broker_addr is None):
        raise InvalidArgument("BAD_REQUEST", "give exactly one of a cluster (-c) or a broker address (-b)")
    if args.broker_addr is not None:
        return [check_addr(args.broker_addr)]
    groups = await admin.cluster_groups(check_name(args.cluster, "cluster"))
    return [a for bd in groups for _bid, a in sorted(bd.broker_addrs.items())]


@answers_checked
async def run_get_broker_config(admin: Admin, args: argparse.Namespace) -> Output:
    addrs = await _replica_addrs(admin, args)
    sections = []
    for addr in addrs:
        ans = await admin.transport.call(addr, "GET", "/v1/admin/config")
        sections.append((addr, dict(ans.get("config") or {})))
    return Output(dict(sections), render_config(sections))


@answers_checked
async def run_update_broker_config(admin: Admin, args: argparse.Namespace) -> Output:
    """RocketMQ's updateBrokerConfig for the keys a running replica can change (its memory, until
    restart); -c: every replica of the cluster (a follower may lead next)."""
    addrs = await _replica_addrs(admin, args)
    body = {"key": args.key, "value": args.value}
    outcomes = []
    for addr in addrs:
        try:
            ans = await admin.transport.call(addr, "POST", "/v1/admin/config", body)
            outcomes.append(Outcome("broker", addr, addr, True, "OK", answer=ans))
        except ClientError as exc:
            if exc.code in ("NOT_UPDATABLE", "BAD_PARAMETER", "BAD_REQUEST"):
                raise InvalidArgument(exc.code, exc.message) from None  # the same answer from every replica
            outcomes.append(Outcome("broker", addr, exc.addr or addr, False, exc.code, exc.message, exc.status))
    if not all(o.ok for o in outcomes):
        raise FanOutError(outcomes)
    text = render_outcomes(outcomes, (("Key", "key"), ("Value", "value")))
    return Output({"key": args.key, "value": args.value, "results": to_jsonable(outcomes)}, text)


# -- messages ---------------------------------------------------------------------------------------
@answers_checked
async def _offset_at(admin: Admin, bd: BrokerData, topic: str, qid: int, ts: int) -> int:
    ans = await admin.read(bd, "/v1/offset/search", {"topic": topic, "queue_id": qid, "ts": ts})
    return int(ans["offset"])


@answers_checked
async def run_print_msg(admin: Admin, args: argparse.Namespace) -> Output:
    """Every message of a topic stored in [begin, end) (default: all), optionally only the tags of
    ``-s``; reads only."""
    if not 1 <= args.count <= PRINT_MSG_MAX:
        raise InvalidArgument("BAD_REQUEST", f"-c count must be in [1, {PRINT_MSG_MAX}]")
    tags = None if args.sub_expression in (None, "", "*") else {
        t.strip() for t in args.sub_expression.split("||") if t.strip()
    }
    route = await admin.topic_route(args.topic)
    got: list[MessageView] = []
    for q in sorted(route.queue_datas, key=lambda q: q.broker_name):
        bd = route.broker(q.broker_name)
        if bd is None:
            continue
        for qid in range(q.read_queue_nums):
            offset = 0 if args.begin is None else await _offset_at(admin, bd, args.topic, qid, args.begin)
            end = None if args.end is None else await _offset_at(admin, bd, args.topic, qid, args.end)
            async for found in pull_range(admin, args.topic, q.broker_name, qid, offset, end, route=route):
                got += [m for m in found if tags is None or m.tags in tags]
                if len(got) >= args.count:
                    break
            if len(got) >= args.count:
                break
    got = got[: args.count]
    if args.print_body:
        lines = [
            f"MSGID: {m.msg_id} QID: {m.queue_id} OFFSET: {m.queue_offset} TAGS: {m.tags or '-'} "
            f"STORED: {format_ts(m.store_ts)} BODY: {body_text(m.body, None)}"
            for m in got
        ]
        text = "\n".join(lines)
    else:
        text = render_message_table(got)
    return Output({"messages": to_jsonable(got)}, f"{text}\n\nPrinted: {len(got)}")


@answers_checked
async def run_clean_expired_cq(admin: Admin, args: argparse.Namespace) -> Output:
    """RocketMQ's cleanExpiredCQ: every replica (-c: of the cluster; -b: one) removes the consume
    queues of topics that no longer exist (each replica's queues are its own, derived from the log)."""
    addrs = await _replica_addrs(admin, args)
    outcomes = []
    for addr in addrs:
        try:
            ans = await admin.transport.call(addr, "POST", "/v1/admin/clean-expired-cq", {})
            removed = list(ans.get("removed") or [])
            ans = {"removed": removed, "count": len(removed),
                   "queues": ", ".join(f"{r['topic']}/{r['queue_id']}" for r in removed) or "-"}
            outcomes.append(Outcome("broker", addr, addr, True, "OK", answer=ans))
        except ClientError as exc:
            outcomes.append(Outcome("broker", addr, exc.addr or addr, False, exc.code, exc.message, exc.status))
    if not all(o.ok for o in outcomes):
        raise FanOutError(outcomes)
    text = render_outcomes(outcomes, (("Removed", "count"), ("Queues", "queues")))
    return Output({"results": to_jsonable(outcomes)}, text)


async def run_refused_records(admin: Admin, args: argparse.Namespace) -> Output:
    """The committed records each replica refused to apply (issue 23; docs/OPERATIONS.md): every
    replica of a group lists the same ones (up to its applied index)."""
    addrs = await _replica_addrs(admin, args)
    outcomes, rows = [], []
    for addr in addrs:
        try:
            ans = await admin.transport.call(addr, "GET", "/v1/admin/refused")
        except ClientError as exc:
            outcomes.append(Outcome("broker", addr, exc.addr or addr, False, exc.code, exc.message, exc.status))
            continue
        outcomes.append(Outcome("broker", addr, addr, True, "OK", answer=ans))
        for r in ans.get("recent") or []:
            rows.append((addr, r.get("index"), r.get("position"), r.get("kind"), r.get("code"),
                         str(r.get("reason"))[:100]))
    if not all(o.ok for o in outcomes):
        raise FanOutError(outcomes)
    text = render_outcomes(outcomes, (("Refused", "total"), ("Applied", "applied_index")))
    if rows:
        text += "\n" + format_table(["Replica", "Index", "Position", "Kind", "Code", "Reason"], rows)
    return Output({"results": to_jsonable(outcomes)}, text)


# -- the parser -------------------------------------------------------------------------------------
