"""Messages in RocketMQ's binary layouts: the stored layout a PULL answer carries, the batch body of
SEND_BATCH_MESSAGE, offset message ids, and body compression.

Stored layout (``MessageDecoder.encode`` / ``decode``; integers big-endian, signed)::

    4 total size  4 magic (V1 -626843481: 1-byte topic length; V2 -626843477: 2-byte)
    4 body CRC (crc32 & 0x7FFFFFFF)  4 queue id  4 flag  8 queue offset  8 commit-log offset
    4 sysFlag  8 born timestamp  born host (4 or 16 bytes IP, by BORNHOST_V6_FLAG) + 4 port
    8 store timestamp  store host (by STOREHOSTADDRESS_V6_FLAG) + 4 port  4 reconsume times
    8 prepared transaction offset  4 body length + body  1|2 topic length + topic
    2 properties length + properties

A pull answer's body is such messages back to back. We write V1 whenever the topic fits in 127
bytes (4.9.x clients read only V1), V2 otherwise; we read both.

Batch item (``MessageDecoder.encodeMessage``): ``4 total  4 magic (0)  4 body CRC (0)  4 flag
4 body length + body  2 properties length + properties``, back to back.

Offset message id (``createMessageId``): store host IP (4 or 16 bytes) + port (4) + commit-log
offset (8), upper-case hex: 32 or 56 characters.

Every decoder here checks each length against what remains and against its bound and raises
``RemotingError`` (BAD_MESSAGE, BAD_PROPERTIES, BAD_MESSAGE_ID, UNSUPPORTED_COMPRESSION,
BODY_TOO_LARGE); none allocates more than its input (decompression: more than its bound).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import struct
import zlib
from collections.abc import Iterable, Mapping
from typing import Final

from broker.protocol.rocketmq.errors import RemotingError
from broker.protocol.rocketmq.properties import (
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    PROPERTIES_BYTES_MAX,
    PROPERTIES_ENTRIES_MAX,
    STOREHOSTADDRESS_V6_FLAG,
    compression_type,
    decode_properties_bytes,
    encode_properties,
)

MAGIC_V1: Final = -626843481
MAGIC_V2: Final = -626843477
BLANK_MAGIC: Final = -875286124
TOPIC_BYTES_MAX_V1: Final = 127
TOPIC_BYTES_MAX: Final = 32767
BODY_BYTES_MAX_DEFAULT: Final = 64 << 20
BATCH_MESSAGES_MAX_DEFAULT: Final = 4096

_HEAD: Final = struct.Struct(">iiiiiqqiq")  # size, magic, crc, queue id, flag, queue off, phys off, sysflag, born ts
_V4_HOST: Final = struct.Struct(">4si")
_V6_HOST: Final = struct.Struct(">16si")
_MID: Final = struct.Struct(">q")  # store timestamp
_TAIL: Final = struct.Struct(">iqi")  # reconsume times, prepared txn offset, body length
_BATCH_HEAD: Final = struct.Struct(">iiiii")  # total, magic, crc, flag, body length
_I16: Final = struct.Struct(">h")
_U8: Final = struct.Struct(">B")
_U16: Final = struct.Struct(">H")
_MIN_STORED: Final = _HEAD.size + 2 * _V4_HOST.size + _MID.size + _TAIL.size + 1 + 2
# the whole fixed part in one pack, by (born host is IPv6, store host is IPv6)
_FIXED: Final = {
    (born6, store6): struct.Struct(">iiiiiqqiq" + ("16si" if born6 else "4si") + "q" + ("16si" if store6 else "4si")
                                   + "iqi")
    for born6 in (False, True) for store6 in (False, True)
}


@dataclasses.dataclass(frozen=True, slots=True)
class Host:
    """An IP address (4 or 16 bytes) and a port, as the layouts carry them."""

    ip: bytes
    port: int

    @classmethod
    def parse(cls, address: str) -> Host:
        """``127.0.0.1:10911`` or ``[::1]:10911`` (``::1:10911`` too: the last colon splits)."""
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 0xFFFF:
            raise RemotingError("BAD_FIELD", f"address {address[:80]!r} is not host:port")
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            raise RemotingError("BAD_FIELD", f"address {address[:80]!r} has no IP address") from None
        return cls(ip.packed, int(port))

    @property
    def is_v6(self) -> bool:
        return len(self.ip) == 16

    def __str__(self) -> str:
        ip = ipaddress.ip_address(self.ip)
        return f"[{ip}]:{self.port}" if self.is_v6 else f"{ip}:{self.port}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StoredMessage:
    """A message as a PULL answer carries it (``MessageExt``). ``body`` is as stored: compressed
    when ``sys_flag`` has COMPRESSED_FLAG (``decompress_body``). ``body_crc`` None: computed."""

    topic: str
    body: bytes
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    born_timestamp: int
    born_host: Host
    store_timestamp: int
    store_host: Host
    sys_flag: int = 0
    flag: int = 0
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    properties: Mapping[str, str] = dataclasses.field(default_factory=dict)
    body_crc: int | None = None

    @property
    def offset_msg_id(self) -> str:
        return make_offset_msg_id(self.store_host, self.commit_log_offset)


def body_crc(body: bytes) -> int:
    """The body CRC RocketMQ stores: CRC-32 with the sign bit cleared."""
    return zlib.crc32(body) & 0x7FFFFFFF


def _is_v6(host: Host) -> bool:
    if len(host.ip) == 4:
        return False
    if len(host.ip) == 16:
        return True
    raise ValueError(f"a host address has 4 or 16 bytes, not {len(host.ip)}")


def stored_parts(msg: StoredMessage, properties: bytes | None = None) -> list[bytes]:
    """The stored layout of ``msg`` as pieces to join (the body is not copied); ``properties``
    overrides ``msg.properties`` with an already encoded string (UTF-8)."""
    topic = msg.topic.encode("utf-8")
    if properties is None:
        properties = encode_properties(msg.properties).encode("utf-8")
    if len(properties) > PROPERTIES_BYTES_MAX:
        raise ValueError(f"properties of {len(properties)} bytes exceed {PROPERTIES_BYTES_MAX}")
    if len(topic) > TOPIC_BYTES_MAX:
        raise ValueError(f"a topic of {len(topic)} bytes exceeds {TOPIC_BYTES_MAX}")
    born6, store6 = _is_v6(msg.born_host), _is_v6(msg.store_host)
    sys_flag = msg.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
    sys_flag |= (BORNHOST_V6_FLAG if born6 else 0) | (STOREHOSTADDRESS_V6_FLAG if store6 else 0)
    if len(topic) <= TOPIC_BYTES_MAX_V1:
        magic, topic_len = MAGIC_V1, _U8.pack(len(topic))
    else:
        magic, topic_len = MAGIC_V2, _U16.pack(len(topic))
    body = msg.body
    fixed = _FIXED[born6, store6]
    size = fixed.size + len(body) + len(topic_len) + len(topic) + 2 + len(properties)
    crc = body_crc(body) if msg.body_crc is None else msg.body_crc
    head = fixed.pack(
        size, magic, crc, msg.queue_id, msg.flag, msg.queue_offset, msg.commit_log_offset, sys_flag,
        msg.born_timestamp, msg.born_host.ip, msg.born_host.port, msg.store_timestamp, msg.store_host.ip,
        msg.store_host.port, msg.reconsume_times, msg.prepared_transaction_offset, len(body))
    return [head, body, topic_len + topic + _I16.pack(len(properties)) + properties]


def encode_stored(msg: StoredMessage) -> bytes:
    return b"".join(stored_parts(msg))


def encode_stored_many(messages: Iterable[StoredMessage]) -> bytes:
    """A PULL answer's body: the messages back to back."""
    parts: list[bytes] = []
    for msg in messages:
        parts += stored_parts(msg)
    return b"".join(parts)


def _bad(what: str, offset: int) -> RemotingError:
    return RemotingError("BAD_MESSAGE", f"{what} (message at byte {offset})")


def decode_stored(buf: bytes | memoryview, offset: int = 0, *,
                  properties_entries_max: int = PROPERTIES_ENTRIES_MAX) -> tuple[StoredMessage, int]:
    """The message at ``offset`` and the offset after it."""
    view = memoryview(buf)
    end_all = len(view)
    if end_all - offset < _MIN_STORED:
        raise _bad(f"{end_all - offset} bytes are fewer than a message's fixed part", offset)
    size, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts = _HEAD.unpack_from(view, offset)
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise _bad(f"magic code {magic} is not a message's", offset)
    if not _MIN_STORED <= size <= end_all - offset:
        raise _bad(f"total size {size} does not fit the {end_all - offset} bytes left", offset)
    end = offset + size
    pos = offset + _HEAD.size
    born = _V6_HOST if sys_flag & BORNHOST_V6_FLAG else _V4_HOST
    store = _V6_HOST if sys_flag & STOREHOSTADDRESS_V6_FLAG else _V4_HOST
    if pos + born.size + _MID.size + store.size + _TAIL.size > end:
        raise _bad("the hosts do not fit the message", offset)
    born_ip, born_port = born.unpack_from(view, pos)
    pos += born.size
    (store_ts,) = _MID.unpack_from(view, pos)
    pos += _MID.size
    store_ip, store_port = store.unpack_from(view, pos)
    pos += store.size
    reconsume, prepared, body_len = _TAIL.unpack_from(view, pos)
    pos += _TAIL.size
    if not 0 <= body_len <= end - pos:
        raise _bad(f"body length {body_len} does not fit", offset)
    body = bytes(view[pos:pos + body_len])
    pos += body_len
    width = 1 if magic == MAGIC_V1 else 2
    if pos + width > end:
        raise _bad("no room for the topic length", offset)
    topic_len = view[pos] if width == 1 else _U16.unpack_from(view, pos)[0]
    pos += width
    if (width == 1 and topic_len > TOPIC_BYTES_MAX_V1) or pos + topic_len + 2 > end:
        raise _bad(f"topic length {topic_len} does not fit", offset)
    try:
        topic = bytes(view[pos:pos + topic_len]).decode("utf-8")
    except UnicodeDecodeError:
        raise _bad("the topic is not UTF-8", offset) from None
    pos += topic_len
    (props_len,) = _I16.unpack_from(view, pos)
    pos += 2
    if props_len < 0 or pos + props_len != end:
        raise _bad(f"properties length {props_len} does not end the message", offset)
    props = decode_properties_bytes(view[pos:end], properties_entries_max) if props_len else {}
    msg = StoredMessage(
        topic=topic, body=body, queue_id=queue_id, queue_offset=queue_offset, commit_log_offset=phys,
        born_timestamp=born_ts, born_host=Host(born_ip, born_port), store_timestamp=store_ts,
        store_host=Host(store_ip, store_port), sys_flag=sys_flag, flag=flag, reconsume_times=reconsume,
        prepared_transaction_offset=prepared, properties=props, body_crc=crc,
    )
    return msg, end


def decode_stored_many(buf: bytes | memoryview, messages_max: int = BATCH_MESSAGES_MAX_DEFAULT) -> list[StoredMessage]:
    """A PULL answer's body."""
    out: list[StoredMessage] = []
    pos, end = 0, len(buf)
    while pos < end:
        if len(out) >= messages_max:
            raise RemotingError("BAD_MESSAGE", f"more than {messages_max} messages")
        msg, pos = decode_stored(buf, pos)
        out.append(msg)
    return out


# -- batches ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class BatchItem:
    """One message of a SEND_BATCH_MESSAGE body: flag, body, properties (no topic: the header's)."""

    flag: int
    body: bytes
    properties: dict[str, str]


def encode_batch(items: Iterable[BatchItem]) -> bytes:
    parts: list[bytes] = []
    for item in items:
        props = encode_properties(item.properties).encode("utf-8")
        if len(props) > PROPERTIES_BYTES_MAX:
            raise ValueError(f"properties of {len(props)} bytes exceed {PROPERTIES_BYTES_MAX}")
        total = _BATCH_HEAD.size + len(item.body) + 2 + len(props)
        parts += (_BATCH_HEAD.pack(total, 0, 0, item.flag, len(item.body)), item.body, _I16.pack(len(props)), props)
    return b"".join(parts)


def decode_batch(buf: bytes | memoryview, *, messages_max: int = BATCH_MESSAGES_MAX_DEFAULT,
                 properties_entries_max: int = PROPERTIES_ENTRIES_MAX) -> list[BatchItem]:
    """The messages of a SEND_BATCH_MESSAGE body; each item's total size must match its parts."""
    view = memoryview(buf)
    out: list[BatchItem] = []
    pos, end = 0, len(view)
    while pos < end:
        if len(out) >= messages_max:
            raise RemotingError("BAD_MESSAGE", f"a batch of more than {messages_max} messages")
        if end - pos < _BATCH_HEAD.size + 2:
            raise _bad("a truncated batch item", pos)
        total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(view, pos)
        if not _BATCH_HEAD.size + 2 <= total <= end - pos:
            raise _bad(f"batch item size {total} does not fit the {end - pos} bytes left", pos)
        start, item_end = pos, pos + total
        pos += _BATCH_HEAD.size
        if not 0 <= body_len <= item_end - pos - 2:
            raise _bad(f"body length {body_len} does not fit the item", start)
        body = bytes(view[pos:pos + body_len])
        pos += body_len
        (props_len,) = _I16.unpack_from(view, pos)
        pos += 2
        if props_len < 0 or pos + props_len != item_end:
            raise _bad(f"properties length {props_len} does not end the item", start)
        props = decode_properties_bytes(view[pos:item_end], properties_entries_max) if props_len else {}
        out.append(BatchItem(flag, body, props))
        pos = item_end
    return out


# -- message ids ------------------------------------------------------------------------------------
_ID_V4: Final = struct.Struct(">4siq")
_ID_V6: Final = struct.Struct(">16siq")


def make_offset_msg_id(store_host: Host, commit_log_offset: int) -> str:
    """The offset message id (what VIEW_MESSAGE_BY_ID resolves): upper-case hex."""
    packer = _ID_V4 if len(store_host.ip) == 4 else _ID_V6
    return packer.pack(store_host.ip, store_host.port, commit_log_offset).hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[Host, int]:
    """The store host and commit-log offset of an offset message id (32 or 56 hex characters)."""
    if len(msg_id) not in (32, 56):
        raise RemotingError("BAD_MESSAGE_ID", f"an offset message id has 32 or 56 hex digits, not {len(msg_id)}")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise RemotingError("BAD_MESSAGE_ID", f"{msg_id[:56]!r} is not hex") from None
    ip, port, offset = (_ID_V4 if len(raw) == 16 else _ID_V6).unpack(raw)
    return Host(ip, port), offset


# -- compression ------------------------------------------------------------------------------------
def compress_body(body: bytes, level: int = 5) -> bytes:
    """zlib at RocketMQ's level (5): what a client sends with COMPRESSED_FLAG (| ZLIB type in 5.x)."""
    return zlib.compress(body, level)


def decompress_body(body: bytes, sys_flag: int, bytes_max: int = BODY_BYTES_MAX_DEFAULT) -> bytes:
    """The body as the producer gave it: inflated when ``sys_flag`` has COMPRESSED_FLAG (zlib: type
    0 or 3), never beyond ``bytes_max``; LZ4 / ZSTD bodies are UNSUPPORTED_COMPRESSION."""
    if not sys_flag & COMPRESSED_FLAG:
        return body
    kind = compression_type(sys_flag)
    if kind not in (0, 3):
        raise RemotingError("UNSUPPORTED_COMPRESSION", f"compression type {kind} (LZ4 1, ZSTD 2) is not served")
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(body, bytes_max + 1)
    except zlib.error as exc:
        raise RemotingError("BAD_MESSAGE", f"the compressed body cannot be inflated: {exc}") from None
    if len(out) > bytes_max or inflater.unconsumed_tail:
        raise RemotingError("BODY_TOO_LARGE", f"the body inflates beyond {bytes_max} bytes")
    if not inflater.eof:
        raise RemotingError("BAD_MESSAGE", "the compressed body is truncated")
    return out
