"""The broker service (broker/service/broker_service.py) called directly, without HTTP: a real 3-replica group
(``tests/broker/harness.py``) whose replicas' ``service`` is what every transport calls."""

from __future__ import annotations

import asyncio
import types
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.protocol.errors import ProtocolError
from broker.server.broker_server import BrokerServer
from broker.service.base import ServiceBase
from broker.store.message_store import CorruptMessage
from dledger.node import AppendTimeoutError, BusyError, NotLeaderError
from tests.broker.harness import BrokerCluster
from tests.dledger.harness import wait_until


@pytest.fixture
async def cluster(tmp_path: Any) -> AsyncIterator[BrokerCluster]:
    async with BrokerCluster(str(tmp_path), longPollingMaxMs=3000) as c:
        yield c


def _leader(cluster: BrokerCluster) -> BrokerServer:
    leader = cluster.writable_leader()
    assert leader is not None
    return leader


def _follower(cluster: BrokerCluster) -> BrokerServer:
    return next(b for b in cluster.brokers.values() if b.node.role != "LEADER")


async def test_send_then_pull_and_query_through_the_service(cluster: BrokerCluster) -> None:
    svc = _leader(cluster).service
    sent = await svc.send(
        "S1", 1, [{"body": b"hello", "tags": "A", "keys": ["k1"], "unique_id": "U1"}], client_addr="10.0.0.9:1"
    )
    assert sent.status == "SEND_OK" and sent.queue_id == 1 and sent.broker_name == "RaftNode00"
    (first,) = sent.results
    assert first.queue_offset == 0 and first.unique_id == "U1" and not first.duplicate
    batch = await svc.send("S1", 1, [{"body": b"b%d" % i, "tags": "B" if i % 2 else "A"} for i in range(6)])
    assert [r.queue_offset for r in batch.results] == list(range(1, 7))

    pulled = await svc.pull("S1", 1, 0, max_count=64)
    assert pulled.status == "FOUND" and pulled.next_offset == 7 and pulled.max_offset == 7
    assert [pm.message.body for pm in pulled.messages][:2] == [b"hello", b"b0"]
    assert pulled.messages[0].message.born_host == "10.0.0.9:1"  # client_addr: the default born host
    view = pulled.to_dict("RaftNode00")["messages"][0]
    assert view["msg_id"] == first.msg_id and view["queue_offset"] == 0 and view["size"] > 0
    tagged = await svc.pull("S1", 1, 0, tags="B")
    assert [pm.message.body for pm in tagged.messages] == [b"b1", b"b3", b"b5"]

    assert svc.message_by_id(first.msg_id).message.body == b"hello"
    assert [pm.position for pm in svc.messages_by_key("S1", "k1")] == [first.position]
    assert [pm.queue_offset for pm in svc.messages_by_key("S1", "U1", unique=True)] == [0]
    assert svc.message_at_offset("S1", 1, 2).message.body == b"b1"
    assert svc.search_offset("S1", 1, 0) == 0


async def test_a_retried_send_is_answered_with_its_first_result(cluster: BrokerCluster) -> None:
    svc = _leader(cluster).service
    first = await svc.send("S2", 0, [{"body": b"x", "unique_id": "DUP1"}])
    again = await svc.send("S2", 0, [{"body": b"x", "unique_id": "DUP1"}])
    assert again.results[0].duplicate and again.results[0].msg_id == first.results[0].msg_id
    assert again.to_dict()["results"][0]["duplicate"] is True and "duplicate" not in first.to_dict()["results"][0]
    assert (await svc.pull("S2", 0, 0)).max_offset == 1  # stored once


async def test_one_send_may_name_each_message_s_queue(cluster: BrokerCluster) -> None:
    """Issue 13: the SDK's auto-batches gather concurrent sends to several queues of one group into
    one request (one append); each message keeps its queue and each result names it."""
    svc = _leader(cluster).service
    await svc.put_topic("SQ", read_queue_nums=4, write_queue_nums=4)
    await svc.send("SQ", 2, [{"body": b"before"}])
    sent = await svc.send(
        "SQ", 1, [{"body": b"a", "queue_id": 1}, {"body": b"b", "queue_id": 2}, {"body": b"c"},
                  {"body": b"d", "queue_id": 2, "unique_id": "QD"}]
    )
    assert sent.queue_id == 1
    assert [(r.queue_id, r.queue_offset) for r in sent.results] == [(1, 0), (2, 1), (1, 1), (2, 2)]
    assert [r.get("queue_id") for r in sent.to_dict()["results"]] == [1, 2, 1, 2]
    assert [pm.message.body for pm in (await svc.pull("SQ", 2, 0)).messages] == [b"before", b"b", b"d"]
    assert [pm.message.body for pm in (await svc.pull("SQ", 1, 0)).messages] == [b"a", b"c"]
    again = await svc.send("SQ", 0, [{"body": b"d", "queue_id": 3, "unique_id": "QD"}])  # a retry elsewhere
    assert again.results[0].duplicate and (again.results[0].queue_id, again.results[0].queue_offset) == (2, 2)
    # a request naming no queue per message answers as before (no queue per result)
    assert "queue_id" not in (await svc.send("SQ", 3, [{"body": b"e"}])).to_dict()["results"][0]
    for bad in (4, -1, "1", True):
        with pytest.raises(ProtocolError) as e:
            await svc.send("SQ", 0, [{"body": b"x"}, {"body": b"y", "queue_id": bad}])
        assert (e.value.code, e.value.status) == ("INVALID_QUEUE_ID", 400)
        assert "messages[1].queue_id" in e.value.message
    assert not (await svc.pull("SQ", 0, 0)).messages  # nothing of a refused request was stored


async def test_every_refusal_is_one_service_error(cluster: BrokerCluster) -> None:
    leader = _leader(cluster)
    svc = leader.service
    with pytest.raises(ProtocolError) as e:
        await svc.send("S3", 0, [{"body": "not bytes"}])
    assert type(e.value) is ProtocolError and e.value.status == 400
    with pytest.raises(ProtocolError) as e:
        await svc.send("S3", 99, [{"body": b"x"}])
    assert e.value.code == "INVALID_QUEUE_ID"
    with pytest.raises(ProtocolError) as e:
        await svc.pull("NO_SUCH_TOPIC", 0, 0)
    assert (e.value.code, e.value.status) == ("TOPIC_NOT_EXIST", 404)
    with pytest.raises(ProtocolError) as e:
        svc.message_by_id("RaftNode00:00000000FFFFFFFF")
    assert e.value.code == "MESSAGE_NOT_FOUND"
    # a follower refuses writes and names the leader to retry at
    follower = _follower(cluster)
    with pytest.raises(ProtocolError) as e:
        await follower.service.send("S3", 0, [{"body": b"x"}])
    assert e.value.code == "NOT_LEADER" and e.value.status == 409
    assert e.value.extra["leader_id"] == leader.cfg.dledger.self_id
    assert e.value.extra["leader_addr"] == leader.cfg.address
    assert e.value.body()["leader_addr"] == leader.cfg.address


async def test_a_held_pull_is_woken_by_a_send(cluster: BrokerCluster) -> None:
    leader = _leader(cluster)
    await leader.service.put_topic("S4", read_queue_nums=1, write_queue_nums=1)
    follower = _follower(cluster)
    await wait_until(lambda: follower.store.topic("S4") is not None, 10, "the follower applied the topic")
    pull = asyncio.create_task(follower.service.pull("S4", 0, 0, suspend_ms=3000))
    await wait_until(lambda: ("S4", 0) in follower._waiters, 10, "the follower to hold the pull")
    await leader.service.send("S4", 0, [{"body": b"late"}])
    answer = await pull
    assert answer.status == "FOUND" and [pm.message.body for pm in answer.messages] == [b"late"]


async def test_an_apply_nobody_waits_for_does_not_wake_the_serving_loop(cluster: BrokerCluster) -> None:
    """Issue 13: the tick thread woke each replica's event loop once per applied entry, though on a
    follower nobody reads from no long poll waits. Now only a waited queue (or metadata) wakes a
    waiter (issue 26: apply runs on the loop itself; an apply nobody waits for wakes nothing)."""
    leader = _leader(cluster)
    await leader.service.put_topic("S6", read_queue_nums=1, write_queue_nums=1)
    follower = _follower(cluster)
    await wait_until(lambda: follower.store.topic("S6") is not None, 10, "the follower applied the topic")
    woken: list[object] = []
    original = follower._wake_waiters

    def counting(touched: Any, metadata_changed: bool) -> None:
        woken.append(touched)
        original(touched, metadata_changed)

    follower._wake_waiters = counting  # type: ignore[method-assign]
    seq = follower.applied_seq
    for i in range(5):
        await leader.service.send("S6", 0, [{"body": b"m%d" % i}])
    await wait_until(lambda: follower.store.cqs.get("S6", 0) is not None
                     and follower.store.cqs.get("S6", 0).max_offset == 5, 10, "the follower applied 5")  # fmt: skip
    assert follower.applied_seq > seq and woken == []
    # a held pull on that follower is still woken by the next send
    pull = asyncio.create_task(follower.service.pull("S6", 0, 5, suspend_ms=3000))
    await wait_until(lambda: ("S6", 0) in follower._waiters, 10, "the follower to hold the pull")
    await leader.service.send("S6", 0, [{"body": b"late"}])
    answer = await asyncio.wait_for(pull, 2.5)
    assert answer.status == "FOUND" and [pm.message.body for pm in answer.messages] == [b"late"] and woken


async def test_a_poll_that_looked_just_before_an_apply_does_not_wait_out_its_hold(cluster: BrokerCluster) -> None:
    """The race the skipped wake-up opens: a pull finds the queue empty, an apply lands and finds
    no waiter (wakes nobody), then the pull registers. It must look again, not sleep its hold."""
    leader = _leader(cluster)
    await leader.service.put_topic("S7", read_queue_nums=1, write_queue_nums=1)
    follower = _follower(cluster)
    await wait_until(lambda: follower.store.topic("S7") is not None, 10, "the follower applied the topic")
    seen = follower.applied_seq  # the pull's look happens here ...
    await leader.service.send("S7", 0, [{"body": b"x"}])
    await wait_until(lambda: follower.applied_seq > seen, 10, "the follower applied the send")  # ... the apply ...
    await asyncio.wait_for(follower.wait_for_queue("S7", 0, 30.0, since=seen), 2.0)  # ... returns at once
    assert ("S7", 0) not in follower._waiters


async def test_admin_offsets_and_retries(cluster: BrokerCluster) -> None:
    svc = _leader(cluster).service
    put = await svc.put_topic("S5", read_queue_nums=2, write_queue_nums=2)
    assert put["read_queue_nums"] == 2 and "S5" in [tc.topic for tc in svc.topics()]
    group = await svc.put_group("G5", retry_max_times=3)
    assert group["retry_max_times"] == 3
    sent = await svc.send("S5", 0, [{"body": b"a"}, {"body": b"b"}])
    committed = await svc.commit_offsets("G5", "S5", {0: 2})
    assert committed.updated == 1
    got = svc.group_offsets("G5", "S5")
    assert got.offsets == {0: 2} and got.reset_generation == 0
    reset = await svc.reset_offsets("G5", "S5", offsets={"0": 1})
    assert reset.offsets == {0: 1} and reset.reset_generation == 1
    with pytest.raises(ProtocolError) as e:  # a commit from before the reset is fenced
        await svc.commit_offsets("G5", "S5", {0: 2}, reset_generation=0)
    assert e.value.code == "OFFSET_RESET" and e.value.extra["offsets"] == {"0": 1}
    progress = svc.group_progress("G5")
    assert progress["total_lag"] == 1
    back = await svc.send_back("G5", sent.results[0].position)
    assert back.topic == "%RETRY%G5" and not back.dlq and back.reconsume_times == 1
    dead = await svc.send_back("G5", sent.results[1].position, to_dlq=True)
    assert dead.topic == "%DLQ%G5" and dead.dlq
    resent = await svc.resend_dlq("G5", svc.position_of(dead.msg_id))
    assert resent.topic == "%RETRY%G5"
    with pytest.raises(ProtocolError) as e:
        await svc.resend_dlq("G5", sent.results[0].position)
    assert e.value.code == "NOT_IN_DLQ"
    assert await svc.delete_group("G5") is True
    await svc.delete_topic("S5")
    assert "S5" not in [tc.topic for tc in svc.topics()]


def test_errors_from_below_are_translated_at_the_boundary() -> None:
    server: Any = types.SimpleNamespace(
        node=types.SimpleNamespace(leader_id="n2", settings=types.SimpleNamespace(self_id="n1")),
        client_addr_of=lambda nid: f"addr-of-{nid}",
    )
    base = ServiceBase(server)
    cases: list[tuple[BaseException, int, str]] = [
        (NotLeaderError("n2"), 409, "NOT_LEADER"),
        (AppendTimeoutError("slow"), 504, "SEND_TIMEOUT"),
        (BusyError("full"), 429, "BUSY"),
        (CorruptMessage("bad crc"), 500, "STORE_CORRUPT"),
        (TimeoutError(), 503, "SERVICE_UNAVAILABLE"),
    ]
    for exc, status, code in cases:
        mapped = base.translate(exc)
        assert mapped is not None and (mapped.status, mapped.code) == (status, code), exc
    not_leader = base.translate(NotLeaderError("n2"))
    assert not_leader is not None and not_leader.extra == {"leader_addr": "addr-of-n2", "leader_id": "n2"}
    assert base.translate(ValueError("a bug")) is None  # not ours: it stays a bug (500, logged)
