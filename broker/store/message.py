"""Messages as they live in the Raft log, and the rules every field obeys.

A Raft entry carries a batch of bodies (``dledger.command_codec``); each body is one *record*:

    b"N" | u32 header length | msgpack header array | body | u32 crc32        a message (checked)
    b"M" | u32 header length | msgpack header array | body                     a message (older, unchecked)
    b"C" | msgpack map                                                         a command (topics, offsets...)

The CRC covers every byte of the record before it. A reader that knows only a record's position
(a consume-queue unit, a msg id) reads that record alone, not its whole Raft entry, so the entry's
own body CRC is not checked on that path: the record's CRC is (a bit flipped in an old segment,
which recovery does not scan, is refused instead of served).

The message header is an array (compact, positional):
``[topic, queue_id, flag, tags, keys, properties, born_ts, born_host, store_ts, unique_id, body_len]``
(``body_len`` lets a reader that only knows a position — a msg id — read exactly one record),
optionally followed by ``sys_flag`` (RocketMQ's ``MessageSysFlag`` bits a producer sent that the
broker keeps: the compressed-body flag and compression type, multi-tags; issue 25). A writer
leaves it out when it is 0 — the common case, so those records are byte for byte what older
releases wrote — and every reader takes a missing one as 0. A reader of an older release accepts a
longer array and ignores the extra element (it checks ``len >= 11``), so a group may run a mix of
releases during a rolling upgrade: such a replica applies the record alike (queue offsets, indexes
and admission do not depend on ``sys_flag``), it only serves a compressed body without saying so.
Queue offsets are not stored: every replica assigns them when it applies the entry, in log order,
so every replica assigns the same ones.

A message's ``position`` is the log position of its record (what ``dledger`` returns for the body);
``msg_id`` is ``"<brokerName>:<position as 16 hex digits>"``.
"""

from __future__ import annotations

import re
import struct
import threading
import typing
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import msgpack

from broker.protocol.errors import ProtocolError
from broker.protocol.limits import (
    BATCH_MESSAGES_MAX,
    BORN_HOST_CHARS_MAX,
    KEY_CHARS_MAX,
    KEYS_MAX,
    PROPERTIES_MAX,
    PROPERTY_BYTES_MAX,
    TAGS_CHARS_MAX,
)
from broker.protocol.names import (
    GROUP_CHARS_MAX,
    GROUP_RULE,
    PROPERTY_NAME_RULE,
    TOPIC_CHARS_MAX,
    TOPIC_RULE,
    UNIQUE_ID_RULE,
    is_group,
    is_hex16,
    is_name,
    is_property_name,
    is_topic,
    is_unique_id,
)
from broker.protocol.rocketmq.properties import COMPRESSED_FLAG, COMPRESSION_TYPE_MASK, MULTI_TAGS_FLAG

MESSAGE_MAGIC = b"N"  # what writers write
MESSAGE_MAGIC_V1 = b"M"  # without the trailing CRC (still read)
MESSAGE_MAGICS = (MESSAGE_MAGIC, MESSAGE_MAGIC_V1)
COMMAND_MAGIC = b"C"
_CRC = struct.Struct("<I")
_HLEN = struct.Struct("<I")
_MAGIC_BYTES = tuple(m[0] for m in MESSAGE_MAGICS)  # the magics as a record's first byte reads (an int)
_hlen_from = _HLEN.unpack_from
_unpackb = msgpack.unpackb

POSITION_MAX = 2**63 - 1
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_WS_RE = re.compile(r"\s")

SYS_FLAG_MAX = 2**31 - 1  # RocketMQ's sysFlag is a Java int; ours keeps only non-negative values


class RecordHeader(NamedTuple):
    """A message record's header, as the log stores it (a msgpack array of these eleven fields, in
    this order). A named tuple, not a frozen dataclass: every replica builds one per message it
    applies, at a fifth of the cost (0.15-0.22 against 0.9-1.2 µs with timeit on a busy 2-core
    machine; the commit that introduced it has the benchmark)."""

    topic: str
    queue_id: int
    flag: int
    tags: str
    keys: list[str]
    properties: dict[str, str]
    born_ts: int
    born_host: str
    store_ts: int
    unique_id: str
    body_len: int


_HEADER_FIELDS = len(RecordHeader._fields)
# the fields' types, in order (what ``_header_types_ok`` checks, spelled out)
_HEADER_TYPES = tuple(typing.get_origin(t) or t for t in typing.get_type_hints(RecordHeader).values())


class StoredMessage(NamedTuple):
    """One message as the log stores it. A named tuple (``_replace`` for a changed copy), not a
    frozen dataclass: the leader makes one per message sent, at a third of the cost."""

    topic: str
    queue_id: int
    flag: int
    tags: str
    keys: tuple[str, ...]
    properties: dict[str, str]
    born_ts: int
    born_host: str
    store_ts: int
    unique_id: str
    body: bytes
    sys_flag: int = 0  # RocketMQ's MessageSysFlag bits kept as sent (COMPRESSED_FLAG: ``body`` is compressed)


# The header's first ten fields are ``StoredMessage``'s first ten, in the same order: the encoder
# packs that slice as it is (msgpack writes a tuple as the array a list would make).
assert StoredMessage._fields[:10] == RecordHeader._fields[:10]
_STORED_HEAD = 10
_PACKERS = threading.local()  # one msgpack Packer per thread (a Packer is not safe to share)


def encode_message(m: StoredMessage) -> bytes:
    """The record of ``m`` (the module doc's layout)."""
    return encode_messages((m,))[0]


def encode_messages(msgs: Sequence[StoredMessage]) -> list[bytes]:
    """The records of ``msgs`` (a send request's) in one loop, no call and no global lookups per
    message. Each header is byte for byte ``msgpack.packb([...fields], use_bin_type=True)``, made with
    this thread's Packer from a slice of the message rather than a new Packer and a list per message
    (the leader encodes every message sent)."""
    try:
        pack = _PACKERS.pack
    except AttributeError:
        pack = _PACKERS.pack = msgpack.Packer(use_bin_type=True).pack
    hlen, crc_of, crc, magic, join = _HLEN.pack, zlib.crc32, _CRC.pack, MESSAGE_MAGIC, b"".join
    out = []
    for m in msgs:
        body = m.body
        sys_flag = m.sys_flag
        header = pack(m[:_STORED_HEAD] + ((len(body), sys_flag) if sys_flag else (len(body),)))
        record = join((magic, hlen(len(header)), header, body))
        out.append(record + crc(crc_of(record)))
    return out


class CorruptRecordError(ValueError):
    """A message record whose bytes do not match its CRC: damaged storage, never served."""


def is_message_record(record: bytes | memoryview) -> bool:
    return bytes(record[:1]) in MESSAGE_MAGICS


def record_size(magic: bytes, header_bytes: int, body_len: int) -> int:
    """Bytes of a record from its magic, header length and body length (what a reader must read)."""
    return 5 + header_bytes + body_len + (_CRC.size if magic == MESSAGE_MAGIC else 0)


def decode_header(record: bytes | memoryview) -> tuple[RecordHeader, int]:
    """The header and where the body starts; raises ValueError on a malformed record."""
    header, end = decode_header_fields(record)
    return RecordHeader._make(header if len(header) == _HEADER_FIELDS else header[:_HEADER_FIELDS]), end


def decode_header_fields(record: bytes | memoryview) -> tuple[list[Any], int]:
    """The header's fields as stored (``RecordHeader``'s, then an optional ``sys_flag``) and where the
    body starts; raises ValueError on a malformed record. Every replica decodes every message it
    applies here: the magic is read as an int (no slice and copy), the length and decoder are bound
    once at import."""
    if len(record) < 5 or record[0] not in _MAGIC_BYTES:
        raise ValueError("not a message record")
    end = 5 + _hlen_from(record, 1)[0]
    if end > len(record):
        raise ValueError("message header runs past the record")
    try:
        header = _unpackb(record[5:end])  # msgpack >= 1.0's defaults: raw=False, use_list=True (no keywords to parse)
    except Exception as exc:  # msgpack raises several types for garbage
        raise ValueError(f"undecodable message header: {exc}") from None
    if not isinstance(header, list) or len(header) < _HEADER_FIELDS:
        raise ValueError("malformed message header")
    if not _header_types_ok(header):
        raise ValueError("message header fields have the wrong types")
    return header, end


def _header_types_ok(h: list[Any]) -> bool:
    """The fields' types (``RecordHeader``'s, in its order), spelled out: every replica checks every
    message it applies, and this is a third of the cost of a loop over the pairs."""
    return (
        isinstance(h[0], str)
        and isinstance(h[1], int)
        and isinstance(h[2], int)
        and isinstance(h[3], str)
        and isinstance(h[4], list)
        and isinstance(h[5], dict)
        and isinstance(h[6], int)
        and isinstance(h[7], str)
        and isinstance(h[8], int)
        and isinstance(h[9], str)
        and isinstance(h[10], int)
        and (not h[4] or all(isinstance(k, str) for k in h[4]))
    )


def decode_message(record: bytes) -> StoredMessage:
    fields, start = decode_header_fields(record)
    h = RecordHeader._make(fields if len(fields) == _HEADER_FIELDS else fields[:_HEADER_FIELDS])
    end = len(record)
    if record[:1] == MESSAGE_MAGIC:
        end -= _CRC.size
        if end < start or zlib.crc32(memoryview(record)[:end]) != _CRC.unpack_from(record, end)[0]:
            raise CorruptRecordError("the message record does not match its CRC")
    if end - start != h.body_len:
        raise CorruptRecordError(f"the message body is {end - start} bytes, its header says {h.body_len}")
    return StoredMessage(
        topic=h.topic,
        queue_id=h.queue_id,
        flag=h.flag,
        tags=h.tags,
        keys=tuple(h.keys),
        properties=dict(h.properties),
        born_ts=h.born_ts,
        born_host=h.born_host,
        store_ts=h.store_ts,
        unique_id=h.unique_id,
        body=bytes(record[start:end]),
        sys_flag=_sys_flag(fields),
    )


def _sys_flag(h: list[Any]) -> int:
    """The optional ``sys_flag`` element (0 when absent). Admission never looks at it, so replicas of
    releases before it and after it admit the same records; a value no writer of ours makes reads 0."""
    if len(h) > _HEADER_FIELDS:
        value = h[_HEADER_FIELDS]
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= SYS_FLAG_MAX:
            return value
    return 0


def encode_command(cmd: Mapping[str, Any]) -> bytes:
    return COMMAND_MAGIC + msgpack.packb(dict(cmd), use_bin_type=True)


def decode_command(record: bytes) -> dict[str, Any]:
    value = msgpack.unpackb(record[1:], raw=False, strict_map_key=False)
    if not isinstance(value, dict):
        raise ValueError("malformed command record")
    return value


def tag_hash(tags: str) -> int:
    """What consume-queue units store for tag filtering (0 = no tags). Stable across processes."""
    return zlib.crc32(tags.encode("utf-8")) + 1 if tags else 0


def make_msg_id(broker_name: str, position: int) -> str:
    return f"{broker_name}:{position:016X}"


def parse_msg_id(msg_id: str) -> tuple[str, int]:
    name, sep, hexpos = msg_id.rpartition(":")
    if not sep or not is_name(name) or not is_hex16(hexpos):
        raise ProtocolError("INVALID_MSG_ID", f"msg id {msg_id[:80]!r} is not <brokerName>:<16 hex digits>", 400)
    position = int(hexpos, 16)
    if position > POSITION_MAX:  # log positions are signed 64-bit (the indexes bind them into sqlite)
        raise ProtocolError("INVALID_MSG_ID", f"msg id {msg_id[:80]!r} has a position beyond {POSITION_MAX:X}", 400)
    return name, position


# -- validation ---------------------------------------------------------------------------------
def check_topic(topic: Any) -> str:
    if not is_topic(topic):
        raise ProtocolError("INVALID_TOPIC", f"topic {str(topic)[:140]!r} must match {TOPIC_RULE}", 400)
    return topic


def check_group(group: Any) -> str:
    if not is_group(group):
        raise ProtocolError(
            "INVALID_GROUP",
            f"group {str(group)[:270]!r} must match {GROUP_RULE}: at most {GROUP_CHARS_MAX} characters, so that "
            f"its retry and dead-letter topics (%RETRY%<group>, %DLQ%<group>) fit the {TOPIC_CHARS_MAX}-character "
            "topic limit", 400,
        )
    return group


def check_int(value: Any, name: str, lo: int, hi: int, code: str = "BAD_REQUEST") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ProtocolError(code, f"{name} must be an integer in [{lo}, {hi}], got {str(value)[:40]!r}", 400)
    return value


def encodable(text: str) -> bool:
    """False for a string UTF-8 cannot encode (a lone surrogate, which JSON's ``"\\ud800"`` yields)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_tags(tags: Any) -> str:
    if tags is None:
        return ""
    if (
        not isinstance(tags, str)
        or len(tags) > TAGS_CHARS_MAX
        or _CONTROL_RE.search(tags)
        or "||" in tags
        or not encodable(tags)
    ):
        raise ProtocolError(
            "INVALID_TAGS", f"tags must be a string of at most {TAGS_CHARS_MAX} chars without '||' or control chars",
            400,
        )
    return tags


def check_keys(keys: Any) -> tuple[str, ...]:
    if keys is None:
        return ()
    if isinstance(keys, str):
        keys = keys.split()
    if not isinstance(keys, (list, tuple)) or len(keys) > KEYS_MAX:
        raise ProtocolError("INVALID_KEYS", f"keys must be a list of at most {KEYS_MAX} strings", 400)
    for k in keys:
        if not isinstance(k, str) or not 1 <= len(k) <= KEY_CHARS_MAX or _WS_RE.search(k) or not encodable(k):
            raise ProtocolError(
                "INVALID_KEYS", f"key {str(k)[:40]!r} must be 1..{KEY_CHARS_MAX} chars without whitespace", 400
            )
    return tuple(keys)


_PROPERTY_NAMES_OK: set[str] = set()  # property names that matched the rule (the same few, message after message)
_PROPERTY_NAMES_REMEMBERED = 1024


def check_properties(props: Any) -> dict[str, str]:
    if props is None:
        return {}
    if not isinstance(props, dict) or len(props) > PROPERTIES_MAX:
        raise ProtocolError("INVALID_PROPERTIES", f"properties must be a map of at most {PROPERTIES_MAX} entries", 400)
    total = 0
    known = _PROPERTY_NAMES_OK
    for k, v in props.items():
        if type(k) is not str or k not in known:
            if not is_property_name(k):
                raise ProtocolError("INVALID_PROPERTIES",
                                    f"property name {str(k)[:70]!r} must match {PROPERTY_NAME_RULE}", 400)
            if type(k) is str and len(known) < _PROPERTY_NAMES_REMEMBERED:
                known.add(k)
        try:
            if not isinstance(v, str):
                raise TypeError
            total += len(v.encode("utf-8"))
        except (TypeError, UnicodeEncodeError):
            raise ProtocolError("INVALID_PROPERTIES", f"property {k!r} must have a UTF-8 string value", 400) from None
    if total > PROPERTY_BYTES_MAX:
        raise ProtocolError("INVALID_PROPERTIES", f"property values exceed {PROPERTY_BYTES_MAX} bytes together", 400)
    return dict(props)


def check_unique_id(value: Any) -> str:
    if not is_unique_id(value):
        raise ProtocolError("INVALID_UNIQUE_ID", f"unique_id {str(value)[:70]!r} must match {UNIQUE_ID_RULE}", 400)
    return value


def check_body(body: Any, max_size: int) -> bytes:
    if not isinstance(body, (bytes, bytearray)) or len(body) == 0:
        raise ProtocolError("INVALID_BODY", "body must be non-empty bytes (msgpack bin)", 400)
    if len(body) > max_size:
        raise ProtocolError("MESSAGE_TOO_LARGE", f"body of {len(body)} bytes exceeds {max_size}", 413)
    return bytes(body)


_MESSAGE_FIELDS = frozenset(
    {"body", "tags", "keys", "properties", "unique_id", "born_ts", "born_host", "flag", "queue_id", "sys_flag"}
)
SYS_FLAG_KEPT = COMPRESSED_FLAG | MULTI_TAGS_FLAG | COMPRESSION_TYPE_MASK
"""The ``MessageSysFlag`` bits a message may carry into the log: what its body is (compressed, and
how) and how its tags read. The others describe the wire (host address kinds) or the broker's own
state (transaction types) and are never taken from a producer."""


def check_sys_flag(value: Any, name: str) -> int:
    flag = check_int(value, name, 0, SYS_FLAG_MAX, "INVALID_SYS_FLAG")
    if flag & ~SYS_FLAG_KEPT:
        raise ProtocolError("INVALID_SYS_FLAG", f"{name} {flag:#x} has bits beyond {SYS_FLAG_KEPT:#x} (compression, "
                           "multi-tags): the others are the broker's", 400)
    return flag


_FLAG_MAX = 2**31 - 1
# A named tuple made from its fields' tuple without its generated ``__new__`` (a Python function of
# every field): build_messages makes one StoredMessage per message sent, fields in their order.
_new_tuple = tuple.__new__
_BORN_TS_MAX = 2**63 - 1


def build_messages(
    topic: str,
    queue_id: int,
    items: Any,
    *,
    store_ts: int,
    max_size: int,
    new_unique_id: Any,
    default_born_host: str,
    queue_ids_max: int,
) -> list[StoredMessage]:
    """Validate a send request's ``messages`` and make the records (one store time for the batch).
    A message's own ``queue_id`` (below ``queue_ids_max``) overrides ``queue_id``: one request may
    carry messages for several queues of the topic (the SDK's auto-batches)."""
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)) or not 1 <= len(items) <= BATCH_MESSAGES_MAX:
        raise ProtocolError("INVALID_BATCH", f"messages must be a list of 1..{BATCH_MESSAGES_MAX} messages", 400)
    out: list[StoredMessage] = []
    total = 0
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ProtocolError("INVALID_BATCH", f"messages[{i}] must be a map", 400)
        if not _MESSAGE_FIELDS.issuperset(item):
            unknown = set(item) - _MESSAGE_FIELDS
            raise ProtocolError("UNKNOWN_FIELD",
                                f"messages[{i}] has unknown field(s) {sorted(map(str, unknown))[:5]}", 400)
        body = item.get("body")
        if type(body) is not bytes or not 0 < len(body) <= max_size:
            body = check_body(body, max_size)
        total += len(body)
        born_host = item.get("born_host", default_born_host)
        if not isinstance(born_host, str) or len(born_host) > BORN_HOST_CHARS_MAX:
            raise ProtocolError("BAD_REQUEST", f"messages[{i}].born_host must be a string ≤ {BORN_HOST_CHARS_MAX}", 400)
        uid = item.get("unique_id")
        qid = item.get("queue_id")
        flag = item.get("flag", 0)
        born_ts = item.get("born_ts", store_ts)
        # The field names of a refusal are formatted only for a value check_int would refuse (an
        # int, not a bool, in range passes as is): no f-string per valid message.
        if qid is None:
            qid = queue_id
        elif type(qid) is not int or not 0 <= qid < queue_ids_max:
            qid = check_int(qid, f"messages[{i}].queue_id", 0, queue_ids_max - 1, "INVALID_QUEUE_ID")
        if type(flag) is not int or not 0 <= flag <= _FLAG_MAX:
            flag = check_int(flag, f"messages[{i}].flag", 0, _FLAG_MAX)
        if type(born_ts) is not int or not 0 <= born_ts <= _BORN_TS_MAX:
            born_ts = check_int(born_ts, f"messages[{i}].born_ts", 0, _BORN_TS_MAX)
        # Checked in the order of StoredMessage's fields (which refusal a message with several bad
        # fields gets); absent tags, keys and properties need no call.
        tags = item.get("tags")
        tags = "" if tags is None else check_tags(tags)
        keys = item.get("keys")
        keys = () if keys is None else check_keys(keys)
        props = item.get("properties")
        props = {} if props is None else check_properties(props)
        uid = new_unique_id() if uid is None else check_unique_id(uid)
        sys_flag = check_sys_flag(item["sys_flag"], f"messages[{i}].sys_flag") if "sys_flag" in item else 0
        out.append(_new_tuple(StoredMessage, (topic, qid, flag, tags, keys, props, born_ts, born_host, store_ts, uid,
                                              body, sys_flag)))
    if total > max_size:
        raise ProtocolError("MESSAGE_TOO_LARGE", f"batch bodies of {total} bytes exceed {max_size}", 413)
    return out


def message_view(
    m: StoredMessage, *, broker_name: str, position: int, size: int, queue_offset: int | None
) -> dict[str, Any]:
    """The API's Message map."""
    view = {
        "topic": m.topic,
        "queue_id": m.queue_id,
        "queue_offset": queue_offset,
        "msg_id": make_msg_id(broker_name, position),
        "unique_id": m.unique_id,
        "tags": m.tags,
        "keys": list(m.keys),
        "properties": m.properties,
        "body": m.body,
        "flag": m.flag,
        "born_ts": m.born_ts,
        "born_host": m.born_host,
        "store_ts": m.store_ts,
        "position": position,
        "size": size,
        "broker_name": broker_name,
    }
    if m.sys_flag:
        view["sys_flag"] = m.sys_flag
    return view
