"""The transaction checks (``checks_txn``) on tiny hand-made history tables."""

from __future__ import annotations

from typing import Any

from spark_jobs import checks, checks_txn
from spark_jobs.frames import _ddl
from spark_jobs.history import RECEIPT_SCHEMA, SEND_SCHEMA, with_extra_columns


def table(spark: Any, schema: Any, rows: list[dict[str, Any]]) -> Any:
    full = with_extra_columns(schema)
    return spark.createDataFrame([tuple(r.get(f.name) for f in full) for r in rows], _ddl(full))


def send(uid: str, txn: str | None, outcome: str = "ok") -> dict[str, Any]:
    return {"type": "send", "producer": "p0", "unique_id": uid, "topic": "T", "invoke_us": 1, "complete_us": 2,
            "outcome": outcome, "error": None if outcome == "ok" else "X", "broker": "G", "file": "p0", "line": 0,
            "txn": txn}


def read(uid: str, offset: int) -> dict[str, Any]:
    return {"type": "receipt", "consumer": "c0", "time_us": 10 + offset, "topic": "T", "broker": "G",
            "queue_id": 0, "queue_offset": offset, "msg_id": f"G:{offset:016X}", "unique_id": uid, "store_us": 1,
            "file": "c0", "line": offset}


def test_rolled_back_delivered_or_stored_is_found(spark: Any) -> None:
    sends = table(spark, SEND_SCHEMA, [
        send("rb_clean", "rollback"),
        send("rb_read", "rollback"),
        send("crb_stored", "check_rollback"),
        send("committed", "commit"),
        send("check_committed", "check_commit"),
        send("plain", None),
        send("rb_failed_half", "rollback", outcome="fail"),
    ])
    receipts = table(spark, RECEIPT_SCHEMA, [read("rb_read", 0), read("committed", 1), read("plain", 2)])
    drain = table(spark, RECEIPT_SCHEMA, [])
    delivered = checks.deliveries(receipts, drain)
    # The workload topic's committed log (halves live in RMQ_SYS_TRANS_HALF_TOPIC and are filtered out).
    committed = spark.createDataFrame(
        [("G", 7, "T", "crb_stored"), ("G", 3, "T", "committed"), ("G", 9, "T", "check_committed")],
        "group string, index long, topic string, unique_id string",
    )
    rows = {r["unique_id"]: r for r in checks_txn.rolled_back_delivered(sends, delivered, committed).collect()}
    assert set(rows) == {"rb_read", "crb_stored"}
    assert rows["rb_read"]["read"] and not rows["rb_read"]["in_log"]
    assert rows["crb_stored"]["in_log"] and rows["crb_stored"]["log_index"] == 7 and not rows["crb_stored"]["read"]
    counts = {r["txn"]: r.asDict() for r in checks_txn.txn_counts(sends, delivered).collect()}
    assert counts["rollback"] == {"txn": "rollback", "sends": 3, "acknowledged": 2, "delivered": 1}
    assert counts["commit"]["delivered"] == 1 and counts["check_commit"]["delivered"] == 0
    assert None not in counts


def test_older_histories_have_no_transactions(spark: Any) -> None:
    sends = table(spark, SEND_SCHEMA, [send("plain", None)])
    delivered = checks.deliveries(table(spark, RECEIPT_SCHEMA, [read("plain", 0)]), table(spark, RECEIPT_SCHEMA, []))
    committed = spark.createDataFrame([("G", 1, "T", "plain")],
                                      "group string, index long, topic string, unique_id string")
    assert checks_txn.rolled_back_delivered(sends, delivered, committed).count() == 0
    assert checks_txn.txn_counts(sends, delivered).count() == 0
