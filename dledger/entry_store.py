"""EntryStore: the segmented, checksummed Raft log on disk (record formats in ``entry_codec``).

Layout under ``path``::

    anchor                        (anchor_index, anchor_term, anchor_chain_crc, floor_position),
                                  replaced atomically (write tmp, fsync, rename, fsync dir)
    log/00000000000000000000      segment: entries back to back, then an optional BLANK marker
    log/00000000001073741824      next segment: previous start + segment_bytes
    index/00000000000000000000    24-byte index records, slot i - base for Raft index i,
    index/00000000000001048576    base = i - i % index_records_per_file

    global position:  0 ........... S ............ 2S ........... 3S
                      | seg 0       | seg 1        | seg 2 (last)  |
                      [e1][e2][e3]B [e4][e5]....B  [e9][e10]       <- appends go here
                      ^ floor_position                       ^ next_position

Invariants:
- The store holds entries ``anchor_index + 1 .. last_index``, contiguous, terms non-decreasing,
  each chain CRC derived from the one before (the first from ``anchor_chain_crc``).
- An entry lives in one segment; its header records its global position (segment start +
  offset). Positions are per replica and never reused: they only grow, across truncation,
  retention and ``reset`` (which continues at the next segment boundary, not at 0).
- Segment files below ``floor_position`` are gone (recovery finishes an interrupted deletion).
- The log segments are the truth; index records are derived and rebuilt from them on open.
- RAM does not grow with the bytes stored: no mmap and no per-entry state; memory holds one
  small record per segment and per index file plus the last entry's (index, term, chain_crc).
- Recovery fully scans only the last segment. Earlier segments are checked at their boundaries
  (first header, last index record and header, file end) and scanned only when these disagree.
  A torn tail of the last segment (an incomplete or bad record with no valid header after it)
  is cut off with a WARNING; any other damage raises CorruptStoreError naming file and offset.

Threads: one writer (the Raft tick thread) calls every mutating method; ``read``, ``read_range``,
``term_at``, ``chain_crc_at``, ``position_at``, ``read_at_position`` and ``segments`` may be called
from any thread. ``_lock`` guards the segment table, the index-file table and ``last_*``. Readers
snapshot under the lock, pin the file they read (a retired file is closed by its last reader),
read without the lock, and re-check ``_generation`` (bumped by ``truncate_suffix`` and ``reset``)
afterwards: a read that raced with one is retried and finally fails with StaleReadError, it never
returns bytes from a replaced entry. Retention does not replace entries: a read pinned to a segment
it removes still returns that (valid) entry; a later one gets IndexOutOfRangeError.

Durability: appends reach the page cache; ``flush()`` fdatasyncs the dirty files (and fsyncs the
directories that gained files). ``truncate_suffix``, ``reset`` and ``delete_segments_before`` are
durable when they return.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import TypeVar

from dledger.clock import SYSTEM, Clock
from dledger.durable import fsync_dir
from dledger.entry_codec import (
    BLANK_BYTES,
    BLANK_SIZE,
    HEADER_SIZE,
    INDEX_RECORD_SIZE,
    CorruptEntryError,
    EntryHeader,
    IndexRecord,
    StoreError,
    check_record,
    decode_header,
    decode_index_record,
    encode_header,
    follows,
    is_blank,
    pack_header,
    pack_index_record,
    valid_header_after,
)
from dledger.log_store import (
    CorruptStoreError,
    Entry,
    EntryTooLargeError,
    IndexOutOfRangeError,
    PositionOutOfRangeError,
    SegmentInfo,
    StaleReadError,
    StoreClosedError,
)

__all__ = [
    "CorruptEntryError",
    "CorruptStoreError",
    "Entry",
    "EntryStore",
    "EntryTooLargeError",
    "IndexOutOfRangeError",
    "PositionOutOfRangeError",
    "SegmentInfo",
    "StaleReadError",
    "StoreClosedError",
    "StoreError",
]

log = logging.getLogger(__name__)

_ANCHOR = struct.Struct("<IHHQQIQ")  # magic, version, reserved, index, term, chain_crc, floor_position
_ANCHOR_CRC = struct.Struct("<I")
_ANCHOR_MAGIC = 0xD1ED0A1C
_ANCHOR_VERSION = 1
_ANCHOR_FILE = "anchor"
_NAME_DIGITS = 20
_SCAN_CHUNK_BYTES = 1 << 20
_RANGE_CHUNK_RECORDS = 4096
_IOV_MAX = 512
_READ_ATTEMPTS = 4

T = TypeVar("T")


class _File:
    """An open file that readers pin while they pread; closed once retired and unpinned."""

    __slots__ = ("fd", "path", "pins", "retired")

    def __init__(self, path: str, fd: int):
        self.path = path
        self.fd = fd
        self.pins = 0
        self.retired = False


class _Segment:
    __slots__ = ("file", "first_index", "last_index", "sealed", "sealed_wall_s", "size", "start")

    def __init__(self, start: int, file: _File, size: int, first_index: int):
        self.start = start
        self.file = file
        self.size = size  # bytes published to readers (entries, and the BLANK marker once sealed)
        self.first_index = first_index
        self.last_index = first_index - 1  # empty until an entry is published
        self.sealed = False  # ends with BLANK or is full: the next entry goes to a new segment
        self.sealed_wall_s: float | None = None  # when it was sealed, on the store's clock


def _name(n: int) -> str:
    return f"{n:0{_NAME_DIGITS}d}"


def _numbered(directory: str) -> list[int]:
    names = os.listdir(directory)
    odd = [n for n in names if not (len(n) == _NAME_DIGITS and n.isdigit()) and not n.endswith(".tmp")]
    if odd:
        log.warning("ignoring unexpected files in %s: %s", directory, sorted(odd))
    return sorted(int(n) for n in names if len(n) == _NAME_DIGITS and n.isdigit())




def _pwrite_all(fd: int, parts: Sequence[bytes], offset: int, total: int = -1) -> None:
    """Write ``parts`` back to back at ``offset`` (``total``: their summed size, when known)."""
    if total >= 0 and len(parts) <= _IOV_MAX and os.pwritev(fd, parts, offset) == total:
        return  # the common case: one syscall, complete
    for k in range(0, len(parts), _IOV_MAX):
        chunk = parts[k : k + _IOV_MAX]
        want = sum(len(p) for p in chunk)
        done = os.pwritev(fd, chunk, offset)
        if done < want:  # short write (rare on regular files): finish it byte-wise
            rest = memoryview(b"".join(chunk))[done:]
            while rest:
                n = os.pwrite(fd, rest, offset + done)
                done += n
                rest = rest[n:]
        offset += want


class EntryStore:
    header_bytes = HEADER_SIZE  # body of the entry at position p starts at p + header_bytes

    def __init__(
        self,
        path: str,
        segment_bytes: int = 1 << 30,
        index_records_per_file: int = 1 << 20,
        clock: Clock = SYSTEM,
    ):
        if segment_bytes < 2 * HEADER_SIZE:
            raise ValueError(f"segment_bytes must be at least {2 * HEADER_SIZE}")
        if index_records_per_file < 1:
            raise ValueError("index_records_per_file must be positive")
        self.path = path
        self.segment_bytes = segment_bytes
        self.index_records_per_file = index_records_per_file
        self._clock = clock
        self._log_dir = os.path.join(path, "log")
        self._index_dir = os.path.join(path, "index")
        self._lock = threading.Lock()
        self._generation = 0
        self._closed = False
        self._segments: list[_Segment] = []
        self._starts: list[int] = []  # segment start positions, for bisect
        self._index_files: dict[int, _File] = {}
        self._dirty_files: set[_File] = set()
        self._dirty_dirs: set[str] = set()
        self._anchor: tuple[int, int, int] = (0, 0, 0)
        self._floor_position = 0
        self._last: tuple[int, int, int] = (0, 0, 0)  # index, term, chain_crc of the last entry
        try:
            self._recover()
        except BaseException:
            self._close_all()
            raise

    # -- state --------------------------------------------------------------------------------
    @property
    def anchor(self) -> tuple[int, int, int]:
        return self._anchor

    @property
    def first_index(self) -> int:
        return self._anchor[0] + 1

    @property
    def last_index(self) -> int:
        return self._last[0]

    @property
    def last_term(self) -> int:
        return self._last[1]

    @property
    def last_chain_crc(self) -> int:
        return self._last[2]

    @property
    def next_position(self) -> int:
        """Where the next entry goes if it fits the current segment."""
        with self._lock:
            return self._next_position_locked()

    @property
    def bytes_stored(self) -> int:
        with self._lock:
            return sum(seg.size for seg in self._segments)

    @property
    def dirty(self) -> bool:
        return bool(self._dirty_files or self._dirty_dirs)

    def _next_position_locked(self) -> int:
        if not self._segments:
            return self._floor_position
        seg = self._segments[-1]
        return self._next_segment_start(seg) if seg.sealed else seg.start + seg.size

    def _next_segment_start(self, seg: _Segment) -> int:
        return seg.start + max(self.segment_bytes, seg.size)

    # -- files ----------------------------------------------------------------------------------
    @staticmethod
    def _open_file(path: str, flags: int = 0) -> _File:
        return _File(path, os.open(path, os.O_RDWR | flags, 0o644))

    def _retire(self, f: _File) -> None:
        """Caller holds the lock. The file leaves the tables; its last reader closes it."""
        f.retired = True
        self._dirty_files.discard(f)
        if f.pins == 0:
            os.close(f.fd)

    def _unpin(self, f: _File) -> None:
        with self._lock:
            f.pins -= 1
            if f.retired and f.pins == 0:
                os.close(f.fd)

    def _pread_pinned(self, f: _File, size: int, offset: int) -> bytes:
        """pread from ``f``, which the caller pinned under the lock; unpins it."""
        try:
            return os.pread(f.fd, size, offset)
        finally:
            self._unpin(f)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"entry store {self.path} is closed")

    def _index_base(self, index: int) -> int:
        return index - index % self.index_records_per_file

    def _index_slot(self, index: int) -> int:
        return (index % self.index_records_per_file) * INDEX_RECORD_SIZE

    # -- reads (any thread) ------------------------------------------------------------------------
    def _consistent(self, op: Callable[[], T], what: str) -> T:
        """Run a read; if truncate_suffix/reset ran meanwhile, run it again (bounded)."""
        for _ in range(_READ_ATTEMPTS):
            generation = self._generation
            try:
                result = op()
            except (CorruptEntryError, OSError):
                if self._generation == generation:
                    raise
                continue
            if self._generation == generation:
                return result
        raise StaleReadError(f"{what}: the log kept changing under the read ({_READ_ATTEMPTS} attempts)")

    def _check_held(self, first: int, last: int) -> None:
        """Caller holds the lock."""
        self._check_open()
        if first < self.first_index or last > self._last[0]:
            raise IndexOutOfRangeError(
                f"indexes {first}..{last} are outside the store [{self.first_index}, {self._last[0]}]"
            )

    def _records(self, first: int, count: int) -> list[IndexRecord]:
        """Index records from ``first`` on: ``count`` at most, all from one index file."""
        base = self._index_base(first)
        count = min(count, base + self.index_records_per_file - first)
        with self._lock:
            self._check_held(first, first + count - 1)
            f = self._index_files.get(base)
            if f is None:
                raise CorruptEntryError(f"index file {_name(base)} for held index {first} is missing")
            f.pins += 1
        offset = self._index_slot(first)
        raw = self._pread_pinned(f, count * INDEX_RECORD_SIZE, offset)
        if len(raw) < count * INDEX_RECORD_SIZE:
            raise CorruptEntryError(f"{f.path}: index records for {first}..{first + count - 1} are missing")
        out = []
        for k in range(count):
            try:
                out.append(decode_index_record(raw, k * INDEX_RECORD_SIZE))
            except CorruptEntryError as exc:
                raise CorruptEntryError(
                    f"{f.path} at offset {offset + k * INDEX_RECORD_SIZE}: {exc}"
                ) from None
        return out

    def _entries(self, first: int, records: list[IndexRecord]) -> list[Entry]:
        """Read and verify the entries ``records`` describe (one pread per contiguous run)."""
        out: list[Entry] = []
        k = 0
        while k < len(records):
            start = records[k].position
            with self._lock:
                self._check_open()
                seg = self._segment_at(start)
                if seg is None:
                    self._check_held(first + k, first + k)  # retention may just have removed it
                    raise CorruptEntryError(
                        f"index record of entry {first + k} points at {start}, not in the log"
                    )
                seg.file.pins += 1
                seg_end = seg.start + seg.size
            end = start
            j = k
            while j < len(records) and records[j].position == end and end + records[j].total_size <= seg_end:
                end += records[j].total_size
                j += 1
            if j == k:
                self._unpin(seg.file)
                raise CorruptEntryError(f"entry {first + k} at {start} runs past the end of {seg.file.path}")
            raw = self._pread_pinned(seg.file, end - start, start - seg.start)
            view = memoryview(raw)
            for m in range(k, j):
                out.append(self._verified(view, records[m].position - start, first + m, records[m], seg))
            k = j
        return out

    def _verified(self, view: memoryview, at: int, index: int, rec: IndexRecord, seg: _Segment) -> Entry:
        where = f"{seg.file.path} at offset {rec.position - seg.start}"
        if len(view) < at + rec.total_size:
            raise CorruptEntryError(f"{where}: short read of entry {index}")
        try:
            head = decode_header(view, at)
        except CorruptEntryError as exc:
            raise CorruptEntryError(f"{where}: entry {index}: {exc}") from None
        if (head.index, head.term, head.position, head.total_size, head.chain_crc) != (
            index,
            rec.term,
            rec.position,
            rec.total_size,
            rec.chain_crc,
        ):
            raise CorruptEntryError(
                f"{where}: header {head} does not match the index record of entry {index}"
            )
        body = bytes(view[at + HEADER_SIZE : at + head.total_size])
        if zlib.crc32(body) != head.body_crc:
            raise CorruptEntryError(f"{where}: body crc mismatch in entry {index}")
        return Entry(index, head.term, head.position, body, head.chain_crc)

    def _segment_at(self, position: int) -> _Segment | None:
        """Caller holds the lock. The segment whose published bytes contain ``position``."""
        k = bisect.bisect_right(self._starts, position) - 1
        if k < 0:
            return None
        seg = self._segments[k]
        return seg if position < seg.start + seg.size else None

    def read(self, index: int) -> Entry:
        """The entry at ``index``, verified; IndexOutOfRangeError outside [first_index, last_index]."""

        def once() -> Entry:
            return self._entries(index, self._records(index, 1))[0]

        return self._consistent(once, f"read({index})")

    def read_range(self, first: int, max_count: int, max_bytes: int) -> list[Entry]:
        """Up to ``max_count`` entries from ``first`` whose bodies total at most ``max_bytes``, but at
        least one when ``first`` is held. ``[]`` when ``first > last_index``."""
        with self._lock:
            self._check_open()
            if first < self.first_index:
                raise IndexOutOfRangeError(
                    f"index {first} is below the store's first index {self.first_index}"
                )
            if first > self._last[0] or max_count <= 0:
                return []

        def once() -> list[Entry]:
            out: list[Entry] = []
            body_bytes = 0
            index = first
            last = min(self._last[0], first + max_count - 1)
            chunk = 16  # grows: a small max_bytes should not read thousands of index records
            while index <= last:
                take: list[IndexRecord] = []
                chunk = min(chunk * 4, _RANGE_CHUNK_RECORDS)
                for rec in self._records(index, min(last - index + 1, chunk)):
                    size = rec.total_size - HEADER_SIZE
                    if (out or take) and body_bytes + size > max_bytes:
                        break
                    body_bytes += size
                    take.append(rec)
                if not take:
                    break
                out.extend(self._entries(index, take))
                index += len(take)
                if body_bytes >= max_bytes:
                    break
            return out

        return self._consistent(once, f"read_range({first})")

    def _record_or_anchor(self, index: int, what: str) -> tuple[int, int]:
        """(term, chain_crc) of ``index``, which may be the anchor."""
        with self._lock:
            self._check_open()
            if index == self._anchor[0]:
                return self._anchor[1], self._anchor[2]
            if index == self._last[0]:
                return self._last[1], self._last[2]
        rec = self._consistent(lambda: self._records(index, 1)[0], f"{what}({index})")
        return rec.term, rec.chain_crc

    def term_at(self, index: int) -> int:
        """Term of ``index`` in [anchor_index, last_index] (0 for index 0 on a fresh store)."""
        return self._record_or_anchor(index, "term_at")[0]

    def chain_crc_at(self, index: int) -> int:
        return self._record_or_anchor(index, "chain_crc_at")[1]

    def position_at(self, index: int) -> int:
        return self._consistent(lambda: self._records(index, 1)[0].position, f"position_at({index})")

    def read_at_position(self, position: int, size: int) -> bytes:
        """Raw log bytes at a global position; they must lie inside one segment's published bytes."""

        def once() -> bytes:
            with self._lock:
                self._check_open()
                seg = self._segment_at(position)
                if seg is None or size < 0 or position + size > seg.start + seg.size:
                    raise PositionOutOfRangeError(f"{size} bytes at position {position} are not in the log")
                seg.file.pins += 1
            raw = self._pread_pinned(seg.file, size, position - seg.start)
            if len(raw) != size:
                raise CorruptEntryError(f"{seg.file.path}: short read at offset {position - seg.start}")
            return raw

        return self._consistent(once, f"read_at_position({position})")

    # -- appends (writer thread) ------------------------------------------------------------------
    def append(self, index: int, term: int, body: bytes) -> int:
        """Append entry ``index`` (must be last_index + 1); returns its header's global position."""
        self._check_open()
        entry = ((index, term, body),)
        self._check_appendable(entry)
        seg = self._segments[-1] if self._segments else None
        if seg is None or seg.sealed or seg.size + HEADER_SIZE + len(body) > self.segment_bytes:
            seg = self._roll(seg)
        return self._write_run(seg, entry)[0]

    def append_many(self, entries: Sequence[tuple[int, int, bytes]]) -> list[int]:
        """Append consecutive entries with one write per segment and index file touched."""
        self._check_open()
        self._check_appendable(entries)
        positions: list[int] = []
        seg = self._segments[-1] if self._segments else None
        run_first = 0
        run_bytes = 0
        for k, (_, _, body) in enumerate(entries):
            total = HEADER_SIZE + len(body)
            if seg is None or seg.sealed or seg.size + run_bytes + total > self.segment_bytes:
                positions += self._write_run(seg, entries[run_first:k])
                seg = self._roll(seg)
                run_first, run_bytes = k, 0
            run_bytes += total
        positions += self._write_run(seg, entries[run_first:])
        return positions

    def _check_appendable(self, entries: Sequence[tuple[int, int, bytes]]) -> None:
        index, term, _ = self._last
        for k, (i, t, body) in enumerate(entries):
            if i != index + 1 + k:
                raise ValueError(f"append of index {i}: expected {index + 1 + k}")
            if t < term:
                raise ValueError(f"append of index {i} with term {t} after term {term}")
            term = t
            if HEADER_SIZE + len(body) > self.segment_bytes:
                raise EntryTooLargeError(
                    f"entry {i} of {len(body)} body bytes does not fit a segment of {self.segment_bytes} "
                    f"bytes (max body {self.segment_bytes - HEADER_SIZE})"
                )

    def _write_run(self, seg: _Segment | None, run: Sequence[tuple[int, int, bytes]]) -> list[int]:
        """Write entries that all fit ``seg`` after its published bytes, then publish them."""
        if not run:
            return []
        assert seg is not None and not seg.sealed
        parts: list[bytes] = []
        records: list[bytes] = []
        positions: list[int] = []
        prev_chain = self._last[2]
        position = seg.start + seg.size
        head: EntryHeader | None = None
        for index, term, body in run:
            head = encode_header(index, term, position, body, prev_chain)
            parts += (pack_header(head), body)
            records.append(pack_index_record(position, term, head.total_size, head.chain_crc))
            positions.append(position)
            prev_chain = head.chain_crc
            position += head.total_size
        assert head is not None and position - seg.start <= self.segment_bytes
        _pwrite_all(seg.file.fd, parts, seg.size, position - seg.start - seg.size)
        self._write_records(run[0][0], records)
        with self._lock:
            if seg.size == 0:
                seg.first_index = run[0][0]
            seg.size = position - seg.start
            seg.last_index = head.index
            self._last = (head.index, head.term, head.chain_crc)
            self._dirty_files.add(seg.file)
        return positions

    def _write_records(self, first: int, records: list[bytes]) -> None:
        k = 0
        while k < len(records):
            index = first + k
            base = self._index_base(index)
            n = min(len(records) - k, base + self.index_records_per_file - index)
            f = self._index_file_for_write(base)
            chunk = records if n == len(records) else records[k : k + n]
            _pwrite_all(f.fd, chunk, self._index_slot(index), n * INDEX_RECORD_SIZE)
            self._dirty_files.add(f)
            k += n

    def _index_file_for_write(self, base: int) -> _File:
        f = self._index_files.get(base)
        if f is None:
            f = self._open_file(os.path.join(self._index_dir, _name(base)), os.O_CREAT)
            with self._lock:
                self._index_files[base] = f
            self._dirty_dirs.add(self._index_dir)
        return f

    def _roll(self, seg: _Segment | None) -> _Segment:
        """Seal ``seg`` (BLANK marker if it has room) and open the next segment."""
        if seg is None:
            start = self._floor_position
        else:
            if not seg.sealed:
                size = seg.size
                if self.segment_bytes - size >= BLANK_SIZE:
                    os.pwrite(seg.file.fd, BLANK_BYTES, size)
                    size += BLANK_SIZE
                with self._lock:
                    seg.size, seg.sealed = size, True
                    self._dirty_files.add(seg.file)
            if seg.sealed_wall_s is None:
                seg.sealed_wall_s = self._clock.wall()
            start = self._next_segment_start(seg)
            # Seal: this segment and every index record so far become durable before the next
            # segment gets a byte, so after a crash only the last segment can be torn.
            self.flush()
        path = os.path.join(self._log_dir, _name(start))
        new = _Segment(start, self._open_file(path, os.O_CREAT | os.O_TRUNC), 0, 0)
        new.first_index = self._last[0] + 1
        new.last_index = self._last[0]
        with self._lock:
            self._segments.append(new)
            self._starts.append(start)
        self._dirty_dirs.add(self._log_dir)
        return new

    def flush(self) -> None:
        """fdatasync every file written since the last flush; fsync directories that gained files."""
        if not self.dirty:
            return
        for f in list(self._dirty_files):
            os.fdatasync(f.fd)
        for d in list(self._dirty_dirs):
            fsync_dir(d)
        self._dirty_files.clear()
        self._dirty_dirs.clear()

    # -- truncation, reset, retention (writer thread; durable on return) ----------------------------
    def truncate_suffix(self, from_index: int) -> None:
        """Drop entries ``>= from_index``; anchor_index < from_index <= last_index + 1."""
        self._check_open()
        if not self._anchor[0] < from_index <= self._last[0] + 1:
            raise IndexOutOfRangeError(
                f"truncate_suffix({from_index}) outside ({self._anchor[0]}, {self._last[0] + 1}]"
            )
        if from_index == self._last[0] + 1:
            return
        cut = self.read(from_index).position  # verified: a bad index record must not cut elsewhere
        if from_index - 1 == self._anchor[0]:
            prev = self._anchor
        else:
            rec = self._records(from_index - 1, 1)[0]
            prev = (from_index - 1, rec.term, rec.chain_crc)
        base = self._index_base(from_index)
        with self._lock:
            k = bisect.bisect_right(self._starts, cut) - 1
            assert k >= 0 and cut < self._segments[k].start + self._segments[k].size, "cut outside the log"
            seg = self._segments[k]
            doomed = self._segments[k + 1 :]
            del self._segments[k + 1 :], self._starts[k + 1 :]
            doomed_index = [b for b in self._index_files if b > base]
            doomed_files = [s.file for s in doomed] + [self._index_files.pop(b) for b in doomed_index]
            self._generation += 1
            seg.size, seg.sealed, seg.last_index = cut - seg.start, False, from_index - 1
            if seg.size == 0:
                seg.first_index = from_index
            self._last = prev
            for f in doomed_files:
                self._retire(f)
        # Later segments go first: a crash in between leaves a shorter, still contiguous log (only
        # entries >= from_index can be lost, and those were being dropped), never a gap.
        for f in reversed(doomed_files):
            os.unlink(f.path)
        fsync_dir(self._log_dir)
        fsync_dir(self._index_dir)
        os.ftruncate(seg.file.fd, seg.size)
        os.fdatasync(seg.file.fd)
        self._dirty_files.discard(seg.file)
        index_file = self._index_files.get(base)
        if index_file is not None:
            os.ftruncate(index_file.fd, self._index_slot(from_index))
            self._dirty_files.add(index_file)
        self.flush()  # what is left is durable when this returns (index files included)

    def reset(self, anchor_index: int, anchor_term: int, anchor_chain_crc: int) -> None:
        """Drop every entry; the log continues after this anchor (a follower installed from a
        leader whose older entries are gone). Positions continue at the next segment boundary."""
        self._check_open()
        if anchor_index < 0 or anchor_term < 0 or not 0 <= anchor_chain_crc <= 0xFFFFFFFF:
            raise ValueError(f"bad anchor {(anchor_index, anchor_term, anchor_chain_crc)}")
        with self._lock:
            floor = self._next_segment_start(self._segments[-1]) if self._segments else self._floor_position
        # The anchor file is the commit point: on open, segments below its floor are deleted.
        self._write_anchor(anchor_index, anchor_term, anchor_chain_crc, floor)
        with self._lock:
            doomed_files = [s.file for s in self._segments] + list(self._index_files.values())
            self._segments.clear()
            self._starts.clear()
            self._index_files.clear()
            self._generation += 1
            self._anchor = (anchor_index, anchor_term, anchor_chain_crc)
            self._last = self._anchor
            self._floor_position = floor
            for f in doomed_files:
                self._retire(f)
        for start in _numbered(self._log_dir):
            os.unlink(os.path.join(self._log_dir, _name(start)))
        for base in _numbered(self._index_dir):
            os.unlink(os.path.join(self._index_dir, _name(base)))
        fsync_dir(self._log_dir)
        fsync_dir(self._index_dir)

    def segments(self) -> list[SegmentInfo]:
        with self._lock:
            self._check_open()
            return [
                SegmentInfo(
                    s.start,
                    s.first_index,
                    s.last_index,
                    s.size,
                    s.sealed_wall_s if s.sealed else None,
                    s.file.path,
                )
                for s in self._segments
            ]

    def delete_segments_before(self, index_floor: int) -> int:
        """Remove whole segments whose last index < ``index_floor``, never the one holding
        last_index; the anchor moves to the last removed entry. Returns segments removed."""
        self._check_open()
        doomed: list[_Segment] = []
        for seg in self._segments[:-1]:
            if seg.size == 0 or seg.last_index >= index_floor or seg.last_index >= self._last[0]:
                break
            doomed.append(seg)
        if not doomed:
            return 0
        anchor_index = doomed[-1].last_index
        rec = self._records(anchor_index, 1)[0]
        floor = self._segments[len(doomed)].start
        # Persist the anchor first: a crash before the unlinks leaves files below the floor,
        # which recovery deletes; never entries the anchor does not account for.
        self._write_anchor(anchor_index, rec.term, rec.chain_crc, floor)
        last_base = self._index_base(anchor_index + 1)
        with self._lock:
            del self._segments[: len(doomed)], self._starts[: len(doomed)]
            doomed_index = [b for b in self._index_files if b < last_base]
            doomed_files = [s.file for s in doomed] + [self._index_files.pop(b) for b in doomed_index]
            self._anchor = (anchor_index, rec.term, rec.chain_crc)
            self._floor_position = floor
            for f in doomed_files:
                self._retire(f)
        for f in doomed_files:
            os.unlink(f.path)
        fsync_dir(self._log_dir)
        fsync_dir(self._index_dir)
        return len(doomed)

    # -- anchor file ----------------------------------------------------------------------------
    def _write_anchor(self, index: int, term: int, chain: int, floor: int) -> None:
        payload = _ANCHOR.pack(_ANCHOR_MAGIC, _ANCHOR_VERSION, 0, index, term, chain, floor)
        path = os.path.join(self.path, _ANCHOR_FILE)
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _pwrite_all(fd, [payload, _ANCHOR_CRC.pack(zlib.crc32(payload))], 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(path + ".tmp", path)
        fsync_dir(self.path)

    def _read_anchor(self) -> tuple[int, int, int, int] | None:
        path = os.path.join(self.path, _ANCHOR_FILE)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        size = _ANCHOR.size + _ANCHOR_CRC.size
        if (
            len(raw) != size
            or zlib.crc32(raw[: _ANCHOR.size]) != _ANCHOR_CRC.unpack_from(raw, _ANCHOR.size)[0]
        ):
            raise CorruptStoreError(f"{path}: anchor record is damaged ({len(raw)} bytes)", path, 0)
        magic, version, _, index, term, chain, floor = _ANCHOR.unpack_from(raw)
        if magic != _ANCHOR_MAGIC or version != _ANCHOR_VERSION:
            raise CorruptStoreError(f"{path}: unknown anchor format 0x{magic:08x} v{version}", path, 0)
        return index, term, chain, floor

    # -- recovery -------------------------------------------------------------------------------
    def _recover(self) -> None:
        os.makedirs(self._log_dir, exist_ok=True)
        os.makedirs(self._index_dir, exist_ok=True)
        anchor_path = os.path.join(self.path, _ANCHOR_FILE)
        if os.path.exists(anchor_path + ".tmp"):
            os.unlink(anchor_path + ".tmp")  # an anchor write that never reached its rename
        anchor = self._read_anchor()
        starts = _numbered(self._log_dir)
        if anchor is None and starts:
            log.warning("%s is missing: the log must start at index 1", anchor_path)
        a_index, a_term, a_chain, floor = anchor if anchor is not None else (0, 0, 0, 0)
        self._anchor = (a_index, a_term, a_chain)
        self._last = self._anchor
        self._floor_position = floor
        self._open_segments([s for s in starts if s >= floor], [s for s in starts if s < floor])
        self._open_index_files(a_index)
        prev = self._anchor
        for k, seg in enumerate(self._segments):
            if k == len(self._segments) - 1:
                prev = self._scan(seg, prev, tail=True)
                continue
            agreed = self._boundaries_agree(seg, self._segments[k + 1], prev)
            if agreed is None:
                log.info("%s: index and segment boundaries disagree; scanning it", seg.file.path)
                agreed = self._scan(seg, prev, tail=False)
            prev = agreed
        self._last = prev
        self._trim_index_after(prev[0])
        for seg in self._segments:
            if seg.sealed or seg is not self._segments[-1]:
                seg.sealed = True
                seg.sealed_wall_s = self._clock.wall() - _age_on_filesystem_clock(seg.file.fd)
        if anchor is None:
            self._write_anchor(a_index, a_term, a_chain, floor)
        self.flush()

    def _open_segments(self, starts: list[int], below_floor: list[int]) -> None:
        for start in below_floor:  # a retention or reset that stopped after writing the anchor
            log.info("removing segment %s below the anchor's floor %d", _name(start), self._floor_position)
            os.unlink(os.path.join(self._log_dir, _name(start)))
            self._dirty_dirs.add(self._log_dir)
        for start in starts:
            f = self._open_file(os.path.join(self._log_dir, _name(start)))
            self._segments.append(_Segment(start, f, os.fstat(f.fd).st_size, 0))
            self._starts.append(start)
        for seg, nxt in zip(self._segments, self._segments[1:], strict=False):
            if seg.start + seg.size > nxt.start:
                raise CorruptStoreError(
                    f"{seg.file.path} at offset {nxt.start - seg.start}: runs into the next segment "
                    f"{nxt.file.path}",
                    seg.file.path,
                    nxt.start - seg.start,
                )
            if seg.size == 0:
                raise CorruptStoreError(
                    f"{seg.file.path} at offset 0: empty segment before the last one", seg.file.path, 0
                )

    def _open_index_files(self, anchor_index: int) -> None:
        per_file = self.index_records_per_file
        for base in _numbered(self._index_dir):
            path = os.path.join(self._index_dir, _name(base))
            if base % per_file:
                raise CorruptStoreError(
                    f"{path} at offset 0: name is not a multiple of index_records_per_file={per_file} "
                    "(was the setting changed? delete the index directory to rebuild it)",
                    path,
                    0,
                )
            if base + per_file - 1 <= anchor_index:  # covers removed entries only
                os.unlink(path)
                self._dirty_dirs.add(self._index_dir)
                continue
            self._index_files[base] = self._open_file(path)

    def _header_at(self, seg: _Segment, offset: int) -> EntryHeader:
        return decode_header(os.pread(seg.file.fd, HEADER_SIZE, offset))

    def _record_at(self, index: int) -> IndexRecord:
        f = self._index_files.get(self._index_base(index))
        if f is None:
            raise CorruptEntryError(f"no index file for {index}")
        return decode_index_record(os.pread(f.fd, INDEX_RECORD_SIZE, self._index_slot(index)))

    def _index_covers(self, first: int, last: int) -> bool:
        per_file = self.index_records_per_file
        for base in range(self._index_base(first), self._index_base(last) + 1, per_file):
            f = self._index_files.get(base)
            if f is None:
                return False
            if os.fstat(f.fd).st_size < (min(last, base + per_file - 1) - base + 1) * INDEX_RECORD_SIZE:
                return False
        return True

    def _boundaries_agree(
        self, seg: _Segment, nxt: _Segment, prev: tuple[int, int, int]
    ) -> tuple[int, int, int] | None:
        """The last entry of a segment that is not the last one, taken from the index when its first
        header, first and last index records, last header and file end agree; else None."""
        try:
            head = self._header_at(seg, 0)
            if follows(head, seg.start, prev) is not None:
                return None
            last = self._header_at(nxt, 0).index - 1
            if last < head.index or not self._index_covers(head.index, last):
                return None
            if self._record_at(head.index) != IndexRecord(
                seg.start, head.term, head.total_size, head.chain_crc
            ):
                return None
            rec = self._record_at(last)
            offset = rec.position - seg.start
            if not 0 <= offset <= seg.size - rec.total_size:
                return None
            tail = self._header_at(seg, offset)
            if (tail.index, tail.term, tail.position, tail.total_size, tail.chain_crc) != (
                last,
                rec.term,
                rec.position,
                rec.total_size,
                rec.chain_crc,
            ):
                return None
            end = offset + tail.total_size
            if seg.size != end and not (
                seg.size == end + BLANK_SIZE and is_blank(os.pread(seg.file.fd, BLANK_SIZE, end))
            ):
                return None
        except CorruptEntryError:
            return None
        seg.first_index, seg.last_index, seg.sealed = head.index, last, True
        return last, tail.term, tail.chain_crc

    def _scan(self, seg: _Segment, prev: tuple[int, int, int], tail: bool) -> tuple[int, int, int]:
        """Verify every record of ``seg`` and rewrite index records that differ. In the last
        segment (``tail``) a torn end is cut off; any other damage raises CorruptStoreError."""
        path = seg.file.path
        chunks = _Chunks(seg.file.fd)
        seg.first_index = prev[0] + 1
        records: list[bytes] = []
        offset = 0
        while offset < seg.size:
            rest = seg.size - offset
            if is_blank(chunks.view(offset, BLANK_SIZE)):
                if rest > BLANK_SIZE:
                    self._bad_record(
                        seg, offset + BLANK_SIZE, f"{rest - BLANK_SIZE} byte(s) after BLANK", tail
                    )
                seg.sealed = True
                break
            head, problem = check_record(chunks, offset, rest)
            if head is None:
                self._bad_record(seg, offset, problem, tail)
                break
            # Header and body verify, so we wrote this record: a gap here is damage, not a tear.
            gap = follows(head, seg.start + offset, prev)
            if gap is not None:
                raise CorruptStoreError(f"{path} at offset {offset}: {gap}", path, offset)
            records.append(pack_index_record(head.position, head.term, head.total_size, head.chain_crc))
            if len(records) == _RANGE_CHUNK_RECORDS:
                self._rewrite_records(head.index - len(records) + 1, records)
                records = []
            prev = (head.index, head.term, head.chain_crc)
            offset += head.total_size
        self._rewrite_records(prev[0] - len(records) + 1, records)
        seg.last_index = prev[0]
        return prev

    def _bad_record(self, seg: _Segment, offset: int, problem: str, tail: bool) -> None:
        path = seg.file.path
        if not tail:
            raise CorruptStoreError(
                f"{path} at offset {offset}: {problem} (not the last segment, so not a torn write)",
                path,
                offset,
            )
        if valid_header_after(seg.file.fd, seg.size, offset + 1, _SCAN_CHUNK_BYTES):
            raise CorruptStoreError(
                f"{path} at offset {offset}: {problem}; valid records follow it, so this is not a torn "
                "tail. Refusing to open: restore this replica from a healthy one.",
                path,
                offset,
            )
        log.warning(
            "torn tail in %s at offset %d (%s): truncating %d byte(s)",
            path,
            offset,
            problem,
            seg.size - offset,
        )
        os.ftruncate(seg.file.fd, offset)
        os.fdatasync(seg.file.fd)
        seg.size = offset

    def _rewrite_records(self, first: int, records: list[bytes]) -> None:
        """Write index records rebuilt from the log, skipping those already on disk."""
        k = 0
        while k < len(records):
            index = first + k
            base = self._index_base(index)
            n = min(len(records) - k, base + self.index_records_per_file - index)
            chunk = b"".join(records[k : k + n])
            f = self._index_file_for_write(base)
            if os.pread(f.fd, len(chunk), self._index_slot(index)) != chunk:
                _pwrite_all(f.fd, [chunk], self._index_slot(index))
                self._dirty_files.add(f)
            k += n

    def _trim_index_after(self, last_index: int) -> None:
        """Drop index records of entries past ``last_index`` (truncated or torn)."""
        base = self._index_base(last_index + 1)
        for b in [b for b in self._index_files if b > base]:
            doomed = self._index_files.pop(b)
            self._retire(doomed)
            os.unlink(doomed.path)
            self._dirty_dirs.add(self._index_dir)
        f = self._index_files.get(base)
        keep = self._index_slot(last_index + 1)
        if f is not None and os.fstat(f.fd).st_size > keep:
            os.ftruncate(f.fd, keep)
            self._dirty_files.add(f)

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Flush and close; idempotent. Readers still inside a pread finish first."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._close_all()

    def _close_all(self) -> None:
        with self._lock:
            self._closed = True
            files = [s.file for s in self._segments] + list(self._index_files.values())
            self._segments.clear()
            self._starts.clear()
            self._index_files.clear()
            for f in files:
                self._retire(f)
        self._dirty_dirs.clear()

    def __enter__(self) -> EntryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _age_on_filesystem_clock(fd: int) -> float:
    """Seconds since the file was last written, measured on the clock that stamped its mtime.

    File times come from the kernel's wall clock, not from the store's injected clock: the age is
    taken on the kernel's clock (the one deliberate read of it here) and only the age, a duration,
    crosses over to the injected clock (recovery turns it into a seal time on that clock).
    """
    return max(0.0, time.time() - os.fstat(fd).st_mtime)


class _Chunks:
    """Sequential positioned reads in 1 MiB chunks (whole records when they are larger)."""

    def __init__(self, fd: int):
        self._fd = fd
        self._buf = b""
        self._start = 0

    def view(self, offset: int, size: int) -> memoryview:
        if not (self._start <= offset and offset + size <= self._start + len(self._buf)):
            self._buf = os.pread(self._fd, max(size, _SCAN_CHUNK_BYTES), offset)
            self._start = offset
        at = offset - self._start
        return memoryview(self._buf)[at : at + size]
