"""Turn replicas' files into Parquet tables the audit's Spark jobs read (columnar, bounded memory).

The replicas of one group are read together (``scan_group``): their logs in lockstep by index, so an
entry body several replicas hold byte for byte is decoded once. Tables under ``out_dir``::

    entries/   per replica: group replica index term position total_size chain_crc body_crc body_hash records
    records/   per distinct (group, index, body_hash): group index body_hash rel size topic queue_id
               unique_id key producer seq born_us store_us          (message records of that body)
    commands/  the same for command records: group index body_hash rel op topic cgroup (consumer group)
    cq_units/  per replica: group replica topic queue_id offset position size prev_position

A record's log position in a replica is that replica's entry position + ``rel`` (header + offset
in the body), so ``entries ⋈ records`` on (group, index, body_hash) gives every replica's messages.
``body_hash`` is the first 8 bytes of BLAKE2b over the entry body (a signed int64): comparing it is
comparing body bytes, short of a 2^-64 collision. ``prev_position`` is the position of the unit
at offset − 1 (−1 for a queue's first unit). Times are µs (the store keeps ms).

Rows go to Parquet in batches of ``BATCH_ROWS``, so memory stays bounded however long the logs
are. ``scan_replicas`` scans groups in parallel processes (plain Python; the cores are otherwise
idle while Spark starts) and returns each replica's ``ReplicaSummary`` (small, JSON-able).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import itertools
import multiprocessing
import os
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from spark_jobs._arrow import pa, pq
from spark_jobs.replica_reader import (
    CommandRecord,
    LogEntry,
    LogReader,
    ReplicaDamaged,
    decode_records,
    read_commit_hint,
    read_consume_queues,
    read_store_snapshot,
    read_term,
)

BATCH_ROWS = 1 << 16
_UNIT_DTYPE = np.dtype([("position", "<u8"), ("size", "<u4"), ("tag", "<u8"), ("ts", "<u8")])
assert _UNIT_DTYPE.itemsize == 28

_S, _I = pa.string(), pa.int64()
SCHEMAS: dict[str, pa.Schema] = {
    "entries": pa.schema(
        [
            ("group", _S),
            ("replica", _S),
            ("index", _I),
            ("term", _I),
            ("position", _I),
            ("total_size", _I),
            ("chain_crc", _I),
            ("body_crc", _I),
            ("body_hash", _I),
            ("records", _I),
        ]
    ),
    "records": pa.schema(
        [
            ("group", _S),
            ("index", _I),
            ("body_hash", _I),
            ("rel", _I),
            ("size", _I),
            ("topic", _S),
            ("queue_id", _I),
            ("unique_id", _S),
            ("key", _S),
            ("producer", _S),
            ("seq", _I),
            ("born_us", _I),
            ("store_us", _I),
        ]
    ),
    "commands": pa.schema(
        [("group", _S), ("index", _I), ("body_hash", _I), ("rel", _I), ("op", _S), ("topic", _S), ("cgroup", _S)]
    ),
    "cq_units": pa.schema(
        [
            ("group", _S),
            ("replica", _S),
            ("topic", _S),
            ("queue_id", _I),
            ("offset", _I),
            ("position", _I),
            ("size", _I),
            ("prev_position", _I),
        ]
    ),
}


@dataclasses.dataclass
class ReplicaSummary:
    """What the audit needs to know about one replica besides its tables."""

    group: str
    replica: str
    path: str
    anchor_index: int = 0
    first_index: int = 1
    last_index: int = 0
    last_term: int = 0
    first_position: int | None = None  # of the first entry held
    end_position: int = 0  # just after the last entry held
    entries: int = 0
    messages: int = 0
    commands: int = 0
    bad_records: int = 0
    commit_hint: int | None = None
    term: int | None = None
    voted_for: str | None = None
    torn_tail: dict[str, Any] | None = None
    damage: dict[str, Any] | None = None
    snapshot_applied_index: int | None = None
    snapshot_end_position: int | None = None
    cq_queues: int = 0
    cq_units: int = 0
    cq_damaged: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.group}-{self.replica}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _TableWriter:
    """Rows in, Parquet row groups out every BATCH_ROWS rows; ``consts`` fill the leading columns."""

    def __init__(self, path: str, schema: pa.Schema, consts: tuple[str, ...]):
        self._path = path
        self._schema = schema
        self._consts = consts
        self._rows: list[tuple[Any, ...]] = []
        self._writer: pq.ParquetWriter | None = None

    def add(self, row: tuple[Any, ...]) -> None:
        self._rows.append(row)
        if len(self._rows) >= BATCH_ROWS:
            self.flush()

    def write_arrays(self, arrays: list[Any]) -> None:
        """A batch given column-wise (without the constant columns)."""
        self.flush()
        n = len(arrays[0])
        consts = [pa.array([c] * n, _S) for c in self._consts]
        self._write(pa.Table.from_arrays(consts + list(arrays), schema=self._schema))

    def flush(self) -> None:
        if not self._rows:
            return
        n = len(self._rows)
        columns = list(zip(*self._rows, strict=True))
        self._rows = []
        fields = list(self._schema)[len(self._consts) :]
        arrays = [pa.array([c] * n, _S) for c in self._consts]
        arrays += [pa.array(col, f.type) for col, f in zip(columns, fields, strict=True)]
        self._write(pa.Table.from_arrays(arrays, schema=self._schema))

    def _write(self, table: pa.Table) -> None:
        if self._writer is None:
            os.makedirs(os.path.dirname(self._path), exist_ok=True)
            self._writer = pq.ParquetWriter(self._path, self._schema, compression="snappy")
        self._writer.write_table(table)

    def close(self) -> None:
        self.flush()
        if self._writer is None:  # an empty table still gets a file: Spark then knows the schema
            self._write(self._schema.empty_table())
        assert self._writer is not None
        self._writer.close()


def _signed64(raw: bytes) -> int:
    return int.from_bytes(raw, "little", signed=True)


def _damage(exc: ReplicaDamaged) -> dict[str, Any]:
    return {"path": exc.path, "offset": exc.offset, "problem": str(exc)}


class _Stream:
    """One replica's log during a lockstep scan."""

    def __init__(self, summary: ReplicaSummary, reader: LogReader, writer: _TableWriter):
        self.summary = summary
        self.reader = reader
        self.writer = writer
        self._it = reader.entries()
        self.head: LogEntry | None = None
        self.advance()

    def advance(self) -> None:
        try:
            self.head = next(self._it, None)
        except ReplicaDamaged as exc:
            self.summary.damage = _damage(exc)
            self.head = None


def scan_group(group: str, replicas: Sequence[tuple[str, str]], out_dir: str) -> list[ReplicaSummary]:
    """Read the replicas ``(replica id, .../dledger-<id>)`` of one group into the tables."""
    summaries = [ReplicaSummary(group, r, p) for r, p in replicas]
    stem = f"{group}.parquet"
    records = _TableWriter(os.path.join(out_dir, "records", stem), SCHEMAS["records"], (group,))
    commands = _TableWriter(os.path.join(out_dir, "commands", stem), SCHEMAS["commands"], (group,))
    writers = [records, commands]
    try:
        streams = []
        for s in summaries:
            entries = _TableWriter(
                os.path.join(out_dir, "entries", f"{group}__{s.replica}.parquet"),
                SCHEMAS["entries"],
                (group, s.replica),
            )
            writers.append(entries)
            try:
                reader = LogReader(os.path.join(s.path, "store"))
            except ReplicaDamaged as exc:
                s.damage = _damage(exc)
                continue
            s.anchor_index = reader.anchor.index if reader.anchor else 0
            s.first_index = reader.first_index
            streams.append(_Stream(s, reader, entries))
        _scan_logs(streams, records, commands)
        for st in streams:
            st.summary.last_index, st.summary.last_term, _ = st.reader.last
            if st.reader.torn_tail is not None:
                st.summary.torn_tail = dataclasses.asdict(st.reader.torn_tail)
        for s in summaries:
            cq = _TableWriter(
                os.path.join(out_dir, "cq_units", f"{group}__{s.replica}.parquet"),
                SCHEMAS["cq_units"],
                (group, s.replica),
            )
            writers.append(cq)
            _scan_state(s, cq)
    finally:
        for w in writers:
            w.close()
    return summaries


def _scan_logs(streams: list[_Stream], records: _TableWriter, commands: _TableWriter) -> None:
    """Merge the replicas' logs by index; decode each distinct body of an index once."""
    while True:
        live = [st for st in streams if st.head is not None]
        if not live:
            return
        index = min(st.head.index for st in live if st.head is not None)
        decoded: dict[int, tuple[int, int, int]] = {}  # body_hash -> (records, messages, bad)
        for st in live:
            e = st.head
            if e is None or e.index != index:
                continue
            body_hash = _signed64(hashlib.blake2b(e.body, digest_size=8).digest())
            if body_hash not in decoded:
                decoded[body_hash] = _write_records(e, body_hash, records, commands)
            n, messages, bad = decoded[body_hash]
            st.writer.add((e.index, e.term, e.position, e.total_size, e.chain_crc, e.body_crc, body_hash, n))
            s = st.summary
            s.messages += messages
            s.commands += n - messages
            s.bad_records += bad
            if s.first_position is None:
                s.first_position = e.position
            s.end_position = e.position + e.total_size
            s.entries += 1
            st.advance()


def _write_records(
    e: LogEntry, body_hash: int, records: _TableWriter, commands: _TableWriter
) -> tuple[int, int, int]:
    recs, bad = decode_records(e)
    messages = 0
    for r in recs:
        rel = r.position - e.position
        if isinstance(r, CommandRecord):
            commands.add((e.index, body_hash, rel, r.op, r.topic, r.group))
        else:
            records.add(
                (
                    e.index,
                    body_hash,
                    rel,
                    r.size,
                    r.topic,
                    r.queue_id,
                    r.unique_id,
                    r.key,
                    r.producer,
                    r.seq,
                    r.born_ms * 1000,
                    r.store_ms * 1000,
                )
            )
            messages += 1
    return len(recs), messages, bad


def _scan_state(s: ReplicaSummary, cq: _TableWriter) -> None:
    meta = os.path.join(s.path, "meta")
    s.commit_hint = read_commit_hint(meta)
    term = read_term(meta)
    if term is not None:
        s.term, s.voted_for = term
    broker_dir = os.path.join(s.path, "broker")
    snap = read_store_snapshot(broker_dir)
    if snap is not None:
        s.snapshot_applied_index = snap.applied_index
        s.snapshot_end_position = snap.end_position
    _scan_queues(s, os.path.join(broker_dir, "consumequeue"), cq)


def _scan_queues(summary: ReplicaSummary, cq_root: str, writer: _TableWriter) -> None:
    pending: list[list[Any]] = []
    pending_rows = 0

    def flush() -> None:
        nonlocal pending, pending_rows
        if pending:
            topics = list(itertools.chain.from_iterable(p[0] for p in pending))
            numeric = [np.concatenate(c) for c in list(zip(*pending, strict=True))[1:]]
            writer.write_arrays([pa.array(topics, _S)] + [pa.array(c, _I) for c in numeric])
        pending, pending_rows = [], 0

    for q in read_consume_queues(cq_root):
        summary.cq_queues += 1
        if q.damage is not None:
            summary.cq_damaged.append({"topic": q.topic, "queue_id": q.queue_id, "problem": q.damage})
            continue
        units = np.frombuffer(q.data, dtype=_UNIT_DTYPE)
        n = len(units)
        if n == 0:
            continue
        summary.cq_units += n
        positions = units["position"].astype(np.int64)
        prev = np.empty(n, np.int64)
        prev[0] = -1
        prev[1:] = positions[:-1]
        pending.append(
            [
                [q.topic] * n,
                np.full(n, q.queue_id, np.int64),
                np.arange(q.first_offset, q.first_offset + n, dtype=np.int64),
                positions,
                units["size"].astype(np.int64),
                prev,
            ]
        )
        pending_rows += n
        if pending_rows >= 4 * BATCH_ROWS:
            flush()
    flush()


def _scan_task(args: tuple[str, list[tuple[str, str]], str]) -> list[ReplicaSummary]:
    return scan_group(*args)


def scan_replicas(
    replicas: Sequence[tuple[str, str, str]], out_dir: str, workers: int | None = None
) -> list[ReplicaSummary]:
    """Scan ``(group, replica, path)`` replicas into ``out_dir``, one task per group; in parallel
    processes when there is enough data to pay for them (``workers=1``: in this process)."""
    by_group: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for g, r, p in replicas:
        by_group[g].append((r, p))
    tasks = [(g, reps, out_dir) for g, reps in sorted(by_group.items())]
    if workers is None:
        workers = min(len(tasks), os.cpu_count() or 1) if _log_bytes(replicas) > (64 << 20) else 1
    if workers <= 1:
        results = [_scan_task(t) for t in tasks]
    else:
        ctx = multiprocessing.get_context("spawn")  # never fork a process that may hold a JVM gateway
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            results = list(pool.map(_scan_task, tasks))
    return [s for group in results for s in group]


def _log_bytes(replicas: Sequence[tuple[str, str, str]]) -> int:
    total = 0
    for _, _, path in replicas:
        log_dir = os.path.join(path, "store", "log")
        try:
            total += sum(e.stat().st_size for e in os.scandir(log_dir) if e.is_file())
        except FileNotFoundError:
            pass
    return total


def iter_rows(path: str) -> Iterator[dict[str, Any]]:
    """Every row of one table directory (tests and debugging)."""
    yield from pq.read_table(path).to_pylist()
