"""The transaction state machine (broker/store/transactions.py): the index derived from the log, the check
scheduler on an injected clock, and the store's rebuilds (index lost, consume queue lost, leader crash)."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.client import LocalTransactionState, Message, MessageExt, TransactionProducer
from broker.protocol.errors import ProtocolError
from broker.protocol.properties import HALF_TOPIC, PROP_CHECK_IMMUNITY, PROP_HALF_POS
from broker.server.config import parse_broker_config
from broker.store.message import StoredMessage, decode_message, encode_command, encode_message
from broker.store.transactions import (
    COMMIT,
    DISCARDED,
    ROLLBACK,
    CheckScheduler,
    Half,
    TransactionIndex,
    committed_copy,
    immunity_ms,
    split_due,
    to_half,
)
from dledger.clock import ManualClock
from tests.acl_fixtures import PRODUCER
from tests.broker.inproc_cluster import WAIT_S, InProcBrokerCluster
from tests.dledger.harness import wait_until

FAST_CHECKS = {"transactionTimeOut": "200", "transactionCheckInterval": "200"}


def _msg(props: dict[str, str] | None = None, store_ts: int = 1_000_000, uid: str = "A" * 32) -> StoredMessage:
    return StoredMessage("T", 1, 0, "tag", ("k",), dict(props or {}), store_ts - 5, "h", store_ts, uid, b"body")


def _records(*items: StoredMessage | dict[str, object]) -> list[tuple[int, bytes]]:
    """(position, record) as the log would hold them: positions 100, 200, ..."""
    out = []
    for i, item in enumerate(items):
        record = encode_message(item) if isinstance(item, StoredMessage) else encode_command(item)
        out.append((100 * (i + 1), record))
    return out


def _apply(index: TransactionIndex, records: list[tuple[int, bytes]]) -> list[object]:
    """What applying does, record by record (the store's calls)."""
    from broker.store.message import COMMAND_MAGIC, decode_header

    results: list[object] = []
    for position, body in records:
        if body[:1] == COMMAND_MAGIC:
            from broker.store.message import decode_command

            results.append(index.on_command(decode_command(body)))
        else:
            h, _ = decode_header(body)
            results.append(index.on_message(position, len(body), h[0], h[5], int(h[8])))
    return results


# -- records ----------------------------------------------------------------------------------------------
def test_half_and_committed_copy_keep_the_message() -> None:
    m = _msg({"a": "1"})
    half = to_half(m, "pg")
    assert (half.topic, half.queue_id) == (HALF_TOPIC, 0)
    assert half.properties == {"a": "1", "REAL_TOPIC": "T", "REAL_QID": "1", "TRAN_MSG": "true", "PGROUP": "pg"}
    copy = committed_copy(decode_message(encode_message(half)), 100, 2_000_000, 4)
    assert (copy.topic, copy.queue_id, copy.store_ts) == ("T", 1, 2_000_000)
    assert copy.properties == {"a": "1", "TRAN_MSG": "true", "PGROUP": "pg", PROP_HALF_POS: "100"}
    assert (copy.unique_id, copy.keys, copy.tags, copy.body, copy.born_ts) == (m.unique_id, m.keys, m.tags, m.body,
                                                                               m.born_ts)
    assert committed_copy(half, 100, 1, 1).queue_id == 0  # the topic shrank: the queue wraps


def test_immunity_property() -> None:
    assert immunity_ms({}, "m") is None
    assert immunity_ms({PROP_CHECK_IMMUNITY: "30"}, "m") == 30_000
    for bad in ("-1", "x", "99999999"):
        with pytest.raises(ProtocolError):
            immunity_ms({PROP_CHECK_IMMUNITY: bad}, "m")


# -- the index ----------------------------------------------------------------------------------------------
def test_commit_is_idempotent_and_refused_after_rollback(tmp_path: Path) -> None:
    index = TransactionIndex(str(tmp_path / "t.db"))
    h1, h2 = to_half(_msg(uid="1" * 32), "pg"), to_half(_msg(uid="2" * 32), "pg")
    records = _records(h1, h2)  # halves at 100 and 200
    c1 = committed_copy(h1, 100, 2, 4)
    c2 = committed_copy(h2, 200, 2, 4)
    records += [
        (300, encode_message(c1)),  # first commit of 100: visible
        (400, encode_message(c1)),  # second commit of 100: skipped
        (500, encode_command({"op": "txn.end", "position": 200, "state": ROLLBACK})),
        (600, encode_message(c2)),  # a commit after the rollback: skipped
        (700, encode_command({"op": "txn.end", "position": 200, "state": ROLLBACK})),  # again: no change
        (800, encode_command({"op": "txn.end", "position": 100, "state": ROLLBACK})),  # after commit: no change
    ]
    results = _apply(index, records)
    assert results[2:] == [
        True, False, {"outcome": ROLLBACK}, False,
        {"outcome": "RESOLVED", "state": ROLLBACK}, {"outcome": "RESOLVED", "state": COMMIT},
    ]
    assert index.pending_count() == 0
    r1, r2 = index.resolution(100), index.resolution(200)
    assert r1 is not None and (r1.state, r1.copy_position) == (COMMIT, 300)
    assert r2 is not None and r2.state == ROLLBACK
    assert index.counters["second_copies"] == 2
    index.close()


def test_check_counts_discards_and_the_rebuild_equals_applying(tmp_path: Path) -> None:
    halves = [to_half(_msg(uid=f"{i:032X}", store_ts=1_000_000 + i), "pg") for i in range(3)]
    records = _records(
        *halves,  # 100, 200, 300
        {"op": "txn.check", "positions": [100, 200, 300]},
        {"op": "txn.check", "positions": [100, 200, 999]},  # 999: unknown, ignored
        {"op": "txn.discard", "positions": [100]},
        {"op": "txn.check", "positions": [100, 200]},  # 100 is gone: not counted
    )
    a = TransactionIndex(str(tmp_path / "a.db"))
    results = _apply(a, records)
    assert results[3:] == [{"checked": 3}, {"checked": 2}, {"discarded": 1}, {"checked": 1}]
    assert {h.position: h.checks for h in a.pending()} == {200: 3, 300: 1}
    res = a.resolution(100)
    assert res is not None and res.state == DISCARDED
    b = TransactionIndex(str(tmp_path / "b.db"))
    b.rebuild(iter(records), 7)
    assert b.applied_index() == 7 and b.rows() == a.rows()
    c = TransactionIndex(str(tmp_path / "c.db"))  # a follower taking a leader's state entry
    c.load_rows(a.rows(), 9)
    assert c.rows() == a.rows() and c.applied_index() == 9
    for i in (a, b, c):
        i.close()


def test_an_index_not_committed_is_rolled_back_on_close(tmp_path: Path) -> None:
    """Only what a store snapshot committed survives a restart (the rest is re-applied from the log)."""
    path = str(tmp_path / "t.db")
    a = TransactionIndex(path)
    _apply(a, _records(to_half(_msg(), "pg")))
    a.commit(5)
    _apply(a, _records(to_half(_msg(uid="B" * 32), "pg"), to_half(_msg(uid="C" * 32), "pg"))[1:])
    a.close()
    b = TransactionIndex(path)
    assert b.applied_index() == 5 and [h.position for h in b.pending()] == [100]
    b.close()


def test_due_honours_timeout_and_per_message_immunity(tmp_path: Path) -> None:
    index = TransactionIndex(str(tmp_path / "t.db"))
    plain = to_half(_msg(store_ts=10_000, uid="1" * 32), "pg")
    immune = to_half(_msg({PROP_CHECK_IMMUNITY: "60"}, store_ts=10_000, uid="2" * 32), "pg")
    _apply(index, _records(plain, immune))
    assert index.due(15_999, 6000, 10) == []
    assert [h.position for h in index.due(16_000, 6000, 10)] == [100]  # transactionTimeOut 6 s
    assert [h.position for h in index.due(69_999, 6000, 10)] == [100]
    assert [h.position for h in index.due(70_000, 6000, 10)] == [100, 200]  # its own 60 s
    assert [h.position for h in index.due(70_000, 6000, 1)] == [100]  # bounded
    index.close()


def test_split_due_discards_at_check_max() -> None:
    halves = [Half(p, 1, "pg", "T", 0, None, checks) for p, checks in ((1, 0), (2, 14), (3, 15), (4, 20))]
    check, discard = split_due(halves, 15)
    assert [h.position for h in check] == [1, 2] and [h.position for h in discard] == [3, 4]


def test_the_check_scheduler_reads_the_injected_clock() -> None:
    clock = ManualClock()
    s = CheckScheduler(60_000)
    assert s.due(clock.monotonic())  # a new leader scans at once
    clock.advance(59.9)
    assert not s.due(clock.monotonic())
    clock.advance(0.1)
    assert s.due(clock.monotonic())
    assert not s.due(clock.monotonic())
    s.reset()  # leadership changed
    assert s.due(clock.monotonic())


def test_a_half_is_first_checked_back_on_the_first_scan_after_its_timeout(tmp_path: Path) -> None:
    """When the first check-back comes (issue 28, papercut 1; docs/CLIENT.md and OPERATIONS.md say
    this): ``TransactionService.run`` scans when ``CheckScheduler.due`` says so — at once on becoming
    leader, then every ``transactionCheckInterval`` — and each scan checks the halves
    ``TransactionIndex.due`` returns, those older than ``transactionTimeOut``. Driven here by one
    injected clock in the service's 50 ms steps, with the defaults (6 s, 60 s): a half is first
    checked back between 6 s and 66 s after it was stored, not 6 s after. RocketMQ does the same:
    its TransactionalMessageCheckService checks on each pass, ``transactionCheckInterval`` apart."""
    from broker.store.transactions import DEFAULT_CHECK_INTERVAL_MS, DEFAULT_TIMEOUT_MS, POLL_S

    clock = ManualClock()
    index = TransactionIndex(str(tmp_path / "t.db"))
    scheduler = CheckScheduler(DEFAULT_CHECK_INTERVAL_MS)  # the leader's first scan is at t = 0
    t0 = clock.monotonic()
    stored_after_s = {"1" * 32: 0.5, "2" * 32: 53.9, "3" * 32: 54.1, "4" * 32: 119.0}
    halves = {uid: to_half(_msg(store_ts=round((clock.wall() + at) * 1000), uid=uid), "pg")
              for uid, at in stored_after_s.items()}
    position_of = {100 * (i + 1): uid for i, uid in enumerate(halves)}
    first_check: dict[str, float] = {}
    applied = 0
    while len(first_check) < len(halves):
        now = clock.monotonic() - t0
        while applied < len(halves) and stored_after_s[list(halves)[applied]] <= now:  # sent by now
            _apply(index, _records(*halves.values())[applied : applied + 1])
            applied += 1
        if scheduler.due(clock.monotonic()):
            for h in index.due(round(clock.wall() * 1000), DEFAULT_TIMEOUT_MS, 2000):
                first_check.setdefault(position_of[h.position], round(now, 2))
        clock.advance(POLL_S)
        assert now < 600, first_check
    after_send = {uid: round(first_check[uid] - stored_after_s[uid], 2) for uid in halves}
    # scans at 0, 60, 120, 180 s (each a 50 ms poll late at most): a half is checked on the first one
    # at least 6 s after it was stored
    expected = {"1" * 32: 60.0, "2" * 32: 60.0, "3" * 32: 120.0, "4" * 32: 180.0}
    assert first_check == pytest.approx(expected, abs=4 * POLL_S)
    assert after_send == pytest.approx({"1" * 32: 59.5, "2" * 32: 6.1, "3" * 32: 65.9, "4" * 32: 61.0},
                                       abs=4 * POLL_S)
    assert all(DEFAULT_TIMEOUT_MS / 1000 <= d <= (DEFAULT_TIMEOUT_MS + DEFAULT_CHECK_INTERVAL_MS) / 1000 + 4 * POLL_S
               for d in after_send.values())
    index.close()


def test_config_keys() -> None:
    base = {"brokerName": "b", "dLegerGroup": "b", "dLegerPeers": "n0-127.0.0.1:1001", "dLegerSelfId": "n0",
            "storePathRootDir": "/tmp/x", "listenPort": "10911", "dLegerPeerPassword": "p" * 16,
            "namesrvAddr": "127.0.0.1:1"}
    cfg = parse_broker_config(base, source="t", env={})
    assert (cfg.transaction_timeout_ms, cfg.transaction_check_interval_ms, cfg.transaction_check_max) == (
        6000, 60_000, 15)
    cfg = parse_broker_config({**base, "transactionTimeOut": "100", "transactionCheckInterval": "50",
                               "transactionCheckMax": "2"}, source="t", env={})
    assert (cfg.transaction_timeout_ms, cfg.transaction_check_interval_ms, cfg.transaction_check_max) == (100, 50, 2)


# -- on a cluster: rebuilds and a crash -----------------------------------------------------------------------
@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[InProcBrokerCluster]:
    baseline = InProcBrokerCluster.baseline()
    c = await InProcBrokerCluster.start(str(tmp_path / "cluster"), broker_props=FAST_CHECKS)
    try:
        await c.create_topic("T", 1)
        yield c
    finally:
        await c.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)


class Decide:
    def __init__(self) -> None:
        self.answers: dict[str, LocalTransactionState] = {}

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState(arg)

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return self.answers.get(msg.unique_id, LocalTransactionState.UNKNOW)


async def test_index_and_queue_rebuilt_from_the_log(cluster: InProcBrokerCluster) -> None:
    """A replica that lost its transaction index and its consume queue rebuilds both from the log:
    pending halves stay pending, and the queue holds the first commit only — not a second copy, not
    a commit that came after a rollback."""
    g = cluster.groups[0]
    leader = g.replicas[0].broker
    async with TransactionProducer("pg", cluster.namesrv_addr, Decide(), credentials=PRODUCER) as p:
        committed = await p.send_message_in_transaction(Message("T", b"c"), "COMMIT_MESSAGE")
        rolled = await p.send_message_in_transaction(Message("T", b"r"), "ROLLBACK_MESSAGE")
        pending = await p.send_message_in_transaction(
            Message("T", b"p", properties={PROP_CHECK_IMMUNITY: "3600"}), "UNKNOW")
    # Forge what a race could append: a second commit of the first, a commit of the rolled back one.
    for r in (committed, rolled):
        position = int(r.msg_id.split(":")[1], 16)
        half = leader.store.read_message(position)
        await leader.node.append([encode_message(committed_copy(half, position, leader.wall_ms(), 1))], timeout_s=5)
    await g.wait_replicated()
    assert [m["body"] for m in await g.messages("T", 0)] == [b"c"]
    rep = g.replica("n2")
    store_dir = rep.broker.cfg.store_dir
    await g.kill("n2")
    shutil.rmtree(os.path.join(store_dir, "transactions"))
    shutil.rmtree(os.path.join(store_dir, "consumequeue", "T"))
    await g.start("n2")
    await g.wait_replicated()
    n2 = g.replica("n2").broker
    assert [h.unique_id for h in [n2.store.read_message(h.position) for h in n2.store.txn.pending()]] == [
        pending.transaction_id]
    cq = n2.store.cqs.get("T", 0)
    assert cq is not None and cq.max_offset == 1
    assert leader.store.counters["transaction_second_copies"] == 2


async def test_a_leader_crash_keeps_halves_and_checks_continue(cluster: InProcBrokerCluster) -> None:
    g = cluster.groups[0]
    decide = Decide()
    async with TransactionProducer("pg", cluster.namesrv_addr, decide, credentials=PRODUCER,
                                   check_wait_ms=300) as p:
        commit_later = await p.send_message_in_transaction(Message("T", b"commit later"), "UNKNOW")
        roll_later = await p.send_message_in_transaction(Message("T", b"roll later"), "UNKNOW")
        await g.wait_replicated()
        old = g.leader()
        assert old is not None
        await g.kill(old.nid)  # a crash: no goodbye
        new = await g.wait_leader()
        decide.answers[commit_later.transaction_id] = LocalTransactionState.COMMIT_MESSAGE
        decide.answers[roll_later.transaction_id] = LocalTransactionState.ROLLBACK_MESSAGE
        await wait_until(lambda: new.broker.store.txn.pending_count() == 0, WAIT_S, "checked back by the new leader")
        await g.start(old.nid)
        await g.wait_replicated()
    for r in g.replicas:
        assert r.broker.store.txn.pending_count() == 0
        cq = r.broker.store.cqs.get("T", 0)
        assert cq is not None and cq.max_offset == 1
    assert [m["body"] for m in await g.messages("T", 0)] == [b"commit later"]
