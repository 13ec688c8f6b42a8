"""The audit's checks as Spark DataFrame transformations (definitions: ``rules`` and docs/CHAOS.md).

Every function takes DataFrames and returns a DataFrame of findings (or of small aggregates);
nothing here runs an action, so the audit decides what to collect. Inputs:

    sends, receipts, drain     history tables (``history``); receipts carry ``file`` and ``line``
    entries                    per replica: every entry it holds (``replica_tables``)
    records, commands          per distinct (group, index, body_hash): the records of that body;
                               a replica's record is at its entry's position + ``rel``
    cq_units                   per replica: every consume-queue unit, with ``prev_position``
    replicas                   one row per replica: group, replica, commit (its own committed
                               index, ≤ what it holds), group_commit (highest commit index any
                               replica of the group recorded), snapshot_end (0 without snapshot)

"Committed" records are those of bodies at index ≤ the group's commit index, held by any replica.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

__all__ = [
    "aborted_read",
    "committed_messages",
    "cq_bounds",
    "cq_mismatch",
    "cq_suspects",
    "deliveries",
    "divergence",
    "duplicate_deliveries",
    "duplicate_log_entries",
    "key_order",
    "latency_first_deliveries",
    "lost",
    "percentiles",
    "recovery",
    "replica_messages",
    "unavailability_gaps",
    "unavailability_starts",
    "unexpected",
]

_QUEUE = ["broker", "topic", "queue_id"]


def _group_commits(replicas: DataFrame) -> DataFrame:
    return F.broadcast(replicas.select("group", "group_commit").distinct())


def committed_messages(records: DataFrame, replicas: DataFrame) -> DataFrame:
    """Message records of committed bodies (one row per distinct body's record)."""
    return (
        records.join(_group_commits(replicas), ["group"])
        .where(F.col("index") <= F.col("group_commit"))
        .drop("group_commit")
    )


def replica_messages(entries: DataFrame, records: DataFrame, replicas: DataFrame) -> DataFrame:
    """Every replica's committed message records with their positions in that replica's log."""
    held = entries.join(_group_commits(replicas), ["group"]).where(F.col("index") <= F.col("group_commit"))
    return (
        held.select("group", "replica", "index", "body_hash", F.col("position").alias("entry_position"))
        .join(records, ["group", "index", "body_hash"])
        .withColumn("position", F.col("entry_position") + F.col("rel"))
    )


def deliveries(receipts: DataFrame, drain: DataFrame) -> DataFrame:
    """Receipts and drain lines together (``source``: receipt | drain)."""
    cols = [
        "unique_id", "consumer", "file", "line", "topic", "broker", "queue_id", "queue_offset", "time_us",
        "session", "body_crc",
    ]
    return (
        receipts.select(*cols)
        .withColumn("source", F.lit("receipt"))
        .unionByName(drain.select(*cols).withColumn("source", F.lit("drain")))
    )


def _ok_sends(sends: DataFrame) -> DataFrame:
    return sends.where(F.col("outcome") == "ok")


def lost(
    sends: DataFrame,
    committed: DataFrame,
    delivered: DataFrame,
    floors: DataFrame,
    check_consumed: bool,
    records: DataFrame | None = None,
) -> DataFrame:
    """Ok sends that are lost or unseen (``rules.lost_and_unseen``), or retained away.

    Lost: not in the group's committed log (unless ``retained_away``), or read by nobody (no receipt,
    no drain line) although reads of its queue went past its acknowledged offset (``read_past``).
    Unseen: in the log, read by nobody, and no read went past it. ``floors`` (broker,
    floor_position): groups whose every replica lost a log prefix to retention; an ok send whose
    msg id points below the floor cannot be looked up (``retained_away``) and is not called lost for
    being absent from the log. Rows: every lost, unseen or retained-away send, with ``in_log``,
    ``consumed``, ``read_past``, the send's ``file``/``line`` and, with ``records`` (all, committed
    or not), ``in_uncommitted_tail``: the message sits past the recorded commit index in some
    replica (a stale commit index, or an entry a new leader will truncate). Consumption is judged
    only when ``check_consumed`` (there are receipts or a drain).
    """
    ok = _ok_sends(sends).select(
        "unique_id",
        "broker",
        "topic",
        "queue_id",
        "queue_offset",
        "msg_id",
        "producer",
        "key",
        "seq",
        "invoke_us",
        "complete_us",
        "file",
        "line",
    )
    stored = committed.select(F.col("group").alias("broker"), "unique_id")
    flags = (
        ok.join(stored, ["broker", "unique_id"], "left_anti")
        .select("unique_id", F.lit(False).alias("in_log"))
        .distinct()
    )
    if check_consumed:
        not_consumed = ok.join(delivered.select("unique_id"), ["unique_id"], "left_anti")
        flags = flags.join(
            not_consumed.select("unique_id", F.lit(False).alias("consumed")).distinct(), ["unique_id"], "full"
        )
    else:
        flags = flags.withColumn("consumed", F.lit(None).cast("boolean"))
    position = F.conv(F.substring_index("msg_id", ":", -1), 16, 10).cast("long")
    highest = delivered.groupBy("broker", "topic", "queue_id").agg(F.max("queue_offset").alias("read_up_to"))
    j = (
        ok.join(F.broadcast(flags), ["unique_id"])
        .join(F.broadcast(floors), ["broker"], "left")
        .join(F.broadcast(highest), ["broker", "topic", "queue_id"], "left")
        .withColumn("in_log", F.coalesce("in_log", F.lit(True)))
        .withColumn("consumed", F.coalesce("consumed", F.lit(True)))
        .withColumn("read_past", F.coalesce(F.col("read_up_to") > F.col("queue_offset"), F.lit(False)))
        .withColumn(
            "retained_away",
            ~F.col("in_log") & F.col("floor_position").isNotNull() & (position < F.col("floor_position")),
        )
    )
    if records is not None:
        tail = (
            records.select(F.col("group").alias("broker"), "unique_id")
            .join(F.broadcast(flags.select("unique_id")), ["unique_id"], "left_semi")
            .distinct()
            .withColumn("anywhere", F.lit(True))
        )
        j = (
            j.join(F.broadcast(tail), ["broker", "unique_id"], "left")
            .withColumn("in_uncommitted_tail", ~F.col("in_log") & F.coalesce("anywhere", F.lit(False)))
            .drop("anywhere")
        )
    is_lost = (~F.col("in_log") & ~F.col("retained_away")) | (~F.col("consumed") & F.col("read_past"))
    is_unseen = F.col("in_log") & ~F.col("consumed") & ~F.col("read_past")
    return (
        j.withColumn("lost", is_lost)
        .withColumn("unseen", ~is_lost & is_unseen)
        .where(F.col("lost") | F.col("unseen") | F.col("retained_away"))
        .drop("floor_position", "read_up_to")
        .dropDuplicates(["unique_id"])
    )


def duplicate_deliveries(receipts: DataFrame) -> DataFrame:
    """Unique ids handed to listeners more than once (receipts only; the drain is a final read).
    Counted first (a cheap partial aggregation), then described: consumers and topic only for the
    ids received twice or more."""
    twice = receipts.groupBy("unique_id").count().where(F.col("count") > 1).select("unique_id")
    return (
        receipts.join(twice, ["unique_id"], "left_semi")
        .groupBy("unique_id")
        .agg(
            F.count("*").alias("deliveries"),
            F.sort_array(F.collect_set("consumer")).alias("consumers"),
            F.first("topic").alias("topic"),
        )
        .where(F.col("deliveries") > 1)
    )


def duplicate_log_entries(committed: DataFrame) -> DataFrame:
    """Unique ids stored more than once in a group's committed log (retried sends): distinct
    (index, rel) places holding the id (one body per place counts, however many replicas
    diverge there)."""
    candidates = committed.groupBy("group", "unique_id").count().where(F.col("count") > 1).drop("count")
    return (
        committed.select("group", "unique_id", "index", "rel")
        .join(F.broadcast(candidates), ["group", "unique_id"], "left_semi")
        .distinct()
        .groupBy("group", "unique_id")
        .agg(F.count("*").alias("copies"), F.sort_array(F.collect_list("index")).alias("indexes"))
        .where(F.col("copies") > 1)
    )


def unexpected(delivered: DataFrame, sends: DataFrame) -> DataFrame:
    """Received or drained unique ids with no send line at all (any outcome)."""
    sent = sends.select("unique_id").distinct()
    return (
        delivered.join(sent, ["unique_id"], "left_anti")
        .groupBy("unique_id")
        .agg(
            F.count("*").alias("deliveries"),
            F.sort_array(F.collect_set("source")).alias("sources"),
            F.sort_array(F.collect_set("consumer")).alias("consumers"),
            F.first("topic").alias("topic"),
            F.first("broker").alias("broker"),
            F.first("queue_id").alias("queue_id"),
            F.first("queue_offset").alias("queue_offset"),
        )
    )


def aborted_read(sends: DataFrame, committed: DataFrame, delivered: DataFrame) -> DataFrame:
    """Unique ids whose every send line says ``fail`` (definitely not stored) yet are in the
    committed log (``in_log``) or were read (``read``): an aborted read. With the send line and the
    first read's."""
    failed_lines = F.broadcast(
        sends.where(F.col("outcome") == "fail").select("unique_id", "producer", "error", "file", "line")
    )
    other_outcome = (
        sends.where(F.col("outcome") != "fail")
        .select("unique_id")
        .join(failed_lines.select("unique_id"), ["unique_id"], "left_semi")
    )
    failed = F.broadcast(
        failed_lines.join(F.broadcast(other_outcome), ["unique_id"], "left_anti").dropDuplicates(["unique_id"])
    )
    # the failed ids' copies in the log only (a semi join on the small side first, then distinct),
    # not a distinct of every committed id
    in_log = (
        committed.select("unique_id")
        .join(failed.select("unique_id"), ["unique_id"], "left_semi")
        .distinct()
        .select("unique_id", F.lit(True).alias("in_log"))
    )
    read = (
        delivered.join(failed.select("unique_id"), ["unique_id"], "left_semi")
        .groupBy("unique_id")
        .agg(F.min(F.struct("time_us", "file", "line", "source")).alias("first_read"))
    )
    return (
        failed.join(F.broadcast(in_log), ["unique_id"], "left")
        .join(read, ["unique_id"], "left")
        .withColumn("in_log", F.coalesce("in_log", F.lit(False)))
        .withColumn("read", F.col("first_read").isNotNull())
        .where(F.col("in_log") | F.col("read"))
        .select(
            "unique_id",
            "producer",
            "error",
            "in_log",
            "read",
            "file",
            "line",
            F.col("first_read.source").alias("read_source"),
            F.col("first_read.file").alias("read_file"),
            F.col("first_read.line").alias("read_line"),
        )
    )


def key_order(committed: DataFrame, sends: DataFrame) -> DataFrame:
    """Per-key log order violations of one producer's ok sends (``rules.key_order_violations``);
    log order is (index, rel); one row per violating unique id. Both windows run on one
    partitioning (group, producer, key)."""
    ok = (
        _ok_sends(sends)
        .where(F.col("key").isNotNull() & F.col("seq").isNotNull())
        .select("unique_id", "producer", "key", "seq", F.col("broker").alias("group"))
        .dropDuplicates(["unique_id"])
    )
    part = ["group", "producer", "key"]
    first = Window.partitionBy(*part, "unique_id").orderBy("index", "rel")
    before = Window.partitionBy(*part).orderBy("index", "rel").rowsBetween(Window.unboundedPreceding, -1)
    return (
        committed.select("group", "index", "rel", "unique_id")
        .join(ok, ["group", "unique_id"])
        .repartition(*part)
        .withColumn("copy", F.row_number().over(first))
        .withColumn("prev_max_seq", F.max(F.when(F.col("copy") == 1, F.col("seq"))).over(before))
        .where((F.col("copy") == 1) & (F.col("seq") <= F.col("prev_max_seq")))
        .select("group", "producer", "key", "unique_id", "seq", "prev_max_seq", "index", "rel")
    )


def divergence(entries: DataFrame, replicas: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(per diverging replica: first index, divergent indexes, kinds; per group: compared indexes,
    divergent indexes). See ``rules.divergence``; kind ``body`` when the body differs from the
    majority's, ``chain`` when only term/chain CRC do, ``no-majority`` when there is none."""
    r = F.broadcast(replicas.select("group", "replica", "commit"))
    e = entries.join(r, ["group", "replica"]).where(F.col("index") <= F.col("commit"))
    per_index = e.groupBy("group", "index").agg(
        F.count("*").alias("n"),
        (
            (F.min("chain_crc") != F.max("chain_crc"))
            | (F.min("body_hash") != F.max("body_hash"))
            | (F.min("term") != F.max("term"))
        ).alias("disagree"),
    )
    groups = (
        per_index.where(F.col("n") >= 2)
        .groupBy("group")
        .agg(
            F.count("*").alias("compared_indexes"),
            F.max("index").alias("compared_up_to"),
            F.sum(F.col("disagree").cast("int")).alias("divergent_indexes"),
        )
    )
    bad = per_index.where(F.col("disagree") & (F.col("n") >= 2)).select("group", "index", "n")
    rows = e.join(bad, ["group", "index"])
    value = ["term", "chain_crc", "body_hash"]
    votes = rows.groupBy("group", "index", *value).agg(F.count("*").alias("votes"), F.first("n").alias("n"))
    majority = votes.where(2 * F.col("votes") > F.col("n")).select(
        "group", "index", *[F.col(c).alias(f"maj_{c}") for c in value]
    )
    judged = rows.join(majority, ["group", "index"], "left")
    same = (
        (F.col("term") == F.col("maj_term"))
        & (F.col("chain_crc") == F.col("maj_chain_crc"))
        & (F.col("body_hash") == F.col("maj_body_hash"))
    )
    kind = (
        F.when(F.col("maj_term").isNull(), "no-majority")
        .when(F.col("body_hash") != F.col("maj_body_hash"), "body")
        .otherwise("chain")
    )
    diverged = judged.where(F.col("maj_term").isNull() | ~same).withColumn("kind", kind)
    per_replica = diverged.groupBy("group", "replica").agg(
        F.min("index").alias("first_index"),
        F.count("*").alias("indexes"),
        F.sort_array(F.collect_set("kind")).alias("kinds"),
        F.min_by("kind", "index").alias("first_kind"),
    )
    return per_replica, groups


_CQ_KEY = ["group", "replica", "topic", "queue_id"]


def cq_bounds(
    entries: DataFrame, records: DataFrame, commands: DataFrame, cq_units: DataFrame, replicas: DataFrame
) -> DataFrame:
    """Per (replica, queue) the compared range of log positions ``[lo, hi]`` (small).

    ``lo`` = the later of the replica's first held entry and just after the last committed
    ``topic.delete`` of the topic (a delete destroys the queues; later messages start new ones at
    offset 0); ``hi`` = the end of the replica's committed log, but no further than the last unit
    unless the store snapshot says the queues were complete up to its end position (a replica
    that has not applied everything yet is not a mismatch)."""
    rep = F.broadcast(replicas.select("group", "replica", "group_commit", "snapshot_end"))
    held = entries.join(rep, ["group", "replica"]).where(F.col("index") <= F.col("group_commit"))
    ends = held.groupBy("group", "replica", "snapshot_end").agg(
        F.min("position").alias("log_first"), F.max(F.col("position") + F.col("total_size")).alias("log_end")
    )
    deletes = (
        held.select("group", "replica", "index", "body_hash", "position")
        .join(F.broadcast(commands.where(F.col("op") == "topic.delete")), ["group", "index", "body_hash"])
        .groupBy("group", "replica", "topic")
        .agg(F.max(F.col("position") + F.col("rel")).alias("deleted_at"))
    )
    last_unit = cq_units.groupBy(*_CQ_KEY).agg(F.max("position").alias("last_unit"))
    log_queues = (
        records.select("group", "topic", "queue_id")
        .distinct()
        .join(rep.select("group", "replica"), ["group"])
    )
    queues = log_queues.select(*_CQ_KEY).union(last_unit.select(*_CQ_KEY)).distinct()
    return (
        queues.join(F.broadcast(ends), ["group", "replica"])
        .join(F.broadcast(deletes), ["group", "replica", "topic"], "left")
        .join(last_unit, _CQ_KEY, "left")
        .withColumn("lo", F.greatest("log_first", F.coalesce(F.col("deleted_at") + 1, F.lit(0))))
        .withColumn(
            "hi",
            F.least(
                F.col("log_end") - 1,
                F.greatest(F.coalesce("last_unit", F.lit(-1)), F.col("snapshot_end") - 1),
            ),
        )
        .select(*_CQ_KEY, "lo", "hi")
    )


def _inside(df: DataFrame, bounds: DataFrame) -> DataFrame:
    return df.join(F.broadcast(bounds), _CQ_KEY).where(F.col("position").between(F.col("lo"), F.col("hi")))


def cq_suspects(
    entries: DataFrame, records: DataFrame, cq_units: DataFrame, replicas: DataFrame, bounds: DataFrame
) -> DataFrame:
    """Queues whose in-range units and committed records differ, found without joining the two:
    per queue, (count, exact sum of xxhash64(position, size)) of each side must be equal and no unit
    may be misordered. Equal sums of 64-bit hashes of unequal sets: ~2^-64. Small."""
    log = replica_messages(
        entries, records.select("group", "index", "body_hash", "rel", "size", "topic", "queue_id"), replicas
    )
    h = lambda size: F.xxhash64("position", size).cast("decimal(38,0)")  # noqa: E731
    log_fp = (
        _inside(log, bounds)
        .groupBy(*_CQ_KEY)
        .agg(F.count("*").alias("records"), F.sum(h("size")).alias("log_hash"))
    )
    unit_fp = (
        _inside(cq_units, bounds)
        .groupBy(*_CQ_KEY)
        .agg(
            F.count("*").alias("units"),
            F.sum(h("size")).alias("unit_hash"),
            F.sum((F.col("prev_position") >= F.col("position")).cast("int")).alias("misordered"),
        )
    )
    fp = log_fp.join(unit_fp, _CQ_KEY, "full")
    return fp.where(
        ~F.coalesce(F.col("records"), F.lit(0)).eqNullSafe(F.coalesce(F.col("units"), F.lit(0)))
        | ~F.col("log_hash").eqNullSafe(F.col("unit_hash"))
        | (F.coalesce(F.col("misordered"), F.lit(0)) > 0)
    ).select(*_CQ_KEY)


def cq_mismatch(
    entries: DataFrame,
    records: DataFrame,
    cq_units: DataFrame,
    replicas: DataFrame,
    bounds: DataFrame,
    suspects: DataFrame,
) -> DataFrame:
    """The consume queue against the committed log (``rules.cq_mismatch``) for the ``suspects``
    queues (small: broadcast, so only their rows are read past the scans). Rows: queues with a
    problem: missing, extra, wrong_size, misordered, first_missing_position, first_bad_offset."""
    s = F.broadcast(suspects)
    sus_records = records.join(
        F.broadcast(suspects.select("group", "topic", "queue_id").distinct()),
        ["group", "topic", "queue_id"],
        "left_semi",
    )
    log = replica_messages(entries, sus_records, replicas).join(s, _CQ_KEY, "left_semi")
    log = _inside(log, bounds).select(*_CQ_KEY, "position", F.col("size").alias("log_size"))
    units = _inside(cq_units.join(s, _CQ_KEY, "left_semi"), bounds).select(
        *_CQ_KEY, "offset", "position", "size", "prev_position"
    )
    both = log.join(units, [*_CQ_KEY, "position"], "full")
    missing = F.col("offset").isNull()
    extra = F.col("log_size").isNull()
    wrong = ~missing & ~extra & (F.col("log_size") != F.col("size"))
    misordered = ~missing & (F.col("prev_position") >= F.col("position"))
    bad_unit = ~missing & (extra | wrong | misordered)
    return (
        both.groupBy(*_CQ_KEY)
        .agg(
            F.sum(missing.cast("int")).alias("missing"),
            F.sum(extra.cast("int")).alias("extra"),
            F.sum(wrong.cast("int")).alias("wrong_size"),
            F.sum(misordered.cast("int")).alias("misordered"),
            F.min(F.when(missing, F.col("position"))).alias("first_missing_position"),
            F.min(F.when(bad_unit, F.col("offset"))).alias("first_bad_offset"),
        )
        .where((F.col("missing") + F.col("extra") + F.col("wrong_size") + F.col("misordered")) > 0)
        .join(F.broadcast(bounds), _CQ_KEY)
    )


# -- availability and latency ------------------------------------------------------------------------
def unavailability_gaps(sends: DataFrame, first_invoke_us: int, threshold_us: int) -> DataFrame:
    """Gaps (gap_start, gap_end, open) between consecutive ok completions at least ``threshold_us``
    long, including the one before the first ok and the open one after the last."""
    ok = sends.where(F.col("outcome") == "ok").select("complete_us")
    w = Window.orderBy("complete_us")
    gaps = ok.select(
        F.coalesce(F.lag("complete_us").over(w), F.lit(first_invoke_us)).alias("gap_start"),
        F.col("complete_us").alias("gap_end"),
        F.lit(False).alias("open"),
    )
    last_ok = ok.agg(F.max("complete_us").alias("last_ok"))
    tail = (
        sends.crossJoin(last_ok)
        .where(F.col("last_ok").isNull() | (F.col("complete_us") > F.col("last_ok")))
        .groupBy("last_ok")
        .agg(F.max("complete_us").alias("gap_end"))
        .select(
            F.coalesce("last_ok", F.lit(first_invoke_us)).alias("gap_start"),
            "gap_end",
            F.lit(True).alias("open"),
        )
    )
    return gaps.unionByName(tail).where(F.col("gap_end") - F.col("gap_start") >= threshold_us)


def unavailability_starts(sends: DataFrame, gaps: DataFrame) -> DataFrame:
    """Each gap with ``start_us``: the earliest invocation of an attempt overlapping it, not before
    the gap starts (``gaps`` is small: broadcast)."""
    g = F.broadcast(gaps)
    overlap = (F.col("invoke_us") < F.col("gap_end")) & (F.col("complete_us") > F.col("gap_start"))
    return (
        sends.select("invoke_us", "complete_us")
        .join(g, overlap)
        .groupBy("gap_start", "gap_end", "open")
        .agg(F.min("invoke_us").alias("first_invoke"))
        .withColumn("start_us", F.greatest("gap_start", "first_invoke"))
        .select("start_us", F.col("gap_end").alias("end_us"), "open")
    )


def recovery(sends: DataFrame, applies: DataFrame) -> DataFrame:
    """Per fault apply (``id``, ``apply_us``): first ok completion at/after it and first ok
    completion of an attempt invoked at/after it (``rules.recovery_times``)."""
    ok = sends.where(F.col("outcome") == "ok").select("invoke_us", "complete_us")
    a = F.broadcast(applies)
    return (
        ok.join(a, F.col("complete_us") >= F.col("apply_us"))
        .groupBy("id")
        .agg(
            F.min("complete_us").alias("first_ok_us"),
            F.min(F.when(F.col("invoke_us") >= F.col("apply_us"), F.col("complete_us"))).alias(
                "recovered_us"
            ),
        )
    )


def latency_first_deliveries(receipts: DataFrame) -> DataFrame:
    """The first receipt of every unique id, with ``e2e_us`` (receipt − born) and ``s2r_us``
    (receipt − store)."""
    first = receipts.groupBy("unique_id").agg(F.min(F.struct("time_us", "born_us", "store_us")).alias("r"))
    return first.select(
        "unique_id",
        F.col("r.time_us").alias("time_us"),
        (F.col("r.time_us") - F.col("r.born_us")).alias("e2e_us"),
        (F.col("r.time_us") - F.col("r.store_us")).alias("s2r_us"),
    )


def percentiles(col: str | Column, qs: Sequence[float]) -> Column:
    return F.percentile_approx(col, list(qs), 10000)
