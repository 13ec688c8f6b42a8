"""Typed request and response headers: a command's ``extFields`` (all strings on the wire) as frozen
dataclasses, parsed with type and range checks, and back.

Each header class lists its ``FIELDS``: the Python attribute, the wire name (RocketMQ's Java field
name), the kind (``str``, ``int`` = Java int, ``long``, ``bool``), whether RocketMQ marks it
``@CFNotNull`` (required), and a range where a value outside it can only be garbage. ``parse(cls,
ext)`` raises ``RemotingError`` ``MISSING_FIELD`` or ``BAD_FIELD`` naming the wire field;
``to_ext(header)`` writes the strings Java's ``makeCustomHeaderToNet`` writes (``"true"``,
``"false"``, decimal integers; absent fields left out). Unknown ext fields are ignored, as Java does
(5.x clients add ``ns``, ``nsd``, ``bname``, ``oway``, ``lo``; signed requests ``AccessKey``,
``Signature``, ``SecurityToken``).

Parsing follows Java's ``Integer.parseInt`` / ``Long.parseLong`` (an optional sign and ASCII
digits; nothing else, no spaces) and ``Boolean.parseBoolean`` (``true`` in any case is true, any
other text false). SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE carry the send header with one-letter
names (``a`` = producerGroup ... ``n`` = brokerName): ``parse_send_header`` reads either form into
one ``SendMessageRequestHeader``; ``send_header_to_ext_v2`` writes the short form.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, Final, Literal, TypeVar

from broker.protocol.rocketmq.codes import RequestCode
from broker.protocol.rocketmq.errors import RemotingError

Kind = Literal["str", "int", "long", "bool"]
INT_MIN: Final = -(2**31)
INT_MAX: Final = 2**31 - 1
LONG_MIN: Final = -(2**63)
LONG_MAX: Final = 2**63 - 1
_RANGES: Final = {"int": (INT_MIN, INT_MAX), "long": (LONG_MIN, LONG_MAX)}


@dataclasses.dataclass(frozen=True, slots=True)
class Field:
    attr: str
    wire: str
    kind: Kind = "str"
    required: bool = False
    min: int | None = None
    max: int | None = None


def _f(attr: str, wire: str, kind: Kind = "str", required: bool = False, lo: int | None = None,
       hi: int | None = None) -> Field:
    return Field(attr, wire, kind, required, lo, hi)


def parse_value(field: Field, raw: str) -> Any:
    """One ext field's string as its typed value, or ``BAD_FIELD`` naming it."""
    kind = field.kind
    if kind == "str":
        return raw
    if kind == "bool":
        return raw.lower() == "true"
    # Java's parseInt/parseLong: an optional sign, then digits only (int() alone would also take
    # spaces, underscores and non-ASCII digits)
    if len(raw) > 20 or not raw.isascii() or not raw.lstrip("+-").isdigit() or raw[1:2] in ("+", "-"):
        raise RemotingError("BAD_FIELD", f"{field.wire} must be an integer, got {raw[:40]!r}")
    value = int(raw)
    lo, hi = _RANGES[kind]
    if field.min is not None:
        lo = max(lo, field.min)
    if field.max is not None:
        hi = min(hi, field.max)
    if not lo <= value <= hi:
        raise RemotingError("BAD_FIELD", f"{field.wire} = {value} is outside {lo}..{hi}")
    return value


def format_value(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


H = TypeVar("H")


def parse(cls: type[H], ext: Mapping[str, str] | None) -> H:
    """The header ``cls`` from a command's ext fields."""
    fields: tuple[Field, ...] = cls.FIELDS  # type: ignore[attr-defined]
    ext = ext or {}
    kwargs: dict[str, Any] = {}
    for field in fields:
        raw = ext.get(field.wire)
        if raw is None:
            if field.required:
                raise RemotingError("MISSING_FIELD", f"the header field {field.wire} is missing")
            continue
        kwargs[field.attr] = parse_value(field, raw)
    return cls(**kwargs)


def to_ext(header: Any) -> dict[str, str]:
    """A header's ext fields (strings), absent (None) fields left out."""
    out: dict[str, str] = {}
    for field in header.FIELDS:
        value = getattr(header, field.attr)
        if value is not None:
            out[field.wire] = format_value(value)
    return out


NAT: Final = 0  # lower bound of counts, ids and offsets that cannot be negative


# -- send -------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SendMessageRequestHeader:
    """SEND_MESSAGE (long names), SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE (``a``..``n``)."""

    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str | None = None
    reconsume_times: int | None = None
    unit_mode: bool | None = None
    max_reconsume_times: int | None = None
    batch: bool | None = None
    broker_name: str | None = None
    FIELDS: ClassVar = (
        _f("producer_group", "producerGroup", required=True),
        _f("topic", "topic", required=True),
        _f("default_topic", "defaultTopic", required=True),
        _f("default_topic_queue_nums", "defaultTopicQueueNums", "int", True),
        _f("queue_id", "queueId", "int", True, -1),
        _f("sys_flag", "sysFlag", "int", True),
        _f("born_timestamp", "bornTimestamp", "long", True),
        _f("flag", "flag", "int", True),
        _f("properties", "properties"),
        _f("reconsume_times", "reconsumeTimes", "int", lo=NAT),
        _f("unit_mode", "unitMode", "bool"),
        _f("max_reconsume_times", "maxReconsumeTimes", "int"),
        _f("batch", "batch", "bool"),
        _f("broker_name", "bname"),
    )


SEND_V2_NAMES: Final = dict(zip("abcdefghijklmn", (
    "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
    "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes", "batch",
    "bname"), strict=True))
"""SEND_MESSAGE_V2's one-letter field names and the long names they stand for."""
_SEND_V2_FIELDS: Final = tuple(
    dataclasses.replace(f, wire=short)
    for short, long_name in SEND_V2_NAMES.items()
    for f in SendMessageRequestHeader.FIELDS
    if f.wire == long_name
)
SEND_V2_CODES: Final = frozenset({RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
                                  RequestCode.SEND_REPLY_MESSAGE_V2})


def parse_send_header(code: int, ext: Mapping[str, str] | None) -> SendMessageRequestHeader:
    """The send header of a SEND_MESSAGE(_V2) / SEND_BATCH_MESSAGE / SEND_REPLY_MESSAGE(_V2)."""
    if code not in SEND_V2_CODES:
        return parse(SendMessageRequestHeader, ext)
    ext = ext or {}
    kwargs: dict[str, Any] = {}
    for field in _SEND_V2_FIELDS:
        raw = ext.get(field.wire)
        if raw is None:
            if field.required:
                long_name = SEND_V2_NAMES[field.wire]
                raise RemotingError("MISSING_FIELD", f"the header field {field.wire} ({long_name}) is missing")
            continue
        try:
            kwargs[field.attr] = parse_value(field, raw)
        except RemotingError as exc:
            raise RemotingError(exc.code, f"{exc.message} ({SEND_V2_NAMES[field.wire]})") from None
    return SendMessageRequestHeader(**kwargs)


def send_header_to_ext_v2(header: SendMessageRequestHeader) -> dict[str, str]:
    out: dict[str, str] = {}
    for field in _SEND_V2_FIELDS:
        value = getattr(header, field.attr)
        if value is not None:
            out[field.wire] = format_value(value)
    return out


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SendMessageResponseHeader:
    msg_id: str
    queue_id: int
    queue_offset: int
    transaction_id: str | None = None
    batch_uniq_id: str | None = None
    FIELDS: ClassVar = (
        _f("msg_id", "msgId", required=True),
        _f("queue_id", "queueId", "int", True),
        _f("queue_offset", "queueOffset", "long", True),
        _f("transaction_id", "transactionId"),
        _f("batch_uniq_id", "batchUniqId"),
    )


# -- pull -------------------------------------------------------------------------------------------
PULL_FLAG_COMMIT_OFFSET: Final = 0x1
PULL_FLAG_SUSPEND: Final = 0x2
PULL_FLAG_SUBSCRIPTION: Final = 0x4
PULL_FLAG_CLASS_FILTER: Final = 0x8
PULL_FLAG_LITE_PULL: Final = 0x10


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PullMessageRequestHeader:
    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int
    sys_flag: int
    commit_offset: int
    suspend_timeout_millis: int
    sub_version: int
    subscription: str | None = None
    expression_type: str | None = None
    max_msg_bytes: int | None = None
    request_source: int | None = None
    proxy_forward_client_id: str | None = None
    FIELDS: ClassVar = (
        _f("consumer_group", "consumerGroup", required=True),
        _f("topic", "topic", required=True),
        _f("queue_id", "queueId", "int", True, NAT),
        _f("queue_offset", "queueOffset", "long", True),
        _f("max_msg_nums", "maxMsgNums", "int", True),
        _f("sys_flag", "sysFlag", "int", True),
        _f("commit_offset", "commitOffset", "long", True),
        _f("suspend_timeout_millis", "suspendTimeoutMillis", "long", True, NAT),
        _f("subscription", "subscription"),
        _f("sub_version", "subVersion", "long", True),
        _f("expression_type", "expressionType"),
        _f("max_msg_bytes", "maxMsgBytes", "int"),
        _f("request_source", "requestSource", "int"),
        _f("proxy_forward_client_id", "proxyFrowardClientId"),  # sic: RocketMQ's spelling
    )

    @property
    def commit_offset_flag(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_COMMIT_OFFSET)

    @property
    def suspend(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_SUSPEND)

    @property
    def has_subscription(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_SUBSCRIPTION)

    @property
    def class_filter(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_CLASS_FILTER)

    @property
    def lite_pull(self) -> bool:
        return bool(self.sys_flag & PULL_FLAG_LITE_PULL)


def pull_sys_flag(*, commit_offset: bool, suspend: bool, subscription: bool, class_filter: bool = False,
                  lite_pull: bool = False) -> int:
    return ((PULL_FLAG_COMMIT_OFFSET if commit_offset else 0) | (PULL_FLAG_SUSPEND if suspend else 0)
            | (PULL_FLAG_SUBSCRIPTION if subscription else 0) | (PULL_FLAG_CLASS_FILTER if class_filter else 0)
            | (PULL_FLAG_LITE_PULL if lite_pull else 0))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PullMessageResponseHeader:
    suggest_which_broker_id: int
    next_begin_offset: int
    min_offset: int
    max_offset: int
    offset_delta: int | None = None
    topic_sys_flag: int | None = None
    group_sys_flag: int | None = None
    forbidden_type: int | None = None
    FIELDS: ClassVar = (
        _f("suggest_which_broker_id", "suggestWhichBrokerId", "long", True),
        _f("next_begin_offset", "nextBeginOffset", "long", True),
        _f("min_offset", "minOffset", "long", True),
        _f("max_offset", "maxOffset", "long", True),
        _f("offset_delta", "offsetDelta", "long"),
        _f("topic_sys_flag", "topicSysFlag", "int"),
        _f("group_sys_flag", "groupSysFlag", "int"),
        _f("forbidden_type", "forbiddenType", "int"),
    )


# -- clients and offsets ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class UnregisterClientRequestHeader:
    client_id: str
    producer_group: str | None = None
    consumer_group: str | None = None
    FIELDS: ClassVar = (
        _f("client_id", "clientID", required=True),
        _f("producer_group", "producerGroup"),
        _f("consumer_group", "consumerGroup"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupHeader:
    """GET_CONSUMER_LIST_BY_GROUP, NOTIFY_CONSUMER_IDS_CHANGED, GET_CONSUMER_CONNECTION_LIST."""

    consumer_group: str
    FIELDS: ClassVar = (_f("consumer_group", "consumerGroup", required=True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueryConsumerOffsetRequestHeader:
    consumer_group: str
    topic: str
    queue_id: int
    set_zero_if_not_found: bool | None = None
    FIELDS: ClassVar = (
        _f("consumer_group", "consumerGroup", required=True),
        _f("topic", "topic", required=True),
        _f("queue_id", "queueId", "int", True, NAT),
        _f("set_zero_if_not_found", "setZeroIfNotFound", "bool"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class UpdateConsumerOffsetRequestHeader:
    consumer_group: str
    topic: str
    queue_id: int
    commit_offset: int
    FIELDS: ClassVar = (
        _f("consumer_group", "consumerGroup", required=True),
        _f("topic", "topic", required=True),
        _f("queue_id", "queueId", "int", True, NAT),
        _f("commit_offset", "commitOffset", "long", True),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TopicQueueHeader:
    """GET_MAX_OFFSET (with ``committed``, 5.x), GET_MIN_OFFSET, GET_EARLIEST_MSG_STORETIME."""

    topic: str
    queue_id: int
    committed: bool | None = None
    FIELDS: ClassVar = (
        _f("topic", "topic", required=True),
        _f("queue_id", "queueId", "int", True, NAT),
        _f("committed", "committed", "bool"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SearchOffsetRequestHeader:
    topic: str
    queue_id: int
    timestamp: int
    boundary_type: str | None = None  # 5.x: "lower" (default) or "upper"
    FIELDS: ClassVar = (
        _f("topic", "topic", required=True),
        _f("queue_id", "queueId", "int", True, NAT),
        _f("timestamp", "timestamp", "long", True),
        _f("boundary_type", "boundaryType"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OffsetResponseHeader:
    """Answer of QUERY_CONSUMER_OFFSET, GET_MAX_OFFSET, GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP."""

    offset: int
    FIELDS: ClassVar = (_f("offset", "offset", "long", True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TimestampResponseHeader:
    """Answer of GET_EARLIEST_MSG_STORETIME."""

    timestamp: int
    FIELDS: ClassVar = (_f("timestamp", "timestamp", "long", True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerSendMsgBackRequestHeader:
    offset: int
    group: str
    delay_level: int
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool | None = None
    max_reconsume_times: int | None = None
    FIELDS: ClassVar = (
        _f("offset", "offset", "long", True),
        _f("group", "group", required=True),
        _f("delay_level", "delayLevel", "int", True),
        _f("origin_msg_id", "originMsgId"),
        _f("origin_topic", "originTopic"),
        _f("unit_mode", "unitMode", "bool"),
        _f("max_reconsume_times", "maxReconsumeTimes", "int"),
    )


# -- transactions -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EndTransactionRequestHeader:
    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    commit_or_rollback: int  # properties.TRANSACTION_COMMIT/ROLLBACK/NOT_TYPE
    msg_id: str
    topic: str | None = None
    from_transaction_check: bool | None = None
    transaction_id: str | None = None
    FIELDS: ClassVar = (
        _f("topic", "topic"),
        _f("producer_group", "producerGroup", required=True),
        _f("tran_state_table_offset", "tranStateTableOffset", "long", True),
        _f("commit_log_offset", "commitLogOffset", "long", True),
        _f("commit_or_rollback", "commitOrRollback", "int", True),
        _f("from_transaction_check", "fromTransactionCheck", "bool"),
        _f("msg_id", "msgId", required=True),
        _f("transaction_id", "transactionId"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CheckTransactionStateRequestHeader:
    tran_state_table_offset: int
    commit_log_offset: int
    topic: str | None = None
    msg_id: str | None = None
    transaction_id: str | None = None
    offset_msg_id: str | None = None
    FIELDS: ClassVar = (
        _f("topic", "topic"),
        _f("tran_state_table_offset", "tranStateTableOffset", "long", True),
        _f("commit_log_offset", "commitLogOffset", "long", True),
        _f("msg_id", "msgId"),
        _f("transaction_id", "transactionId"),
        _f("offset_msg_id", "offsetMsgId"),
    )


# -- message queries --------------------------------------------------------------------------------
UNIQUE_MSG_QUERY_FLAG: Final = "_UNIQUE_KEY_QUERY"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueryMessageRequestHeader:
    topic: str
    key: str
    max_num: int
    begin_timestamp: int
    end_timestamp: int
    unique_key_query: bool | None = None  # the extra ext field _UNIQUE_KEY_QUERY
    FIELDS: ClassVar = (
        _f("topic", "topic", required=True),
        _f("key", "key", required=True),
        _f("max_num", "maxNum", "int", True),
        _f("begin_timestamp", "beginTimestamp", "long", True),
        _f("end_timestamp", "endTimestamp", "long", True),
        _f("unique_key_query", UNIQUE_MSG_QUERY_FLAG, "bool"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueryMessageResponseHeader:
    index_last_update_timestamp: int
    index_last_update_phyoffset: int
    FIELDS: ClassVar = (
        _f("index_last_update_timestamp", "indexLastUpdateTimestamp", "long", True),
        _f("index_last_update_phyoffset", "indexLastUpdatePhyoffset", "long", True),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ViewMessageRequestHeader:
    offset: int
    topic: str | None = None
    FIELDS: ClassVar = (_f("topic", "topic"), _f("offset", "offset", "long", True))


# -- NameServer -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetRouteInfoRequestHeader:
    topic: str
    accept_standard_json_only: bool | None = None
    FIELDS: ClassVar = (
        _f("topic", "topic", required=True),
        _f("accept_standard_json_only", "acceptStandardJsonOnly", "bool"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeleteTopicFromNamesrvRequestHeader:
    topic: str
    cluster_name: str | None = None
    FIELDS: ClassVar = (_f("topic", "topic", required=True), _f("cluster_name", "clusterName"))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class KVConfigRequestHeader:
    """GET_KV_CONFIG, DELETE_KV_CONFIG (namespace, key) and PUT_KV_CONFIG (with value)."""

    namespace: str
    key: str
    value: str | None = None
    FIELDS: ClassVar = (
        _f("namespace", "namespace", required=True),
        _f("key", "key", required=True),
        _f("value", "value"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetKVConfigResponseHeader:
    value: str | None = None
    FIELDS: ClassVar = (_f("value", "value"),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NamespaceHeader:
    """GET_KVLIST_BY_NAMESPACE."""

    namespace: str
    FIELDS: ClassVar = (_f("namespace", "namespace", required=True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetTopicsByClusterRequestHeader:
    cluster: str
    FIELDS: ClassVar = (_f("cluster", "cluster", required=True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BrokerNameHeader:
    """WIPE_WRITE_PERM_OF_BROKER, ADD_WRITE_PERM_OF_BROKER."""

    broker_name: str
    FIELDS: ClassVar = (_f("broker_name", "brokerName", required=True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WipeWritePermOfBrokerResponseHeader:
    wipe_topic_count: int
    FIELDS: ClassVar = (_f("wipe_topic_count", "wipeTopicCount", "int", True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AddWritePermOfBrokerResponseHeader:
    add_topic_count: int
    FIELDS: ClassVar = (_f("add_topic_count", "addTopicCount", "int", True),)


# -- administration ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CreateTopicRequestHeader:
    topic: str
    default_topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_filter_type: str
    order: bool
    topic_sys_flag: int | None = None
    attributes: str | None = None
    force: bool | None = None
    FIELDS: ClassVar = (
        _f("topic", "topic", required=True),
        _f("default_topic", "defaultTopic", required=True),
        _f("read_queue_nums", "readQueueNums", "int", True, NAT),
        _f("write_queue_nums", "writeQueueNums", "int", True, NAT),
        _f("perm", "perm", "int", True, NAT),
        _f("topic_filter_type", "topicFilterType", required=True),
        _f("topic_sys_flag", "topicSysFlag", "int"),
        _f("order", "order", "bool", True),
        _f("attributes", "attributes"),
        _f("force", "force", "bool"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TopicHeader:
    """DELETE_TOPIC_IN_BROKER, GET_TOPIC_STATS_INFO, QUERY_TOPIC_CONSUME_BY_WHO, GET_TOPIC_CONFIG."""

    topic: str
    FIELDS: ClassVar = (_f("topic", "topic", required=True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeleteSubscriptionGroupRequestHeader:
    group_name: str
    remove_offset: bool | None = None  # 4.9
    clean_offset: bool | None = None  # 5.x
    FIELDS: ClassVar = (
        _f("group_name", "groupName", required=True),
        _f("remove_offset", "removeOffset", "bool"),
        _f("clean_offset", "cleanOffset", "bool"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetConsumeStatsRequestHeader:
    consumer_group: str
    topic: str | None = None
    FIELDS: ClassVar = (_f("consumer_group", "consumerGroup", required=True), _f("topic", "topic"))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetProducerConnectionListRequestHeader:
    producer_group: str
    FIELDS: ClassVar = (_f("producer_group", "producerGroup", required=True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetBrokerConfigResponseHeader:
    version: str
    FIELDS: ClassVar = (_f("version", "version", required=True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ResetOffsetRequestHeader:
    """INVOKE_BROKER_TO_RESET_OFFSET (and, broker to client, RESET_CONSUMER_CLIENT_OFFSET)."""

    topic: str
    group: str
    timestamp: int
    is_force: bool
    queue_id: int | None = None  # 5.x: -1 = every queue
    offset: int | None = None  # 5.x
    FIELDS: ClassVar = (
        _f("topic", "topic", required=True),
        _f("group", "group", required=True),
        _f("queue_id", "queueId", "int", lo=-1),
        _f("offset", "offset", "long"),
        _f("timestamp", "timestamp", "long", True),
        _f("is_force", "isForce", "bool", True),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TopicGroupHeader:
    """QUERY_CONSUME_TIME_SPAN (topic, group)."""

    topic: str
    group: str
    FIELDS: ClassVar = (_f("topic", "topic", required=True), _f("group", "group", required=True))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GroupHeader:
    """QUERY_TOPICS_BY_CONSUMER, GET_SUBSCRIPTIONGROUP_CONFIG (5.x)."""

    group: str
    FIELDS: ClassVar = (_f("group", "group", required=True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QuerySubscriptionByConsumerRequestHeader:
    group: str
    topic: str | None = None
    FIELDS: ClassVar = (_f("group", "group", required=True), _f("topic", "topic"))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetConsumerStatusRequestHeader:
    """INVOKE_BROKER_TO_GET_CONSUMER_STATUS, GET_CONSUMER_STATUS_FROM_CLIENT."""

    topic: str
    group: str
    client_addr: str | None = None
    FIELDS: ClassVar = (
        _f("topic", "topic", required=True),
        _f("group", "group", required=True),
        _f("client_addr", "clientAddr"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetConsumerRunningInfoRequestHeader:
    consumer_group: str
    client_id: str
    jstack_enable: bool | None = None
    FIELDS: ClassVar = (
        _f("consumer_group", "consumerGroup", required=True),
        _f("client_id", "clientId", required=True),
        _f("jstack_enable", "jstackEnable", "bool"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConsumeMessageDirectlyRequestHeader:
    consumer_group: str
    client_id: str | None = None
    msg_id: str | None = None
    broker_name: str | None = None
    topic: str | None = None
    FIELDS: ClassVar = (
        _f("consumer_group", "consumerGroup", required=True),
        _f("client_id", "clientId"),
        _f("msg_id", "msgId"),
        _f("broker_name", "brokerName"),
        _f("topic", "topic"),
    )


REQUEST_HEADERS: Final[dict[int, type]] = {
    RequestCode.SEND_MESSAGE: SendMessageRequestHeader,
    RequestCode.SEND_MESSAGE_V2: SendMessageRequestHeader,
    RequestCode.SEND_BATCH_MESSAGE: SendMessageRequestHeader,
    RequestCode.SEND_REPLY_MESSAGE: SendMessageRequestHeader,
    RequestCode.SEND_REPLY_MESSAGE_V2: SendMessageRequestHeader,
    RequestCode.PULL_MESSAGE: PullMessageRequestHeader,
    RequestCode.LITE_PULL_MESSAGE: PullMessageRequestHeader,
    RequestCode.UNREGISTER_CLIENT: UnregisterClientRequestHeader,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: ConsumerGroupHeader,
    RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: ConsumerGroupHeader,
    RequestCode.QUERY_CONSUMER_OFFSET: QueryConsumerOffsetRequestHeader,
    RequestCode.UPDATE_CONSUMER_OFFSET: UpdateConsumerOffsetRequestHeader,
    RequestCode.GET_MAX_OFFSET: TopicQueueHeader,
    RequestCode.GET_MIN_OFFSET: TopicQueueHeader,
    RequestCode.GET_EARLIEST_MSG_STORETIME: TopicQueueHeader,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: SearchOffsetRequestHeader,
    RequestCode.CONSUMER_SEND_MSG_BACK: ConsumerSendMsgBackRequestHeader,
    RequestCode.END_TRANSACTION: EndTransactionRequestHeader,
    RequestCode.CHECK_TRANSACTION_STATE: CheckTransactionStateRequestHeader,
    RequestCode.QUERY_MESSAGE: QueryMessageRequestHeader,
    RequestCode.VIEW_MESSAGE_BY_ID: ViewMessageRequestHeader,
    RequestCode.GET_ROUTEINFO_BY_TOPIC: GetRouteInfoRequestHeader,
    RequestCode.DELETE_TOPIC_IN_NAMESRV: DeleteTopicFromNamesrvRequestHeader,
    RequestCode.GET_KV_CONFIG: KVConfigRequestHeader,
    RequestCode.PUT_KV_CONFIG: KVConfigRequestHeader,
    RequestCode.DELETE_KV_CONFIG: KVConfigRequestHeader,
    RequestCode.GET_KVLIST_BY_NAMESPACE: NamespaceHeader,
    RequestCode.GET_TOPICS_BY_CLUSTER: GetTopicsByClusterRequestHeader,
    RequestCode.WIPE_WRITE_PERM_OF_BROKER: BrokerNameHeader,
    RequestCode.ADD_WRITE_PERM_OF_BROKER: BrokerNameHeader,
    RequestCode.UPDATE_AND_CREATE_TOPIC: CreateTopicRequestHeader,
    RequestCode.DELETE_TOPIC_IN_BROKER: TopicHeader,
    RequestCode.GET_TOPIC_STATS_INFO: TopicHeader,
    RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: TopicHeader,
    RequestCode.GET_TOPIC_CONFIG: TopicHeader,
    RequestCode.DELETE_SUBSCRIPTIONGROUP: DeleteSubscriptionGroupRequestHeader,
    RequestCode.GET_CONSUME_STATS: GetConsumeStatsRequestHeader,
    RequestCode.GET_CONSUMER_CONNECTION_LIST: ConsumerGroupHeader,
    RequestCode.GET_PRODUCER_CONNECTION_LIST: GetProducerConnectionListRequestHeader,
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: ResetOffsetRequestHeader,
    RequestCode.RESET_CONSUMER_CLIENT_OFFSET: ResetOffsetRequestHeader,
    RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS: GetConsumerStatusRequestHeader,
    RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT: GetConsumerStatusRequestHeader,
    RequestCode.QUERY_CONSUME_TIME_SPAN: TopicGroupHeader,
    RequestCode.QUERY_TOPICS_BY_CONSUMER: GroupHeader,
    RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG: GroupHeader,
    RequestCode.QUERY_SUBSCRIPTION_BY_CONSUMER: QuerySubscriptionByConsumerRequestHeader,
    RequestCode.GET_CONSUMER_RUNNING_INFO: GetConsumerRunningInfoRequestHeader,
    RequestCode.CONSUME_MESSAGE_DIRECTLY: ConsumeMessageDirectlyRequestHeader,
}
"""The header each request code carries (codes with a body only, or nothing: absent)."""


def parse_request_header(code: int, ext: Mapping[str, str] | None) -> Any:
    """The typed header of a request with ``code``; ``None`` for a code that carries none."""
    cls = REQUEST_HEADERS.get(code)
    if cls is None:
        return None
    if cls is SendMessageRequestHeader:
        return parse_send_header(code, ext)
    return parse(cls, ext)
