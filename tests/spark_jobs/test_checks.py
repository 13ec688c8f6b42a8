"""Spark checks on tiny hand-made tables: the edge cases synthetic runs do not reach."""

from __future__ import annotations

from typing import Any

from spark_jobs import checks

SENDS = (
    "type string, producer string, unique_id string, key string, seq long, topic string, invoke_us long, "
    "complete_us long, outcome string, error string, broker string, queue_id long, queue_offset long, "
    "msg_id string, store_us long"
)
DELIVERED = (
    "unique_id string, consumer string, file string, topic string, broker string, queue_id long, "
    "queue_offset long, time_us long, source string"
)


def send(uid: str, position: int, outcome: str = "ok") -> tuple[Any, ...]:
    return ("send", "p0", uid, "k", 0, "T", 1, 2, outcome, None, "G", 0, 0, f"G:{position:016X}", 1)


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
        r["unique_id"]: r["lost"] for r in checks.lost(sends, committed, delivered, floors, True).collect()
    }
    assert judged == {"old": True, "gone": True, "kept": True}  # nobody consumed anything
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


def test_fail_but_stored_and_unexpected(spark: Any) -> None:
    sends = spark.createDataFrame(
        [send("f1", 1, "fail"), send("f2", 2, "fail"), send("f3", 3, "fail"), send("f3", 3, "ok")], SENDS
    )
    committed = spark.createDataFrame([("G", "f1")], "group string, unique_id string")
    delivered = spark.createDataFrame(
        [
            ("f3", "c0", "c0", "T", "G", 0, 0, 5, "receipt"),
            ("ghost", "c0", "c0", "T", "G", 0, 1, 6, "receipt"),
        ],
        DELIVERED,
    )
    stored = {r["unique_id"] for r in checks.fail_but_stored(sends, committed, delivered).collect()}
    assert stored == {"f1"}  # f3 also had an ok line: its storing is expected
    assert [r["unique_id"] for r in checks.unexpected(delivered, sends).collect()] == ["ghost"]


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
