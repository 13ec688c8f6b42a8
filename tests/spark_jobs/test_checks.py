"""Spark checks on tiny hand-made tables: the edge cases synthetic runs do not reach."""

from __future__ import annotations

from typing import Any

import pytest

from spark_jobs import checks

SENDS = (
    "type string, producer string, unique_id string, key string, seq long, topic string, invoke_us long, "
    "complete_us long, outcome string, error string, broker string, queue_id long, queue_offset long, "
    "msg_id string, store_us long, body_crc long, file string, line long"
)
DELIVERED = (
    "unique_id string, consumer string, file string, topic string, broker string, queue_id long, "
    "queue_offset long, time_us long, source string, line long, session long, body_crc long"
)


def send(uid: str, position: int, outcome: str = "ok", offset: int = 0, line: int = 0) -> tuple[Any, ...]:
    return (
        "send",
        "p0",
        uid,
        "k",
        0,
        "T",
        1,
        2,
        outcome,
        None,
        "G",
        0,
        offset,
        f"G:{position:016X}",
        1,
        7,
        "p0",
        line,
    )


def read(uid: str, offset: int, line: int = 0, source: str = "receipt") -> tuple[Any, ...]:
    return (uid, "c0", "c0", "T", "G", 0, offset, 5, source, line, 1, 7)


def test_lost_retained_away_and_without_consumers(spark: Any) -> None:
    """Retention removed the prefix of every replica: an ok send below the floor is not called lost
    for missing from the log; with no receipts and no drain, consumption is not judged."""
    sends = spark.createDataFrame([send("old", 0x10), send("gone", 0x900), send("kept", 0x950)], SENDS)
    committed = spark.createDataFrame([("G", "kept")], "group string, unique_id string")
    delivered = spark.createDataFrame([], DELIVERED)
    floors = spark.createDataFrame([("G", 0x800)], "broker string, floor_position long")
    rows = {r["unique_id"]: r for r in checks.lost(sends, committed, delivered, floors, False).collect()}
    assert set(rows) == {"old", "gone"}
    assert (rows["old"]["lost"], rows["old"]["retained_away"]) == (False, True)
    assert (rows["gone"]["lost"], rows["gone"]["retained_away"], rows["gone"]["consumed"]) == (
        True,
        False,
        True,
    )
    judged = {
        r["unique_id"]: (r["lost"], r["unseen"])
        for r in checks.lost(sends, committed, delivered, floors, True).collect()
    }
    # nobody consumed anything and no read went past any of them: "kept" is in the log, unseen; "old"
    # was retained away (not judged from the log) and nobody read past it: neither
    assert judged == {"old": (False, False), "gone": (True, False), "kept": (False, True)}
    past = spark.createDataFrame([read("other", 5)], DELIVERED)  # a read of the queue past offset 0
    judged = {
        r["unique_id"]: (r["lost"], r["unseen"], r["read_past"])
        for r in checks.lost(sends, committed, past, floors, True).collect()
    }
    assert judged["kept"] == (True, False, True)
    # "gone" sits in a replica's log past the recorded commit index: flagged for the reader.
    everything = spark.createDataFrame([("G", "kept"), ("G", "gone")], "group string, unique_id string")
    tail = {
        r["unique_id"]: r["in_uncommitted_tail"]
        for r in checks.lost(sends, committed, delivered, floors, False, everything).collect()
    }
    assert tail == {"old": False, "gone": True}


def test_divergence_without_a_majority_and_beyond_commit(spark: Any) -> None:
    entries = spark.createDataFrame(
        [
            ("G", "n0", 1, 1, 10, 100),
            ("G", "n1", 1, 1, 10, 100),
            ("G", "n0", 2, 1, 20, 200),
            ("G", "n1", 2, 2, 21, 201),  # two replicas, two values: no majority
            ("G", "n0", 3, 1, 30, 300),
            ("G", "n1", 3, 2, 31, 301),  # n1 never recorded 3 as committed: not compared
        ],
        "group string, replica string, index long, term long, chain_crc long, body_hash long",
    )
    replicas = spark.createDataFrame(
        [("G", "n0", 3), ("G", "n1", 2)], "group string, replica string, commit long"
    )
    per_replica, per_group = checks.divergence(entries, replicas)
    got = {r["replica"]: (r["first_index"], r["indexes"], r["kinds"]) for r in per_replica.collect()}
    assert got == {"n0": (2, 1, ["no-majority"]), "n1": (2, 1, ["no-majority"])}
    (g,) = per_group.collect()
    assert (g["compared_indexes"], g["divergent_indexes"]) == (2, 1)


def test_aborted_read_and_unexpected(spark: Any) -> None:
    sends = spark.createDataFrame(
        [
            send("f1", 1, "fail"),
            send("f2", 2, "fail"),
            send("f3", 3, "fail"),
            send("f3", 3, "ok"),
            send("f4", 4, "fail", line=9),
        ],
        SENDS,
    )
    committed = spark.createDataFrame([("G", "f1")], "group string, unique_id string")
    delivered = spark.createDataFrame([read("f3", 0), read("ghost", 1), read("f4", 2, 4, "drain")], DELIVERED)
    got = {r["unique_id"]: r for r in checks.aborted_read(sends, committed, delivered).collect()}
    assert set(got) == {"f1", "f4"}  # f3 also had an ok line: its storing is expected
    assert (got["f1"]["in_log"], got["f1"]["read"], got["f4"]["in_log"], got["f4"]["read"]) == (
        True,
        False,
        False,
        True,
    )
    assert (got["f4"]["line"], got["f4"]["read_source"], got["f4"]["read_file"], got["f4"]["read_line"]) == (
        9,
        "drain",
        "c0",
        4,
    )
    assert [r["unique_id"] for r in checks.unexpected(delivered, sends).collect()] == ["ghost"]


@pytest.mark.slow  # 11-17 s of Spark jobs (docs/ARCHITECTURE.md, "Test tiers")
def test_cq_mismatch_kinds_and_topic_delete(spark: Any) -> None:
    """Extra, wrong-sized and misordered units, against the pure rule; a deleted topic's earlier
    messages are out of range."""
    from spark_jobs import rules

    entries = spark.createDataFrame(
        [("G", "n0", 1, 1, 0, 100, 0, 0, 1, 2), ("G", "n0", 2, 1, 100, 100, 0, 0, 2, 3)],
        "group string, replica string, index long, term long, position long, total_size long, chain_crc long, "
        "body_crc long, body_hash long, records long",
    )
    records = spark.createDataFrame(
        [
            ("G", 1, 1, 50, 10, "T", 0, "a"),
            ("G", 1, 1, 70, 5, "T2", 0, "d"),  # before T2's delete: not compared
            ("G", 2, 2, 50, 10, "T", 0, "b"),
            ("G", 2, 2, 70, 10, "T", 0, "c"),
        ],
        "group string, index long, body_hash long, rel long, size long, topic string, queue_id long, "
        "unique_id string",
    )
    commands = spark.createDataFrame(
        [("G", 2, 2, 20, "topic.delete", "T2")],
        "group string, index long, body_hash long, rel long, op string, topic string",
    )
    units = [(0, 50, 10, -1), (1, 170, 10, 50), (2, 150, 11, 170), (3, 180, 10, 150)]
    cq_units = spark.createDataFrame(
        [("G", "n0", "T", 0, o, p, s, prev) for o, p, s, prev in units],
        "group string, replica string, topic string, queue_id long, offset long, position long, size long, "
        "prev_position long",
    )
    replicas = spark.createDataFrame(
        [("G", "n0", 2, 2, 2, 0)],
        "group string, replica string, recorded_commit long, commit long, group_commit long, snapshot_end long",
    )
    bounds = checks.cq_bounds(entries, records, commands, cq_units, replicas)
    got_bounds = {(r["topic"], r["queue_id"]): (r["lo"], r["hi"]) for r in bounds.collect()}
    assert got_bounds == {("T", 0): (0, 180), ("T2", 0): (121, -1)}  # no snapshot: up to the last unit
    suspects = checks.cq_suspects(entries, records, cq_units, replicas, bounds)
    assert [(r["topic"], r["queue_id"]) for r in suspects.collect()] == [("T", 0)]
    (row,) = checks.cq_mismatch(entries, records, cq_units, replicas, bounds, suspects).collect()
    want = rules.cq_mismatch([(50, 10), (150, 10), (170, 10)], [(o, p, s) for o, p, s, _ in units], 0, 180)
    assert (
        (row["missing"], row["extra"], row["wrong_size"], row["misordered"])
        == (
            want.missing,
            want.extra,
            want.wrong_size,
            want.misordered,
        )
        == (0, 1, 1, 1)
    )
    assert row["first_bad_offset"] == 2


SAMPLES = (
    "group string, replica string, node_id string, line long, time_us long, pid long, role string, term long, "
    "commit_index long, applied_index long, last_index long, last_term long, chain_crc long, entries_truncated long"
)


def sample(
    replica: str, line: int, commit: int, crc: int | None, last: int | None = None, pid: int = 1
) -> tuple[Any, ...]:
    return (
        "G",
        replica,
        replica[-2:],
        line,
        line * 100,
        pid,
        "FOLLOWER",
        1,
        commit,
        commit,
        commit if last is None else last,
        1,
        crc,
        0,
    )


def test_committed_prefix_with_damage_windows_equals_the_rules(spark: Any) -> None:
    """Samples inside a damage window are left out and epochs end there (the rules' cases plus a
    damaged replica whose log legitimately restarts shorter)."""
    from spark_jobs import checks_samples, rules

    rows = [
        sample("G-n1", 0, 5, 50),
        sample("G-n1", 1, 7, 70),
        sample("G-n1", 2, 7, 71),
        sample("G-n1", 3, 8, 80, last=6),
        sample("G-n1", 4, 6, 60, last=9),
        sample("G-n2", 5, 3, 30, pid=2),
        sample("G-n2", 6, 2, 20, last=3, pid=3),
        sample("G-n3", 7, 9, 90),
        sample("G-n3", 8, 9, 91),
        sample("G-n3", 9, 4, 40),
        sample("G-n3", 10, 5, 50),
    ]
    damage_rows = [("G-n3", 800, 850)]
    finals = [("G", "G-n1", 1, 9), ("G", "G-n2", 1, 2), ("G", "G-n3", 1, 5)]
    crcs = {"G-n1": {5: 50, 6: 60, 7: 70, 8: 81}, "G-n2": {2: 20}, "G-n3": {4: 40, 5: 50}}
    entries = spark.createDataFrame(
        [("G", r, i, c) for r, held in crcs.items() for i, c in held.items()],
        "group string, replica string, index long, chain_crc long",
    )
    got = checks_samples.committed_prefix(
        spark.createDataFrame(rows, SAMPLES),
        spark.createDataFrame(damage_rows, "replica string, apply_us long, heal_us long"),
        entries,
        spark.createDataFrame(finals, "group string, replica string, first_index long, last_index long"),
    ).collect()
    samples = [
        rules.Sample(r[0], r[1], r[3], r[4], r[5], r[7], r[8], r[9], r[10], r[11], r[12], r[13]) for r in rows
    ]
    final = {("G", r): (1, last, crcs[r]) for _, r, _, last in finals}
    want = rules.committed_prefix_violations(rules.damage_epochs(samples, {"G-n3": [(800, 850)]}), final)
    assert {(r["line"], r["later_line"], r["kind"]) for r in got} == {
        (a.line, b.line if b else None, k) for a, b, k in want
    }
    assert not any(r["replica"] == "G-n3" for r in got)  # its shorter log came after its damage window


def test_offset_regression_with_a_reset_equals_the_rules(spark: Any) -> None:
    from spark_jobs import checks_samples, rules

    rows = [
        sample("G-n0", 0, 100, 1),
        sample("G-n0", 1, 110, 1),
        sample("G-n1", 2, 105, 1, pid=2),
        sample("G-n1", 3, 120, 1, pid=2),
        sample("G-n2", 4, 110, 1, pid=3),
        sample("G-n2", 5, 130, 1, pid=3),
        sample("G-n0", 6, 140, 1),
    ]
    offsets = [
        ("G", "G-n0", 0, "T", 0, 10),
        ("G", "G-n1", 2, "T", 0, 8),
        ("G", "G-n2", 4, "T", 0, 9),
        ("G", "G-n0", 6, "T", 0, 12),
    ]
    frame = spark.createDataFrame(
        offsets, "group string, replica string, line long, topic string, queue_id long, offset long"
    )
    for resets in ({}, {("G", "T"): [108]}):
        got = checks_samples.offset_regression(spark.createDataFrame(rows, SAMPLES), frame, resets).collect()
        after = {0: 110, 1: 140, 2: 120, 3: None, 4: 130, 5: None, 6: None}
        fetches = [
            rules.Fetch("G", rep, line, ("G", t, q), off, {0: 100, 2: 105, 4: 110, 6: 140}[line], after[line])
            for _, rep, line, t, q, off in offsets
        ]
        want = rules.offset_regressions(fetches, resets)
        assert {(r["line"], r["prev_line"]) for r in got} == {(f2.line, f1.line) for f2, f1 in want}
        assert len(want) == (0 if resets else 1)
