"""Spark audits of chaos runs: histories and every replica's files, checked against the invariants.

``python -m spark_jobs.audit RUN_DIR`` reads a run directory (docs/CHAOS.md) and reports lost,
duplicated, unexpected and out-of-order messages, replica divergence, consume-queue/log mismatches,
unavailability and latency. ``replica_reader`` reads replica files with no broker running (never
writing); ``replica_tables`` turns them into Parquet; ``history`` does the same for the JSONL
histories; ``checks`` holds the Spark transformations and ``rules`` the same definitions as plain
Python over small data; ``report`` writes summary.json and report.html; ``synth`` writes synthetic
run directories with planted anomalies.
"""
