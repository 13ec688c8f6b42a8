"""Spark audits of chaos runs: histories and every replica's files, checked against the invariants.

``python -m spark_jobs.audit RUN_DIR`` reads a run directory (docs/CHAOS.md) and reports lost,
unseen, duplicated, unexpected and out-of-order messages, inconsistent and wrongly acknowledged
offsets, non-monotonic sends and polls, aborted and corrupt reads, consumer offsets moving
backwards, replica divergence, committed prefixes that change or shrink, consume-queue/log
mismatches, unavailability windows, recovery times and latency; exit code 1 when a failing check
finds something.

Modules:
- ``run_dir``        the run directory's layout, run.json statuses, faults (usage errors: exit 2)
- ``replica_reader`` one replica's files read with no broker running and without writing a byte
- ``replica_tables`` replicas -> Parquet (a group's logs read in lockstep, shared bodies decoded once)
- ``history``        history JSONL -> Parquet
- ``rules``          every check's definition as plain Python over small data (the reference)
- ``checks``, ``checks_history``, ``checks_samples``  the same checks as Spark DataFrame transformations
- ``evidence``       the history lines that prove each finding (quoted in report.html)
- ``frames``, ``session``  the input DataFrames; the SparkSession (local mode unless told otherwise)
- ``audit``          the CLI: runs the pipeline, decides the verdict
- ``report``         summary.json, details/*.json, report.html with embedded plots
- ``synth``, ``synth_replicas``, ``synth_samples``  synthetic run directories with planted anomalies
  (tests, benchmarks)
- ``source``         the ``dledger-mq`` PySpark data source: topics read through the brokers (docs/SPARK.md)
"""
