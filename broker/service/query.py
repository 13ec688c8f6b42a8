"""The read half of the broker service (broker/service/broker_service.py): pull (RocketMQ ``getMessage``), and the
message queries of ``mqadmin queryMsgById / queryMsgByKey / queryMsgByUniqueKey / queryMsgByOffset``.

A pull, in order::

    group may consume -> topic exists, readable -> queue id, offset, counts, filter (tags | SQL92)
      -> loop: offset < min: OFFSET_TOO_SMALL | offset > max: OFFSET_OVERFLOW
               offset == max: hold (long poll, until suspend_ms or a new unit) then look again
               else read units from the consume queue, records from the log, filter -> FOUND / NO_MATCHED_MSG

A unit whose record is not readable yet (being applied) ends the read there: a pull never moves a
consumer past a message it did not deliver; only records removed by retention are skipped.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from broker.protocol.errors import ProtocolError
from broker.protocol.limits import PULL_BYTES_MAX, PULL_COUNT_MAX, PULL_SUSPEND_MS_MAX
from broker.protocol.sql_filter import SqlFilter, SqlFilterError, compile_filter, message_properties
from broker.service.base import INT64_MAX, ServiceBase, translated, translated_sync
from broker.store.consume_queue import QueueReader
from broker.store.message import (
    StoredMessage,
    check_group,
    check_int,
    check_topic,
    encodable,
    message_view,
    parse_msg_id,
    tag_hash,
)
from broker.store.message_store import MessageNotFound

MAX_SCAN_UNITS = 16_384
MAX_SQL_SCAN_UNITS = 2048  # an SQL filter reads every unit it scans from the log: fewer per pull

TagFilter = tuple[set[int], set[str]]  # (tag hashes, tags)


@dataclasses.dataclass(frozen=True, slots=True)
class PulledMessage:
    """A stored message with where it is: log ``position``, record ``size``, its ``queue_offset``."""

    message: StoredMessage
    position: int
    size: int
    queue_offset: int | None

    def view(self, broker_name: str) -> dict[str, Any]:
        """The API's Message map (docs/API.md)."""
        return message_view(
            self.message, broker_name=broker_name, position=self.position, size=self.size,
            queue_offset=self.queue_offset,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class PullAnswer:
    """``status``: FOUND, NO_NEW_MSG, NO_MATCHED_MSG, OFFSET_TOO_SMALL or OFFSET_OVERFLOW."""

    status: str
    next_offset: int
    min_offset: int
    max_offset: int
    messages: tuple[PulledMessage, ...]
    topic_epoch: int | None

    @property
    def size_bytes(self) -> int:
        return sum(m.size for m in self.messages)

    def to_dict(self, broker_name: str) -> dict[str, Any]:
        return {
            "status": self.status,
            "next_offset": self.next_offset,
            "min_offset": self.min_offset,
            "max_offset": self.max_offset,
            "messages": [m.view(broker_name) for m in self.messages],
            "topic_epoch": self.topic_epoch,
        }


def tag_filter(expr: Any) -> TagFilter | None:
    """A pull's ``tags`` expression (``'*'`` or ``'a||b'``): None = every message."""
    if expr is None or expr in ("", "*"):
        return None
    if not isinstance(expr, str) or len(expr) > 4096 or not encodable(expr):
        raise ProtocolError("INVALID_TAGS", "tags must be '*' or 'a||b' (at most 4096 UTF-8 chars)", 400)
    tags = {t.strip() for t in expr.split("||") if t.strip()}
    if not tags:
        return None
    return {tag_hash(t) for t in tags}, tags


def sql_filter(expr: Any, tags: Any, enabled: bool) -> SqlFilter | None:
    """The compiled SQL92 filter of a pull (cached per expression), or None."""
    if expr is None:
        return None
    if not enabled:
        raise ProtocolError(
            "FILTER_NOT_SUPPORTED", "this broker does not filter by SQL92 (enablePropertyFilter=false)", 400
        )
    if tags not in (None, "", "*"):
        raise ProtocolError("BAD_REQUEST", "a pull filters by tags or by sql, not both", 400)
    if not isinstance(expr, str) or not encodable(expr):
        raise ProtocolError("SUBSCRIPTION_PARSE_FAILED", "sql must be a UTF-8 string", 400, position=0)
    try:
        return compile_filter(expr)
    except SqlFilterError as exc:
        raise ProtocolError("SUBSCRIPTION_PARSE_FAILED", str(exc), 400, position=exc.position) from None


class QueryOps(ServiceBase):
    # -- pull ------------------------------------------------------------------------------------------
    @translated
    async def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        group: str | None = None,
        max_count: int = 32,
        max_bytes: int = 4 << 20,
        tags: str | None = None,
        sql: str | None = None,
        suspend_ms: int = 0,
    ) -> PullAnswer:
        """Up to ``max_count`` messages (and about ``max_bytes`` of bodies, at least one) of one queue
        from ``offset``; with nothing there yet, held up to ``suspend_ms`` (clamped to
        ``longPollingMaxMs``) for one to arrive. ``tags`` or ``sql`` filter (not both)."""
        s = self.s
        started = s.clock.monotonic()
        topic = check_topic(topic)
        if group is not None:
            check_group(group)
        self.require_state()
        if group is not None:
            gc = s.store.group(group)
            if gc is not None and not gc.consume_enable:
                raise ProtocolError("NO_PERMISSION", f"group {gc.group!r} has consume_enable=false", 403)
        tc = self.topic(topic)
        if not tc.readable:
            raise ProtocolError("NO_PERMISSION", f"topic {topic!r} is not readable (perm {tc.perm})", 403)
        qid = check_int(queue_id, "queue_id", 0, tc.read_queue_nums - 1, "INVALID_QUEUE_ID")
        offset = check_int(offset, "offset", 0, INT64_MAX)
        max_count = check_int(max_count, "max_count", 1, PULL_COUNT_MAX)
        max_bytes = check_int(max_bytes, "max_bytes", 1, PULL_BYTES_MAX)
        # Held at most longPollingMaxMs, like RocketMQ clamps the suspend time (not an error).
        suspend_ms = check_int(suspend_ms, "suspend_ms", 0, PULL_SUSPEND_MS_MAX)
        suspend_ms = min(suspend_ms, s.cfg.long_polling_max_ms)
        flt = tag_filter(tags)
        compiled = sql_filter(sql, tags, s.cfg.enable_property_filter) if sql is not None else None
        deadline = s.clock.monotonic() + suspend_ms / 1000
        while True:
            seen = s.applied_seq  # before the look: an apply after it makes the wait return at once
            cq = s.store.queue(topic, qid)
            lo, hi = (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)
            if offset < lo:
                return self._pull_answer(topic, "OFFSET_TOO_SMALL", lo, lo, hi, [])
            if offset > hi:
                return self._pull_answer(topic, "OFFSET_OVERFLOW", hi, lo, hi, [])
            if offset == hi or cq is None:
                remaining = deadline - s.clock.monotonic()
                if remaining <= 0 or s.stopping:
                    return self._pull_answer(topic, "NO_NEW_MSG", offset, lo, hi, [])
                await s.wait_for_queue(topic, qid, remaining, since=seen)
                continue
            answer = self._read_queue(topic, cq, offset, max_count, max_bytes, flt, lo, compiled)
            if answer.messages:
                s.metrics.pulled(topic, group, len(answer.messages), answer.size_bytes, s.clock.monotonic() - started)
            return answer

    def _read_queue(
        self,
        topic: str,
        cq: QueueReader,
        offset: int,
        max_count: int,
        max_bytes: int,
        flt: TagFilter | None,
        lo: int,
        sql: SqlFilter | None,
    ) -> PullAnswer:
        scan = max_count if flt is None and sql is None else min(MAX_SCAN_UNITS, max_count * 64)
        if sql is not None:
            scan = min(scan, MAX_SQL_SCAN_UNITS)
        out: list[PulledMessage] = []
        total = 0
        next_offset = offset
        for u in cq.read(offset, scan):
            if flt is not None and u.tag_hash not in flt[0]:
                next_offset = u.offset + 1
                continue
            try:
                m = self.s.store.read_message(u.position, u.size)
            except MessageNotFound:
                if u.position < self.s.first_log_position():  # removed by retention: skip it
                    next_offset = u.offset + 1
                    continue
                break  # not readable yet (being applied): stop here, never skip it
            if flt is not None and m.tags not in flt[1]:
                next_offset = u.offset + 1
                continue
            if sql is not None and not sql.matches(message_properties(m.properties, m.tags, m.keys)):
                next_offset = u.offset + 1
                continue
            if out and total + len(m.body) > max_bytes:
                break
            total += len(m.body)
            out.append(PulledMessage(m, u.position, u.size, u.offset))
            next_offset = u.offset + 1
            if len(out) >= max_count:
                break
        hi = cq.max_offset
        status = "FOUND" if out else ("NO_MATCHED_MSG" if next_offset > offset else "NO_NEW_MSG")
        return self._pull_answer(topic, status, next_offset, max(lo, cq.min_offset), hi, out)

    def _pull_answer(
        self, topic: str, status: str, next_offset: int, lo: int, hi: int, msgs: list[PulledMessage]
    ) -> PullAnswer:
        self.s.counters["pulls"] += 1
        self.s.counters["messages_pulled"] += len(msgs)
        # Read after the queue: an answer never pairs a new incarnation's offsets with an older epoch.
        epoch = self.s.store.topic_epoch(topic)
        return PullAnswer(status, next_offset, lo, hi, tuple(msgs), epoch)

    # -- queries ---------------------------------------------------------------------------------------
    @translated_sync
    def message_by_id(self, msg_id: str) -> PulledMessage:
        """The message of a msg id (``<brokerName>:<position hex>``) of this broker group."""
        self.require_state()
        name, position = parse_msg_id(msg_id)
        if name != self.s.cfg.broker_name:
            raise ProtocolError("MESSAGE_NOT_FOUND", f"msg id belongs to broker group {name!r}, this is "
                               f"{self.s.cfg.broker_name!r}", 404)
        return self.message_at(position)

    @translated_sync
    def message_at(self, position: int) -> PulledMessage:
        store = self.s.store
        try:
            m = store.read_message(position)
        except MessageNotFound:
            if position < store.applied_end_position and position < self.s.first_log_position():
                raise ProtocolError("MESSAGE_REMOVED", f"position {position} was removed by retention", 410) from None
            raise ProtocolError("MESSAGE_NOT_FOUND", f"no message at position {position}", 404) from None
        cq = store.queue(m.topic, m.queue_id)
        offset = cq.search_by_position(position) if cq is not None else None
        if offset is None:
            raise ProtocolError("MESSAGE_NOT_FOUND", f"no message at position {position}", 404)
        unit = cq.get(offset) if cq is not None else None
        return PulledMessage(m, position, unit.size if unit else 0, offset)

    @translated_sync
    def messages_by_key(
        self, topic: str, key: str, *, max_n: int = 64, begin_ts: int = 0, end_ts: int = INT64_MAX, unique: bool = False
    ) -> list[PulledMessage]:
        """Messages of ``topic`` with ``key`` among their keys (``unique``: whose unique id is
        ``key``) stored in [begin_ts, end_ts], at most ``max_n``, from the key index."""
        self.require_state()
        store = self.s.store
        out: list[PulledMessage] = []
        for position in store.positions_by_key(topic, key, max_n * 2, begin_ts, end_ts):
            try:
                m = store.read_message(position)
            except MessageNotFound:
                continue
            if m.topic != topic or (m.unique_id != key if unique else key not in m.keys):
                continue  # a hash collision
            cq = store.queue(m.topic, m.queue_id)
            offset = cq.search_by_position(position) if cq is not None else None
            unit = cq.get(offset) if cq is not None and offset is not None else None
            out.append(PulledMessage(m, position, unit.size if unit else 0, offset))
            if len(out) >= max_n:
                break
        return out

    @translated_sync
    def message_at_offset(self, topic: str, queue_id: int, offset: int) -> PulledMessage:
        """The message at ``offset`` of a queue (``MESSAGE_REMOVED`` once retention took it)."""
        self.require_state()
        cq = self.s.store.queue(topic, queue_id)
        unit = cq.get(offset) if cq is not None else None
        if unit is None:
            raise ProtocolError("MESSAGE_NOT_FOUND", f"no message at {topic}/{queue_id} offset {offset}", 404)
        try:
            m = self.s.store.read_message(unit.position, unit.size)
        except MessageNotFound:
            raise ProtocolError("MESSAGE_REMOVED", f"{topic}/{queue_id} offset {offset} was removed", 410) from None
        return PulledMessage(m, unit.position, unit.size, offset)

    @translated_sync
    def search_offset(self, topic: str, queue_id: int, ts: int) -> int:
        """The first offset of a queue stored at or after ``ts`` (RocketMQ ``searchOffset``)."""
        self.require_state()
        cq = self.s.store.queue(topic, queue_id)
        return cq.search_by_time(ts) if cq is not None else 0
