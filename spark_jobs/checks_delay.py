"""Checks of delayed messages and of consumer retries and DLQs (issue 14; docs/CHAOS.md, "Audit").

Inputs are the history tables (``history``): ``sends`` (version 3 adds ``delay_level``,
``deliver_ms`` and ``due_us``: when the producer asked the message delivered, the send's store time
plus its level's delay, or its deliver time), the workload group's ``receipts`` and ``drain`` (of the
real topic), the retry group's ``retries`` (``reconsume_times``, ``retry``, ``answer``) and ``dlq``
(the retry group's DLQ, read at the end). Histories older than version 3 have none of these: every
check is then empty.

A delayed message's *copy* is one (broker, topic, queue, offset) of the real topic holding its unique
id; its store time is the broker's clock when the copy was appended, which is compared with the due
time the send's own store time (the broker's clock too) implies: never the consumer machine's clock.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

__all__ = [
    "EARLY_TOLERANCE_US",
    "delay_deliveries",
    "delayed_lost",
    "delayed_twice",
    "delivered_early",
    "dlq_duplicates",
    "dlq_mismatch",
    "lateness_outside",
    "retry_lost",
    "retry_outcomes",
]

# Store times are milliseconds; a deliver time is the producer's clock against the broker's (one
# machine in a local run): a copy stored less than this before its due time is still on time.
EARLY_TOLERANCE_US = 20_000


def delayed_ok_sends(sends: DataFrame) -> DataFrame:
    return sends.where((F.col("outcome") == "ok") & F.col("due_us").isNotNull())


def delay_deliveries(sends: DataFrame, receipts: DataFrame, drain: DataFrame) -> DataFrame:
    """One row per acknowledged delayed send: ``due_us``, ``copies`` (distinct positions of its unique
    id in the real topic, receipts and drain together), ``delivered_us`` (the first copy's store
    time), ``received_us`` (the first receipt's time, None when only drained), ``lateness_us``."""
    cols = ["unique_id", "broker", "topic", "queue_id", "queue_offset", "store_us"]
    delayed = delayed_ok_sends(sends)
    # Only the delayed ids' copies are counted: the reads of every other message (nearly all of them,
    # and all of them in a run without delays) are dropped before the aggregation, not after it.
    seen = (
        receipts.select(*cols, F.col("time_us").alias("received_us"))
        .unionByName(drain.select(*cols, F.lit(None).cast("long").alias("received_us")))
        .join(delayed.select("unique_id"), ["unique_id"], "left_semi")
    )
    copies = seen.groupBy("unique_id").agg(
        F.countDistinct("broker", "topic", "queue_id", "queue_offset").alias("copies"),
        F.min("store_us").alias("delivered_us"),
        F.min("received_us").alias("received_us"),
    )
    return (
        delayed.select(
            "unique_id", "producer", "broker", "delay_level", "deliver_ms", "store_us", "due_us", "file", "line"
        )
        .withColumnRenamed("store_us", "sent_store_us")
        .join(copies, ["unique_id"], "left")
        .withColumn("copies", F.coalesce(F.col("copies"), F.lit(0)))
        .withColumn("lateness_us", F.col("delivered_us") - F.col("due_us"))
    )


def delayed_lost(dd: DataFrame) -> DataFrame:
    """Acknowledged delayed sends of which no copy reached the real topic (nobody received it, the
    drain did not find it)."""
    return dd.where(F.col("copies") == 0)


def delivered_early(dd: DataFrame, tolerance_us: int = EARLY_TOLERANCE_US) -> DataFrame:
    """Delayed messages whose first copy was stored in the real topic before their due time."""
    return dd.where(F.col("delivered_us") < F.col("due_us") - F.lit(tolerance_us))


def delayed_twice(dd: DataFrame) -> DataFrame:
    """Delayed messages the broker made visible more than once (two positions in the real topic)."""
    return dd.where(F.col("copies") > 1)


def lateness_outside(dd: DataFrame, windows: DataFrame, grace_us: int) -> DataFrame:
    """The delivered rows of ``dd`` whose due time lies outside every fault window (``apply_us``,
    ``heal_us`` + ``grace_us``; an unhealed window lasts to the end)."""
    inside = dd.join(
        F.broadcast(windows),
        (F.col("due_us") >= F.col("apply_us"))
        & (F.col("heal_us").isNull() | (F.col("due_us") <= F.col("heal_us") + F.lit(grace_us))),
        "left_semi",
    )
    return dd.where(F.col("delivered_us").isNotNull()).join(inside.select("unique_id"), ["unique_id"], "left_anti")


def retry_outcomes(retries: DataFrame, dlq: DataFrame, max_reconsume_times: int) -> DataFrame:
    """One row per unique id the retry group failed at least once or that is in its DLQ: ``failed``
    (deliveries answered RECONSUME_LATER), ``consumed`` (a delivery answered success), ``final_fail``
    (failed at its ``max_reconsume_times``-th re-consumption: the DLQ is its place), ``attempts``
    (distinct ``reconsume_times`` failed, up to ``max_reconsume_times``: a send-back that failed makes
    the SDK redeliver locally with a higher count the broker does not know), ``via_retry`` (deliveries
    through the retry topic), ``dlq_copies`` and ``dlq_min_reconsume``/``dlq_max_reconsume`` (of the
    DLQ copies' ``RECONSUME_TIME``)."""
    later = F.col("answer") == "later"
    per_id = retries.groupBy("unique_id").agg(
        F.sum(later.cast("int")).alias("failed"),
        F.max((F.col("answer") == "success").cast("int")).alias("consumed"),
        F.max((later & (F.col("reconsume_times") >= F.lit(max_reconsume_times))).cast("int")).alias("final_fail"),
        F.countDistinct(
            F.when(later & (F.col("reconsume_times") <= F.lit(max_reconsume_times)), F.col("reconsume_times"))
        ).alias("attempts"),
        F.sum(F.coalesce(F.col("retry").cast("int"), F.lit(0))).alias("via_retry"),
    )
    in_dlq = dlq.groupBy("unique_id").agg(
        F.countDistinct("broker", "queue_id", "queue_offset").alias("dlq_copies"),
        F.min("reconsume_times").alias("dlq_min_reconsume"),
        F.max("reconsume_times").alias("dlq_max_reconsume"),
    )
    return (
        per_id.where(F.col("failed") > 0)
        .join(in_dlq, ["unique_id"], "full")
        .select(
            "unique_id",
            F.coalesce("failed", F.lit(0)).alias("failed"),
            (F.coalesce("consumed", F.lit(0)) > 0).alias("consumed"),
            (F.coalesce("final_fail", F.lit(0)) > 0).alias("final_fail"),
            F.coalesce("attempts", F.lit(0)).alias("attempts"),
            F.coalesce("via_retry", F.lit(0)).alias("via_retry"),
            F.coalesce("dlq_copies", F.lit(0)).alias("dlq_copies"),
            "dlq_min_reconsume",
            "dlq_max_reconsume",
        )
    )


def retry_lost(outcomes: DataFrame, sends: DataFrame, retries: DataFrame, dlq: DataFrame) -> DataFrame:
    """Messages the retry group lost (``reason``): ``failed_not_resolved`` — failed, never consumed by a
    later attempt, not in the DLQ; ``never_received`` — acknowledged, never delivered to the retry
    group, not in the DLQ (judged only when the retry group delivered anything)."""
    failed = outcomes.where(
        (F.col("failed") > 0) & ~F.col("consumed") & (F.col("dlq_copies") == 0)
    ).select("unique_id", F.lit("failed_not_resolved").alias("reason"))
    ok = sends.where(F.col("outcome") == "ok").select("unique_id").distinct()
    never = (
        ok.join(retries.select("unique_id"), ["unique_id"], "left_anti")
        .join(dlq.select("unique_id"), ["unique_id"], "left_anti")
        .crossJoin(F.broadcast(retries.select(F.lit(1).alias("_any")).limit(1)))
        .select("unique_id", F.lit("never_received").alias("reason"))
    )
    return failed.unionByName(never)


def dlq_mismatch(outcomes: DataFrame, max_reconsume_times: int) -> DataFrame:
    """DLQ contents that disagree with the retry group's answers (``reason``): ``missing_from_dlq`` —
    failed at its last allowed attempt, not in the DLQ; ``unexpected_in_dlq`` — in the DLQ, never
    failed at its last attempt (or consumed); ``wrong_attempts`` — in the DLQ after a number of failed
    attempts other than 1 + ``max_reconsume_times``, or with a ``RECONSUME_TIME`` other than it."""
    m = F.lit(max_reconsume_times)
    in_dlq = F.col("dlq_copies") > 0
    reason = (
        F.when(F.col("final_fail") & ~in_dlq & ~F.col("consumed"), F.lit("missing_from_dlq"))
        .when(in_dlq & (~F.col("final_fail") | F.col("consumed")), F.lit("unexpected_in_dlq"))
        .when(
            in_dlq
            & (
                (F.col("attempts") != m + 1)
                | (F.col("dlq_min_reconsume") != m)
                | (F.col("dlq_max_reconsume") != m)
            ),
            F.lit("wrong_attempts"),
        )
    )
    return outcomes.withColumn("reason", reason).where(F.col("reason").isNotNull())


def dlq_duplicates(outcomes: DataFrame) -> DataFrame:
    """Messages the DLQ holds more than once (a send-back whose outcome the consumer did not learn,
    sent again: the client's doing, a note)."""
    return outcomes.where(F.col("dlq_copies") > 1)
