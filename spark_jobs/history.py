"""History JSONL (docs/CHAOS.md) into Parquet for Spark: ``sends/``, ``receipts/``, ``drain/``,
``retries/`` and ``dlq/`` (the retry group's receipts and its DLQ; empty before history version 3), and the
small tables ``samples/``, ``sample_offsets/`` (the sampler's lines) and ``offset_ops/`` (offset
clients' fetches and commits).

Parsing uses pyarrow's multithreaded JSON reader with the contract's schema (a few times faster than
Spark's JSON source on a small machine), streaming batch by batch into one Parquet file per input
file, so memory stays bounded. Two columns are added: ``file`` (the file's stem: ``p0``, ``c1``,
``drain``) and ``line`` (0-based position among the file's records: a consumer's delivery order).

A file pyarrow rejects (a torn last line after a crash, a field of the wrong type) is re-read line
by line; lines that are not a JSON object or carry a field of the wrong type are skipped and
counted in ``HistoryStats.bad_lines`` (reported, never silently dropped).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from typing import Any

from spark_jobs._arrow import pa, pj, pq

__all__ = [
    "OFFSET_OP_SCHEMA",
    "RECEIPT_SCHEMA",
    "RETRY_SCHEMA",
    "SAMPLE_OFFSET_SCHEMA",
    "SAMPLE_SCHEMA",
    "SEND_SCHEMA",
    "HistoryStats",
    "ingest_history",
    "ingest_samples",
    "with_extra_columns",
]

_S, _I = pa.string(), pa.int64()
SEND_SCHEMA = pa.schema(
    [
        ("type", _S),
        ("producer", _S),
        ("unique_id", _S),
        ("key", _S),
        ("seq", _I),
        ("topic", _S),
        ("invoke_us", _I),
        ("complete_us", _I),
        ("outcome", _S),
        ("error", _S),
        ("broker", _S),
        ("queue_id", _I),
        ("queue_offset", _I),
        ("msg_id", _S),
        ("store_us", _I),
        ("body_crc", _I),
        ("delay_level", _I),  # history version 3 (null before)
        ("deliver_ms", _I),
        ("due_us", _I),
        ("txn", _S),  # history version 4 (null before): the transaction plan
    ]
)
RECEIPT_SCHEMA = pa.schema(
    [
        ("type", _S),
        ("consumer", _S),
        ("time_us", _I),
        ("topic", _S),
        ("broker", _S),
        ("queue_id", _I),
        ("queue_offset", _I),
        ("msg_id", _S),
        ("unique_id", _S),
        ("key", _S),
        ("seq", _I),
        ("producer", _S),
        ("born_us", _I),
        ("store_us", _I),
        ("session", _I),
        ("body_crc", _I),
    ]
)
# The retry group's receipts and the DLQ's messages (history version 3).
RETRY_SCHEMA = pa.schema(
    [*RECEIPT_SCHEMA, pa.field("reconsume_times", _I), pa.field("retry", pa.bool_()), pa.field("answer", _S)]
)
# One row per sample line (``line``: its place in samples.jsonl), and one per (sample, queue) offset.
SAMPLE_SCHEMA = pa.schema(
    [
        ("group", _S),
        ("replica", _S),
        ("node_id", _S),
        ("line", _I),
        ("time_us", _I),
        ("pid", _I),
        ("role", _S),
        ("term", _I),
        ("commit_index", _I),
        ("applied_index", _I),
        ("last_index", _I),
        ("last_term", _I),
        ("chain_crc", _I),
        ("entries_truncated", _I),
    ]
)
SAMPLE_OFFSET_SCHEMA = pa.schema(
    [("group", _S), ("replica", _S), ("line", _I), ("topic", _S), ("queue_id", _I), ("offset", _I)]
)
OFFSET_OP_SCHEMA = pa.schema(
    [
        ("client", _S),
        ("line", _I),
        ("action", _S),
        ("invoke_us", _I),
        ("complete_us", _I),
        ("cgroup", _S),
        ("topic", _S),
        ("broker", _S),
        ("queue_id", _I),
        ("offset", _I),
        ("outcome", _S),
        ("stale", _I),
    ]
)
_EXTRA = [("file", _S), ("line", _I)]
_BLOCK_BYTES = 8 << 20


@dataclasses.dataclass
class HistoryStats:
    rows: dict[str, int] = dataclasses.field(default_factory=dict)  # per table
    files: dict[str, int] = dataclasses.field(default_factory=dict)  # rows per input file
    bad_lines: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # file -> count, samples

    @property
    def bad_line_count(self) -> int:
        return sum(int(v["count"]) for v in self.bad_lines.values())


def _stem(path: str) -> str:
    name = os.path.basename(path)
    name = name[: -len(".jsonl")] if name.endswith(".jsonl") else name
    for prefix in ("sends-", "receipts-", "retries-"):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def ingest_history(
    send_files: list[str],
    receipt_files: list[str],
    drain_file: str | None,
    out_dir: str,
    retry_files: list[str] | None = None,
    dlq_file: str | None = None,
) -> HistoryStats:
    stats = HistoryStats()
    for table, files, schema in (
        ("sends", send_files, SEND_SCHEMA),
        ("receipts", receipt_files, RECEIPT_SCHEMA),
        ("drain", [drain_file] if drain_file else [], RECEIPT_SCHEMA),
        ("retries", retry_files or [], RETRY_SCHEMA),
        ("dlq", [dlq_file] if dlq_file else [], RETRY_SCHEMA),
    ):
        target = os.path.join(out_dir, table)
        os.makedirs(target, exist_ok=True)
        total = 0
        for k, path in enumerate(files):
            n = _convert(path, os.path.join(target, f"part-{k:05d}.parquet"), schema, stats)
            stats.files[os.path.relpath(path, os.path.dirname(os.path.dirname(path)))] = n
            total += n
        if not files:  # an empty table still has a schema
            pq.write_table(
                with_extra_columns(schema).empty_table(), os.path.join(target, "part-00000.parquet")
            )
        stats.rows[table] = total
    return stats


def ingest_samples(
    samples_file: str | None, offset_files: list[str], out_dir: str, topic: str | None, stats: HistoryStats
) -> int:
    """``samples.jsonl`` -> ``samples/`` and ``sample_offsets/`` (offsets of ``topic``, the one the
    sampler reads), ``offsets-*.jsonl`` -> ``offset_ops/`` (one row per queue). Small files, read
    with the json module; bad lines are counted like the other histories'. Returns the samples read."""
    samples: list[dict[str, Any]] = []
    offsets: list[dict[str, Any]] = []
    bad: list[str] = []
    for lineno, raw in enumerate(_lines(samples_file) if samples_file else []):
        try:
            d = json.loads(raw)
            row = {
                "group": str(d["group"]), "replica": str(d["replica"]), "node_id": str(d["node_id"]),
                "line": lineno, "time_us": _opt_int(d["time_us"]), "pid": _opt_int(d.get("pid")),
                "role": d.get("role") if isinstance(d.get("role"), str) else None,
                "term": _opt_int(d.get("term")), "commit_index": _opt_int(d.get("commit_index")),
                "applied_index": _opt_int(d.get("applied_index")), "last_index": _opt_int(d.get("last_index")),
                "last_term": _opt_int(d.get("last_term")), "chain_crc": _opt_int(d.get("chain_crc_at_commit")),
                "entries_truncated": _opt_int(d.get("entries_truncated")),
            }
            if row["time_us"] is None:
                raise ValueError("time_us must be an integer")
            for q, off in dict(d.get("offsets") or {}).items():
                if _opt_int(off) is not None:
                    offsets.append({"group": row["group"], "replica": row["replica"], "line": lineno,
                                    "topic": topic, "queue_id": int(q), "offset": off})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            bad.append(f"line {lineno + 1}: {exc!r}"[:200])
            continue
        samples.append(row)
    if bad and samples_file:
        stats.bad_lines[os.path.basename(samples_file)] = {"count": len(bad), "samples": bad[:5]}
    ops: list[dict[str, Any]] = []
    for path in offset_files:
        op_bad: list[str] = []
        for lineno, raw in enumerate(_lines(path)):
            try:
                d = json.loads(raw)
                for q, off in dict(d["offsets"]).items():
                    ops.append({
                        "client": str(d["client"]), "line": lineno, "action": str(d["action"]),
                        "invoke_us": int(d["invoke_us"]), "complete_us": int(d["complete_us"]),
                        "cgroup": str(d["group"]), "topic": str(d["topic"]), "broker": str(d["broker"]),
                        "queue_id": int(q), "offset": int(off), "outcome": str(d["outcome"]),
                        "stale": int(bool(d.get("stale"))),
                    })
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                op_bad.append(f"line {lineno + 1}: {exc!r}"[:200])
        if op_bad:
            stats.bad_lines[os.path.basename(path)] = {"count": len(op_bad), "samples": op_bad[:5]}
    for name, rows, schema in (
        ("samples", samples, SAMPLE_SCHEMA),
        ("sample_offsets", offsets, SAMPLE_OFFSET_SCHEMA),
        ("offset_ops", ops, OFFSET_OP_SCHEMA),
    ):
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), os.path.join(out_dir, name, "part-00000.parquet"))
        stats.rows[name] = len(rows)
    return len(samples)


def _opt_int(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{v!r} is not an integer")
    return v


def with_extra_columns(schema: pa.Schema) -> pa.Schema:
    """The Parquet schema of a history table: the line schema plus ``file`` and ``line``."""
    return pa.schema(list(schema) + [pa.field(n, t) for n, t in _EXTRA])


def _convert(path: str, target: str, schema: pa.Schema, stats: HistoryStats) -> int:
    stem = _stem(path)
    full = with_extra_columns(schema)
    try:
        with pq.ParquetWriter(target, full, compression="snappy") as writer:
            return _convert_fast(path, schema, stem, writer)
    except pa.ArrowInvalid:
        pass
    with pq.ParquetWriter(target, full, compression="snappy") as writer:
        return _convert_lenient(path, schema, stem, writer, stats)


def _convert_fast(path: str, schema: pa.Schema, stem: str, writer: pq.ParquetWriter) -> int:
    if os.path.getsize(path) == 0:
        return 0
    reader = pj.open_json(
        path,
        read_options=pj.ReadOptions(block_size=_BLOCK_BYTES),
        parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
    )
    line = 0
    for batch in reader:
        n = batch.num_rows
        extra = [pa.array([stem] * n, _S), pa.array(range(line, line + n), _I)]
        writer.write_table(
            pa.Table.from_arrays(batch.select(schema.names).columns + extra, schema=writer.schema)
        )
        line += n
    return line


def _convert_lenient(
    path: str, schema: pa.Schema, stem: str, writer: pq.ParquetWriter, stats: HistoryStats
) -> int:
    bad: list[str] = []
    rows: list[dict[str, Any]] = []
    count = 0
    for lineno, raw in enumerate(_lines(path)):
        row = _coerce(raw, schema)
        if isinstance(row, str):
            bad.append(f"line {lineno + 1}: {row}")
            continue
        row["file"], row["line"] = stem, count
        rows.append(row)
        count += 1
        if len(rows) >= 65536:
            writer.write_table(pa.Table.from_pylist(rows, schema=writer.schema))
            rows = []
    if rows:
        writer.write_table(pa.Table.from_pylist(rows, schema=writer.schema))
    if bad:
        stats.bad_lines[os.path.basename(path)] = {"count": len(bad), "samples": bad[:5]}
    return count


def _lines(path: str) -> Iterable[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            if raw.strip():
                yield raw


def _coerce(raw: str, schema: pa.Schema) -> dict[str, Any] | str:
    """The row for one line, or why it is unusable."""
    try:
        d = json.loads(raw)
    except ValueError as exc:
        return f"not JSON ({exc})"
    if not isinstance(d, dict):
        return "not a JSON object"
    row: dict[str, Any] = {}
    for f in schema:
        v = d.get(f.name)
        if v is None:
            row[f.name] = None
        elif (
            (f.type == _I and isinstance(v, int) and not isinstance(v, bool))
            or (f.type == _S and isinstance(v, str))
            or (f.type == pa.bool_() and isinstance(v, bool))
        ):
            row[f.name] = v
        else:
            return f"field {f.name!r} has the wrong type ({type(v).__name__})"
    return row
