"""Checks of transactional sends (issue 15; docs/CHAOS.md, "Audit").

A send line with ``txn`` (history version 4) was sent with ``send_message_in_transaction`` under a
plan (chaos/workload.py ``txn_plan``): ``commit`` and ``check_commit`` end committed — the message
must be delivered, which the ``lost``/``unseen`` checks judge like any acknowledged send —,
``rollback`` and ``check_rollback`` end rolled back: the message must never be delivered nor stored
in its topic. Its half (same unique id, in ``RMQ_SYS_TRANS_HALF_TOPIC``) is in the committed log
either way: only the workload's topics count here. Histories older than version 4 have no ``txn``:
every check is then empty.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

__all__ = ["ROLLED_BACK", "rolled_back_delivered", "txn_counts", "txn_sends"]

ROLLED_BACK = ("rollback", "check_rollback")
COMMITTED = ("commit", "check_commit")


def txn_sends(sends: DataFrame) -> DataFrame:
    return sends.where(F.col("txn").isNotNull())


def rolled_back_delivered(sends: DataFrame, delivered: DataFrame, committed: DataFrame) -> DataFrame:
    """Rolled-back transactional sends whose unique id was read (receipts or drain of the workload's
    topics: ``read``) or is in a workload topic's committed log (``in_log``): an aborted read."""
    rolled = F.broadcast(
        txn_sends(sends).where(F.col("txn").isin(*ROLLED_BACK))
        .select("unique_id", "producer", "txn", "broker", "file", "line").dropDuplicates(["unique_id"])
    )
    in_log = (
        committed.join(rolled.select("unique_id"), ["unique_id"], "left_semi")
        .groupBy("unique_id").agg(F.min("index").alias("log_index"), F.first("topic").alias("log_topic"))
    )
    read = (
        delivered.join(rolled.select("unique_id"), ["unique_id"], "left_semi")
        .groupBy("unique_id")
        .agg(F.count("*").alias("reads"), F.min(F.struct("time_us", "source", "file", "line")).alias("first_read"))
    )
    return (
        rolled.join(in_log, ["unique_id"], "left").join(read, ["unique_id"], "left")
        .where(F.col("log_index").isNotNull() | F.col("reads").isNotNull())
        .withColumn("in_log", F.col("log_index").isNotNull())
        .withColumn("read", F.col("reads").isNotNull())
    )


def txn_counts(sends: DataFrame, delivered: DataFrame) -> DataFrame:
    """Per plan: transactional sends, acknowledged halves, and how many unique ids were delivered."""
    t = txn_sends(sends).dropDuplicates(["unique_id", "outcome"])
    # the transactional ids' reads only: the rest of the deliveries (all of them in a run without
    # transactions) are dropped before the distinct, not after it
    seen = (
        delivered.select("unique_id")
        .join(t.select("unique_id"), ["unique_id"], "left_semi")
        .distinct()
        .withColumn("delivered", F.lit(1))
    )
    return (
        t.join(seen, ["unique_id"], "left")
        .groupBy("txn")
        .agg(
            F.countDistinct("unique_id").alias("sends"),
            F.countDistinct(F.when(F.col("outcome") == "ok", F.col("unique_id"))).alias("acknowledged"),
            F.countDistinct(F.when(F.col("delivered") == 1, F.col("unique_id"))).alias("delivered"),
        )
        .orderBy("txn")
    )
