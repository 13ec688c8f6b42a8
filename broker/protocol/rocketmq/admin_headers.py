"""Headers of the NameServer's and the administration requests (mqadmin): typed ``extFields``,
read with ``header_fields.parse`` (see ``headers`` for the conventions)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from broker.protocol.rocketmq.header_fields import NAT, spec


# -- NameServer -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetRouteInfoRequestHeader:
    topic: str
    accept_standard_json_only: bool | None = None
    FIELDS: ClassVar = (
        spec("topic", "topic", required=True),
        spec("accept_standard_json_only", "acceptStandardJsonOnly", "bool"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeleteTopicFromNamesrvRequestHeader:
    topic: str
    cluster_name: str | None = None
    FIELDS: ClassVar = (spec("topic", "topic", required=True), spec("cluster_name", "clusterName"))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class KVConfigRequestHeader:
    """GET_KV_CONFIG, DELETE_KV_CONFIG (namespace, key) and PUT_KV_CONFIG (with value)."""

    namespace: str
    key: str
    value: str | None = None
    FIELDS: ClassVar = (
        spec("namespace", "namespace", required=True),
        spec("key", "key", required=True),
        spec("value", "value"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetKVConfigResponseHeader:
    value: str | None = None
    FIELDS: ClassVar = (spec("value", "value"),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NamespaceHeader:
    """GET_KVLIST_BY_NAMESPACE."""

    namespace: str
    FIELDS: ClassVar = (spec("namespace", "namespace", required=True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetTopicsByClusterRequestHeader:
    cluster: str
    FIELDS: ClassVar = (spec("cluster", "cluster", required=True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BrokerNameHeader:
    """WIPE_WRITE_PERM_OF_BROKER, ADD_WRITE_PERM_OF_BROKER."""

    broker_name: str
    FIELDS: ClassVar = (spec("broker_name", "brokerName", required=True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WipeWritePermOfBrokerResponseHeader:
    wipe_topic_count: int
    FIELDS: ClassVar = (spec("wipe_topic_count", "wipeTopicCount", "int", True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AddWritePermOfBrokerResponseHeader:
    add_topic_count: int
    FIELDS: ClassVar = (spec("add_topic_count", "addTopicCount", "int", True),)


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
        spec("topic", "topic", required=True),
        spec("default_topic", "defaultTopic", required=True),
        spec("read_queue_nums", "readQueueNums", "int", True, NAT),
        spec("write_queue_nums", "writeQueueNums", "int", True, NAT),
        spec("perm", "perm", "int", True, NAT),
        spec("topic_filter_type", "topicFilterType", required=True),
        spec("topic_sys_flag", "topicSysFlag", "int"),
        spec("order", "order", "bool", True),
        spec("attributes", "attributes"),
        spec("force", "force", "bool"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TopicHeader:
    """DELETE_TOPIC_IN_BROKER, GET_TOPIC_STATS_INFO, QUERY_TOPIC_CONSUME_BY_WHO, GET_TOPIC_CONFIG."""

    topic: str
    FIELDS: ClassVar = (spec("topic", "topic", required=True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeleteSubscriptionGroupRequestHeader:
    group_name: str
    remove_offset: bool | None = None  # 4.9
    clean_offset: bool | None = None  # 5.x
    FIELDS: ClassVar = (
        spec("group_name", "groupName", required=True),
        spec("remove_offset", "removeOffset", "bool"),
        spec("clean_offset", "cleanOffset", "bool"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetConsumeStatsRequestHeader:
    consumer_group: str
    topic: str | None = None
    FIELDS: ClassVar = (spec("consumer_group", "consumerGroup", required=True), spec("topic", "topic"))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetProducerConnectionListRequestHeader:
    producer_group: str
    FIELDS: ClassVar = (spec("producer_group", "producerGroup", required=True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetBrokerConfigResponseHeader:
    version: str
    FIELDS: ClassVar = (spec("version", "version", required=True),)


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
        spec("topic", "topic", required=True),
        spec("group", "group", required=True),
        spec("queue_id", "queueId", "int", lo=-1),
        spec("offset", "offset", "long"),
        spec("timestamp", "timestamp", "long", True),
        spec("is_force", "isForce", "bool", True),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TopicGroupHeader:
    """QUERY_CONSUME_TIME_SPAN (topic, group)."""

    topic: str
    group: str
    FIELDS: ClassVar = (spec("topic", "topic", required=True), spec("group", "group", required=True))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GroupHeader:
    """QUERY_TOPICS_BY_CONSUMER, GET_SUBSCRIPTIONGROUP_CONFIG (5.x)."""

    group: str
    FIELDS: ClassVar = (spec("group", "group", required=True),)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QuerySubscriptionByConsumerRequestHeader:
    group: str
    topic: str | None = None
    FIELDS: ClassVar = (spec("group", "group", required=True), spec("topic", "topic"))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetConsumerStatusRequestHeader:
    """INVOKE_BROKER_TO_GET_CONSUMER_STATUS, GET_CONSUMER_STATUS_FROM_CLIENT."""

    topic: str
    group: str
    client_addr: str | None = None
    FIELDS: ClassVar = (
        spec("topic", "topic", required=True),
        spec("group", "group", required=True),
        spec("client_addr", "clientAddr"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GetConsumerRunningInfoRequestHeader:
    consumer_group: str
    client_id: str
    jstack_enable: bool | None = None
    FIELDS: ClassVar = (
        spec("consumer_group", "consumerGroup", required=True),
        spec("client_id", "clientId", required=True),
        spec("jstack_enable", "jstackEnable", "bool"),
    )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConsumeMessageDirectlyRequestHeader:
    consumer_group: str
    client_id: str | None = None
    msg_id: str | None = None
    broker_name: str | None = None
    topic: str | None = None
    FIELDS: ClassVar = (
        spec("consumer_group", "consumerGroup", required=True),
        spec("client_id", "clientId"),
        spec("msg_id", "msgId"),
        spec("broker_name", "brokerName"),
        spec("topic", "topic"),
    )
