"""Issue 10, finding 1: nobody without a broker group's credentials registers, unregisters, claims a
term or deletes routes at a NameServer; a term claim is bounded by what the group's members report.

Each hijack of the finding is replayed against a NameServer with ``aclEnable=true`` (real HTTP on
127.0.0.1): the unsigned requests that used to succeed now get 401, signed ones by the wrong account
403, and the real group keeps its route.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.client.transport import ClientError, NamesrvClient, Transport
from broker.protocol.auth import Credentials, authorization
from broker.protocol.routes import INT64_MAX, BrokerRegistration, TopicConfig
from namesrv.config import NamesrvConfig
from namesrv.route_table import RouteTable
from namesrv.server import NamesrvService
from tests.acl_fixtures import ADMIN, BROKER_G0, BROKER_G1, CONSUMER, STRANGER, acl_doc, write_acl
from tests.dledger.harness import HOST, free_ports

REAL = "127.0.0.1:10911"
REAL_FOLLOWER = "127.0.0.1:10921"
FAKE = "127.0.0.1:6666"


class Ns:
    def __init__(self, service: NamesrvService, addr: str, acl_path: str):
        self.service = service
        self.addr = addr
        self.acl_path = acl_path

    def client(self, creds: Credentials | None) -> Transport:
        return Transport(timeout_s=5.0, credentials=creds, tls=None)


@pytest.fixture
async def ns(tmp_path: Any) -> AsyncIterator[Ns]:
    acl = write_acl(str(tmp_path / "plain_acl.yml"))
    (port,) = free_ports(1)
    service = NamesrvService(NamesrvConfig(listen_port=port, acl_file=acl), run_scanner=False)
    runner, addr = await service.serve(HOST, port)
    try:
        yield Ns(service, addr, acl)
    finally:
        await runner.cleanup()


def reg(address: str, role: str, term: int, *, broker_name: str = "RaftNode00", broker_id: int | None = None,
        topics: list[dict[str, Any]] | None = None, data_version: int = 1) -> dict[str, Any]:
    return {
        "v": 1,
        "cluster": "DefaultCluster",
        "broker_name": broker_name,
        "broker_id": (0 if role == "LEADER" else 1) if broker_id is None else broker_id,
        "address": address,
        "role": role,
        "term": term,
        "topics": [{"topic": "TopicTest", "read_queue_nums": 4, "write_queue_nums": 4}] if topics is None else topics,
        "data_version": data_version,
    }


async def call(t: Transport, addr: str, method: str, path: str, body: Any = None) -> Any:
    try:
        return await t.call(addr, method, path, body)
    finally:
        await t.close()


async def refused(t: Transport, addr: str, method: str, path: str, body: Any = None) -> tuple[int, str]:
    with pytest.raises(ClientError) as e:
        await call(t, addr, method, path, body)
    return e.value.status, e.value.code


async def route_of(ns: Ns) -> Any:
    t = Transport(timeout_s=5.0, credentials=None, tls=None)
    try:
        return await NamesrvClient([ns.addr], t).route("TopicTest")
    finally:
        await t.close()


async def test_hijacks_of_finding_1_are_refused(ns: Ns) -> None:
    # The real group registers with its own credentials.
    r = await call(ns.client(BROKER_G0), ns.addr, "POST", "/v1/brokers/register", reg(REAL, "LEADER", 3))
    assert r["accepted"] and r["leader_address"] == REAL
    await call(ns.client(BROKER_G0), ns.addr, "POST", "/v1/brokers/register", reg(REAL_FOLLOWER, "FOLLOWER", 3))

    # 1. A fake LEADER at an attacker address with term 2^63-1: unsigned, signed by a stranger, by another
    #    group's broker account, by an admin and by a client account.
    fake = reg(FAKE, "LEADER", INT64_MAX, data_version=10**15)
    assert await refused(ns.client(None), ns.addr, "POST", "/v1/brokers/register", fake) == (401, "NO_CREDENTIALS")
    assert await refused(ns.client(STRANGER), ns.addr, "POST", "/v1/brokers/register", fake) == (
        401, "SIGNATURE_INVALID")
    for creds in (BROKER_G1, ADMIN, CONSUMER):
        assert await refused(ns.client(creds), ns.addr, "POST", "/v1/brokers/register", fake) == (
            403, "NO_PERMISSION"), creds.access_key
    # 2. A second fake group advertising the topic with 16 queues.
    other = reg(FAKE, "LEADER", 1, broker_name="Evil00",
                topics=[{"topic": "TopicTest", "read_queue_nums": 16, "write_queue_nums": 16}])
    assert (await refused(ns.client(None), ns.addr, "POST", "/v1/brokers/register", other))[0] == 401
    assert (await refused(ns.client(BROKER_G0), ns.addr, "POST", "/v1/brokers/register", other))[0] == 403
    # 3. Unregistering the real leader, and deleting the route.
    unreg = {"v": 1, "cluster": "DefaultCluster", "broker_name": "RaftNode00", "address": REAL}
    assert (await refused(ns.client(None), ns.addr, "POST", "/v1/brokers/unregister", unreg))[0] == 401
    assert (await refused(ns.client(BROKER_G1), ns.addr, "POST", "/v1/brokers/unregister", unreg))[0] == 403
    assert (await refused(ns.client(None), ns.addr, "DELETE", "/v1/topics/TopicTest"))[0] == 401
    assert (await refused(ns.client(BROKER_G0), ns.addr, "DELETE", "/v1/topics/TopicTest"))[0] == 403

    # The route is the real group's, untouched; the real leader keeps registering (not STALE_TERM).
    route = await route_of(ns)
    assert [q.broker_name for q in route.queue_datas] == ["RaftNode00"]
    assert route.broker_datas[0].broker_addrs == {0: REAL, 1: REAL_FOLLOWER}
    r = await call(ns.client(BROKER_G0), ns.addr, "POST", "/v1/brokers/register",
                   reg(REAL, "LEADER", 3, data_version=2))
    assert r["accepted"] and r["ignored_reason"] is None
    # An admin may delete a route.
    r = await call(ns.client(ADMIN), ns.addr, "DELETE", "/v1/topics/TopicTest")
    assert r["deleted"] is True
    status = await call(ns.client(None), ns.addr, "GET", "/v1/status")
    assert status["security"]["acl"] is True and status["security"]["refused"]["NO_PERMISSION"] >= 6


async def raw(addr: str, data: bytes) -> tuple[int, bytes]:
    host, _, port = addr.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(
            b"content-length"))
        return int(head.split()[1]), await reader.readexactly(length)
    finally:
        writer.close()


def signed_request(addr: str, creds: Credentials, body: bytes, ts_ms: int, nonce: str | None = None, *,
                   scope: str) -> bytes:
    target = "/v1/brokers/register"
    auth = authorization(creds, "POST", target, body, ts_ms, nonce, scope=scope)
    return (f"POST {target} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nAuthorization: {auth}\r\n\r\n").encode() + body


async def test_replay_stale_timestamp_and_tampered_body_are_refused(ns: Ns) -> None:
    import json

    body = json.dumps(reg(REAL, "LEADER", 3)).encode()
    scope = ns.service.security.scope
    request = signed_request(ns.addr, BROKER_G0, body, int(time.time() * 1000), scope=scope)
    status, _ = await raw(ns.addr, request)
    assert status == 200
    status, answer = await raw(ns.addr, request)  # the same bytes again: a captured request replayed
    assert status == 401 and b"REPLAYED_REQUEST" in answer
    stale = signed_request(ns.addr, BROKER_G0, body, int(time.time() * 1000) - 3_600_000, scope=scope)
    status, answer = await raw(ns.addr, stale)
    assert status == 401 and b"TIMESTAMP_OUT_OF_WINDOW" in answer
    # the signature covers the body: a term changed in flight no longer matches the signed hash
    tampered = signed_request(ns.addr, BROKER_G0, body, int(time.time() * 1000), scope=scope).replace(
        b'"term": 3', b'"term": 9')
    status, answer = await raw(ns.addr, tampered)
    assert status == 401 and b"BODY_DIGEST_MISMATCH" in answer
    # signed for another NameServer (or this one's previous process): refused, naming this one
    other = signed_request(ns.addr, BROKER_G0, body, int(time.time() * 1000), scope="namesrv:0123456789abcdef")
    status, answer = await raw(ns.addr, other)
    assert status == 401 and b"WRONG_SCOPE" in answer and scope.encode() in answer


async def test_acl_file_reloads_when_it_changes(ns: Ns) -> None:
    new = Credentials("RaftNode02-broker", "broker-secret-g2")
    body = reg("127.0.0.1:10931", "LEADER", 1, broker_name="RaftNode02")
    assert (await refused(ns.client(new), ns.addr, "POST", "/v1/brokers/register", body))[0] == 401
    write_acl(ns.acl_path, acl_doc({"accessKey": new.access_key, "secretKey": new.secret_key,
                                    "brokerNames": ["RaftNode02"]}))
    watcher = ns.service.security.watcher
    assert watcher is not None and watcher.poll()
    r = await call(ns.client(new), ns.addr, "POST", "/v1/brokers/register", body)
    assert r["accepted"]
    # a broken file leaves the rules in force
    with open(ns.acl_path, "w") as f:
        f.write("accounts: [{accessKey: x}]\n")
    assert not watcher.poll()
    r = await call(ns.client(new), ns.addr, "POST", "/v1/brokers/register", {**body, "data_version": 2})
    assert r["accepted"]


# -- the table: a term claim is bounded by what the group's members report ---------------------------
def leader(address: str, term: int, dv: int = 1) -> BrokerRegistration:
    return BrokerRegistration("C", "G", 0, address, "LEADER", term, (TopicConfig("T"),), dv)


def follower(address: str, term: int, k: int, dv: int = 1) -> BrokerRegistration:
    return BrokerRegistration("C", "G", k, address, "FOLLOWER", term, (), dv)


@pytest.mark.parametrize("leaves", ["unregister", "expire"])
def test_a_huge_term_that_leaves_does_not_lock_out_the_real_leader(leaves: str) -> None:
    table = RouteTable(heartbeat_timeout_ms_default=1000)
    assert table.register(leader(REAL, 5), 0).accepted
    assert table.register(follower(REAL_FOLLOWER, 5, 2), 0).accepted
    # a member (say, a replayed or buggy registration) claims term 2^63-1 from another address
    assert table.register(leader(FAKE, INT64_MAX, 1), 500).accepted
    assert table.leader_term("G") == INT64_MAX
    if leaves == "unregister":
        assert table.unregister("C", "G", FAKE)
    else:
        table.register(follower(REAL_FOLLOWER, 5, 2, dv=2), 1400)  # the follower keeps heartbeating
        table.register(follower(REAL, 5, 1, dv=2), 1400)
        assert [e.address for e in table.scan_expired(1600)] == [FAKE]
    # bounded by what the remaining members report (term 5), not by the claim
    assert table.leader_term("G") == 5
    r = table.register(leader(REAL, 5, dv=3), 1700)
    assert r.accepted and r.ignored_reason is None and r.leader_address == REAL
    route = table.topic_route("T")
    assert route is not None and route.broker_datas[0].broker_addrs[0] == REAL
    table.check_invariants()


def test_topic_routes_are_capped_and_counted() -> None:
    table = RouteTable(topic_entries_max=3)
    four = tuple(TopicConfig(f"T{i}") for i in range(4))
    with pytest.raises(Exception) as e:
        table.register(BrokerRegistration("C", "G", 0, REAL, "LEADER", 1, four, 1), 0)
    assert getattr(e.value, "code", "") == "TABLE_FULL"
    assert table.register(BrokerRegistration("C", "G", 0, REAL, "LEADER", 1, four[:3], 1), 0).accepted
    assert table.counts()["topics"] == 3 and table.topic_list() == ("T0", "T1", "T2")
    assert table.delete_topic("T1")
    assert table.counts()["topic_routes"] == 2
    table.check_invariants()
