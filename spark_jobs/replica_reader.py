"""Read one replica's files with no broker running: the Raft log, its meta, consume queues, snapshot.

Replica layout (``RUN_DIR/cluster/data/<group>/dledger-<node_id>/``)::

    store/anchor, store/log/<20-digit start position>   the Raft log (``dledger.entry_store``)
    meta/raft_term, meta/raft_commit                    term + vote, commit-index hint (``dledger.journal``)
    broker/consumequeue/<topic>/<queue_id>/             28-byte units (``broker.store.consume_queue``)
    broker/snapshot                                     the store snapshot (``broker.store.message_store``)

Read-only by construction: every file is opened ``O_RDONLY``; nothing is repaired, truncated,
rebuilt or created (``store/index/`` is derived data and not read at all). The record formats come
from the writers' modules, imported, never restated: records, the anchor and segment names from
``dledger.entry_codec`` / ``dledger.segment_files``, commands from ``dledger.command_codec``, the
meta records from ``dledger.meta_store``, consume-queue units, ``min_offset`` and file names from
``broker.store.consume_queue``, messages from ``broker.store.message`` (only constants and pure decoders are
used: nothing here opens a store). The snapshot map (crc32 + msgpack, version 1) is read here and
tested against files the real writer produces.

Recovery rules mirrored from the store, so the audit sees what a restarted replica would see:
- segments below the anchor's ``floor_position`` are ignored (recovery deletes them);
- the log holds ``anchor_index + 1 ..``; every entry must follow the one before it (index + 1,
  position = segment start + offset, term non-decreasing, chain CRC derived from the previous);
- a bad record at the end of the *last* segment with no valid header after it is a torn tail:
  reading stops there and ``LogReader.torn_tail`` says what the store would cut;
- any other bad record is damage: ``entries()`` raises ``ReplicaDamaged`` after yielding every
  good entry before it (the store would refuse to open).
Consume queues: a torn last unit and a trailing run of all-zero units are ignored, units below
``min_offset`` are skipped; a gap between files or a wrong-sized inner file is reported as damage.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from broker.store.consume_queue import FILE_NAME_DIGITS, MIN_OFFSET_MAGIC, MIN_OFFSET_RECORD, UNIT_SIZE
from broker.store.message import COMMAND_MAGIC, MESSAGE_MAGICS, decode_command
from broker.store.message import decode_header as decode_message_header
from dledger.command_codec import CommandCodecError, decode_batch, is_batch
from dledger.entry_codec import (
    ANCHOR_FILE,
    BLANK_SIZE,
    HEADER_SIZE,
    AnchorFormatError,
    check_record,
    decode_anchor,
    follows,
    is_blank,
    valid_header_after,
)
from dledger.meta_store import COMMIT_RECORD, TERM_RECORD
from dledger.segment_files import Chunks
from dledger.segment_files import file_name as segment_file_name

__all__ = [
    "UNIT_SIZE",
    "Anchor",
    "CommandRecord",
    "ConsumeQueueFiles",
    "LogEntry",
    "LogReader",
    "MessageRecord",
    "ReplicaDamaged",
    "StoreSnapshot",
    "TornTail",
    "decode_records",
    "read_anchor",
    "read_commit_hint",
    "read_consume_queue",
    "read_consume_queues",
    "read_store_snapshot",
    "read_term",
]

_CHUNK_BYTES = 4 << 20


class ReplicaDamaged(Exception):
    """A replica file is damaged in a way a crash cannot explain (the store would refuse to open)."""

    code = "REPLICA_DAMAGED"

    def __init__(self, message: str, path: str, offset: int | None = None):
        super().__init__(message)
        self.path = path
        self.offset = offset


@dataclass(frozen=True, slots=True)
class Anchor:
    index: int
    term: int
    chain_crc: int
    floor_position: int


@dataclass(frozen=True, slots=True)
class TornTail:
    path: str
    offset: int  # where the store would cut the segment
    dropped_bytes: int
    problem: str


@dataclass(frozen=True, slots=True)
class LogEntry:
    index: int
    term: int
    position: int
    total_size: int
    chain_crc: int
    body_crc: int
    body: bytes


def _numbered(directory: str) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if len(n) == FILE_NAME_DIGITS and n.isdigit())


def _read_file(path: str, limit: int = 1 << 20) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return os.pread(fd, limit, 0)
    finally:
        os.close(fd)


def read_anchor(store_dir: str) -> Anchor | None:
    """The anchor record, or None when the store never wrote one (log starts at index 1)."""
    path = os.path.join(store_dir, ANCHOR_FILE)
    raw = _read_file(path)
    if raw is None:
        return None
    try:
        return Anchor(*decode_anchor(raw))
    except AnchorFormatError as exc:
        raise ReplicaDamaged(f"{path}: {exc}", path, 0) from None


class LogReader:
    """The Raft log under ``store_dir``, read front to back (see the module docstring for rules)."""

    def __init__(self, store_dir: str):
        self.store_dir = store_dir
        self.anchor = read_anchor(store_dir)
        floor = self.anchor.floor_position if self.anchor else 0
        log_dir = os.path.join(store_dir, "log")
        self.segments = [(s, os.path.join(log_dir, segment_file_name(s))) for s in _numbered(log_dir)]
        self.segments = [(s, p) for s, p in self.segments if s >= floor]
        self.torn_tail: TornTail | None = None
        self.last: tuple[int, int, int] = self._start()  # index, term, chain_crc of the last entry read

    def _start(self) -> tuple[int, int, int]:
        a = self.anchor
        return (a.index, a.term, a.chain_crc) if a else (0, 0, 0)

    @property
    def first_index(self) -> int:
        return self._start()[0] + 1

    def entries(self) -> Iterator[LogEntry]:
        """Every entry, verified, in index order; stops at a torn tail, raises ReplicaDamaged."""
        self.torn_tail = None
        self.last = self._start()
        for k, (start, path) in enumerate(self.segments):
            if k + 1 < len(self.segments):
                size, nxt = os.path.getsize(path), self.segments[k + 1][0]
                if start + size > nxt:
                    raise ReplicaDamaged(
                        f"{path} at offset {nxt - start}: runs into the next segment", path, nxt - start
                    )
            yield from self._segment(start, path, last=k == len(self.segments) - 1)

    def _segment(self, start: int, path: str, last: bool) -> Iterator[LogEntry]:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size == 0 and not last:
                raise ReplicaDamaged(f"{path} at offset 0: empty segment before the last one", path, 0)
            chunks = Chunks(fd, _CHUNK_BYTES)
            offset = 0
            while offset < size:
                rest = size - offset
                if is_blank(chunks.view(offset, min(BLANK_SIZE, rest))):
                    if rest > BLANK_SIZE:
                        self._bad(
                            fd,
                            path,
                            size,
                            offset + BLANK_SIZE,
                            f"{rest - BLANK_SIZE} byte(s) after BLANK",
                            last,
                        )
                    return
                head, problem = check_record(chunks, offset, rest)
                if head is None:
                    self._bad(fd, path, size, offset, problem, last)
                    return
                gap = follows(head, start + offset, self.last)
                if gap is not None:
                    raise ReplicaDamaged(f"{path} at offset {offset}: {gap}", path, offset)
                body = bytes(chunks.view(offset + HEADER_SIZE, head.body_size))
                self.last = (head.index, head.term, head.chain_crc)
                yield LogEntry(
                    head.index, head.term, head.position, head.total_size, head.chain_crc, head.body_crc, body
                )
                offset += head.total_size
        finally:
            os.close(fd)

    def _bad(self, fd: int, path: str, size: int, offset: int, problem: str, last: bool) -> None:
        if not last:
            raise ReplicaDamaged(
                f"{path} at offset {offset}: {problem} (not the last segment, so not a torn write)",
                path,
                offset,
            )
        if valid_header_after(fd, size, offset + 1, _CHUNK_BYTES):
            raise ReplicaDamaged(
                f"{path} at offset {offset}: {problem}; valid records follow it, so this is not a torn tail",
                path,
                offset,
            )
        self.torn_tail = TornTail(path, offset, size - offset, problem)




# -- records inside entries ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MessageRecord:
    position: int  # the record's log position (what a msg id names)
    size: int
    topic: str
    queue_id: int
    tags: str
    key: str | None  # first key: the sharding key of chaos workloads
    producer: str | None  # user property ``producer``
    seq: int | None  # user property ``seq``
    born_ms: int
    store_ms: int
    unique_id: str


@dataclass(frozen=True, slots=True)
class CommandRecord:
    position: int
    op: str
    topic: str | None
    group: str | None = None  # the consumer group of offset commands


def decode_records(entry: LogEntry) -> tuple[list[MessageRecord | CommandRecord], int]:
    """The message and command records of one entry and the number of undecodable records
    (skipped, as the broker's apply skips them). No-op and foreign entries hold none."""
    body = entry.body
    if not is_batch(body):
        return [], 0
    try:
        parts = decode_batch(body)
    except CommandCodecError:
        return [], 1
    base = entry.position + HEADER_SIZE
    out: list[MessageRecord | CommandRecord] = []
    bad = 0
    for offset, record in parts:
        kind = record[:1]
        if kind in MESSAGE_MAGICS:
            try:
                h, _ = decode_message_header(record)
            except ValueError:
                bad += 1
                continue
            keys, props = h.keys, h.properties
            seq = props.get("seq")
            try:
                seq_int = int(seq) if seq is not None else None
            except (TypeError, ValueError):
                seq_int = None
            producer = props.get("producer")
            out.append(
                MessageRecord(
                    base + offset,
                    len(record),
                    h.topic,
                    h.queue_id,
                    h.tags,
                    keys[0] if keys else None,
                    producer if isinstance(producer, str) else None,
                    seq_int,
                    h.born_ts,
                    h.store_ts,
                    h.unique_id,
                )
            )
        elif kind == COMMAND_MAGIC:
            try:
                cmd = decode_command(record)
            except (ValueError, msgpack.UnpackException):
                bad += 1
                continue
            topic, group = cmd.get("topic"), cmd.get("group")
            out.append(
                CommandRecord(
                    base + offset,
                    str(cmd.get("op")),
                    topic if isinstance(topic, str) else None,
                    group if isinstance(group, str) else None,
                )
            )
        else:
            bad += 1
    return out, bad


# -- meta -----------------------------------------------------------------------------------------
def read_commit_hint(meta_dir: str) -> int | None:
    """The commit index the replica last recorded (a hint: written ≤ 1/s, no fsync); None if absent
    or damaged (the journal ignores a damaged hint too)."""
    raw = _read_file(os.path.join(meta_dir, "raft_commit"), 64)
    if raw is None or len(raw) != COMMIT_RECORD.size:
        return None
    commit, crc = COMMIT_RECORD.unpack(raw)
    if zlib.crc32(struct.pack("<Q", commit)) != crc:
        return None
    return int(commit)


def read_term(meta_dir: str) -> tuple[int, str | None] | None:
    """(current term, voted for) from ``raft_term``; None if absent or damaged."""
    raw = _read_file(os.path.join(meta_dir, "raft_term"), 4096)
    if raw is None or len(raw) < TERM_RECORD.size + 4:
        return None
    payload, (crc,) = raw[:-4], struct.unpack("<I", raw[-4:])
    if zlib.crc32(payload) != crc:
        return None
    term, vote_len = TERM_RECORD.unpack_from(payload, 0)
    vote = payload[TERM_RECORD.size : TERM_RECORD.size + vote_len].decode("utf-8", "replace")
    return int(term), (vote or None)


# -- broker store ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    applied_index: int
    end_position: int  # every queue holds the units of all records below this position
    queues: dict[tuple[str, int], int]  # max offset per queue at the snapshot


def read_store_snapshot(broker_dir: str) -> StoreSnapshot | None:
    """``broker/snapshot`` (crc32 LE + msgpack map); None if absent, damaged or of another version."""
    raw = _read_file(os.path.join(broker_dir, "snapshot"), 1 << 30)
    if raw is None or len(raw) < 4 or zlib.crc32(raw[4:]) != int.from_bytes(raw[:4], "little"):
        return None
    try:
        snap: Any = msgpack.unpackb(raw[4:], raw=False, strict_map_key=False)
        if not isinstance(snap, dict) or snap.get("version") != 1:
            return None
        queues = {(str(t), int(q)): int(m) for t, q, m in snap.get("queues", [])}
        return StoreSnapshot(int(snap["applied_index"]), int(snap["end_position"]), queues)
    except (ValueError, TypeError, KeyError, msgpack.UnpackException):
        return None


@dataclass(frozen=True, slots=True)
class ConsumeQueueFiles:
    """One queue's readable units: ``data`` holds units ``first_offset ..`` back to back."""

    topic: str
    queue_id: int
    first_offset: int
    data: bytes
    damage: str | None = None  # set (and data empty) when the files contradict each other

    @property
    def count(self) -> int:
        return len(self.data) // UNIT_SIZE


def read_consume_queues(cq_root: str) -> Iterator[ConsumeQueueFiles]:
    """Every queue under ``broker/consumequeue/``, sorted by (topic, queue id)."""
    try:
        topics = sorted(os.listdir(cq_root))
    except FileNotFoundError:
        return
    for topic in topics:
        topic_dir = os.path.join(cq_root, topic)
        if not os.path.isdir(topic_dir):
            continue
        for name in sorted(os.listdir(topic_dir), key=lambda n: (len(n), n)):
            qdir = os.path.join(topic_dir, name)
            if name.isdigit() and os.path.isdir(qdir):
                yield read_consume_queue(qdir, topic, int(name))


def read_consume_queue(qdir: str, topic: str, queue_id: int) -> ConsumeQueueFiles:
    starts = _numbered(qdir)
    min_offset = 0
    raw = _read_file(os.path.join(qdir, "min_offset"), 64)
    if raw is not None:
        body = raw[: MIN_OFFSET_RECORD.size]
        if len(raw) != MIN_OFFSET_RECORD.size + 4 or struct.unpack_from("<I", raw, len(body))[0] != zlib.crc32(
            body
        ):
            return ConsumeQueueFiles(topic, queue_id, 0, b"", "bad min_offset record")
        magic, min_offset = MIN_OFFSET_RECORD.unpack(body)
        if magic != MIN_OFFSET_MAGIC:
            return ConsumeQueueFiles(topic, queue_id, 0, b"", "bad min_offset magic")
    if not starts:
        return ConsumeQueueFiles(topic, queue_id, min_offset, b"")
    parts: list[bytes] = []
    for k, start in enumerate(starts):
        path = os.path.join(qdir, f"{start:0{FILE_NAME_DIGITS}d}")
        with open(path, "rb", buffering=0) as f:  # "rb": read-only
            data = f.read()
        if k + 1 < len(starts):
            want = (starts[k + 1] - start) * UNIT_SIZE
            if k > 0 and starts[k + 1] - start != starts[1] - starts[0]:
                return ConsumeQueueFiles(topic, queue_id, 0, b"", f"gap before file {starts[k + 1]}")
            if len(data) != want:
                return ConsumeQueueFiles(topic, queue_id, 0, b"", f"file {start}: size {len(data)} != {want}")
        else:
            data = data[: len(data) - len(data) % UNIT_SIZE]  # a torn last unit
            stripped = len(data.rstrip(b"\0"))  # trailing zero units: torn or preallocated
            data = data[: -(-stripped // UNIT_SIZE) * UNIT_SIZE]
        parts.append(data)
    data = b"".join(parts)
    first = starts[0]
    if min_offset > first:
        skip = min(min_offset - first, len(data) // UNIT_SIZE)
        data = data[skip * UNIT_SIZE :]
        first += skip
    return ConsumeQueueFiles(topic, queue_id, first, data)
