"""mqadmin's topic, subscription-group and broker codes, answered by the broker service:

    UPDATE_AND_CREATE_TOPIC (17)           -> ``service.put_topic`` through the Raft log (the ready
                                              leader; a follower answers SERVICE_NOT_AVAILABLE); the
                                              NameServers hear of it with the next registration
                                              (at once: the apply triggers it). ``updateTopic -c``
                                              sends it to every master of the cluster: each group's
                                              leader. topicFilterType / topicSysFlag are not kept.
    DELETE_TOPIC_IN_BROKER (215)           -> ``service.delete_topic`` (a topic this group does not
                                              hold: SUCCESS, as RocketMQ answers)
    GET_ALL_TOPIC_CONFIG (21)              TopicConfigSerializeWrapper of ``service.topics``
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200) body SubscriptionGroupConfig -> ``service.put_group``
                                              (consumeEnable, consumeBroadcastEnable, retryMaxTimes
                                              are kept; the other members are RocketMQ's defaults,
                                              which is how our broker behaves)
    DELETE_SUBSCRIPTIONGROUP (207)         -> ``service.delete_group`` (its offsets go with it)
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) SubscriptionGroupWrapper of ``service.groups``
    GET_SYSTEM_TOPIC_LIST_FROM_BROKER (305) the topics the broker keeps for itself
    GET_BROKER_RUNTIME_INFO (28)           KVTable from ``service.runtime_info`` (``runtime_table``)
    GET_BROKER_CONFIG (26)                 ``key=value`` lines: ``service.config`` + RocketMQ's names
                                              of what it holds (``config_table``); header version
    UPDATE_BROKER_CONFIG (25)              ``key=value`` lines -> ``service.update_config``, every key
                                              checked first (``service.check_config_update``: only
                                              hot keys, valid values; all or none change)
    CLEAN_EXPIRED_CONSUMEQUEUE (306)       -> ``service.clean_expired_queues`` (this replica's queues of
                                              topics that no longer exist)

ACL (``needs_of``): admin for the writes, GET_BROKER_CONFIG and CLEAN_EXPIRED_CONSUMEQUEUE, as the
HTTP API; a valid signature for the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from broker.protocol.errors import ProtocolError
from broker.protocol.properties import AUTO_CREATE_TOPIC, BROKER_TOPICS
from broker.protocol.rocketmq import admin_headers as ah
from broker.protocol.rocketmq import bodies
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode
from broker.protocol.rocketmq.command import VERSION_V4_9_8, RemotingCommand
from broker.protocol.rocketmq.header_fields import to_ext
from broker.service.base import ServiceConfig
from broker.service.broker_service import RuntimeInfo
from broker.serving.remoting_server import CommandError, Request

if TYPE_CHECKING:
    from broker.edge.rocketmq.host import EdgeHost

BROKER_VERSION: Final = VERSION_V4_9_8
BROKER_VERSION_DESC: Final = "V4_9_8"
"""The RocketMQ version our brokers speak (``MQVersion``'s ordinal and name): what every answer's
``version`` says and what brokerStatus / clusterList print."""
CONFIG_BODY_BYTES_MAX: Final = 64 << 10  # an UPDATE_BROKER_CONFIG body
CONFIG_KEYS_MAX: Final = 64


# -- pure: our figures and configuration as RocketMQ's tables -----------------------------------------------
def _tps(value: float) -> str:
    return f"{value:.2f}"


def runtime_table(info: RuntimeInfo) -> dict[str, str]:
    """GET_BROKER_RUNTIME_INFO's table: RocketMQ's keys that we hold a counter or a reading for.
    putTps / getTransferedTps carry one figure (the last 10 s) where RocketMQ gives three (10 s,
    1 min, 10 min): the tools read the first. The keys we have nothing for are left out (the tools
    print them empty), never filled with made-up values: docs/TOOLS.md lists both."""
    table = {
        "brokerVersionDesc": BROKER_VERSION_DESC,
        "brokerVersion": str(BROKER_VERSION),
        "bootTimestamp": str(info.boot_ms),
        "msgPutTotalTodayNow": str(info.messages_put),
        "msgGetTotalTodayNow": str(info.messages_got),
        "putMessageTimesTotal": str(info.messages_put),
        "putTps": _tps(info.put_tps),
        "getTransferedTps": _tps(info.get_tps),  # 4.9.x tools read this spelling
        "getTransferredTps": _tps(info.get_tps),  # 5.x's
        "commitLogMinOffset": str(info.log_first_position),
        "commitLogMaxOffset": str(info.log_end_position),
        "brokerActive": "true" if info.leads else "false",
        "transactionHalvesPending": str(info.halves_pending),
    }
    if info.disk_used_ratio is not None:
        table["commitLogDiskRatio"] = f"{info.disk_used_ratio:.4f}"
    return table


def config_table(view: Mapping[str, str], cfg: ServiceConfig, broker_id: int) -> dict[str, str]:
    """GET_BROKER_CONFIG's properties: our configuration (``service.config``: our key names, secrets
    left out) and, under RocketMQ's names, the values RocketMQ's tools look for."""
    out = dict(view)
    out.update({
        "brokerClusterName": cfg.cluster,
        "brokerName": cfg.broker_name,
        "brokerId": str(broker_id),
        "brokerIP1": cfg.dledger.http_host,
        "listenPort": str(cfg.dledger.listen_port),
        "namesrvAddr": ";".join(cfg.namesrv_addrs),
        "enableDLegerCommitLog": "true",
        "dLegerGroup": cfg.broker_name,
        "dLegerSelfId": cfg.dledger.self_id,
        "autoCreateTopicEnable": "true" if cfg.auto_create_topic else "false",
        "defaultTopicQueueNums": str(cfg.default_topic_queue_nums),
        "maxMessageSize": str(cfg.max_message_size),
        "enablePropertyFilter": "true" if cfg.enable_property_filter else "false",
    })
    return out


def parse_config_update(raw: bytes) -> dict[str, str]:
    """UPDATE_BROKER_CONFIG's body: ``key=value`` lines, bounded (the service checks the keys and
    values: ``check_config_update``)."""
    if len(raw) > CONFIG_BODY_BYTES_MAX:
        raise CommandError(ResponseCode.SYSTEM_ERROR, f"BAD_BODY: at most {CONFIG_BODY_BYTES_MAX} bytes")
    return bodies.decode_properties_text(raw, entries_max=CONFIG_KEYS_MAX)


# -- handlers ------------------------------------------------------------------------------------------------
def register(edge: EdgeHost) -> None:
    h = Admin(edge)
    edge.route(RequestCode.UPDATE_AND_CREATE_TOPIC, h.put_topic, writes=True)
    edge.route(RequestCode.DELETE_TOPIC_IN_BROKER, h.delete_topic, writes=True)
    edge.route(RequestCode.GET_ALL_TOPIC_CONFIG, h.all_topics)
    edge.route(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, h.put_group, writes=True)
    edge.route(RequestCode.DELETE_SUBSCRIPTIONGROUP, h.delete_group, writes=True)
    edge.route(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, h.all_groups)
    edge.route(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER, h.system_topics)
    edge.route(RequestCode.GET_BROKER_RUNTIME_INFO, h.runtime_info)
    edge.route(RequestCode.GET_BROKER_CONFIG, h.get_config)
    edge.route(RequestCode.UPDATE_BROKER_CONFIG, h.update_config, writes=True)
    edge.route(RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, h.clean_expired_queues, writes=True)


class Admin:
    def __init__(self, edge: EdgeHost):
        self.edge = edge
        self.svc = edge.service

    # -- topics ------------------------------------------------------------------------------------------
    async def put_topic(self, req: Request) -> RemotingCommand:
        h = req.header(ah.CreateTopicRequestHeader)
        await self.svc.put_topic(h.topic, read_queue_nums=h.read_queue_nums, write_queue_nums=h.write_queue_nums,
                                 perm=h.perm, order=h.order)
        return req.ok()

    async def delete_topic(self, req: Request) -> RemotingCommand:
        topic = req.header(ah.TopicHeader).topic
        try:
            await self.svc.delete_topic(topic)
        except ProtocolError as exc:
            if exc.code != "TOPIC_NOT_EXIST":
                raise
        return req.ok()

    def _data_version(self, counter: int) -> bodies.DataVersion:
        return bodies.DataVersion(timestamp=self.svc.runtime_info().boot_ms, counter=counter)

    async def all_topics(self, req: Request) -> RemotingCommand:
        table = {
            tc.topic: bodies.TopicConfig(topic_name=tc.topic, read_queue_nums=tc.read_queue_nums,
                                         write_queue_nums=tc.write_queue_nums, perm=tc.perm, order=tc.order)
            for tc in self.svc.topics()
        }
        wrapper = bodies.TopicConfigSerializeWrapper(topic_config_table=table,
                                                     data_version=self._data_version(self.svc.metadata_version()))
        return req.ok(body=bodies.encode(wrapper))

    async def system_topics(self, req: Request) -> RemotingCommand:
        cfg = self.svc.broker_config()
        names = (*BROKER_TOPICS, AUTO_CREATE_TOPIC, cfg.msg_trace_topic_name)
        return req.ok(body=bodies.encode(bodies.TopicList(topic_list=tuple(dict.fromkeys(names)))))

    # -- subscription groups -------------------------------------------------------------------------------
    async def put_group(self, req: Request) -> RemotingCommand:
        body = bodies.decode(bodies.SubscriptionGroupConfig, req.cmd.body)
        await self.svc.put_group(body.group_name, consume_enable=body.consume_enable,
                                 consume_broadcast_enable=body.consume_broadcast_enable,
                                 retry_max_times=body.retry_max_times)
        return req.ok()

    async def delete_group(self, req: Request) -> RemotingCommand:
        h = req.header(ah.DeleteSubscriptionGroupRequestHeader)
        await self.svc.delete_group(h.group_name)
        return req.ok()

    async def all_groups(self, req: Request) -> RemotingCommand:
        table = {
            g.group: bodies.SubscriptionGroupConfig(group_name=g.group, consume_enable=g.consume_enable,
                                                    consume_broadcast_enable=g.consume_broadcast_enable,
                                                    retry_max_times=g.retry_max_times)
            for g in self.svc.groups()
        }
        wrapper = bodies.SubscriptionGroupWrapper(subscription_group_table=table,
                                                  data_version=self._data_version(self.svc.metadata_version()))
        return req.ok(body=bodies.encode(wrapper))

    # -- the broker ------------------------------------------------------------------------------------------
    async def runtime_info(self, req: Request) -> RemotingCommand:
        return req.ok(body=bodies.encode(bodies.KVTable(table=runtime_table(self.svc.runtime_info()))))

    async def get_config(self, req: Request) -> RemotingCommand:
        cfg = self.svc.broker_config()
        info = self.svc.runtime_info()
        table = config_table(self.svc.config(), cfg, 0 if info.leads else cfg.follower_broker_id)
        version = bodies.encode(self._data_version(self.svc.config_updates())).decode("utf-8")
        header = ah.GetBrokerConfigResponseHeader(version=version)
        return req.ok(ext_fields=to_ext(header), body=bodies.encode_properties_text(table))

    async def clean_expired_queues(self, req: Request) -> RemotingCommand:
        await self.svc.clean_expired_queues()
        return req.ok()

    async def update_config(self, req: Request) -> RemotingCommand:
        props = parse_config_update(req.cmd.body)
        self.svc.check_config_update(props)  # every key hot, every value valid: all change or none
        for key, value in props.items():
            self.svc.update_config(key, value)
        return req.ok()
