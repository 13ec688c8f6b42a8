"""The audit's definitions (spark_jobs.rules) on small hand-made cases: the reference for the Spark jobs."""

from __future__ import annotations

from spark_jobs.rules import (
    Ack,
    Fetch,
    LogRecord,
    Read,
    Sample,
    Window,
    aborted_reads,
    ack_offset_mismatches,
    commit_crc_mismatches,
    committed_prefix_violations,
    corrupt_reads,
    cq_mismatch,
    damage_epochs,
    divergence,
    elections_without_fault,
    fault_recovery,
    inconsistent_offsets,
    key_order_violations,
    lost_and_unseen,
    nonconflicting_truncations,
    offset_regressions,
    pair_faults,
    poll_order_violations,
    recovery_times,
    send_order_violations,
    unavailability_windows,
)

Q = ("G", "T", 0)


def reads(
    consumer: str, offsets: list[int], session: int | None = 1, queue: tuple[str, str, int] = Q
) -> list[Read]:
    return [Read(consumer, line, queue, o, f"u{o}", session) for line, o in enumerate(offsets)]


def ack(
    uid: str, offset: int | None, line: int = 0, producer: str = "p0", queue: tuple[str, str, int] = Q
) -> Ack:
    return Ack(producer, line, uid, queue, offset, invoke_us=line)


# -- reads: poll order, lost and unseen ------------------------------------------------------------
def test_a_gap_free_session_is_fine_and_a_new_session_may_start_anywhere() -> None:
    assert poll_order_violations(reads("c0", [3, 4, 5])) == []
    assert poll_order_violations(reads("c0", [3, 4, 5]) + reads("c0", [1, 2], session=2)) == []


def test_poll_skip_and_backwards_within_a_session() -> None:
    got = poll_order_violations(reads("c0", [0, 1, 3, 2, 2]))
    assert [(r.offset, prev, kind) for r, prev, kind in got] == [
        (3, 1, "skip"),
        (2, 3, "backwards"),
        (2, 2, "backwards"),
    ]


def test_reads_without_a_session_and_the_drain_are_not_judged() -> None:
    assert poll_order_violations(reads("c0", [0, 5, 1], session=None) + reads("drain", [0, 9, 1])) == []


def test_lost_and_unseen() -> None:
    acks = [ack("a", 0), ack("b", 1, 1), ack("c", 2, 2), ack("d", 3, 3)]
    in_log = {("G", "a"), ("G", "b"), ("G", "d")}  # c never reached a log
    got_reads = [Read("c0", 0, Q, 0, "a", 1), Read("drain", 0, Q, 2, "x", None)]  # reads went up to 2
    lost, unseen = lost_and_unseen(acks, in_log, got_reads)
    assert [(a.unique_id, logged, past) for a, logged, past in lost] == [
        ("b", True, True),
        ("c", False, False),
    ]
    assert [a.unique_id for a in unseen] == ["d"]  # nobody read as far as 3


# -- offsets claimed, acknowledged, sent -----------------------------------------------------------
def test_inconsistent_offsets() -> None:
    claims = [(Q, 0, "a", "ack"), (Q, 0, "a", "receipt"), (Q, 1, "b", "ack"), (Q, 1, "c", "replica G-n1")]
    assert inconsistent_offsets(claims) == {(Q, 1): {"b", "c"}}


def test_ack_offset_mismatch_per_replica() -> None:
    acks = [ack("a", 5), ack("b", 6, 1), ack("c", 9, 2)]
    units = [
        ("G", "n0", "a", "T", 0, 5),
        ("G", "n1", "a", "T", 0, 5),
        ("G", "n0", "b", "T", 0, 6),
        ("G", "n1", "b", "T", 0, 7),
        ("G", "n1", "b", "T", 0, 8),
    ]  # n1 holds b twice, never at 6
    got = ack_offset_mismatches(acks, units)
    assert [(a.unique_id, replica, places) for a, replica, places in got] == [("b", "n1", [(0, 7), (0, 8)])]


def test_send_order_per_producer_and_queue() -> None:
    acks = [
        ack("a", 3, 0),
        ack("b", 5, 1),
        ack("c", 4, 2),
        ack("d", 1, 3, queue=("G", "T", 1)),
        ack("e", 0, 4, producer="p1"),
    ]
    got = send_order_violations(acks)
    assert [(a.unique_id, high) for a, high in got] == [("c", 5)]


def test_aborted_and_corrupt_reads() -> None:
    sends = [("a", "fail"), ("b", "fail"), ("b", "unknown"), ("c", "fail"), ("d", "fail")]
    assert aborted_reads(sends, in_log={"a", "b"}, read={"c"}) == {"a": (True, False), "c": (False, True)}
    rs = [
        Read("c0", 0, Q, 0, "a", 1, 111),
        Read("drain", 0, Q, 0, "a", None, 112),
        Read("c0", 1, Q, 1, "b", 1),
    ]
    got = corrupt_reads({"a": 111, "b": 5}, rs)
    assert [(r.consumer, want) for r, want in got] == [("drain", 111)]


# -- samples ---------------------------------------------------------------------------------------
def sample(
    replica: str,
    line: int,
    commit: int,
    crc: int | None,
    last: int | None = None,
    pid: int = 1,
    term: int = 1,
    last_term: int = 1,
    truncated: int = 0,
    applied: int | None = None,
) -> Sample:
    return Sample(
        "G",
        replica,
        line,
        line * 100,
        pid,
        term,
        commit,
        applied if applied is not None else commit,
        last if last is not None else commit,
        last_term,
        crc,
        truncated,
    )


def test_committed_prefix_shrank_went_back_or_changed() -> None:
    rows = [
        sample("n1", 0, 5, 50),
        sample("n1", 1, 7, 70),
        sample("n1", 2, 7, 71),
        sample("n1", 3, 8, 80, last=6),
        sample("n1", 4, 6, 60, last=9),
        sample("n2", 5, 3, 30, pid=2),
        sample("n2", 6, 2, 20, last=3, pid=3),
    ]
    epochs = damage_epochs(rows, {})
    final = {("G", "n1"): (1, 9, {5: 50, 6: 60, 7: 70, 8: 81}), ("G", "n2"): (1, 2, {2: 20})}
    got = [
        (early.line, late.line if late else None, kind)
        for early, late, kind in committed_prefix_violations(epochs, final)
    ]
    # 2: same commit, other CRC; 3: holds up to 6 after committing 7; 4: commit 6 after 8, same process;
    # 6: a lower commit index after a restart (another process) is no finding while it holds 3;
    # final logs: 8 has CRC 81 (changed), n2's log ends at 2 after it committed 3 (shrank)
    assert got == [
        (1, 2, "changed"),
        (1, 3, "shrank"),
        (3, 4, "commit_back"),
        (3, None, "changed"),
        (5, None, "shrank"),
    ]


def test_damage_windows_cut_epochs_and_leave_out_their_samples() -> None:
    rows = [sample("n1", 0, 9, 90), sample("n1", 1, 9, 91), sample("n1", 2, 4, 40), sample("n1", 3, 5, 50)]
    epochs = damage_epochs(rows, {"n1": [(100, 150)]})  # line 1 (t=100) is inside, line 2 (t=200) after
    assert [[s.line for s in part] for part in epochs[("G", "n1")]] == [[0], [2, 3]]
    assert committed_prefix_violations(epochs, {("G", "n1"): (1, 5, {4: 40, 5: 50})}) == []


def test_commit_crc_mismatch_between_replicas() -> None:
    rows = [sample("n0", 0, 5, 50), sample("n1", 1, 5, 50), sample("n2", 2, 5, 51), sample("n2", 3, 6, None)]
    assert commit_crc_mismatches(rows) == {("G", 5): {("n0", 50), ("n1", 50), ("n2", 51)}}


def test_truncation_is_only_judged_when_the_log_could_not_conflict() -> None:
    rows = [
        sample("n1", 0, 5, 50, term=2, last_term=1),
        sample("n1", 1, 5, 50, term=2, last_term=2, truncated=4),
        sample("n1", 2, 6, 60, term=2, last_term=2, truncated=6),
        sample("n1", 3, 6, 60, term=3, last_term=2, truncated=9),
    ]
    got = nonconflicting_truncations(rows)
    # 0->1: its log still ended in term 1 (a real conflict); 2->3: the term changed
    assert [(a.line, b.line) for a, b in got] == [(1, 2)]


def test_offset_regression_follows_the_applied_index() -> None:
    q = ("G", "T", 0)
    fetches = [
        Fetch("G", "n0", 0, q, 10, 100, 110),
        Fetch("G", "n1", 1, q, 8, 105, 120),  # 105 < 110: not ordered
        Fetch("G", "n2", 2, q, 9, 110, 130),
        Fetch("G", "n0", 3, q, 12, 140, None),
    ]
    got = offset_regressions(fetches, {})
    assert [(f2.line, f1.line) for f2, f1 in got] == [(2, 0)]  # read at >= 110 after 10 was read by 110
    assert offset_regressions(fetches, {("G", "T"): [108]}) == []  # a reset in between


def test_elections_outside_fault_windows() -> None:
    rows = [
        sample("n0", 0, 1, 1, term=1),
        sample("n1", 1, 1, 1, term=2),
        sample("n0", 2, 1, 1, term=2),
        sample("n0", 10, 1, 1, term=3),
        sample("n0", 30, 1, 1, term=4),
    ]
    got = elections_without_fault(rows, [(900, 950), (2900, None)], grace_us=100)
    assert got == [("G", 2, 100)]  # term 3 at 1000 is within the grace after 950; term 4 in an open window


# -- key order, divergence, consume queues, windows -------------------------------------------------
def rec(pos: int, seq: int, uid: str | None = None, key: str = "k") -> LogRecord:
    return LogRecord("G", "p0", key, pos, seq, uid or f"u{seq}")


def test_key_order_increasing_is_fine_and_retried_copies_are_ignored() -> None:
    assert key_order_violations([rec(1, 0), rec(2, 1), rec(3, 1), rec(4, 2)]) == []  # seq 1 stored twice


def test_key_order_violation() -> None:
    got = key_order_violations([rec(1, 0), rec(2, 2), rec(3, 1), rec(4, 3)])
    assert [(r.seq, high) for r, high in got] == [(1, 2)]


def test_key_order_is_per_key() -> None:
    assert key_order_violations([rec(1, 5, key="a"), rec(2, 0, key="b")]) == []


def test_divergence_majority_and_minority() -> None:
    held = {"n0": {1: "a", 2: "b", 3: "c"}, "n1": {1: "a", 2: "b", 3: "c"}, "n2": {1: "a", 2: "x", 3: "y"}}
    assert divergence(held, {"n0": 3, "n1": 3, "n2": 3}) == {"n2": (2, 2)}


def test_divergence_only_where_both_sides_committed() -> None:
    """An uncommitted suffix may differ (it will be truncated); a replica's commit bounds it."""
    held = {"n0": {1: "a", 2: "b"}, "n1": {1: "a", 2: "z"}}
    assert divergence(held, {"n0": 2, "n1": 1}) == {}
    assert divergence(held, {"n0": 2, "n1": 2}) == {"n0": (2, 1), "n1": (2, 1)}  # no majority: both


def test_cq_mismatch_counts() -> None:
    log = [(10, 5), (20, 5), (30, 5), (40, 5)]
    assert cq_mismatch(log, [(0, 10, 5), (1, 20, 5), (2, 30, 5), (3, 40, 5)], 0, 40).total == 0
    assert cq_mismatch(log, [(0, 10, 5), (1, 30, 5), (2, 40, 5)], 0, 40).missing == 1
    got = cq_mismatch(log, [(0, 10, 5), (1, 20, 6), (2, 25, 5), (3, 30, 5), (4, 40, 5)], 0, 40)
    assert (got.missing, got.extra, got.wrong_size, got.misordered) == (0, 1, 1, 0)
    got = cq_mismatch(log, [(0, 10, 5), (1, 30, 5), (2, 20, 5), (3, 40, 5)], 0, 40)
    assert got.misordered == 1
    assert cq_mismatch(log, [(0, 10, 5), (1, 20, 5)], 0, 20).total == 0  # a queue behind its log is fine


def test_unavailability_windows() -> None:
    ms = 1000
    attempts = [
        (0, 5 * ms, True),
        (6 * ms, 10 * ms, True),
        (11 * ms, 3011 * ms, False),
        (12 * ms, 3012 * ms, False),
        (3012 * ms, 3020 * ms, True),
        (3021 * ms, 3030 * ms, True),
    ]
    assert unavailability_windows(attempts, 1000 * ms) == [Window(11 * ms, 3020 * ms)]
    # A quiet period with nothing attempted is not unavailability.
    quiet = [(0, 5 * ms, True), (5000 * ms, 5003 * ms, True)]
    assert unavailability_windows(quiet, 1000 * ms) == []
    # The run ending inside an outage: an open window.
    tail = [(0, 5 * ms, True), (6 * ms, 2500 * ms, False)]
    assert unavailability_windows(tail, 1000 * ms) == [Window(6 * ms, 2500 * ms, True)]


def test_fault_pairing_and_recovery() -> None:
    lines = [
        (10, "kill", "apply", ("a",)),
        (15, "latency", "apply", ("x",)),
        (20, "kill", "heal", ("a",)),
        (40, "latency", "heal", ("x",)),
        (50, "pause", "apply", ("b",)),
    ]
    windows = pair_faults(lines)
    assert [(w.fault, w.apply_us, w.heal_us) for w in windows] == [
        ("kill", 10, 20),
        ("latency", 15, 40),
        ("pause", 50, None),
    ]
    attempts = [(0, 11, True), (9, 30, True), (12, 35, True)]
    assert recovery_times([10], attempts) == [(11, 35)]
    assert recovery_times([100], attempts) == [(None, None)]


def test_fault_recovery_prefers_the_outage_it_caused() -> None:
    outage = Window(1_010_000, 4_000_000)
    got = fault_recovery(1_000_000, 2_000_000, 1_003_000, 1_005_000, [outage, Window(9_000_000, 9_500_000)])
    assert got == {"first_ok_after_ms": 3.0, "time_to_recover_ms": 3000.0, "unavailability_ms": 2990.0}
    calm = fault_recovery(1_000_000, 2_000_000, 1_003_000, 1_005_000, [])
    assert calm == {"first_ok_after_ms": 3.0, "time_to_recover_ms": 5.0, "unavailability_ms": 0}
