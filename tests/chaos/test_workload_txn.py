"""The workload's deterministic transaction plans, its listener, and the history line that carries
the plan (version 4, backwards compatible)."""

from __future__ import annotations

from collections import Counter

from broker.client import LocalTransactionState, Message, MessageExt
from chaos.history import SendRecord
from chaos.workload import TXN_PLANS, Counters, TxnListener, txn_plan

COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)


def ext(uid: str) -> MessageExt:
    return MessageExt("T", 0, -1, "G:1", uid, "", (), {}, b"", 0, "", 0, 1, 1, "G")


def test_txn_plan_is_deterministic_and_splits_its_share_in_quarters() -> None:
    ids = [f"id-{i}" for i in range(20_000)]
    plans = [txn_plan(u, 0.4) for u in ids]
    assert plans == [txn_plan(u, 0.4) for u in ids]
    counts = Counter(p for p in plans if p is not None)
    assert 0.38 < sum(counts.values()) / len(ids) < 0.42
    assert set(counts) == set(TXN_PLANS) and all(0.09 < n / len(ids) < 0.11 for n in counts.values())
    assert all(txn_plan(u, 0.0) is None for u in ids[:100])


def test_the_listener_answers_by_plan_at_once_or_on_check_back() -> None:
    c = Counters()
    listener = TxnListener(0.5, c)
    by_plan = {}
    for i in range(1000):
        p = txn_plan(f"u{i}", 0.5)
        if p is not None:
            by_plan.setdefault(p, f"u{i}")
    m = Message("T", b"x")
    assert [listener.execute_local_transaction(m, p) for p in TXN_PLANS] == [COMMIT, ROLLBACK, UNKNOW, UNKNOW]
    assert [listener.check_local_transaction(ext(by_plan[p])) for p in TXN_PLANS] == [COMMIT, ROLLBACK, COMMIT,
                                                                                    ROLLBACK]
    plain = next(f"u{i}" for i in range(1000) if txn_plan(f"u{i}", 0.5) is None)
    assert listener.check_local_transaction(ext(plain)) == UNKNOW  # not ours to decide
    assert c.txn_checks == 5 and c.txn_checked == set(by_plan.values())


def test_version_4_txn_field_is_left_out_when_unset() -> None:
    plain = SendRecord("p0", "u", None, 0, "T", 1, 2, "ok", None, "G", 0, 0, "G:0", 1_000, 7).to_dict()
    assert "txn" not in plain
    t = SendRecord("p0", "u", None, 0, "T", 1, 2, "ok", None, "G", None, None, None, 1_000, 7, txn="check_commit")
    assert t.to_dict()["txn"] == "check_commit"
