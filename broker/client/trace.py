"""Message trace (RocketMQ's msgtrace): producers and push consumers created with
``enable_msg_trace=True`` record what happened to each message — sent (``Pub``: producer group,
time, cost, status, msgId, keys, tags, topic, store host, queue and offset) and consumed (``Sub``:
consumer group, time, cost, success or not, reconsume times) — and a ``TraceDispatcher`` writes
the records in batches, as ordinary messages, to the trace topic (``RMQ_SYS_TRACE_TOPIC`` unless
configured otherwise). ``broker/client/trace_query.py`` reads them back (``mqadmin
queryMsgTraceById``).

Record path::

    send / listener call ends ─▶ record(s) ─▶ append(): bounded queue (queue_max), never waits
                                                   │      full: dropped, counted, logged
                              background task ◀────┘
        flush when batch_max records wait, or the oldest waited flush_interval_ms
          ─▶ trace messages (≤ 16 records each; keys = the traced msgIds and unique ids)
          ─▶ its own Producer (group ``_INNER_TRACE_PRODUCER-<group>``) ─▶ the trace topic
          failure: the batch is dropped, counted, logged (never retried into the send path)

The trace messages carry the traced messages' msgIds and unique ids as keys, so the broker's key
index (broker/store/key_index.py, ``GET /v1/msg/key``) finds every record of one message. Nothing here
blocks or fails a send or a listener call: recording is an O(1) append on the caller's event
loop, and the dispatcher's producer has its own connections and limits.

The body of a trace message is one versioned JSON document, ``{"v": 1, "records": [...]}``
(``encode_records`` / ``decode_records``; RocketMQ's text format with \\x01/\\x02 separators is not
used: the records here are read by this SDK only). Time stamps are wall-clock ms since the epoch
(each host's own clock); costs are measured on the event loop's monotonic clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from broker.client.consumer_common import wait_event
from broker.client.message import ConsumeStatus, Message, MessageExt, SendResult
from broker.protocol.limits import KEYS_MAX
from broker.protocol.properties import PROP_ORIGIN_MESSAGE_ID

log = logging.getLogger(__name__)

TRACE_TOPIC_DEFAULT = "RMQ_SYS_TRACE_TOPIC"  # RocketMQ's default msgTraceTopicName
TRACE_PRODUCER_PREFIX = "_INNER_TRACE_PRODUCER-"
TRACE_RECORD_VERSION = 1
TRACE_KEYS_PER_MESSAGE = KEYS_MAX  # one key per traced message id, as many as the broker takes
TRACE_BODY_BYTES_MAX = 256 << 10  # one trace message; far below the 4 MiB message limit
TRACE_SEND_MESSAGES_MAX = 64  # trace messages in one batch send
TRACE_SEND_BYTES_MAX = 1 << 20  # their bodies together (a batch send takes 4 MiB)
TRACE_RECORDS_PER_DOC_MAX = 1024  # what decode_records accepts from one body
DROP_LOG_EVERY = 1000  # log the first drop, then every this many


class TraceType(enum.StrEnum):
    PUB = "Pub"  # a send (RocketMQ: Pub)
    SUB = "Sub"  # a listener call on one message (RocketMQ: SubBefore + SubAfter in one record)


class TraceCodecError(ValueError):
    """A trace message body that is not a trace document of a known version."""


@dataclasses.dataclass(frozen=True)
class TraceRecord:
    type: TraceType
    group: str  # producer or consumer group
    time_ms: int  # when the send or the listener call started (wall clock, ms since the epoch)
    cost_ms: int
    success: bool
    status: str  # SEND_OK / FLUSH_DISK_TIMEOUT ... for Pub; CONSUME_SUCCESS / RECONSUME_LATER for Sub
    msg_id: str  # the stored message's id (a retried copy is traced under its original msgId)
    unique_id: str
    topic: str
    tags: str = ""
    keys: tuple[str, ...] = ()
    broker_name: str = ""  # the broker group that stored it
    store_host: str = ""  # Pub: the leader address that took the send
    queue_id: int = -1
    queue_offset: int = -1
    retry_times: int = 0  # Sub: the message's reconsume times at this call
    client_host: str = ""  # the producer's born host / the consumer's client id
    body_length: int = 0


_FIELDS = tuple(f.name for f in dataclasses.fields(TraceRecord))


def record_to_dict(r: TraceRecord) -> dict[str, Any]:
    d = dataclasses.asdict(r)
    d["type"] = str(r.type)
    d["keys"] = list(r.keys)
    return d


def record_from_dict(d: Any) -> TraceRecord:
    if not isinstance(d, dict) or set(d) - set(_FIELDS):
        raise TraceCodecError(f"a trace record must be an object with fields {_FIELDS}")
    try:
        return TraceRecord(
            type=TraceType(d["type"]),
            group=str(d["group"]),
            time_ms=int(d["time_ms"]),
            cost_ms=int(d["cost_ms"]),
            success=bool(d["success"]),
            status=str(d["status"]),
            msg_id=str(d["msg_id"]),
            unique_id=str(d["unique_id"]),
            topic=str(d["topic"]),
            tags=str(d.get("tags", "")),
            keys=tuple(str(k) for k in d.get("keys", ())),
            broker_name=str(d.get("broker_name", "")),
            store_host=str(d.get("store_host", "")),
            queue_id=int(d.get("queue_id", -1)),
            queue_offset=int(d.get("queue_offset", -1)),
            retry_times=int(d.get("retry_times", 0)),
            client_host=str(d.get("client_host", "")),
            body_length=int(d.get("body_length", 0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceCodecError(f"bad trace record: {exc!r}") from None


def encode_records(records: Sequence[TraceRecord]) -> bytes:
    doc = {"v": TRACE_RECORD_VERSION, "records": [record_to_dict(r) for r in records]}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def decode_records(body: bytes) -> list[TraceRecord]:
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise TraceCodecError(f"not a JSON trace document: {exc}") from None
    if not isinstance(doc, dict) or doc.get("v") != TRACE_RECORD_VERSION:
        raise TraceCodecError(f"not a version {TRACE_RECORD_VERSION} trace document")
    raw = doc.get("records")
    if not isinstance(raw, list) or len(raw) > TRACE_RECORDS_PER_DOC_MAX:
        raise TraceCodecError(f"records must be a list of at most {TRACE_RECORDS_PER_DOC_MAX}")
    return [record_from_dict(d) for d in raw]


def trace_keys(r: TraceRecord) -> list[str]:
    """The keys a trace message carries for ``r``: what ``queryMsgTraceById`` looks up."""
    return [k for k in (r.msg_id, r.unique_id) if k]


def trace_messages(topic: str, records: Sequence[TraceRecord]) -> list[tuple[Message, int]]:
    """Pack records, in order, into trace messages of at most ``TRACE_KEYS_PER_MESSAGE`` distinct
    keys and ``TRACE_BODY_BYTES_MAX`` bytes each; returns (message, records in it)."""
    out: list[tuple[Message, int]] = []
    chunk: list[TraceRecord] = []
    keys: dict[str, None] = {}
    size = 0
    for r in records:
        new = [k for k in trace_keys(r) if k not in keys]
        r_size = len(encode_records([r]))
        if chunk and (len(keys) + len(new) > TRACE_KEYS_PER_MESSAGE or size + r_size > TRACE_BODY_BYTES_MAX):
            out.append((Message(topic, encode_records(chunk), keys=tuple(keys)), len(chunk)))
            chunk, keys, size = [], {}, 0
            new = trace_keys(r)
        chunk.append(r)
        keys.update(dict.fromkeys(new))
        size += r_size
    if chunk:
        out.append((Message(topic, encode_records(chunk), keys=tuple(keys)), len(chunk)))
    return out


def send_batches(packed: Sequence[tuple[Message, int]]) -> list[list[tuple[Message, int]]]:
    """Trace messages grouped into sends of at most ``TRACE_SEND_MESSAGES_MAX`` messages and
    ``TRACE_SEND_BYTES_MAX`` body bytes (well inside one batch send's limits)."""
    out: list[list[tuple[Message, int]]] = []
    size = 0
    for m, n in packed:
        if not out or len(out[-1]) >= TRACE_SEND_MESSAGES_MAX or size + len(m.body) > TRACE_SEND_BYTES_MAX:
            out.append([])
            size = 0
        out[-1].append((m, n))
        size += len(m.body)
    return out


# -- records from the send and consume paths -----------------------------------------------------
def send_records(
    group: str,
    msgs: Sequence[Message],
    result: SendResult,
    *,
    time_ms: int,
    cost_ms: int,
    store_host: str,
    client_host: str,
) -> list[TraceRecord]:
    """One Pub record per message of a (batch) send."""
    out = []
    for i, m in enumerate(msgs):
        item = result.items[i] if i < len(result.items) else None
        out.append(
            TraceRecord(
                type=TraceType.PUB,
                group=group,
                time_ms=time_ms,
                cost_ms=cost_ms,
                success=True,
                status=str(result.status),
                msg_id=item.msg_id if item else result.msg_id,
                unique_id=item.unique_id if item else (m.unique_id or ""),
                topic=m.topic,
                tags=m.tags,
                keys=tuple(m.keys),
                broker_name=result.message_queue.broker_name,
                store_host=store_host,
                queue_id=result.message_queue.queue_id,
                queue_offset=item.queue_offset if item else result.queue_offset,
                client_host=client_host,
                body_length=len(m.body),
            )
        )
    return out


def consume_records(
    group: str,
    msgs: Sequence[MessageExt],
    status: ConsumeStatus,
    *,
    time_ms: int,
    cost_ms: int,
    client_host: str,
) -> list[TraceRecord]:
    """One Sub record per message of a listener call. A copy from the retry topic is traced under
    its original msgId (``ORIGIN_MESSAGE_ID``) and topic, so one query shows every attempt."""
    return [
        TraceRecord(
            type=TraceType.SUB,
            group=group,
            time_ms=time_ms,
            cost_ms=cost_ms,
            success=status is ConsumeStatus.CONSUME_SUCCESS,
            status=str(status),
            msg_id=m.properties.get(PROP_ORIGIN_MESSAGE_ID) or m.msg_id,
            unique_id=m.unique_id,
            topic=m.topic,
            tags=m.tags,
            keys=tuple(m.keys),
            broker_name=m.broker_name,
            queue_id=m.queue_id,
            queue_offset=m.queue_offset,
            retry_times=m.reconsume_times,
            client_host=client_host,
            body_length=len(m.body),
        )
        for m in msgs
    ]


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


# -- the dispatcher ------------------------------------------------------------------------------
class TraceSink(Protocol):
    """Where trace messages go: the dispatcher's own ``Producer``."""

    async def start(self) -> None: ...
    async def send_batch(self, msgs: Sequence[Message]) -> Any: ...
    async def shutdown(self) -> None: ...


class TraceDispatcher:
    """A bounded queue of trace records and the task that writes them (see the module docstring).
    ``append`` is safe to call before ``start`` and after ``shutdown`` (records are then dropped
    and counted). One owner: the event loop of the producer or consumer that records."""

    def __init__(
        self,
        sink: TraceSink,
        trace_topic: str = TRACE_TOPIC_DEFAULT,
        *,
        queue_max: int = 2048,
        batch_max: int = 100,
        flush_interval_ms: int = 500,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not 1 <= batch_max <= queue_max:
            raise ValueError("trace batch_max must be in 1..queue_max")
        if flush_interval_ms < 1:
            raise ValueError("trace flush_interval_ms must be positive")
        self.sink = sink
        self.trace_topic = trace_topic
        self.queue_max = queue_max
        self.batch_max = batch_max
        self.flush_interval_s = flush_interval_ms / 1000
        self._clock = clock
        self._queue: deque[TraceRecord] = deque()
        self._oldest_at: float | None = None  # when the oldest waiting record was appended
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._accepting = False
        self._closing = False
        self.appended = 0
        self.dropped = 0  # queue full, or not running
        self.written = 0  # records in trace messages the broker stored
        self.failed = 0  # records in trace messages whose send failed

    @property
    def queued(self) -> int:
        return len(self._queue)

    def append(self, records: Iterable[TraceRecord]) -> None:
        """Queue records for writing; never waits. Over ``queue_max`` the newest are dropped."""
        for r in records:
            if not self._accepting or len(self._queue) >= self.queue_max:
                self.dropped += 1
                if self.dropped % DROP_LOG_EVERY == 1:
                    log.warning("trace queue of %s full or closed: %d record(s) dropped so far",
                                self.trace_topic, self.dropped)
                continue
            if not self._queue:
                self._oldest_at = self._clock()
            self._queue.append(r)
            self.appended += 1
        if len(self._queue) >= self.batch_max:
            self._wake.set()

    def flush_wait_s(self, now: float) -> float:
        """How long until a flush is due (0: now)."""
        if len(self._queue) >= self.batch_max:
            return 0.0
        if self._oldest_at is None:
            return self.flush_interval_s
        return max(0.0, self._oldest_at + self.flush_interval_s - now)

    def take_due(self, now: float, *, force: bool = False) -> list[TraceRecord]:
        """The next batch (≤ ``batch_max``) when a flush is due, else nothing."""
        if not self._queue or (not force and self.flush_wait_s(now) > 0):
            return []
        n = min(self.batch_max, len(self._queue))
        batch = [self._queue.popleft() for _ in range(n)]
        self._oldest_at = now if self._queue else None  # the rest waits at most one more interval
        return batch

    async def write(self, batch: Sequence[TraceRecord]) -> None:
        """Send one batch of records; a failure drops them (counted, logged), never raises."""
        sent = 0
        try:
            for part in send_batches(trace_messages(self.trace_topic, batch)):
                await self.sink.send_batch([m for m, _ in part])
                sent += sum(n for _, n in part)
        except Exception as exc:
            log.warning("writing %d trace record(s) to %s failed (dropped): %s",
                        len(batch) - sent, self.trace_topic, exc)
        self.failed += len(batch) - sent
        self.written += sent

    async def flush_due(self, *, force: bool = False) -> int:
        """Write every batch that is due now (all of them with ``force``); returns records taken."""
        taken = 0
        while batch := self.take_due(self._clock(), force=force):
            taken += len(batch)
            await self.write(batch)
        return taken

    async def start(self) -> None:
        if self._task is not None:
            return
        await self.sink.start()
        self._accepting = True
        self._closing = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def shutdown(self, timeout_s: float = 3.0) -> None:
        """Stop accepting, write what is queued (bounded by ``timeout_s``), stop the sink."""
        task = self._task
        if task is None:
            return
        self._accepting = False
        self._closing = True
        self._wake.set()
        _done, left = await asyncio.wait({task}, timeout=timeout_s)
        if left:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._task = None
        if self._queue:
            log.warning("trace flush at shutdown incomplete: %d record(s) dropped", len(self._queue))
            self.dropped += len(self._queue)
            self._queue.clear()
        await self.sink.shutdown()

    async def _run(self) -> None:
        while not self._closing:
            wait_s = self.flush_wait_s(self._clock())
            if wait_s > 0:
                await wait_event(self._wake, wait_s)
            self._wake.clear()
            await self.flush_due(force=self._closing)
        await self.flush_due(force=True)  # closing: write what is left
