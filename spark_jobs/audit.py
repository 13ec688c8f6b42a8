"""``python -m spark_jobs.audit RUN_DIR [--master local[*]] [--json]``: audit a chaos run.

Reads the run's histories and, independently of the brokers, every replica's files
(``RUN_DIR/cluster/data/<group>/dledger-<id>/``, read-only), checks them (definitions in
``rules`` and docs/CHAOS.md, "Audit") and writes ``RUN_DIR/audit/summary.json``,
``RUN_DIR/audit/report.html`` and ``RUN_DIR/audit/details/<check>.json``.

Exit codes: 0 every failing check is clean; 1 a failing check found something (by default: lost,
divergence, unexpected, cq_mismatch, key_order, replica_damage; ``--fail-on`` changes the list);
2 usage error (missing or invalid RUN_DIR, bad option); 3 the audit itself broke (Spark failed).

Pipeline: histories -> Parquet (pyarrow) and replicas -> Parquet (``replica_tables``, one process per
group) while the JVM starts, then one SparkSession runs every check over the Parquet tables (most
of them in one Spark job: ``Audit._collect``); the work directory
``audit/work`` is removed afterwards unless ``--keep-work``. Also runs under spark-submit
(``spark-submit spark_jobs/audit.py RUN_DIR``; RUN_DIR must then be on storage every executor sees).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

if __package__ in (None, ""):  # spark-submit spark_jobs/audit.py: make the package importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from broker.client.transport import add_security_arguments, security_kwargs
from broker.protocol.auth import CredentialsError
from spark_jobs import evidence, report
from spark_jobs.history import HistoryStats, ingest_history, ingest_samples
from spark_jobs.replica_tables import ReplicaSummary, scan_replicas
from spark_jobs.rules import FaultWindow, Window, fault_recovery, pair_faults
from spark_jobs.run_dir import RunDir, UsageError

# Failing checks first (the default --fail-on), then notes and inputs the audit had to skip.
DEFAULT_FAIL_ON = (
    "lost",
    "unseen",
    "divergence",
    "unexpected",
    "cq_mismatch",
    "key_order",
    "replica_damage",
    "inconsistent_offsets",
    "ack_offset_mismatch",
    "send_order",
    "poll_order",
    "aborted_read",
    "corrupt_read",
    "offset_regression",
    "committed_prefix",
    "commit_crc_mismatch",
    "nonconflicting_truncation",
    "drain_incomplete",
    # Producers are idempotent by default (broker/store/dedup.py): a retried send lands once.
    "duplicate_log_entries",
    # Delayed messages and the retry group (issue 14; empty for runs without them).
    "delayed_lost",
    "delivered_early",
    "delayed_twice",
    "retry_lost",
    "dlq_mismatch",
    # Transactions (issue 15; empty for runs without them): committed ones are judged by lost/unseen.
    "txn_rolled_back_delivered",
)
CHECKS = (
    *DEFAULT_FAIL_ON,
    "duplicate_deliveries",
    "unavailability",
    "elections_without_fault",
    "cq_damaged",
    "bad_history_lines",
    "retained_away",
    "dlq_duplicates",
)
DEFAULT_MAX_RECONSUME_TIMES = 16  # the broker's, when run.json does not name the retry group's
DAMAGE_FAULTS = ("bitflip-", "truncate-")
LATENESS_QUANTILES = (0.5, 0.9, 0.99)
ELECTION_GRACE_US = 10_000_000  # after a heal, elections still belong to the fault (restarts, rejoins)
DETAIL_ROWS_MAX = 100_000
SAMPLE_ROWS = 20


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m spark_jobs.audit", description="Audit a chaos run directory."
    )
    ap.add_argument("run_dir", help="the run directory (docs/CHAOS.md)")
    ap.add_argument("--master", default=None, help="Spark master (default: local[*], or spark-submit's)")
    ap.add_argument(
        "--json", action="store_true", help="print summary.json to stdout instead of a text summary"
    )
    ap.add_argument("--out", default=None, help="output directory (default: RUN_DIR/audit)")
    ap.add_argument(
        "--fail-on",
        default=",".join(DEFAULT_FAIL_ON),
        help=f"checks whose findings fail the run (default: %(default)s; known: {', '.join(CHECKS)})",
    )
    ap.add_argument(
        "--unavailable-ms",
        type=int,
        default=1000,
        help="shortest gap without an ok send that counts as unavailability (default: %(default)s)",
    )
    ap.add_argument("--partitions", type=int, default=None, help="spark.sql.shuffle.partitions")
    ap.add_argument(
        "--driver-memory", default="2g", help="spark.driver.memory in local mode (default: %(default)s)"
    )
    ap.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting (repeatable)"
    )
    ap.add_argument("--workers", type=int, default=None, help="processes reading replicas (default: by size)")
    ap.add_argument("--keep-work", action="store_true", help="keep the Parquet work directory (audit/work)")
    ap.add_argument("--no-plots", action="store_true", help="leave the plots out of report.html")
    ap.add_argument(
        "--from-cluster", metavar="NAMESRV", default=None,
        help="read the replicas' files through the brokers of the cluster these NameServers know "
             "(read-only export routes, admin account) instead of RUN_DIR/cluster/data",
    )  # fmt: skip
    add_security_arguments(ap)
    return ap.parse_args(argv)


def verdict(counts: dict[str, int], fail_on: Sequence[str]) -> list[str]:
    """The checks that fail the run: those in ``fail_on`` with findings."""
    return [k for k, n in counts.items() if k in fail_on and n > 0]


def _fail_on(spec: str) -> list[str]:
    kinds = [k.strip() for k in spec.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in CHECKS]
    if unknown:
        raise UsageError(f"--fail-on: unknown check(s) {', '.join(unknown)} (known: {', '.join(CHECKS)})")
    return kinds


class Timer:
    def __init__(self) -> None:
        self.steps: dict[str, float] = {}
        self._t0 = time.perf_counter()

    def step(self, name: str) -> Callable[[], None]:
        start = time.perf_counter()

        def done() -> None:
            self.steps[name] = round(time.perf_counter() - start, 3)

        return done

    @property
    def total_s(self) -> float:
        return round(time.perf_counter() - self._t0, 3)


def commit_table(summaries: list[ReplicaSummary], run: RunDir, warnings: list[str]) -> list[dict[str, Any]]:
    """Per replica: ``recorded`` (max of its meta/raft_commit hint and run.json's final status),
    ``commit`` (recorded, capped at what it holds), ``group_commit`` (max recorded in the group)."""
    by_group: dict[str, list[ReplicaSummary]] = defaultdict(list)
    for s in summaries:
        by_group[s.group].append(s)
    rows = []
    for group, reps in sorted(by_group.items()):
        recorded: dict[str, int | None] = {}
        for s in reps:
            st = run.statuses.get((group, s.replica))
            vals = [v for v in (s.commit_hint, st.commit_index if st else None) if v is not None]
            recorded[s.replica] = max(vals) if vals else None
        if all(v is None for v in recorded.values()):
            lasts = sorted((s.last_index for s in reps), reverse=True)
            majority_held = lasts[len(lasts) // 2]
            warnings.append(
                f"{group}: no replica recorded a commit index; assuming {majority_held}, the highest index a "
                "majority of replicas holds"
            )
            recorded = dict.fromkeys(recorded, majority_held)
        group_commit = max(v for v in recorded.values() if v is not None)
        for s in reps:
            rows.append(
                {
                    "group": group,
                    "replica": s.replica,
                    "recorded_commit": recorded[s.replica],
                    "commit": min(recorded[s.replica] or 0, s.last_index),
                    "group_commit": group_commit,
                    "snapshot_end": s.snapshot_end_position or 0,
                }
            )
    return rows


def retention_floors(summaries: list[ReplicaSummary]) -> list[tuple[str, int]]:
    """(group, lowest first position) for groups where every replica lost a prefix to retention."""
    by_group: dict[str, list[ReplicaSummary]] = defaultdict(list)
    for s in summaries:
        by_group[s.group].append(s)
    out = []
    for group, reps in by_group.items():
        if all(s.anchor_index > 0 for s in reps):
            out.append((group, min(s.first_position or s.end_position for s in reps)))
    return out


class Audit:
    """One audit of one run directory (``run`` does the work; ``summary`` is the result)."""

    def __init__(self, run: RunDir, out_dir: str, args: argparse.Namespace, fail_on: list[str]):
        self.run = run
        self.out_dir = out_dir
        self.work_dir = os.path.join(out_dir, "work")
        self.args = args
        self.fail_on = fail_on
        self.timer = Timer()
        self.warnings = list(run.warnings)
        self.findings: dict[str, dict[str, Any]] = {}
        self.details: dict[str, list[dict[str, Any]]] = {}
        self.extra: dict[str, Any] = {}

    # -- inputs ------------------------------------------------------------------------------------
    def prepare(self) -> tuple[HistoryStats, list[ReplicaSummary]]:
        shutil.rmtree(self.work_dir, ignore_errors=True)
        os.makedirs(self.work_dir)
        done = self.timer.step("ingest_history")
        stats = ingest_history(
            self.run.send_files, self.run.receipt_files, self.run.drain_file, self.work_dir,
            self.run.retry_files, self.run.dlq_file,
        )
        self.extra["samples"] = ingest_samples(
            self.run.samples_file, self.run.offset_files, self.work_dir, self.run.sampler[1], stats
        )
        done()
        done = self.timer.step("read_replicas")
        summaries = scan_replicas(self.run.replicas, self.work_dir, self.args.workers)
        done()
        return stats, summaries

    def run_checks(self, spark: Any, stats: HistoryStats, summaries: list[ReplicaSummary]) -> None:
        from pyspark.sql import functions as F

        from spark_jobs import checks as C
        from spark_jobs import checks_delay as D
        from spark_jobs import checks_history as H
        from spark_jobs import checks_samples as S
        from spark_jobs import checks_txn as T
        from spark_jobs.frames import Frames, distinct_values

        commits = commit_table(summaries, self.run, self.warnings)
        groups = {s.group for s in summaries}
        for broker in distinct_values(self.work_dir, "sends", "broker"):
            if broker not in groups:
                self.warnings.append(
                    f"sends were acknowledged by {broker}, which has no replica data under cluster/data: "
                    "they count as lost from the log"
                )
        done = self.timer.step("load")
        fr = Frames.load(spark, self.work_dir, commits, retention_floors(summaries), self.run.topics)
        fault_windows = pair_faults((f.time_us, f.fault, f.action, f.targets) for f in self.run.faults)
        damage = spark.createDataFrame(damage_windows(fault_windows), "replica string, apply_us long, heal_us long")
        finals = spark.createDataFrame(
            [(x.group, x.name, x.first_index, x.last_index) for x in summaries],
            "group string, replica string, first_index long, last_index long",
        )
        windows = spark.createDataFrame(
            [(w.apply_us, w.heal_us) for w in fault_windows], "apply_us long, heal_us long"
        )
        resets = self._resets(fr)
        samples, sample_offsets = fr.samples, fr.sample_offsets
        done()
        check_consumed = bool(self.run.receipt_files or self.run.drain_file)
        done = self.timer.step("checks")
        per_replica, per_group = C.divergence(fr.entries, fr.replicas)
        bounds = C.cq_bounds(fr.entries, fr.records, fr.commands, fr.cq_units, fr.replicas)
        # Two checks read every replica's units with their records' unique ids: computed once (two
        # joins over every unit and every replica's records) and kept until they have run.
        units = H.unit_ids(fr.cq_units, fr.entries, fr.records, fr.replicas, fr.topics).persist()
        receipts, drain = fr.workload(fr.receipts), fr.workload(fr.drain)
        delivered = fr.workload(fr.delivered)
        # A delayed send's acknowledged queue offset is the schedule queue's (API.md): the offset checks
        # judge undelayed sends only; delayed ones have checks of their own.
        # Likewise a transactional send's: its half's (or its committed message's, when known).
        plain = fr.sends.where(F.col("due_us").isNull() & F.col("txn").isNull())
        # A rolled-back transaction's half was acknowledged, yet it must never be delivered: not "lost".
        to_deliver = fr.sends.where(F.col("txn").isNull() | ~F.col("txn").isin(*T.ROLLED_BACK))
        dd = D.delay_deliveries(fr.sends, receipts, drain)
        max_times = self.run.max_reconsume_times
        max_times = DEFAULT_MAX_RECONSUME_TIMES if max_times is None else max_times
        outcomes = D.retry_outcomes(fr.retries, fr.dlq, max_times)
        got = self._collect(
            {
                "lost": C.lost(to_deliver, fr.committed, fr.delivered, fr.floors, check_consumed, fr.records),
                "duplicate_deliveries": C.duplicate_deliveries(receipts),
                "duplicate_log_entries": C.duplicate_log_entries(fr.workload(fr.committed)),
                "unexpected": C.unexpected(delivered, fr.sends),
                "aborted_read": C.aborted_read(fr.sends, fr.committed, fr.delivered),
                "key_order": C.key_order(fr.committed, fr.sends),
                "divergence": per_replica,
                "compared": per_group,
                "cq_bounds": bounds,
                "cq_suspects": C.cq_suspects(fr.entries, fr.records, fr.cq_units, fr.replicas, bounds),
                "inconsistent_offsets": H.inconsistent_offsets(plain, receipts, drain, units),
                "ack_offset_mismatch": H.ack_offset_mismatch(plain, units),
                "delayed_lost": D.delayed_lost(dd),
                "delivered_early": D.delivered_early(dd),
                "delayed_twice": D.delayed_twice(dd),
                "retry_lost": D.retry_lost(outcomes, fr.sends, fr.retries, fr.dlq),
                "dlq_mismatch": D.dlq_mismatch(outcomes, max_times),
                "dlq_duplicates": D.dlq_duplicates(outcomes),
                "txn_rolled_back_delivered": T.rolled_back_delivered(fr.sends, delivered, fr.workload(fr.committed)),
                "send_order": H.send_order(plain),
                "poll_order": H.poll_order(receipts),
                "corrupt_read": H.corrupt_read(fr.sends, delivered),
                "committed_prefix": S.committed_prefix(samples, damage, named_entries(fr.entries), finals),
                "commit_crc_mismatch": S.commit_crc_mismatch(samples),
                "nonconflicting_truncation": S.nonconflicting_truncation(samples),
                "offset_regression": S.offset_regression(samples, sample_offsets, resets),
                "elections_without_fault": S.elections_without_fault(samples, windows, ELECTION_GRACE_US),
            }
        )
        units.unpersist()
        lost_rows, _ = got.pop("lost")
        self._record("lost", [r for r in lost_rows if r["lost"]])
        self._record("unseen", [r for r in lost_rows if r["unseen"]])
        self._record("retained_away", [r for r in lost_rows if not r["lost"] and not r["unseen"]])
        self.extra["compared"] = got.pop("compared")[0]
        self._cq_mismatch(spark, fr, bounds, got.pop("cq_bounds")[0], got.pop("cq_suspects")[0])
        corrupt_rows, _ = got.pop("corrupt_read")
        self._record("corrupt_read", corrupt_rows + corrupt_probes(self.run.faults))
        for name, (rows, count) in got.items():
            self._record(name, rows, count)
        self._record("drain_incomplete", [{"error": e} for e in self.run.drain_errors])
        done()
        done = self.timer.step("delays_and_retries")
        self.extra["delays"] = self._delays(spark, dd, fr)
        self.extra["retries"] = self._retries(fr, outcomes, max_times)
        self.extra["transactions"] = [r.asDict() for r in T.txn_counts(fr.sends, delivered).collect()]
        done()
        done = self.timer.step("availability")
        self._availability(spark, fr)
        done()
        done = self.timer.step("latency")
        self.extra["latency"], self.extra["series"] = report.latency_and_series(fr, self.extra["span"])
        self.extra["commit_series"] = report.commit_series(self.work_dir)
        done()
        self._replica_findings(summaries)
        self._record("bad_history_lines", [{"file": f, **v} for f, v in stats.bad_lines.items()])
        self.extra["commits"] = commits

    def _delays(self, spark: Any, dd: Any, fr: Any) -> dict[str, Any]:
        """Delayed sends and their lateness (due -> first copy stored in the real topic), in all and
        for due times outside every fault window (ms)."""
        from pyspark.sql import functions as F

        from spark_jobs import checks as C
        from spark_jobs import checks_delay as D
        from spark_jobs.report import lateness_quantiles

        windows = spark.createDataFrame(
            [(w.apply_us, w.heal_us) for w in pair_faults((f.time_us, f.fault, f.action, f.targets)
                                                          for f in self.run.faults)],
            "apply_us long, heal_us long",
        )
        out: dict[str, Any] = {}
        for name, df in (("all", dd.where(F.col("delivered_us").isNotNull())),
                         ("outside_faults", D.lateness_outside(dd, windows, ELECTION_GRACE_US))):
            r = df.agg(F.count("*").alias("n"), C.percentiles("lateness_us", LATENESS_QUANTILES).alias("q"),
                       F.max("lateness_us").alias("mx")).first()
            out[f"lateness_{name}_ms"] = lateness_quantiles(r["n"], r["q"], r["mx"]) if r else {"count": 0}
        counts = dd.agg(
            F.count("*").alias("acknowledged"),
            F.sum(F.col("delay_level").isNotNull().cast("int")).alias("by_level"),
            F.sum(F.col("deliver_ms").isNotNull().cast("int")).alias("by_deliver_time"),
            F.sum((F.col("copies") > 0).cast("int")).alias("delivered"),
        ).first()
        out.update({k: int(v or 0) for k, v in (counts.asDict() if counts else {}).items()})
        out["definition"] = (
            "acknowledged delayed sends; lateness: store time of the first copy in the real topic − due time "
            f"(send store time + level delay, or deliver time); outside_faults: due times not in a fault window "
            f"(+{ELECTION_GRACE_US // 1_000_000} s)"
        )
        return out

    def _retries(self, fr: Any, outcomes: Any, max_times: int) -> dict[str, Any]:
        from pyspark.sql import functions as F

        r = fr.retries.agg(
            F.count("*").alias("deliveries"),
            F.sum((F.col("answer") == "later").cast("int")).alias("failed_deliveries"),
            F.sum(F.coalesce(F.col("retry").cast("int"), F.lit(0))).alias("via_retry_topic"),
        ).first()
        o = outcomes.agg(
            F.sum((F.col("failed") > 0).cast("int")).alias("failed_ids"),
            F.sum((F.col("consumed") & (F.col("failed") > 0)).cast("int")).alias("consumed_after_retry"),
            F.sum(F.col("final_fail").cast("int")).alias("expected_in_dlq"),
            F.sum((F.col("dlq_copies") > 0).cast("int")).alias("in_dlq"),
        ).first()
        out = {k: int(v or 0) for k, v in {**(r.asDict() if r else {}), **(o.asDict() if o else {})}.items()}
        out["dlq_messages"] = fr.dlq.count()
        out["max_reconsume_times"] = max_times
        return out

    def _resets(self, fr: Any) -> dict[tuple[str, str], list[int]]:
        """Indexes of committed ``offset.reset`` commands of the sampled consumer group, per (broker
        group, topic): offsets may move backwards there."""
        from pyspark.sql import functions as F

        cgroup, _topic = self.run.sampler
        rows = (
            fr.commands.where((F.col("op") == "offset.reset") & (F.col("cgroup") == cgroup))
            .join(fr.replicas.select("group", "group_commit").distinct(), ["group"])
            .where(F.col("index") <= F.col("group_commit"))
            .select("group", "topic", "index")
            .distinct()
            .collect()
        )
        out: dict[tuple[str, str], list[int]] = defaultdict(list)
        for r in rows:
            out[(r["group"], r["topic"])].append(int(r["index"]))
        return {k: sorted(v) for k, v in out.items()}

    def _cq_mismatch(
        self,
        spark: Any,
        fr: Any,
        bounds: Any,
        bound_rows: list[dict[str, Any]],
        suspects: list[dict[str, Any]],
    ) -> None:
        """Second phase of the consume-queue check: detail for the suspect queues only."""
        from spark_jobs import checks as C

        if not suspects:
            self._record("cq_mismatch", [])
            return
        small_bounds = spark.createDataFrame([tuple(r.values()) for r in bound_rows], bounds.schema)
        key = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in bounds.schema.fields[:4])
        small_suspects = spark.createDataFrame([tuple(r.values()) for r in suspects], key)
        mismatch = C.cq_mismatch(
            fr.entries, fr.records, fr.cq_units, fr.replicas, small_bounds, small_suspects
        )
        rows, count = self._collect({"cq_mismatch": mismatch})["cq_mismatch"]
        self._record("cq_mismatch", rows, count)

    def _availability(self, spark: Any, fr: Any) -> None:
        from pyspark.sql import functions as F

        from spark_jobs import checks as C

        span = fr.sends.agg(
            F.min("invoke_us").alias("first_invoke_us"),
            F.max("complete_us").alias("last_complete_us"),
            F.count("*").alias("sends"),
            *[F.sum((F.col("outcome") == o).cast("int")).alias(o) for o in ("ok", "fail", "unknown")],
        ).first()
        self.extra["span"] = span.asDict() if span is not None else {}
        self.extra["workload"], rate_warnings = report.workload_figures(self.extra["span"], self.run.run)
        self.warnings += rate_warnings
        first = self.extra["span"].get("first_invoke_us")
        windows: list[dict[str, Any]] = []
        if first is not None:
            gaps = C.unavailability_gaps(fr.sends, first, self.args.unavailable_ms * 1000)
            gap_rows = gaps.collect()
            if gap_rows:
                small = spark.createDataFrame(gap_rows, gaps.schema)
                for r in sorted(
                    C.unavailability_starts(fr.sends, small).collect(), key=lambda r: r["start_us"]
                ):
                    if r["end_us"] - r["start_us"] >= self.args.unavailable_ms * 1000:
                        windows.append({**r.asDict(), "duration_ms": (r["end_us"] - r["start_us"]) / 1000})
        self._record("unavailability", windows)
        fault_windows = pair_faults((f.time_us, f.fault, f.action, f.targets) for f in self.run.faults)
        faults: list[dict[str, Any]] = [
            {
                "id": k,
                "fault": w.fault,
                "targets": list(w.targets),
                "apply_us": w.apply_us,
                "heal_us": w.heal_us,
            }
            for k, w in enumerate(fault_windows)
        ]
        if faults:
            applies = spark.createDataFrame(
                [(f["id"], f["apply_us"]) for f in faults], "id long, apply_us long"
            )
            got = {r["id"]: r for r in C.recovery(fr.sends, applies).collect()}
            for f, fw in zip(faults, fault_windows, strict=True):
                rec = got.get(f["id"])
                f.update(
                    fault_recovery(
                        fw.apply_us,
                        fw.heal_us,
                        rec["first_ok_us"] if rec else None,
                        rec["recovered_us"] if rec else None,
                        [Window(w["start_us"], w["end_us"], w["open"]) for w in windows],
                    )
                )
        self.extra["faults"] = faults

    def _replica_findings(self, summaries: list[ReplicaSummary]) -> None:
        damaged = {r for w in pair_faults((f.time_us, f.fault, f.action, f.targets) for f in self.run.faults)
                   if w.fault.startswith(DAMAGE_FAULTS) for r in w.targets}
        self._record(
            "replica_damage",
            [
                {"group": s.group, "replica": s.replica, **(s.damage or {}), "damaged_by_a_fault": s.name in damaged}
                for s in summaries
                if s.damage
            ],
        )
        self._record(
            "cq_damaged",
            [{"group": s.group, "replica": s.replica, **d} for s in summaries for d in s.cq_damaged],
        )
        self.extra["replicas"] = [s.to_dict() for s in summaries]

    # -- findings ------------------------------------------------------------------------------------
    def _collect(self, frames: dict[str, Any]) -> dict[str, tuple[list[dict[str, Any]], int]]:
        """Collect several DataFrames, one Spark job each, in order: at most DETAIL_ROWS_MAX rows
        each, and each one's exact row count.

        One job per check rather than one job for all (a union of every check): a persisted input
        shared by several checks (``unit_ids``) is computed once, by the first job that reads it, and
        each job's plan stays small (issue 28; docs/PERFORMANCE.md)."""
        from pyspark.sql import functions as F

        out = {}
        for name, df in frames.items():
            rows = [
                json.loads(r["row"])
                for r in df.limit(DETAIL_ROWS_MAX + 1)
                .select(F.to_json(F.struct(*df.columns), {"ignoreNullFields": "false"}).alias("row"))
                .collect()
            ]
            out[name] = (rows[:DETAIL_ROWS_MAX], df.count() if len(rows) > DETAIL_ROWS_MAX else len(rows))
        return out

    def _record(self, name: str, rows: list[dict[str, Any]], count: int | None = None) -> None:
        rows = sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))
        self.details[name] = rows
        self.findings[name] = {
            "count": len(rows) if count is None else count,
            "fails": name in self.fail_on,
            "sample": rows[:SAMPLE_ROWS],
        }

    def summary(self, stats: HistoryStats) -> dict[str, Any]:
        self.findings = {k: self.findings[k] for k in CHECKS if k in self.findings}  # failing ones first
        failed = verdict({k: v["count"] for k, v in self.findings.items()}, self.fail_on)
        return {
            "version": 1,
            "run_dir": self.run.path,
            "audited_at_us": int(time.time() * 1e6),
            "verdict": "FAIL" if failed else "PASS",
            "failed_checks": failed,
            "fail_on": self.fail_on,
            "counts": {k: v["count"] for k, v in self.findings.items()},
            "findings": self.findings,
            "inputs": {
                "history_rows": stats.rows,
                "history_files": stats.files,
                "sends": self.extra.get("span", {}),
                "replicas": self.extra.get("replicas", []),
                "commits": self.extra.get("commits", []),
                "compared": self.extra.get("compared", []),
                "topics": self.run.topics,
            },
            "faults": self.extra.get("faults", []),
            "workload": self.extra.get("workload", {}),
            "latency": self.extra.get("latency", {}),
            "delays": self.extra.get("delays", {}),
            "retries": self.extra.get("retries", {}),
            "transactions": self.extra.get("transactions", []),
            "warnings": self.warnings,
            "timings_s": {**self.timer.steps, "total": self.timer.total_s},
        }


def damage_windows(windows: list[FaultWindow]) -> list[tuple[str, int, int | None]]:
    """(replica, apply_us, heal_us) of every bitflip/truncate fault window, per replica it hit."""
    return [(r, w.apply_us, w.heal_us) for w in windows if w.fault.startswith(DAMAGE_FAULTS) for r in w.targets]


def corrupt_probes(faults: Sequence[Any]) -> list[dict[str, Any]]:
    """Damage faults whose read-back found the replica serving the damaged message (faults.jsonl)."""
    out = []
    for k, f in enumerate(faults):
        if not f.fault.startswith("bitflip-"):
            continue
        per = f.detail.get("damage") if f.action == "apply" else f.detail.get("replicas")
        for replica, d in (per or {}).items():
            if isinstance(d, dict) and d.get("probe") == "corrupt":
                out.append({"source": f"probe after {f.action} of {f.fault}", "replica": replica,
                            "unique_id": d.get("unique_id"), "time_us": f.time_us, "fault_line": k})
    return out


def named_entries(entries: Any) -> Any:
    """The replica tables name replicas by node id (``n1``); samples and faults by process name
    (``RaftNode00-n1``)."""
    from pyspark.sql import functions as F

    return entries.withColumn("replica", F.concat(F.col("group"), F.lit("-"), F.col("replica")))


def run_audit(run: RunDir, out_dir: str, args: argparse.Namespace, fail_on: list[str]) -> dict[str, Any]:
    """Audit ``run`` and write the outputs under ``out_dir``; returns the summary."""
    from spark_jobs.session import get_session

    audit = Audit(run, out_dir, args, fail_on)
    # The JVM starts while the histories and replicas are read (it is mostly waiting on itself).
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spark-start") as starter:
        started = time.perf_counter()
        session = starter.submit(
            get_session,
            args.master,
            shuffle_partitions=args.partitions,
            driver_memory=args.driver_memory,
            conf=dict(c.split("=", 1) for c in args.conf),
        )
        session.add_done_callback(
            lambda _: audit.timer.steps.__setitem__("spark_start", round(time.perf_counter() - started, 3))
        )
        stats, summaries = audit.prepare()
        spark = session.result()
    try:
        audit.run_checks(spark, stats, summaries)
    finally:
        if not args.keep_work:
            shutil.rmtree(audit.work_dir, ignore_errors=True)
    done = audit.timer.step("report")
    summary = audit.summary(stats)
    proof = evidence.for_findings(run.path, summary["findings"])
    summary["proof"] = proof
    report.write(
        out_dir,
        summary,
        audit.details,
        audit.extra.get("series", {}),
        plots=not args.no_plots,
        commits=audit.extra.get("commit_series"),
        proof=proof,
    )
    done()
    summary["timings_s"] = {**audit.timer.steps, "total": audit.timer.total_s}
    report.write_summary(out_dir, summary)
    return summary


class Fetched:
    """The replica copies ``--from-cluster`` made, and what they add to the run's inputs."""

    def __init__(self, data_dir: str, replicas: list[Any], errors: list[str], namesrv: str):
        self.data_dir, self.replicas, self.errors, self.namesrv = data_dir, replicas, errors, namesrv

    def apply(self, run: RunDir) -> None:
        from spark_jobs.run_dir import ReplicaStatus

        got = {(r.group, r.node_id) for r in self.replicas}
        run.warnings.extend(f"--from-cluster: could not copy {e}" for e in self.errors)
        missing = sorted(k for k in run.statuses if k not in got)
        if missing:
            run.warnings.append(
                "--from-cluster: replicas run.json lists were not copied (not registered with the NameServers, "
                f"or unreachable): {', '.join(f'{g}-{n}' for g, n in missing)}; their logs are not compared"
            )
        for r in self.replicas:  # the commit index each one reported when it listed its files
            old = run.statuses.get((r.group, r.node_id))
            commits = [c for c in (r.commit_index, old.commit_index if old else None) if c is not None]
            run.statuses[(r.group, r.node_id)] = ReplicaStatus(
                r.group, r.node_id, old.role if old else r.role, old.term if old else r.term,
                max(commits) if commits else None, old.applied_index if old else None,
            )  # fmt: skip
        run.run["fetched_from"] = {
            "namesrv": self.namesrv,
            "replicas": [{"group": r.group, "node_id": r.node_id, "addr": r.addr, "files": r.files,
                          "bytes": r.bytes, "commit_index": r.commit_index} for r in self.replicas],
        }  # fmt: skip


def from_cluster(args: argparse.Namespace, out_dir: str) -> Fetched:
    """Copy every replica's files through the brokers (``spark_jobs.remote``) into OUT/replicas."""
    import asyncio

    from broker.client.transport import parse_addrs
    from spark_jobs.remote import fetch_cluster

    try:
        parse_addrs(args.from_cluster)
        security = security_kwargs(args)
    except (ValueError, CredentialsError) as exc:
        raise UsageError(f"--from-cluster: {exc}") from None
    dest = os.path.join(out_dir, "replicas")
    shutil.rmtree(dest, ignore_errors=True)
    started = time.perf_counter()
    try:
        replicas, errors = asyncio.run(fetch_cluster(args.from_cluster, dest, security=security))
    except Exception as exc:  # the NameServers did not answer, or refused
        raise UsageError(f"--from-cluster {args.from_cluster}: {exc}") from None
    if not replicas:
        raise UsageError(f"--from-cluster {args.from_cluster}: no replica could be copied: {'; '.join(errors)}")
    size = sum(r.bytes for r in replicas)
    print(f"audit: copied {len(replicas)} replicas ({size / 1e6:.1f} MB) through the brokers in "
          f"{time.perf_counter() - started:.1f} s", file=sys.stderr)  # fmt: skip
    return Fetched(dest, replicas, errors, args.from_cluster)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    fetched: Fetched | None = None
    try:
        fail_on = _fail_on(args.fail_on)
        if args.unavailable_ms <= 0:
            raise UsageError("--unavailable-ms must be positive")
        bad_conf = [c for c in args.conf if "=" not in c]
        if bad_conf:
            raise UsageError(f"--conf wants KEY=VALUE, got {bad_conf[0]!r}")
        if args.from_cluster:  # the run's own files first (as RunDir.open checks them), then the copies
            RunDir.check_history(args.run_dir)
        else:
            run = RunDir.open(args.run_dir)
        out_dir = os.path.abspath(args.out or os.path.join(args.run_dir, "audit"))
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create the output directory {out_dir}: {exc}") from None
        if not os.access(out_dir, os.W_OK):
            raise UsageError(f"the output directory {out_dir} is not writable (use --out)")
        if args.from_cluster:
            fetched = from_cluster(args, out_dir)
            run = RunDir.open(args.run_dir, data_dir=fetched.data_dir)
            fetched.apply(run)
    except UsageError as exc:
        print(f"audit: error: {exc}", file=sys.stderr)
        return 2
    try:
        summary = run_audit(run, out_dir, args, fail_on)
    except Exception:
        traceback.print_exc()
        print("audit: internal error (exit 3): the audit itself failed, not the run", file=sys.stderr)
        return 3
    finally:
        if fetched and not args.keep_work:
            shutil.rmtree(fetched.data_dir, ignore_errors=True)
    if args.json:
        print(json.dumps(summary, indent=1, default=str))
    else:
        print(report.text(summary, out_dir))
    return 1 if summary["verdict"] == "FAIL" else 0


if __name__ == "__main__":
    sys.exit(main())
