"""The NameServer's side of RocketMQ's remoting protocol: what the official clients and mqadmin ask a
NameServer, answered from the same route table (and through the same service methods) as the HTTP API.

    code                                     answer                                    who may ask (ACL on)
    GET_ROUTEINFO_BY_TOPIC (105)             TopicRouteData, or TOPIC_NOT_EXIST          anyone
    GET_BROKER_CLUSTER_INFO (106)            ClusterInfo                                 anyone
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206) TopicList                                   anyone
    GET_TOPICS_BY_CLUSTER (224)              TopicList of the cluster's groups           anyone
    GET_SYSTEM_TOPIC_LIST_FROM_NS (304)      cluster and group names (RocketMQ's)        anyone
    GET_UNIT_TOPIC_LIST (311), GET_HAS_UNIT_SUB_TOPIC_LIST (312),
    GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST (313) empty TopicList (no unit topics here)       anyone
    GET_KV_CONFIG (101)                      header value, or QUERY_NOT_FOUND            anyone
    GET_KVLIST_BY_NAMESPACE (219)            KVTable, or QUERY_NOT_FOUND                 anyone
    GET_NAMESRV_CONFIG (319)                 key=value lines                             anyone
    PUT_KV_CONFIG (100), DELETE_KV_CONFIG (102)                                          admin
    UPDATE_NAMESRV_CONFIG (318)              the updatable keys only (HOT_KEYS)          admin
    WIPE_WRITE_PERM_OF_BROKER (205), ADD_WRITE_PERM_OF_BROKER (327)                      admin
    DELETE_TOPIC_IN_NAMESRV (216)            SUCCESS whether or not it was there         admin

Anything else (REGISTER_BROKER and the other broker-to-NameServer codes included: our brokers
register over HTTP with our signatures) answers REQUEST_CODE_NOT_SUPPORTED. "anyone" matches the HTTP
API, whose reads are open: an unsigned read is served, a signed one must verify.

A route's brokers are the addresses they registered (``address``: their ``listenPort``), the
group's leader as broker id 0 and the followers under their own ids (replica index + 1): a role
change is in the next answer (no cache between the table and this module). Routes go out in standard
JSON (quoted broker ids) to clients of 4.9.4 and later (``version`` >= 401) or that ask for it
(``acceptStandardJsonOnly``), in fastjson's own dialect to older ones, as RocketMQ's NameServer does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final, Protocol, TypeVar

from broker.protocol.errors import ProtocolError
from broker.protocol.rocketmq import admin_headers as ah
from broker.protocol.rocketmq import bodies
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode
from broker.protocol.rocketmq.command import RemotingCommand
from broker.protocol.rocketmq.header_fields import to_ext
from broker.protocol.routes import BrokerData, ClusterInfo, TopicRouteData
from broker.serving.remoting_server import RemotingServer, Request
from namesrv.kv_config import ORDER_TOPIC_CONFIG, KvConfigTable
from namesrv.route_table import RouteTable, validate_topic

if TYPE_CHECKING:
    from namesrv.config import NamesrvConfig

T = TypeVar("T")

VERSION_V4_9_4: Final = 401
"""``MQVersion.Version.V4_9_4.ordinal()``: from this client version on, routes go out as standard JSON."""
FAQ_APPLY_TOPIC: Final = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."


# -- pure conversions: our route records -> RocketMQ's bodies ------------------------------------------------
def broker_body(b: BrokerData) -> bodies.BrokerData:
    return bodies.BrokerData(cluster=b.cluster, broker_name=b.broker_name, broker_addrs=dict(b.broker_addrs))


def route_body(route: TopicRouteData, order_topic_conf: str | None = None) -> bodies.TopicRouteData:
    return bodies.TopicRouteData(
        order_topic_conf=order_topic_conf,
        queue_datas=tuple(bodies.QueueData(broker_name=q.broker_name, read_queue_nums=q.read_queue_nums,
                                           write_queue_nums=q.write_queue_nums, perm=q.perm)
                          for q in route.queue_datas),
        broker_datas=tuple(broker_body(b) for b in route.broker_datas),
        filter_server_table={},
    )


def cluster_body(info: ClusterInfo) -> bodies.ClusterInfo:
    return bodies.ClusterInfo(broker_addr_table={name: broker_body(b) for name, b in info.brokers.items()},
                              cluster_addr_table=dict(info.clusters))


def system_topics(info: ClusterInfo) -> bodies.TopicList:
    """RocketMQ's "system topics" at a NameServer: every cluster name and broker group name (4.x brokers
    create a topic of each), with the address of one broker."""
    names: list[str] = []
    for cluster, groups in info.clusters.items():
        names.append(cluster)
        names.extend(groups)
    addr = next((a for b in info.brokers.values() if (a := b.any_addr()) is not None), None)
    return bodies.TopicList(topic_list=tuple(dict.fromkeys(names)), broker_addr=addr)


def standard_json_wanted(cmd: RemotingCommand, header: ah.GetRouteInfoRequestHeader) -> bool:
    return cmd.version >= VERSION_V4_9_4 or bool(header.accept_standard_json_only)


# -- the handlers ---------------------------------------------------------------------------------------------
class TableCalls(Protocol):
    """Runs a job on the route table's one task (``namesrv.server.TableOwner`` is one)."""

    async def call(self, fn: Callable[[RouteTable, int], T]) -> T: ...


class NamesrvHost(Protocol):
    """What the remoting handlers use of the NameServer (``NamesrvService`` is one)."""

    kv: KvConfigTable
    cfg: NamesrvConfig

    @property
    def owner(self) -> TableCalls: ...
    def config_text(self) -> dict[str, str]: ...
    async def put_kv(self, namespace: str, key: str, value: str) -> None: ...
    async def delete_kv(self, namespace: str, key: str) -> bool: ...
    async def update_config(self, changes: Mapping[str, str]) -> dict[str, str]: ...
    async def set_write_perm(self, broker_name: str, write: bool) -> int: ...
    async def delete_topic(self, topic: str, cluster: str | None = None) -> bool: ...


class NamesrvRemoting:
    """The remoting handlers of one ``NamesrvService``."""

    def __init__(self, service: NamesrvHost):
        self.service = service

    def install(self, server: RemotingServer) -> None:
        reads = (
            (RequestCode.GET_ROUTEINFO_BY_TOPIC, self.route_by_topic),
            (RequestCode.GET_BROKER_CLUSTER_INFO, self.cluster_info),
            (RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, self.all_topics),
            (RequestCode.GET_TOPICS_BY_CLUSTER, self.topics_by_cluster),
            (RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS, self.system_topics),
            (RequestCode.GET_UNIT_TOPIC_LIST, self.no_topics),
            (RequestCode.GET_HAS_UNIT_SUB_TOPIC_LIST, self.no_topics),
            (RequestCode.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST, self.no_topics),
            (RequestCode.GET_KV_CONFIG, self.get_kv),
            (RequestCode.GET_KVLIST_BY_NAMESPACE, self.kv_namespace),
            (RequestCode.GET_NAMESRV_CONFIG, self.get_config),
        )
        writes = (
            (RequestCode.PUT_KV_CONFIG, self.put_kv),
            (RequestCode.DELETE_KV_CONFIG, self.delete_kv),
            (RequestCode.UPDATE_NAMESRV_CONFIG, self.update_config),
            (RequestCode.WIPE_WRITE_PERM_OF_BROKER, self.wipe_write_perm),
            (RequestCode.ADD_WRITE_PERM_OF_BROKER, self.add_write_perm),
            (RequestCode.DELETE_TOPIC_IN_NAMESRV, self.delete_topic),
        )
        for code, handler in reads:
            server.route(code, handler, anonymous=True)
        for code, handler in writes:
            server.route(code, handler, writes=True)

    @property
    def kv(self) -> KvConfigTable:
        return self.service.kv

    # -- reads ----------------------------------------------------------------------------------------------
    async def route_by_topic(self, req: Request) -> RemotingCommand:
        header = req.header(ah.GetRouteInfoRequestHeader)
        topic = header.topic
        validate_topic(topic)
        order_conf = self.service.cfg.order_message_enable

        def job(table: RouteTable, now_ms: int) -> tuple[TopicRouteData | None, str | None]:
            return table.topic_route(topic), self.kv.get(ORDER_TOPIC_CONFIG, topic) if order_conf else None

        route, conf = await self.service.owner.call(job)
        if route is None:
            return req.answer(ResponseCode.TOPIC_NOT_EXIST,
                              f"No topic route info in name server for the topic: {topic}{FAQ_APPLY_TOPIC}")
        return req.ok(body=bodies.encode(route_body(route, conf), standard_json=standard_json_wanted(req.cmd, header)))

    async def cluster_info(self, req: Request) -> RemotingCommand:
        info = await self.service.owner.call(lambda table, now_ms: table.cluster_info())
        return req.ok(body=bodies.encode(cluster_body(info)))

    async def all_topics(self, req: Request) -> RemotingCommand:
        topics = await self.service.owner.call(lambda table, now_ms: table.topic_list())
        return req.ok(body=bodies.encode(bodies.TopicList(topic_list=topics)))

    async def topics_by_cluster(self, req: Request) -> RemotingCommand:
        cluster = req.header(ah.GetTopicsByClusterRequestHeader).cluster
        topics = await self.service.owner.call(lambda table, now_ms: table.topics_of_cluster(cluster))
        return req.ok(body=bodies.encode(bodies.TopicList(topic_list=topics)))

    async def system_topics(self, req: Request) -> RemotingCommand:
        info = await self.service.owner.call(lambda table, now_ms: table.cluster_info())
        return req.ok(body=bodies.encode(system_topics(info)))

    async def no_topics(self, req: Request) -> RemotingCommand:
        return req.ok(body=bodies.encode(bodies.TopicList()))

    async def get_kv(self, req: Request) -> RemotingCommand:
        h = req.header(ah.KVConfigRequestHeader)
        value = await self.service.owner.call(lambda table, now_ms: self.kv.get(h.namespace, h.key))
        if value is None:
            return req.answer(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {h.namespace} Key: {h.key}")
        return req.ok(ext_fields=to_ext(ah.GetKVConfigResponseHeader(value=value)))

    async def kv_namespace(self, req: Request) -> RemotingCommand:
        namespace = req.header(ah.NamespaceHeader).namespace
        table = await self.service.owner.call(lambda t, now_ms: self.kv.namespace(namespace))
        if table is None:
            return req.answer(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}")
        return req.ok(body=bodies.encode(bodies.KVTable(table=table)))

    async def get_config(self, req: Request) -> RemotingCommand:
        return req.ok(body=bodies.encode_properties_text(self.service.config_text()))

    # -- writes (an admin account when ACL is on) --------------------------------------------------------------
    async def put_kv(self, req: Request) -> RemotingCommand:
        h = req.header(ah.KVConfigRequestHeader)
        req.require(admin=True)
        if h.value is None:
            raise ProtocolError("MISSING_FIELD", "PUT_KV_CONFIG needs a value")  # answered SYSTEM_ERROR
        await self.service.put_kv(h.namespace, h.key, h.value)
        return req.ok()

    async def delete_kv(self, req: Request) -> RemotingCommand:
        h = req.header(ah.KVConfigRequestHeader)
        req.require(admin=True)
        await self.service.delete_kv(h.namespace, h.key)
        return req.ok()  # RocketMQ answers SUCCESS for a key that was not there too

    async def update_config(self, req: Request) -> RemotingCommand:
        req.require(admin=True)
        if req.cmd.body:
            await self.service.update_config(bodies.decode_properties_text(req.cmd.body, entries_max=64))
        return req.ok()

    async def wipe_write_perm(self, req: Request) -> RemotingCommand:
        name = req.header(ah.BrokerNameHeader).broker_name
        req.require(admin=True)
        count = await self.service.set_write_perm(name, False)
        return req.ok(ext_fields=to_ext(ah.WipeWritePermOfBrokerResponseHeader(wipe_topic_count=count)))

    async def add_write_perm(self, req: Request) -> RemotingCommand:
        name = req.header(ah.BrokerNameHeader).broker_name
        req.require(admin=True)
        count = await self.service.set_write_perm(name, True)
        return req.ok(ext_fields=to_ext(ah.AddWritePermOfBrokerResponseHeader(add_topic_count=count)))

    async def delete_topic(self, req: Request) -> RemotingCommand:
        h = req.header(ah.DeleteTopicFromNamesrvRequestHeader)
        req.require(admin=True)
        validate_topic(h.topic)
        await self.service.delete_topic(h.topic, h.cluster_name or None)
        return req.ok()  # RocketMQ answers SUCCESS when the topic was not there: mqadmin deleteTopic relies on it
