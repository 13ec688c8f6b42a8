"""QUERY_MESSAGE (by key, by unique key, with the time range) and VIEW_MESSAGE_BY_ID (by the offset msg
id a send answered) over RocketMQ's remoting (broker/edge/rocketmq/query.py), with ACL on and off."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.protocol.rocketmq import headers
from broker.protocol.rocketmq import properties as rp
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode
from broker.protocol.rocketmq.command import RemotingCommand
from tests.acl_fixtures import CONSUMER, NOBODY, PRODUCER
from tests.broker.edge.rocketmq_support import (
    ACL_OFF,
    acl_on,
    client,
    ext,
    new_uid,
    ok,
    position_of,
    refused,
    send,
    start_cluster,
    stored,
)
from tests.broker.inproc_cluster import InProcBrokerCluster
from tests.broker.serving.rmq_client import RmqClient

INT64_MAX = 2**63 - 1


@pytest.fixture(params=["acl", "noacl"])
async def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[InProcBrokerCluster]:
    baseline = InProcBrokerCluster.baseline()
    props = {} if request.param == "acl" else ACL_OFF
    c = await start_cluster(str(tmp_path / "cluster"), **props)
    try:
        await c.create_topic("T", 2)
        yield c
    finally:
        await c.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)


async def query(c: RmqClient, key: str, *, unique: bool = False, max_num: int = 64, begin: int = 0,
                end: int = INT64_MAX, topic: str = "T") -> RemotingCommand:
    header = headers.QueryMessageRequestHeader(topic=topic, key=key, max_num=max_num, begin_timestamp=begin,
                                               end_timestamp=end, unique_key_query=unique)
    return await c.call(RequestCode.QUERY_MESSAGE, headers.to_ext(header))


async def test_query_by_key_and_unique_key(cluster: InProcBrokerCluster) -> None:
    g = cluster.groups[0]
    leader = g.replicas[0]
    t0 = int(time.time() * 1000)
    async with client(leader, PRODUCER) as p:
        uids = [new_uid() for _ in range(4)]
        sent = [ok(await send(p, "T", i % 2, f"m{i}".encode(), keys=f"k{i} shared", tags="A", uid=uids[i]))
                for i in range(4)]
    await g.wait_replicated()
    async with client(g.replicas[1], CONSUMER) as c:  # a follower answers too
        found = ok(await query(c, "k2"))
        (m,) = stored(found)
        assert (m.body, m.topic, m.queue_id, m.commit_log_offset) == (b"m2", "T", 0, position_of(sent[2]))
        assert m.properties[rp.KEYS] == "k2 shared" and m.properties[rp.UNIQ_KEY] == uids[2]
        assert m.store_host.port == int(g.replicas[1].addr.rsplit(":", 1)[1])  # the replica that answered
        a = ext(found)
        assert int(a["indexLastUpdateTimestamp"]) >= t0 and int(a["indexLastUpdatePhyoffset"]) >= position_of(sent[3])
        assert sorted(x.body for x in stored(ok(await query(c, "shared")))) == [b"m0", b"m1", b"m2", b"m3"]
        assert len(stored(ok(await query(c, "shared", max_num=2)))) == 2
        (u,) = stored(ok(await query(c, uids[1], unique=True)))
        assert u.body == b"m1"
        refused(await query(c, uids[1]), ResponseCode.QUERY_NOT_FOUND)  # a unique id is not a key
        refused(await query(c, "k1", end=t0 - 60_000), ResponseCode.QUERY_NOT_FOUND)  # out of the time range
        refused(await query(c, "k1", topic="U"), ResponseCode.QUERY_NOT_FOUND)
        bad = refused(await query(c, "two words"), ResponseCode.SYSTEM_ERROR)
        assert "INVALID_KEYS" in (bad.remark or "")
    if acl_on(cluster):
        async with client(leader, NOBODY) as n:
            refused(await query(n, "k1"))


async def test_view_message_by_offset_msg_id(cluster: InProcBrokerCluster) -> None:
    g = cluster.groups[0]
    async with client(g.replicas[0], PRODUCER) as p:
        sent = ok(await send(p, "T", 1, b"by id", keys="kid", tags="B"))
    await g.wait_replicated()
    position = position_of(sent)
    for replica in g.replicas:  # the offset msg id names a log position every replica holds
        async with client(replica, CONSUMER) as c:
            got = ok(await c.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(position), "topic": "T"}))
            (m,) = stored(got)
            assert (m.body, m.queue_id, m.queue_offset, m.properties[rp.TAGS]) == (b"by id", 1, 0, "B")
            nothing = refused(await c.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(position + 1)}),
                              ResponseCode.SYSTEM_ERROR)
            assert "MESSAGE_NOT_FOUND" in (nothing.remark or "")
    if acl_on(cluster):
        async with client(g.replicas[0], NOBODY) as n:
            refused(await n.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(position)}))
        async with client(g.replicas[0], None) as anonymous:
            refused(await anonymous.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(position)}))
