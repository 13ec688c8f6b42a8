"""Transactions over RocketMQ's remoting (broker/edge/rocketmq/txn.py): a half sent with TRAN_MSG, ended
by END_TRANSACTION (oneway as Java sends it, a request as Go does), checked back with
CHECK_TRANSACTION_STATE pushed to a producer's connection — also by a new leader after a crash — and
the ACL on both."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.protocol.properties import HALF_TOPIC
from broker.protocol.rocketmq import headers
from broker.protocol.rocketmq import properties as rp
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode
from broker.protocol.rocketmq.command import RemotingCommand
from broker.protocol.rocketmq.message import decode_stored, parse_offset_msg_id
from tests.acl_fixtures import CONSUMER, NOBODY, PRODUCER
from tests.broker.edge.rocketmq_support import (
    client,
    ext,
    heartbeat,
    max_offset,
    ok,
    position_of,
    refused,
    send,
    start_cluster,
)
from tests.broker.inproc_cluster import WAIT_S, InProcBrokerCluster
from tests.broker.serving.rmq_client import RmqClient
from tests.dledger.harness import wait_until

FAST_CHECKS = {"transactionTimeOut": "200", "transactionCheckInterval": "200"}


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[InProcBrokerCluster]:
    baseline = InProcBrokerCluster.baseline()
    c = await start_cluster(str(tmp_path / "cluster"), **FAST_CHECKS)
    try:
        await c.create_topic("T", 1)
        yield c
    finally:
        await c.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)


def end_ext(answer: RemotingCommand, state: int, *, group: str = "pg", from_check: bool = False,
            topic: str | None = None) -> dict[str, str]:
    """END_TRANSACTION's header as DefaultMQProducerImpl.endTransaction builds it from a send's answer."""
    a = ext(answer)
    header = headers.EndTransactionRequestHeader(
        producer_group=group, tran_state_table_offset=int(a["queueOffset"]), commit_log_offset=position_of(answer),
        commit_or_rollback=state, msg_id=a["transactionId"], transaction_id=a["transactionId"], topic=topic,
        from_transaction_check=from_check,
    )
    return headers.to_ext(header)


async def next_check(c: RmqClient, timeout_s: float = WAIT_S) -> RemotingCommand:
    while True:
        cmd = await wait_until(lambda: c.server_requests.get_nowait(), timeout_s, "a CHECK_TRANSACTION_STATE")
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            return cmd


async def test_commit_rollback_and_a_check_back(cluster: InProcBrokerCluster) -> None:
    """Java's way: halves are invisible; a oneway commit shows one, a rollback never does; the
    third, ended UNKNOW, is checked back on the producer's connection (the half in the stored layout,
    in its real topic, with its group, UNIQ_KEY and check count) and committed from the check."""
    leader = cluster.groups[0].replicas[0]
    async with client(leader, PRODUCER) as p:
        ok(await heartbeat(p, "127.0.0.1@txn-1", producers=("pg",)))
        commit = ok(await send(p, "T", 0, b"commit", half=True, keys="kc"))
        rollback = ok(await send(p, "T", 0, b"rollback", half=True))
        later = ok(await send(p, "T", 0, b"later", half=True))
        assert await max_offset(p, "T", 0) == 0  # halves are not in the queue
        await p.oneway(RequestCode.END_TRANSACTION, end_ext(commit, rp.TRANSACTION_COMMIT_TYPE))
        await p.oneway(RequestCode.END_TRANSACTION, end_ext(rollback, rp.TRANSACTION_ROLLBACK_TYPE))
        await p.oneway(RequestCode.END_TRANSACTION, end_ext(later, rp.TRANSACTION_NOT_TYPE))
        await wait_until(lambda: leader.broker.store.txn.pending_count() == 1, WAIT_S, "two halves resolved")

        check = await next_check(p)
        h = headers.parse(headers.CheckTransactionStateRequestHeader, check.ext_fields)
        assert h.commit_log_offset == position_of(later) and h.topic == HALF_TOPIC
        assert h.transaction_id == h.msg_id == ext(later)["transactionId"]
        assert h.tran_state_table_offset == int(ext(later)["queueOffset"])
        assert h.offset_msg_id == ext(later)["msgId"]
        m = decode_stored(check.body)[0]
        assert (m.topic, m.queue_id, m.body, m.commit_log_offset) == ("T", 0, b"later", position_of(later))
        assert m.properties["PGROUP"] == "pg" and m.properties[rp.UNIQ_KEY] == h.transaction_id
        assert int(m.properties[rp.TRANSACTION_CHECK_TIMES]) >= 1
        # answered as 5.3.1 answers a check: with the check's topic (the half topic)
        await p.oneway(RequestCode.END_TRANSACTION,
                       end_ext(later, rp.TRANSACTION_COMMIT_TYPE, from_check=True, topic=h.topic))
        await wait_until(lambda: leader.broker.store.txn.pending_count() == 0, WAIT_S, "the last half committed")
        assert await max_offset(p, "T", 0) == 2
    bodies_seen = [msg["body"] for msg in await cluster.groups[0].messages("T", 0)]
    assert bodies_seen == [b"commit", b"later"]


async def test_end_transaction_as_a_request_and_its_errors(cluster: InProcBrokerCluster) -> None:
    """Go's way (a request, answered), 5.x's topic, and what is refused: a state that is none of 0, 8,
    12; another producer group; another topic; a half that does not exist; an account that may not
    publish to the half's topic (the half stays pending)."""
    leader = cluster.groups[0].replicas[0]
    async with client(leader, PRODUCER) as p, client(leader, CONSUMER) as c:
        half = ok(await send(p, "T", 0, b"x", half=True))
        refused(await p.call(RequestCode.END_TRANSACTION, end_ext(half, 4)), ResponseCode.SYSTEM_ERROR)
        wrong_group = refused(await p.call(RequestCode.END_TRANSACTION, end_ext(half, 8, group="other")),
                              ResponseCode.SYSTEM_ERROR)
        assert "TRANSACTION_MISMATCH" in (wrong_group.remark or "")
        refused(await p.call(RequestCode.END_TRANSACTION, end_ext(half, 8, topic="U")), ResponseCode.SYSTEM_ERROR)
        missing = {**end_ext(half, 8), "commitLogOffset": str(position_of(half) + 1)}
        assert "TRANSACTION_NOT_FOUND" in (refused(await p.call(RequestCode.END_TRANSACTION, missing),
                                                   ResponseCode.SYSTEM_ERROR).remark or "")
        refused(await c.call(RequestCode.END_TRANSACTION, end_ext(half, 8)))  # CONSUMER may not publish
        assert leader.broker.store.txn.pending_count() == 1
        ok(await p.call(RequestCode.END_TRANSACTION, end_ext(half, 8, topic="T")))
        ok(await p.call(RequestCode.END_TRANSACTION, end_ext(half, 8)))  # again: the first commit's answer
        assert await max_offset(p, "T", 0) == 1


async def test_check_backs_go_only_where_the_topic_may_be_published(cluster: InProcBrokerCluster) -> None:
    """A producer of the group whose account may not publish to the half's topic is never handed its
    check-back (it carries the body); one that may is, and the half stays pending until it answers."""
    leader = cluster.groups[0].replicas[0]
    async with client(leader, NOBODY) as stranger, client(leader, PRODUCER) as p:
        ok(await heartbeat(stranger, "127.0.0.1@nobody", producers=("pg",)))
        half = ok(await send(p, "T", 0, b"x", half=True))
        await p.oneway(RequestCode.END_TRANSACTION, end_ext(half, rp.TRANSACTION_NOT_TYPE))
        queue = leader.broker.transactions.queue
        await wait_until(lambda: queue.queued() > 0, WAIT_S, "a check-back queued")
        assert stranger.server_requests.empty()  # nothing pushed to a producer that may not have it
        ok(await heartbeat(p, "127.0.0.1@producer", producers=("pg",)))
        check = await next_check(p)
        assert decode_stored(check.body)[0].body == b"x"
        assert all(r.code != RequestCode.CHECK_TRANSACTION_STATE for r in _drain(stranger))


def _drain(c: RmqClient) -> list[RemotingCommand]:
    out = []
    while not c.server_requests.empty():
        out.append(c.server_requests.get_nowait())
    return out


async def test_a_new_leader_checks_back_after_a_crash(cluster: InProcBrokerCluster) -> None:
    """A half left unresolved when the leader crashes: the producer heartbeats the new leader, which
    checks it back; the commit made from the check is delivered once."""
    g = cluster.groups[0]
    old = g.replicas[0]
    async with client(old, PRODUCER) as p:
        half = ok(await send(p, "T", 0, b"across", half=True))
        await p.oneway(RequestCode.END_TRANSACTION, end_ext(half, rp.TRANSACTION_NOT_TYPE))
        await g.wait_replicated()
    await g.kill(old.nid)
    new = await g.wait_leader()
    async with client(new, PRODUCER) as p:
        ok(await heartbeat(p, "127.0.0.1@txn-2", producers=("pg",)))
        check = await next_check(p)
        h = headers.parse(headers.CheckTransactionStateRequestHeader, check.ext_fields)
        assert h.commit_log_offset == position_of(half)
        assert parse_offset_msg_id(h.offset_msg_id or "")[0].port == int(new.addr.rsplit(":", 1)[1])
        await p.oneway(RequestCode.END_TRANSACTION, end_ext(half, rp.TRANSACTION_COMMIT_TYPE, from_check=True))
        await wait_until(lambda: new.broker.store.txn.pending_count() == 0, WAIT_S, "committed from the check")
    await g.start(old.nid)
    await g.wait_replicated()
    assert [m["body"] for m in await g.messages("T", 0)] == [b"across"]
