"""What the SDK hands to users: messages, queues, results and statuses, with their v1 wire codecs.

- ``Message`` is what a producer sends (mutable, like RocketMQ's: the producer sets ``unique_id``
  once, before the first attempt, so every retry carries the same id).
- ``MessageExt`` is what a consumer receives: every field of the broker API's Message plus
  ``reconsume_times`` (how often this consumer has handed it to the listener before). A body an
  official RocketMQ producer sent compressed (``sys_flag`` bit 0x1; the broker stores bodies as
  sent) is inflated here when it is zlib; an LZ4 or ZSTD body (RocketMQ 5.x options the standard
  library cannot read) is handed over as stored, with ``sys_flag`` still saying so.
- ``MessageQueue`` names one queue: (topic, broker_name, queue_id); it sorts in that order, which
  is the order rebalancing uses.
- Request building and answer parsing are plain functions here; the ``await`` sits in the callers.

Unique ids follow RocketMQ's ``MessageClientIDSetter`` (UNIQ_KEY): 16 bytes shown as 32 upper-case
hex digits::

    ip (4) | pid (2) | salt (4) | ms since the start of the month, UTC (4) | counter (2)

The salt tells two generators of one process apart (RocketMQ uses the class loader's hash).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from broker.client.transport import ClientError
from broker.protocol.limits import BATCH_MESSAGES_MAX, MESSAGE_BYTES_MAX, PULL_COUNT_MAX
from broker.protocol.names import (  # the broker's and NameServer's rules
    GROUP_RULE,
    TOPIC_RULE,
    is_group,
    is_topic,
)
from broker.protocol.properties import PROP_DELAY, PROP_TIMER_DELIVER_MS, reconsume_times
from broker.protocol.rocketmq.errors import RemotingError
from broker.protocol.rocketmq.message import decompress_body
from broker.protocol.rocketmq.properties import COMPRESSED_FLAG, COMPRESSION_TYPE_MASK

SUSPEND_MS_MAX = 30_000  # the SDK's own long-poll policy: under its HTTP timeout (the protocol allows more)


class SendStatus(enum.StrEnum):
    SEND_OK = "SEND_OK"


class PullStatus(enum.StrEnum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    OFFSET_OVERFLOW = "OFFSET_OVERFLOW"


class ConsumeStatus(enum.StrEnum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class MessageModel(enum.StrEnum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFrom(enum.StrEnum):
    LAST = "LAST"
    FIRST = "FIRST"
    TIMESTAMP = "TIMESTAMP"


@dataclasses.dataclass(eq=False)
class Message:
    """A message to send. ``keys`` may be given as one space-separated string (RocketMQ's habit)."""

    topic: str
    body: bytes
    tags: str = ""
    keys: Sequence[str] = ()
    properties: dict[str, str] = dataclasses.field(default_factory=dict)
    flag: int = 0
    unique_id: str | None = None
    # Delayed delivery (broker/store/schedule.py): a RocketMQ delay level (1 = 1 s ... 18 = 2 h; wire
    # property DELAY), or a deliver time in ms since the epoch (wire property TIMER_DELIVER_MS, at
    # most timerMaxDelaySec ahead of the broker's clock). The message is stored when sent and shows
    # up in its topic when due.
    delay_time_level: int = 0
    deliver_time_ms: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.keys, str):
            self.keys = tuple(self.keys.split())
        else:
            self.keys = tuple(self.keys)
        if isinstance(self.body, (bytearray, memoryview)):
            self.body = bytes(self.body)


@dataclasses.dataclass(frozen=True, order=True)
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}:{self.queue_id}"


@dataclasses.dataclass(frozen=True)
class MessageExt:
    """A stored message as a consumer sees it (the broker API's Message, plus ``reconsume_times``)."""

    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    unique_id: str
    tags: str
    keys: tuple[str, ...]
    properties: Mapping[str, str]
    body: bytes
    born_ts: int
    born_host: str
    store_ts: int
    position: int
    size: int
    broker_name: str
    flag: int = 0
    reconsume_times: int = 0
    sys_flag: int = 0  # 0x1: ``body`` is still compressed (a compression this SDK cannot inflate)

    @property
    def message_queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)


@dataclasses.dataclass(frozen=True)
class SendItem:
    """Where one message of a send landed."""

    msg_id: str
    unique_id: str
    queue_offset: int
    position: int


@dataclasses.dataclass(frozen=True)
class SendResult:
    """A stored send. For a batch, ``msg_id``/``unique_id``/``queue_offset`` are the first message's
    and ``items`` lists every message in order."""

    status: SendStatus
    msg_id: str
    unique_id: str
    message_queue: MessageQueue
    queue_offset: int
    store_ts: int
    items: tuple[SendItem, ...]


@dataclasses.dataclass(frozen=True)
class PullResult:
    status: PullStatus
    next_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt]
    topic_epoch: int | None = None  # the topic's incarnation on the answering replica (None: unknown)


# -- validation (the broker checks everything again; these catch mistakes before a round trip) --
def check_message(msg: Message) -> None:
    if not is_topic(msg.topic):
        raise ClientError("INVALID_TOPIC", f"topic {str(msg.topic)[:140]!r} must match {TOPIC_RULE}")
    if not isinstance(msg.body, bytes) or not msg.body:
        raise ClientError("INVALID_BODY", "body must be non-empty bytes")
    if len(msg.body) > MESSAGE_BYTES_MAX:
        raise ClientError("MESSAGE_TOO_LARGE", f"body of {len(msg.body)} bytes exceeds {MESSAGE_BYTES_MAX}")
    if not isinstance(msg.tags, str) or "||" in msg.tags or len(msg.tags) > 255:
        raise ClientError("INVALID_TAGS", "tags must be a string of at most 255 chars without '||'")
    if not isinstance(msg.delay_time_level, int) or msg.delay_time_level < 0:
        raise ClientError("INVALID_DELAY", "delay_time_level must be an integer ≥ 0 (0: not delayed)")
    if msg.deliver_time_ms is not None and (not isinstance(msg.deliver_time_ms, int) or msg.deliver_time_ms < 0):
        raise ClientError("INVALID_DELAY", "deliver_time_ms must be milliseconds since the epoch")


def check_batch(msgs: Sequence[Message]) -> str:
    """Validate a batch (one topic, 1..1024 messages, bodies ≤ 4 MiB together); returns the topic."""
    if not 1 <= len(msgs) <= BATCH_MESSAGES_MAX:
        raise ClientError("INVALID_BATCH", f"a batch holds 1..{BATCH_MESSAGES_MAX} messages, got {len(msgs)}")
    topic = msgs[0].topic
    total = 0
    for m in msgs:
        check_message(m)
        if m.topic != topic:
            raise ClientError("INVALID_BATCH", f"a batch goes to one topic: {topic!r} and {m.topic!r}")
        total += len(m.body)
    if total > MESSAGE_BYTES_MAX:
        raise ClientError("MESSAGE_TOO_LARGE", f"batch bodies of {total} bytes exceed {MESSAGE_BYTES_MAX}")
    return topic


def check_group(group: str) -> str:
    if not is_group(group):
        raise ClientError("INVALID_GROUP", f"group {str(group)[:270]!r} must match {GROUP_RULE}")
    return group


def parse_tags_expression(expr: str | None) -> frozenset[str] | None:
    """``"*"``/``""``/None → None (everything); ``"a || b"`` → {"a", "b"}."""
    if expr is None or expr.strip() in ("", "*"):
        return None
    tags = frozenset(t.strip() for t in expr.split("||") if t.strip())
    if not tags:
        raise ClientError("INVALID_TAGS", f"tag expression {expr!r} names no tag")
    return tags


def tags_expression(tags: frozenset[str] | None) -> str:
    return "*" if tags is None else "||".join(sorted(tags))


# -- wire codecs (v1) ---------------------------------------------------------------------------
def send_request(
    mq: MessageQueue, msgs: Sequence[Message], *, producer_group: str, born_ts: int, born_host: str
) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for m in msgs:
        assert m.unique_id is not None, "the producer sets unique ids before the first attempt"
        item: dict[str, Any] = {
            "body": m.body,
            "unique_id": m.unique_id,
            "born_ts": born_ts,
            "born_host": born_host,
        }
        if m.tags:
            item["tags"] = m.tags
        if m.keys:
            item["keys"] = list(m.keys)
        props = dict(m.properties)
        if m.delay_time_level:
            props[PROP_DELAY] = str(m.delay_time_level)
        if m.deliver_time_ms is not None:
            props[PROP_TIMER_DELIVER_MS] = str(m.deliver_time_ms)
        if props:
            item["properties"] = props
        if m.flag:
            item["flag"] = m.flag
        items.append(item)
    return {"topic": mq.topic, "queue_id": mq.queue_id, "producer_group": producer_group, "messages": items}


_SEND_STATUS = {s.value: s for s in SendStatus}


# The client makes a SendResult and a SendItem per message sent (auto-batched ones too): both are
# frozen dataclasses, whose generated __init__ sets each field through object.__setattr__. The send
# path fills the instance's __dict__ at once instead: the same object (fields, equality, hash, repr;
# neither class has a __post_init__, defaults or slots), a third of the cost (a test pins the two).
_new_object = object.__new__


def _send_item(msg_id: str, unique_id: str, queue_offset: int, position: int) -> SendItem:
    item: SendItem = _new_object(SendItem)
    item.__dict__.update(msg_id=msg_id, unique_id=unique_id, queue_offset=queue_offset, position=position)
    return item


def send_result_from_answer(answer: Any, mq: MessageQueue, index: int | None = None) -> SendResult:
    """The ``SendResult`` of a send answer; ``index``: only that message's (one caller of an
    auto-batch: its queue is the one its result names, else the answer's)."""
    try:
        raw = answer["results"]
        queue_id = answer.get("queue_id", mq.queue_id)
        if index is not None:  # one message (an auto-batch's caller): no list of results
            r = raw[index]
            queue_id = r.get("queue_id", queue_id)
            items = [_send_item(str(r["msg_id"]), str(r["unique_id"]), int(r["queue_offset"]),
                                int(r.get("position", -1)))]
        else:
            items = [
                _send_item(str(r["msg_id"]), str(r["unique_id"]), int(r["queue_offset"]), int(r.get("position", -1)))
                for r in raw
            ]
        broker = answer.get("broker_name", mq.broker_name)
        if type(queue_id) is int and queue_id == mq.queue_id and broker == mq.broker_name:
            stored_mq = mq  # where it was asked to go (the usual case): no new object per message
        else:
            stored_mq = MessageQueue(mq.topic, str(broker), int(queue_id))
        status = answer.get("status", "SEND_OK")
        first = items[0]
        result: SendResult = _new_object(SendResult)
        result.__dict__.update(
            status=_SEND_STATUS.get(status) or SendStatus(status),
            msg_id=first.msg_id,
            unique_id=first.unique_id,
            message_queue=stored_mq,
            queue_offset=first.queue_offset,
            store_ts=int(answer.get("store_ts", 0)),
            items=tuple(items),
        )
        return result
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise ClientError("BAD_ANSWER", f"unexpected send answer: {exc!r}") from None


def pull_request(
    mq: MessageQueue,
    offset: int,
    *,
    max_count: int,
    tags: str,
    suspend_ms: int,
    consumer_group: str | None,
    sql: str | None = None,
) -> dict[str, Any]:
    if not 1 <= max_count <= PULL_COUNT_MAX:
        raise ValueError(f"max_count must be in 1..{PULL_COUNT_MAX}")
    if not 0 <= suspend_ms <= SUSPEND_MS_MAX:
        raise ValueError(f"suspend_ms must be in 0..{SUSPEND_MS_MAX}")
    body: dict[str, Any] = {
        "topic": mq.topic,
        "queue_id": mq.queue_id,
        "offset": offset,
        "max_count": max_count,
        "tags": tags,
        "suspend_ms": suspend_ms,
    }
    if consumer_group is not None:
        body["consumer_group"] = consumer_group
    if sql is not None:
        body["sql"] = sql
    return body


def stored_body(body: bytes, sys_flag: int) -> tuple[bytes, int]:
    """The body as its producer gave it and the sys flag left: a zlib-compressed body (what official
    RocketMQ producers send over 4 KiB) inflated, bounded by the largest message; any other
    compression, or a body that does not inflate, as stored with its flags (never an error: one
    such message must not stop a consumer)."""
    if not sys_flag & COMPRESSED_FLAG:
        return body, sys_flag
    try:
        return decompress_body(body, sys_flag, MESSAGE_BYTES_MAX), sys_flag & ~(COMPRESSED_FLAG | COMPRESSION_TYPE_MASK)
    except RemotingError:
        return body, sys_flag


def message_ext_from_dict(d: Mapping[str, Any]) -> MessageExt:
    body = d.get("body")
    if body is None and "body_b64" in d:
        import base64

        body = base64.b64decode(d["body_b64"])
    body, sys_flag = stored_body(bytes(body or b""), int(d.get("sys_flag", 0)))
    return MessageExt(
        topic=str(d["topic"]),
        queue_id=int(d["queue_id"]),
        queue_offset=int(d["queue_offset"]),
        msg_id=str(d["msg_id"]),
        unique_id=str(d.get("unique_id", "")),
        tags=str(d.get("tags") or ""),
        keys=tuple(str(k) for k in d.get("keys") or ()),
        properties={str(k): str(v) for k, v in dict(d.get("properties") or {}).items()},
        body=body,
        born_ts=int(d.get("born_ts", 0)),
        born_host=str(d.get("born_host", "")),
        store_ts=int(d.get("store_ts", 0)),
        position=int(d.get("position", -1)),
        size=int(d.get("size", 0)),
        broker_name=str(d["broker_name"]),
        flag=int(d.get("flag", 0)),
        reconsume_times=reconsume_times(dict(d.get("properties") or {})),
        sys_flag=sys_flag,
    )


def pull_result_from_answer(answer: Any) -> PullResult:
    try:
        return PullResult(
            status=PullStatus(answer["status"]),
            next_offset=int(answer["next_offset"]),
            min_offset=int(answer.get("min_offset", 0)),
            max_offset=int(answer.get("max_offset", 0)),
            messages=[message_ext_from_dict(m) for m in answer.get("messages") or ()],
            topic_epoch=int(answer["topic_epoch"]) if answer.get("topic_epoch") is not None else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ClientError("BAD_ANSWER", f"unexpected pull answer: {exc!r}") from None


# -- unique ids ---------------------------------------------------------------------------------
_local_ip_cache: str | None = None


def local_ip() -> str:
    """This host's outward IPv4 address (no packet is sent), else 127.0.0.1."""
    global _local_ip_cache
    if _local_ip_cache is None:
        ip = "127.0.0.1"
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect(("10.255.255.255", 1))
                ip = s.getsockname()[0]
        except OSError:
            pass
        _local_ip_cache = ip
    return _local_ip_cache


def _month_bounds_ms(now_ms: int) -> tuple[int, int]:
    now = datetime.datetime.fromtimestamp(now_ms / 1000, tz=datetime.UTC)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    nxt = (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )
    return int(start.timestamp() * 1000), int(nxt.timestamp() * 1000)


@dataclasses.dataclass(frozen=True)
class UniqueIdInfo:
    ip: str
    pid: int
    salt: int
    month_offset_ms: int
    counter: int


class UniqueIdGenerator:
    """RocketMQ-style UNIQ_KEY generator; thread-safe. Clock and identity are injectable for tests."""

    def __init__(
        self,
        *,
        ip: str | None = None,
        pid: int | None = None,
        salt: int | None = None,
        clock_ms: Callable[[], int] | None = None,
    ):
        ip_bytes = socket.inet_aton(ip or local_ip())
        pid = os.getpid() if pid is None else pid
        salt = int.from_bytes(os.urandom(4), "big") if salt is None else salt
        self._prefix = (ip_bytes + struct.pack(">HI", pid & 0xFFFF, salt & 0xFFFFFFFF)).hex().upper()
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._lock = threading.Lock()
        self._counter = 0
        self._month_start_ms, self._next_month_ms = _month_bounds_ms(self._clock_ms())

    def next(self) -> str:
        with self._lock:
            now_ms = self._clock_ms()
            if now_ms >= self._next_month_ms or now_ms < self._month_start_ms:
                self._month_start_ms, self._next_month_ms = _month_bounds_ms(now_ms)
            diff = (now_ms - self._month_start_ms) & 0xFFFFFFFF
            counter = self._counter
            self._counter = (counter + 1) & 0xFFFF
        return f"{self._prefix}{diff:08X}{counter:04X}"


def unique_id_info(unique_id: str) -> UniqueIdInfo:
    if len(unique_id) != 32:
        raise ValueError(f"not an SDK unique id: {unique_id!r}")
    raw = bytes.fromhex(unique_id)
    pid, salt, diff, counter = struct.unpack(">HIIH", raw[4:])
    return UniqueIdInfo(socket.inet_ntoa(raw[:4]), pid, salt, diff, counter)


_default_ids: UniqueIdGenerator | None = None


def new_unique_id() -> str:
    global _default_ids
    if _default_ids is None:
        _default_ids = UniqueIdGenerator()
    return _default_ids.next()
