"""The sampler's checks as Spark DataFrame transformations (definitions: ``rules`` and
docs/CHAOS.md): committed prefix, commit CRC mismatch, non-conflicting truncation, offset
regression, elections without a fault.

Inputs (small: a few samples per replica per second; ``history.ingest_samples``)::

    samples         group replica node_id line time_us pid role term commit_index applied_index
                    last_index last_term chain_crc entries_truncated
    sample_offsets  group replica line topic queue_id offset       (stored offsets of the consumer group)
    damage          replica apply_us heal_us                        (bitflip/truncate fault windows)
    finals          group replica first_index last_index            (each replica's final log)
    entries         the final logs' entries (``replica_tables``)
    resets          group topic index                               (offset.reset of the consumer group)
    windows         apply_us heal_us                                (every fault window; heal null: open)
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

__all__ = [
    "commit_crc_mismatch",
    "committed_prefix",
    "elections_without_fault",
    "nonconflicting_truncation",
    "offset_regression",
]

_REPLICA = ["group", "replica"]


def _epochs(samples: DataFrame, damage: DataFrame) -> DataFrame:
    """Samples with ``epoch`` (damage windows of the replica applied before it) and
    ``last_epoch`` (its number of windows); samples inside a window are dropped."""
    d = F.broadcast(damage.select("replica", "apply_us", "heal_us"))
    joined = samples.join(d, ["replica"], "left")
    before = F.col("apply_us").isNotNull() & (F.col("apply_us") <= F.col("time_us"))
    inside = before & (F.col("time_us") <= F.coalesce(F.col("heal_us"), F.lit(2**62)))
    keys = [c for c in samples.columns]
    return (
        joined.groupBy(*keys)
        .agg(
            F.sum(before.cast("int")).alias("epoch"),
            F.max(inside.cast("int")).alias("inside"),
            F.count("apply_us").alias("last_epoch"),
        )
        .where(F.col("inside") == 0)
        .drop("inside")
    )


def committed_prefix(
    samples: DataFrame, damage: DataFrame, entries: DataFrame, finals: DataFrame
) -> DataFrame:
    """Violations (``rules.committed_prefix_violations``): rows with ``kind`` shrank | commit_back |
    changed, the earlier sample (``line``, ``time_us``, ``commit_index``, ``chain_crc``) and the later
    one (``later_line``...; null when the final log contradicts the earlier sample)."""
    s = _epochs(samples, damage)
    part = [*_REPLICA, "epoch"]
    order = Window.partitionBy(*part).orderBy("time_us", "line")
    before = order.rowsBetween(Window.unboundedPreceding, -1)
    # The earliest sample with the highest commit index so far; the first one at each commit index.
    rank = F.struct(
        F.col("commit_index"),
        (-F.col("time_us")).alias("t"),
        (-F.col("line")).alias("l"),
        F.col("line"),
        F.col("time_us"),
        F.col("pid"),
        F.col("chain_crc"),
    )
    at_commit = (
        Window.partitionBy(*part, "commit_index")
        .orderBy("time_us", "line")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    s = s.withColumn("best", F.max(F.when(F.col("commit_index").isNotNull(), rank)).over(before)).withColumn(
        "first_here",
        F.first(F.struct("line", "time_us", "chain_crc", "commit_index"), ignorenulls=True).over(at_commit),
    )
    shrank = (
        F.col("best").isNotNull()
        & F.col("last_index").isNotNull()
        & (F.col("last_index") < F.col("best.commit_index"))
    )
    back = (
        ~shrank
        & F.col("best").isNotNull()
        & (F.col("pid") == F.col("best.pid"))
        & F.col("commit_index").isNotNull()
        & (F.col("commit_index") < F.col("best.commit_index"))
    )
    changed = (
        ~shrank
        & ~back
        & F.col("commit_index").isNotNull()
        & F.col("first_here").isNotNull()
        & F.col("first_here.chain_crc").isNotNull()
        & F.col("chain_crc").isNotNull()
        & (F.col("first_here.chain_crc") != F.col("chain_crc"))
    )

    def earlier(field: str) -> Column:
        return F.when(changed, F.col(f"first_here.{field}")).otherwise(F.col(f"best.{field}")).alias(field)

    pairs = s.where(shrank | back | changed).select(
        *_REPLICA,
        F.when(shrank, "shrank").when(back, "commit_back").otherwise("changed").alias("kind"),
        earlier("line"),
        earlier("time_us"),
        earlier("commit_index"),
        earlier("chain_crc"),
        F.col("line").alias("later_line"),
        F.col("time_us").alias("later_time_us"),
        F.col("commit_index").alias("later_commit_index"),
        F.col("last_index").alias("later_last_index"),
        F.col("chain_crc").alias("later_chain_crc"),
    )
    # The final log against the first sample at each commit index of the replica's last epoch.
    firsts = (
        s.where(
            (F.col("epoch") == F.col("last_epoch"))
            & F.col("commit_index").isNotNull()
            & F.col("first_here").isNull()
        )
        .join(
            F.broadcast(finals.select(*_REPLICA, "first_index", F.col("last_index").alias("final_last"))),
            _REPLICA,
        )
        .where(F.col("chain_crc").isNotNull() & (F.col("commit_index") >= F.col("first_index")))
    )
    final_crc = entries.select(
        *_REPLICA, F.col("index").alias("commit_index"), F.col("chain_crc").alias("final_crc")
    )
    judged = firsts.join(final_crc, [*_REPLICA, "commit_index"], "left")
    final_shrank = F.col("commit_index") > F.col("final_last")
    final_changed = (
        ~final_shrank & F.col("final_crc").isNotNull() & (F.col("final_crc") != F.col("chain_crc"))
    )
    final_rows = judged.where(final_shrank | final_changed).select(
        *_REPLICA,
        F.when(final_shrank, "shrank").otherwise("changed").alias("kind"),
        "line",
        "time_us",
        "commit_index",
        "chain_crc",
        F.lit(None).cast("long").alias("later_line"),
        F.lit(None).cast("long").alias("later_time_us"),
        F.lit(None).cast("long").alias("later_commit_index"),
        F.col("final_last").alias("later_last_index"),
        F.col("final_crc").alias("later_chain_crc"),
    )
    return pairs.unionByName(final_rows)


def commit_crc_mismatch(samples: DataFrame) -> DataFrame:
    """(group, commit index) that replicas reported with different chain CRCs: the distinct
    (replica, chain CRC) pairs and, per CRC, the first sample line that reported it."""
    s = samples.where(F.col("commit_index").isNotNull() & F.col("chain_crc").isNotNull())
    per_crc = s.groupBy("group", "commit_index", "chain_crc").agg(
        F.array_sort(F.collect_set("replica")).alias("replicas"), F.min("line").alias("line")
    )
    return (
        per_crc.groupBy("group", "commit_index")
        .agg(
            F.count("*").alias("crcs"),
            F.array_sort(F.collect_list(F.struct("chain_crc", "replicas", "line"))).alias("reports"),
        )
        .where(F.col("crcs") > 1)
    )


def nonconflicting_truncation(samples: DataFrame) -> DataFrame:
    """Consecutive samples of one process, same term, the first one's log ending in that term, with
    the truncation counter grown between them."""
    w = Window.partitionBy(*_REPLICA).orderBy("time_us", "line")
    prev = F.lag(
        F.struct("pid", "term", "last_term", "entries_truncated", "line", "time_us", "last_index")
    ).over(w)
    s = samples.withColumn("prev", prev)
    cond = (
        F.col("prev").isNotNull()
        & (F.col("prev.pid") == F.col("pid"))
        & (F.col("prev.term") == F.col("term"))
        & (F.col("prev.last_term") == F.col("term"))
        & (F.col("entries_truncated") > F.col("prev.entries_truncated"))
    )
    return s.where(cond).select(
        *_REPLICA,
        "term",
        (F.col("entries_truncated") - F.col("prev.entries_truncated")).alias("truncated"),
        F.col("prev.last_index").alias("prev_last_index"),
        "last_index",
        F.col("prev.line").alias("prev_line"),
        F.col("prev.time_us").alias("prev_time_us"),
        "line",
        "time_us",
    )


def _epoch_of(applied: Column, cuts: list[int]) -> Column:
    out: Column = F.lit(0)
    for c in cuts:
        out = out + (applied >= F.lit(c)).cast("int")
    return out


def offset_regression(
    samples: DataFrame, sample_offsets: DataFrame, resets: dict[tuple[str, str], list[int]]
) -> DataFrame:
    """Stored offsets read at a higher applied index that are lower than one read at a lower one
    (``rules.offset_regressions``): per violating read, the highest earlier offset it falls below.
    ``resets[(group, topic)]``: indexes of the consumer group's offset.reset commands (few: a
    literal per reset)."""
    w = Window.partitionBy(*_REPLICA).orderBy("time_us", "line")
    nxt = F.lead(F.struct("pid", "applied_index")).over(w)
    applied = samples.withColumn("nxt", nxt).select(
        *_REPLICA,
        "line",
        "time_us",
        F.col("applied_index").alias("applied_before"),
        F.when(F.col("nxt.pid") == F.col("pid"), F.col("nxt.applied_index")).alias("applied_after"),
    )
    f = sample_offsets.join(applied, [*_REPLICA, "line"]).where(F.col("applied_before").isNotNull())
    epoch_before: Column = F.lit(0)
    epoch_after: Column = F.lit(0)
    for (group, topic), cuts in sorted(resets.items()):
        here = (F.col("group") == group) & (F.col("topic") == topic)
        epoch_before = F.when(here, _epoch_of(F.col("applied_before"), sorted(cuts))).otherwise(epoch_before)
        reach = F.coalesce(F.col("applied_after"), F.col("applied_before"))
        epoch_after = F.when(here, _epoch_of(reach, sorted(cuts))).otherwise(epoch_after)
    payload = F.struct("offset", "replica", "line", "time_us", "applied_before", "applied_after")
    earlier = f.where(F.col("applied_after").isNotNull()).select(
        "group",
        "topic",
        "queue_id",
        epoch_before.alias("epoch"),
        F.col("applied_after").alias("key"),
        F.lit(0).alias("kind"),
        payload.alias("p"),
    )
    query = f.select(
        "group",
        "topic",
        "queue_id",
        epoch_after.alias("epoch"),
        F.col("applied_before").alias("key"),
        F.lit(1).alias("kind"),
        payload.alias("p"),
    )
    w2 = (
        Window.partitionBy("group", "topic", "queue_id", "epoch")
        .orderBy("key", "kind")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    ranked = earlier.unionByName(query).withColumn(
        "high",
        F.max(F.when(F.col("kind") == 0, F.struct(F.col("p.offset").alias("o"), F.col("p").alias("p")))).over(
            w2
        ),
    )
    return ranked.where(
        (F.col("kind") == 1) & F.col("high").isNotNull() & (F.col("high.o") > F.col("p.offset"))
    ).select(
        "group",
        "topic",
        "queue_id",
        F.col("p.offset").alias("offset"),
        F.col("high.o").alias("prev_max_offset"),
        F.col("p.replica").alias("replica"),
        F.col("p.line").alias("line"),
        F.col("p.time_us").alias("time_us"),
        F.col("p.applied_before").alias("applied_index"),
        F.col("high.p.replica").alias("prev_replica"),
        F.col("high.p.line").alias("prev_line"),
        F.col("high.p.time_us").alias("prev_time_us"),
        F.col("high.p.applied_after").alias("prev_applied_after"),
    )


def elections_without_fault(samples: DataFrame, windows: DataFrame, grace_us: int) -> DataFrame:
    """group, term, time_us, line: a term first seen in a group outside every fault window
    [apply, heal + grace] (``windows``: apply_us, heal_us; null heal: open to the end)."""
    w = Window.partitionBy("group").orderBy("time_us", "line").rowsBetween(Window.unboundedPreceding, -1)
    new = (
        samples.where(F.col("term").isNotNull())
        .withColumn("prev_max", F.max("term").over(w))
        .where(F.col("prev_max").isNotNull() & (F.col("term") > F.col("prev_max")))
        .select("group", "replica", "term", "time_us", "line")
    )
    inside = (F.col("apply_us") <= F.col("time_us")) & (
        F.col("heal_us").isNull() | (F.col("time_us") <= F.col("heal_us") + F.lit(grace_us))
    )
    return new.join(F.broadcast(windows), inside, "left_anti")
