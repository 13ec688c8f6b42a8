"""Reading a message's trace back (``mqadmin queryMsgTraceById``; RocketMQ's QueryMsgTraceById):
the trace messages whose keys hold the msgId (the broker's key index on the trace topic,
``Admin.query_msg_by_key``), decoded (broker/client/trace.py), narrowed to the records of that
message and put in order — the send first, then each consumer group's calls by time.

``select_records`` and ``timeline_rows`` are plain functions over plain data; ``query_msg_trace``
is the one ``await``. A trace message that is not a trace document (something else sent to the
trace topic) is skipped and counted, never fatal.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any

from broker.client.admin import Admin
from broker.client.admin_checks import check_key
from broker.client.trace import (
    TRACE_TOPIC_DEFAULT,
    TraceCodecError,
    TraceRecord,
    TraceType,
    decode_records,
    record_to_dict,
)
from broker.client.transport import ClientError
from broker.protocol.limits import QUERY_MESSAGES_MAX

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TraceTimeline:
    msg_id: str
    trace_topic: str
    records: tuple[TraceRecord, ...]  # sends first, then consumption by (group, time)
    unreadable: int = 0  # trace-topic messages with this key that were not trace documents

    @property
    def sends(self) -> list[TraceRecord]:
        return [r for r in self.records if r.type is TraceType.PUB]

    def consumes(self, group: str | None = None) -> list[TraceRecord]:
        return [r for r in self.records if r.type is TraceType.SUB and (group is None or r.group == group)]


def _order(r: TraceRecord) -> tuple[int, str, int, int]:
    return (0 if r.type is TraceType.PUB else 1, r.group, r.time_ms, r.retry_times)


def select_records(msg_id: str, bodies: Iterable[bytes]) -> tuple[list[TraceRecord], int]:
    """The records of ``msg_id`` (its msgId or unique id) in ``bodies``, each once, in timeline
    order; and how many bodies were not trace documents."""
    seen: set[TraceRecord] = set()
    unreadable = 0
    for body in bodies:
        try:
            records = decode_records(body)
        except TraceCodecError as exc:
            unreadable += 1
            log.debug("not a trace document: %s", exc)
            continue
        seen.update(r for r in records if msg_id in (r.msg_id, r.unique_id))
    return sorted(seen, key=_order), unreadable


async def query_msg_trace(
    admin: Admin, msg_id: str, trace_topic: str = TRACE_TOPIC_DEFAULT, max_msgs: int = QUERY_MESSAGES_MAX
) -> TraceTimeline:
    """The timeline of ``msg_id``; ``MESSAGE_NOT_FOUND`` when the trace topic holds no record of it."""
    msgs = await admin.query_msg_by_key(trace_topic, check_key(msg_id), max_msgs)
    records, unreadable = select_records(msg_id, (m.body for m in msgs))
    if not records:
        raise ClientError("MESSAGE_NOT_FOUND", f"no trace of {msg_id} in {trace_topic}", status=404)
    return TraceTimeline(msg_id, trace_topic, tuple(records), unreadable)


def timeline_json(t: TraceTimeline) -> dict[str, Any]:
    return {
        "msg_id": t.msg_id,
        "trace_topic": t.trace_topic,
        "unreadable": t.unreadable,
        "events": [record_to_dict(r) for r in t.records],
    }


TIMELINE_HEADERS = ("Type", "Group", "ClientHost", "Time", "CostTimes", "Status", "RetryTimes", "StoreHost")


def timeline_rows(t: TraceTimeline) -> list[tuple[Any, ...]]:
    """One row per event, in ``TIMELINE_HEADERS`` order (``time_ms`` for the caller to format)."""
    return [
        (
            str(r.type),
            r.group,
            r.client_host,
            r.time_ms,
            f"{r.cost_ms}ms",
            r.status if r.type is TraceType.PUB else ("success" if r.success else f"failed ({r.status})"),
            r.retry_times if r.type is TraceType.SUB else "-",
            r.store_host or r.broker_name,
        )
        for r in t.records
    ]


def timeline_summary(t: TraceTimeline) -> list[tuple[str, Any]]:
    """What the message is, from its send record (else from the first record)."""
    first = (t.sends or list(t.records))[0]
    return [
        ("msgId", t.msg_id),
        ("topic", first.topic),
        ("tags", first.tags or "-"),
        ("keys", " ".join(first.keys) or "-"),
        ("brokerName", first.broker_name),
        ("queue", f"{first.queue_id} offset {first.queue_offset}"),
        ("consumerGroups", " ".join(sorted({r.group for r in t.consumes()})) or "-"),
    ]
