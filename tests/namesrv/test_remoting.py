"""The NameServer's remoting side: a real ``NamesrvService`` in-process on 127.0.0.1, asked with frames built
by our codec (``broker.protocol.rocketmq``) the way the official clients build them, every code it serves,
ACL off and on (signed like ``AclClientRPCHook`` signs), and HTTP on the same port.

The groups are registered through the service's table task (what an HTTP registration does after its
checks); the routes are then read over remoting."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from broker.protocol import route_wire as wire
from broker.protocol.rocketmq import admin_headers as ah
from broker.protocol.rocketmq import bodies
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode, SerializeType
from broker.protocol.rocketmq.command import RemotingCommand
from broker.protocol.rocketmq.header_fields import parse
from broker.protocol.routes import BrokerRegistration, Role, TopicConfig
from namesrv.config import NamesrvConfig
from namesrv.server import NamesrvService
from tests.acl_fixtures import ADMIN, CONSUMER, write_acl
from tests.broker.serving.rmq_client import RmqClient
from tests.dledger.harness import HOST

C = RequestCode
N0, N1, N2 = "127.0.0.1:10911", "127.0.0.1:10921", "127.0.0.1:10931"
M0 = "127.0.0.1:11911"  # a group of another cluster


@dataclasses.dataclass
class Ns:
    service: NamesrvService
    addr: str
    acl: bool
    clients: list[RmqClient] = dataclasses.field(default_factory=list)

    async def client(self, creds: Any = None, **kw: Any) -> RmqClient:
        c = await RmqClient.connect(self.addr, credentials=(creds.access_key, creds.secret_key) if creds else None,
                                    **kw)
        self.clients.append(c)
        return c

    async def admin(self) -> RmqClient:
        return await self.client(ADMIN if self.acl else None)

    async def register(self, address: str, broker_id: int, term: int, *, broker_name: str = "RaftNode00",
                       cluster: str = "DefaultCluster", topics: tuple[TopicConfig, ...] | None = None) -> None:
        role: Role = "LEADER" if broker_id == 0 else "FOLLOWER"
        if topics is None:
            topics = (TopicConfig("TopicA"), TopicConfig("TopicRO", 2, 2, perm=4), TopicConfig("TBW102", perm=7))
        reg = BrokerRegistration(cluster, broker_name, broker_id, address, role, term, topics, data_version=term)
        result = await self.service.owner.call(lambda table, now_ms: table.register(reg, now_ms))
        assert result.accepted


async def start(tmp_path: Any, acl: bool, **cfg: Any) -> tuple[Ns, Any]:
    acl_file = write_acl(str(tmp_path / "plain_acl.yml")) if acl else None
    service = NamesrvService(NamesrvConfig(listen_port=0, acl_file=acl_file, **cfg), run_scanner=False)
    runner, addr = await service.serve(HOST, 0)
    return Ns(service, addr, acl), runner


@pytest.fixture(params=[False, True], ids=["acl-off", "acl-on"])
async def ns(request: Any, tmp_path: Any) -> AsyncIterator[Ns]:
    srv, runner = await start(tmp_path, request.param)
    try:
        yield srv
    finally:
        for c in srv.clients:
            await c.close()
        await runner.cleanup()


async def group(ns: Ns) -> None:
    await ns.register(N0, 0, 1)
    await ns.register(N1, 2, 1)
    await ns.register(N2, 3, 1)
    await ns.register(M0, 0, 1, broker_name="Other00", cluster="OtherCluster", topics=(TopicConfig("TopicB"),))


def route_of(answer: RemotingCommand) -> bodies.TopicRouteData:
    assert answer.code == ResponseCode.SUCCESS, answer
    return bodies.decode(bodies.TopicRouteData, answer.body)


# -- reads ----------------------------------------------------------------------------------------------------
async def test_routes_leader_as_broker_id_0_followers_by_replica_index(ns: Ns) -> None:
    await group(ns)
    for c in (await ns.client(), await ns.client(ADMIN if ns.acl else None, serialize_type=SerializeType.ROCKETMQ)):
        answer = await c.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"})
        route = route_of(answer)
        assert answer.serialize_type == c.serialize_type
        assert [(b.cluster, b.broker_name, b.broker_addrs) for b in route.broker_datas] == [
            ("DefaultCluster", "RaftNode00", {0: N0, 2: N1, 3: N2})]
        assert [(q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) for q in route.queue_datas] == [
            ("RaftNode00", 4, 4, 6)]
        assert route.order_topic_conf is None and route.filter_server_table == {}
        ro = route_of(await c.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicRO"}))
        assert ro.queue_datas[0].perm == 4 and ro.queue_datas[0].read_queue_nums == 2
        # TBW102, the template topic a producer routes a new topic by (auto-create at the brokers)
        tbw = route_of(await c.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}))
        assert tbw.queue_datas[0].perm == 7


async def test_route_json_dialect_follows_the_client_version(ns: Ns) -> None:
    await group(ns)
    c = await ns.client()
    new = await c.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"}, version=409)  # 4.9.8: standard JSON
    assert b'"brokerAddrs":{"0":"127.0.0.1:10911"' in new.body
    old = await c.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"}, version=399)  # 4.9.3: fastjson's keys
    assert b'"brokerAddrs":{0:"127.0.0.1:10911"' in old.body
    asked = await c.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA", "acceptStandardJsonOnly": "true"}, version=399)
    assert b'"brokerAddrs":{"0":' in asked.body
    assert route_of(new) == route_of(old) == route_of(asked)


async def test_unknown_and_bad_topics(ns: Ns) -> None:
    await group(ns)
    c = await ns.client()
    missing = await c.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "NoSuchTopic"})
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST and missing.body == b""
    assert (missing.remark or "").startswith("No topic route info in name server for the topic: NoSuchTopic")
    bad = await c.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "bad topic!"})
    assert bad.code == ResponseCode.SYSTEM_ERROR and (bad.remark or "").startswith("INVALID_TOPIC: ")
    absent = await c.call(C.GET_ROUTEINFO_BY_TOPIC, {})
    assert absent.code == ResponseCode.SYSTEM_ERROR and (absent.remark or "").startswith("MISSING_FIELD: ")


async def test_cluster_info_topic_lists_and_config(ns: Ns) -> None:
    await group(ns)
    c = await ns.client()
    info = bodies.decode(bodies.ClusterInfo, (await c.call(C.GET_BROKER_CLUSTER_INFO)).body)
    assert info.cluster_addr_table == {"DefaultCluster": ("RaftNode00",), "OtherCluster": ("Other00",)}
    assert info.broker_addr_table["RaftNode00"].broker_addrs == {0: N0, 2: N1, 3: N2}
    assert info.broker_addr_table["Other00"].cluster == "OtherCluster"

    def topics(answer: RemotingCommand) -> tuple[str, ...]:
        assert answer.code == ResponseCode.SUCCESS
        return bodies.decode(bodies.TopicList, answer.body).topic_list

    assert topics(await c.call(C.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)) == ("TBW102", "TopicA", "TopicB", "TopicRO")
    assert topics(await c.call(C.GET_TOPICS_BY_CLUSTER, {"cluster": "OtherCluster"})) == ("TopicB",)
    assert topics(await c.call(C.GET_TOPICS_BY_CLUSTER, {"cluster": "Nope"})) == ()
    system = bodies.decode(bodies.TopicList, (await c.call(C.GET_SYSTEM_TOPIC_LIST_FROM_NS)).body)
    assert system.topic_list == ("DefaultCluster", "RaftNode00", "OtherCluster", "Other00")
    assert system.broker_addr in (N0, M0)
    for code in (C.GET_UNIT_TOPIC_LIST, C.GET_HAS_UNIT_SUB_TOPIC_LIST, C.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST):
        assert topics(await c.call(code)) == ()
    config = bodies.decode_properties_text((await c.call(C.GET_NAMESRV_CONFIG)).body)
    assert config["listenPort"] == "0" and config["aclEnable"] == ("true" if ns.acl else "false")
    assert config["remotingAclV1"] == "accept" and config["orderMessageEnable"] == "false"


async def test_codes_a_namesrv_does_not_serve(ns: Ns) -> None:
    c = await ns.admin()
    for code in (C.REGISTER_BROKER, C.UNREGISTER_BROKER, C.QUERY_DATA_VERSION, C.REGISTER_TOPIC_IN_NAMESRV,
                 C.GET_BROKER_MEMBER_GROUP, C.SEND_MESSAGE_V2, 31337):
        answer = await c.call(code, {"topic": "T"})
        assert (answer.code, answer.remark) == (ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                                f" request type {int(code)} not supported")


# -- role changes (invariant 6: what the table has is in the next answer) --------------------------------------
async def test_role_changes_are_in_the_next_route_answer(ns: Ns) -> None:
    await group(ns)
    c = await ns.client()

    async def addrs() -> dict[int, str]:
        return route_of(await c.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"})).broker_datas[0].broker_addrs

    assert await addrs() == {0: N0, 2: N1, 3: N2}
    await ns.register(N1, 0, 2)  # n1 won term 2: n0 moves to its last follower id, or leaves until it re-registers
    assert (await addrs())[0] == N1 and N0 not in (await addrs()).values()
    await ns.register(N0, 1, 2)  # n0 re-registers as follower 1
    assert await addrs() == {0: N1, 1: N0, 3: N2}
    await ns.register(N1, 2, 3)  # n1 steps down (term 3, no leader yet): no broker id 0, nobody writable
    assert 0 not in await addrs()
    info = bodies.decode(bodies.ClusterInfo, (await c.call(C.GET_BROKER_CLUSTER_INFO)).body)
    assert 0 not in info.broker_addr_table["RaftNode00"].broker_addrs


# -- writes ---------------------------------------------------------------------------------------------------
async def test_kv_config_and_order_topic_conf(ns: Ns) -> None:
    await group(ns)
    admin = await ns.admin()
    kv = {"namespace": "ORDER_TOPIC_CONFIG", "key": "TopicA", "value": "RaftNode00:4"}
    assert (await admin.call(C.PUT_KV_CONFIG, kv)).code == ResponseCode.SUCCESS
    assert (await admin.call(C.PUT_KV_CONFIG, {"namespace": "NS", "key": "k", "value": "v"})).code == 0
    got = await admin.call(C.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "TopicA"})
    assert got.code == 0 and parse(ah.GetKVConfigResponseHeader, got.ext_fields).value == "RaftNode00:4"
    table = bodies.decode(bodies.KVTable, (await admin.call(C.GET_KVLIST_BY_NAMESPACE, {"namespace": "NS"})).body)
    assert table.table == {"k": "v"}
    none = await admin.call(C.GET_KV_CONFIG, {"namespace": "NS", "key": "zz"})
    assert (none.code, none.remark) == (ResponseCode.QUERY_NOT_FOUND, "No config item, Namespace: NS Key: zz")
    none = await admin.call(C.GET_KVLIST_BY_NAMESPACE, {"namespace": "Empty"})
    assert (none.code, none.remark) == (ResponseCode.QUERY_NOT_FOUND, "No config item, Namespace: Empty")
    no_value = await admin.call(C.PUT_KV_CONFIG, {"namespace": "NS", "key": "k2"})
    assert no_value.code == ResponseCode.SYSTEM_ERROR and "MISSING_FIELD" in (no_value.remark or "")
    too_big = await admin.call(C.PUT_KV_CONFIG, {"namespace": "NS", "key": "k" * 300, "value": "v"})
    assert too_big.code == ResponseCode.SYSTEM_ERROR and (too_big.remark or "").startswith("INVALID_KV: ")

    # orderTopicConf in routes only with orderMessageEnable (RocketMQ's default: off)
    route = route_of(await admin.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"}))
    assert route.order_topic_conf is None
    update = await admin.call(C.UPDATE_NAMESRV_CONFIG, body=b"orderMessageEnable=true\n")
    assert update.code == ResponseCode.SUCCESS and ns.service.cfg.order_message_enable
    route = route_of(await admin.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"}))
    assert route.order_topic_conf == "RaftNode00:4"

    for _ in range(2):  # deleting twice: SUCCESS both times, as RocketMQ answers
        assert (await admin.call(C.DELETE_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "TopicA"})).code == 0
    assert route_of(await admin.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"})).order_topic_conf is None
    assert ns.service.kv.counts() == {"namespaces": 1, "entries": 1}


async def test_update_config_write_perm_and_delete_topic(ns: Ns) -> None:
    await group(ns)
    admin = await ns.admin()
    ok = await admin.call(C.UPDATE_NAMESRV_CONFIG, body=b"scanNotActiveBrokerInterval=5000\n")
    assert ok.code == 0 and ns.service.cfg.scan_not_active_broker_interval_ms == 5000
    for body, code in ((b"listenPort=1\n", "NOT_UPDATABLE"), (b"scanNotActiveBrokerInterval=abc\n", "BAD_PARAMETER"),
                       (b"brokerChannelMaxIdleTime=2000\n", "BAD_PARAMETER")):  # below the scan interval
        bad = await admin.call(C.UPDATE_NAMESRV_CONFIG, body=body)
        assert bad.code == ResponseCode.SYSTEM_ERROR and (bad.remark or "").startswith(code + ": "), bad
    assert ns.service.cfg.broker_channel_max_idle_time_ms == 120_000
    assert (await admin.call(C.UPDATE_NAMESRV_CONFIG)).code == 0  # no body: nothing to change

    wiped = await admin.call(C.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "RaftNode00"})
    assert wiped.code == 0 and wiped.ext("wipeTopicCount") == "3"
    assert route_of(await admin.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"})).queue_datas[0].perm == 4
    added = await admin.call(C.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "RaftNode00"})
    assert added.code == 0 and added.ext("addTopicCount") == "3"
    assert route_of(await admin.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"})).queue_datas[0].perm == 6
    unknown = await admin.call(C.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "Nope"})
    assert unknown.code == ResponseCode.SYSTEM_ERROR and (unknown.remark or "").startswith("BROKER_NOT_EXIST: ")

    # deleting in another cluster leaves the topic; in its cluster (or everywhere) removes it; again: SUCCESS
    assert (await admin.call(C.DELETE_TOPIC_IN_NAMESRV, {"topic": "TopicA", "clusterName": "OtherCluster"})).code == 0
    assert (await admin.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"})).code == ResponseCode.SUCCESS
    assert (await admin.call(C.DELETE_TOPIC_IN_NAMESRV, {"topic": "TopicA", "clusterName": "DefaultCluster"})).code == 0
    assert (await admin.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"})).code == ResponseCode.TOPIC_NOT_EXIST
    assert (await admin.call(C.DELETE_TOPIC_IN_NAMESRV, {"topic": "TopicA"})).code == 0
    assert (await admin.call(C.DELETE_TOPIC_IN_NAMESRV, {"topic": "TopicB"})).code == 0
    assert (await admin.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicB"})).code == ResponseCode.TOPIC_NOT_EXIST


WRITES: tuple[tuple[int, dict[str, str], bytes], ...] = (
    (C.PUT_KV_CONFIG, {"namespace": "NS", "key": "k", "value": "v"}, b""),
    (C.DELETE_KV_CONFIG, {"namespace": "NS", "key": "k"}, b""),
    (C.UPDATE_NAMESRV_CONFIG, {}, b"scanNotActiveBrokerInterval=5000\n"),
    (C.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "RaftNode00"}, b""),
    (C.ADD_WRITE_PERM_OF_BROKER, {"brokerName": "RaftNode00"}, b""),
    (C.DELETE_TOPIC_IN_NAMESRV, {"topic": "TopicA"}, b""),
)


async def test_with_acl_writes_need_an_admin_signature_and_reads_stay_open(tmp_path: Any) -> None:
    ns, runner = await start(tmp_path, acl=True)
    try:
        await group(ns)
        anonymous, consumer = await ns.client(), await ns.client(CONSUMER)
        forged = await ns.client(dataclasses.replace(ADMIN, secret_key="not-the-secret-1"))
        for code, ext, body in WRITES:
            for c, reason in ((anonymous, "NO_CREDENTIALS: "), (consumer, "NO_PERMISSION: "),
                              (forged, "SIGNATURE_INVALID: ")):
                answer = await c.call(code, ext, body)
                assert answer.code == ResponseCode.NO_PERMISSION and (answer.remark or "").startswith(reason), \
                    (code, answer)
        # nothing changed
        assert ns.service.cfg.scan_not_active_broker_interval_ms == 10_000 and ns.service.kv.counts()["entries"] == 0
        route = route_of(await anonymous.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"}))
        assert route.queue_datas[0].perm == 6
        # reads: unsigned and consumer-signed are served; a forged signature is refused even on a read
        assert (await consumer.call(C.GET_BROKER_CLUSTER_INFO)).code == ResponseCode.SUCCESS
        refused = await forged.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"})
        assert refused.code == ResponseCode.NO_PERMISSION
        # the admin may
        admin = await ns.admin()
        for code, ext, body in WRITES:
            assert (await admin.call(code, ext, body)).code == ResponseCode.SUCCESS, code
        async with aiohttp.ClientSession() as http, http.get(f"http://{ns.addr}/v1/status") as resp:
            status = await resp.json()
        assert status["remoting"]["acl_refused"] == {"NO_CREDENTIALS": 6, "SIGNATURE_INVALID": 7}
        assert status["remoting"]["auth_refused"] == 6 * 3 + 1
    finally:
        for c in ns.clients:
            await c.close()
        await runner.cleanup()


@pytest.mark.parametrize("policy", ["readonly", "refuse"])
async def test_remoting_acl_v1_policy(tmp_path: Any, policy: str) -> None:
    ns, runner = await start(tmp_path, acl=True, remoting_acl_v1=policy)
    try:
        await group(ns)
        admin, anonymous = await ns.admin(), await ns.client()
        for code, ext, body in WRITES:
            answer = await admin.call(code, ext, body)
            assert answer.code == ResponseCode.NO_PERMISSION, code
            remark = answer.remark or ""
            assert remark.startswith("ACL_V1_REFUSED: ") and f"remotingAclV1={policy}" in remark
        signed_read = await admin.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"})
        assert signed_read.code == (ResponseCode.SUCCESS if policy == "readonly" else ResponseCode.NO_PERMISSION)
        assert (await anonymous.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"})).code == ResponseCode.SUCCESS
        assert ns.service.kv.counts()["entries"] == 0
    finally:
        for c in ns.clients:
            await c.close()
        await runner.cleanup()


# -- one port, two protocols -------------------------------------------------------------------------------------
async def test_http_api_keeps_working_on_the_shared_port(tmp_path: Any) -> None:
    ns, runner = await start(tmp_path, acl=False)
    try:
        c = await ns.client()
        async with aiohttp.ClientSession() as http:
            reg = wire.registration_to_dict(BrokerRegistration("DefaultCluster", "RaftNode00", 0, N0, "LEADER", 1,
                                                               (TopicConfig("TopicA"),)))
            async with http.post(f"http://{ns.addr}/v1/brokers/register", json=reg) as resp:
                assert resp.status == 200 and (await resp.json())["accepted"]
            route = route_of(await c.call(C.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"}))  # registered over HTTP
            assert route.broker_datas[0].broker_addrs == {0: N0}
            assert (await c.call(C.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "RaftNode00"})).code == 0
            async with http.get(f"http://{ns.addr}/v1/routes/TopicA") as resp:  # wiped over remoting
                assert (await resp.json())["queue_datas"][0]["perm"] == 4
            async with http.get(f"http://{ns.addr}/v1/status") as resp:
                status = await resp.json()
            assert status["remoting"]["requests"] == 2 and status["remoting"]["connections"] == 1
            assert status["remoting"]["sniff"]["remoting"] == 1 and status["remoting"]["sniff"]["http"] >= 1
            assert status["write_wiped"] == ["RaftNode00"]
    finally:
        for c in ns.clients:
            await c.close()
        await runner.cleanup()
