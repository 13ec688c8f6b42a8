"""The broker's RocketMQ edge (broker/edge/rocketmq/, issue 25) on a real in-process group of three replicas,
asked with frames our codecs build the way the official clients build them (tests/broker/edge/rmq.py), signed
like ``AclClientRPCHook`` when ACL is on: every code the edge serves, what the clients read in each answer,
and the refusals (ACL, followers, bad messages)."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.client.message import message_ext_from_dict
from broker.protocol.auth import Credentials
from broker.protocol.rocketmq import bodies, headers
from broker.protocol.rocketmq import message as rm
from broker.protocol.rocketmq import properties as rp
from broker.protocol.rocketmq.codes import RequestCode as C
from broker.protocol.rocketmq.codes import ResponseCode as R
from tests.acl_fixtures import ADMIN, CONSUMER, PRODUCER, STRANGER
from tests.broker.edge.rmq import Rmq, ext_int, messages_of, msg_props, send_header, uniq
from tests.broker.inproc_cluster import Group, InProcBrokerCluster
from tests.dledger.harness import wait_until

FAST_LEVELS = " ".join(["1s"] * 18)


class Env:
    def __init__(self, cluster: InProcBrokerCluster, acl: bool):
        self.cluster = cluster
        self.acl = acl
        self.group: Group = cluster.groups[0]
        self.clients: list[Rmq] = []

    def creds(self, who: Credentials = ADMIN) -> Credentials | None:
        return who if self.acl else None

    async def to(self, nid: str | None = None, who: Credentials = ADMIN, *, anonymous: bool = False,
                 port_offset: int = 0) -> Rmq:
        """A client of the leader (or of replica ``nid``)."""
        r = self.group.replica(nid) if nid else (self.group.leader() or await self.group.wait_leader())
        host, port = r.addr.rsplit(":", 1)
        c = await Rmq.connect(f"{host}:{int(port) + port_offset}", None if anonymous else self.creds(who))
        self.clients.append(c)
        return c

    def leader_addr(self) -> str:
        leader = self.group.leader()
        assert leader is not None
        return leader.addr


@pytest.fixture(params=[True, False], ids=["acl-on", "acl-off"])
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Env]:
    baseline = InProcBrokerCluster.baseline()
    props = {"messageDelayLevel": FAST_LEVELS, "aclEnable": "true" if request.param else "false"}
    cluster = await InProcBrokerCluster.start(str(tmp_path / "c"), broker_props=props)
    e = Env(cluster, request.param)
    try:
        await cluster.create_topic("T", 2)
        yield e
    finally:
        for c in e.clients:
            await c.close()
        await cluster.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)


def offset_id(cmd: Any) -> tuple[str, int]:
    host, offset = rm.parse_offset_msg_id(cmd.ext_fields["msgId"].split(",")[0])
    return str(host), offset


# -- sends and pulls -----------------------------------------------------------------------------------------
async def test_sends_v1_v2_and_batch_are_read_back_as_the_clients_decode_them(env: Env) -> None:
    c = await env.to()
    uid = uniq()
    v2 = await c.send("T", b"v2-body", 1, tags="TagA", keys="k1 k2", uid=uid, seq="7")
    assert v2.code == R.SUCCESS, v2
    ext = v2.ext_fields or {}
    assert ext["transactionId"] == uid and ext["MSG_REGION"] == "DefaultRegion" and ext["queueId"] == "1"
    store_host, position = offset_id(v2)
    assert store_host == env.leader_addr()
    v1 = await c.send("T", b"v1-body", 1, v1=True, tags="TagA")
    assert v1.code == R.SUCCESS and ext_int(v1, "queueOffset") == ext_int(v2, "queueOffset") + 1
    batch, uids = await c.send_batch("T", [b"b0", b"b1", b"b2"], 1, batch_uid="BATCH5X")
    assert batch.code == R.SUCCESS and (batch.ext_fields or {})["transactionId"] == "BATCH5X"
    assert len((batch.ext_fields or {})["msgId"].split(",")) == 3
    plain, _ = await c.send_batch("T", [b"b3"], 1)
    assert "transactionId" not in (plain.ext_fields or {})  # 4.9.8 and Go name no batch

    got = await c.pull("T", 1, 0)
    assert got.code == R.SUCCESS and got.remark == "FOUND"
    assert (ext_int(got, "nextBeginOffset"), ext_int(got, "minOffset"), ext_int(got, "maxOffset")) == (6, 0, 6)
    assert ext_int(got, "suggestWhichBrokerId") == 0
    msgs = messages_of(got)
    assert [m.body for m in msgs] == [b"v2-body", b"v1-body", b"b0", b"b1", b"b2", b"b3"]
    assert [m.queue_offset for m in msgs] == list(range(6)) and all(m.queue_id == 1 for m in msgs)
    first = msgs[0]
    assert first.commit_log_offset == position and first.offset_msg_id == ext["msgId"]
    assert first.properties[rp.UNIQ_KEY] == uid and first.properties[rp.TAGS] == "TagA"
    assert first.properties[rp.KEYS] == "k1 k2" and first.properties["seq"] == "7"
    assert rp.WAIT_STORE_MSG_OK not in first.properties
    sock = c.c.writer.get_extra_info("sockname")
    assert str(first.born_host) == f"{sock[0]}:{sock[1]}" and str(first.store_host) == env.leader_addr()
    assert first.store_timestamp >= first.born_timestamp - 60_000 and first.sys_flag == 0
    assert [m.properties[rp.UNIQ_KEY] for m in msgs[2:5]] == uids
    assert rm.body_crc(first.body) == first.body_crc


async def test_a_retried_send_is_stored_once(env: Env) -> None:
    """The clients keep UNIQ_KEY across the retries of one send: the de-duplication window answers a retry
    with the first copy's result."""
    c = await env.to()
    uid = uniq()
    first = await c.send("T", b"once", 0, uid=uid)
    again = await c.send("T", b"once", 0, uid=uid)
    assert first.code == again.code == R.SUCCESS
    assert again.ext_fields == first.ext_fields
    assert [m.body for m in messages_of(await c.pull("T", 0, 0))] == [b"once"]


async def test_a_compressed_body_is_stored_as_sent_and_our_sdk_inflates_it(env: Env) -> None:
    c = await env.to()
    body = b"compressible " * 1000
    packed = zlib.compress(body, 5)
    assert (await c.send("T", packed, 0, sys_flag=rp.COMPRESSED_FLAG | rp.COMPRESSION_ZLIB_TYPE)).code == R.SUCCESS
    (m,) = messages_of(await c.pull("T", 0, 0))
    assert m.body == packed and m.sys_flag & rp.COMPRESSED_FLAG  # what the official client inflates itself
    assert rm.decompress_body(m.body, m.sys_flag) == body
    pulled = await env.cluster.call(env.leader_addr(), "POST", "/v1/pull", {"topic": "T", "queue_id": 0, "offset": 0})
    (view,) = pulled["messages"]
    assert view["sys_flag"] == rp.COMPRESSED_FLAG | rp.COMPRESSION_ZLIB_TYPE and view["body"] == packed
    ext = message_ext_from_dict(view)
    assert ext.body == body and ext.sys_flag == 0


async def test_followers_never_store_a_send_and_answer_so_that_the_client_retries(env: Env) -> None:
    g = env.group
    follower = next(r for r in g.replicas if r is not g.leader())
    c = await env.to(follower.nid)
    got = await c.send("T", b"x", 0)
    assert got.code == R.SERVICE_NOT_AVAILABLE and "NOT_LEADER" in (got.remark or "")  # retried by the client
    await g.wait_replicated()
    assert g.max_offset("T", 0) == 0


async def test_bad_messages_are_refused_before_anything_is_appended(env: Env) -> None:
    c = await env.to()
    g = env.group
    before = g.leader().broker.node.last_index  # type: ignore[union-attr]
    bad_name = send_header("T", 0, {**msg_props(), "bad name": "x"})
    got = await c.call(C.SEND_MESSAGE_V2, headers.send_header_to_ext_v2(bad_name), b"x")
    assert got.code == R.MESSAGE_ILLEGAL and "INVALID_PROPERTIES" in (got.remark or "")
    reserved = send_header("T", 0, {**msg_props(), "REAL_TOPIC": "Other"})
    got = await c.call(C.SEND_MESSAGE_V2, headers.send_header_to_ext_v2(reserved), b"x")
    assert got.code == R.MESSAGE_ILLEGAL and "reserved" in (got.remark or "")
    got = await c.call(C.SEND_BATCH_MESSAGE, headers.send_header_to_ext_v2(send_header("T", 0, batch=True)),
                       b"\x00\x00\x00\x09garbage")
    assert got.code == R.MESSAGE_ILLEGAL
    got = await c.call(C.SEND_MESSAGE_V2, headers.send_header_to_ext_v2(send_header("T", 0, msg_props())),
                       b"y" * (4 << 20 + 1))
    assert got.code == R.MESSAGE_ILLEGAL and "MESSAGE_TOO_LARGE" in (got.remark or "")
    got = await c.call(C.SEND_MESSAGE_V2, headers.send_header_to_ext_v2(send_header("T", 0, msg_props(uid="no/"))),
                       b"x")
    assert got.code == R.MESSAGE_ILLEGAL and "INVALID_UNIQUE_ID" in (got.remark or "")
    got = await c.send("T", b"x", 7)
    assert got.code == R.MESSAGE_ILLEGAL and "INVALID_QUEUE_ID" in (got.remark or "")
    got = await c.send("%DLQ%" + "g" * 130, b"x", 0)
    assert got.code != R.SUCCESS
    assert g.leader().broker.node.last_index == before  # type: ignore[union-attr]


async def test_an_unknown_topic_is_created_on_first_send_and_routed(env: Env) -> None:
    c = await env.to()
    got = await c.send("Fresh", b"x", 2)
    assert got.code == R.SUCCESS
    await env.cluster.wait_route("Fresh", [env.group.name], 4)


async def test_a_read_only_topic_refuses_sends_with_no_permission(env: Env) -> None:
    await env.cluster.create_topic("RO", 1, perm=4)
    got = await (await env.to()).send("RO", b"x", 0)
    assert got.code == R.NO_PERMISSION


async def test_pull_answers_as_the_clients_interpret_them(env: Env) -> None:
    c = await env.to()
    for tag in ("TagA", "TagB", "TagA"):
        assert (await c.send("T", tag.encode(), 0, tags=tag)).code == R.SUCCESS
    tagged = await c.pull("T", 0, 0, expression="TagB")
    assert [m.body for m in messages_of(tagged)] == [b"TagB"] and ext_int(tagged, "nextBeginOffset") == 3
    none = await c.pull("T", 0, 2, expression="TagC")
    assert none.code == R.PULL_RETRY_IMMEDIATELY and ext_int(none, "nextBeginOffset") == 3
    end = await c.pull("T", 0, 3)
    assert end.code == R.PULL_NOT_FOUND and ext_int(end, "nextBeginOffset") == 3
    beyond = await c.pull("T", 0, 99)
    assert beyond.code == R.PULL_OFFSET_MOVED and ext_int(beyond, "nextBeginOffset") == 3
    negative = await c.pull("T", 0, -5)
    assert negative.code == R.PULL_OFFSET_MOVED and ext_int(negative, "nextBeginOffset") == 0
    empty = await c.pull("T", 1, 0)
    assert empty.code == R.PULL_NOT_FOUND and empty.remark == "NO_MESSAGE_IN_QUEUE"
    sql = await c.pull("T", 0, 0, expression="TAGS = 'TagA'", kind="SQL92")
    assert [m.queue_offset for m in messages_of(sql)] == [0, 2]
    bad = await c.pull("T", 0, 0, expression="a BETWEEN", kind="SQL92")
    assert bad.code == R.SUBSCRIPTION_PARSE_FAILED


async def test_a_held_pull_answers_when_a_message_arrives(env: Env) -> None:
    c = await env.to()
    # any Java long is a valid suspendTimeoutMillis: held at most longPollingMaxMs (30 s here)
    held = asyncio.ensure_future(c.pull("T", 1, 0, suspend_ms=2**62, timeout_s=40))
    await asyncio.sleep(0)
    assert not held.done()
    assert (await (await env.to()).send("T", b"late", 1)).code == R.SUCCESS
    got = await asyncio.wait_for(held, 20)
    assert [m.body for m in messages_of(got)] == [b"late"]


async def test_a_push_consumers_pull_filters_by_its_heartbeats_subscription(env: Env) -> None:
    c = await env.to(who=CONSUMER)
    p = await env.to(who=PRODUCER)
    for tag in ("TagA", "TagB"):
        assert (await p.send("T", tag.encode(), 0, tags=tag)).code == R.SUCCESS
    before = await c.pull("T", 0, 0, expression=None)
    assert before.code == R.SUBSCRIPTION_NOT_EXIST
    assert (await c.heartbeat("10.0.0.1@a", {"cg": {"T": ("TAG", "TagB")}})).code == R.SUCCESS
    got = await c.pull("T", 0, 0, expression=None)
    assert [m.body for m in messages_of(got)] == [b"TagB"]
    assert (await c.heartbeat("10.0.0.1@a", {"cg": {"T": ("SQL92", "TAGS = 'TagA'")}})).code == R.SUCCESS
    assert [m.body for m in messages_of(await c.pull("T", 0, 0, expression=None))] == [b"TagA"]
    assert (await c.heartbeat("10.0.0.1@a", {"cg": {"T": ("SQL92", "a >")}})).code == R.SUBSCRIPTION_PARSE_FAILED


async def test_a_pulls_commit_flag_commits_the_offset_through_the_log(env: Env) -> None:
    c = await env.to()
    for i in range(3):
        assert (await c.send("T", b"m%d" % i, 0)).code == R.SUCCESS
    await c.pull("T", 0, 3, commit_offset=2)
    await wait_until(lambda: env.group.offset("cg", "T", 0) == 2, 20, "the offset committed behind the pull")
    await env.group.wait_replicated()
    assert all(r.broker.store.metadata_view().offsets.get(("cg", "T", 0)) == 2 for r in env.group.replicas)


# -- membership ----------------------------------------------------------------------------------------------
async def test_heartbeats_notify_members_and_a_closed_connection_leaves_its_groups(env: Env) -> None:
    a = await env.to(who=CONSUMER)
    b = await env.to(who=CONSUMER)
    sub = {"cg": {"T": ("TAG", "*"), "%RETRY%cg": ("TAG", "*")}}
    assert (await a.heartbeat("10.0.0.1@a", sub)).code == R.SUCCESS
    note = await asyncio.wait_for(a.c.server_requests.get(), 10)
    assert note.code == C.NOTIFY_CONSUMER_IDS_CHANGED and note.is_oneway and note.ext_fields == {"consumerGroup": "cg"}
    assert (await a.heartbeat("10.0.0.1@a", sub)).code == R.SUCCESS  # nothing changed: nobody told
    assert (await b.heartbeat("10.0.0.2@b", sub)).code == R.SUCCESS
    assert (await asyncio.wait_for(a.c.server_requests.get(), 10)).code == C.NOTIFY_CONSUMER_IDS_CHANGED
    assert (await asyncio.wait_for(b.c.server_requests.get(), 10)).code == C.NOTIFY_CONSUMER_IDS_CHANGED
    assert a.c.server_requests.empty()
    listed = await a.call(C.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"})
    ids = bodies.decode(bodies.GetConsumerListByGroupResponseBody, listed.body).consumer_id_list
    assert ids == ("10.0.0.1@a", "10.0.0.2@b")
    await b.close()
    assert (await asyncio.wait_for(a.c.server_requests.get(), 10)).code == C.NOTIFY_CONSUMER_IDS_CHANGED
    listed = await a.call(C.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"})
    assert bodies.decode(bodies.GetConsumerListByGroupResponseBody, listed.body).consumer_id_list == ("10.0.0.1@a",)
    got = await a.call(C.UNREGISTER_CLIENT, {"clientID": "10.0.0.1@a", "consumerGroup": "cg"})
    assert got.code == R.SUCCESS
    none = await a.call(C.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"})
    assert none.code == R.SYSTEM_ERROR and none.remark == "no consumer for this group, cg"


async def test_a_client_id_stays_its_first_accounts(env: Env) -> None:
    if not env.acl:
        return  # one owner for everybody without ACL (a meaningful check only with it on)
    c = await env.to(who=CONSUMER)
    assert (await c.heartbeat("10.0.0.1@a", {"cg": {"T": ("TAG", "*")}})).code == R.SUCCESS
    other = await env.to(who=Credentials("tracer", "tracer-secret-01"))
    taken = await other.heartbeat("10.0.0.1@a", {"cg": {"T": ("TAG", "*")}})
    assert taken.code == R.NO_PERMISSION and "CLIENT_ID_TAKEN" in (taken.remark or "")


async def test_check_client_config_checks_an_sql92_subscription(env: Env) -> None:
    c = await env.to()

    def body(expr: str) -> bytes:
        return bodies.encode(bodies.CheckClientRequestBody(client_id="x@1", group="cg", subscription_data=
                             bodies.SubscriptionData(topic="T", sub_string=expr, expression_type="SQL92")))

    assert (await c.call(C.CHECK_CLIENT_CONFIG, None, body("a > 1"))).code == R.SUCCESS
    assert (await c.call(C.CHECK_CLIENT_CONFIG, None, body("a >"))).code == R.SUBSCRIPTION_PARSE_FAILED


async def test_orderly_consumers_lock_queues_one_client_at_a_time(env: Env) -> None:
    a = await env.to(who=CONSUMER)

    def lock_body(client: str, qids: tuple[int, ...], broker: str = "RaftNode00") -> bytes:
        return bodies.encode(bodies.LockBatchRequestBody(
            consumer_group="cg", client_id=client,
            mq_set=tuple(bodies.MessageQueue(topic="T", broker_name=broker, queue_id=q) for q in qids)))

    def locked(cmd: Any) -> list[int]:
        return sorted(mq.queue_id for mq in bodies.decode(bodies.LockBatchResponseBody, cmd.body).lock_ok_mq_set)

    assert locked(await a.call(C.LOCK_BATCH_MQ, None, lock_body("A", (0, 1)))) == [0, 1]
    assert locked(await a.call(C.LOCK_BATCH_MQ, None, lock_body("B", (0, 1)))) == []
    assert locked(await a.call(C.LOCK_BATCH_MQ, None, lock_body("A", (0, 1)))) == [0, 1]  # renewed
    assert (await a.call(C.UNLOCK_BATCH_MQ, None, lock_body("A", (0,)))).code == R.SUCCESS
    assert locked(await a.call(C.LOCK_BATCH_MQ, None, lock_body("B", (0, 1)))) == [0]
    assert locked(await a.call(C.LOCK_BATCH_MQ, None, lock_body("B", (0,), "OtherGroup"))) == []


# -- offsets ---------------------------------------------------------------------------------------------------
async def test_consumer_offsets_through_the_log_and_queue_offsets(env: Env) -> None:
    c = await env.to()
    q = {"consumerGroup": "cg", "topic": "T", "queueId": "0"}
    got = await c.call(C.QUERY_CONSUMER_OFFSET, q)
    assert got.code == R.QUERY_NOT_FOUND
    stamps = []
    for i in range(3):
        sent = await c.send("T", b"m%d" % i, 0)
        stamps.append(messages_of(await c.pull("T", 0, ext_int(sent, "queueOffset")))[0].store_timestamp)
    assert (await c.call(C.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": "2"})).code == R.SUCCESS
    assert ext_int(await c.call(C.QUERY_CONSUMER_OFFSET, q), "offset") == 2
    await env.group.wait_replicated()
    follower = next(r for r in env.group.replicas if r is not env.group.leader())
    f = await env.to(follower.nid)
    assert ext_int(await f.call(C.QUERY_CONSUMER_OFFSET, q), "offset") == 2  # offsets are replicated
    refused = await f.call(C.UPDATE_CONSUMER_OFFSET, {**q, "commitOffset": "3"})
    assert refused.code == R.SERVICE_NOT_AVAILABLE and "NOT_LEADER" in (refused.remark or "")
    tq = {"topic": "T", "queueId": "0"}
    assert ext_int(await c.call(C.GET_MAX_OFFSET, tq), "offset") == 3
    assert ext_int(await c.call(C.GET_MIN_OFFSET, tq), "offset") == 0
    assert ext_int(await c.call(C.GET_MAX_OFFSET, {"topic": "T", "queueId": "1"}), "offset") == 0
    assert ext_int(await c.call(C.GET_EARLIEST_MSG_STORETIME, tq), "timestamp") == stamps[0]
    assert ext_int(await c.call(C.GET_EARLIEST_MSG_STORETIME, {"topic": "T", "queueId": "1"}), "timestamp") == -1
    search = {**tq, "timestamp": str(stamps[1])}
    first_at = ext_int(await c.call(C.SEARCH_OFFSET_BY_TIMESTAMP, search), "offset")
    assert stamps[first_at] >= stamps[1] and (first_at == 0 or stamps[first_at - 1] < stamps[1])
    last_at = ext_int(await c.call(C.SEARCH_OFFSET_BY_TIMESTAMP, {**search, "boundaryType": "upper"}), "offset")
    assert stamps[last_at] <= stamps[1] and (last_at == 2 or stamps[last_at + 1] > stamps[1])


# -- retries --------------------------------------------------------------------------------------------------
async def test_send_back_goes_to_the_retry_topic_then_the_dlq(env: Env) -> None:
    c = await env.to(who=CONSUMER)
    p = await env.to(who=PRODUCER)
    sent = await p.send("T", b"fail", 0, tags="TagA")
    _host, position = offset_id(sent)
    back = {"group": "cg", "offset": str(position), "delayLevel": "1", "originMsgId": "x", "originTopic": "T",
            "maxReconsumeTimes": "1", "unitMode": "false"}
    refused = await c.call(C.CONSUMER_SEND_MSG_BACK, back)
    assert refused.code == R.NO_PERMISSION and "NOT_SUBSCRIBED" in (refused.remark or "")  # issue 23
    assert (await c.heartbeat("10.0.0.1@a", {"cg": {"T": ("TAG", "*")}})).code == R.SUCCESS
    assert (await c.call(C.CONSUMER_SEND_MSG_BACK, back)).code == R.SUCCESS
    await wait_until(lambda: env.group.max_offset("%RETRY%cg", 0) == 1, 20, "the copy in %RETRY%cg (delay level 1)")
    (retry,) = messages_of(await c.pull("%RETRY%cg", 0, 0))
    assert retry.topic == "%RETRY%cg" and retry.reconsume_times == 1 and retry.body == b"fail"
    assert retry.properties["RETRY_TOPIC"] == "T" and retry.properties[rp.TAGS] == "TagA"
    assert retry.properties["ORIGIN_MESSAGE_ID"] == sent.ext_fields["msgId"]  # type: ignore[index]
    again = {**back, "offset": str(retry.commit_log_offset)}
    assert (await c.call(C.CONSUMER_SEND_MSG_BACK, again)).code == R.SUCCESS  # reconsumed once = max: DLQ
    await wait_until(lambda: env.group.max_offset("%DLQ%cg", 0) == 1, 20, "the copy in %DLQ%cg")
    (dead,) = messages_of(await c.pull("%DLQ%cg", 0, 0))
    assert dead.body == b"fail" and dead.reconsume_times == 1
    dlq_now = {**back, "delayLevel": "-1"}
    assert (await c.call(C.CONSUMER_SEND_MSG_BACK, dlq_now)).code == R.SUCCESS  # delayLevel < 0: straight there
    await wait_until(lambda: env.group.max_offset("%DLQ%cg", 0) == 2, 20, "the second copy in %DLQ%cg")


# -- ACL, unknown codes, ports --------------------------------------------------------------------------------
async def test_acl_1_0_signatures_and_permissions(env: Env) -> None:
    if not env.acl:
        anonymous = await env.to(anonymous=True)
        assert (await anonymous.send("T", b"x", 0)).code == R.SUCCESS
        return
    anonymous = await env.to(anonymous=True)
    assert (await anonymous.send("T", b"x", 0)).code == R.NO_PERMISSION
    stranger = await env.to(who=STRANGER)
    assert (await stranger.pull("T", 0, 0)).code == R.NO_PERMISSION
    producer = await env.to(who=PRODUCER)
    assert (await producer.send("T", b"x", 0)).code == R.SUCCESS
    assert (await producer.pull("T", 0, 0)).code == R.NO_PERMISSION
    consumer = await env.to(who=CONSUMER)
    assert (await consumer.send("T", b"x", 0)).code == R.NO_PERMISSION
    assert (await consumer.pull("T", 0, 0)).code == R.SUCCESS
    tampered = consumer.c.build(C.PULL_MESSAGE, {"consumerGroup": "cg", "topic": "T", "queueId": "0"})
    assert tampered.ext_fields is not None
    tampered.ext_fields["queueId"] = "1"  # after signing
    fut = await consumer.c.send(tampered)
    assert fut is not None and (await asyncio.wait_for(fut, 10)).code == R.NO_PERMISSION


async def test_unknown_codes_and_http_on_the_same_port(env: Env) -> None:
    c = await env.to()
    got = await c.call(C.QUERY_CONSUME_QUEUE, {})
    assert got.code == R.REQUEST_CODE_NOT_SUPPORTED
    assert got.remark == f" request type {int(C.QUERY_CONSUME_QUEUE)} not supported"
    status = await env.cluster.call(env.leader_addr(), "GET", "/v1/status")
    assert status["rocketmq"]["requests"] >= 1 and status["rocketmq"]["address"] == env.leader_addr()


async def test_the_vip_channel_serves_the_same(tmp_path: Path) -> None:
    cluster = await InProcBrokerCluster.start(str(tmp_path / "vip"), broker_props={"vipChannelEnable": "true"})
    env = Env(cluster, True)
    try:
        await cluster.create_topic("T", 1)
        vip = await env.to(port_offset=-2)
        assert (await vip.send("T", b"vip", 0)).code == R.SUCCESS
        assert [m.body for m in messages_of(await (await env.to()).pull("T", 0, 0))] == [b"vip"]
        status = await cluster.call(env.leader_addr(), "GET", "/v1/status")
        host, port = env.leader_addr().rsplit(":", 1)
        assert status["rocketmq"]["vip_address"] == f"{host}:{int(port) - 2}"
    finally:
        for c in env.clients:
            await c.close()
        await cluster.stop()
