"""``mqadmin`` commands on messages: queryMsgById, queryMsgTraceById, queryMsgByKey, queryMsgByUniqueKey,
queryMsgByOffset, queryDlqMessageByConsumerGroup, resendDlqMessage, sendMessage, consumeMessage (with
``pull_range``, the read-only pull of a queue range that printMsg shares). Parsed and wired in
``broker/tools/mqadmin.py``."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Callable

from broker.client.admin import Admin
from broker.client.admin_checks import check_topic
from broker.client.admin_records import InvalidArgument, MessageView
from broker.client.message_selector import MessageSelector
from broker.client.trace import TRACE_TOPIC_DEFAULT
from broker.client.trace_query import (
    TIMELINE_HEADERS,
    query_msg_trace,
    timeline_json,
    timeline_rows,
    timeline_summary,
)
from broker.client.transport import ClientError, TopicRoute
from broker.tools.mqadmin_format import (
    Output,
    format_kv,
    format_table,
    format_ts,
    message_details,
    perm_text,
    render_message_table,
    to_jsonable,
)

CONSUME_COUNT_MAX = 100_000


async def run_query_msg_by_id(admin: Admin, args: argparse.Namespace) -> Output:
    m = await admin.query_msg_by_id(args.msg_id)
    return Output(to_jsonable(m), message_details(m))


async def run_query_msg_trace_by_id(admin: Admin, args: argparse.Namespace) -> Output:
    t = await query_msg_trace(admin, args.msg_id, args.trace_topic or TRACE_TOPIC_DEFAULT)
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
