"""The pure helpers of ``mqadmin`` (``broker/tools/mqadmin.py``): what a command returns (``Output``),
the argument value types (timestamps, booleans, bounded numbers) and the rendering of answers (RocketMQ-style
tables, key/value lists, JSON documents). Plain functions over plain data: no request is sent here."""

from __future__ import annotations

import argparse
import base64
import dataclasses
import datetime
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: parsing mqadmin's arguments imports no client code
    from broker.client.admin import Admin
    from broker.client.admin_records import BrokerMember, MessageView, Outcome
    from broker.client.transport import TopicRoute

BODY_TEXT_MAX = 80  # characters of a body shown in a table (--json carries the whole body)


@dataclasses.dataclass(frozen=True)
class Output:
    data: Any  # what --json prints
    text: str  # what a terminal gets
    exit_code: int = 0


Runner = Callable[["Admin", argparse.Namespace], Awaitable[Output]]


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
    from broker.protocol import route_wire

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
