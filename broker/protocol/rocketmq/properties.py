"""Message properties as RocketMQ encodes them, their names, the sysFlag bits and tag hash codes.

Properties travel as one string: ``name \\u0001 value \\u0002 name \\u0001 value ...`` (4.9.x leaves
the last ``\\u0002`` out, 5.x writes it; readers accept both). Reading follows Java's
``string2messageProperties``: an entry with an empty name or an empty value, or without a
``\\u0001``, is skipped; a name seen twice keeps its last value.

A tag's hash code is Java's ``String.hashCode`` over UTF-16 code units, as a signed 32-bit int:
what the consume queue stores and what ``SubscriptionData.codeSet`` holds. A message without tags
has tag code 0; SQL92 subscriptions carry no codes (the broker evaluates the expression).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Mapping
from operator import methodcaller
from typing import Final

from broker.protocol.rocketmq.errors import RemotingError

NAME_VALUE_SEPARATOR: Final = "\u0001"
PROPERTY_SEPARATOR: Final = "\u0002"
_SPLIT_ENTRY: Final = methodcaller("split", NAME_VALUE_SEPARATOR, 1)
KEY_SEPARATOR: Final = " "
PROPERTIES_BYTES_MAX: Final = 32767
"""The properties of one message in the binary layouts (a signed 16-bit length)."""
PROPERTIES_ENTRIES_MAX: Final = 1024

# -- names (MessageConst) ---------------------------------------------------------------------------
KEYS: Final = "KEYS"
TAGS: Final = "TAGS"
WAIT_STORE_MSG_OK: Final = "WAIT"
DELAY: Final = "DELAY"
RETRY_TOPIC: Final = "RETRY_TOPIC"
REAL_TOPIC: Final = "REAL_TOPIC"
REAL_QID: Final = "REAL_QID"
TRAN_MSG: Final = "TRAN_MSG"
PGROUP: Final = "PGROUP"
MIN_OFFSET: Final = "MIN_OFFSET"
MAX_OFFSET: Final = "MAX_OFFSET"
BUYER_ID: Final = "BUYER_ID"
ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
TRANSFER_FLAG: Final = "TRANSFER_FLAG"
CORRECTION_FLAG: Final = "CORRECTION_FLAG"
MQ2_FLAG: Final = "MQ2_FLAG"
RECONSUME_TIME: Final = "RECONSUME_TIME"
MSG_REGION: Final = "MSG_REGION"
TRACE_ON: Final = "TRACE_ON"
UNIQ_KEY: Final = "UNIQ_KEY"
EXTEND_UNIQ_INFO: Final = "EXTEND_UNIQ_INFO"
MAX_RECONSUME_TIMES: Final = "MAX_RECONSUME_TIMES"
CONSUME_START_TIME: Final = "CONSUME_START_TIME"
INNER_NUM: Final = "INNER_NUM"
INNER_BASE: Final = "INNER_BASE"
TRAN_PREPARED_QUEUE_OFFSET: Final = "TRAN_PREPARED_QUEUE_OFFSET"
TRANSACTION_ID: Final = "__transactionId__"
TRANSACTION_CHECK_TIMES: Final = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY_TIME_IN_SECONDS: Final = "CHECK_IMMUNITY_TIME_IN_SECONDS"
INSTANCE_ID: Final = "INSTANCE_ID"
CORRELATION_ID: Final = "CORRELATION_ID"
REPLY_TO_CLIENT: Final = "REPLY_TO_CLIENT"
TTL: Final = "TTL"
ARRIVE_TIME: Final = "ARRIVE_TIME"
PUSH_REPLY_TIME: Final = "PUSH_REPLY_TIME"
CLUSTER: Final = "CLUSTER"
MSG_TYPE: Final = "MSG_TYPE"
SHARDING_KEY: Final = "__SHARDINGKEY"
START_DELIVER_TIME: Final = "__STARTDELIVERTIME"
TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC: Final = "TIMER_DELAY_SEC"
TIMER_DELAY_MS: Final = "TIMER_DELAY_MS"
TIMER_ENQUEUE_MS: Final = "TIMER_ENQUEUE_MS"
TIMER_DEQUEUE_MS: Final = "TIMER_DEQUEUE_MS"
TIMER_ROLL_TIMES: Final = "TIMER_ROLL_TIMES"
TIMER_OUT_MS: Final = "TIMER_OUT_MS"
TIMER_DEL_UNIQKEY: Final = "TIMER_DEL_UNIQKEY"
TIMER_DELAY_LEVEL: Final = "TIMER_DELAY_LEVEL"
BORN_HOST: Final = "__BORNHOST"
BORN_TIMESTAMP: Final = "BORN_TIMESTAMP"
DLQ_ORIGIN_TOPIC: Final = "DLQ_ORIGIN_TOPIC"
DLQ_ORIGIN_MESSAGE_ID: Final = "DLQ_ORIGIN_MESSAGE_ID"
CRC32: Final = "__CRC32#"

SYSTEM_PROPERTIES: Final = frozenset({
    TRACE_ON, MSG_REGION, KEYS, TAGS, WAIT_STORE_MSG_OK, DELAY, RETRY_TOPIC, REAL_TOPIC, REAL_QID,
    TRAN_MSG, PGROUP, MIN_OFFSET, MAX_OFFSET, BUYER_ID, ORIGIN_MESSAGE_ID, TRANSFER_FLAG,
    CORRECTION_FLAG, MQ2_FLAG, RECONSUME_TIME, UNIQ_KEY, MAX_RECONSUME_TIMES, CONSUME_START_TIME,
    TRAN_PREPARED_QUEUE_OFFSET, EXTEND_UNIQ_INFO, INSTANCE_ID, CORRELATION_ID, REPLY_TO_CLIENT, TTL,
    ARRIVE_TIME, PUSH_REPLY_TIME, CLUSTER, MSG_TYPE, TIMER_DELAY_MS, TIMER_DELAY_SEC, TIMER_DELIVER_MS,
    TIMER_ENQUEUE_MS, TIMER_DEQUEUE_MS, TIMER_ROLL_TIMES, TIMER_OUT_MS, TIMER_DEL_UNIQKEY,
    TIMER_DELAY_LEVEL, BORN_HOST, BORN_TIMESTAMP, DLQ_ORIGIN_TOPIC, DLQ_ORIGIN_MESSAGE_ID, CRC32,
})
"""Names a user may not set with ``putUserProperty`` (RocketMQ's reserved set)."""

# -- sysFlag (MessageSysFlag) -----------------------------------------------------------------------
COMPRESSED_FLAG: Final = 0x1
MULTI_TAGS_FLAG: Final = 0x2
TRANSACTION_NOT_TYPE: Final = 0
TRANSACTION_PREPARED_TYPE: Final = 0x4
TRANSACTION_COMMIT_TYPE: Final = 0x8
TRANSACTION_ROLLBACK_TYPE: Final = 0xC
BORNHOST_V6_FLAG: Final = 0x10
STOREHOSTADDRESS_V6_FLAG: Final = 0x20
NEED_UNWRAP_FLAG: Final = 0x40
INNER_BATCH_FLAG: Final = 0x80
COMPRESSION_TYPE_MASK: Final = 0x700
COMPRESSION_LZ4_TYPE: Final = 0x100
COMPRESSION_ZSTD_TYPE: Final = 0x200
COMPRESSION_ZLIB_TYPE: Final = 0x300


def transaction_type(sys_flag: int) -> int:
    """One of TRANSACTION_NOT/PREPARED/COMMIT/ROLLBACK_TYPE."""
    return sys_flag & TRANSACTION_ROLLBACK_TYPE


def with_transaction_type(sys_flag: int, kind: int) -> int:
    return (sys_flag & ~TRANSACTION_ROLLBACK_TYPE) | kind


def compression_type(sys_flag: int) -> int:
    """0 (4.9.x, meaning zlib) or 1 LZ4, 2 ZSTD, 3 ZLIB (5.x) — meaningful with COMPRESSED_FLAG."""
    return (sys_flag & COMPRESSION_TYPE_MASK) >> 8


# -- the properties string --------------------------------------------------------------------------
def encode_properties(props: Mapping[str, str], *, trailing_separator: bool = False) -> str:
    """``props`` as one string (``trailing_separator``: 5.x style)."""
    if not props:
        return ""
    text = PROPERTY_SEPARATOR.join(f"{k}{NAME_VALUE_SEPARATOR}{v}" for k, v in props.items())
    return text + PROPERTY_SEPARATOR if trailing_separator else text


def decode_properties(text: str, entries_max: int = PROPERTIES_ENTRIES_MAX) -> dict[str, str]:
    """The properties map of ``text`` (Java's reading rules, see the module doc); more than
    ``entries_max`` entries is ``BAD_PROPERTIES``."""
    props: dict[str, str] = {}
    if not text:
        return props
    segments = text.split(PROPERTY_SEPARATOR)
    if len(segments) > entries_max + 1:
        raise RemotingError("BAD_PROPERTIES", f"more than {entries_max} properties")
    # The usual text — every entry ``name \u0001 value`` with both non-empty (no separator next to
    # another, none at either end; 5.x's final property separator allowed) — is split in C; an entry
    # without a name-value separator (ValueError in dict()) and anything else is read by the loop
    # below. The same map, in the same order, either way.
    if (NAME_VALUE_SEPARATOR + PROPERTY_SEPARATOR not in text and PROPERTY_SEPARATOR + NAME_VALUE_SEPARATOR not in text
            and not text.startswith(NAME_VALUE_SEPARATOR) and not text.endswith(NAME_VALUE_SEPARATOR)):
        try:
            props = dict(map(_SPLIT_ENTRY, segments[:-1] if not segments[-1] else segments))
        except ValueError:
            props = {}
        else:
            if len(props) > entries_max:
                raise RemotingError("BAD_PROPERTIES", f"more than {entries_max} properties")
            return props
    for segment in segments:
        i = segment.find(NAME_VALUE_SEPARATOR)
        if 0 < i < len(segment) - 1:
            props[segment[:i]] = segment[i + 1:]
    if len(props) > entries_max:
        raise RemotingError("BAD_PROPERTIES", f"more than {entries_max} properties")
    return props


def decode_properties_bytes(raw: bytes | memoryview, entries_max: int = PROPERTIES_ENTRIES_MAX) -> dict[str, str]:
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise RemotingError("BAD_PROPERTIES", "the properties are not UTF-8") from None
    return decode_properties(text, entries_max)


def keys_of(props: Mapping[str, str]) -> list[str]:
    """The message's keys (KEYS, space separated), empty ones dropped."""
    return [k for k in props.get(KEYS, "").split(KEY_SEPARATOR) if k]


# -- tags -------------------------------------------------------------------------------------------
_UTF16_NATIVE: Final = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: h = 31*h + c over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    for unit in array("H", text.encode(_UTF16_NATIVE, "surrogatepass")):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """The tag code a broker stores for a message with ``tags`` (0 without tags)."""
    return java_string_hash(tags) if tags else 0


SUB_ALL: Final = "*"


def subscription_tags(expression: str | None) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """A TAG subscription's tags and their codes, as the clients build them (``a || b``);
    ``*`` or empty: no tags (every message)."""
    if not expression or expression.strip() == SUB_ALL:
        return (), ()
    tags: list[str] = []
    for part in expression.split("||"):
        tag = part.strip()
        if tag and tag not in tags:
            tags.append(tag)
    return tuple(tags), tuple(java_string_hash(t) for t in tags)
