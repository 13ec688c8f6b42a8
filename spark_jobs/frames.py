"""The audit's input DataFrames, read from the Parquet work directory (``history``, ``replica_tables``)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs import checks
from spark_jobs._arrow import pa, pc, pq
from spark_jobs.history import (
    OFFSET_OP_SCHEMA,
    RECEIPT_SCHEMA,
    RETRY_SCHEMA,
    SAMPLE_OFFSET_SCHEMA,
    SAMPLE_SCHEMA,
    SEND_SCHEMA,
    with_extra_columns,
)
from spark_jobs.replica_tables import SCHEMAS

_REPLICAS_SCHEMA = (
    "group string, replica string, recorded_commit long, commit long, group_commit long, snapshot_end long"
)


@dataclasses.dataclass
class Frames:
    sends: DataFrame
    receipts: DataFrame
    drain: DataFrame
    entries: DataFrame
    records: DataFrame
    commands: DataFrame
    cq_units: DataFrame
    replicas: DataFrame  # one row per replica (``audit.commit_table``)
    floors: DataFrame  # broker, floor_position (``audit.retention_floors``)
    topics: list[str]  # the workload's topics: run.json's and every topic a send named
    samples: DataFrame  # the sampler's lines (``history.ingest_samples``)
    sample_offsets: DataFrame
    offset_ops: DataFrame
    retries: DataFrame  # the retry group's receipts (``retries-*.jsonl``)
    dlq: DataFrame  # the retry group's DLQ read at the end (``dlq.jsonl``)
    committed: DataFrame = dataclasses.field(init=False)
    delivered: DataFrame = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        # Not cached: a filtered scan of the records is cheaper than building an in-memory copy.
        self.committed = checks.committed_messages(self.records, self.replicas)
        self.delivered = checks.deliveries(self.receipts, self.drain)

    @classmethod
    def load(
        cls,
        spark: SparkSession,
        work_dir: str,
        commits: list[dict[str, Any]],
        floors: list[tuple[str, int]],
        run_topics: list[str],
    ) -> Frames:
        def table(name: str, schema: Any) -> DataFrame:
            # The schema is known: Spark need not read Parquet footers to infer it.
            return spark.read.schema(_ddl(schema)).parquet(os.path.join(work_dir, name))

        rows = [
            tuple(
                c[k]
                for k in ("group", "replica", "recorded_commit", "commit", "group_commit", "snapshot_end")
            )
            for c in commits
        ]
        send_topics = distinct_values(work_dir, "sends", "topic")
        topics = sorted({*run_topics, *send_topics})
        return cls(
            sends=table("sends", with_extra_columns(SEND_SCHEMA)),
            receipts=table("receipts", with_extra_columns(RECEIPT_SCHEMA)),
            drain=table("drain", with_extra_columns(RECEIPT_SCHEMA)),
            entries=table("entries", SCHEMAS["entries"]),
            records=table("records", SCHEMAS["records"]),
            commands=table("commands", SCHEMAS["commands"]),
            cq_units=table("cq_units", SCHEMAS["cq_units"]),
            replicas=spark.createDataFrame(rows, _REPLICAS_SCHEMA),
            floors=spark.createDataFrame(floors, "broker string, floor_position long"),
            topics=topics,
            samples=table("samples", SAMPLE_SCHEMA),
            sample_offsets=table("sample_offsets", SAMPLE_OFFSET_SCHEMA),
            offset_ops=table("offset_ops", OFFSET_OP_SCHEMA),
            retries=table("retries", with_extra_columns(RETRY_SCHEMA)),
            dlq=table("dlq", with_extra_columns(RETRY_SCHEMA)),
        )

    def workload(self, df: DataFrame) -> DataFrame:
        """Only rows of the workload's topics (other traffic is not the audit's business)."""
        return df.where(F.col("topic").isin(self.topics)) if self.topics else df


def distinct_values(work_dir: str, table: str, column: str) -> list[str]:
    """The distinct non-null values of one (small-cardinality) column, read with pyarrow."""
    values = pc.unique(pq.read_table(os.path.join(work_dir, table), columns=[column])[column]).to_pylist()
    return sorted(v for v in values if v is not None)


def _ddl(schema: Any) -> str:
    """A Spark DDL string for an Arrow schema of strings, int64s and booleans."""
    types = {pa.string(): "string", pa.int64(): "bigint", pa.bool_(): "boolean"}
    return ", ".join(f"`{f.name}` {types[f.type]}" for f in schema)
