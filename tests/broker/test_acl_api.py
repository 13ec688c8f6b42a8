"""Issue 10, finding 4: with ACL on, no broker route but ``GET /v1/status`` works without credentials,
and each works only with the permission it needs — on the leader and on followers alike.

One in-process 3-replica group and a NameServer, both with ``aclEnable=true`` (the brokers register
with their group's account). Every route is driven by a stranger, by an account that may do nothing,
and by the account that may.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.client import Message, Producer, PullConsumer
from broker.client.admin import Admin
from broker.client.transport import ClientError, Transport
from broker.protocol.auth import Credentials
from tests.acl_fixtures import ADMIN, CONSUMER, NOBODY, PRODUCER, STRANGER, write_acl
from tests.broker.harness import BrokerCluster
from tests.dledger.harness import wait_until


@pytest.fixture
async def cluster(tmp_path: Any) -> AsyncIterator[BrokerCluster]:
    acl = write_acl(str(tmp_path / "plain_acl.yml"))
    c = BrokerCluster(str(tmp_path), acl_file=acl, longPollingMaxMs=1000)
    await c.start()
    try:
        yield c
    finally:
        await c.stop()


async def call(creds: Credentials | None, addr: str, method: str, path: str, body: Any = None,
               params: dict[str, Any] | None = None) -> Any:
    t = Transport(timeout_s=5.0, credentials=creds, tls=None)
    try:
        return await t.call(addr, method, path, body, params=params)
    finally:
        await t.close()


async def status_of(creds: Credentials | None, addr: str, method: str, path: str, body: Any = None,
                    params: dict[str, Any] | None = None) -> tuple[int, str]:
    try:
        await call(creds, addr, method, path, body, params)
    except ClientError as exc:
        return exc.status, exc.code
    return 200, "OK"


# (method, path, body, params, the account that may) — every route of broker/edge/http_api.py but /v1/status
ROUTES: list[tuple[str, str, Any, dict[str, Any] | None, Credentials]] = [
    ("POST", "/v1/send", {"topic": "T", "messages": [{"body": b"x"}]}, None, PRODUCER),
    ("POST", "/v1/pull", {"topic": "T", "queue_id": 0, "offset": 0, "consumer_group": "g"}, None, CONSUMER),
    ("GET", "/v1/msg/key", None, {"topic": "T", "key": "k"}, CONSUMER),
    ("GET", "/v1/msg/unique", None, {"topic": "T", "unique_id": "U1"}, CONSUMER),
    ("GET", "/v1/msg/offset", None, {"topic": "T", "queue_id": 0, "offset": 0}, CONSUMER),
    ("GET", "/v1/offset/search", None, {"topic": "T", "queue_id": 0, "ts": 0}, CONSUMER),
    ("POST", "/v1/topics", {"topic": "T2"}, None, ADMIN),
    ("GET", "/v1/topics", None, None, CONSUMER),
    ("GET", "/v1/topics/T", None, None, CONSUMER),
    ("GET", "/v1/topics/T/status", None, None, CONSUMER),
    ("POST", "/v1/groups", {"group": "g2"}, None, ADMIN),
    ("GET", "/v1/groups", None, None, CONSUMER),
    ("GET", "/v1/groups/g/progress", None, None, CONSUMER),
    ("GET", "/v1/groups/g/consumers", None, None, CONSUMER),
    ("POST", "/v1/offsets", {"group": "g", "topic": "T", "offsets": {"0": 0}}, None, CONSUMER),
    ("GET", "/v1/offsets", None, {"group": "g", "topic": "T"}, CONSUMER),
    ("POST", "/v1/offsets/reset", {"group": "g", "topic": "T", "offsets": {"0": 0}}, None, ADMIN),
    ("POST", "/v1/heartbeat", {"client_id": "c1", "groups": [{"group": "g", "topics": ["T"]}]}, None, CONSUMER),
    ("POST", "/v1/unregister", {"client_id": "c1"}, None, CONSUMER),
    ("DELETE", "/v1/groups/g2", None, None, ADMIN),
    ("DELETE", "/v1/topics/T2", None, None, ADMIN),
    ("GET", "/v1/replica/files", None, {"limit": 5}, ADMIN),
    ("POST", "/v1/admin/clean-expired-cq", {}, None, ADMIN),
    ("GET", "/v1/admin/membership", None, None, ADMIN),
    # issue 27: a membership change is an admin's, on the leader (before the transfer below moves it;
    # this learner never starts: it counts for nothing)
    ("POST", "/v1/admin/membership", {"op": "add_learner", "id": "n9", "address": "127.0.0.1:9"}, None, ADMIN),
    ("POST", "/v1/admin/transfer", {}, None, ADMIN),
]


async def test_every_route_needs_the_right_account(cluster: BrokerCluster) -> None:
    leader = cluster.writable_leader()
    assert leader is not None
    addr = leader.cfg.address
    await call(ADMIN, addr, "POST", "/v1/topics", {"topic": "T", "read_queue_nums": 1, "write_queue_nums": 1})
    await call(ADMIN, addr, "POST", "/v1/groups", {"group": "g"})
    msg_id = (await call(PRODUCER, addr, "POST", "/v1/send", {"topic": "T", "messages": [
        {"body": b"hello", "keys": ["k"], "unique_id": "U1"}]}))["results"][0]["msg_id"]
    routes = [*ROUTES, ("GET", f"/v1/msg/id/{msg_id}", None, None, CONSUMER)]
    assert (await call(None, addr, "GET", "/v1/status"))["security"]["acl"] is True
    for method, path, body, params, allowed in routes:
        where = f"{method} {path}"
        assert await status_of(None, addr, method, path, body, params) == (401, "NO_CREDENTIALS"), where
        assert await status_of(STRANGER, addr, method, path, body, params) == (401, "SIGNATURE_INVALID"), where
        st, code = await status_of(NOBODY, addr, method, path, body, params)
        if path == "/v1/unregister":  # signed, but the client id is not its own
            assert (st, code) == (403, "CLIENT_ID_TAKEN"), where
        elif allowed is not CONSUMER or path not in ("/v1/topics", "/v1/topics/T", "/v1/topics/T/status",
                                                       "/v1/groups"):
            assert (st, code) == (403, "NO_PERMISSION"), where
        other = CONSUMER if allowed is not CONSUMER else PRODUCER
        if allowed is ADMIN or path in ("/v1/send", "/v1/pull", "/v1/offsets"):
            assert (await status_of(other, addr, method, path, body, params))[0] == 403, (where, other.access_key)
        assert (await status_of(allowed, addr, method, path, body, params)) == (200, "OK"), where


async def test_followers_enforce_the_same_acl_and_the_sdk_passes_credentials(cluster: BrokerCluster) -> None:
    ns = cluster.namesrv_addr
    async with Admin(ns, credentials=ADMIN, tls=None) as admin:
        await admin.update_topic("T", cluster="TestCluster", read_queue_nums=2, write_queue_nums=2)
    async with Producer("pg", ns, credentials=PRODUCER) as producer:
        result = await producer.send(Message("T", b"one", keys=["k1"]))
        assert result.status.name == "SEND_OK"
    async with Producer("pg", ns, credentials=CONSUMER) as not_a_producer:
        with pytest.raises(ClientError) as e:
            await not_a_producer.send(Message("T", b"two"))
        assert e.value.code == "NO_PERMISSION"
    leader = cluster.writable_leader()
    assert leader is not None
    followers = [b.cfg.address for nid, b in cluster.brokers.items() if b is not leader]
    pull = {"topic": "T", "queue_id": result.message_queue.queue_id, "offset": 0, "consumer_group": "g"}

    async def pulled_on_followers() -> bool:
        for a in followers:
            answer = await call(CONSUMER, a, "POST", "/v1/pull", pull)
            if len(answer["messages"]) != 1:
                return False
        return True

    await wait_until(pulled_on_followers, 10, "followers serve the message to the consumer account")
    for a in followers:
        assert await status_of(NOBODY, a, "POST", "/v1/pull", pull) == (403, "NO_PERMISSION")
        assert await status_of(PRODUCER, a, "POST", "/v1/pull", pull) == (403, "NO_PERMISSION")
        assert await status_of(None, a, "POST", "/v1/pull", pull) == (401, "NO_CREDENTIALS")
    consumer = PullConsumer("g", ns, credentials=CONSUMER)
    await consumer.start()
    try:
        queues = await consumer.fetch_message_queues("T")
        got = [m for q in queues for m in (await consumer.pull(q, 0, 32)).messages]
        assert [m.body for m in got] == [b"one"]
    finally:
        await consumer.shutdown()
