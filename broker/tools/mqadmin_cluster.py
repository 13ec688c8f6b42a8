"""``mqadmin`` commands on the cluster, topics and subscription groups: clusterList, topicList, topicRoute,
updateTopic, deleteTopic, topicStatus, updateSubGroup, consumerProgress, brokerStatus, resetOffsetByTime,
transferLeader. One ``run_*`` per command over one ``Admin``; parsed and wired in ``broker/tools/mqadmin.py``."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from broker.client.admin import Admin
from broker.client.admin_checks import answers_checked, check_group, path_part
from broker.client.transport import ClientError
from broker.tools.mqadmin_format import (
    Output,
    flatten,
    format_kv,
    format_table,
    format_ts,
    render_cluster_list,
    render_outcomes,
    render_route,
    route_json,
    to_jsonable,
)


async def run_cluster_list(admin: Admin, args: argparse.Namespace) -> Output:
    rows = await admin.cluster_list()
    return Output({"brokers": to_jsonable(rows)}, render_cluster_list(rows))


async def run_topic_list(admin: Admin, args: argparse.Namespace) -> Output:
    topics = await admin.topic_list()
    return Output({"topics": topics}, "\n".join(topics))


async def run_topic_route(admin: Admin, args: argparse.Namespace) -> Output:
    route = await admin.topic_route(args.topic)
    return Output(route_json(route), render_route(route))


_TOPIC_FIELDS = (
    ("Read Queues", "read_queue_nums"),
    ("Write Queues", "write_queue_nums"),
    ("Perm", "perm"),
    ("Order", "order"),
)


async def run_update_topic(admin: Admin, args: argparse.Namespace) -> Output:
    outcomes = await admin.update_topic(
        args.topic,
        cluster=args.cluster,
        broker_addr=args.broker_addr,
        read_queue_nums=args.read_queue_nums,
        write_queue_nums=args.write_queue_nums,
        perm=args.perm,
        order=args.order,
    )
    return Output(
        {"topic": args.topic, "results": to_jsonable(outcomes)}, render_outcomes(outcomes, _TOPIC_FIELDS)
    )


async def run_delete_topic(admin: Admin, args: argparse.Namespace) -> Output:
    outcomes = await admin.delete_topic(args.topic, args.cluster)
    return Output({"topic": args.topic, "results": to_jsonable(outcomes)}, render_outcomes(outcomes))


async def run_topic_status(admin: Admin, args: argparse.Namespace) -> Output:
    rows = await admin.topic_status(args.topic)
    text = format_table(
        ["Broker Name", "QID", "Min Offset", "Max Offset", "Last Updated"],
        [(r.broker_name, r.queue_id, r.min_offset, r.max_offset, format_ts(r.last_store_ts)) for r in rows],
    )
    return Output({"topic": args.topic, "queues": to_jsonable(rows)}, text)


async def run_update_sub_group(admin: Admin, args: argparse.Namespace) -> Output:
    outcomes = await admin.update_sub_group(
        args.group,
        cluster=args.cluster,
        broker_addr=args.broker_addr,
        consume_enable=args.consume_enable,
        consume_broadcast_enable=args.consume_broadcast_enable,
        retry_max_times=args.retry_max_times,
    )
    fields = (
        ("Consume Enable", "consume_enable"),
        ("Broadcast Enable", "consume_broadcast_enable"),
        ("Retry Max Times", "retry_max_times"),
    )
    return Output({"group": args.group, "results": to_jsonable(outcomes)}, render_outcomes(outcomes, fields))


async def run_consumer_progress(admin: Admin, args: argparse.Namespace) -> Output:
    progress = await admin.consumer_progress(args.group, args.topic)
    if not any(q.consumer_offset is not None for q in progress.queues):
        reason = await _no_progress_reason(admin, args.group, args.topic, bool(progress.queues))
        if reason is not None:
            raise reason
    table = format_table(
        ["Topic", "Broker Name", "QID", "Broker Offset", "Consumer Offset", "Diff", "LastTime"],
        [
            (
                q.topic,
                q.broker_name,
                q.queue_id,
                q.broker_offset,
                q.consumer_offset,
                q.lag,
                format_ts(q.last_ts),
            )
            for q in progress.queues
        ],
    )
    data = {"group": progress.group, "queues": to_jsonable(progress.queues), "total_lag": progress.total_lag}
    return Output(data, f"{table}\n\nDiff Total: {progress.total_lag}")


@answers_checked
async def group_members(admin: Admin, group: str) -> list[tuple[str, dict[str, Any]]]:
    """(broker name, member) of every consumer of ``group`` online at any broker group."""
    return [(b, dict(m)) for b, ans in await _group_answers(admin, group) for m in ans.get("members") or []]


@answers_checked
async def _group_answers(admin: Admin, group: str) -> list[tuple[str, dict[str, Any]]]:
    """(broker name, ``GET /v1/groups/{group}/consumers`` answer) of every broker group that answered."""
    path = f"/v1/groups/{path_part(check_group(group))}/consumers"
    groups = await admin.all_groups()
    answers = await asyncio.gather(*(admin.read(bd, path) for bd in groups), return_exceptions=True)
    out = []
    for bd, ans in zip(groups, answers, strict=True):
        if isinstance(ans, BaseException):
            if isinstance(ans, ClientError):
                continue  # one unreachable group does not hide the others' members
            raise ans
        out.append((bd.broker_name, dict(ans)))
    return out


@answers_checked
async def _no_progress_reason(
    admin: Admin, group: str, topic: str | None, has_rows: bool
) -> ClientError | None:
    """Why a group with no committed offset has no progress to show (RocketMQ's consumerProgress
    fails there too); None when the rows (subscribed queues, nothing committed yet) are the answer."""
    answers = await _group_answers(admin, group)
    members = [(b, dict(m)) for b, ans in answers for m in ans.get("members") or []]
    if members and all(m.get("model") == "BROADCASTING" for _b, m in members):
        return ClientError(
            "BROADCASTING_GROUP",
            f"consumer group {group} consumes in BROADCASTING mode: each of its {len(members)} consumer(s) keeps "
            "its own offsets, the brokers hold none (see consumerConnection)",
        )
    departed = [(b, ans["departed"]) for b, ans in answers if isinstance(ans.get("departed"), dict)]
    if not members and departed and all(d.get("model") == "BROADCASTING" for _b, d in departed):
        ago_s = min(int(d.get("last_seen_ms_ago") or 0) for _b, d in departed) // 1000
        return ClientError(
            "BROADCASTING_GROUP",
            f"consumer group {group} consumed in BROADCASTING mode (no consumer online; the last one was seen "
            f"{ago_s} s ago): each consumer keeps its own offsets, the brokers hold none",
        )
    known = False
    for bd in await admin.all_groups():
        try:
            listed = await admin.read(bd, "/v1/groups")
        except ClientError:
            continue
        if any(g.get("group") == group for g in listed.get("groups") or []):
            known = True
            break
    on = f" on topic {topic}" if topic else ""
    if not known and not members:
        return ClientError(
            "SUBSCRIPTION_GROUP_NOT_EXIST",
            f"no consumer group {group}: not created (updateSubGroup), no offset committed{on} and no consumer "
            "online",
            status=404,
        )
    if has_rows:
        return None
    return ClientError(
        "CONSUMER_NOT_ONLINE" if not members else "NO_CONSUME_STATS",
        f"consumer group {group} has committed no offset{on} yet"
        + ("" if members else " and has no consumer online"),
        status=404,
    )


async def run_broker_status(admin: Admin, args: argparse.Namespace) -> Output:
    status = await admin.broker_status(args.broker_addr)
    pairs = flatten(status)
    width = max((len(k) for k, _ in pairs), default=0) + 1
    return Output(to_jsonable(status), format_kv(pairs, width))


async def run_reset_offset_by_time(admin: Admin, args: argparse.Namespace) -> Output:
    rows = await admin.reset_offset_by_time(args.group, args.topic, args.timestamp)
    text = format_table(
        ["Broker Name", "QID", "Offset"], [(r.broker_name, r.queue_id, r.offset) for r in rows]
    )
    return Output(
        {"group": args.group, "topic": args.topic, "ts": args.timestamp, "offsets": to_jsonable(rows)}, text
    )


async def run_transfer_leader(admin: Admin, args: argparse.Namespace) -> Output:
    r = await admin.transfer_leader(args.broker_name, args.target_id)
    return Output(to_jsonable(r), format_table(["Broker Name", "New Leader"], [(r.broker_name, r.leader_id)]))
