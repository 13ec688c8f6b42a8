"""The replicated nonce set (broker/store/replay.py), pure: the verdicts are a function of the log alone,
bounded per access key, and a restart that re-reads the log from the checkpoint rebuilds the same
set (issue 23, finding 3)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from broker.protocol.auth import AuthError, SignedHeader
from broker.store.replay import NONCE_OP, NonceLog

NOW = 1_800_000_000_000
W = 300_000


def rec(ak: str, nonce: str, ts: int, now: int, n: int = 1) -> dict[str, Any]:
    return {"op": NONCE_OP, "ak": ak, "nonce": nonce, "ts": ts, "now": now, "n": n}


def signed(ak: str, nonce: str, ts: int) -> SignedHeader:
    return SignedHeader(ak, "broker:C/G/n0", ts, nonce, "0" * 64, "x")


def test_a_nonce_is_admitted_once_and_its_bodies_skipped_after() -> None:
    log = NonceLog(W, 10_000, 100)
    assert log.apply(rec("a", "n1", NOW, NOW, n=2), index=5, position=100) == {}
    assert log.apply(rec("a", "n1", NOW, NOW + 5, n=2), index=6, position=200) == {"refused": "REPLAYED_REQUEST"}
    assert [log.take_skip(6, p) for p in (210, 220, 230)] == [True, True, False]  # exactly its 2 bodies
    assert not log.take_skip(7, 240)
    assert log.is_skipped(210) and log.is_skipped(220) and not log.is_skipped(100)
    assert log.apply(rec("b", "n1", NOW, NOW), 8, 300) == {}  # another key's nonce is its own
    with pytest.raises(AuthError) as e:
        log.check(signed("a", "n1", NOW))  # the early check at a leader
    assert e.value.code == "REPLAYED_REQUEST"
    log.check(signed("a", "n2", NOW))


def test_time_rules_use_each_records_own_leader_time() -> None:
    log = NonceLog(W, 10_000, 100)
    assert log.apply(rec("a", "x1", NOW + 10_001, NOW), 1, 1) == {"refused": "TIMESTAMP_OUT_OF_WINDOW"}
    assert log.apply(rec("a", "x2", NOW - W - 1, NOW), 2, 2) == {"refused": "TIMESTAMP_OUT_OF_WINDOW"}
    # a leader whose clock ran an hour ahead appended this: M moves, but a later leader with a good
    # clock is judged by its own time, so fresh requests are not refused for the hour
    assert log.apply(rec("a", "x3", NOW + 3_600_000, NOW + 3_600_000), 3, 3) == {}
    assert log.apply(rec("a", "x4", NOW, NOW), 4, 4) == {}
    # one 4 minutes ahead (less than a window): what a leader with a good clock admitted stays known
    log2 = NonceLog(W, 10_000, 100)
    assert log2.apply(rec("a", "y1", NOW, NOW), 1, 1) == {}
    assert log2.apply(rec("a", "y2", NOW + 240_000, NOW + 240_000), 2, 2) == {}
    assert log2.apply(rec("a", "y1", NOW, NOW + 1), 3, 3) == {"refused": "REPLAYED_REQUEST"}
    assert log.apply({"op": NONCE_OP, "ak": 7, "n": 3}, 6, 6) == {"refused": "BAD_NONCE_RECORD"}
    assert [log.take_skip(6, p) for p in (7, 8, 9, 10)] == [True, True, True, False]


def test_one_key_over_its_cap_moves_its_own_floor_only() -> None:
    log = NonceLog(W, 10_000, 3)
    for i in range(5):
        assert log.apply(rec("sub", f"p{i}", NOW + 9_000, NOW), i + 1, i + 1) in ({}, {"refused": "REQUEST_TOO_OLD"})
    assert log.apply(rec("admin", "a1", NOW, NOW), 10, 10) == {}
    assert log.apply(rec("admin", "a2", NOW + 1, NOW), 11, 11) == {}
    assert log.apply(rec("sub", "late", NOW + 9_000, NOW), 12, 12) == {"refused": "REQUEST_TOO_OLD"}


def test_entries_older_than_the_window_are_forgotten() -> None:
    log = NonceLog(W, 10_000, 1000)
    for i in range(50):
        log.apply(rec("a", f"old{i}", NOW + i, NOW + i), i + 1, i + 1)
    assert len(log) == 50
    log.apply(rec("a", "new", NOW + 2 * W + 100, NOW + 2 * W + 100), 60, 60)
    assert len(log) == 1  # memory stays bounded by the window, whatever was sent before
    cp = log.checkpoint()
    assert cp["from_index"] == 60 and cp["m"] == NOW + 2 * W + 100


def test_a_restart_that_rereads_the_log_rebuilds_the_same_set() -> None:
    """Apply a seeded stream (replays, stale and future stamps, keys over their cap), take the
    checkpoint, then rebuild from it over the same log as a restart does: every later verdict is the
    same as the original set's."""
    seed = 2311
    print(f"seed {seed}")
    rng = random.Random(seed)
    log_records: list[tuple[int, int, dict[str, Any]]] = []
    original = NonceLog(W, 10_000, 40)
    now = NOW
    used: list[tuple[str, str, int]] = []
    for i in range(3000):
        now += rng.randrange(0, 400)
        ak = rng.choice(["a", "b", "c"])
        if used and rng.random() < 0.2:
            ak, nonce, ts = rng.choice(used)  # a replay (of something maybe long gone)
        else:
            nonce, ts = f"n{i}", now + rng.randrange(-20_000, 12_000)
            used.append((ak, nonce, ts))
        r = rec(ak, nonce, ts, now)
        log_records.append((i + 1, 1000 + i, r))
        original.apply(r, i + 1, 1000 + i)
    cp = original.checkpoint()
    rebuilt = NonceLog(W, 10_000, 40)
    start = rebuilt.begin_restore(cp)
    assert start is not None
    for index, position, r in log_records:
        if index >= start[0]:
            rebuilt.restore_add(r, index, position)
    assert len(rebuilt) == len(original)
    probe_now = now + 1000
    for ak, nonce, ts in used[-500:]:  # every recent request replayed at both: the same verdicts
        r = rec(ak, nonce, ts, probe_now)
        assert original.checkpoint() == rebuilt.checkpoint()
        verdict_original = _verdict(original, ak, nonce, ts)
        verdict_rebuilt = _verdict(rebuilt, ak, nonce, ts)
        assert verdict_original == verdict_rebuilt, (ak, nonce, ts, r)


def _verdict(log: NonceLog, ak: str, nonce: str, ts: int) -> str:
    try:
        log.check(signed(ak, nonce, ts))
    except AuthError as exc:
        return exc.code
    return "ok"
