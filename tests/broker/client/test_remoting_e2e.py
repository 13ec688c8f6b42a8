"""The SDK over the broker's binary protocol (issue 13) on real broker groups (in-process log, real
sockets): routes advertise each replica's remoting address, producers and pull consumers use it
(no /v1/send or /v1/pull reaches the HTTP port), auto-batched concurrent sends each get their own
offset, ACL refusals and NOT_LEADER arrive as over HTTP, and HTTP can be forced."""

from __future__ import annotations

import asyncio

import pytest

from broker.client import ClientError, Message, MessageQueue, Producer, PullConsumer, PullStatus
from broker.client.transport import Transport
from broker.protocol.frames import Op
from tests.acl_fixtures import CONSUMER, NOBODY, PRODUCER
from tests.broker.client.conftest import ClusterFactory
from tests.broker.inproc_cluster import WAIT_S, InProcBrokerCluster
from tests.dledger.harness import wait_until

BINARY = {"remotingListenPort": "0"}


def binary_requests(cluster: InProcBrokerCluster) -> int:
    return sum(r.server.remoting.stats.requests for g in cluster.groups for r in g.replicas if r.server is not None)


async def test_routes_advertise_the_binary_port_and_the_sdk_uses_it(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 2}, broker_props=BINARY)
    g = cluster.group("RaftNode00")

    async def advertised() -> bool:
        route = await cluster.transport.call(cluster.namesrvs[0].addr, "GET", "/v1/routes/T", params={"v": 1})
        bd = route["broker_datas"][0]
        return len(bd["broker_addrs"]) == 3 and set(bd.get("remoting_addrs", {})) == set(bd["broker_addrs"])

    await wait_until(advertised, WAIT_S, "every replica to advertise its binary port")
    async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER, batch_max_delay_ms=5) as p:
        mq = MessageQueue("T", "RaftNode00", 0)
        results = await asyncio.gather(*(p.send(Message("T", f"m{i}".encode(), keys=[f"k{i}"]), queue=mq)
                                         for i in range(40)))
        offsets = [r.queue_offset for r in results]
        assert sorted(offsets) == list(range(40))  # each caller its own offset
        stored = await g.messages("T", 0)
        for r in results:
            assert stored[r.queue_offset]["unique_id"] == r.unique_id
            assert stored[r.queue_offset]["msg_id"] == r.msg_id
        assert cluster.all_requests("/v1/send") == []  # nothing went over HTTP
        sends = binary_requests(cluster)
        assert 1 <= sends < 40  # coalesced: fewer requests than messages
    http_pulls = len(cluster.all_requests("/v1/pull"))  # the test's own reads (g.messages) use HTTP
    async with PullConsumer("pc", cluster.namesrv_addr, credentials=CONSUMER) as pc:
        await pc.fetch_message_queues("T")
        res = await pc.pull(mq, 0, max_count=64)
        assert res.status is PullStatus.FOUND and [m.queue_offset for m in res.messages] == list(range(40))
        assert {m.body for m in res.messages} == {f"m{i}".encode() for i in range(40)}
        assert len(cluster.all_requests("/v1/pull")) == http_pulls
        assert binary_requests(cluster) > sends


async def test_round_robin_sends_share_requests_across_queues(make_cluster: ClusterFactory) -> None:
    """Issue 13: concurrent sends to the four queues of one group share requests; each message is
    stored in the queue the producer chose and its result names that queue and offset."""
    cluster = await make_cluster(n_groups=1, topics={"T": 4}, broker_props=BINARY)
    g = cluster.group("RaftNode00")
    async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER, batch_max_delay_ms=5) as p:
        results = await asyncio.gather(*(p.send(Message("T", f"m{i}".encode())) for i in range(60)))
        # sent together, all 60 reach the batcher in one loop turn: fewer requests than queues
        # (per-queue batches took at least 4)
        assert 1 <= binary_requests(cluster) < 4, binary_requests(cluster)
    by_queue: dict[int, list[str]] = {}
    for r in results:
        assert r.message_queue.topic == "T" and r.message_queue.broker_name == "RaftNode00"
        by_queue.setdefault(r.message_queue.queue_id, []).append(r.unique_id)
    assert sorted(by_queue) == [0, 1, 2, 3] and all(len(v) == 15 for v in by_queue.values())  # round-robin
    for qid, uids in by_queue.items():
        stored = await g.messages("T", qid)
        assert sorted(m["unique_id"] for m in stored) == sorted(uids)
        for r in results:
            if r.message_queue.queue_id == qid:
                assert stored[r.queue_offset]["unique_id"] == r.unique_id


async def test_acl_refusal_and_forced_http(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 1}, broker_props=BINARY)
    async with Producer("pg", cluster.namesrv_addr, credentials=NOBODY, retry_times=0) as p:
        with pytest.raises(ClientError) as e:
            await p.send(Message("T", b"no"))
        assert (e.value.code, e.value.status) == ("NO_PERMISSION", 403)
    assert cluster.all_requests("/v1/send") == []
    http = Transport(credentials=PRODUCER, protocol="http")
    try:
        async with Producer("pg", cluster.namesrv_addr, transport=http) as p:
            r = await p.send(Message("T", b"over http"))
        assert len(cluster.all_requests("/v1/send")) == 1 and r.queue_offset == 0
    finally:
        await http.close()


async def test_not_leader_over_binary_is_followed(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 1}, broker_props=BINARY)
    g = cluster.group("RaftNode00")
    async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER) as p:
        assert (await p.send(Message("T", b"a"))).queue_offset == 0
        await g.transfer("n1")  # the producer's cached route still names n0
        r = await asyncio.wait_for(p.send(Message("T", b"b")), WAIT_S)
        assert r.queue_offset == 1
    assert cluster.all_requests("/v1/send") == []


async def test_an_unreachable_binary_port_falls_back_to_http(make_cluster: ClusterFactory) -> None:
    from tests.dledger.harness import free_ports

    cluster = await make_cluster(n_groups=1, topics={"T": 1})  # HTTP only
    leader = cluster.group("RaftNode00").replicas[0]
    t = Transport(credentials=PRODUCER)
    try:
        t._remoting_addrs[leader.addr] = f"127.0.0.1:{free_ports(1)[0]}"  # advertised, but nobody listens
        answer = await t.operation(leader.addr, Op.SEND, {"topic": "T", "queue_id": 0, "messages": [{"body": b"x"}]})
        assert answer["status"] == "SEND_OK"
        assert len(cluster.all_requests("/v1/send")) == 1
    finally:
        await t.close()


async def test_a_pull_at_a_replica_whose_log_is_closing_is_a_coded_retryable_error(
    make_cluster: ClusterFactory,
) -> None:
    """Issue 23, finding 7: a binary PULL at a replica whose log closed under it (the replica is
    stopping) answered 500 INTERNAL (``StoreClosedError`` was not mapped): now 503
    ``SERVICE_UNAVAILABLE``, which the SDK retries (elsewhere)."""
    from broker.client.remoting import RemotingConnection
    from broker.client.signer import Signer
    from broker.protocol.frames import Op

    cluster = await make_cluster(n_groups=1, topics={"T": 1}, broker_props=BINARY)
    g = cluster.group("RaftNode00")
    await cluster.group("RaftNode00").put("T", 0, 3)
    await g.wait_replicated()
    leader = await g.wait_leader()
    f = next(r for r in g.replicas if r is not leader)
    server = f.broker
    assert server.remoting_address is not None
    await server.node.stop()  # the log closes; the listener still answers (as during a stop)
    conn = RemotingConnection(server.remoting_address, error=ClientError, signer=Signer(CONSUMER))
    try:
        with pytest.raises(ClientError) as e:
            await conn.call(Op.PULL, {"topic": "T", "queue_id": 0, "offset": 0, "max_count": 8}, 10.0)
        assert (e.value.code, e.value.status) == ("SERVICE_UNAVAILABLE", 503), e.value
    finally:
        await conn.close()
        server.store.close()  # what the node's stop would have run on its way out
