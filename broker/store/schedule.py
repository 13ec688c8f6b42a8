"""Delayed and timed messages: stored when sent, visible in their real topic when due, their delivery
progress replicated through the Raft log (RocketMQ's ScheduleMessageService / RocketMQ 5 timers).

Sending. A message with property ``DELAY=N`` (a delay level, 1..len(messageDelayLevel), larger
levels clamp to the last, like RocketMQ) or a deliver time (``TIMER_DELIVER_MS``, ``TIMER_DELAY_SEC``,
``TIMER_DELAY_MS`` or ``__STARTDELIVERTIME``, all relative to the broker's store time; at most
``timerMaxDelaySec`` ahead) is rewritten before it is appended: its record goes to topic
``SCHEDULE_TOPIC_XXXX``, queue ``level - 1`` (queue ``TIMER_QUEUE_ID`` for deliver times), with the
real topic and queue in ``REAL_TOPIC`` / ``REAL_QID`` and the due time in ``__DUE_MS``. The send
is answered once that record is committed, like any other.

Pending set. Every replica keeps the schedule records not delivered yet in ``ScheduleIndex`` (sqlite,
on disk: memory stays bounded with 100k pending), derived from the log alone: applying a schedule
record adds it; applying a delivered copy (a record carrying ``__SCHED_POS``, the schedule record's
position) removes it. The index is committed with the store's snapshot, stamped with the applied
index; one that does not match the snapshot at start is rebuilt from the log.

Delivering. The ready leader (``ScheduleService``) asks its index for the records due by its clock
and appends their copies to the real topics (fresh store time, ``__DUE_MS`` kept, delay properties
dropped). Whether a copy becomes visible is decided when it is *applied*, by the pending set every
replica holds at that log point: the first copy of a schedule record is dispatched to its real queue
and removes the record; a second copy (a leader that retried an append whose outcome it did not know,
or a new leader that did not see its predecessor's copy yet) is skipped on every replica. So a
failover neither loses a due message (it stays pending until a copy is applied) nor shows one twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from broker.protocol.errors import ProtocolError
from broker.protocol.names import is_decimal, is_topic
from broker.protocol.properties import (
    BROKER_TOPICS,
    PROP_DELAY,
    PROP_DUE_MS,
    PROP_LEVEL,
    PROP_REAL_QID,
    PROP_REAL_TOPIC,
    PROP_SCHED_POS,
    PROP_START_DELIVER,
    PROP_TIMER_DELAY_MS,
    PROP_TIMER_DELAY_SEC,
    PROP_TIMER_DELIVER_MS,
    RESERVED_PROPS,
    SCHEDULE_PROPS,
    SCHEDULE_TOPIC,
)
from broker.protocol.routes import TopicConfig
from broker.store.host import LeaderHost
from broker.store.message import StoredMessage, encode_command, encode_message
from broker.store.snapshot_index import SnapshotIndex

log = logging.getLogger("broker.schedule")

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
DEFAULT_TIMER_MAX_DELAY_SEC = 3 * 24 * 3600
MAX_LEVELS = 64
TIMER_QUEUE_ID = MAX_LEVELS  # the schedule queue of deliver-time messages (level queues are 0..levels-1)


_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
DELIVER_BATCH = 128
DELIVER_BATCH_BYTES = 1 << 20
POLL_S = 0.1


def parse_delay_levels(text: str) -> tuple[int, ...]:
    """RocketMQ's ``messageDelayLevel`` ("1s 5s 10s 30s 1m ... 2h") as milliseconds per level."""
    out = []
    for item in text.split():
        unit = _UNITS_MS.get(item[-1:])
        if unit is None or not item[:-1].isdigit() or not 0 < int(item[:-1]) <= 10**6:
            raise ValueError(f"delay level {item!r} must be <number><s|m|h|d>")
        out.append(int(item[:-1]) * unit)
    if not 1 <= len(out) <= MAX_LEVELS:
        raise ValueError(f"messageDelayLevel needs 1..{MAX_LEVELS} levels, got {len(out)}")
    return tuple(out)


# (name, scale to ms, absolute time): the timer properties ``due_of`` reads, the first one present wins
_TIMER_PROPS: tuple[tuple[str, int, bool], ...] = (
    (PROP_TIMER_DELIVER_MS, 1, True),
    (PROP_TIMER_DELAY_SEC, 1000, False),
    (PROP_TIMER_DELAY_MS, 1, False),
    (PROP_START_DELIVER, 1, True),
)
# Every property ``due_of`` looks at: a message with none of them is not delayed and refused nothing.
_DUE_PROPS: frozenset[str] = frozenset((*RESERVED_PROPS, *(name for name, _, _ in _TIMER_PROPS), PROP_DELAY))


@dataclasses.dataclass(frozen=True)
class SchedulePolicy:
    levels_ms: tuple[int, ...] = parse_delay_levels(DEFAULT_DELAY_LEVELS)
    timer_max_delay_ms: int = DEFAULT_TIMER_MAX_DELAY_SEC * 1000

    def due_of(self, props: Mapping[str, str], store_ts: int, where: str) -> tuple[int, int] | None:
        """(due ms, level; 0 for a deliver time) of a message sent at ``store_ts``, None: not delayed."""
        for name in RESERVED_PROPS:
            if name in props:
                raise ProtocolError("BAD_REQUEST", f"{where}: property {name} is reserved for the broker", 400)
        timer = None
        for name, scale, absolute in _TIMER_PROPS:
            if name in props:
                value = _int_prop(props[name], name, where)
                timer = value * scale if absolute else store_ts + value * scale
                break
        if timer is not None:
            if timer - store_ts > self.timer_max_delay_ms:
                raise ProtocolError(
                    "TIMER_DELAY_TOO_LONG",
                    f"{where}: deliver time {timer} is more than timerMaxDelaySec "
                    f"({self.timer_max_delay_ms // 1000} s) after the store time {store_ts}", 400,
                )
            return (timer, 0) if timer > store_ts else None
        if PROP_DELAY in props:
            level = _int_prop(props[PROP_DELAY], PROP_DELAY, where)
            if level <= 0:
                return None
            level = min(level, len(self.levels_ms))  # RocketMQ clamps to the longest level
            return store_ts + self.levels_ms[level - 1], level
        return None

    def prepare_batch(self, msgs: list[StoredMessage]) -> list[StoredMessage]:
        """``prepare`` for a send request's messages (``where``: ``messages[i]``), formatting ``where``
        only for a message ``prepare`` has to look into (a broker topic, or a property ``due_of``
        reads: ``prepare`` returns any other message as it is)."""
        return [
            m if m.topic not in BROKER_TOPICS and (not m.properties or m.properties.keys().isdisjoint(_DUE_PROPS))
            else self.prepare(m, f"messages[{i}]")
            for i, m in enumerate(msgs)
        ]

    def prepare(self, m: StoredMessage, where: str) -> StoredMessage:
        """The record to append for ``m``: itself, or its schedule record when it is delayed."""
        if m.topic in BROKER_TOPICS:
            raise ProtocolError("NO_PERMISSION", f"{where}: topic {m.topic} is the broker's own", 403)
        if not m.properties:  # most messages: nothing reserved, nothing delayed
            return m
        due = self.due_of(m.properties, m.store_ts, where)
        if due is None:
            return m
        due_ms, level = due
        props = dict(m.properties)
        props.update(
            {
                PROP_REAL_TOPIC: m.topic,
                PROP_REAL_QID: str(m.queue_id),
                PROP_DUE_MS: str(due_ms),
                PROP_LEVEL: str(level),
            }
        )
        qid = level - 1 if level else TIMER_QUEUE_ID
        return m._replace(topic=SCHEDULE_TOPIC, queue_id=qid, properties=props)


def _int_prop(value: str, name: str, where: str) -> int:
    text = value.strip()
    # ASCII digits only: str.isdigit() also accepts '²', which int() refuses (a 500 once).
    if not is_decimal(text.removeprefix("-")) or len(text) > 19:
        raise ProtocolError("BAD_REQUEST", f"{where}: property {name} must be an integer, got {value[:40]!r}", 400)
    return int(text)


def delivery_refusal(props: Mapping[str, str]) -> str | None:
    """Why a schedule record's delivered copy could not be applied (None: it can): its real topic
    and queue come from the record's properties."""
    topic, qid = props.get(PROP_REAL_TOPIC), props.get(PROP_REAL_QID)
    if not is_topic(topic):
        return f"names no valid real topic ({str(topic)[:140]!r})"
    if not isinstance(qid, str) or not is_decimal(qid):
        return f"names no valid real queue ({str(qid)[:40]!r})"
    return None


def delivered_copy(m: StoredMessage, position: int, store_ts: int, queue_nums: int) -> StoredMessage:
    """The copy of schedule record ``m`` (at ``position``) that makes it visible in its real topic."""
    props = {k: v for k, v in m.properties.items() if k not in SCHEDULE_PROPS}
    topic = props.pop(PROP_REAL_TOPIC)
    qid = int(props.pop(PROP_REAL_QID)) % max(1, queue_nums)
    props.pop(PROP_LEVEL, None)
    props[PROP_SCHED_POS] = str(position)
    return m._replace(topic=topic, queue_id=qid, properties=props, store_ts=store_ts)


class ScheduleIndex(SnapshotIndex):
    """The pending schedule records of one replica (sqlite; changed on the apply thread, committed with
    the store's snapshots; read by the leader's delivery loop)."""

    def __init__(self, path: str):
        super().__init__(
            path,
            (
                "CREATE TABLE IF NOT EXISTS pending (position INTEGER PRIMARY KEY, size INTEGER NOT NULL,"
                " due_ms INTEGER NOT NULL, level INTEGER NOT NULL)",
                "CREATE INDEX IF NOT EXISTS pending_due ON pending (due_ms, position)",
            ),
            ("pending",),
        )

    def add(self, position: int, size: int, props: Mapping[str, str]) -> None:
        try:
            due, level = int(props[PROP_DUE_MS]), int(props.get(PROP_LEVEL, "0"))
        except (KeyError, ValueError):
            log.error("schedule record at position %d has no due time: not scheduled", position)
            return
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO pending (position, size, due_ms, level) VALUES (?, ?, ?, ?)",
                (position, size, due, level),
            )

    def take(self, position: int) -> bool:
        """Remove a pending record; False when it is not pending (delivered already)."""
        with self._lock:
            return self._db.execute("DELETE FROM pending WHERE position = ?", (position,)).rowcount > 0

    def due(self, now_ms: int, limit: int) -> list[tuple[int, int, int]]:
        """(position, size, due ms) of up to ``limit`` records due by ``now_ms``, earliest first."""
        with self._lock:
            return list(
                self._db.execute(
                    "SELECT position, size, due_ms FROM pending WHERE due_ms <= ? ORDER BY due_ms, position LIMIT ?",
                    (now_ms, limit),
                )
            )

    def get(self, position: int) -> tuple[int, int] | None:
        """(due ms, level) of a pending record."""
        with self._lock:
            row = self._db.execute("SELECT due_ms, level FROM pending WHERE position = ?", (position,)).fetchone()
        return (int(row[0]), int(row[1])) if row else None

    def backlog(self) -> dict[int, int]:
        """Pending records per level (0: deliver-time messages)."""
        with self._lock:
            return {int(lv): int(n) for lv, n in self._db.execute("SELECT level, count(*) FROM pending GROUP BY level")}

    # -- applying (the store's apply thread, in log order) ------------------------------------------
    def on_message(self, position: int, size: int, topic: str, props: Mapping[str, str]) -> bool:
        """Account one applied message record; False: a second copy of a delivered record (skip it)."""
        if topic == SCHEDULE_TOPIC:
            self.add(position, size, props)
            return True
        raw = props.get(PROP_SCHED_POS)
        if raw is None:
            return True
        try:
            return self.take(int(raw))
        except ValueError:
            return False

    def on_command(self, cmd: Mapping[str, Any]) -> None:
        if cmd.get("op") == "schedule.drop":
            for position in cmd.get("positions") or ():
                if isinstance(position, int):
                    self.take(position)

    def rebuild(self, records: Iterable[tuple[int, bytes]], applied_index: int) -> None:
        """Derive the pending set from the log's records (position order)."""
        from broker.store.message import COMMAND_MAGIC, MESSAGE_MAGICS
        from broker.store.record_rules import admit_command, admitted_header

        self.reset()
        n = 0
        for position, body in records:  # what applying refused (broker/store/record_rules.py) is skipped
            kind = body[:1]
            if kind in MESSAGE_MAGICS:
                h = admitted_header(body)
                if h is None:
                    continue
                self.on_message(position, len(body), h.topic, h.properties)
            elif kind == COMMAND_MAGIC:
                cmd, _refused = admit_command(body)
                if cmd is None:
                    continue
                self.on_command(cmd)
            n += 1
        self.commit(applied_index)
        log.info("schedule index rebuilt from %d log records: %d pending", n, sum(self.backlog().values()))

    def rows(self) -> list[list[int]]:
        """Every pending record as [position, size, due ms, level] (for a state entry)."""
        with self._lock:
            return [list(r) for r in self._db.execute("SELECT position, size, due_ms, level FROM pending")]

    def load_rows(self, rows: Iterable[Any], applied_index: int) -> None:
        """Take a leader's pending set (a state entry) instead of this replica's."""
        self.reset()
        with self._lock:
            self._db.executemany(
                "INSERT OR REPLACE INTO pending (position, size, due_ms, level) VALUES (?, ?, ?, ?)",
                [(int(p), int(sz), int(d), int(lv)) for p, sz, d, lv in rows],
            )
        self.commit(applied_index)


class DeliveryStore(Protocol):
    """What the delivery loop reads of the message store (``MessageStore`` is one)."""

    @property
    def schedule(self) -> ScheduleIndex: ...
    def read_message(self, position: int, size: int | None = None) -> StoredMessage: ...
    def topic(self, name: str) -> TopicConfig | None: ...


class DeliveryHost(LeaderHost, Protocol):
    """What the delivery loop uses of the replica it runs on (``BrokerServer`` is one)."""

    @property
    def store(self) -> DeliveryStore: ...


class ScheduleService:
    """The ready leader's delivery loop (one per broker; idle on followers)."""

    def __init__(self, server: DeliveryHost, policy: SchedulePolicy):
        self.s = server
        self.policy = policy
        self.counters = {"delivered": 0, "rounds": 0, "lost": 0}

    async def run(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            if self.s.stopping:
                return
            if not (self.s.node.role == "LEADER" and self.s.ready):
                continue
            try:
                while await self.deliver_once():
                    pass
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # not leader any more, timeouts: the next round retries
                log.info("delivery of due messages interrupted: %s", exc)

    async def deliver_once(self) -> int:
        """Append copies of the due records (one entry); returns how many were appended."""
        store = self.s.store
        now = self.s.wall_ms()
        due = store.schedule.due(now, DELIVER_BATCH)
        if not due:
            return 0
        records: list[bytes] = []
        total = 0
        for position, size, _due_ms in due:
            try:
                m = store.read_message(position, size)
                undeliverable = delivery_refusal(m.properties)
            except Exception as exc:  # removed by retention, damaged: it can never be delivered
                undeliverable = f"cannot be read ({exc})"
            if undeliverable is not None:
                # Checked before its copy is appended (docs/SECURITY.md): a copy the apply would refuse
                # (a real topic an older release let in) would stay pending and be retried for ever.
                log.error("delayed message at position %d %s: dropped from the schedule", position, undeliverable)
                self.counters["lost"] += 1
                drop = {"op": "schedule.drop", "positions": [position]}
                await self.s.node.append([encode_command(drop)], timeout_s=self.s.send_timeout_s)
                continue
            topic = m.properties[PROP_REAL_TOPIC]
            tc = store.topic(topic)
            queue_nums = tc.write_queue_nums if tc is not None else 1
            record = encode_message(delivered_copy(m, position, now, queue_nums))
            if records and total + len(record) > DELIVER_BATCH_BYTES:
                break
            records.append(record)
            total += len(record)
        if not records:
            return 0
        await self.s.node.append(records, timeout_s=self.s.send_timeout_s)
        self.counters["delivered"] += len(records)
        self.counters["rounds"] += 1
        return len(records)

    def status(self) -> dict[str, Any]:
        backlog = self.s.store.schedule.backlog()
        levels = self.policy.levels_ms
        return {
            "pending": sum(backlog.values()),
            "backlog": {("timer" if lv == 0 else f"level{lv}"): n for lv, n in sorted(backlog.items())},
            "levels_ms": list(levels),
            **self.counters,
        }


def schedule_message_fields(props: Mapping[str, str]) -> dict[str, Any]:
    """What a message view shows about its schedule (mqadmin: the due time)."""
    out: dict[str, Any] = {}
    if PROP_DUE_MS in props:
        out["due_ts"] = int(props[PROP_DUE_MS])
    return out


def strip_schedule(props: Iterable[str]) -> list[str]:
    return [p for p in props if p not in SCHEDULE_PROPS]
