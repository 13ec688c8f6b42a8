"""The delay and retry checks (``checks_delay``) on tiny hand-made history tables."""

from __future__ import annotations

from typing import Any

from spark_jobs import checks, checks_delay
from spark_jobs.frames import _ddl
from spark_jobs.history import RECEIPT_SCHEMA, RETRY_SCHEMA, SEND_SCHEMA, with_extra_columns

MAX = 2  # the retry group's maxReconsumeTimes in these tables


def table(spark: Any, schema: Any, rows: list[dict[str, Any]]) -> Any:
    full = with_extra_columns(schema)
    return spark.createDataFrame([tuple(r.get(f.name) for f in full) for r in rows], _ddl(full))


def send(uid: str, store_us: int = 1_000_000, due_us: int | None = None, outcome: str = "ok",
         offset: int = 0, level: int | None = 1) -> dict[str, Any]:
    return {"type": "send", "producer": "p0", "unique_id": uid, "topic": "T", "invoke_us": 1, "complete_us": 2,
            "outcome": outcome, "error": None if outcome == "ok" else "X", "broker": "G", "queue_id": 0,
            "queue_offset": offset, "msg_id": f"G:{offset:016X}", "store_us": store_us, "file": "p0", "line": 0,
            "delay_level": level if due_us is not None else None, "due_us": due_us}


def copy(uid: str, offset: int, store_us: int, kind: str = "receipt", time_us: int | None = None) -> dict[str, Any]:
    return {"type": kind, "consumer": "c0" if kind == "receipt" else "drain", "time_us": time_us or store_us + 5,
            "topic": "T", "broker": "G", "queue_id": 1, "queue_offset": offset, "msg_id": f"G:{offset:08X}",
            "unique_id": uid, "store_us": store_us, "file": "c0", "line": offset}


def attempt(uid: str, times: int, answer: str, kind: str = "receipt", offset: int = 0) -> dict[str, Any]:
    return {"type": kind, "consumer": "r0" if kind == "receipt" else "dlq", "time_us": 1, "topic": "T",
            "broker": "G", "queue_id": 0, "queue_offset": offset, "unique_id": uid, "store_us": 1,
            "reconsume_times": times, "retry": times > 0, "answer": answer if kind == "receipt" else None,
            "file": "r0", "line": 0}


def test_delayed_lost_early_twice_and_lateness(spark: Any) -> None:
    """The first copy's store time (the broker's clock) against the due time; a consumer's receipt
    time is not what decides early; the drain counts as a copy; two positions are two copies."""
    sends = table(spark, SEND_SCHEMA, [
        send("fine", due_us=2_000_000),
        send("early", due_us=2_000_000),
        send("within_tolerance", due_us=2_000_000),
        send("never", due_us=2_000_000),
        send("twice", due_us=2_000_000),
        send("drained_only", due_us=2_000_000),
        send("plain"),  # not delayed: none of these checks' business
        send("unacked", due_us=None, outcome="unknown"),
    ])
    receipts = table(spark, RECEIPT_SCHEMA, [
        copy("fine", 0, 2_300_000, time_us=1_000),  # a consumer clock far behind: still on time
        copy("early", 1, 1_500_000),
        copy("within_tolerance", 2, 1_990_000),
        copy("twice", 3, 2_100_000),
        copy("twice", 4, 2_900_000),
        copy("twice", 3, 2_100_000),  # the same position received again: one copy
        copy("plain", 5, 1_000_000),
    ])
    drain = table(spark, RECEIPT_SCHEMA, [copy("drained_only", 6, 2_500_000, kind="drain"),
                                          copy("fine", 0, 2_300_000, kind="drain")])
    dd = checks_delay.delay_deliveries(sends, receipts, drain)
    by_id = {r["unique_id"]: r for r in dd.collect()}
    assert set(by_id) == {"fine", "early", "within_tolerance", "never", "twice", "drained_only"}
    assert (by_id["fine"]["copies"], by_id["fine"]["lateness_us"]) == (1, 300_000)
    assert by_id["drained_only"]["received_us"] is None and by_id["drained_only"]["copies"] == 1
    assert [r["unique_id"] for r in checks_delay.delayed_lost(dd).collect()] == ["never"]
    assert [r["unique_id"] for r in checks_delay.delivered_early(dd).collect()] == ["early"]
    assert [(r["unique_id"], r["copies"]) for r in checks_delay.delayed_twice(dd).collect()] == [("twice", 2)]
    # the existing lost/unseen check catches the undelivered delayed message as well
    committed = spark.createDataFrame([("G", u) for u in [*by_id, "plain"]], "group string, unique_id string")
    floors = spark.createDataFrame([], "broker string, floor_position long")
    delivered = checks.deliveries(receipts, drain)
    flagged = {r["unique_id"]: (r["lost"], r["unseen"]) for r in
               checks.lost(sends, committed, delivered, floors, True).collect()}
    assert flagged == {"never": (False, True)}


def test_lateness_outside_fault_windows(spark: Any) -> None:
    sends = table(spark, SEND_SCHEMA, [send("calm", due_us=1_000_000), send("faulty", due_us=50_000_000),
                                       send("open", due_us=90_000_000), send("lost", due_us=1_000_000)])
    receipts = table(spark, RECEIPT_SCHEMA, [copy("calm", 0, 1_100_000), copy("faulty", 1, 55_000_000),
                                             copy("open", 2, 91_000_000)])
    dd = checks_delay.delay_deliveries(sends, receipts, table(spark, RECEIPT_SCHEMA, []))
    windows = spark.createDataFrame([(40_000_000, 45_000_000), (80_000_000, None)], "apply_us long, heal_us long")
    calm = checks_delay.lateness_outside(dd, windows, grace_us=10_000_000)
    assert [r["unique_id"] for r in calm.collect()] == ["calm"]  # 50 s is within heal + grace; 90 s unhealed


def test_retry_lost_and_dlq_mismatch(spark: Any) -> None:
    retries = table(spark, RETRY_SCHEMA, [
        attempt("ok", 0, "success"),
        attempt("once", 0, "later"), attempt("once", 1, "success"),
        attempt("dead", 0, "later"), attempt("dead", 1, "later"), attempt("dead", 2, "later"),
        attempt("dead", 3, "later"),  # a local redelivery after a failed send-back: not an attempt of its own
        attempt("stuck", 0, "later"),  # failed, never delivered again, not in the DLQ: lost
        attempt("missing", 0, "later"), attempt("missing", 1, "later"), attempt("missing", 2, "later"),
        attempt("short", 0, "later"), attempt("short", 2, "later"),  # attempt 1 never happened
        attempt("intruder", 0, "success"),
    ])
    dlq = table(spark, RETRY_SCHEMA, [
        attempt("dead", 2, "", kind="dlq", offset=0),
        attempt("short", 2, "", kind="dlq", offset=1),
        attempt("intruder", 0, "", kind="dlq", offset=2),
        attempt("dead", 2, "", kind="dlq", offset=3),  # a second copy: a note, not a mismatch
    ])
    sends = table(spark, SEND_SCHEMA, [send(u) for u in ("ok", "once", "dead", "stuck", "missing", "short",
                                                        "intruder", "unreceived")])
    outcomes = checks_delay.retry_outcomes(retries, dlq, MAX)
    lost = {(r["unique_id"], r["reason"]) for r in checks_delay.retry_lost(outcomes, sends, retries, dlq).collect()}
    assert lost == {("stuck", "failed_not_resolved"), ("missing", "failed_not_resolved"),
                    ("unreceived", "never_received")}
    mismatch = {r["unique_id"]: r["reason"] for r in checks_delay.dlq_mismatch(outcomes, MAX).collect()}
    assert mismatch == {"missing": "missing_from_dlq", "short": "wrong_attempts", "intruder": "unexpected_in_dlq"}
    assert [r["unique_id"] for r in checks_delay.dlq_duplicates(outcomes).collect()] == ["dead"]
    # the same DLQ copy with another RECONSUME_TIME than maxReconsumeTimes: wrong attempts
    wrong = table(spark, RETRY_SCHEMA, [attempt("dead", 1, "", kind="dlq")])
    got = {r["unique_id"]: r["reason"]
           for r in checks_delay.dlq_mismatch(checks_delay.retry_outcomes(retries, wrong, MAX), MAX).collect()}
    assert got["dead"] == "wrong_attempts"


def test_no_retry_group_no_findings(spark: Any) -> None:
    """A run without a retry group (older histories): no retry findings, whatever the sends."""
    empty = table(spark, RETRY_SCHEMA, [])
    sends = table(spark, SEND_SCHEMA, [send("a"), send("b")])
    outcomes = checks_delay.retry_outcomes(empty, empty, MAX)
    assert checks_delay.retry_lost(outcomes, sends, empty, empty).count() == 0
    assert checks_delay.dlq_mismatch(outcomes, MAX).count() == 0
