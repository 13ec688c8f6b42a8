"""mqadmin's codes about queues, consumer groups and their clients over RocketMQ's remoting
(broker/edge/rocketmq/stats.py): topic stats, consume stats, connections, who consumes a topic, time
spans, resets (through the Raft log, then pushed to the group's clients), clones, and running info
relayed to a client; ACL on (group reads need SUB on the group, resets an admin) and off."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.edge.rocketmq import stats
from broker.protocol.rocketmq import admin_headers as ah
from broker.protocol.rocketmq import bodies, headers
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode
from broker.protocol.rocketmq.command import RemotingCommand
from tests.acl_fixtures import CONSUMER, NOBODY, PRODUCER
from tests.broker.edge.rocketmq_support import (
    ACL_OFF,
    acl_on,
    client,
    consumer,
    ext,
    heartbeat,
    ok,
    refused,
    send,
    start_cluster,
)
from tests.broker.inproc_cluster import WAIT_S, InProcBrokerCluster
from tests.broker.serving.rmq_client import RmqClient
from tests.dledger.harness import wait_until


@pytest.fixture(params=["acl", "noacl"])
async def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[InProcBrokerCluster]:
    baseline = InProcBrokerCluster.baseline()
    c = await start_cluster(str(tmp_path / "cluster"), **({} if request.param == "acl" else ACL_OFF))
    try:
        await c.create_topic("T", 2)
        yield c
    finally:
        await c.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)


async def commit(c: RmqClient, group: str, topic: str, queue_id: int, offset: int) -> None:
    header = headers.UpdateConsumerOffsetRequestHeader(consumer_group=group, topic=topic, queue_id=queue_id,
                                                       commit_offset=offset)
    ok(await c.call(RequestCode.UPDATE_CONSUMER_OFFSET, headers.to_ext(header)))


async def pull(c: RmqClient, group: str, topic: str, queue_id: int, offset: int) -> RemotingCommand:
    header = headers.PullMessageRequestHeader(
        consumer_group=group, topic=topic, queue_id=queue_id, queue_offset=offset, max_msg_nums=32,
        sys_flag=headers.pull_sys_flag(commit_offset=False, suspend=False, subscription=True),
        commit_offset=0, suspend_timeout_millis=0, subscription="*", sub_version=0, expression_type="TAG")
    return await c.call(RequestCode.PULL_MESSAGE, headers.to_ext(header))


async def server_request(c: RmqClient, code: int) -> RemotingCommand:
    while True:
        cmd = await wait_until(lambda: c.server_requests.get_nowait(), WAIT_S, f"a request {code} from the broker")
        if cmd.code == code:
            return cmd


async def test_topic_and_consume_stats(cluster: InProcBrokerCluster) -> None:
    g = cluster.groups[0]
    leader = g.replicas[0]
    t0 = int(time.time() * 1000)
    async with client(leader, PRODUCER) as p:
        for i in range(5):
            ok(await send(p, "T", i % 2, f"m{i}".encode()))
    async with client(leader, CONSUMER) as c:
        ok(await heartbeat(c, "127.0.0.1@c1", consumers=(consumer("G", "T", expression="A || B"),)))
        await commit(c, "G", "T", 0, 2)
        stats_answer = ok(await c.call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "T"}))
        ts = bodies.decode(bodies.TopicStatsTable, stats_answer.body)
        table = {mq.queue_id: (mq.broker_name, o.min_offset, o.max_offset) for mq, o in ts.offset_table}
        assert table == {0: (g.name, 0, 3), 1: (g.name, 0, 2)}
        assert all(o.last_update_timestamp >= t0 for _mq, o in ts.offset_table)
        refused(await c.call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "U"}), ResponseCode.TOPIC_NOT_EXIST)

        cs = bodies.decode(bodies.ConsumeStats,
                           ok(await c.call(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "G"})).body)
        rows = {(mq.topic, mq.queue_id): (w.broker_offset, w.consumer_offset, w.last_timestamp > 0)
                for mq, w in cs.offset_table}
        assert rows == {("T", 0): (3, 2, True), ("T", 1): (2, 0, False)}
        empty = bodies.decode(bodies.ConsumeStats,
                              ok(await c.call(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "nobody"})).body)
        assert empty.offset_table == ()

        who = bodies.decode(bodies.GroupList, ok(await c.call(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO,
                                                              {"topic": "T"})).body)
        assert who.group_list == ("G",)
        span = bodies.decode(bodies.QueryConsumeTimeSpanBody,
                             ok(await c.call(RequestCode.QUERY_CONSUME_TIME_SPAN, {"topic": "T", "group": "G"})).body)
        q0 = next(s for s in span.consume_time_span_set if s.message_queue.queue_id == 0)
        assert t0 <= q0.min_time_stamp <= q0.consume_time_stamp <= q0.max_time_stamp and q0.delay_time >= 0
    if acl_on(cluster):
        async with client(leader, NOBODY) as n:  # no SUB on the group
            refused(await n.call(RequestCode.GET_CONSUME_STATS, {"consumerGroup": "G"}))
            refused(await n.call(RequestCode.QUERY_CONSUME_TIME_SPAN, {"topic": "T", "group": "G"}))


async def test_connections(cluster: InProcBrokerCluster) -> None:
    leader = cluster.groups[0].replicas[0]
    async with client(leader, CONSUMER) as c, client(leader, PRODUCER) as p:
        refused(await c.call(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "G"}),
                ResponseCode.CONSUMER_NOT_ONLINE)
        ok(await heartbeat(c, "127.0.0.1@c1", consumers=(consumer("G", "T", "%RETRY%G", expression="A || B"),)))
        # mqadmin finds a group's brokers by its retry topic's route: the heartbeat created it
        await cluster.wait_route("%RETRY%G", [cluster.groups[0].name], 1)
        got = bodies.decode(bodies.ConsumerConnection,
                            ok(await c.call(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "G"})).body)
        (conn,) = got.connection_set
        assert (conn.client_id, conn.language, conn.version) == ("127.0.0.1@c1", "JAVA", 409)
        assert conn.client_addr.startswith("127.0.0.1:")
        assert got.subscription_table["T"].sub_string == "A || B" and "%RETRY%G" in got.subscription_table
        assert (got.message_model, got.consume_type, got.consume_from_where) == (
            "CLUSTERING", "CONSUME_PASSIVELY", "CONSUME_FROM_FIRST_OFFSET")

        ok(await heartbeat(p, "127.0.0.1@p1", producers=("PG",)))
        got_p = await c.call(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "PG"})
        if acl_on(cluster):
            refused(got_p)  # admin only
        async with client(leader) as a:
            prod = bodies.decode(bodies.ProducerConnection,
                                 ok(await a.call(RequestCode.GET_PRODUCER_CONNECTION_LIST,
                                                 {"producerGroup": "PG"})).body)
            assert [x.client_id for x in prod.connection_set] == ["127.0.0.1@p1"]
            refused(await a.call(RequestCode.GET_PRODUCER_CONNECTION_LIST, {"producerGroup": "none"}),
                    ResponseCode.SYSTEM_ERROR)
    async with client(leader, CONSUMER) as c:  # the connections closed: their clients left
        await wait_until(
            lambda: not leader.broker.service.group_members("G")["client_ids"], WAIT_S, "the consumer gone")
        refused(await c.call(RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": "G"}),
                ResponseCode.CONSUMER_NOT_ONLINE)


async def test_reset_by_time_is_replicated_and_pushed_to_the_group(cluster: InProcBrokerCluster) -> None:
    g = cluster.groups[0]
    leader = g.replicas[0]
    async with client(leader, PRODUCER) as p:
        for i in range(4):
            ok(await send(p, "T", i % 2, f"m{i}".encode()))
    first_store = min(leader.broker.store.cqs.get("T", q).get(0).store_ts for q in (0, 1))  # type: ignore[union-attr]
    async with client(leader, CONSUMER) as c, client(leader) as a:
        ok(await heartbeat(c, "127.0.0.1@c1", consumers=(consumer("G", "T"),)))
        await commit(c, "G", "T", 0, 2)
        await commit(c, "G", "T", 1, 1)

        def reset(ts: int, force: bool) -> dict[str, str]:
            return headers.to_ext(ah.ResetOffsetRequestHeader(topic="T", group="G", timestamp=ts, is_force=force))

        if acl_on(cluster):
            refused(await c.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, reset(first_store, True)))
        got = ok(await a.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, reset(first_store, True)))
        table = {mq.queue_id: o for mq, o in bodies.decode(bodies.ResetOffsetBody, got.body).offset_table}
        assert table == {0: 0, 1: 0}
        await g.wait_replicated()
        for r in g.replicas:
            assert r.broker.store.metadata_view().group_offsets("G", "T") == {0: 0, 1: 0}
        pushed = await server_request(c, RequestCode.RESET_CONSUMER_CLIENT_OFFSET)
        h = headers.parse(ah.ResetOffsetRequestHeader, pushed.ext_fields)
        assert (h.topic, h.group, h.timestamp) == ("T", "G", first_store)
        assert {mq.queue_id: o for mq, o in bodies.decode(bodies.ResetOffsetBody, pushed.body).offset_table} == table

        # A commit the client made before it knew is stale: ignored until it pulls the queue, which
        # tells it where the reset moved it (PULL_OFFSET_MOVED), as RocketMQ 5's server-side reset does.
        await commit(c, "G", "T", 0, 2)
        assert g.offsets("G", "T") == {0: 0, 1: 0}
        moved = await pull(c, "G", "T", 0, 2)
        assert moved.code == ResponseCode.PULL_OFFSET_MOVED and ext(moved)["nextBeginOffset"] == "0"
        assert (await pull(c, "G", "T", 0, 0)).code == ResponseCode.SUCCESS  # the reset was taken
        await commit(c, "G", "T", 0, 1)
        ok(await a.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, reset(-1, False)))  # to the end, never forward
        assert g.offsets("G", "T") == {0: 1, 1: 0}
        ok(await a.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, reset(-1, True)))  # forced: to the end
        assert g.offsets("G", "T") == {0: 2, 1: 2}
        # 5.x by queue: one queue to one offset
        by_queue = {**reset(0, True), "queueId": "1", "offset": "1"}
        ok(await a.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, by_queue))
        assert g.offsets("G", "T") == {0: 2, 1: 1}

        clone = headers.to_ext(ah.CloneGroupOffsetRequestHeader(src_group="G", dest_group="G2", topic="T"))
        ok(await a.call(RequestCode.CLONE_GROUP_OFFSET, clone))
        assert g.offsets("G2", "T") == {0: 2, 1: 1}
        refused(await a.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {**reset(0, True), "topic": "U"}),
                ResponseCode.TOPIC_NOT_EXIST)


async def test_running_info_is_relayed_to_the_client(cluster: InProcBrokerCluster,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    leader = cluster.groups[0].replicas[0]
    monkeypatch.setattr(stats, "RELAY_TIMEOUT_S", 0.5)
    async with client(leader, CONSUMER) as c, client(leader) as a:
        ok(await heartbeat(c, "127.0.0.1@c1", consumers=(consumer("G", "T"),)))
        ask = headers.to_ext(ah.GetConsumerRunningInfoRequestHeader(consumer_group="G", client_id="127.0.0.1@c1"))
        pending = await a.send(a.build(RequestCode.GET_CONSUMER_RUNNING_INFO, ask))
        relayed = await server_request(c, RequestCode.GET_CONSUMER_RUNNING_INFO)
        assert headers.parse(ah.GetConsumerRunningInfoRequestHeader, relayed.ext_fields).client_id == "127.0.0.1@c1"
        await c.reply(relayed, body=b'{"properties":{}}')
        assert pending is not None
        answer = ok(await pending)
        assert answer.body == b'{"properties":{}}'
        late = await a.call(RequestCode.GET_CONSUMER_RUNNING_INFO, ask)  # the client does not answer
        refused(late, ResponseCode.CONSUME_MSG_TIMEOUT)
        other = headers.to_ext(ah.GetConsumerRunningInfoRequestHeader(consumer_group="G", client_id="nobody@x"))
        refused(await a.call(RequestCode.GET_CONSUMER_RUNNING_INFO, other), ResponseCode.SYSTEM_ERROR)
