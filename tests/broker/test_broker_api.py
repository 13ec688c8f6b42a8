"""The broker's HTTP API against an in-process 3-replica group and a NameServer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgpack
import pytest

from broker.client.transport import ClientError, Transport
from tests.broker.harness import BrokerCluster
from tests.dledger.harness import wait_until


@pytest.fixture
async def cluster(tmp_path: Any) -> AsyncIterator[BrokerCluster]:
    async with BrokerCluster(str(tmp_path), longPollingMaxMs=3000) as c:
        yield c


@pytest.fixture
async def t() -> AsyncIterator[Transport]:
    tr = Transport(timeout_s=5.0)
    try:
        yield tr
    finally:
        await tr.close()


def msg(body: bytes, **kw: Any) -> dict[str, Any]:
    return {"body": body, **kw}


async def test_send_pull_and_queries(cluster: BrokerCluster, t: Transport) -> None:
    leader = cluster.writable_leader()
    assert leader is not None
    addr = leader.cfg.address
    r = await t.call(addr, "POST", "/v1/send", {"topic": "T1", "queue_id": 1, "messages": [msg(b"hello", tags="A",
                     keys=["k1", "k2"], properties={"p": "v"}, unique_id="U1")]})
    assert r["status"] == "SEND_OK" and r["queue_id"] == 1
    res = r["results"][0]
    assert res["queue_offset"] == 0 and res["unique_id"] == "U1" and res["msg_id"].startswith("RaftNode00:")
    # a batch: offsets follow in order
    r2 = await t.call(addr, "POST", "/v1/send", {"topic": "T1", "queue_id": 1, "messages": [
        msg(b"b%d" % i, tags="B" if i % 2 else "A") for i in range(10)]})
    assert [x["queue_offset"] for x in r2["results"]] == list(range(1, 11))
    # pull from every replica once they applied it (followers serve committed reads)
    for nid in cluster.brokers:
        a = cluster.addr(nid)

        async def pulled(a: str = a) -> Any:
            p = await t.call(a, "POST", "/v1/pull", {"topic": "T1", "queue_id": 1, "offset": 0, "max_count": 64})
            return p if len(p["messages"]) == 11 else None

        p = await wait_until(pulled, 10, f"pull from {nid}")
        assert p["status"] == "FOUND" and p["next_offset"] == 11 and p["max_offset"] == 11
        first = p["messages"][0]
        assert first["body"] == b"hello" and first["tags"] == "A" and first["keys"] == ["k1", "k2"]
        assert first["properties"] == {"p": "v"} and first["msg_id"] == res["msg_id"]
    # tag filter
    p = await t.call(addr, "POST", "/v1/pull", {"topic": "T1", "queue_id": 1, "offset": 0, "tags": "B"})
    assert [m["body"] for m in p["messages"]] == [b"b1", b"b3", b"b5", b"b7", b"b9"]
    # queries
    m = await t.call(addr, "GET", f"/v1/msg/id/{res['msg_id']}")
    assert m["body"] == b"hello" and m["queue_offset"] == 0
    q = await t.call(addr, "GET", "/v1/msg/key", params={"topic": "T1", "key": "k2"})
    assert [x["body"] for x in q["messages"]] == [b"hello"]
    q = await t.call(addr, "GET", "/v1/msg/unique", params={"topic": "T1", "unique_id": "U1"})
    assert len(q["messages"]) == 1
    m = await t.call(addr, "GET", "/v1/msg/offset", params={"topic": "T1", "queue_id": 1, "offset": 3})
    assert m["body"] == b"b2"
    st = await t.call(addr, "GET", "/v1/topics/T1/status")
    assert st["queues"][1]["max_offset"] == 11 and st["queues"][0]["max_offset"] == 0
    s = await t.call(addr, "GET", "/v1/offset/search", params={"topic": "T1", "queue_id": 1, "ts": 0})
    assert s["offset"] == 0


async def test_status_reports_the_chain_crc_at_the_commit_index(cluster: BrokerCluster, t: Transport) -> None:
    """The chaos sampler compares replicas by (commit index, chain CRC there): every replica that
    reports one committed index reports one chain CRC for it."""
    leader = cluster.writable_leader()
    assert leader is not None
    await t.call(leader.cfg.address, "POST", "/v1/send", {"topic": "TS", "messages": [msg(b"x")]})
    seen: dict[int, set[int]] = {}

    async def all_caught_up() -> bool:
        rows = [await t.call(cluster.addr(nid), "GET", "/v1/status") for nid in cluster.brokers]
        for st in rows:
            assert st["last_term"] >= 1 and st["entries_truncated"] == 0
            if st["chain_crc_at_commit"] is not None:
                seen.setdefault(st["commit_index"], set()).add(st["chain_crc_at_commit"])
        return len({st["commit_index"] for st in rows}) == 1 and all(st["chain_crc_at_commit"] for st in rows)

    await wait_until(all_caught_up, 10, "every replica at one commit index")
    assert seen and all(len(crcs) == 1 for crcs in seen.values()), seen


async def test_long_poll_is_woken_by_a_send(cluster: BrokerCluster, t: Transport) -> None:
    leader = cluster.writable_leader()
    assert leader is not None
    await t.call(leader.cfg.address, "POST", "/v1/topics", {"topic": "LP"})
    follower = next(b for b in cluster.brokers.values() if b is not leader)
    await wait_until(lambda: follower.store.topic("LP") is not None, 5, "the follower applied the topic")
    loop = asyncio.get_running_loop()
    started = loop.time()
    pull = asyncio.create_task(t.call(follower.cfg.address, "POST", "/v1/pull",
                                      {"topic": "LP", "queue_id": 0, "offset": 0, "suspend_ms": 8000}, timeout_s=12))
    await wait_until(lambda: ("LP", 0) in follower._waiters, 5, "the follower to hold the pull")
    assert not pull.done()
    await t.call(leader.cfg.address, "POST", "/v1/send", {"topic": "LP", "queue_id": 0, "messages": [msg(b"x")]})
    p = await pull
    assert p["status"] == "FOUND" and loop.time() - started < 5
    # nothing new: held for the whole time then NO_NEW_MSG
    p = await t.call(leader.cfg.address, "POST", "/v1/pull", {"topic": "LP", "queue_id": 0, "offset": 1,
                                                             "suspend_ms": 300})
    assert p["status"] == "NO_NEW_MSG" and p["next_offset"] == 1


async def test_follower_answers_not_leader_with_the_leader_address(cluster: BrokerCluster, t: Transport) -> None:
    leader = cluster.writable_leader()
    assert leader is not None
    follower = next(b for b in cluster.brokers.values() if b is not leader)
    with pytest.raises(ClientError) as e:
        await t.call(follower.cfg.address, "POST", "/v1/send", {"topic": "T", "messages": [msg(b"x")]})
    assert e.value.code == "NOT_LEADER" and e.value.status == 409
    assert e.value.leader_addr == leader.cfg.address


async def test_offsets_through_the_log_never_go_backwards(cluster: BrokerCluster, t: Transport) -> None:
    leader = cluster.writable_leader()
    assert leader is not None
    a = leader.cfg.address
    await t.call(a, "POST", "/v1/topics", {"topic": "OT", "read_queue_nums": 2, "write_queue_nums": 2})
    r = await t.call(a, "POST", "/v1/offsets", {"group": "g1", "topic": "OT", "offsets": {"0": 5, "1": 7}})
    assert r["updated"] == 2
    r = await t.call(a, "POST", "/v1/offsets", {"group": "g1", "topic": "OT", "offsets": {"0": 3}})
    assert r["updated"] == 0
    for nid in cluster.brokers:
        async def got(nid: str = nid) -> bool:
            o = await t.call(cluster.addr(nid), "GET", "/v1/offsets", params={"group": "g1", "topic": "OT"})
            return bool(o["offsets"] == {"0": 5, "1": 7})
        await wait_until(got, 10, f"offsets on {nid}")
    r = await t.call(a, "POST", "/v1/offsets/reset", {"group": "g1", "topic": "OT", "offsets": {"0": 1}})
    o = await t.call(a, "GET", "/v1/offsets", params={"group": "g1", "topic": "OT"})
    assert o["offsets"] == {"0": 1, "1": 7}
    prog = await t.call(a, "GET", "/v1/groups/g1/progress")
    assert prog["topics"][0]["topic"] == "OT"


async def test_registration_names_the_leader_and_follows_a_transfer(cluster: BrokerCluster, t: Transport) -> None:
    ns = cluster.namesrvs[0].addr
    leader = cluster.writable_leader()
    assert leader is not None
    await t.call(leader.cfg.address, "POST", "/v1/topics", {"topic": "RT"})

    async def route_leader() -> str | None:
        try:
            r = await t.call(ns, "GET", "/v1/routes/RT", params={"v": 1})
        except ClientError:
            return None
        return r["broker_datas"][0]["broker_addrs"].get("0")

    assert await wait_until(route_leader, 5, "route with a leader") == leader.cfg.address
    target = next(nid for nid, b in cluster.brokers.items() if b is not leader)

    async def transfer() -> Any:
        try:
            return await t.call(leader.cfg.address, "POST", "/v1/admin/transfer", {"target": target})
        except ClientError as exc:  # refused while the target is not caught up (a busy machine)
            if exc.code != "SERVICE_UNAVAILABLE":
                raise
            return None

    r = await wait_until(transfer, 10, "the leader to accept the transfer")
    assert r["leader_id"] == target
    new_addr = cluster.addr(target)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await wait_until(lambda: cluster.brokers[target].ready, 5, "new leader ready")
    ready_at = loop.time()
    await wait_until(lambda: _eq(route_leader(), new_addr), 5, "NameServer names the new leader")
    assert loop.time() - ready_at < 1.0, "registration after a role change must take < 1 s"
    assert loop.time() - began < 6


async def _eq(coro: Any, value: Any) -> bool:
    return bool(await coro == value)


BAD_SENDS: list[tuple[Any, int, str]] = [
    ({"topic": "bad topic!", "messages": [msg(b"x")]}, 400, "INVALID_TOPIC"),
    ({"topic": "T", "messages": []}, 400, "INVALID_BATCH"),
    ({"topic": "T", "messages": [{"body": b""}]}, 400, "INVALID_BODY"),
    ({"topic": "T", "messages": [{"body": "text"}]}, 400, "INVALID_BODY"),
    ({"topic": "T", "messages": [msg(b"x", tags="a||b")]}, 400, "INVALID_TAGS"),
    ({"topic": "T", "messages": [msg(b"x", keys=["has space"])]}, 400, "INVALID_KEYS"),
    ({"topic": "T", "messages": [msg(b"x", properties={"k": 1})]}, 400, "INVALID_PROPERTIES"),
    ({"topic": "T", "messages": [msg(b"x", unique_id="no/slash")]}, 400, "INVALID_UNIQUE_ID"),
    ({"topic": "T", "messages": [msg(b"x", extra=1)]}, 400, "UNKNOWN_FIELD"),
    ({"topic": "T", "queue_id": 99, "messages": [msg(b"x")]}, 400, "INVALID_QUEUE_ID"),
    ({"topic": "T", "queue_id": "0", "messages": [msg(b"x")]}, 400, "INVALID_QUEUE_ID"),
    ({"messages": [msg(b"x")]}, 400, "MISSING_FIELD"),
    ({"topic": "T", "messages": [msg(b"x" * (4 << 20 + 1))]}, 413, "MESSAGE_TOO_LARGE"),
]


async def test_bad_input_gets_4xx_with_a_code(cluster: BrokerCluster, t: Transport) -> None:
    leader = cluster.writable_leader()
    assert leader is not None
    a = leader.cfg.address
    await t.call(a, "POST", "/v1/topics", {"topic": "T"})
    for body, status, code in BAD_SENDS:
        with pytest.raises(ClientError) as e:
            await t.call(a, "POST", "/v1/send", body)
        assert (e.value.status, e.value.code) == (status, code), body.get("messages", body)
    bad_other: list[tuple[str, str, Any, dict[str, Any] | None, int, str]] = [
        ("POST", "/v1/pull", {"topic": "T", "queue_id": 0}, None, 400, "MISSING_FIELD"),
        ("POST", "/v1/pull", {"topic": "NOPE", "queue_id": 0, "offset": 0}, None, 404, "TOPIC_NOT_EXIST"),
        ("POST", "/v1/pull", {"topic": "T", "queue_id": 0, "offset": -1}, None, 400, "BAD_REQUEST"),
        ("POST", "/v1/pull", {"topic": "T", "queue_id": 0, "offset": 0, "suspend_ms": 10**9}, None, 400,
         "BAD_REQUEST"),
        ("POST", "/v1/topics", {"topic": "T", "perm": 9}, None, 400, "INVALID_PERM"),
        ("POST", "/v1/topics", {"topic": "T", "read_queue_nums": 0}, None, 400, "INVALID_QUEUE_NUMS"),
        ("POST", "/v1/offsets", {"group": "g", "topic": "T", "offsets": {"x": 1}}, None, 400, "INVALID_QUEUE_ID"),
        ("POST", "/v1/offsets", {"group": "g", "topic": "T", "offsets": {"0": -5}}, None, 400, "INVALID_OFFSET"),
        ("POST", "/v1/groups", {"group": "bad group"}, None, 400, "INVALID_GROUP"),
        ("POST", "/v1/heartbeat", {"client_id": "", "groups": []}, None, 400, "INVALID_CLIENT_ID"),
        ("GET", "/v1/msg/id/garbage", None, None, 400, "INVALID_MSG_ID"),
        ("GET", "/v1/msg/id/RaftNode00:00000000FFFFFFFF", None, None, 404, "MESSAGE_NOT_FOUND"),
        ("GET", "/v1/msg/key", None, {"topic": "T"}, 400, "INVALID_KEYS"),
        ("GET", "/v1/msg/offset", None, {"topic": "T", "queue_id": 0, "offset": "x"}, 400, "BAD_PARAMETER"),
        ("GET", "/v1/topics/NOPE", None, None, 404, "TOPIC_NOT_EXIST"),
        ("GET", "/v1/nothing/here", None, None, 404, "NOT_FOUND"),
        ("POST", "/v1/admin/transfer", {"target": "zz"}, None, 400, "BAD_REQUEST"),
        ("POST", "/v1/admin/transfer", {"target": 5}, None, 400, "BAD_REQUEST"),
        ("DELETE", "/v1/topics/NOPE", None, None, 404, "TOPIC_NOT_EXIST"),
        ("DELETE", "/v1/topics/bad%20name", None, None, 400, "INVALID_TOPIC"),
        ("DELETE", "/v1/groups/bad%20g", None, None, 400, "INVALID_GROUP"),
        ("GET", "/v1/groups/bad%20g/progress", None, None, 400, "INVALID_GROUP"),
        ("GET", "/v1/groups/bad%20g/consumers", None, None, 400, "INVALID_GROUP"),
        ("GET", "/v1/topics/bad%20name/status", None, None, 400, "INVALID_TOPIC"),
        ("GET", "/v1/offset/search", None, {"topic": "T", "queue_id": 0}, 400, "MISSING_FIELD"),
        ("GET", "/v1/offset/search", None, {"topic": "T", "queue_id": 99, "ts": 0}, 400, "BAD_PARAMETER"),
        ("GET", "/v1/offsets", None, {"group": "g"}, 400, "INVALID_TOPIC"),
        ("POST", "/v1/offsets/reset", {"group": "g", "topic": "T"}, None, 400, "BAD_REQUEST"),
        ("POST", "/v1/offsets/reset", {"group": "g", "topic": "T", "ts": "yesterday"}, None, 400, "BAD_REQUEST"),
        ("POST", "/v1/unregister", {"client_id": 7}, None, 400, "INVALID_CLIENT_ID"),
        ("POST", "/v1/unregister", {}, None, 400, "MISSING_FIELD"),
        ("GET", "/v1/msg/unique", None, {"topic": "T", "unique_id": "a/b"}, 400, "INVALID_UNIQUE_ID"),
        ("POST", "/v1/heartbeat", {"client_id": "c", "groups": [{"group": "g", "model": "P2P"}]}, None, 400,
         "BAD_REQUEST"),
        ("POST", "/v1/topics", {"topic": "T", "order": "yes"}, None, 400, "BAD_REQUEST"),
        ("POST", "/v1/groups", {"group": "g", "retry_max_times": -1}, None, 400, "BAD_REQUEST"),
        ("PUT", "/v1/send", {"topic": "T"}, None, 405, "METHOD_NOT_ALLOWED"),
    ]
    for method, path, body, params, status, code in bad_other:
        with pytest.raises(ClientError) as e:
            await t.call(a, method, path, body, params=params)
        assert (e.value.status, e.value.code) == (status, code), (path, body, params)
    # malformed bodies and media types, with a raw client
    async with aiohttp.ClientSession() as s:
        for data, ctype, status, code in [
            (b"\xc1\xc1", "application/x-msgpack", 400, "BAD_MSGPACK"),
            (b"{nope", "application/json", 400, "BAD_JSON"),
            (msgpack.packb([1, 2]), "application/x-msgpack", 400, "BAD_REQUEST"),
            (b"x", "text/plain", 415, "UNSUPPORTED_MEDIA_TYPE"),
        ]:
            async with s.post(f"http://{a}/v1/pull", data=data, headers={"Content-Type": ctype}) as resp:
                assert resp.status == status
                raw = await resp.read()
                body = msgpack.unpackb(raw) if resp.content_type == "application/x-msgpack" else json.loads(raw)
                assert body["code"] == code and body["message"]
        async with s.post(f"http://{a}/v1/send", data=b'{"topic": "T"}',
                          headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 415
    # the broker is still fine
    r = await t.call(a, "POST", "/v1/send", {"topic": "T", "messages": [msg(b"ok")]})
    assert r["status"] == "SEND_OK"


async def test_fixes_from_the_docs_review(cluster: BrokerCluster, t: Transport) -> None:
    leader = cluster.writable_leader()
    assert leader is not None
    a = leader.cfg.address
    # a rejected send must not auto-create its topic
    with pytest.raises(ClientError) as e:
        await t.call(a, "POST", "/v1/send", {"topic": "NotCreated", "messages": [{"body": b""}]})
    assert e.value.code == "INVALID_BODY"
    with pytest.raises(ClientError) as e:
        await t.call(a, "POST", "/v1/send", {"topic": "NotCreated", "queue_id": 4, "messages": [msg(b"x")]})
    assert e.value.code == "INVALID_QUEUE_ID"
    assert leader.store.topic("NotCreated") is None
    # key queries report the real size
    await t.call(a, "POST", "/v1/send", {"topic": "SZ", "messages": [msg(b"12345", keys=["kk"])]})
    q = await t.call(a, "GET", "/v1/msg/key", params={"topic": "SZ", "key": "kk"})
    assert q["messages"][0]["size"] > 5
    with pytest.raises(ClientError) as e:
        await t.call(a, "GET", "/v1/msg/key", params={"topic": "SZ", "key": "a b"})
    assert e.value.code == "INVALID_KEYS"
    # a group with consume_enable=false may not pull
    await t.call(a, "POST", "/v1/groups", {"group": "off", "consume_enable": False})
    with pytest.raises(ClientError) as e:
        await t.call(a, "POST", "/v1/pull", {"topic": "SZ", "queue_id": 0, "offset": 0, "consumer_group": "off"})
    assert (e.value.status, e.value.code) == (403, "NO_PERMISSION")
    # progress tells "never committed" (null) from a committed 0; lag counts from the queue's start
    await t.call(a, "POST", "/v1/heartbeat", {"client_id": "c1", "groups": [{"group": "pg", "topics": ["SZ"]}]})
    prog = await t.call(a, "GET", "/v1/groups/pg/progress")
    q0 = prog["topics"][0]["queues"][0]
    assert q0["consumer_offset"] is None and q0["lag"] == 1
    # a hold longer than longPollingMaxMs is clamped, not refused
    p = await t.call(a, "POST", "/v1/pull", {"topic": "SZ", "queue_id": 0, "offset": 1, "suspend_ms": 100_000},
                     timeout_s=40)
    assert p["status"] == "NO_NEW_MSG"
