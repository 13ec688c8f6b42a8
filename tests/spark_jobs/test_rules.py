"""The audit's definitions (spark_jobs.rules) on small hand-made cases: the reference for the Spark jobs."""

from __future__ import annotations

from spark_jobs.rules import (
    LogRecord,
    Receipt,
    Window,
    cq_mismatch,
    divergence,
    fault_recovery,
    key_order_violations,
    pair_faults,
    percentile,
    queue_order_violations,
    recovery_times,
    unavailability_windows,
)

Q = ("G", "T", 0)


def receipts(consumer: str, offsets: list[int], queue: object = Q) -> list[Receipt]:
    return [Receipt(consumer, queue, o, line, f"u{o}") for line, o in enumerate(offsets)]


def test_in_order_and_skips_forward_are_fine() -> None:
    assert queue_order_violations(receipts("c0", [0, 1, 2, 5, 9])) == []


def test_first_delivery_after_a_higher_offset_is_a_violation() -> None:
    got = queue_order_violations(receipts("c0", [0, 2, 1, 3]))
    assert [(r.offset, high) for r, high in got] == [(1, 2)]


def test_redelivery_after_a_rewind_is_not_a_violation() -> None:
    """A rebalance or reset re-reads offsets the consumer already had: duplicates, not disorder."""
    assert queue_order_violations(receipts("c0", [0, 1, 2, 3, 4, 1, 2, 3, 4, 5])) == []


def test_rewind_past_a_gap_exposes_the_skipped_offset() -> None:
    got = queue_order_violations(receipts("c0", [0, 1, 3, 4, 2, 3, 4]))
    assert [(r.offset, high) for r, high in got] == [(2, 4)]


def test_queues_and_consumers_are_separate_streams() -> None:
    rs = receipts("c0", [5, 6]) + receipts("c1", [0, 1]) + receipts("c0", [0, 1], queue=("G", "T", 1))
    assert queue_order_violations(rs) == []


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


def test_percentile_nearest_rank() -> None:
    values = list(range(1, 101))
    assert (percentile(values, 0.5), percentile(values, 0.99), percentile(values, 1.0)) == (50, 99, 100)
    assert percentile([], 0.5) is None
