"""``python -m spark_jobs.stream_audit RUN_DIR``: audit a chaos run continuously, while it goes.

A Structured Streaming query reads the workload's topics with the ``dledger-mq`` data source
(from the earliest offset; every stored message once, in queue order) and, for every micro-batch
(``foreachBatch``), hands the rows and the send lines the producers appended to
``RUN_DIR/history/sends-*.jsonl`` since the batch before to ``stream_checks.StreamChecker``: lost
and mis-acknowledged sends, definite failures that were stored, key order, offset gaps, duplicates.
Each micro-batch gives one line on stdout and one JSON object in ``OUT/batches.jsonl``
(``OUT`` = ``RUN_DIR/stream-audit`` unless ``--out``); at the end ``OUT/summary.json``.

It stops after ``--duration`` seconds, or once ``--idle`` seconds passed without new rows or send
lines (after the run's producers stopped), or on Ctrl-C; then it judges what is left (``finish``)
and exits 1 when a failing check found something, 0 otherwise, 2 on bad usage, 3 when the query
failed. The checker's state lives in the driver: a restarted stream audit reads from the start
again (its checkpoint, under OUT, is made afresh each time).

Definitions: docs/CHAOS.md, "Continuous audit (stream_audit)".
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from spark_jobs.run_dir import UsageError
from spark_jobs.stream_checks import FAILING, BatchReport, Row, StreamChecker

__all__ = ["HistoryTail", "StreamAudit", "main"]

READ_MAX_BYTES = 64 << 20  # per file per batch: a backlog is read over several batches


class HistoryTail:
    """Follows ``history/sends-*.jsonl`` as the producers append to them: each call returns the
    complete lines written since the last one (new files are picked up as they appear)."""

    def __init__(self, history_dir: str):
        self.history_dir = history_dir
        self.offsets: dict[str, int] = {}
        self.bad_lines = 0

    def read(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in sorted(glob.glob(os.path.join(self.history_dir, "sends-*.jsonl"))):
            at = self.offsets.get(path, 0)
            try:
                with open(path, "rb") as f:
                    f.seek(at)
                    chunk = f.read(READ_MAX_BYTES)
            except FileNotFoundError:
                continue
            end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next batch
            for line in chunk[:end].splitlines():
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                except ValueError:
                    self.bad_lines += 1
                    continue
                if isinstance(d, dict):
                    out.append(d)
                else:
                    self.bad_lines += 1
            self.offsets[path] = at + end
        return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from broker.client.transport import add_security_arguments

    ap = argparse.ArgumentParser(prog="python -m spark_jobs.stream_audit",
                                 description="Audit a chaos run continuously while it goes.")  # fmt: skip
    ap.add_argument("run_dir", help="the run directory whose history/sends-*.jsonl the producers write")
    ap.add_argument("--namesrv", default=None, help="NameServers (default: run.json namesrv_addr, else $NAMESRV_ADDR)")
    ap.add_argument("--topic", action="append", default=[],
                    help="topic to follow (repeatable; default: run.json topics)")
    ap.add_argument("--master", default=None, help="Spark master (default: local[*])")
    ap.add_argument("--trigger-s", type=float, default=2.0, help="seconds between micro-batches (default: %(default)s)")
    ap.add_argument("--max-per-batch", type=int, default=0,
                    help="maxRecordsPerTrigger of the data source (0: no limit, the default)")
    ap.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (0: no limit)")
    ap.add_argument("--idle", type=float, default=0.0,
                    help="stop once this many seconds passed without new rows or send lines (0: never)")
    ap.add_argument("--out", default=None, help="output directory (default: RUN_DIR/stream-audit)")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")
    add_security_arguments(ap)
    return ap.parse_args(argv)


def _topics_and_namesrv(args: argparse.Namespace) -> tuple[list[str], str | None]:
    run: dict[str, Any] = {}
    path = os.path.join(args.run_dir, "run.json")
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                loaded = json.load(f)
            run = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            run = {}
    topics = list(args.topic)
    if not topics:
        for t in run.get("topics") or []:
            name = t if isinstance(t, str) else t.get("topic") if isinstance(t, dict) else None
            if isinstance(name, str):
                topics.append(name)
    if not topics:
        raise UsageError("no topic: give --topic (RUN_DIR/run.json names none)")
    ns = args.namesrv or (run.get("namesrv_addr") if isinstance(run.get("namesrv_addr"), str) else None)
    return topics, ns


class StreamAudit:
    """One continuous audit: ``start`` the query, ``wait`` for its end condition, ``stop``."""

    def __init__(self, spark: Any, run_dir: str, out_dir: str, options: dict[str, str], trigger_s: float,
                 printer: Callable[[str], None] = print):  # fmt: skip
        self.spark = spark
        self.run_dir = os.path.abspath(run_dir)
        self.out_dir = out_dir
        self.options = options
        self.trigger_s = trigger_s
        self.printer = printer
        topics = options.get("topics", options.get("topic", ""))
        self.checker = StreamChecker(topics=[t for t in topics.split(",") if t])
        self.tail = HistoryTail(os.path.join(self.run_dir, "history"))
        self.reports: list[BatchReport] = []
        self.last_activity = time.monotonic()
        self.lock = threading.Lock()
        self.query: Any = None
        os.makedirs(out_dir, exist_ok=True)
        self.batches_file = os.path.join(out_dir, "batches.jsonl")
        open(self.batches_file, "w").close()

    def start(self) -> None:
        from pyspark.sql import functions as F

        from spark_jobs.source import register

        register(self.spark)
        self.last_activity = time.monotonic()
        ckpt = os.path.join(self.out_dir, "checkpoint")
        shutil.rmtree(ckpt, ignore_errors=True)
        reader = self.spark.readStream.format("dledger-mq").option("startingOffsets", "earliest")
        for k, v in self.options.items():
            reader = reader.option(k, v)
        df = reader.load().select(
            "topic", "broker", "queue_id", "queue_offset", "unique_id",
            F.expr("try_element_at(keys, 1)").alias("key"),
            F.expr("try_element_at(properties, 'producer')").alias("producer"),
            F.expr("try_cast(try_element_at(properties, 'seq') AS BIGINT)").alias("seq"),
            F.unix_millis("store_timestamp").alias("store_ms"),
        )  # fmt: skip
        self.query = (
            df.writeStream.foreachBatch(self._on_batch)
            .option("checkpointLocation", ckpt)
            .trigger(processingTime=f"{self.trigger_s} seconds")
            .queryName("dledger-stream-audit")
            .start()
        )

    def _on_batch(self, batch_df: Any, batch_id: int) -> None:
        table = batch_df.toArrow()  # Arrow to the driver: much cheaper than collect()'s Row objects
        cols = [table.column(i).to_pylist() for i in range(table.num_columns)]
        rows: list[Row] = list(zip(*cols, strict=True)) if cols else []
        self._handle(int(batch_id), rows)

    def _handle(self, batch_id: int, rows: list[Row]) -> BatchReport:
        with self.lock:
            sends = self.tail.read()
            if rows or sends:
                self.last_activity = time.monotonic()
            rep = self.checker.batch(batch_id, rows, sends, int(time.time() * 1e6))
            self._emit(rep)
            return rep

    def _emit(self, rep: BatchReport) -> None:
        self.reports.append(rep)
        with open(self.batches_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(rep.to_dict(), default=str) + "\n")
        bad = " ".join(f"{k}={rep.counts[k]}" for k in FAILING if rep.counts.get(k))
        name = {-1: "final", -2: "last sends"}.get(rep.batch_id, f"batch {rep.batch_id}")
        self.printer(
            f"{name}: rows {rep.rows} sends {rep.sends_read} judged {rep.judged} pending {rep.pending} "
            f"delay_ms p50 {rep.delay_ms['p50']} max {rep.delay_ms['max']} dup {rep.counts['duplicates']} | "
            + (f"ANOMALIES {bad}" if bad else "ok")
        )

    def wait(self, duration_s: float = 0.0, idle_s: float = 0.0, stop: threading.Event | None = None) -> None:
        started = time.monotonic()
        while True:
            if self.query.exception() is not None:
                raise RuntimeError(f"the streaming query failed: {self.query.exception()}")
            now = time.monotonic()
            if duration_s and now - started >= duration_s:
                return
            if idle_s and now - self.last_activity >= idle_s and self._caught_up():
                return
            if stop is not None and stop.is_set():
                return
            time.sleep(0.2)

    def _caught_up(self) -> bool:
        """A micro-batch ran, and the query neither runs one nor sees new data."""
        st = self.query.status
        return bool(self.reports) and not st.get("isTriggerActive") and not st.get("isDataAvailable")

    def stop(self) -> dict[str, Any]:
        last_plan_us: int | None = None
        if self.query is not None:
            self.query.stop()
            progress = self.query.lastProgress  # the last trigger: its start precedes its offsets' lookup
            if progress and progress.get("timestamp"):
                stamp = datetime.datetime.fromisoformat(str(progress["timestamp"]).replace("Z", "+00:00"))
                last_plan_us = int(stamp.timestamp() * 1e6)
        with self.lock:
            self._emit(self.checker.batch(-2, [], self.tail.read(), int(time.time() * 1e6)))
            final = self.checker.finish(int(time.time() * 1e6), last_plan_us)
            self._emit(final)
        c = self.checker
        delays = [r.delay_ms["max"] for r in self.reports if r.delay_ms["max"] is not None]
        summary = {
            "run_dir": self.run_dir,
            "verdict": "FAIL" if any(c.totals[k] for k in FAILING) else "PASS",
            "counts": dict(c.totals),
            "batches": sum(1 for r in self.reports if r.batch_id >= 0),
            "rows": c.rows,
            "sends_ok": c.sends_ok,
            "judged": c.judged,
            "unjudged": final.pending,  # acknowledged after the last micro-batch was planned
            "bad_history_lines": self.tail.bad_lines,
            "max_delay_ms": max(delays) if delays else None,
            "first_anomaly_batch": next((r.batch_id for r in self.reports if r.failed), None),
        }
        with open(os.path.join(self.out_dir, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
        return summary


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if not os.path.isdir(args.run_dir):
            raise UsageError(f"RUN_DIR {os.path.abspath(args.run_dir)} does not exist or is not a directory")
        if args.trigger_s <= 0 or args.duration < 0 or args.idle < 0 or args.max_per_batch < 0:
            raise UsageError("--trigger-s must be positive; --duration, --idle, --max-per-batch not negative")
        bad_conf = [c for c in args.conf if "=" not in c]
        if bad_conf:
            raise UsageError(f"--conf wants KEY=VALUE, got {bad_conf[0]!r}")
        topics, namesrv = _topics_and_namesrv(args)
        options = {"topics": ",".join(topics)}
        if namesrv:
            options["namesrv"] = namesrv
        if args.credentials:
            options["credentialsFile"] = args.credentials
        if args.tls_ca:
            options["tlsCaFile"] = args.tls_ca
        if args.max_per_batch:
            options["maxRecordsPerTrigger"] = str(args.max_per_batch)
        out_dir = os.path.abspath(args.out or os.path.join(args.run_dir, "stream-audit"))
    except UsageError as exc:
        print(f"stream_audit: error: {exc}", file=sys.stderr)
        return 2
    from spark_jobs.session import get_session

    spark = get_session(args.master, app_name="dledger-stream-audit", conf=dict(c.split("=", 1) for c in args.conf))
    audit = StreamAudit(spark, args.run_dir, out_dir, options, args.trigger_s)
    try:
        audit.start()
        audit.wait(args.duration, args.idle)
    except KeyboardInterrupt:
        pass
    except Exception:
        traceback.print_exc()
        print("stream_audit: the streaming query failed (exit 3)", file=sys.stderr)
        try:
            audit.query and audit.query.stop()
        finally:
            return 3  # noqa: B012
    summary = audit.stop()
    print(json.dumps(summary))
    return 1 if summary["verdict"] == "FAIL" else 0


if __name__ == "__main__":
    sys.exit(main())
