"""``mqadmin <command> [options]``: RocketMQ's admin tool for the DLedger-mode cluster.

Command names and flags follow RocketMQ's ``mqadmin`` where they exist (``-n`` NameServers, ``-t``
topic, ``-g`` group, ``-c`` cluster, ``-b`` broker address...); ``mqadmin <command> --help`` lists
them. Output is an aligned text table like RocketMQ's; ``--json`` prints one JSON document instead.

Exit codes: 0 done; 1 the cluster answered an error or could not be reached (the message names
the code, e.g. ``TOPIC_NOT_EXIST: ...``); 2 bad usage or bad input (argparse errors, invalid names,
bad timestamps), refused before any request. Expected failures never print a traceback.

Parsing and rendering are plain functions over plain data; the ``await`` sits in one ``run_*``
function per command, each over one ``Admin``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import datetime
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from broker.client.admin import (
    Admin,
    BrokerMember,
    FanOutError,
    InvalidArgument,
    MessageView,
    Outcome,
    answers_checked,
    check_group,
    check_topic,
    path_part,
)
from broker.client.message_selector import MessageSelector
from broker.client.trace import TRACE_TOPIC_DEFAULT
from broker.client.trace_query import (
    TIMELINE_HEADERS,
    query_msg_trace,
    timeline_json,
    timeline_rows,
    timeline_summary,
)
from broker.client.transport import (
    DEFAULT_NAMESRV,
    ClientError,
    TopicRoute,
    add_security_arguments,
    security_kwargs,
)
from broker.protocol import route_wire
from broker.protocol.auth import CredentialsError
from broker.tools.cli import add_namesrv_argument

PROG = "mqadmin"
BODY_TEXT_MAX = 80  # characters of a body shown in a table (--json carries the whole body)
CONSUME_COUNT_MAX = 100_000
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool whose reader closed the pipe


@dataclasses.dataclass(frozen=True)
class Output:
    data: Any  # what --json prints
    text: str  # what a terminal gets
    exit_code: int = 0


# -- pure helpers: parsing --------------------------------------------------------------------------
def parse_timestamp(value: str) -> int:
    """``now``, epoch milliseconds, or RocketMQ's ``yyyy-MM-dd#HH:mm:ss:SSS`` (local time)."""
    value = value.strip()
    if value == "now":
        return time.time_ns() // 1_000_000
    if value.isdigit():
        return int(value)
    try:
        dt = datetime.datetime.strptime(value, "%Y-%m-%d#%H:%M:%S:%f")
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad timestamp {value!r}: use now, milliseconds since the epoch or yyyy-MM-dd#HH:mm:ss:SSS"
        ) from None
    return int(dt.timestamp() * 1000)


def parse_bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def non_negative_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {n}")
    return n


def positive_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not x > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value!r}")
    return x


# -- pure helpers: rendering ------------------------------------------------------------------------
def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """RocketMQ-style: ``#``-prefixed headers, columns left-aligned, two spaces apart."""
    cells = [[f"#{h}" for h in headers]] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def format_kv(pairs: Iterable[tuple[str, Any]], width: int = 20) -> str:
    return "\n".join(f"{(k + ':').ljust(width)} {_cell(v)}" for k, v in pairs)


def format_ts(ms: int | None) -> str:
    """RocketMQ's ``yyyy-MM-dd HH:mm:ss,SSS`` in local time; ``-`` when unknown."""
    if not ms:
        return "-"
    dt = datetime.datetime.fromtimestamp(ms / 1000)
    return dt.strftime("%Y-%m-%d %H:%M:%S,") + f"{ms % 1000:03d}"


def perm_text(perm: int) -> str:
    return f"{'R' if perm & 4 else '-'}{'W' if perm & 2 else '-'}{'X' if perm & 1 else '-'} ({perm})"


def body_text(body: bytes, limit: int | None = BODY_TEXT_MAX) -> str:
    text = body.decode("utf-8", "replace")
    text = "".join(c if c.isprintable() else "." for c in text)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def to_jsonable(value: Any) -> Any:
    """Dataclasses to maps; message bodies to ``body_b64`` (as the broker's JSON answers carry them)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if isinstance(v, (bytes, bytearray)):
                out[f"{k}_b64"] = base64.b64encode(v).decode()
            else:
                out[str(k)] = to_jsonable(v)
        return out
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    return value


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, Mapping):
        items: list[tuple[str, Any]] = []
        for k in sorted(value, key=str):
            items += flatten(value[k], f"{prefix}.{k}" if prefix else str(k))
        return items
    return [(prefix, value)]


def render_cluster_list(rows: Sequence[BrokerMember]) -> str:
    headers = [
        "Cluster Name",
        "Broker Name",
        "BID",
        "Addr",
        "Role",
        "Term",
        "Self Id",
        "Leader",
        "Writable",
        "Commit Index",
        "Applied Index",
        "Topics",
    ]
    return format_table(
        headers,
        [
            (
                m.cluster,
                m.broker_name,
                m.broker_id,
                m.addr,
                m.role or m.error,
                m.term,
                m.self_id,
                m.leader_id,
                m.writable,
                m.commit_index,
                m.applied_index,
                m.topics,
            )
            for m in rows
        ],
    )


def render_route(route: TopicRoute) -> str:
    queues = format_table(
        ["Broker Name", "Read Queues", "Write Queues", "Perm"],
        [
            (q.broker_name, q.read_queue_nums, q.write_queue_nums, perm_text(q.perm))
            for q in route.queue_datas
        ],
    )
    brokers = format_table(
        ["Cluster Name", "Broker Name", "BID", "Addr"],
        [
            (b.cluster, b.broker_name, bid, addr)
            for b in route.broker_datas
            for bid, addr in sorted(b.broker_addrs.items())
        ],
    )
    return f"Topic: {route.topic}\nOrder: {str(route.order).lower()}\n\n{queues}\n\n{brokers}"


def route_json(route: TopicRoute) -> dict[str, Any]:
    return route_wire.topic_route_to_dict(route)


def render_outcomes(outcomes: Sequence[Outcome], fields: Sequence[tuple[str, str]] = ()) -> str:
    """One row per target; ``fields`` adds columns (header, answer key) from each answer."""
    headers = ["Target", "Name", "Addr", "Result", *(h for h, _ in fields)]
    rows = []
    for o in outcomes:
        answer = o.answer if isinstance(o.answer, Mapping) else {}
        result = o.code if o.ok else f"{o.code}: {o.message}"
        rows.append((o.target, o.name, o.addr, result, *(answer.get(k) for _, k in fields)))
    return format_table(headers, rows)


def message_details(m: MessageView) -> str:
    return format_kv(
        [
            ("OffsetID", m.msg_id),
            ("Unique Key", m.unique_id),
            ("Topic", m.topic),
            ("Tags", f"[{m.tags}]"),
            ("Keys", f"[{' '.join(m.keys)}]"),
            ("Broker Name", m.broker_name),
            ("Queue ID", m.queue_id),
            ("Queue Offset", m.queue_offset),
            ("CommitLog Offset", m.position),
            ("Size", m.size),
            ("Born Timestamp", format_ts(m.born_ts)),
            ("Store Timestamp", format_ts(m.store_ts)),
            ("Born Host", m.born_host),
            *_schedule_lines(m),
            ("Properties", json.dumps(m.properties, sort_keys=True)),
            ("Body", body_text(m.body, None)),
        ]
    )


def _schedule_lines(m: MessageView) -> list[tuple[str, Any]]:
    """A delayed message's due time, a retried one's count and origin (issue 14)."""
    lines: list[tuple[str, Any]] = []
    due = m.properties.get("__DUE_MS")
    if due is not None and due.isdigit():
        lines.append(("Due Timestamp", format_ts(int(due))))
    for label, prop in (("Reconsume Times", "RECONSUME_TIME"), ("Retry Topic", "RETRY_TOPIC"),
                        ("Origin Message ID", "ORIGIN_MESSAGE_ID")):
        if prop in m.properties:
            lines.append((label, m.properties[prop]))
    return lines


def render_message_table(msgs: Sequence[MessageView]) -> str:
    return format_table(
        ["Broker Name", "QID", "Offset", "Message ID", "Unique Key", "Tags", "Keys", "Store Time", "Body"],
        [
            (
                m.broker_name,
                m.queue_id,
                m.queue_offset,
                m.msg_id,
                m.unique_id,
                m.tags or None,
                " ".join(m.keys) or None,
                format_ts(m.store_ts),
                body_text(m.body),
            )
            for m in msgs
        ],
    )


# -- commands ---------------------------------------------------------------------------------------
Runner = Callable[[Admin, argparse.Namespace], Awaitable[Output]]


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
    path = f"/v1/groups/{path_part(check_group(group))}/consumers"
    groups = await admin.all_groups()
    answers = await asyncio.gather(*(admin.read(bd, path) for bd in groups), return_exceptions=True)
    out = []
    for bd, ans in zip(groups, answers, strict=True):
        if isinstance(ans, BaseException):
            if isinstance(ans, ClientError):
                continue  # one unreachable group does not hide the others' members
            raise ans
        out += [(bd.broker_name, dict(m)) for m in ans.get("members") or []]
    return out


@answers_checked
async def _no_progress_reason(
    admin: Admin, group: str, topic: str | None, has_rows: bool
) -> ClientError | None:
    """Why a group with no committed offset has no progress to show (RocketMQ's consumerProgress
    fails there too); None when the rows (subscribed queues, nothing committed yet) are the answer."""
    members = await group_members(admin, group)
    if members and all(m.get("model") == "BROADCASTING" for _b, m in members):
        return ClientError(
            "BROADCASTING_GROUP",
            f"consumer group {group} consumes in BROADCASTING mode: each of its {len(members)} consumer(s) keeps "
            "its own offsets, the brokers hold none (see consumerConnection)",
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


async def run_query_msg_by_id(admin: Admin, args: argparse.Namespace) -> Output:
    m = await admin.query_msg_by_id(args.msg_id)
    return Output(to_jsonable(m), message_details(m))


async def run_query_msg_trace_by_id(admin: Admin, args: argparse.Namespace) -> Output:
    t = await query_msg_trace(admin, args.msg_id, args.trace_topic)
    rows = [(*row[:3], format_ts(row[3]), *row[4:]) for row in timeline_rows(t)]
    return Output(timeline_json(t), format_kv(timeline_summary(t)) + "\n\n" + format_table(TIMELINE_HEADERS, rows))


async def run_query_msg_by_key(admin: Admin, args: argparse.Namespace) -> Output:
    msgs = await admin.query_msg_by_key(args.topic, args.key, args.max)
    return Output({"messages": to_jsonable(msgs)}, render_message_table(msgs))


async def run_query_msg_by_unique_key(admin: Admin, args: argparse.Namespace) -> Output:
    msgs = await admin.query_msg_by_unique_key(args.topic, args.unique_key)
    if not msgs:
        raise ClientError(
            "MESSAGE_NOT_FOUND", f"no message of topic {args.topic} has unique key {args.unique_key}"
        )
    return Output({"messages": to_jsonable(msgs)}, "\n\n".join(message_details(m) for m in msgs))


async def run_query_msg_by_offset(admin: Admin, args: argparse.Namespace) -> Output:
    m = await admin.query_msg_by_offset(args.topic, args.broker_name, args.queue_id, args.offset)
    return Output(to_jsonable(m), message_details(m))


async def run_query_dlq_messages(admin: Admin, args: argparse.Namespace) -> Output:
    msgs = await admin.query_dlq_messages(args.group, args.max)
    return Output({"messages": to_jsonable(msgs)}, render_message_table(msgs))


async def run_resend_dlq_message(admin: Admin, args: argparse.Namespace) -> Output:
    got = await admin.resend_dlq_message(args.group, args.msg_id)
    return Output(got, f"resent {args.msg_id} to {got.get('topic')} as {got.get('msg_id')}")


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


async def run_send_message(admin: Admin, args: argparse.Namespace) -> Output:
    check_topic(args.topic)
    if (args.broker_name is None) != (args.queue_id is None):
        raise InvalidArgument("BAD_REQUEST", "give both -m brokerName and -q queueId, or neither")
    try:
        from broker.client import Message, Producer
    except ImportError as exc:
        raise ClientError("SDK_UNAVAILABLE", f"the producer SDK cannot be imported: {exc}") from None
    await _check_writable(admin, args.topic, args.broker_name)
    msg = Message(args.topic, args.body.encode("utf-8"), tags=args.tags or "", keys=(args.keys or "").split())
    producer = Producer(
        "mqadmin_producer",
        admin.namesrv.addrs,
        send_timeout_s=args.timeout,
        credentials=admin.transport.credentials,
        tls=admin.transport.ssl_context,
    )
    await producer.start()
    try:
        if args.broker_name is not None:
            from broker.client import MessageQueue

            result = await producer.send(msg, queue=MessageQueue(args.topic, args.broker_name, args.queue_id))
        else:
            result = await producer.send(msg)
    finally:
        await producer.shutdown()
    mq = result.message_queue
    status = str(getattr(result.status, "name", result.status))
    row = {
        "broker_name": mq.broker_name,
        "queue_id": mq.queue_id,
        "status": status,
        "msg_id": result.msg_id,
        "unique_id": result.unique_id,
        "queue_offset": result.queue_offset,
    }
    text = format_table(
        ["Broker Name", "QID", "Send Result", "MsgId", "Unique Key", "Queue Offset"], [tuple(row.values())]
    )
    return Output(row, text)


async def _check_writable(admin: Admin, topic: str, broker_name: str | None) -> None:
    """A topic whose route has no writable queue fails at once with the permission named (the
    producer would only report that no writable queue has a leader, after its retries)."""
    try:
        route = await admin.topic_route(topic)
    except ClientError as exc:
        if exc.status == 404:
            return  # unknown topic: the producer auto-creates it or says TOPIC_NOT_EXIST itself
        raise
    queues = [q for q in route.queue_datas if broker_name in (None, q.broker_name)]
    if queues and not any(q.perm & 2 and q.write_queue_nums > 0 for q in queues):
        perms = ", ".join(f"{q.broker_name} {perm_text(q.perm)}" for q in queues)
        raise ClientError(
            "NO_PERMISSION",
            f"topic {topic} is not writable ({perms}): `updateTopic -t {topic} -p 6` grants write permission",
            status=403,
        )


async def pull_range(
    admin: Admin,
    topic: str,
    broker_name: str,
    queue_id: int,
    offset: int,
    end: int | None,
    *,
    route: TopicRoute,
    batch: Callable[[], int] = lambda: 32,
    consumer_group: str | None = None,
    sql: str | None = None,
) -> AsyncIterator[list[MessageView]]:
    """The messages of one queue in [offset, end) — ``end`` None: the queue's max offset at the first
    pull — a pull (of ``batch()`` at most) at a time, without committing; ranges with nothing that
    matches or removed by retention are stepped over. The caller stops iterating when it has enough."""
    while end is None or offset < end:
        r = await admin.pull(
            topic, broker_name, queue_id, offset, max_count=batch(), consumer_group=consumer_group, route=route,
            sql=sql,
        )
        if end is None:
            end = r.max_offset
        if r.status in ("OFFSET_TOO_SMALL", "NO_MATCHED_MSG") and r.next_offset > offset:
            offset = r.next_offset
            continue
        if r.status != "FOUND":
            return
        yield [m for m in r.messages if m.queue_offset is None or m.queue_offset < end]
        offset = r.next_offset


async def run_consume_message(admin: Admin, args: argparse.Namespace) -> Output:
    """Pull up to ``-c`` messages from each selected queue's ``-s`` (default: its first offset) up to
    ``-e`` (default: its max offset when we started), printing them; nothing is committed."""
    if not 1 <= args.count <= CONSUME_COUNT_MAX:
        raise InvalidArgument("BAD_REQUEST", f"-c count must be in [1, {CONSUME_COUNT_MAX}]")
    if args.sql is not None:  # checked before anything is sent
        try:
            MessageSelector.by_sql(args.sql)
        except ClientError as exc:
            raise InvalidArgument(exc.code, exc.message) from None
    route = await admin.topic_route(args.topic)
    queues = [
        (q.broker_name, qid)
        for q in route.queue_datas
        for qid in range(q.read_queue_nums)
        if args.broker_name in (None, q.broker_name) and args.queue_id in (None, qid)
    ]
    if not queues:
        raise ClientError("NO_QUEUE", f"topic {args.topic} has no readable queue matching -m/-q")
    got: list[MessageView] = []

    def batch() -> int:
        return min(32, args.count - len(got))

    for broker_name, qid in queues:
        batches = pull_range(
            admin, args.topic, broker_name, qid, args.start_offset or 0, args.end_offset, route=route,
            batch=batch, consumer_group=args.group, sql=args.sql,
        )
        async for found in batches:
            got.extend(found)
            if len(got) >= args.count:
                break
        if len(got) >= args.count:
            break
    got = got[: args.count]
    return Output({"messages": to_jsonable(got)}, render_message_table(got) + f"\n\nConsumed: {len(got)}")


# -- the parser -------------------------------------------------------------------------------------
def _common(p: argparse.ArgumentParser) -> None:
    add_namesrv_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    p.add_argument("--timeout", type=positive_float, default=3.0, help="seconds per request (default 3)")
    add_security_arguments(p)


def _target(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("-c", "--clusterName", dest="cluster", help="every group leader of this cluster")
    g.add_argument("-b", "--brokerAddr", dest="broker_addr", help="this one broker (host:port)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Admin tool of the DLedger-mode message cluster (RocketMQ's mqadmin).",
        epilog="Exit codes: 0 ok, 1 the cluster answered an error or is unreachable, 2 bad usage or input.",
    )
    parser.add_argument(
        "--json",
        dest="json_first",
        action="store_true",
        help="print one JSON document instead of a table (also accepted after the command)",
    )
    sub = parser.add_subparsers(dest="command", metavar="<command>")

    def cmd(name: str, help_text: str, runner: Runner) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _common(p)
        p.set_defaults(runner=runner)
        return p

    cmd("clusterList", "List the broker groups of every cluster, one row per replica", run_cluster_list)
    cmd("topicList", "List every topic the NameServer knows", run_topic_list)
    p = cmd("topicRoute", "Show a topic's queues and broker groups", run_topic_route)
    p.add_argument("-t", "--topic", required=True)
    p = cmd("updateTopic", "Create or update a topic", run_update_topic)
    p.add_argument("-t", "--topic", required=True)
    _target(p)
    p.add_argument("-r", "--readQueueNums", dest="read_queue_nums", type=int, default=4)
    p.add_argument("-w", "--writeQueueNums", dest="write_queue_nums", type=int, default=4)
    p.add_argument("-p", "--perm", type=int, default=6, help="4 read | 2 write (default 6)")
    p.add_argument("-o", "--order", type=parse_bool, nargs="?", const=True, default=False)
    p = cmd(
        "deleteTopic", "Delete a topic from a cluster's brokers, then from every NameServer", run_delete_topic
    )
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-c", "--clusterName", dest="cluster", required=True)
    p = cmd("topicStatus", "Min/max offset and last store time of every queue of a topic", run_topic_status)
    p.add_argument("-t", "--topic", required=True)
    p = cmd("updateSubGroup", "Create or update a subscription group", run_update_sub_group)
    p.add_argument("-g", "--groupName", dest="group", required=True)
    _target(p)
    p.add_argument("-s", "--consumeEnable", dest="consume_enable", type=parse_bool, default=True)
    p.add_argument(
        "-d", "--consumeBroadcastEnable", dest="consume_broadcast_enable", type=parse_bool, default=True
    )
    p.add_argument("-r", "--retryMaxTimes", dest="retry_max_times", type=int, default=16)
    p = cmd("consumerProgress", "A consumer group's offsets and lag per queue", run_consumer_progress)
    p.add_argument("-g", "--groupName", dest="group", required=True)
    p.add_argument("-t", "--topic", default=None)
    p = cmd("brokerStatus", "A broker's own status", run_broker_status)
    p.add_argument("-b", "--brokerAddr", dest="broker_addr", required=True)
    p = cmd("queryMsgById", "A message by its msgId (<brokerName>:<position>)", run_query_msg_by_id)
    p.add_argument("-i", "--msgId", dest="msg_id", required=True)
    p = cmd("queryMsgTraceById", "A message's trace: its send, then each group's consumption",
            run_query_msg_trace_by_id)
    p.add_argument("-i", "--msgId", dest="msg_id", required=True, help="the msgId or the unique id")
    p.add_argument("-t", "--traceTopic", dest="trace_topic", default=TRACE_TOPIC_DEFAULT)
    p = cmd("queryMsgByKey", "Messages of a topic carrying a key, newest first", run_query_msg_by_key)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-k", "--msgKey", dest="key", required=True)
    p.add_argument("-c", "--maxNum", dest="max", type=int, default=64)
    p = cmd("queryMsgByUniqueKey", "Messages by the producer's unique key", run_query_msg_by_unique_key)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-u", "--uniqueKey", dest="unique_key", required=True)
    p = cmd("queryMsgByOffset", "The message at a queue offset", run_query_msg_by_offset)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-m", "--brokerName", dest="broker_name", required=True)
    p.add_argument("-q", "--queueId", dest="queue_id", type=non_negative_int, required=True)
    p.add_argument("-o", "--offset", type=non_negative_int, required=True)
    p = cmd("queryDlqMessageByConsumerGroup", "The newest messages of a group's dead-letter queue",
            run_query_dlq_messages)
    p.add_argument("-g", "--consumerGroup", dest="group", required=True)
    p.add_argument("-c", "--maxNum", dest="max", type=int, default=64, help="per queue (default 64)")
    p = cmd("resendDlqMessage", "Send a dead-letter message back to its group's retry topic", run_resend_dlq_message)
    p.add_argument("-g", "--consumerGroup", dest="group", required=True)
    p.add_argument("-i", "--msgId", dest="msg_id", required=True)
    p = cmd("sendMessage", "Send one message", run_send_message)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-p", "--body", required=True, help="the body, as UTF-8 text")
    p.add_argument("-k", "--keys", default=None, help="space-separated keys")
    p.add_argument("-c", "--tags", default=None)
    p.add_argument("-m", "--brokerName", dest="broker_name", default=None)
    p.add_argument("-q", "--queueId", dest="queue_id", type=non_negative_int, default=None)
    p = cmd("consumeMessage", "Print messages of a topic (reads only: commits nothing)", run_consume_message)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("--sql", default=None, help="only messages matching this SQL92 condition (filtered by the broker)")
    p.add_argument("-g", "--consumerGroup", dest="group", default=None)
    p.add_argument(
        "-c", "--count", dest="count", type=int, default=128, help="at most this many (default 128)"
    )
    p.add_argument("-m", "--brokerName", dest="broker_name", default=None)
    p.add_argument("-q", "--queueId", dest="queue_id", type=non_negative_int, default=None)
    p.add_argument(
        "-s",
        "--startOffset",
        dest="start_offset",
        type=non_negative_int,
        default=None,
        help="first queue offset (default: each queue's first)",
    )
    p.add_argument(
        "-e",
        "--endOffset",
        dest="end_offset",
        type=non_negative_int,
        default=None,
        help="stop before this queue offset (default: each queue's max when started)",
    )
    p = cmd(
        "resetOffsetByTime",
        "Move a group's offsets of a topic to a time (backwards too)",
        run_reset_offset_by_time,
    )
    p.add_argument("-g", "--groupName", dest="group", required=True)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument(
        "-s",
        "--timestamp",
        type=parse_timestamp,
        required=True,
        help="now, epoch ms, or yyyy-MM-dd#HH:mm:ss:SSS",
    )
    p = cmd("transferLeader", "Hand a broker group's leadership to another replica", run_transfer_leader)
    p.add_argument("-m", "--brokerName", dest="broker_name", required=True)
    p.add_argument("-i", "--targetId", dest="target_id", default=None, help="peer id, e.g. n1 (default: any)")
    from broker.tools.mqadmin_ops import register  # (imports this module: loaded once it is complete)

    register(cmd)
    from broker.tools.mqadmin_txn import register as register_txn  # queryTransactionHalf

    register_txn(cmd)
    return parser


# -- running ----------------------------------------------------------------------------------------
def _fail(args: argparse.Namespace, exc: ClientError, code: int) -> int:
    if args.json:
        print(json.dumps({"ok": False, "code": exc.code, "message": exc.message, "addr": exc.addr}))
    print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
    return code


async def run(args: argparse.Namespace) -> int:
    try:
        admin = Admin(args.namesrv, timeout_s=args.timeout, **security_kwargs(args))
    except InvalidArgument as exc:
        return _fail(args, exc, 2)
    except CredentialsError as exc:
        return _fail(args, ClientError("BAD_CREDENTIALS", str(exc)), 2)
    try:
        out = await args.runner(admin, args)
    except InvalidArgument as exc:
        return _fail(args, exc, 2)
    except FanOutError as exc:
        if args.json:
            print(
                json.dumps(
                    {
                        "ok": False,
                        "code": exc.code,
                        "message": exc.message,
                        "results": to_jsonable(exc.outcomes),
                    },
                    indent=2,
                )
            )
        else:
            print(render_outcomes(exc.outcomes))
        print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
        return 1
    except ClientError as exc:
        return _fail(args, await _explain(admin, exc), 1)
    except Exception as exc:
        code = getattr(exc, "code", None)
        if not isinstance(code, str):  # not a typed client failure: a bug
            raise
        return _fail(args, ClientError(code, str(exc)), 1)
    finally:
        await admin.close()
    print(json.dumps(out.data, indent=2, ensure_ascii=False) if args.json else out.text)
    sys.stdout.flush()  # a closed pipe fails here, inside main's BrokenPipeError handling
    return out.exit_code


async def _explain(admin: Admin, exc: ClientError) -> ClientError:
    """A 404 for a NameServer path from an address given with -n: that address is no NameServer."""
    if exc.code != "NOT_FOUND" or exc.addr is None or exc.addr not in admin.namesrv.addrs:
        return exc
    what = "it has no NameServer API"
    try:
        st = await admin.transport.call(exc.addr, "GET", "/v1/status", timeout_s=2.0)
        if isinstance(st, dict) and st.get("broker_name"):
            what = f"it is a broker ({st.get('cluster')}/{st.get('broker_name')}, replica {st.get('self_id')})"
    except ClientError:
        pass
    return ClientError(
        "NOT_A_NAMESRV",
        f"{exc.addr} is not a NameServer: {what}; -n takes the NameServer list, e.g. 127.0.0.1:9876",
        addr=exc.addr,
    )


def _quiet_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's final flush stays silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, message already on stderr)
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    args.json = args.json or args.json_first
    if args.namesrv is None:
        args.namesrv = os.environ.get("NAMESRV_ADDR") or DEFAULT_NAMESRV
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `mqadmin ... | head -1`: the reader left; exit like a Unix tool, quietly
        _quiet_stdout()
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
