"""Typed request and response headers: a command's ``extFields`` (all strings on the wire) as frozen
dataclasses, parsed with type and range checks, and back. This module holds the producers' and
consumers' headers and the registry of every request code's header (``REQUEST_HEADERS``,
``parse_request_header``); the NameServer's and mqadmin's are in ``admin_headers``, the machinery
(``Field``, ``parse``, ``to_ext``) in ``header_fields``.

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
from typing import Any, ClassVar, Final

from broker.protocol.rocketmq.admin_headers import (
    BrokerNameHeader,
    CloneGroupOffsetRequestHeader,
    ConsumeMessageDirectlyRequestHeader,
    CreateTopicRequestHeader,
    DeleteSubscriptionGroupRequestHeader,
    DeleteTopicFromNamesrvRequestHeader,
    GetConsumerRunningInfoRequestHeader,
    GetConsumerStatusRequestHeader,
    GetConsumeStatsRequestHeader,
    GetProducerConnectionListRequestHeader,
    GetRouteInfoRequestHeader,
    GetTopicsByClusterRequestHeader,
    GroupHeader,
    KVConfigRequestHeader,
    NamespaceHeader,
    QuerySubscriptionByConsumerRequestHeader,
    ResetOffsetRequestHeader,
    TopicGroupHeader,
    TopicHeader,
)
from broker.protocol.rocketmq.codes import RequestCode
from broker.protocol.rocketmq.errors import RemotingError
from broker.protocol.rocketmq.header_fields import NAT, RANGES, Field, format_value, parse_value, spec
from broker.protocol.rocketmq.header_fields import parse as parse  # re-exported: headers.parse(cls, ext)
from broker.protocol.rocketmq.header_fields import to_ext as to_ext


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
        spec("producer_group", "producerGroup", required=True),
        spec("topic", "topic", required=True),
        spec("default_topic", "defaultTopic", required=True),
        spec("default_topic_queue_nums", "defaultTopicQueueNums", "int", True),
        spec("queue_id", "queueId", "int", True, -1),
        spec("sys_flag", "sysFlag", "int", True),
        spec("born_timestamp", "bornTimestamp", "long", True),
        spec("flag", "flag", "int", True),
        spec("properties", "properties"),
        spec("reconsume_times", "reconsumeTimes", "int", lo=NAT),
        spec("unit_mode", "unitMode", "bool"),
        spec("max_reconsume_times", "maxReconsumeTimes", "int"),
        spec("batch", "batch", "bool"),
        spec("broker_name", "bname"),
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


def _plan(field: Field) -> tuple[str, str, str, bool, int, int, Field]:
    """A field of the V2 send header as ``parse_send_header`` reads it: wire name, attribute, kind,
    required, the range ``parse_value`` checks (Java type's, narrowed by the field's), the field."""
    lo, hi = RANGES.get(field.kind, (0, 0))
    lo = lo if field.min is None else max(lo, field.min)
    hi = hi if field.max is None else min(hi, field.max)
    return field.wire, field.attr, field.kind, field.required, lo, hi, field


_SEND_V2_PLAN: Final = tuple(_plan(f) for f in _SEND_V2_FIELDS)
_PLAIN_DIGITS_MAX: Final = 18  # digits that always fit a long: read at once; longer ones by parse_value


def parse_send_header(code: int, ext: Mapping[str, str] | None) -> SendMessageRequestHeader:
    """The send header of a SEND_MESSAGE(_V2) / SEND_BATCH_MESSAGE / SEND_REPLY_MESSAGE(_V2).

    V2 (every message of the Java clients): each field read in line, ``parse_value``'s rules; a
    number that is not plain ASCII digits within range (a sign, garbage, out of range) goes to
    ``parse_value`` itself, which takes or refuses it (a test pins the two)."""
    if code not in SEND_V2_CODES:
        return parse(SendMessageRequestHeader, ext)
    get = (ext or {}).get
    kwargs: dict[str, Any] = {}
    for wire, attr, kind, required, lo, hi, field in _SEND_V2_PLAN:
        raw = get(wire)
        if raw is None:
            if required:
                raise RemotingError("MISSING_FIELD", f"the header field {wire} ({SEND_V2_NAMES[wire]}) is missing")
            continue
        if kind == "str":
            kwargs[attr] = raw
        elif kind == "bool":
            kwargs[attr] = raw.lower() == "true"
        elif raw.isascii() and raw.isdigit() and len(raw) <= _PLAIN_DIGITS_MAX and lo <= (value := int(raw)) <= hi:
            kwargs[attr] = value
        else:
            try:
                kwargs[attr] = parse_value(field, raw)
            except RemotingError as exc:
                raise RemotingError(exc.code, f"{exc.message} ({SEND_V2_NAMES[wire]})") from None
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
        spec("msg_id", "msgId", required=True),
        spec("queue_id", "queueId", "int", True),
        spec("queue_offset", "queueOffset", "long", True),
        spec("transaction_id", "transactionId"),
        spec("batch_uniq_id", "batchUniqId"),
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
        spec("consumer_group", "consumerGroup", required=True),
        spec("topic", "topic", required=True),
        spec("queue_id", "queueId", "int", True, NAT),
        spec("queue_offset", "queueOffset", "long", True),
        spec("max_msg_nums", "maxMsgNums", "int", True),
        spec("sys_flag", "sysFlag", "int", True),
        spec("commit_offset", "commitOffset", "long", True),
        spec("suspend_timeout_millis", "suspendTimeoutMillis", "long", True, NAT),
        spec("subscription", "subscription"),
        spec("sub_version", "subVersion", "long", True),
        spec("expression_type", "expressionType"),
        spec("max_msg_bytes", "maxMsgBytes", "int"),
        spec("request_source", "requestSource", "int"),
        spec("proxy_forward_client_id", "proxyFrowardClientId"),  # sic: RocketMQ's spelling
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
        spec("suggest_which_broker_id", "suggestWhichBrokerId", "long", True),
        spec("next_begin_offset", "nextBeginOffset", "long", True),
        spec("min_offset", "minOffset", "long", True),
        spec("max_offset", "maxOffset", "long", True),
        spec("offset_delta", "offsetDelta", "long"),
        spec("topic_sys_flag", "topicSysFlag", "int"),
        spec("group_sys_flag", "groupSysFlag", "int"),
        spec("forbidden_type", "forbiddenType", "int"),
    )


# -- clients and offsets ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class UnregisterClientRequestHeader:
    client_id: str
    producer_group: str | None = None
    consumer_group: str | None = None
    FIELDS: ClassVar = (
        spec("client_id", "clientID", required=True),
        spec("producer_group", "producerGroup"),
        spec("consumer_group", "consumerGroup"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupHeader:
    """GET_CONSUMER_LIST_BY_GROUP, NOTIFY_CONSUMER_IDS_CHANGED, GET_CONSUMER_CONNECTION_LIST."""

    consumer_group: str
    FIELDS: ClassVar = (spec("consumer_group", "consumerGroup", required=True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueryConsumerOffsetRequestHeader:
    consumer_group: str
    topic: str
    queue_id: int
    set_zero_if_not_found: bool | None = None
    FIELDS: ClassVar = (
        spec("consumer_group", "consumerGroup", required=True),
        spec("topic", "topic", required=True),
        spec("queue_id", "queueId", "int", True, NAT),
        spec("set_zero_if_not_found", "setZeroIfNotFound", "bool"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class UpdateConsumerOffsetRequestHeader:
    consumer_group: str
    topic: str
    queue_id: int
    commit_offset: int
    FIELDS: ClassVar = (
        spec("consumer_group", "consumerGroup", required=True),
        spec("topic", "topic", required=True),
        spec("queue_id", "queueId", "int", True, NAT),
        spec("commit_offset", "commitOffset", "long", True),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TopicQueueHeader:
    """GET_MAX_OFFSET (with ``committed``, 5.x), GET_MIN_OFFSET, GET_EARLIEST_MSG_STORETIME."""

    topic: str
    queue_id: int
    committed: bool | None = None
    FIELDS: ClassVar = (
        spec("topic", "topic", required=True),
        spec("queue_id", "queueId", "int", True, NAT),
        spec("committed", "committed", "bool"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SearchOffsetRequestHeader:
    topic: str
    queue_id: int
    timestamp: int
    boundary_type: str | None = None  # 5.x: "lower" (default) or "upper"
    FIELDS: ClassVar = (
        spec("topic", "topic", required=True),
        spec("queue_id", "queueId", "int", True, NAT),
        spec("timestamp", "timestamp", "long", True),
        spec("boundary_type", "boundaryType"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OffsetResponseHeader:
    """Answer of QUERY_CONSUMER_OFFSET, GET_MAX_OFFSET, GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP."""

    offset: int
    FIELDS: ClassVar = (spec("offset", "offset", "long", True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TimestampResponseHeader:
    """Answer of GET_EARLIEST_MSG_STORETIME."""

    timestamp: int
    FIELDS: ClassVar = (spec("timestamp", "timestamp", "long", True),)


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
        spec("offset", "offset", "long", True),
        spec("group", "group", required=True),
        spec("delay_level", "delayLevel", "int", True),
        spec("origin_msg_id", "originMsgId"),
        spec("origin_topic", "originTopic"),
        spec("unit_mode", "unitMode", "bool"),
        spec("max_reconsume_times", "maxReconsumeTimes", "int"),
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
        spec("topic", "topic"),
        spec("producer_group", "producerGroup", required=True),
        spec("tran_state_table_offset", "tranStateTableOffset", "long", True),
        spec("commit_log_offset", "commitLogOffset", "long", True),
        spec("commit_or_rollback", "commitOrRollback", "int", True),
        spec("from_transaction_check", "fromTransactionCheck", "bool"),
        spec("msg_id", "msgId", required=True),
        spec("transaction_id", "transactionId"),
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
        spec("topic", "topic"),
        spec("tran_state_table_offset", "tranStateTableOffset", "long", True),
        spec("commit_log_offset", "commitLogOffset", "long", True),
        spec("msg_id", "msgId"),
        spec("transaction_id", "transactionId"),
        spec("offset_msg_id", "offsetMsgId"),
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
        spec("topic", "topic", required=True),
        spec("key", "key", required=True),
        spec("max_num", "maxNum", "int", True),
        spec("begin_timestamp", "beginTimestamp", "long", True),
        spec("end_timestamp", "endTimestamp", "long", True),
        spec("unique_key_query", UNIQUE_MSG_QUERY_FLAG, "bool"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueryMessageResponseHeader:
    index_last_update_timestamp: int
    index_last_update_phyoffset: int
    FIELDS: ClassVar = (
        spec("index_last_update_timestamp", "indexLastUpdateTimestamp", "long", True),
        spec("index_last_update_phyoffset", "indexLastUpdatePhyoffset", "long", True),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ViewMessageRequestHeader:
    offset: int
    topic: str | None = None
    FIELDS: ClassVar = (spec("topic", "topic"), spec("offset", "offset", "long", True))


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
    RequestCode.CLONE_GROUP_OFFSET: CloneGroupOffsetRequestHeader,
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
