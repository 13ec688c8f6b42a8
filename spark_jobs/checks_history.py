"""Jepsen's queue checks as Spark DataFrame transformations (definitions: ``rules`` and docs/CHAOS.md):
inconsistent offsets, acknowledged offsets, non-monotonic sends, poll order, corrupt reads.

Inputs as in ``checks`` (``sends``, ``receipts``, ``drain`` with ``file`` and ``line``) plus
``unit_ids``: every replica's consume-queue units of the workload's topics with the unique id of the
committed record each points at (``unit_ids``). Nothing here runs an action. Rows carry the
``file``/``line`` of the history lines that show the finding (the report prints those lines).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs.checks import replica_messages

__all__ = [
    "ack_offset_mismatch",
    "corrupt_read",
    "inconsistent_offsets",
    "poll_order",
    "send_order",
    "unit_ids",
]

_QUEUE = ["broker", "topic", "queue_id"]


def unit_ids(
    cq_units: DataFrame, entries: DataFrame, records: DataFrame, replicas: DataFrame, topics: Sequence[str]
) -> DataFrame:
    """group, replica, topic, queue_id, offset, position, unique_id: each replica's units (of the
    workload's topics) joined to the committed record at the unit's position in that replica."""
    msgs = replica_messages(
        entries, records.select("group", "index", "body_hash", "rel", "unique_id"), replicas
    ).select("group", "replica", "position", "unique_id")
    units = cq_units.where(F.col("topic").isin(list(topics))) if topics else cq_units
    return units.select("group", "replica", "topic", "queue_id", "offset", "position").join(
        msgs, ["group", "replica", "position"]
    )


def _claims(sends: DataFrame, receipts: DataFrame, drain: DataFrame, units: DataFrame) -> DataFrame:
    cols = [*_QUEUE, "offset", "unique_id", "source", "file", "line"]
    acks = (
        sends.where((F.col("outcome") == "ok") & F.col("queue_offset").isNotNull())
        .withColumn("source", F.lit("ack"))
        .withColumnRenamed("queue_offset", "offset")
        .select(*cols)
    )
    reads = [
        df.withColumn("source", F.lit(kind)).withColumnRenamed("queue_offset", "offset").select(*cols)
        for df, kind in ((receipts, "receipt"), (drain, "drain"))
    ]
    replica = units.select(
        F.col("group").alias("broker"),
        "topic",
        "queue_id",
        "offset",
        "unique_id",
        F.concat(F.lit("replica "), F.col("group"), F.lit("-"), F.col("replica")).alias("source"),
        F.lit(None).cast("string").alias("file"),
        F.lit(None).cast("long").alias("line"),
    )
    out = acks
    for df in [*reads, replica]:
        out = out.unionByName(df)
    return out


def inconsistent_offsets(sends: DataFrame, receipts: DataFrame, drain: DataFrame, units: DataFrame) -> DataFrame:
    """(broker, topic, queue_id, offset) named with two or more unique ids by acks, receipts, the
    drain or a replica's consume queue. One aggregate over every claim, no second pass: per offset
    the claims with the lowest and the highest 64-bit hash of the unique id (they differ exactly
    when two ids are named, short of a 2^-64 collision) — ``unique_ids`` are those two ids, and
    ``claims`` (source, unique id, file, line) show where each was named."""
    key = [*_QUEUE, "offset"]
    claim = F.struct(F.xxhash64("unique_id").alias("h"), "unique_id", "source", "file", "line")
    return (
        _claims(sends, receipts, drain, units)
        .groupBy(*key)
        .agg(F.min(claim).alias("lo"), F.max(claim).alias("hi"))
        .where(F.col("lo.h") != F.col("hi.h"))
        .select(
            *key,
            F.array_sort(F.array(F.col("lo.unique_id"), F.col("hi.unique_id"))).alias("unique_ids"),
            F.array(
                *(F.struct(*(F.col(f"{side}.{c}").alias(c) for c in ("unique_id", "source", "file", "line")))
                  for side in ("lo", "hi"))
            ).alias("claims"),
        )
    )


def ack_offset_mismatch(sends: DataFrame, units: DataFrame) -> DataFrame:
    """Ok sends whose acknowledged (topic, queue_id, queue_offset) is not among the units a replica
    holds for the message (one row per send line and disagreeing replica)."""
    acks = sends.where((F.col("outcome") == "ok") & F.col("queue_offset").isNotNull()).select(
        "unique_id",
        F.col("broker").alias("group"),
        F.col("topic").alias("acked_topic"),
        F.col("queue_id").alias("acked_queue_id"),
        F.col("queue_offset").alias("acked_offset"),
        "producer",
        "file",
        "line",
    )
    same = (
        (F.col("topic") == F.col("acked_topic"))
        & (F.col("queue_id") == F.col("acked_queue_id"))
        & (F.col("offset") == F.col("acked_offset"))
    )
    return (
        units.join(acks, ["group", "unique_id"])
        .groupBy(
            "group", "unique_id", "replica", "acked_queue_id", "acked_offset", "producer", "file", "line"
        )
        .agg(
            F.max(same.cast("int")).alias("matched"),
            F.array_sort(F.collect_list(F.struct("queue_id", "offset"))).alias("stored"),
        )
        .where(F.col("matched") == 0)
        .drop("matched")
        .withColumnRenamed("group", "broker")
    )


def send_order(sends: DataFrame) -> DataFrame:
    """One producer's ok sends to one queue in invocation order: an acknowledged offset not above
    every earlier one (``prev_max_offset``, with the line of that earlier send)."""
    part = ["producer", *_QUEUE]
    before = Window.partitionBy(*part).orderBy("invoke_us", "line").rowsBetween(Window.unboundedPreceding, -1)
    ok = sends.where((F.col("outcome") == "ok") & F.col("queue_offset").isNotNull())
    return (
        ok.withColumn("prev", F.max(F.struct("queue_offset", "line")).over(before))
        .where(F.col("prev").isNotNull() & (F.col("queue_offset") <= F.col("prev.queue_offset")))
        .select(
            *part,
            "unique_id",
            "queue_offset",
            F.col("prev.queue_offset").alias("prev_max_offset"),
            "file",
            "line",
            F.col("prev.line").alias("prev_line"),
            "invoke_us",
        )
    )


def poll_order(receipts: DataFrame) -> DataFrame:
    """Within one consumer's session of one queue, in its file order, a receipt whose offset is not
    the previous one + 1: ``kind`` backwards (lower or equal) or skip (higher)."""
    part = ["file", "session", *_QUEUE]
    w = Window.partitionBy(*part).orderBy("line")
    r = (
        receipts.where(F.col("session").isNotNull())
        .withColumn("prev_offset", F.lag("queue_offset").over(w))
        .withColumn("prev_line", F.lag("line").over(w))
    )
    return r.where(
        F.col("prev_offset").isNotNull() & (F.col("queue_offset") != F.col("prev_offset") + 1)
    ).select(
        "consumer",
        *part,
        "queue_offset",
        "prev_offset",
        F.when(F.col("queue_offset") > F.col("prev_offset"), "skip").otherwise("backwards").alias("kind"),
        "unique_id",
        "line",
        "prev_line",
        "time_us",
    )


def corrupt_read(sends: DataFrame, delivered: DataFrame) -> DataFrame:
    """Receipts and drain lines whose body CRC is not the one the send line recorded."""
    sent = (
        sends.where(F.col("body_crc").isNotNull())
        .groupBy("unique_id")
        .agg(F.first("body_crc").alias("sent_crc"), F.min(F.struct("file", "line")).alias("send"))
    )
    return (
        delivered.where(F.col("body_crc").isNotNull())
        .join(sent, ["unique_id"])
        .where(F.col("body_crc") != F.col("sent_crc"))
        .select(
            "unique_id",
            "source",
            "consumer",
            *_QUEUE,
            "queue_offset",
            "body_crc",
            "sent_crc",
            "file",
            "line",
            F.col("send.file").alias("send_file"),
            F.col("send.line").alias("send_line"),
        )
    )
