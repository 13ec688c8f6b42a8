"""Review findings on the broker server, against an in-process 3-replica group (tests/broker/harness.py).

Each test fails on the code as reviewed; its docstring names the bug, where it is and the fix.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgpack
import pytest

from broker.client.transport import ClientError, Transport
from broker.store.message import StoredMessage, encode_message
from tests.broker.harness import IDS, BrokerCluster
from tests.dledger.harness import wait_until

MSGPACK = "application/x-msgpack"


@pytest.fixture
async def cluster(tmp_path: Any) -> AsyncIterator[BrokerCluster]:
    c = BrokerCluster(str(tmp_path))
    await c.start()
    try:
        yield c
    finally:
        await c.stop()


@pytest.fixture
async def t() -> AsyncIterator[Transport]:
    tr = Transport(timeout_s=8.0)
    try:
        yield tr
    finally:
        await tr.close()


def _leader_addr(cluster: BrokerCluster) -> str:
    leader = cluster.writable_leader()
    assert leader is not None
    return leader.cfg.address


async def _raw(addr: str, method: str, path: str, data: bytes, ctype: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.request(
        method, f"http://{addr}{path}", data=data, headers={"Content-Type": ctype}
    ) as resp:
        raw = await resp.read()
        body = msgpack.unpackb(raw) if resp.content_type == MSGPACK else json.loads(raw)
        return resp.status, body


# -- bad input answered 500 (invariant 7, docs/BROKER_API.md "Bad input is never a 500") -------------
async def test_msg_id_pointing_into_a_crafted_body_is_404_not_500(
    cluster: BrokerCluster, t: Transport
) -> None:
    """BUG: any client can make ``GET /v1/msg/id/{id}`` answer 500.

    broker/edge/http_api.py:349-356 (``_message_at``) trusts whatever ``MessageStore.read_message`` decodes at an
    arbitrary position: a msg id that points *inside* a message body whose bytes look like a record
    (b"M" + header length + a msgpack header whose topic is a list) decodes to a StoredMessage with
    ``topic=[...]``; ``self.s.store.cqs.get(m.topic, m.queue_id)`` then raises ``TypeError:
    unhashable type: 'list'`` -> 500 INTERNAL. (With a string topic the later ``search_by_position``
    check turns it into a 404, so only the type check is missing.)

    Fix: validate the decoded header's field types in ``broker/store/message.py`` ``decode_header`` /
    ``decode_message`` (topic str, queue_id int >= 0, keys list of str, properties map str->str, ...)
    raising ValueError, which ``read_message`` already maps to MessageNotFound -> 404.
    """
    a = _leader_addr(cluster)
    fake = encode_message(
        StoredMessage(
            topic=["x"],  # type: ignore[arg-type]
            queue_id=0, flag=0, tags="", keys=(), properties={}, born_ts=0, born_host="", store_ts=0,
            unique_id="U", body=b"zz",
        )
    )
    r = await t.call(a, "POST", "/v1/send", {"topic": "T", "queue_id": 0, "messages": [{"body": fake}]})
    res = r["results"][0]
    m = await t.call(a, "GET", f"/v1/msg/id/{res['msg_id']}")
    assert m["body"] == fake
    inside = res["position"] + m["size"] - len(fake)  # where the body starts in the log
    with pytest.raises(ClientError) as e:
        await t.call(a, "GET", f"/v1/msg/id/RaftNode00:{inside:016X}")
    assert (e.value.status, e.value.code) == (404, "MESSAGE_NOT_FOUND"), (e.value.status, e.value.code)


async def test_deeply_nested_json_body_is_400_not_500(cluster: BrokerCluster) -> None:
    """BUG: broker/edge/http_codec.py:47-50 (``read_body``) catches only ``ValueError``/``UnicodeDecodeError``
    around ``json.loads``; a deeply nested JSON body (``[[[[...`` — 100 KB is enough, far below
    client_max_size) raises ``RecursionError`` -> 500 INTERNAL on every JSON endpoint, with a
    traceback in the broker log per request. (msgpack is fine: its depth limit raises a ValueError.)

    Fix: also catch ``RecursionError`` there (-> 400 BAD_JSON).
    """
    a = _leader_addr(cluster)
    status, body = await _raw(a, "POST", "/v1/pull", b"[" * 100_000, "application/json")
    assert (status, body["code"]) == (400, "BAD_JSON"), (status, body)


async def test_offsets_with_an_infinite_queue_id_key_is_400_not_500(
    cluster: BrokerCluster, t: Transport
) -> None:
    """BUG: broker/edge/http_api.py:501-508 (``_offsets_map``, used by ``POST /v1/offsets`` and
    ``/v1/offsets/reset``) converts each key with ``int(k)`` catching only TypeError/ValueError; a
    msgpack float key ``inf`` (read_body unpacks with ``strict_map_key=False``) raises
    ``OverflowError`` -> 500 INTERNAL.

    Fix: accept only int keys or decimal-digit strings (``isinstance(k, int) and not bool`` or
    ``str.isdigit``), anything else 400 INVALID_QUEUE_ID; or add OverflowError to the except.
    """
    a = _leader_addr(cluster)
    await t.call(a, "POST", "/v1/topics", {"topic": "T"})
    for path in ("/v1/offsets", "/v1/offsets/reset"):
        data = msgpack.packb({"group": "g", "topic": "T", "offsets": {float("inf"): 1}})
        status, body = await _raw(a, "POST", path, data, MSGPACK)
        assert (status, body["code"]) == (400, "INVALID_QUEUE_ID"), (path, status, body)


async def test_transfer_with_an_unhashable_target_is_400_not_500(cluster: BrokerCluster) -> None:
    """BUG: broker/edge/http_api.py:640 (``transfer``) tests ``target not in self.s.node.settings.peers``
    (a dict) with whatever the body holds; ``{"target": [1]}`` raises ``TypeError: unhashable type``
    -> 500 INTERNAL.

    Fix: require ``isinstance(target, str)`` before the membership test (else 400 BAD_REQUEST).
    """
    a = _leader_addr(cluster)
    status, body = await _raw(a, "POST", "/v1/admin/transfer", msgpack.packb({"target": [1]}), MSGPACK)
    assert (status, body["code"]) == (400, "BAD_REQUEST"), (status, body)


async def test_status_and_sends_answer_while_the_leaders_disk_is_stuck(cluster: BrokerCluster, t: Transport) -> None:
    """Was (issue 11): ``GET /v1/status`` answered 500 when the dledger tick thread did not run the
    request within 2 s (a long apply batch, snapshot fsyncs, a slow disk), then a typed 503. Issue
    26: the replica belongs to the serving loop and never waits for its disk there: with the
    leader's flush stuck (a job that never returns), status answers at once, and sends still
    commit — the two followers' durable copies are a majority without the leader's."""
    leader = cluster.writable_leader()
    assert leader is not None
    core = leader.node.core

    def stuck() -> None:  # the disk hangs: this job and every later one never come back
        core._flush_in_flight = True

    core._start_flush = stuck  # type: ignore[method-assign]
    try:
        status = await t.call(leader.cfg.address, "GET", "/v1/status", timeout_s=2)
        assert status["role"] == "LEADER"
        answer = await leader.service.send("StuckDisk", 0, [{"body": b"while the leader's disk hangs"}])
        assert answer.results[0].queue_offset == 0
        assert core.commit_index > core.self_match_index()  # committed without counting the leader
    finally:
        del core._start_flush  # type: ignore[method-assign]
        core._flush_in_flight = False
    await leader.node.run_on_replica_thread(core._maybe_flush)
    await wait_until(lambda: core.self_match_index() >= core.commit_index, 10, "the leader's disk to catch up")


# -- consume queues rebuilt from the log (invariant 4) ---------------------------------------------
async def _pull_all(t: Transport, addr: str, topic: str) -> tuple[int, list[bytes]]:
    p = await t.call(
        addr, "POST", "/v1/pull", {"topic": topic, "queue_id": 0, "offset": 0, "max_count": 1024}
    )
    return p["max_offset"], [m["body"] for m in p["messages"]]


async def test_rebuilt_queue_does_not_resurrect_messages_of_a_deleted_topic(tmp_path: Any) -> None:
    """BUG (invariant 4 "consume queues hold exactly the committed messages of their queue", and
    replicas must assign the same queue offsets): rebuilding a lost/damaged consume queue counts and
    re-adds the messages of *every* incarnation of the topic still in the log.

    broker/store/message_store.py:373-395 (``_rebuild_queues``, also used by ``_load_state``) counts all message
    records of (topic, queue) in the retained log up to the snapshot index and appends them all,
    ignoring the ``topic.delete`` commands in between. After delete + re-create, a replica whose
    queue directory is lost (the store's own "rebuilt from the log" path,
    tests/broker/test_store_recovery.py) serves the deleted
    messages again (here 10 old + 3 new instead of 3), its max offset jumps (13 instead of 3) and,
    when only some replicas rebuilt, the replicas assign different offsets to the same new message.
    ``base = max(0, want_max - n)`` even hides the mismatch (n > want_max).

    Fix: in the rebuild scan also read command records; when a ``topic.delete`` of the topic is seen,
    drop what was counted/appended for its queues so far (only messages after the last delete
    belong to the live queue). A count greater than the snapshot's max offset should be an
    assertion, not silently clamped.
    """
    c = BrokerCluster(str(tmp_path))
    t = Transport(timeout_s=8.0)
    await c.start()
    try:
        a = _leader_addr(c)
        await t.call(a, "POST", "/v1/topics", {"topic": "D", "read_queue_nums": 1, "write_queue_nums": 1})
        await t.call(a, "POST", "/v1/send", {"topic": "D", "queue_id": 0,
                                             "messages": [{"body": b"old%d" % i} for i in range(10)]})
        await t.call(a, "DELETE", "/v1/topics/D")
        await t.call(a, "POST", "/v1/topics", {"topic": "D", "read_queue_nums": 1, "write_queue_nums": 1})
        r = await t.call(a, "POST", "/v1/send", {"topic": "D", "queue_id": 0,
                                                 "messages": [{"body": b"new%d" % i} for i in range(3)]})
        assert [x["queue_offset"] for x in r["results"]] == [0, 1, 2]
        leader = c.writable_leader()
        assert leader is not None
        commit = leader.node.commit_index
        for nid in IDS:
            b = c.brokers[nid]
            await wait_until(lambda b=b: b.node.applied_index >= commit, 5, f"{nid} applied")
        for nid in IDS:
            await c.stop_broker(nid)
        shutil.rmtree(os.path.join(c.config("n1").store_dir, "consumequeue"))  # one replica lost its queues
        for nid in IDS:
            await c.start_broker(nid)
        await c.wait_writable()
        states = {}
        for nid in IDS:
            addr = c.addr(nid)
            await wait_until(lambda addr=addr: _pull_all(t, addr, "D"), 10, f"queue D/0 on {nid}")
            states[nid] = await _pull_all(t, addr, "D")
        want = (3, [b"new0", b"new1", b"new2"])
        assert all(s == want for s in states.values()), (
            f"queue D/0 per replica (max offset, bodies): {states}"
        )
    finally:
        await t.close()
        await c.stop()


async def test_one_bad_heartbeat_does_not_break_the_group_member_list(
    cluster: BrokerCluster, t: Transport
) -> None:
    """BUG (invariant 7; a denial of service on rebalancing): ``POST /v1/heartbeat``
    (broker/edge/http_api.py ``heartbeat``, the ``client_id`` check) accepts any ``str`` of 1..255 chars. A JSON
    body may carry a lone surrogate (``"\\ud800"``), which Python keeps in the str; it is stored in
    the ConsumerManager and from then on every msgpack answer of ``GET /v1/groups/{group}/consumers``
    (the one the SDK's rebalance uses, broker/client/consumer_common.py ``group_consumer_ids``) fails in
    ``msgpack.packb`` (UnicodeEncodeError) -> 500 INTERNAL, for every consumer of the group, until
    the bad client expires (never, if it keeps heartbeating). Rebalancing of the group stops.

    Fix: validate ``client_id`` like the other names (e.g. ``^[\\x21-\\x7e]{1,255}$``, or at least
    ``cid.encode("utf-8")`` must succeed) -> 400 ``INVALID_CLIENT_ID``; the same for ``unregister``.
    """
    a = _leader_addr(cluster)
    await t.call(a, "POST", "/v1/heartbeat", {"client_id": "good", "groups": [{"group": "g", "topics": []}]})
    bad = b'{"client_id": "bad\\ud800", "groups": [{"group": "g"}]}'
    status, _ = await _raw(a, "POST", "/v1/heartbeat", bad, "application/json")
    try:
        r = await t.call(a, "GET", "/v1/groups/g/consumers")
    except ClientError as e:
        raise AssertionError(f"the member list of group g now answers {e.status} {e.code}") from None
    assert r["client_ids"] == ["good"]
    assert status == 400, f"a client id that cannot be encoded was accepted ({status})"
