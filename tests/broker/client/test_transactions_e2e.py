"""Transactional messages end to end on the in-process cluster (broker/store/transactions.py,
broker/client/transaction.py): a commit is delivered once, a rollback never, an UNKNOW is resolved
by a check-back, and a leader change in the middle keeps all three."""

from __future__ import annotations

import asyncio
from typing import Any

from broker.client import (
    ClientError,
    LocalTransactionState,
    Message,
    MessageExt,
    TransactionProducer,
)
from broker.client.transport import Transport
from tests.acl_fixtures import CONSUMER, PRODUCER
from tests.broker.client.conftest import ClusterFactory
from tests.broker.inproc_cluster import WAIT_S, InProcBrokerCluster
from tests.dledger.harness import wait_until

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
FAST_CHECKS = {"transactionTimeOut": "200", "transactionCheckInterval": "200", "transactionCheckMax": "15"}


class Listener:
    """Executes to ``arg`` (a state); check-backs answer ``checked[unique id]`` (default UNKNOW)."""

    def __init__(self) -> None:
        self.checked: dict[str, LocalTransactionState] = {}
        self.checks: list[MessageExt] = []

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState(arg)

    async def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        self.checks.append(msg)
        return self.checked.get(msg.unique_id, UNKNOW)


async def delivered(cluster: InProcBrokerCluster, topic: str, queues: int) -> list[dict[str, Any]]:
    out = []
    for g in cluster.groups:
        for q in range(queues):
            out += await g.messages(topic, q)
    return out


async def test_commit_is_delivered_once_and_rollback_never(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 2})
    listener = Listener()
    async with TransactionProducer("txn-pg", cluster.namesrv_addr, listener, credentials=PRODUCER) as p:
        committed = await p.send_message_in_transaction(Message("T", b"commit me", keys="k1", tags="A"), COMMIT)
        rolled = await p.send_message_in_transaction(Message("T", b"roll me back"), ROLLBACK)
        assert committed.local_transaction_state == COMMIT and committed.end_answer is not None
        assert committed.end_answer["state"] == "COMMIT_MESSAGE"
        assert rolled.end_answer == {"state": "ROLLBACK_MESSAGE"}
        # A second commit of the same half is answered with the first message and delivers nothing.
        again = await p._end("T", "RaftNode00", committed.msg_id, committed.transaction_id, COMMIT, False)
        assert again is not None and again["duplicate"] and again["msg_id"] == committed.end_answer["msg_id"]
        # A commit after the rollback is refused with a clear code.
        leader = cluster.groups[0].replicas[0]
        body = {"producer_group": "txn-pg", "topic": "T", "msg_id": rolled.msg_id, "state": "COMMIT_MESSAGE"}
        try:
            await cluster.call(leader.addr, "POST", "/v1/transaction/end", body)
            raise AssertionError("a commit after a rollback was accepted")
        except ClientError as exc:
            assert exc.code == "TRANSACTION_ROLLED_BACK"
    msgs = await delivered(cluster, "T", 2)
    assert [m["body"] for m in msgs] == [b"commit me"]
    (m,) = msgs
    assert m["unique_id"] == committed.transaction_id and m["keys"] == ["k1"] and m["tags"] == "A"
    assert m["properties"]["TRAN_MSG"] == "true" and m["properties"]["PGROUP"] == "txn-pg"
    assert "REAL_TOPIC" not in m["properties"]
    assert leader.broker.store.txn.pending_count() == 0


async def test_unknown_is_resolved_by_check_back(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 2}, broker_props=FAST_CHECKS)
    listener = Listener()
    async with TransactionProducer("txn-pg", cluster.namesrv_addr, listener, credentials=PRODUCER,
                                   check_wait_ms=500) as p:
        to_commit = await p.send_message_in_transaction(Message("T", b"later commit"), UNKNOW)
        to_roll = await p.send_message_in_transaction(Message("T", b"later rollback"), UNKNOW)
        assert to_commit.end_answer == {"state": "UNKNOW", "pending": True}
        assert await delivered(cluster, "T", 2) == []  # invisible while pending
        listener.checked[to_commit.transaction_id] = COMMIT
        listener.checked[to_roll.transaction_id] = ROLLBACK
        leader = cluster.groups[0].replicas[0].broker
        await wait_until(lambda: leader.store.txn.pending_count() == 0, WAIT_S, "check-backs resolve both")
    assert [m["body"] for m in await delivered(cluster, "T", 2)] == [b"later commit"]
    seen = {m.unique_id for m in listener.checks}
    assert seen == {to_commit.transaction_id, to_roll.transaction_id}
    check = next(m for m in listener.checks if m.unique_id == to_commit.transaction_id)
    assert check.topic == "T" and check.body == b"later commit"
    assert int(check.properties["TRANSACTION_CHECK_TIMES"]) >= 1


async def test_unanswered_half_is_discarded_after_check_max(make_cluster: ClusterFactory) -> None:
    props = {**FAST_CHECKS, "transactionTimeOut": "0", "transactionCheckInterval": "50", "transactionCheckMax": "3"}
    cluster = await make_cluster(n_groups=1, topics={"T": 1}, broker_props=props)
    listener = Listener()  # always UNKNOW
    async with TransactionProducer("txn-pg", cluster.namesrv_addr, listener, credentials=PRODUCER,
                                   check_wait_ms=200) as p:
        r = await p.send_message_in_transaction(Message("T", b"never decided"), UNKNOW)
        g = cluster.groups[0]
        leader = g.replicas[0].broker
        await wait_until(lambda: leader.store.txn.pending_count() == 0, WAIT_S, "the half is discarded")
        await g.wait_replicated()
        position = int(r.msg_id.split(":")[1], 16)
        for rep in g.replicas:  # replicated: every replica knows it was discarded
            res = rep.broker.store.txn.resolution(position)
            assert res is not None and res.state == "DISCARDED"
        body = {"producer_group": "txn-pg", "topic": "T", "msg_id": r.msg_id, "state": "COMMIT_MESSAGE"}
        try:
            await cluster.call(g.replicas[0].addr, "POST", "/v1/transaction/end", body)
            raise AssertionError("a commit after the discard was accepted")
        except ClientError as exc:
            assert exc.code == "TRANSACTION_DISCARDED"
    assert leader.transactions.counters["discarded"] == 1
    assert len([c for c in listener.checks if c.unique_id == r.transaction_id]) <= 3
    assert await delivered(cluster, "T", 1) == []


async def test_failover_keeps_commits_and_rollbacks_and_checks_continue(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 2}, broker_props=FAST_CHECKS)
    g = cluster.groups[0]
    listener = Listener()
    async with TransactionProducer("txn-pg", cluster.namesrv_addr, listener, credentials=PRODUCER,
                                   check_wait_ms=300) as p:
        c1 = await p.send_message_in_transaction(Message("T", b"c1"), COMMIT)
        await p.send_message_in_transaction(Message("T", b"r1"), ROLLBACK)
        pending = await p.send_message_in_transaction(Message("T", b"decided after failover"), UNKNOW)
        await g.wait_replicated()
        await g.transfer("n1")  # the leader changes with a half pending
        c2 = await p.send_message_in_transaction(Message("T", b"c2"), COMMIT)
        r2 = await p.send_message_in_transaction(Message("T", b"r2"), ROLLBACK)
        assert c2.end_answer is not None and r2.end_answer is not None
        listener.checked[pending.transaction_id] = COMMIT
        new_leader = g.replica("n1").broker
        await wait_until(lambda: new_leader.store.txn.pending_count() == 0, WAIT_S,
                         "the new leader checks the pending half back")
        await g.wait_replicated()
        # Committing c1 again on the new leader: idempotent (it knows from the log).
        again = await p._end("T", "RaftNode00", c1.msg_id, c1.transaction_id, COMMIT, False)
        assert again is not None and again.get("duplicate") is True
    bodies = sorted(m["body"] for m in await delivered(cluster, "T", 2))
    assert bodies == [b"c1", b"c2", b"decided after failover"]


async def test_bad_input_gets_clear_errors(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 1})
    addr = cluster.groups[0].replicas[0].addr
    cases = [
        ("/v1/transaction/half", {"topic": "T", "messages": [{"body": b"x"}]}, "MISSING_FIELD"),
        ("/v1/transaction/half", {"topic": "T", "producer_group": "pg",
                                  "messages": [{"body": b"x"}, {"body": b"y"}]}, "TRANSACTION_BATCH_UNSUPPORTED"),
        ("/v1/transaction/half", {"topic": "T", "producer_group": "pg",
                                  "messages": [{"body": b"x", "properties": {"DELAY": "3"}}]},
         "TRANSACTION_DELAY_UNSUPPORTED"),
        ("/v1/transaction/half", {"topic": "T", "producer_group": "pg",
                                  "messages": [{"body": b"x", "properties": {"__TXN_HALF_POS": "1"}}]}, "BAD_REQUEST"),
        ("/v1/send", {"topic": "T", "messages": [{"body": b"x", "properties": {"__TXN_HALF_POS": "1"}}]},
         "BAD_REQUEST"),
        ("/v1/send", {"topic": "RMQ_SYS_TRANS_HALF_TOPIC", "messages": [{"body": b"x"}]}, "NO_PERMISSION"),
        ("/v1/transaction/end", {"producer_group": "pg", "topic": "T", "msg_id": "RaftNode00:0000000000000000",
                                 "state": "MAYBE"}, "BAD_REQUEST"),
        ("/v1/transaction/end", {"producer_group": "pg", "topic": "T", "msg_id": "RaftNode00:00000000000FFFFF",
                                 "state": "COMMIT_MESSAGE"}, "TRANSACTION_NOT_FOUND"),
        ("/v1/transaction/checks", {"producer_group": "pg", "topics": []}, "BAD_REQUEST"),
        ("/v1/transaction/checks", {"producer_group": "pg", "topics": ["T"] * 65}, "BAD_REQUEST"),
    ]
    for path, body, code in cases:
        try:
            await cluster.call(addr, "POST", path, body)
            raise AssertionError(f"{path} {body} was accepted")
        except ClientError as exc:
            assert exc.code == code, (path, body, exc)
    for limit in ("0", "1001", "x", "9" * 5000):
        try:
            await cluster.call(addr, "GET", "/v1/transaction/halves", params={"limit": limit})
            raise AssertionError(f"limit {limit[:10]} was accepted")
        except ClientError as exc:
            assert exc.code == "BAD_REQUEST", (limit[:10], exc)


async def test_half_retry_is_stored_once(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 1})
    addr = cluster.groups[0].replicas[0].addr
    body = {"topic": "T", "producer_group": "pg", "messages": [{"body": b"h", "unique_id": "AB" * 16}]}
    first, again = await asyncio.gather(*[cluster.call(addr, "POST", "/v1/transaction/half", body) for _ in range(2)])
    assert first["results"][0]["msg_id"] == again["results"][0]["msg_id"]
    assert cluster.groups[0].replicas[0].broker.store.txn.pending_count() == 1
    listed = await cluster.call(addr, "GET", "/v1/transaction/halves", params={"group": "pg"})
    assert [h["msg_id"] for h in listed["halves"]] == [first["results"][0]["msg_id"]]


async def test_acl_needs_pub_on_the_topic(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 1})
    addr = cluster.groups[0].replicas[0].addr
    half = await cluster.call(addr, "POST", "/v1/transaction/half",
                              {"topic": "T", "producer_group": "pg", "messages": [{"body": b"x"}]})
    msg_id = half["results"][0]["msg_id"]
    consumer = Transport(timeout_s=5.0, credentials=CONSUMER)  # SUB only
    try:
        for path, body in [
            ("/v1/transaction/half", {"topic": "T", "producer_group": "pg", "messages": [{"body": b"x"}]}),
            ("/v1/transaction/end", {"producer_group": "pg", "topic": "T", "msg_id": msg_id,
                                     "state": "COMMIT_MESSAGE"}),
            ("/v1/transaction/checks", {"producer_group": "pg", "topics": ["T"]}),
        ]:
            try:
                await consumer.call(addr, "POST", path, body)
                raise AssertionError(f"{path} accepted without PUB")
            except ClientError as exc:
                assert exc.status == 403, (path, exc)
        try:
            await consumer.call(addr, "GET", "/v1/transaction/halves")
            raise AssertionError("halves listed without admin")
        except ClientError as exc:
            assert exc.status == 403
    finally:
        await consumer.close()
    assert cluster.groups[0].replicas[0].broker.store.txn.pending_count() == 1
