"""EntryStore: the segmented, checksummed, append-only Raft log on disk.

Layout under ``path``::

    log/00000000000000000000        segment: entries back to back (+ BLANK pad at its end)
    log/00000000001073741824        next segment starts at previous start + segment_bytes
    index/00000000000000000000      24-byte records; record i at (i - base) * 24
    index/00000000000001048576      base = i // records_per_file * records_per_file
    anchor                          (index, term, chain_crc, next_position) of the last removed
                                    entry; (0, 0, 0, 0) on a log that never lost its prefix

Invariants:
- Entries ``anchor_index + 1 .. last_index`` are held, contiguous, each chained to the one before
  (the first to the anchor's chain CRC).
- The log segments are the truth; index records are derived and rebuilt from them when missing.
- RAM does not grow with the bytes stored: no mmap, no per-entry state in memory; reads are
  positioned reads served from the page cache.
- Recovery fully scans only the last segment. A torn tail (an incomplete or bad record with no
  valid record after it) is cut off and logged; a bad record with valid data after it, or damage
  in an earlier segment, raises CorruptStoreError naming the file and offset.

Threads: one writer (the Raft tick thread); readers may call from any thread. A lock guards the
segment table and file descriptors.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from dledger.entry_codec import (
    BLANK_SIZE,
    HEADER_SIZE,
    INDEX_RECORD_SIZE,
    MAGIC,
    CorruptEntryError,
    CorruptStoreError,
    EntryTooLargeError,
    IndexOutOfRangeError,
    IndexRecord,
    StoreError,
    chain_crc,
    decode_header,
    decode_index,
    encode_blank,
    encode_entry,
    encode_index,
    is_blank,
)

__all__ = [
    "CorruptEntryError",
    "CorruptStoreError",
    "Entry",
    "EntryStore",
    "EntryTooLargeError",
    "IndexOutOfRangeError",
    "SegmentInfo",
    "StoreError",
]

log = logging.getLogger(__name__)

_ANCHOR = struct.Struct("<QQIQI")  # index, term, chain, next_position, crc
_SCAN_CHUNK = 1 << 20


@dataclass(frozen=True)
class Entry:
    index: int
    term: int
    position: int
    body: bytes
    chain_crc: int


@dataclass(frozen=True)
class SegmentInfo:
    start_position: int
    first_index: int
    last_index: int
    size_bytes: int
    mtime: float
    path: str


class _Segment:
    __slots__ = ("fd", "first_index", "path", "size", "start")

    def __init__(self, start: int, path: str, fd: int, size: int, first_index: int):
        self.start = start
        self.path = path
        self.fd = fd
        self.size = size
        self.first_index = first_index  # 0 while empty


def _name(n: int) -> str:
    return f"{n:020d}"


class EntryStore:
    header_bytes = HEADER_SIZE

    def __init__(
        self,
        path: str,
        segment_bytes: int = 1 << 30,
        index_records_per_file: int = 1 << 20,
        clock: Callable[[], float] = time.time,
    ):
        if segment_bytes < 4096:
            raise ValueError("segment_bytes must be at least 4096")
        self.path = path
        self.segment_bytes = segment_bytes
        self.records_per_file = index_records_per_file
        self._clock = clock
        self._log_dir = os.path.join(path, "log")
        self._index_dir = os.path.join(path, "index")
        os.makedirs(self._log_dir, exist_ok=True)
        os.makedirs(self._index_dir, exist_ok=True)
        self._lock = threading.RLock()
        self._segments: list[_Segment] = []
        self._starts: list[int] = []
        self._index_fds: dict[int, int] = {}
        self._dirty: set[int] = set()
        self._closed = False
        self.anchor: tuple[int, int, int] = (0, 0, 0)
        self.last_index = 0
        self.last_term = 0
        self.last_chain_crc = 0
        self.next_position = 0
        self._recover()

    # -- properties ---------------------------------------------------------------------------
    @property
    def first_index(self) -> int:
        return self.anchor[0] + 1

    @property
    def dirty(self) -> bool:
        return bool(self._dirty)

    @property
    def bytes_stored(self) -> int:
        with self._lock:
            return sum(s.size for s in self._segments)

    # -- index files ----------------------------------------------------------------------------
    def _index_fd(self, index: int, create: bool) -> int | None:
        base = index // self.records_per_file * self.records_per_file
        fd = self._index_fds.get(base)
        if fd is None:
            path = os.path.join(self._index_dir, _name(base))
            if not create and not os.path.exists(path):
                return None
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            self._index_fds[base] = fd
        return fd

    def _index_offset(self, index: int) -> int:
        return (index % self.records_per_file) * INDEX_RECORD_SIZE

    def _write_index(self, index: int, rec: IndexRecord) -> None:
        fd = self._index_fd(index, create=True)
        assert fd is not None
        os.pwrite(fd, encode_index(rec), self._index_offset(index))

    def _read_index(self, index: int) -> IndexRecord | None:
        fd = self._index_fd(index, create=False)
        if fd is None:
            return None
        return decode_index(os.pread(fd, INDEX_RECORD_SIZE, self._index_offset(index)))

    def _record(self, index: int) -> IndexRecord:
        if not self.first_index <= index <= self.last_index:
            raise IndexOutOfRangeError(
                f"index {index} is outside the store [{self.first_index}, {self.last_index}]"
            )
        rec = self._read_index(index)
        if rec is None:
            raise CorruptStoreError(f"{self._index_dir}: no index record for held index {index}")
        return rec

    # -- reads ------------------------------------------------------------------------------------
    def _segment_for(self, position: int) -> _Segment:
        i = bisect.bisect_right(self._starts, position) - 1
        if i < 0 or position >= self._segments[i].start + self._segments[i].size:
            raise IndexOutOfRangeError(f"position {position} is not in the log")
        return self._segments[i]

    def read(self, index: int) -> Entry:
        with self._lock:
            rec = self._record(index)
            seg = self._segment_for(rec.position)
            raw = os.pread(seg.fd, rec.total_size, rec.position - seg.start)
        if len(raw) != rec.total_size:
            raise CorruptEntryError(f"{seg.path}: short read at {rec.position - seg.start}")
        head = decode_header(raw)
        body = raw[HEADER_SIZE:]
        if head.index != index or zlib.crc32(body) != head.body_crc:
            raise CorruptEntryError(
                f"{seg.path}: entry {index} at offset {rec.position - seg.start} fails its checks"
            )
        return Entry(index, head.term, rec.position, body, head.chain_crc)

    def read_range(self, first: int, max_count: int, max_bytes: int) -> list[Entry]:
        """Entries from ``first`` on: at most ``max_count``, stopping once ``max_bytes`` are reached
        (at least one entry when ``first`` is held)."""
        out: list[Entry] = []
        total = 0
        last = min(self.last_index, first + max_count - 1)
        for index in range(first, last + 1):
            entry = self.read(index)
            out.append(entry)
            total += len(entry.body)
            if total >= max_bytes:
                break
        return out

    def term_at(self, index: int) -> int:
        if index == self.anchor[0]:
            return self.anchor[1]
        if index == self.last_index:
            return self.last_term
        with self._lock:
            return self._record(index).term

    def chain_crc_at(self, index: int) -> int:
        if index == self.anchor[0]:
            return self.anchor[2]
        with self._lock:
            return self._record(index).chain_crc

    def position_at(self, index: int) -> int:
        with self._lock:
            return self._record(index).position

    def read_at_position(self, position: int, size: int) -> bytes:
        with self._lock:
            seg = self._segment_for(position)
            if position + size > seg.start + seg.size:
                raise IndexOutOfRangeError(f"{size} bytes at position {position} run past the log")
            return os.pread(seg.fd, size, position - seg.start)

    # -- writes (tick thread) -------------------------------------------------------------------
    def append(self, index: int, term: int, body: bytes) -> int:
        if index != self.last_index + 1:
            raise ValueError(f"append of index {index}, expected {self.last_index + 1}")
        total = HEADER_SIZE + len(body)
        if total > self.segment_bytes - BLANK_SIZE:
            raise EntryTooLargeError(
                f"entry of {total} bytes does not fit a {self.segment_bytes}-byte segment"
            )
        with self._lock:
            seg = self._segments[-1] if self._segments else None
            if seg is None or seg.size + total > self.segment_bytes:
                seg = self._roll(seg)
            position = seg.start + seg.size
            data, head = encode_entry(index, term, position, body, self.last_chain_crc)
            os.pwrite(seg.fd, data, seg.size)
            seg.size += total
            if seg.first_index == 0:
                seg.first_index = index
            self._dirty.add(seg.fd)
            self._write_index(index, IndexRecord(position, term, total, head.chain_crc))
            self.last_index, self.last_term, self.last_chain_crc = index, term, head.chain_crc
            self.next_position = position + total
        return position

    def _roll(self, current: _Segment | None) -> _Segment:
        if current is None:
            start = self.next_position
        else:
            room = self.segment_bytes - current.size
            if room >= BLANK_SIZE:
                os.pwrite(current.fd, encode_blank(room), current.size)
            # sealing: from now on recovery trusts this segment's index records without a scan
            os.fdatasync(current.fd)
            self._dirty.discard(current.fd)
            self._sync_index_files()
            start = current.start + self.segment_bytes
        path = os.path.join(self._log_dir, _name(start))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        seg = _Segment(start, path, fd, 0, 0)
        self._segments.append(seg)
        self._starts.append(start)
        self._fsync_dir(self._log_dir)
        return seg

    def flush(self) -> None:
        """Make appended entries durable: fdatasync the dirty log segments.

        Index files are not synced here: they are derived. Recovery rescans the last segment and
        rewrites its index records; an earlier segment's index records are synced when the
        segment is sealed (``_roll``), on truncation and on close."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            for fd in dirty:
                os.fdatasync(fd)

    def _sync_index_files(self) -> None:
        for fd in self._index_fds.values():
            os.fdatasync(fd)

    def truncate_suffix(self, from_index: int) -> None:
        """Drop every entry ``>= from_index``."""
        if not self.first_index <= from_index <= self.last_index + 1:
            raise IndexOutOfRangeError(
                f"cannot truncate from {from_index} in [{self.first_index}, {self.last_index}]"
            )
        if from_index == self.last_index + 1:
            return
        with self._lock:
            if from_index == self.first_index:
                keep_end = self._segments[0].start if self._segments else self.next_position
                prev = self.anchor
            else:
                rec = self._record(from_index - 1)
                keep_end = rec.position + rec.total_size
                prev = (from_index - 1, rec.term, rec.chain_crc)
            while self._segments and self._segments[-1].start >= keep_end:
                seg = self._segments.pop()
                self._starts.pop()
                os.close(seg.fd)
                self._dirty.discard(seg.fd)
                os.unlink(seg.path)
            if self._segments:
                seg = self._segments[-1]
                seg.size = keep_end - seg.start
                os.ftruncate(seg.fd, seg.size)
                self._dirty.add(seg.fd)
                if seg.size == 0:
                    seg.first_index = 0
            self._drop_index_from(from_index)
            self._fsync_dir(self._log_dir)
            self.last_index, self.last_term, self.last_chain_crc = prev
            self.next_position = keep_end

    def _drop_index_from(self, from_index: int) -> None:
        base = from_index // self.records_per_file * self.records_per_file
        for b in sorted(self._index_fds):
            if b > base:
                os.close(self._index_fds.pop(b))
                os.unlink(os.path.join(self._index_dir, _name(b)))
        for name in os.listdir(self._index_dir):
            if name.isdigit() and int(name) > base and int(name) not in self._index_fds:
                os.unlink(os.path.join(self._index_dir, name))
        fd = self._index_fd(from_index, create=False)
        if fd is not None:
            os.ftruncate(fd, self._index_offset(from_index))
            os.fdatasync(fd)

    def reset(self, anchor_index: int, anchor_term: int, anchor_chain_crc: int) -> None:
        """Drop everything; the log continues after this anchor (a follower installed from a leader
        whose older entries are gone). Positions restart at 0: they are per replica."""
        with self._lock:
            self._write_anchor(anchor_index, anchor_term, anchor_chain_crc, 0)
            for seg in self._segments:
                os.close(seg.fd)
                os.unlink(seg.path)
            self._segments.clear()
            self._starts.clear()
            for b, fd in list(self._index_fds.items()):
                os.close(fd)
                os.unlink(os.path.join(self._index_dir, _name(b)))
            self._index_fds.clear()
            for name in os.listdir(self._index_dir):
                os.unlink(os.path.join(self._index_dir, name))
            self._dirty.clear()
            self._fsync_dir(self._log_dir)
            self.anchor = (anchor_index, anchor_term, anchor_chain_crc)
            self.last_index, self.last_term, self.last_chain_crc = self.anchor
            self.next_position = 0

    # -- retention ------------------------------------------------------------------------------
    def segments(self) -> list[SegmentInfo]:
        with self._lock:
            out = []
            for i, seg in enumerate(self._segments):
                if seg.first_index == 0:
                    continue
                nxt = self._segments[i + 1].first_index if i + 1 < len(self._segments) else 0
                last = nxt - 1 if nxt else self.last_index
                out.append(
                    SegmentInfo(
                        seg.start, seg.first_index, last, seg.size, os.fstat(seg.fd).st_mtime, seg.path
                    )
                )
            return out

    def delete_segments_before(self, index_floor: int) -> int:
        """Remove whole segments whose last index is below ``index_floor`` (never the last one)."""
        with self._lock:
            infos = self.segments()
            doomed = [s for s in infos[:-1] if s.last_index < index_floor]
            if not doomed:
                return 0
            last_gone = doomed[-1].last_index
            rec = self._record(last_gone)
            self._write_anchor(last_gone, rec.term, rec.chain_crc, self.next_position)
            self.anchor = (last_gone, rec.term, rec.chain_crc)
            for info in doomed:
                i = self._starts.index(info.start_position)
                seg = self._segments.pop(i)
                self._starts.pop(i)
                os.close(seg.fd)
                self._dirty.discard(seg.fd)
                os.unlink(seg.path)
            keep_base = (last_gone + 1) // self.records_per_file * self.records_per_file
            for b in sorted(self._index_fds):
                if b < keep_base:
                    os.close(self._index_fds.pop(b))
                    os.unlink(os.path.join(self._index_dir, _name(b)))
            self._fsync_dir(self._log_dir)
            return len(doomed)

    # -- anchor and recovery --------------------------------------------------------------------
    def _write_anchor(self, index: int, term: int, chain: int, next_position: int) -> None:
        body = _ANCHOR.pack(index, term, chain, next_position, 0)[:-4]
        data = body + struct.pack("<I", zlib.crc32(body))
        path = os.path.join(self.path, "anchor")
        with open(path + ".tmp", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        self._fsync_dir(self.path)

    def _read_anchor(self) -> tuple[int, int, int, int]:
        path = os.path.join(self.path, "anchor")
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return (0, 0, 0, 0)
        if len(raw) != _ANCHOR.size or zlib.crc32(raw[:-4]) != struct.unpack("<I", raw[-4:])[0]:
            raise CorruptStoreError(f"{path}: the anchor record is damaged")
        index, term, chain, next_position, _ = _ANCHOR.unpack(raw)
        return index, term, chain, next_position

    @staticmethod
    def _fsync_dir(path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _recover(self) -> None:
        a_index, a_term, a_chain, a_next = self._read_anchor()
        self.anchor = (a_index, a_term, a_chain)
        self.last_index, self.last_term, self.last_chain_crc = self.anchor
        self.next_position = a_next
        names = sorted(n for n in os.listdir(self._log_dir) if n.isdigit())
        for name in names:
            path = os.path.join(self._log_dir, name)
            fd = os.open(path, os.O_RDWR)
            self._segments.append(_Segment(int(name), path, fd, os.fstat(fd).st_size, 0))
            self._starts.append(int(name))
        # drop empty trailing segments (a crash right after a roll)
        while self._segments and self._segments[-1].size == 0 and len(self._segments) > 1:
            seg = self._segments.pop()
            self._starts.pop()
            os.close(seg.fd)
            os.unlink(seg.path)
        prev_index, prev_chain = a_index, a_chain
        for i, seg in enumerate(self._segments):
            is_last = i == len(self._segments) - 1
            boundary = None if is_last else self._trusted_boundary(seg, self._segments[i + 1], prev_index)
            if boundary is not None:
                prev_index, prev_chain = boundary
            else:
                prev_index, prev_chain = self._scan_segment(seg, prev_index, prev_chain, is_last)
        if self._segments:
            last = self._segments[-1]
            self.next_position = last.start + last.size
        self.last_index = prev_index
        self.last_chain_crc = prev_chain
        if prev_index == a_index:
            self.last_term = a_term
        else:
            rec = self._read_index(prev_index)
            assert rec is not None
            self.last_term = rec.term
        # index records past the last entry belong to truncated or torn entries
        self._drop_index_from(self.last_index + 1)

    def _trusted_boundary(self, seg: _Segment, nxt: _Segment, prev_index: int) -> tuple[int, int] | None:
        """For an earlier segment whose first entry and end agree with the index, the (index, chain)
        of its last entry without a full scan; None when anything disagrees (then it is scanned)."""
        try:
            head = decode_header(os.pread(seg.fd, HEADER_SIZE, 0))
            nxt_head = decode_header(os.pread(nxt.fd, HEADER_SIZE, 0))
        except CorruptEntryError:
            return None
        if head.index != prev_index + 1 or head.position != seg.start or nxt_head.position != nxt.start:
            return None
        first = self._read_index(head.index)
        last = self._read_index(nxt_head.index - 1)
        if first is None or last is None or first.position != seg.start or first.chain_crc != head.chain_crc:
            return None
        if not seg.start <= last.position < seg.start + seg.size:
            return None
        seg.first_index = head.index
        return nxt_head.index - 1, last.chain_crc

    def _scan_segment(
        self, seg: _Segment, prev_index: int, prev_chain: int, is_last: bool
    ) -> tuple[int, int]:
        offset = 0
        size = seg.size
        while offset < size:
            head_raw = os.pread(seg.fd, HEADER_SIZE, offset)
            if is_blank(head_raw):
                break  # the rest of the segment is padding
            problem = None
            head = None
            try:
                head = decode_header(head_raw)
            except CorruptEntryError as exc:
                problem = str(exc)
            if head is not None:
                if offset + head.total_size > size:
                    problem = "record runs past the end of the file"
                elif head.index != prev_index + 1:
                    problem = f"index {head.index} where {prev_index + 1} was expected"
                else:
                    body = os.pread(seg.fd, head.body_size, offset + HEADER_SIZE)
                    if zlib.crc32(body) != head.body_crc:
                        problem = "body checksum mismatch"
                    elif chain_crc(prev_chain, head.index, head.term, head.body_crc) != head.chain_crc:
                        problem = "chain checksum breaks here"
            if problem is not None:
                if is_last and not self._valid_header_after(seg, offset + 1):
                    log.warning(
                        "torn tail in %s at offset %d (%s): truncating %d byte(s)",
                        seg.path,
                        offset,
                        problem,
                        size - offset,
                    )
                    os.ftruncate(seg.fd, offset)
                    os.fsync(seg.fd)
                    seg.size = offset
                    break
                raise CorruptStoreError(
                    f"{seg.path}: corrupt record at offset {offset} ({problem}); valid data follows it, "
                    "so this is not a torn tail. Restore this replica from a healthy one (wipe its data "
                    "directory and restart it: it catches up from the leader)."
                )
            assert head is not None
            if seg.first_index == 0:
                seg.first_index = head.index
            rec = self._read_index(head.index)
            want = IndexRecord(seg.start + offset, head.term, head.total_size, head.chain_crc)
            if rec != want:
                self._write_index(head.index, want)
            prev_index, prev_chain = head.index, head.chain_crc
            offset += head.total_size
        return prev_index, prev_chain

    def _valid_header_after(self, seg: _Segment, offset: int) -> bool:
        """Is there any well-formed entry header at or after ``offset`` in this segment?"""
        magic = struct.pack("<I", MAGIC)
        pos = offset
        while pos < seg.size:
            chunk = os.pread(seg.fd, _SCAN_CHUNK + HEADER_SIZE, pos)
            at = chunk.find(magic)
            while at != -1:
                try:
                    decode_header(chunk[at : at + HEADER_SIZE])
                    return True
                except CorruptEntryError:
                    at = chunk.find(magic, at + 1)
            pos += _SCAN_CHUNK
        return False

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.flush()
            self._sync_index_files()
            for seg in self._segments:
                os.close(seg.fd)
            for fd in self._index_fds.values():
                os.close(fd)
            self._segments.clear()
            self._index_fds.clear()
