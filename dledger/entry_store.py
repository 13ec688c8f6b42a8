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
- RAM does not grow with the bytes stored: no mmap; memory holds one small record per segment and
  per index file, plus the most recent entries this store appended (``recent_bytes``, by default
  4 MiB and at most ``RECENT_ENTRIES_MAX`` entries): the entries a leader replicates and applies,
  and a follower applies, moments after writing them. Reads of those come from memory, exactly the
  bytes and header fields that were written (a disk fault after the write shows on the next read
  from disk: after a restart, or once the entry has left the recent window).
- Recovery on open (``store_recovery``) cuts a torn tail of the last segment and refuses any
  other damage with CorruptStoreError naming file and offset. File helpers: ``segment_files``.

Threads: one writer (the replica's thread: its event loop) calls every mutating method; ``flush``
runs on any thread (the replica's flusher thread, a state machine's snapshot thread) while the
writer appends; ``read``, ``read_range``, ``term_at``, ``chain_crc_at``, ``position_at``,
``read_at_position`` and ``segments`` may be called from any thread. ``_lock`` guards the segment
table, the index-file table and ``last_*``. Readers snapshot under the lock, pin the file they read
(a retired file is closed by its last reader), read without the lock, and re-check ``_generation``
(bumped by ``truncate_suffix`` and ``reset``) afterwards: a read that raced with one is retried and
finally fails with StaleReadError, it never returns bytes from a replaced entry. Retention does not
replace entries: a read pinned to a segment it removes still returns that (valid) entry; a later one
gets IndexOutOfRangeError.

Durability: appends reach the page cache; ``flush()`` fdatasyncs the segment files written since the
last flush (and fsyncs the directories that gained files): one fdatasync per acknowledged append, or
fewer (group commit: a flush covers everything written before it started). Flushes are serialised by
``_flush_lock`` and pin the files they sync (a file retired meanwhile is closed by the flush, its
last user), so a flush on another thread never races the writer's bookkeeping. Index records are
derived data (recovery rebuilds them from the last segment, which it scans in full), so they are
synced lazily: with the segment they describe when it is sealed, and by ``truncate_suffix`` and
``close``. ``truncate_suffix``, ``reset`` and ``delete_segments_before`` are durable when they
return.
"""

from __future__ import annotations

import bisect
import collections
import logging
import os
import threading
import zlib
from collections.abc import Callable, Sequence
from typing import NoReturn, TypeVar

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
    decode_header,
    decode_index_record,
    encode_header,
    pack_header,
    pack_index_record,
)
from dledger.log_store import (
    FULL_ERRNOS,
    CorruptStoreError,
    Entry,
    EntryTooLargeError,
    IndexOutOfRangeError,
    PositionOutOfRangeError,
    SegmentInfo,
    StaleReadError,
    StoreClosedError,
    StoreFailedError,
    StoreFullError,
    describe_os_error,
)
from dledger.segment_files import Segment, SegmentFile, file_name, numbered, pwrite_all
from dledger.store_recovery import RANGE_CHUNK_RECORDS, StoreRecovery

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
    "StoreFailedError",
    "StoreFullError",
]

log = logging.getLogger(__name__)

_READ_ATTEMPTS = 4
RECENT_BYTES_DEFAULT = 4 << 20
RECENT_ENTRIES_MAX = 4096

T = TypeVar("T")


class EntryStore(StoreRecovery):
    header_bytes = HEADER_SIZE  # body of the entry at position p starts at p + header_bytes

    def __init__(
        self,
        path: str,
        segment_bytes: int = 1 << 30,
        index_records_per_file: int = 1 << 20,
        clock: Clock = SYSTEM,
        recent_bytes: int = RECENT_BYTES_DEFAULT,
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
        # Held for a whole flush (and by truncation, which flushes): whatever was written before a
        # flush() call is durable when it returns, on any thread.
        self._flush_lock = threading.RLock()
        self._generation = 0
        self._closed = False
        # Set by the first write/sync failure that leaves the disk's state unknown (fsyncgate):
        # every later write and flush raises it, none is retried.
        self._failed: StoreFailedError | None = None
        self._segments: list[Segment] = []
        self._starts: list[int] = []  # segment start positions, for bisect
        self._index_files: dict[int, SegmentFile] = {}
        self._dirty_files: set[SegmentFile] = set()
        self._lazy_files: set[SegmentFile] = set()  # index files: synced at seal, truncate, close
        self._dirty_dirs: set[str] = set()
        self._anchor: tuple[int, int, int] = (0, 0, 0)
        self._floor_position = 0
        self._last: tuple[int, int, int] = (0, 0, 0)  # index, term, chain_crc of the last entry
        # The entries appended most recently, contiguous and ending at last_index when not empty
        # (guarded by _lock; bodies bounded by recent_bytes, count by RECENT_ENTRIES_MAX).
        self._recent: collections.deque[Entry] = collections.deque()
        self._recent_body_bytes = 0
        self.recent_bytes = max(0, recent_bytes)
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

    def _next_segment_start(self, seg: Segment) -> int:
        return seg.start + max(self.segment_bytes, seg.size)

    # -- files ----------------------------------------------------------------------------------
    @staticmethod
    def _open_file(path: str, flags: int = 0) -> SegmentFile:
        return SegmentFile(path, os.open(path, os.O_RDWR | flags, 0o644))

    def _retire(self, f: SegmentFile) -> None:
        """Caller holds the lock. The file leaves the tables; its last reader closes it."""
        f.retired = True
        self._dirty_files.discard(f)
        self._lazy_files.discard(f)
        if f.pins == 0:
            os.close(f.fd)

    def _unpin(self, f: SegmentFile) -> None:
        with self._lock:
            f.pins -= 1
            if f.retired and f.pins == 0:
                os.close(f.fd)

    def _pread_pinned(self, f: SegmentFile, size: int, offset: int) -> bytes:
        """pread from ``f``, which the caller pinned under the lock; unpins it."""
        try:
            return os.pread(f.fd, size, offset)
        finally:
            self._unpin(f)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"entry store {self.path} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self._failed is not None:
            raise self._failed

    @property
    def failed(self) -> StoreFailedError | None:
        """Why this store takes no more writes (a write or sync whose outcome is unknown), or None."""
        return self._failed

    def _fail(self, what: str, exc: OSError) -> StoreFailedError:
        """The store stops taking writes and flushes for good; returns the error to raise."""
        if self._failed is None:
            self._failed = StoreFailedError(
                f"{what} failed: {describe_os_error(exc)}; what reached the disk is unknown, so the log "
                "takes no more writes and never retries the sync (restart the replica: it recovers "
                "from what is on disk)"
            )
            log.critical("%s", self._failed)
        return self._failed

    def _full_or_fail(self, what: str, exc: OSError, needed: int) -> NoReturn:
        """After an undone write: no room (StoreFullError, the store stays usable) or a failure."""
        if exc.errno in FULL_ERRNOS:
            raise StoreFullError(
                f"{what}: {describe_os_error(exc)}; nothing of it was kept", needed, exc.errno or 0
            ) from exc
        raise self._fail(what, exc) from exc

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
                raise CorruptEntryError(f"index file {file_name(base)} for held index {first} is missing")
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

    def _verified(self, view: memoryview, at: int, index: int, rec: IndexRecord, seg: Segment) -> Entry:
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

    def _segment_at(self, position: int) -> Segment | None:
        """Caller holds the lock. The segment whose published bytes contain ``position``."""
        k = bisect.bisect_right(self._starts, position) - 1
        if k < 0:
            return None
        seg = self._segments[k]
        return seg if position < seg.start + seg.size else None

    def _recent_at(self, index: int) -> Entry | None:
        """Caller holds the lock. Entry ``index`` if it is among the recent entries."""
        recent = self._recent
        if recent:
            k = index - recent[0].index
            if 0 <= k < len(recent):
                return recent[k]
        return None

    def read(self, index: int) -> Entry:
        """The entry at ``index``, verified; IndexOutOfRangeError outside [first_index, last_index]."""
        with self._lock:
            self._check_open()
            hit = self._recent_at(index)
            if hit is not None:
                return hit

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
            if self._recent_at(first) is not None:
                return self._recent_range(first, max_count, max_bytes)

        def once() -> list[Entry]:
            out: list[Entry] = []
            body_bytes = 0
            index = first
            last = min(self._last[0], first + max_count - 1)
            chunk = 16  # grows: a small max_bytes should not read thousands of index records
            while index <= last:
                take: list[IndexRecord] = []
                chunk = min(chunk * 4, RANGE_CHUNK_RECORDS)
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

    def _recent_range(self, first: int, max_count: int, max_bytes: int) -> list[Entry]:
        """Caller holds the lock; ``first`` is among the recent entries (so is every later one)."""
        out: list[Entry] = []
        body_bytes = 0
        recent = self._recent
        # By position, not islice: reads are near the end (replicating, applying what was just
        # written) and a deque is indexed from its nearer end; islice walked from the front.
        for k in range(first - recent[0].index, len(recent)):
            e = recent[k]
            size = len(e.body)
            if out and (len(out) >= max_count or body_bytes + size > max_bytes):
                break
            out.append(e)
            body_bytes += size
        return out

    def _record_or_anchor(self, index: int, what: str) -> tuple[int, int]:
        """(term, chain_crc) of ``index``, which may be the anchor."""
        with self._lock:
            self._check_open()
            if index == self._anchor[0]:
                return self._anchor[1], self._anchor[2]
            if index == self._last[0]:
                return self._last[1], self._last[2]
            hit = self._recent_at(index)
            if hit is not None:
                return hit.term, hit.chain_crc
        rec = self._consistent(lambda: self._records(index, 1)[0], f"{what}({index})")
        return rec.term, rec.chain_crc

    def term_at(self, index: int) -> int:
        """Term of ``index`` in [anchor_index, last_index] (0 for index 0 on a fresh store)."""
        return self._record_or_anchor(index, "term_at")[0]

    def chain_crc_at(self, index: int) -> int:
        return self._record_or_anchor(index, "chain_crc_at")[1]

    def position_at(self, index: int) -> int:
        with self._lock:
            self._check_open()
            hit = self._recent_at(index)
            if hit is not None:
                return hit.position
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
        """Append entry ``index`` (must be last_index + 1); returns its header's global position.
        StoreFullError when the file system has no room: nothing of the entry is kept."""
        self._check_writable()
        entry = ((index, term, body),)
        self._check_appendable(entry)
        seg = self._segments[-1] if self._segments else None
        if seg is None or seg.sealed or seg.size + HEADER_SIZE + len(body) > self.segment_bytes:
            seg = self._roll(seg)
        return self._write_run(seg, entry)[0]

    def append_many(self, entries: Sequence[tuple[int, int, bytes]]) -> list[int]:
        """Append consecutive entries with one write per segment and index file touched. Each
        segment's run is all or nothing: on StoreFullError the runs before it are kept."""
        self._check_writable()
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

    def _write_run(self, seg: Segment | None, run: Sequence[tuple[int, int, bytes]]) -> list[int]:
        """Write entries that all fit ``seg`` after its published bytes, then publish them."""
        if not run:
            return []
        assert seg is not None and not seg.sealed
        parts: list[bytes] = []
        records: list[bytes] = []
        positions: list[int] = []
        written: list[Entry] = []
        prev_chain = self._last[2]
        position = seg.start + seg.size
        head: EntryHeader | None = None
        for index, term, body in run:
            head = encode_header(index, term, position, body, prev_chain)
            parts += (pack_header(head), body)
            records.append(pack_index_record(position, term, head.total_size, head.chain_crc))
            positions.append(position)
            written.append(Entry(index, term, position, body if type(body) is bytes else bytes(body), head.chain_crc))
            prev_chain = head.chain_crc
            position += head.total_size
        assert head is not None and position - seg.start <= self.segment_bytes
        needed = position - seg.start - seg.size
        where = seg.file.path
        try:
            pwrite_all(seg.file.fd, parts, seg.size, needed)
            where = f"the index file of {seg.file.path}"
            self._write_records(run[0][0], records)
        except OSError as exc:
            self._undo_write(seg, run[0][0], head.index)
            self._full_or_fail(f"writing {needed} bytes of entries {run[0][0]}..{head.index} to {where}", exc, needed)
        with self._lock:
            if seg.size == 0:
                seg.first_index = run[0][0]
            seg.size = position - seg.start
            seg.last_index = head.index
            self._last = (head.index, head.term, head.chain_crc)
            self._dirty_files.add(seg.file)
            self._remember(written)
        return positions

    def _undo_write(self, seg: Segment, first: int, last: int) -> None:
        """A write of entries ``first..last`` failed part-way: cut the segment back to its published
        bytes and the index files back to ``first`` (shrinking needs no free space), so neither a
        partial entry nor a stale index record stays behind for recovery or the next write."""
        try:
            os.ftruncate(seg.file.fd, seg.size)
            first_base = self._index_base(first)
            for base in range(first_base, self._index_base(last) + 1, self.index_records_per_file):
                f = self._index_files.get(base)
                if f is not None:
                    os.ftruncate(f.fd, self._index_slot(first) if base == first_base else 0)
        except OSError as exc:
            raise self._fail(f"undoing a failed write to {seg.file.path}", exc) from exc

    def _remember(self, written: list[Entry]) -> None:
        """Caller holds the lock; ``written`` follow the recent entries (or start them)."""
        if self.recent_bytes <= 0:
            return
        recent = self._recent
        recent.extend(written)
        self._recent_body_bytes += sum(len(e.body) for e in written)
        while recent and (self._recent_body_bytes > self.recent_bytes or len(recent) > RECENT_ENTRIES_MAX):
            self._recent_body_bytes -= len(recent.popleft().body)

    def _forget_recent_from(self, index: int) -> None:
        """Caller holds the lock: drop recent entries >= ``index``."""
        recent = self._recent
        while recent and recent[-1].index >= index:
            self._recent_body_bytes -= len(recent.pop().body)

    def _forget_recent_upto(self, index: int) -> None:
        """Caller holds the lock: drop recent entries <= ``index``."""
        recent = self._recent
        while recent and recent[0].index <= index:
            self._recent_body_bytes -= len(recent.popleft().body)

    def _write_records(self, first: int, records: list[bytes]) -> None:
        k = 0
        while k < len(records):
            index = first + k
            base = self._index_base(index)
            n = min(len(records) - k, base + self.index_records_per_file - index)
            f = self._index_file_for_write(base)
            chunk = records if n == len(records) else records[k : k + n]
            pwrite_all(f.fd, chunk, self._index_slot(index), n * INDEX_RECORD_SIZE)
            with self._lock:
                self._lazy_files.add(f)
            k += n

    def _index_file_for_write(self, base: int) -> SegmentFile:
        f = self._index_files.get(base)
        if f is None:
            f = self._open_file(os.path.join(self._index_dir, file_name(base)), os.O_CREAT)
            with self._lock:
                self._index_files[base] = f
                self._dirty_dirs.add(self._index_dir)
        return f

    def _roll(self, seg: Segment | None) -> Segment:
        """Seal ``seg`` (BLANK marker if it has room) and open the next segment."""
        if seg is None:
            start = self._floor_position
        else:
            if not seg.sealed:
                size = seg.size
                if self.segment_bytes - size >= BLANK_SIZE:
                    try:
                        os.pwrite(seg.file.fd, BLANK_BYTES, size)
                    except OSError as exc:
                        self._undo_write(seg, self._last[0] + 1, self._last[0] + 1)
                        self._full_or_fail(f"sealing {seg.file.path}", exc, BLANK_SIZE)
                    size += BLANK_SIZE
                with self._lock:
                    seg.size, seg.sealed = size, True
                    self._dirty_files.add(seg.file)
            if seg.sealed_wall_s is None:
                seg.sealed_wall_s = self._clock.wall()
            start = self._next_segment_start(seg)
            # Seal: this segment and every index record so far become durable before the next
            # segment gets a byte, so after a crash only the last segment can be torn.
            self.flush_all()
        path = os.path.join(self._log_dir, file_name(start))
        try:
            opened = self._open_file(path, os.O_CREAT | os.O_TRUNC)
        except OSError as exc:
            self._full_or_fail(f"creating the segment {path}", exc, 0)
        new = Segment(start, opened, 0, 0)
        new.first_index = self._last[0] + 1
        new.last_index = self._last[0]
        with self._lock:
            self._segments.append(new)
            self._starts.append(start)
            self._dirty_dirs.add(self._log_dir)
        return new

    def flush(self) -> None:
        """fdatasync every segment file written since the last flush; fsync directories that gained
        files. Index files wait for ``flush_all`` (recovery rebuilds what they lack). Any thread:
        what was written before the call is durable when it returns."""
        with self._flush_lock:
            if self._failed is not None:
                raise self._failed  # never retried: it could "succeed" without the lost pages
            self._sync_files(self._dirty_files, self._dirty_dirs)

    def flush_all(self) -> None:
        """``flush``, and the index files too."""
        with self._flush_lock:
            if self._failed is not None:
                raise self._failed
            self._sync_files(self._lazy_files, set())
            self.flush()

    def _sync_files(self, files_set: set[SegmentFile], dirs_set: set[str]) -> None:
        """Caller holds _flush_lock. Takes the files out of ``files_set`` (pinned, so that a
        truncation or retention retiring one meanwhile cannot close it under the fdatasync),
        syncs them and the directories. An OSError fails the store for good (``_fail``): the files
        are not put back to be synced again (fsyncgate: a retried fsync may succeed although the
        kernel dropped the pages the failed one did not write)."""
        with self._lock:
            if not files_set and not dirs_set:
                return
            files, dirs = list(files_set), list(dirs_set)
            files_set.clear()
            dirs_set.clear()
            for f in files:
                f.pins += 1
        doing = ""
        try:
            for f in files:
                if not f.retired:
                    doing = f"fdatasync of {f.path}"
                    os.fdatasync(f.fd)
            for d in dirs:
                doing = f"fsync of the directory {d}"
                fsync_dir(d)
        except OSError as exc:
            raise self._fail(doing, exc) from exc
        except BaseException:
            with self._lock:
                files_set.update(f for f in files if not f.retired)
                dirs_set.update(dirs)
            raise
        finally:
            for f in files:
                self._unpin(f)

    # -- truncation, reset, retention (writer thread; durable on return) ----------------------------
    def truncate_suffix(self, from_index: int) -> None:
        """Drop entries ``>= from_index``; anchor_index < from_index <= last_index + 1."""
        self._check_writable()
        with self._flush_lock:  # no flush on another thread runs while the tail is cut
            try:
                self._truncate_suffix(from_index)
            except OSError as exc:
                raise self._fail(f"truncating {self.path} from entry {from_index}", exc) from exc

    def _truncate_suffix(self, from_index: int) -> None:
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
            self._forget_recent_from(from_index)
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
        with self._lock:
            self._dirty_files.discard(seg.file)
        index_file = self._index_files.get(base)
        if index_file is not None:
            os.ftruncate(index_file.fd, self._index_slot(from_index))
            with self._lock:
                self._dirty_files.add(index_file)
        self.flush_all()  # what is left is durable when this returns (index files included)

    def reset(self, anchor_index: int, anchor_term: int, anchor_chain_crc: int) -> None:
        """Drop every entry; the log continues after this anchor (a follower installed from a
        leader whose older entries are gone). Positions continue at the next segment boundary.
        StoreFullError (nothing changed) when the new anchor finds no room."""
        self._check_writable()
        if anchor_index < 0 or anchor_term < 0 or not 0 <= anchor_chain_crc <= 0xFFFFFFFF:
            raise ValueError(f"bad anchor {(anchor_index, anchor_term, anchor_chain_crc)}")
        with self._lock:
            floor = self._next_segment_start(self._segments[-1]) if self._segments else self._floor_position
        # The anchor file is the commit point: on open, segments below its floor are deleted.
        self._write_anchor_or_refuse(anchor_index, anchor_term, anchor_chain_crc, floor)
        with self._lock:
            doomed_files = [s.file for s in self._segments] + list(self._index_files.values())
            self._segments.clear()
            self._starts.clear()
            self._index_files.clear()
            self._generation += 1
            self._forget_recent_from(0)
            self._anchor = (anchor_index, anchor_term, anchor_chain_crc)
            self._last = self._anchor
            self._floor_position = floor
            for f in doomed_files:
                self._retire(f)
        for start in numbered(self._log_dir):
            os.unlink(os.path.join(self._log_dir, file_name(start)))
        for base in numbered(self._index_dir):
            os.unlink(os.path.join(self._index_dir, file_name(base)))
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
        last_index; the anchor moves to the last removed entry. Returns segments removed.
        StoreFullError (nothing removed) when the new anchor finds no room."""
        self._check_writable()
        doomed: list[Segment] = []
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
        self._write_anchor_or_refuse(anchor_index, rec.term, rec.chain_crc, floor)
        last_base = self._index_base(anchor_index + 1)
        with self._lock:
            del self._segments[: len(doomed)], self._starts[: len(doomed)]
            doomed_index = [b for b in self._index_files if b < last_base]
            doomed_files = [s.file for s in doomed] + [self._index_files.pop(b) for b in doomed_index]
            self._anchor = (anchor_index, rec.term, rec.chain_crc)
            self._forget_recent_upto(anchor_index)
            self._floor_position = floor
            for f in doomed_files:
                self._retire(f)
        for f in doomed_files:
            os.unlink(f.path)
        fsync_dir(self._log_dir)
        fsync_dir(self._index_dir)
        return len(doomed)

    def _write_anchor_or_refuse(self, index: int, term: int, chain: int, floor: int) -> None:
        """The anchor file is replaced first (the commit point): if there is no room for the new
        one, nothing changed (StoreFullError); any other failure fails the store."""
        try:
            self._write_anchor(index, term, chain, floor)
        except OSError as exc:
            self._full_or_fail(f"writing the anchor of {self.path}", exc, 0)

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Flush and close; idempotent. Readers still inside a pread finish first. A failed store
        (``failed``) is closed without a flush: its failure was raised where it happened."""
        if self._closed:
            return
        try:
            if self._failed is None:
                self.flush_all()
        finally:
            self._close_all()

    def _close_all(self) -> None:
        with self._lock:
            self._closed = True
            self._forget_recent_from(0)
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
