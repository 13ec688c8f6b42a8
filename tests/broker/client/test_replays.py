"""Issue 23, finding 3: requests captured on the wire and replayed elsewhere or later.

A request is captured as the tap of the replica that received it saw it (its target, its
``Authorization`` header and its body bytes: what an attacker on the path records) and replayed
byte for byte. The effect is read back from every replica's state, not from the status code alone:

- at the new leader after a failover: a topic the captured request created (then deleted) stays
  deleted, a captured send is stored once;
- at the same replica after it restarted (its in-memory nonce window gone) and became leader again:
  refused from the replicated nonces of the Raft log (broker/store/replay.py), state unchanged;
- a captured heartbeat replayed at another replica registers no consumer there;
- and, below the verifier, two entries carrying one nonce: the second is refused at apply by every
  replica alike (its bodies skipped), the same outcome everywhere.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgpack

from broker.client.transport import Transport
from broker.protocol import auth
from broker.serving.security import SIGNED, SignedRequest
from tests.acl_fixtures import ADMIN, CONSUMER
from tests.broker.client.conftest import ClusterFactory
from tests.broker.inproc_cluster import Group, InProcBrokerCluster, Replica, Seen


async def replay(addr: str, seen: Seen) -> tuple[int, dict[str, Any]]:
    """Send the captured request again, byte for byte: (status, decoded answer)."""
    host, _, port = addr.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        head = [f"{seen.method} {seen.target} HTTP/1.1", f"Host: {addr}", "Connection: close",
                "Content-Type: application/x-msgpack", f"Content-Length: {len(seen.raw)}"]
        if seen.authorization is not None:
            head.append(f"Authorization: {seen.authorization}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + seen.raw)
        await writer.drain()
        async with asyncio.timeout(10.0):
            answer = await reader.read()  # until the server closes
    finally:
        writer.close()
    head_raw, _, body = answer.partition(b"\r\n\r\n")
    status = int(head_raw.split()[1])
    if b"application/json" in head_raw.lower():
        import json

        return status, json.loads(body)
    return status, msgpack.unpackb(body, raw=False) if body else {}


def captured(r: Replica, method: str, path: str, **body: Any) -> Seen:
    """The last request ``r`` accepted (signed for it) to ``path`` whose body has these fields."""
    found = [s for s in r.tap.seen(path, method) if all(s.body.get(k) == v for k, v in body.items())]
    assert found, f"no {method} {path} {body} seen at {r}"
    return found[-1]


async def capture_create_send_delete(cluster: InProcBrokerCluster, g: Group, leader: Replica) -> tuple[Seen, Seen]:
    """At ``leader``: create topic X, send one message to T, delete X again. The create and the
    send, as captured."""
    await cluster.call(leader.addr, "POST", "/v1/topics", {"topic": "X", "read_queue_nums": 1, "write_queue_nums": 1})
    await cluster.call(leader.addr, "POST", "/v1/send",
                       {"topic": "T", "queue_id": 0, "messages": [{"body": b"stored once"}]})
    create = captured(leader, "POST", "/v1/topics", topic="X")
    send = captured(leader, "POST", "/v1/send", topic="T")
    await cluster.call(leader.addr, "DELETE", "/v1/topics/X")
    await g.wait_replicated()
    return create, send


def assert_state_unchanged(g: Group) -> None:
    """On every live replica: X deleted, T's queue 0 holds exactly the one message."""
    for r in g.replicas:
        if not r.alive:
            continue
        store = r.broker.store
        assert "X" not in store.metadata_view().topics, f"{r} re-created X"
        cq = store.cqs.get("T", 0)
        assert cq is not None and cq.max_offset == 1, f"{r} holds {cq and cq.max_offset} messages in T/0"


async def test_a_request_captured_at_the_old_leader_is_refused_by_the_new_one(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(topics={"T": 1})
    g = cluster.group("RaftNode00")
    old = await g.wait_leader()
    create, send = await capture_create_send_delete(cluster, g, old)
    await g.kill(old.nid)
    new = await g.wait_leader()
    for seen in (create, send):
        status, answer = await replay(new.addr, seen)
        assert status == 401 and answer["code"] == "WRONG_SCOPE", answer  # signed for the old leader only
    await g.start(old.nid)  # and the old leader, back as a follower, applies the same state
    await g.wait_replicated()
    assert_state_unchanged(g)


async def test_a_replay_at_the_same_replica_after_its_restart_is_refused_from_the_log(
    make_cluster: ClusterFactory,
) -> None:
    cluster = await make_cluster(topics={"T": 1})
    g = cluster.group("RaftNode00")
    first = await g.wait_leader()
    create, send = await capture_create_send_delete(cluster, g, first)
    await g.kill(first.nid)  # its in-memory nonce window is gone with it
    await g.wait_leader()
    await g.start(first.nid)
    again = await g.transfer(first.nid)  # the same replica (same scope) leads again
    assert again.broker.store.nonces.check is not None and len(again.broker.store.nonces) >= 3
    for seen in (create, send):
        status, answer = await replay(again.addr, seen)
        assert (status, answer["code"]) == (401, "REPLAYED_REQUEST"), answer
    await g.wait_replicated()
    assert_state_unchanged(g)


async def test_a_heartbeat_replayed_at_another_replica_registers_no_consumer(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(topics={"T": 1})
    g = cluster.group("RaftNode00")
    leader = await g.wait_leader()
    follower = next(r for r in g.replicas if r is not leader)
    t = Transport(credentials=CONSUMER, tls=None)
    try:
        await t.call(leader.addr, "POST", "/v1/heartbeat",
                     {"client_id": "phantom@1", "groups": [{"group": "G", "topics": ["T"]}]})
    finally:
        await t.close()
    hb = captured(leader, "POST", "/v1/heartbeat", client_id="phantom@1")
    now_ms = follower.broker.monotonic_ms()
    assert [m.client_id for m in leader.broker.consumers.members("G", now_ms)] == ["phantom@1"]
    status, answer = await replay(follower.addr, hb)
    assert status == 401 and answer["code"] == "WRONG_SCOPE", answer
    assert follower.broker.consumers.members("G", now_ms) == []
    assert follower.broker.consumers.owner_of("phantom@1") is None


async def test_two_entries_with_one_nonce_the_second_is_refused_at_apply_on_every_replica(
    make_cluster: ClusterFactory,
) -> None:
    """Below the verifier (whose checks would stop the second request first): the Raft log decides,
    and every replica decides the same, so no replica's state differs from another's."""
    cluster = await make_cluster()
    g = cluster.group("RaftNode00")
    leader = await g.wait_leader()
    server = leader.broker
    header = auth.parse_authorization(auth.authorization(
        ADMIN, "POST", "/v1/topics", b"", int(time.time() * 1000), scope=server.security.scope))
    token = SIGNED.set(SignedRequest(header))
    try:
        await server.service.command({"op": "topic.put", "topic": "Y", "read_queue_nums": 1, "write_queue_nums": 1,
                                      "perm": 6})
        SIGNED.set(SignedRequest(header))  # the same signed request once more
        try:
            await server.service.command({"op": "topic.delete", "topic": "Y"})
            raise AssertionError("the second entry with the same nonce was applied")
        except auth.AuthError as exc:
            assert exc.code == "REPLAYED_REQUEST"
    finally:
        SIGNED.reset(token)
    await g.wait_replicated()
    for r in g.replicas:
        store = r.broker.store
        assert "Y" in store.metadata_view().topics, r  # the delete was skipped everywhere
        assert store.counters["replay_skipped"] == 1 and dict(store.nonces.refused) == {"REPLAYED_REQUEST": 1}, r
    # and the same after a restart: the refusal is part of the state the log and snapshot rebuild
    follower = next(r for r in g.replicas if r is not leader)
    await g.kill(follower.nid)
    await g.start(follower.nid)
    await g.wait_replicated()
    assert "Y" in follower.broker.store.metadata_view().topics
