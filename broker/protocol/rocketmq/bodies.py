"""The JSON bodies of the remoting protocol, as frozen dataclasses with fastjson's member names.

``encode(obj)`` gives the bytes fastjson writes for the Java class of the same name (4.9.8's fields;
5.x clients read them, filling their newer fields with defaults); ``decode(cls, raw)`` reads what
4.9.x and 5.x clients send (newer members ignored), bounded by ``fastjson.loads``. Collections keep
the order given: Java writes ``HashSet`` and ``HashMap`` in its iteration order, and the clients do
not care. ``standard_json=True`` writes ``BrokerData.brokerAddrs`` with quoted keys (what a 5.x
client asks for with ``acceptStandardJsonOnly``).

Which request or answer carries which body: docs/REMOTING.md.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, ClassVar, Final, TypeVar

from broker.protocol.rocketmq import fastjson
from broker.protocol.rocketmq.errors import RemotingError
from broker.protocol.rocketmq.jsonbean import (
    BOOL,
    DOUBLE,
    INT,
    LONG,
    STR,
    bean_map_of,
    bean_of,
    decode_bean,
    encode_bean,
    enum_of,
    list_of,
    long_map_of,
    map_of,
)

T = TypeVar("T")

CONSUME_TYPES: Final = frozenset({"CONSUME_ACTIVELY", "CONSUME_PASSIVELY", "CONSUME_POP"})
MESSAGE_MODELS: Final = frozenset({"BROADCASTING", "CLUSTERING"})
CONSUME_FROM: Final = frozenset({
    "CONSUME_FROM_LAST_OFFSET", "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
    "CONSUME_FROM_MIN_OFFSET", "CONSUME_FROM_MAX_OFFSET", "CONSUME_FROM_FIRST_OFFSET", "CONSUME_FROM_TIMESTAMP",
})
LANGUAGES: Final = frozenset({"JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO",
                              "PHP", "OMS", "RUST"})
TOPIC_FILTER_TYPES: Final = frozenset({"SINGLE_TAG", "MULTI_TAG"})
EXPRESSION_TAG: Final = "TAG"
EXPRESSION_SQL92: Final = "SQL92"


def encode(obj: Any, *, standard_json: bool = False) -> bytes:
    """The body's bytes as fastjson writes them."""
    return fastjson.dumps_bytes(encode_bean(obj, standard_json))


def decode(cls: type[T], raw: bytes, *, bytes_max: int = fastjson.JSON_BYTES_MAX) -> T:
    """A body of type ``cls``; ``RemotingError`` BAD_JSON / BAD_BODY on anything else."""
    value: T = decode_bean(cls, fastjson.loads(raw, bytes_max=bytes_max), cls.__name__)
    return value


# -- queues and routes ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int
    JSON: ClassVar = (("topic", "topic", STR), ("broker_name", "brokerName", STR), ("queue_id", "queueId", INT))


MQ: Final = bean_of(MessageQueue)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0
    JSON: ClassVar = (
        ("broker_name", "brokerName", STR), ("read_queue_nums", "readQueueNums", INT),
        ("write_queue_nums", "writeQueueNums", INT), ("perm", "perm", INT), ("topic_sys_flag", "topicSysFlag", INT),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BrokerData:
    """``broker_addrs``: broker id -> address; id 0 is the master (our group's leader)."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str]
    zone_name: str | None = None
    enable_acting_master: bool | None = None
    JSON: ClassVar = (
        ("cluster", "cluster", STR), ("broker_name", "brokerName", STR),
        ("broker_addrs", "brokerAddrs", long_map_of(STR)), ("zone_name", "zoneName", STR),
        ("enable_acting_master", "enableActingMaster", BOOL),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TopicRouteData:
    queue_datas: tuple[QueueData, ...] = ()
    broker_datas: tuple[BrokerData, ...] = ()
    order_topic_conf: str | None = None
    filter_server_table: dict[str, tuple[str, ...]] | None = None  # 4.9.x NameServers send {}
    JSON: ClassVar = (
        ("order_topic_conf", "orderTopicConf", STR), ("queue_datas", "queueDatas", list_of(bean_of(QueueData))),
        ("broker_datas", "brokerDatas", list_of(bean_of(BrokerData))),
        ("filter_server_table", "filterServerTable", map_of(list_of(STR))),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClusterInfo:
    broker_addr_table: dict[str, BrokerData] = dataclasses.field(default_factory=dict)
    cluster_addr_table: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    JSON: ClassVar = (
        ("broker_addr_table", "brokerAddrTable", map_of(bean_of(BrokerData))),
        ("cluster_addr_table", "clusterAddrTable", map_of(list_of(STR))),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TopicList:
    topic_list: tuple[str, ...] = ()
    broker_addr: str | None = None
    JSON: ClassVar = (("topic_list", "topicList", list_of(STR)), ("broker_addr", "brokerAddr", STR))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GroupList:
    group_list: tuple[str, ...] = ()
    JSON: ClassVar = (("group_list", "groupList", list_of(STR)),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class KVTable:
    table: dict[str, str] = dataclasses.field(default_factory=dict)
    JSON: ClassVar = (("table", "table", map_of(STR)),)


# -- clients ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SubscriptionData:
    topic: str
    sub_string: str
    tags_set: tuple[str, ...] = ()
    code_set: tuple[int, ...] = ()
    sub_version: int = 0
    expression_type: str = EXPRESSION_TAG
    class_filter_mode: bool = False
    filter_class_source: str | None = None
    JSON: ClassVar = (
        ("class_filter_mode", "classFilterMode", BOOL), ("topic", "topic", STR), ("sub_string", "subString", STR),
        ("tags_set", "tagsSet", list_of(STR)), ("code_set", "codeSet", list_of(INT)),
        ("sub_version", "subVersion", LONG), ("expression_type", "expressionType", STR),
        ("filter_class_source", "filterClassSource", STR),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerData:
    group_name: str
    consume_type: str | None = None
    message_model: str | None = None
    consume_from_where: str | None = None
    subscription_data_set: tuple[SubscriptionData, ...] = ()
    unit_mode: bool = False
    JSON: ClassVar = (
        ("group_name", "groupName", STR), ("consume_type", "consumeType", enum_of(CONSUME_TYPES)),
        ("message_model", "messageModel", enum_of(MESSAGE_MODELS)),
        ("consume_from_where", "consumeFromWhere", enum_of(CONSUME_FROM)),
        ("subscription_data_set", "subscriptionDataSet", list_of(bean_of(SubscriptionData))),
        ("unit_mode", "unitMode", BOOL),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProducerData:
    group_name: str
    JSON: ClassVar = (("group_name", "groupName", STR),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatData:
    client_id: str
    producer_data_set: tuple[ProducerData, ...] = ()
    consumer_data_set: tuple[ConsumerData, ...] = ()
    heartbeat_fingerprint: int | None = None  # 5.x
    without_sub: bool | None = None  # 5.x
    JSON: ClassVar = (
        ("client_id", "clientID", STR), ("producer_data_set", "producerDataSet", list_of(bean_of(ProducerData))),
        ("consumer_data_set", "consumerDataSet", list_of(bean_of(ConsumerData))),
        ("heartbeat_fingerprint", "heartbeatFingerprint", INT), ("without_sub", "withoutSub", BOOL),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Connection:
    client_id: str
    client_addr: str
    language: str
    version: int
    JSON: ClassVar = (
        ("client_id", "clientId", STR), ("client_addr", "clientAddr", STR),
        ("language", "language", enum_of(LANGUAGES)), ("version", "version", INT),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerConnection:
    connection_set: tuple[Connection, ...] = ()
    subscription_table: dict[str, SubscriptionData] = dataclasses.field(default_factory=dict)
    consume_type: str | None = None
    message_model: str | None = None
    consume_from_where: str | None = None
    JSON: ClassVar = (
        ("connection_set", "connectionSet", list_of(bean_of(Connection))),
        ("subscription_table", "subscriptionTable", map_of(bean_of(SubscriptionData))),
        ("consume_type", "consumeType", enum_of(CONSUME_TYPES)),
        ("message_model", "messageModel", enum_of(MESSAGE_MODELS)),
        ("consume_from_where", "consumeFromWhere", enum_of(CONSUME_FROM)),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProducerConnection:
    connection_set: tuple[Connection, ...] = ()
    JSON: ClassVar = (("connection_set", "connectionSet", list_of(bean_of(Connection))),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetConsumerListByGroupResponseBody:
    consumer_id_list: tuple[str, ...] = ()
    JSON: ClassVar = (("consumer_id_list", "consumerIdList", list_of(STR)),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LockBatchRequestBody:
    """LOCK_BATCH_MQ's body; UNLOCK_BATCH_MQ's has the same members (``UnlockBatchRequestBody``)."""

    consumer_group: str
    client_id: str
    mq_set: tuple[MessageQueue, ...] = ()
    only_this_broker: bool | None = None  # 5.x
    JSON: ClassVar = (
        ("consumer_group", "consumerGroup", STR), ("client_id", "clientId", STR), ("mq_set", "mqSet", list_of(MQ)),
        ("only_this_broker", "onlyThisBroker", BOOL),
    )


UnlockBatchRequestBody = LockBatchRequestBody


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LockBatchResponseBody:
    lock_ok_mq_set: tuple[MessageQueue, ...] = ()
    JSON: ClassVar = (("lock_ok_mq_set", "lockOKMQSet", list_of(MQ)),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CheckClientRequestBody:
    client_id: str
    group: str
    subscription_data: SubscriptionData
    namespace: str | None = None  # 5.x
    JSON: ClassVar = (
        ("client_id", "clientId", STR), ("group", "group", STR),
        ("subscription_data", "subscriptionData", bean_of(SubscriptionData)), ("namespace", "namespace", STR),
    )


# -- statistics -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OffsetWrapper:
    broker_offset: int
    consumer_offset: int
    last_timestamp: int = 0
    pull_offset: int | None = None  # 5.x
    JSON: ClassVar = (
        ("broker_offset", "brokerOffset", LONG), ("consumer_offset", "consumerOffset", LONG),
        ("pull_offset", "pullOffset", LONG), ("last_timestamp", "lastTimestamp", LONG),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConsumeStats:
    """GET_CONSUME_STATS's answer: ``offset_table`` as (queue, offsets) pairs."""

    offset_table: tuple[tuple[MessageQueue, OffsetWrapper], ...] = ()
    consume_tps: float = 0.0
    JSON: ClassVar = (
        ("offset_table", "offsetTable", bean_map_of(MessageQueue, bean_of(OffsetWrapper))),
        ("consume_tps", "consumeTps", DOUBLE),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TopicOffset:
    min_offset: int
    max_offset: int
    last_update_timestamp: int = 0
    JSON: ClassVar = (
        ("min_offset", "minOffset", LONG), ("max_offset", "maxOffset", LONG),
        ("last_update_timestamp", "lastUpdateTimestamp", LONG),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TopicStatsTable:
    offset_table: tuple[tuple[MessageQueue, TopicOffset], ...] = ()
    JSON: ClassVar = (("offset_table", "offsetTable", bean_map_of(MessageQueue, bean_of(TopicOffset))),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ResetOffsetBody:
    """INVOKE_BROKER_TO_RESET_OFFSET's answer (and RESET_CONSUMER_CLIENT_OFFSET's request body)."""

    offset_table: tuple[tuple[MessageQueue, int], ...] = ()
    JSON: ClassVar = (("offset_table", "offsetTable", bean_map_of(MessageQueue, LONG)),)


def human_time(ms: int, tz: datetime.tzinfo | None = None) -> str:
    """RocketMQ's ``timeMillisToHumanString2``-style text: ``2023-11-14#22:13:25:000``, local time
    unless ``tz`` is given."""
    t = datetime.datetime.fromtimestamp(ms / 1000, tz or datetime.datetime.now().astimezone().tzinfo)
    return f"{t:%Y-%m-%d#%H:%M:%S}:{ms % 1000:03d}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueTimeSpan:
    message_queue: MessageQueue
    min_time_stamp: int
    max_time_stamp: int
    consume_time_stamp: int
    delay_time: int
    min_time_stamp_str: str | None = None
    max_time_stamp_str: str | None = None
    consume_time_stamp_str: str | None = None
    JSON: ClassVar = (
        ("message_queue", "messageQueue", MQ), ("min_time_stamp", "minTimeStamp", LONG),
        ("max_time_stamp", "maxTimeStamp", LONG), ("consume_time_stamp", "consumeTimeStamp", LONG),
        ("delay_time", "delayTime", LONG), ("min_time_stamp_str", "minTimeStampStr", STR),
        ("max_time_stamp_str", "maxTimeStampStr", STR), ("consume_time_stamp_str", "consumeTimeStampStr", STR),
    )

    @classmethod
    def of(cls, mq: MessageQueue, min_ms: int, max_ms: int, consume_ms: int, delay_ms: int,
           tz: datetime.tzinfo | None = None) -> QueueTimeSpan:
        """With the three ``...Str`` members Java derives from the timestamps."""
        return cls(message_queue=mq, min_time_stamp=min_ms, max_time_stamp=max_ms, consume_time_stamp=consume_ms,
                   delay_time=delay_ms, min_time_stamp_str=human_time(min_ms, tz),
                   max_time_stamp_str=human_time(max_ms, tz), consume_time_stamp_str=human_time(consume_ms, tz))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueryConsumeTimeSpanBody:
    consume_time_span_set: tuple[QueueTimeSpan, ...] = ()
    JSON: ClassVar = (("consume_time_span_set", "consumeTimeSpanSet", list_of(bean_of(QueueTimeSpan))),)


# -- topic and group configuration ------------------------------------------------------------------
PERM_PRIORITY: Final = 0x8
PERM_READ: Final = 0x4
PERM_WRITE: Final = 0x2
PERM_INHERIT: Final = 0x1


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict[str, str] | None = None  # 5.x
    JSON: ClassVar = (
        ("topic_name", "topicName", STR), ("read_queue_nums", "readQueueNums", INT),
        ("write_queue_nums", "writeQueueNums", INT), ("perm", "perm", INT),
        ("topic_filter_type", "topicFilterType", enum_of(TOPIC_FILTER_TYPES)),
        ("topic_sys_flag", "topicSysFlag", INT), ("order", "order", BOOL), ("attributes", "attributes", map_of(STR)),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DataVersion:
    timestamp: int
    counter: int
    state_version: int | None = None  # 5.x
    JSON: ClassVar = (("timestamp", "timestamp", LONG), ("counter", "counter", LONG),
                      ("state_version", "stateVersion", LONG))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TopicConfigSerializeWrapper:
    """GET_ALL_TOPIC_CONFIG's answer."""

    topic_config_table: dict[str, TopicConfig]
    data_version: DataVersion
    JSON: ClassVar = (
        ("topic_config_table", "topicConfigTable", map_of(bean_of(TopicConfig))),
        ("data_version", "dataVersion", bean_of(DataVersion)),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SubscriptionGroupConfig:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP's body (4.9.8's members; 5.x adds more, read and ignored)."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    consume_message_orderly: bool | None = None  # 5.x
    JSON: ClassVar = (
        ("group_name", "groupName", STR), ("consume_enable", "consumeEnable", BOOL),
        ("consume_from_min_enable", "consumeFromMinEnable", BOOL),
        ("consume_broadcast_enable", "consumeBroadcastEnable", BOOL),
        ("retry_queue_nums", "retryQueueNums", INT), ("retry_max_times", "retryMaxTimes", INT),
        ("broker_id", "brokerId", LONG), ("which_broker_when_consume_slowly", "whichBrokerWhenConsumeSlowly", LONG),
        ("notify_consumer_ids_changed_enable", "notifyConsumerIdsChangedEnable", BOOL),
        ("consume_message_orderly", "consumeMessageOrderly", BOOL),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SubscriptionGroupWrapper:
    """GET_ALL_SUBSCRIPTIONGROUP_CONFIG's answer."""

    subscription_group_table: dict[str, SubscriptionGroupConfig]
    data_version: DataVersion
    JSON: ClassVar = (
        ("subscription_group_table", "subscriptionGroupTable", map_of(bean_of(SubscriptionGroupConfig))),
        ("data_version", "dataVersion", bean_of(DataVersion)),
    )


# -- properties text (GET_BROKER_CONFIG, UPDATE_BROKER_CONFIG, GET/UPDATE_NAMESRV_CONFIG) -------------
def encode_properties_text(props: dict[str, str]) -> bytes:
    """``key=value`` lines, as ``MixAll.properties2String`` writes them (UTF-8)."""
    return "".join(f"{k}={v}\n" for k, v in props.items()).encode("utf-8")


def decode_properties_text(raw: bytes, entries_max: int = 4096) -> dict[str, str]:
    """``key=value`` lines (``#`` comments and blank lines skipped); BAD_BODY beyond ``entries_max``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RemotingError("BAD_BODY", "the properties text is not UTF-8") from None
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
        if len(out) > entries_max:
            raise RemotingError("BAD_BODY", f"more than {entries_max} properties")
    return out
