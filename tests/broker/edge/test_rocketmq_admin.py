"""mqadmin's topic, subscription-group and broker codes over RocketMQ's remoting
(broker/edge/rocketmq/admin.py): through the Raft log on the leader, refused on a follower, read
anywhere; ACL on (admin codes need an admin account) and off. Pure parts tested without a cluster."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.edge.rocketmq.admin import config_table, parse_config_update, runtime_table
from broker.edge.rocketmq.errors import code_of
from broker.protocol.properties import HALF_TOPIC
from broker.protocol.rocketmq import admin_headers as ah
from broker.protocol.rocketmq import bodies, headers
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode
from broker.server.admin_config import NotUpdatable, check_updates
from broker.server.config import BrokerConfig, parse_broker_config
from broker.service.broker_service import RuntimeInfo
from broker.serving.remoting_server import CommandError
from dledger.config import ConfigError
from tests.acl_fixtures import ADMIN, CONSUMER, PRODUCER
from tests.broker.edge.rocketmq_support import ACL_OFF, acl_on, client, ok, refused, send, start_cluster
from tests.broker.inproc_cluster import InProcBrokerCluster


# -- pure ------------------------------------------------------------------------------------------------------
def _cfg(**extra: str) -> BrokerConfig:
    props = {"brokerClusterName": "C1", "brokerName": "G1", "dLegerGroup": "G1", "dLegerSelfId": "n1",
             "dLegerPeers": "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913", "listenPort": "10921",
             "brokerIP1": "127.0.0.2", "namesrvAddr": "127.0.0.1:9876;127.0.0.1:9877", "storePathRootDir": "/tmp/x",
             "dLegerPeerPassword": "secret-password", **extra}
    return parse_broker_config(props, source="<test>", env={})


def test_runtime_table_holds_our_counters_under_rocketmqs_names() -> None:
    info = RuntimeInfo(broker_name="G1", leads=True, boot_ms=1_700_000_000_000, messages_put=12, messages_got=7,
                       put_tps=1.25, get_tps=0.5, log_first_position=0, log_end_position=4096,
                       disk_used_ratio=0.25, halves_pending=3)
    t = runtime_table(info)
    assert t["brokerVersionDesc"] == "V4_9_8" and t["brokerVersion"] == "409"
    assert (t["msgPutTotalTodayNow"], t["msgGetTotalTodayNow"], t["putMessageTimesTotal"]) == ("12", "7", "12")
    assert (t["putTps"], t["getTransferedTps"], t["getTransferredTps"]) == ("1.25", "0.50", "0.50")
    assert (t["commitLogMinOffset"], t["commitLogMaxOffset"], t["bootTimestamp"]) == ("0", "4096", "1700000000000")
    assert t["commitLogDiskRatio"] == "0.2500" and t["brokerActive"] == "true"
    # Keys we have no counter for are left out, never filled in.
    for absent in ("msgPutTotalTodayMorning", "msgGetTotalYesterdayMorning", "earliestMessageTimeStamp",
                   "pageCacheLockTimeMills", "sendThreadPoolQueueHeadWaitTimeMills"):
        assert absent not in t
    assert "commitLogDiskRatio" not in runtime_table(dataclasses.replace(info, disk_used_ratio=None))


def test_config_table_names_what_rocketmqs_tools_read_and_no_secret() -> None:
    cfg = _cfg()
    t = config_table({"brokerName": "G1", "dledger.self_id": "n1"}, cfg, 2)
    assert (t["brokerClusterName"], t["brokerName"], t["listenPort"], t["brokerIP1"], t["brokerId"]) == (
        "C1", "G1", "10921", "127.0.0.2", "2")
    assert t["namesrvAddr"] == "127.0.0.1:9876;127.0.0.1:9877" and t["enableDLegerCommitLog"] == "true"
    assert t["dledger.self_id"] == "n1"  # our own names stay
    assert not any("secret-password" in v for v in t.values())  # config_table adds no secret


def test_config_update_all_or_nothing() -> None:
    """The edge parses the body (bounded); the server's check tries every key on a copy first
    (``check_updates``, behind ``service.check_config_update``): all change or none."""
    cfg = _cfg()
    props = parse_config_update(b"autoCreateTopicEnable=false\nlongPollingMaxMs=1000\n")
    assert props == {"autoCreateTopicEnable": "false", "longPollingMaxMs": "1000"}
    trial = check_updates(cfg, props)
    assert (trial.auto_create_topic, trial.long_polling_max_ms) == (False, 1000)
    assert (cfg.auto_create_topic, cfg.long_polling_max_ms) == (True, 30_000)  # the copy changed, not cfg
    with pytest.raises(NotUpdatable, match="brokerName"):
        check_updates(cfg, parse_config_update(b"autoCreateTopicEnable=false\nbrokerName=other\n"))
    with pytest.raises(ConfigError):
        check_updates(cfg, parse_config_update(b"autoCreateTopicEnable=false\nlongPollingMaxMs=-5\n"))
    # ... answered as the coded errors map to RocketMQ's response codes (broker/edge/rocketmq/errors.py)
    assert code_of("NOT_UPDATABLE") == ResponseCode.NO_PERMISSION
    assert code_of("BAD_PARAMETER") == ResponseCode.SYSTEM_ERROR
    with pytest.raises(CommandError):
        parse_config_update(b"x=" + b"y" * (65 << 10))


# -- on a cluster ------------------------------------------------------------------------------------------------
@pytest.fixture(params=["acl", "noacl"])
async def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[InProcBrokerCluster]:
    baseline = InProcBrokerCluster.baseline()
    c = await start_cluster(str(tmp_path / "cluster"), **({} if request.param == "acl" else ACL_OFF))
    try:
        yield c
    finally:
        await c.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)


def create_ext(topic: str, queues: int = 4, perm: int = 6) -> dict[str, str]:
    """UPDATE_AND_CREATE_TOPIC's header as mqadmin updateTopic sends it."""
    return headers.to_ext(ah.CreateTopicRequestHeader(
        topic=topic, default_topic="TBW102", read_queue_nums=queues, write_queue_nums=queues, perm=perm,
        topic_filter_type="SINGLE_TAG", topic_sys_flag=0, order=False))


async def test_topics_created_listed_and_deleted(cluster: InProcBrokerCluster) -> None:
    g = cluster.groups[0]
    leader, follower = g.replicas[0], g.replicas[1]
    async with client(leader) as a:
        ok(await a.call(RequestCode.UPDATE_AND_CREATE_TOPIC, create_ext("AT", 3)))
        await cluster.wait_route("AT", [g.name], 3)  # the NameServer routes it at once
        await g.wait_replicated()
        for r in g.replicas:
            assert r.broker.store.topic("AT") is not None
        got = bodies.decode(bodies.TopicConfigSerializeWrapper, ok(await a.call(RequestCode.GET_ALL_TOPIC_CONFIG)).body)
        tc = got.topic_config_table["AT"]
        assert (tc.read_queue_nums, tc.write_queue_nums, tc.perm) == (3, 3, 6)
        assert got.data_version.counter > 0
        bad = refused(await a.call(RequestCode.UPDATE_AND_CREATE_TOPIC, create_ext("AT", 0)), ResponseCode.SYSTEM_ERROR)
        assert "INVALID_QUEUE_NUMS" in (bad.remark or "")
        ok(await a.call(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "AT"}))
        ok(await a.call(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "AT"}))  # gone already: SUCCESS, as RocketMQ
        assert leader.broker.store.topic("AT") is None
        ok(await a.call(RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE))  # mqadmin cleanExpiredCQ, on this replica
        system = bodies.decode(bodies.TopicList, ok(await a.call(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER)).body)
        assert HALF_TOPIC in system.topic_list and "TBW102" in system.topic_list
    async with client(follower) as f:  # writes are the leader's
        refused(await f.call(RequestCode.UPDATE_AND_CREATE_TOPIC, create_ext("FT")), ResponseCode.SERVICE_NOT_AVAILABLE)
        assert leader.broker.store.topic("FT") is None


async def test_subscription_groups(cluster: InProcBrokerCluster) -> None:
    leader = cluster.groups[0].replicas[0]
    sub = bodies.SubscriptionGroupConfig(group_name="SG", consume_enable=False, consume_broadcast_enable=False,
                                         retry_max_times=5)
    async with client(leader) as a:
        ok(await a.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, bodies.encode(sub)))
        got = bodies.decode(bodies.SubscriptionGroupWrapper,
                            ok(await a.call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).body)
        sg = got.subscription_group_table["SG"]
        assert (sg.consume_enable, sg.consume_broadcast_enable, sg.retry_max_times) == (False, False, 5)
        ok(await a.call(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "SG", "removeOffset": "true"}))
        assert "SG" not in leader.broker.store.metadata_view().groups
        refused(await a.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, None, b"{not json"),
                ResponseCode.SYSTEM_ERROR)


async def test_runtime_info_and_config(cluster: InProcBrokerCluster) -> None:
    g = cluster.groups[0]
    await cluster.create_topic("T", 1)
    leader, follower = g.replicas[0], g.replicas[1]
    async with client(leader, PRODUCER if acl_on(cluster) else None) as p:
        for i in range(3):
            ok(await send(p, "T", 0, f"m{i}".encode()))
    async with client(leader) as a:
        table = bodies.decode(bodies.KVTable, ok(await a.call(RequestCode.GET_BROKER_RUNTIME_INFO)).body).table
        assert table["msgPutTotalTodayNow"] == str(leader.broker.counters["messages_sent"]) == "3"
        assert table["commitLogMaxOffset"] == str(leader.broker.store.applied_end_position)
        assert table["brokerActive"] == "true" and float(table["putTps"]) > 0
        conf = ok(await a.call(RequestCode.GET_BROKER_CONFIG))
        props = bodies.decode_properties_text(conf.body)
        assert (props["brokerName"], props["brokerClusterName"], props["brokerId"]) == (g.name, "DefaultCluster", "0")
        assert props["listenPort"] == leader.addr.rsplit(":", 1)[1]
        version = json.loads((conf.ext_fields or {})["version"])
        assert version["counter"] == 0
        ok(await a.call(RequestCode.UPDATE_BROKER_CONFIG, None, b"defaultTopicQueueNums=7\n"))
        assert leader.broker.cfg.default_topic_queue_nums == 7
        conf = ok(await a.call(RequestCode.GET_BROKER_CONFIG))
        assert json.loads((conf.ext_fields or {})["version"])["counter"] == 1
        refused(await a.call(RequestCode.UPDATE_BROKER_CONFIG, None, b"defaultTopicQueueNums=8\nlistenPort=1\n"))
        assert leader.broker.cfg.default_topic_queue_nums == 7  # nothing changed
    async with client(follower) as a:
        table = bodies.decode(bodies.KVTable, ok(await a.call(RequestCode.GET_BROKER_RUNTIME_INFO)).body).table
        assert table["brokerActive"] == "false" and table["msgPutTotalTodayNow"] == "0"
        props = bodies.decode_properties_text(ok(await a.call(RequestCode.GET_BROKER_CONFIG)).body)
        assert props["brokerId"] == str(follower.broker.cfg.follower_broker_id) != "0"


ADMIN_ONLY = [
    (RequestCode.UPDATE_AND_CREATE_TOPIC, create_ext("X")),
    (RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "X"}),
    (RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "X"}),
    (RequestCode.GET_BROKER_CONFIG, None),
    (RequestCode.UPDATE_BROKER_CONFIG, None),
    (RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, None),
]


async def test_acl_admin_codes_need_an_admin(cluster: InProcBrokerCluster) -> None:
    """With ACL on, producers and consumers are refused every admin code (NO_PERMISSION) and an
    unsigned request anything; reads need a signature only. With ACL off, anyone may."""
    leader = cluster.groups[0].replicas[0]
    async with client(leader, CONSUMER) as c, client(leader, PRODUCER) as p, client(leader, None) as anon:
        for code, fields in ADMIN_ONLY:
            body = b"defaultTopicQueueNums=5\n" if code == RequestCode.UPDATE_BROKER_CONFIG else b""
            for who in (c, p, anon):
                got = await who.call(code, fields, body)
                if acl_on(cluster):
                    refused(got)
                else:
                    ok(got)
        if acl_on(cluster):
            refused(await anon.call(RequestCode.GET_BROKER_RUNTIME_INFO))
            assert leader.broker.store.topic("X") is None and leader.broker.cfg.default_topic_queue_nums == 4
        ok(await c.call(RequestCode.GET_BROKER_RUNTIME_INFO))
        ok(await c.call(RequestCode.GET_ALL_TOPIC_CONFIG))
    async with client(leader, ADMIN) as a:
        ok(await a.call(RequestCode.GET_BROKER_CONFIG))
