"""The message key index: (topic, key) -> candidate log positions, in RocketMQ IndexFile style.

Files ``<root>/<seq:010d>.kidx``, fixed size, created sparse, mmapped, filled in order::

    header   64 B   magic b"RKIX" | u8 version | u8 state | u16 flags | u32 slots | u32 entries_max
                    | u32 count | i64 base_ts | i64 begin_ts | i64 end_ts | i64 begin_pos | i64 end_pos
                    | u32 crc32
    slots    slots x u32          number of the newest entry in the bucket (0 = empty)
    entries  entries_max x 20 B   u32 key hash | u64 log position | i32 ts diff | u32 previous entry

Entry numbers start at 1. The key hash is crc32(utf-8 of ``f"{topic}#{key}"``), the bucket is
hash % slots, and ``ts diff`` is the store timestamp in *milliseconds* minus the file's ``base_ts``
(the store ts of its first entry). It is signed, so a store ts slightly behind the base (a new
leader's clock) fits; a put whose diff does not fit in i32 (about +-24.8 days), or that finds the
file full, rolls to a new file. begin/end ts and begin/end pos are the min/max over the file's
entries (positions: -1 when empty). Flag bit 0 (UNORDERED) is set once a put's position is not
above every position before it in the file (re-indexing after recovery); queries then walk a whole
chain instead of stopping at ``max_count``. The crc covers the 60 header bytes before it.

Queries return *candidates*: the caller reads each message and checks its key, so a 32-bit hash
collision only costs a read. Results are deduplicated: re-putting (key, position) after recovery is
harmless.

Durability (the header is the durable point; puts only touch the mmap, no syscalls)::

    create --> OPEN --flush()--> OPEN (count, ranges as of the flush) --close()--> CLOSED
                 \\--file full or ts out of range (roll)--> SEALED (immutable)
    open of a CLOSED last file --> OPEN again (rewritten before any put)

``flush()`` msyncs the whole mapping, then rewrites the header with the entry count and ranges of
that moment and msyncs it. After a crash the header of the last file says OPEN: entries past its
``count`` are ignored, slots that point past it (their pages may have reached the disk) are rebuilt
from entries 1..count (prev links of those entries were durable before the header said so), and
``needs_rebuild_from()`` reports the first position to re-index: end_pos + 1 of what remains. A
file whose header is unreadable (bad magic/version/crc/geometry) is deleted and re-indexing must
start after the newest position of the files before it. Memory holds one small record per file;
recovering an OPEN file reads its slot table (slots x 4 B) once and scans entries in chunks.

Threads: ``put`` is called by one writer (the Raft apply thread); ``query``, ``max_position`` from
any thread. ``_lock`` guards the file list and each file's counters and is held for one put. Readers
snapshot the file list and walk chains without the lock: an entry is complete before the slot
points at it and prev links only point backwards, so a walk never sees a half-written entry.
Retention drops its references to a deleted file and CPython unmaps it once the last reader is done.
``_flush_lock`` serialises flush, roll, retention and close (lock order: _flush_lock, _lock).
"""

from __future__ import annotations

import array
import logging
import mmap
import os
import struct
import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from dledger.durable import fsync_dir, fsync_path

__all__ = [
    "ENTRY_SIZE",
    "HEADER_SIZE",
    "STATE_CLOSED",
    "STATE_OPEN",
    "STATE_SEALED",
    "HeaderError",
    "IndexHeader",
    "KeyIndex",
    "KeyIndexClosedError",
    "decode_header",
    "encode_header",
    "key_hash",
]

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<4sBBHIIIqqqqq")
_CRC = struct.Struct("<I")
HEADER_SIZE = 64
_SLOT = struct.Struct("<I")
_ENTRY = struct.Struct("<IQiI")
ENTRY_SIZE = _ENTRY.size  # 20
_SLOT_SIZE = _SLOT.size
_slot_unpack_from = _SLOT.unpack_from
_slot_pack_into = _SLOT.pack_into
_entry_pack_into = _ENTRY.pack_into
_MAGIC = b"RKIX"
_VERSION = 1
STATE_OPEN = 1
STATE_CLOSED = 2
STATE_SEALED = 3
_FLAG_UNORDERED = 1
_DIFF_MIN = -(2**31)
_DIFF_MAX = 2**31 - 1
_SUFFIX = ".kidx"
_SEQ_DIGITS = 10
_SCAN_CHUNK_ENTRIES = 1 << 16
assert _HEADER.size + _CRC.size <= HEADER_SIZE


class KeyIndexClosedError(RuntimeError):
    code = "KEY_INDEX_CLOSED"


class HeaderError(ValueError):
    """An index file header that cannot be trusted."""


@dataclass(frozen=True, slots=True)
class IndexHeader:
    state: int
    slots: int
    entries_max: int
    count: int
    base_ts: int
    begin_ts: int
    end_ts: int
    begin_pos: int
    end_pos: int
    ordered: bool = True  # positions grow with the entry number

    def file_bytes(self) -> int:
        return HEADER_SIZE + self.slots * _SLOT.size + self.entries_max * ENTRY_SIZE


def key_hash(topic: str, key: str) -> int:
    return zlib.crc32(f"{topic}#{key}".encode())


def encode_header(h: IndexHeader) -> bytes:
    body = _HEADER.pack(
        _MAGIC, _VERSION, h.state, 0 if h.ordered else _FLAG_UNORDERED, h.slots, h.entries_max, h.count,
        h.base_ts, h.begin_ts, h.end_ts, h.begin_pos, h.end_pos,
    )  # fmt: skip
    return (body + _CRC.pack(zlib.crc32(body))).ljust(HEADER_SIZE, b"\0")


def decode_header(raw: bytes) -> IndexHeader:
    """Parse and check a header; raises HeaderError naming what is wrong."""
    if len(raw) < HEADER_SIZE:
        raise HeaderError(f"short header ({len(raw)} bytes)")
    body = raw[: _HEADER.size]
    if _CRC.unpack_from(raw, _HEADER.size)[0] != zlib.crc32(body):
        raise HeaderError("header crc mismatch")
    magic, version, state, flags, slots, entries_max, count, base_ts, begin_ts, end_ts, begin_pos, end_pos = (
        _HEADER.unpack(body)
    )
    if magic != _MAGIC or version != _VERSION:
        raise HeaderError(f"bad magic/version {magic!r}/{version}")
    if state not in (STATE_OPEN, STATE_CLOSED, STATE_SEALED) or slots < 1 or not 0 <= count <= entries_max:
        raise HeaderError(f"bad state/geometry {state}/{slots}/{count}/{entries_max}")
    return IndexHeader(
        state, slots, entries_max, count, base_ts, begin_ts, end_ts, begin_pos, end_pos,
        ordered=not flags & _FLAG_UNORDERED,
    )  # fmt: skip


class _IndexFile:
    """One mapped file and its counters (guarded by KeyIndex._lock)."""

    __slots__ = (
        "base_ts", "begin_pos", "begin_ts", "count", "end_pos", "end_ts", "entries_max",
        "mm", "ordered", "path", "seq", "slots", "state",
    )  # fmt: skip

    def __init__(self, path: str, seq: int, mm: mmap.mmap, header: IndexHeader):
        self.path = path
        self.seq = seq
        self.mm = mm
        self.slots = header.slots
        self.entries_max = header.entries_max
        self.state = header.state  # as last written to the header
        self.count = header.count
        self.base_ts = header.base_ts
        self.begin_ts = header.begin_ts
        self.end_ts = header.end_ts
        self.begin_pos = header.begin_pos
        self.end_pos = header.end_pos
        self.ordered = header.ordered

    def header(self, state: int) -> IndexHeader:
        return IndexHeader(
            state, self.slots, self.entries_max, self.count,
            self.base_ts, self.begin_ts, self.end_ts, self.begin_pos, self.end_pos, self.ordered,
        )  # fmt: skip

    def entry_offset(self, n: int) -> int:
        return HEADER_SIZE + self.slots * _SLOT.size + (n - 1) * ENTRY_SIZE

    def write_header(self, state: int) -> None:
        """Write the header for the current counters and msync it. Caller holds _flush_lock."""
        self.store_header(self.header(state))

    def store_header(self, header: IndexHeader) -> None:
        self.mm[:HEADER_SIZE] = encode_header(header)
        fsync_path(self.path)
        self.state = header.state


class KeyIndex:
    """The key index under ``root``; see the module docstring for the format, recovery and threads."""

    def __init__(self, root: str, slots: int = 500_000, entries_per_file: int = 2_000_000):
        assert slots > 0 and entries_per_file > 0
        self._root = root
        self._slots = slots
        self._entries_max = entries_per_file
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._files: list[_IndexFile] = []  # oldest first
        self._active: _IndexFile | None = None  # takes puts; the last file unless it is sealed
        self._rebuild_from: int | None = None
        self._next_seq = 0  # file sequence numbers are not reused while the process runs
        self._closed = False
        os.makedirs(root, exist_ok=True)
        self._recover()

    # -- recovery ----------------------------------------------------------------------------

    def _recover(self) -> None:
        seqs = sorted(
            int(n[: -len(_SUFFIX)])
            for n in os.listdir(self._root)
            if n.endswith(_SUFFIX) and n[: -len(_SUFFIX)].isdigit()
        )
        self._next_seq = seqs[-1] + 1 if seqs else 0
        trusted_end = -1  # newest position held by the files kept so far
        for seq in seqs:
            path = self._path(seq)
            try:
                f = self._open_file(path, seq)
            except HeaderError as e:
                log.warning("%s: %s; deleting it, re-index from position %d", path, e, trusted_end + 1)
                os.unlink(path)
                self._note_rebuild(trusted_end + 1)
                continue
            if f.state == STATE_OPEN:  # not cleanly closed: trust only what the header counts
                self._repair_unclean(f)
                self._note_rebuild(max(trusted_end, f.end_pos) + 1)
            trusted_end = max(trusted_end, f.end_pos)
            self._files.append(f)
        for f in self._files[:-1]:
            if f.state != STATE_SEALED:
                f.write_header(STATE_SEALED)
        if self._files and self._files[-1].state != STATE_SEALED:
            self._active = self._files[-1]
            self._active.write_header(STATE_OPEN)  # before any put can dirty it
        fsync_dir(self._root)

    def _note_rebuild(self, position: int) -> None:
        if self._rebuild_from is None or position < self._rebuild_from:
            self._rebuild_from = position

    def _open_file(self, path: str, seq: int) -> _IndexFile:
        fd = os.open(path, os.O_RDWR)
        try:
            header = decode_header(os.pread(fd, HEADER_SIZE, 0))
            size = os.fstat(fd).st_size
            if size != header.file_bytes():
                raise HeaderError(f"size {size} != {header.file_bytes()} for the header's geometry")
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return _IndexFile(path, seq, mm, header)

    def _repair_unclean(self, f: _IndexFile) -> None:
        """Make slots point only at entries 1..count (rebuilt from the entries when one points past)."""
        slots_bytes = f.slots * _SLOT.size
        heads = array.array("I")
        heads.frombytes(f.mm[HEADER_SIZE : HEADER_SIZE + slots_bytes])
        if heads.itemsize != _SLOT.size:  # pragma: no cover - every Linux/CPython has a 4-byte "I"
            raise AssertionError("array 'I' is not 4 bytes")
        if max(heads) <= f.count:
            return
        log.warning("%s: slots point past the %d flushed entries; rebuilding them", f.path, f.count)
        heads = array.array("I", bytes(slots_bytes))
        n = 1
        while n <= f.count:
            chunk = min(_SCAN_CHUNK_ENTRIES, f.count - n + 1)
            start = f.entry_offset(n)
            raw = f.mm[start : start + chunk * ENTRY_SIZE]
            for i, (h, _pos, _diff, _prev) in enumerate(_ENTRY.iter_unpack(raw)):
                heads[h % f.slots] = n + i
            n += chunk
        f.mm[HEADER_SIZE : HEADER_SIZE + slots_bytes] = heads.tobytes()
        f.mm.flush()

    # -- writing -----------------------------------------------------------------------------

    def put(self, topic: str, key: str, position: int, store_ts: int) -> None:
        """Index ``position`` under (topic, key). Called by the single writer thread."""
        self.put_many(((topic, key, position, store_ts),))

    def put_many(self, puts: Sequence[tuple[str, str, int, int]]) -> None:
        """``put`` of each ``(topic, key, position, store_ts)``, in order: one lock for as many as the
        active file takes (the same entries, slots and ranges as putting them one by one)."""
        i, n_puts = 0, len(puts)
        while i < n_puts:
            store_ts = puts[i][3]
            f = self._active
            if f is None or f.count >= f.entries_max or not _DIFF_MIN <= store_ts - f.base_ts <= _DIFF_MAX:
                f = self._roll(store_ts)
            with self._lock:
                mm, slots, base_ts, entries_max = f.mm, f.slots, f.base_ts, f.entries_max
                entries_at = HEADER_SIZE + slots * _SLOT_SIZE - ENTRY_SIZE  # entry n at + n * ENTRY_SIZE
                n = f.count
                while i < n_puts:
                    topic, key, position, store_ts = puts[i]
                    if n >= entries_max or not _DIFF_MIN <= store_ts - base_ts <= _DIFF_MAX:
                        break  # the next file's (rolled above, outside the lock)
                    h = zlib.crc32(f"{topic}#{key}".encode())
                    n += 1
                    slot_at = HEADER_SIZE + (h % slots) * _SLOT_SIZE
                    _entry_pack_into(mm, entries_at + n * ENTRY_SIZE, h, position, store_ts - base_ts,
                                     _slot_unpack_from(mm, slot_at)[0])
                    _slot_pack_into(mm, slot_at, n)  # after the entry: readers follow slots
                    if n == 1:
                        f.begin_ts = f.end_ts = store_ts
                        f.begin_pos = f.end_pos = position
                    else:
                        if store_ts < f.begin_ts:
                            f.begin_ts = store_ts
                        if store_ts > f.end_ts:
                            f.end_ts = store_ts
                        if position > f.end_pos:
                            f.end_pos = position
                        else:
                            f.ordered = False
                            if position < f.begin_pos:
                                f.begin_pos = position
                    f.count = n
                    i += 1

    def _roll(self, base_ts: int) -> _IndexFile:
        """Seal the active file (if any) and start a new one whose ts diffs count from ``base_ts``."""
        with self._flush_lock:
            if self._closed:
                raise KeyIndexClosedError(f"{self._root}: key index closed")
            old = self._active
            if old is not None:
                old.mm.flush()
                with self._lock:
                    old.write_header(STATE_SEALED)
            seq = self._next_seq
            self._next_seq += 1
            header = IndexHeader(STATE_OPEN, self._slots, self._entries_max, 0, base_ts, 0, 0, -1, -1)
            path = self._path(seq)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.ftruncate(fd, header.file_bytes())  # sparse
                mm = mmap.mmap(fd, header.file_bytes())
            finally:
                os.close(fd)
            f = _IndexFile(path, seq, mm, header)
            f.write_header(STATE_OPEN)
            fsync_dir(self._root)
            with self._lock:
                self._files.append(f)
                self._active = f
            return f

    def flush(self) -> None:
        """msync the active file, then record its count and ranges in its header: the durable point."""
        with self._flush_lock:
            f = self._active
            if f is None:
                return
            with self._lock:
                snapshot = f.header(STATE_OPEN)  # every entry it counts is in the mapping
            fsync_path(f.path)  # unlike mmap.flush, os.fsync releases the GIL
            f.store_header(snapshot)

    def delete_before_position(self, log_first_position: int) -> int:
        """Drop whole files whose newest position is below ``log_first_position``; returns how many."""
        with self._flush_lock, self._lock:
            doomed = [
                f
                for f in self._files
                if f.end_pos < log_first_position and (f.count > 0 or f is not self._active)
            ]
            for f in doomed:
                self._files.remove(f)
                if f is self._active:
                    self._active = None
                os.unlink(f.path)
                log.info("deleted key index file %s (end position %d)", f.path, f.end_pos)
            # The mappings close when the last reader drops its snapshot (CPython refcounting).
        return len(doomed)

    def close(self) -> None:
        with self._flush_lock:
            if self._closed:
                return
            self._closed = True
            f = self._active
            if f is not None:
                f.mm.flush()
                with self._lock:
                    f.write_header(STATE_CLOSED)
            with self._lock:
                for f in self._files:
                    f.mm.close()
                self._files = []
                self._active = None

    # -- reading -----------------------------------------------------------------------------

    def query(
        self, topic: str, key: str, max_count: int = 64, begin_ts: int = 0, end_ts: int = 2**63 - 1
    ) -> list[int]:
        """Candidate positions for (topic, key) stored in [begin_ts, end_ts] (ms, inclusive), newest
        (highest position) first, deduplicated, at most ``max_count``."""
        if max_count <= 0:
            return []
        h = key_hash(topic, key)
        with self._lock:
            files = self._files[::-1]
        found: set[int] = set()
        for f in files:
            if f.count == 0 or f.end_ts < begin_ts or f.begin_ts > end_ts:
                continue
            if len(found) >= max_count and f.end_pos < min(found):
                continue  # only positions older than all we hold (positions grow with file order)
            found.update(self._walk(f, h, max_count, begin_ts, end_ts))
            if len(found) > max_count:
                found = set(sorted(found, reverse=True)[:max_count])
        return sorted(found, reverse=True)

    @staticmethod
    def _walk(f: _IndexFile, h: int, max_count: int, begin_ts: int, end_ts: int) -> set[int]:
        """The highest ``max_count`` positions for hash ``h`` in one file. In an ordered file they are
        the first ones on the chain (newest entry first); otherwise the whole chain is read."""
        mm = f.mm
        entries_base = HEADER_SIZE + f.slots * _SLOT.size
        n = _SLOT.unpack_from(mm, HEADER_SIZE + (h % f.slots) * _SLOT.size)[0]
        stop_at_max = f.ordered
        out: set[int] = set()
        limit = f.entries_max
        while 0 < n <= limit:
            eh, pos, diff, prev = _ENTRY.unpack_from(mm, entries_base + (n - 1) * ENTRY_SIZE)
            if eh == h and begin_ts <= f.base_ts + diff <= end_ts:
                out.add(pos)
                if len(out) >= max_count:
                    if stop_at_max:
                        break
                    if len(out) >= 2 * max_count:  # bounded memory on a long unordered chain
                        out = set(sorted(out, reverse=True)[:max_count])
            limit = n - 1  # links only point backwards: the walk ends
            n = prev
        return out

    def max_position(self) -> int:
        """Highest position indexed so far (-1 when empty): indexing resumes after it."""
        with self._lock:
            return max((f.end_pos for f in self._files), default=-1)

    def last_update(self) -> tuple[int, int]:
        """(store ts, position) of the newest entry indexed so far ((0, 0) when empty): RocketMQ's
        ``indexLastUpdateTimestamp`` / ``indexLastUpdatePhyoffset`` of a query answer."""
        with self._lock:
            live = [f for f in self._files if f.count > 0]
            if not live:
                return 0, 0
            return max(f.end_ts for f in live), max(f.end_pos for f in live)

    def needs_rebuild_from(self) -> int | None:
        """Lowest position to re-index because open discarded unflushed or damaged index data."""
        return self._rebuild_from

    def files(self) -> list[tuple[str, int, int, int]]:
        """(path, entry count, begin position, end position) per file, oldest first."""
        with self._lock:
            return [(f.path, f.count, f.begin_pos, f.end_pos) for f in self._files]

    def _path(self, seq: int) -> str:
        return os.path.join(self._root, f"{seq:0{_SEQ_DIGITS}d}{_SUFFIX}")


