"""Consume queues: per (topic, queue_id) sequences of fixed-width units pointing into the Raft log.

A unit is 28 bytes, little endian ``<QIQQ``: log position, message size, tag hash (0 = no tags),
store timestamp (ms). A unit's index is its *queue offset*. Layout under ``<root>/<topic>/<qid>/``::

    min_offset                   b"CQMO" | u64 min offset | u32 crc32, replaced atomically
    00000000000000000000         units 0 .. upf-1          (upf = units_per_file)
    00000000000000300000         units upf .. 2*upf-1      <- appends go to the last file
                                 (no preallocation: a file's size is its unit count * 28)

    offset:  min_offset ........ written ........ max_offset
             | in files           | in _buffer     |  <- append
             (units below min_offset may still sit at the head of the first file)

Invariants:
- Files are contiguous: file i+1 starts at file i's start + upf; every file but the last holds
  exactly upf units. The first file is named by whatever base the queue had (``set_base``, or the
  offset the queue stood at when retention emptied it), so names need not be multiples of upf.
- ``min_offset <= max_offset``; units ``[min_offset, max_offset)`` are readable, those below
  ``written`` from the files, the rest from the in-memory buffer (bounded: ``append`` writes out
  once it holds ``BUFFER_UNITS_MAX`` units).
- Log positions strictly increase with the offset (the caller dispatches in log order), which is
  what ``search_by_position`` and retention's binary searches rely on. Store timestamps are
  assumed non-decreasing for ``search_by_time`` (it is a binary search, as in RocketMQ).
- The queue is derived data: any damage recovery cannot explain raises ConsumeQueueDamaged and the
  caller rebuilds the queue from the log.

Recovery on open: a last file whose size is not a multiple of 28 is cut to whole units, a trailing
run of all-zero units (torn or preallocated; a real unit never has size 0) is dropped, files wholly
below the stored min_offset are deleted (an interrupted retention). A gap between files, a non-last
file of the wrong size or a bad ``min_offset`` file raises ConsumeQueueDamaged.

Threads: one writer thread (the Raft apply thread) calls every mutating method (``append``,
``write_out``, ``flush``, ``set_base``, ``truncate*``, ``delete_before_position``, ``destroy``,
``close``); ``get``, ``read``, ``last_unit`` and the searches may be called from any thread.
``_lock`` guards the offsets, the buffer and ``_gen`` and is held only for memory operations;
``_fd_lock`` guards the file table and the fd cache and is held around each pread/pwrite. Lock order:
``_lock`` before ``_fd_lock``. A reader snapshots the offsets, preads without ``_lock`` and re-checks
``_gen`` (bumped when units are truncated or files replaced); a raced read is retried, finally under
``_lock``. It never sees a half-written unit: it reads only below the published ``max_offset``, and
units below ``written`` were pwritten before ``written`` moved.

File descriptors: at most ``FD_CACHE_MAX`` per queue, and ``flush()`` releases them all, so a broker
with thousands of queues holds fds only for queues touched since the last flush.

Durability: ``write_out`` reaches the page cache; ``flush`` fsyncs the files written (and the
directory when it gained files). ``set_base`` and retention make ``min_offset`` durable before
deleting files.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import logging
import os
import shutil
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from broker.protocol.names import is_decimal, is_topic
from dledger.durable import fsync_dir

__all__ = [
    "BUFFER_UNITS_MAX",
    "FD_CACHE_MAX",
    "UNIT_SIZE",
    "ConsumeQueue",
    "ConsumeQueueDamaged",
    "ConsumeQueueStore",
    "Unit",
    "file_name",
    "pack_unit",
    "unpack_units",
]

log = logging.getLogger(__name__)

_UNIT = struct.Struct("<QIQQ")
_pack_unit = _UNIT.pack
UNIT_SIZE = _UNIT.size  # 28
_ZERO_UNIT = bytes(UNIT_SIZE)
MIN_OFFSET_FILE = "min_offset"
MIN_OFFSET_RECORD = struct.Struct("<4sQ")
MIN_OFFSET_MAGIC = b"CQMO"
_CRC = struct.Struct("<I")
FILE_NAME_DIGITS = 20
BUFFER_UNITS_MAX = 4096
FD_CACHE_MAX = 3
_READ_ATTEMPTS = 3
_SCAN_CHUNK_UNITS = 4096


class ConsumeQueueDamaged(Exception):
    """A queue's files are inconsistent in a way a crash cannot explain; rebuild it from the log."""

    code = "CONSUME_QUEUE_DAMAGED"

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Unit:
    offset: int
    position: int
    size: int
    tag_hash: int
    store_ts: int


# ---------------------------------------------------------------------------------------------
# Pure helpers


def pack_unit(position: int, size: int, tag_hash: int, store_ts: int) -> bytes:
    return _UNIT.pack(position, size, tag_hash, store_ts)


def unpack_units(data: bytes, first_offset: int) -> list[Unit]:
    """Decode whole units back to back; ``first_offset`` is the offset of the first one."""
    assert len(data) % UNIT_SIZE == 0, len(data)
    return [Unit(first_offset + i, *fields) for i, fields in enumerate(_UNIT.iter_unpack(data))]


def file_name(first_offset: int) -> str:
    return f"{first_offset:0{FILE_NAME_DIGITS}d}"


def _is_file_name(name: str) -> bool:
    return len(name) == FILE_NAME_DIGITS and name.isdigit()


@dataclass
class PendingSync:
    """Files written by the writer, to be fsynced (and closed) by ``finish_flush``."""

    fds: list[int]
    dir_path: str | None


def finish_flush(pending: PendingSync) -> None:
    try:
        for fd in pending.fds:  # fsync outside every lock: readers are not held up by the disk
            os.fsync(fd)
    finally:
        for fd in pending.fds:
            os.close(fd)
        pending.fds = []
    if pending.dir_path is not None:
        try:
            fsync_dir(pending.dir_path)
        except FileNotFoundError:
            pass  # the queue was destroyed since begin_flush (topic deleted, queue reset): nothing to keep




def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _last_nonzero_unit_end(fd: int, nbytes: int) -> int:
    """Byte length of the file once a trailing run of all-zero units is dropped."""
    end = nbytes
    while end > 0:
        start = max(0, end - _SCAN_CHUNK_UNITS * UNIT_SIZE)
        chunk = os.pread(fd, end - start, start)
        if len(chunk) != end - start:
            raise OSError(f"short read at {start}")
        stripped = len(chunk.rstrip(b"\0"))
        if stripped:
            # Round up to the unit holding the last non-zero byte.
            return start + -(-stripped // UNIT_SIZE) * UNIT_SIZE
        end = start
    return 0


# ---------------------------------------------------------------------------------------------


class QueueReader(Protocol):
    """The read side of a consume queue (``ConsumeQueue`` is one): what readers outside the store
    may use. Any thread; a unit is visible once appended."""

    @property
    def min_offset(self) -> int: ...
    @property
    def max_offset(self) -> int: ...
    def get(self, offset: int) -> Unit | None: ...
    def read(self, offset: int, max_count: int) -> list[Unit]: ...
    def last_unit(self) -> Unit | None: ...
    def search_by_position(self, position: int) -> int | None: ...
    def search_by_time(self, ts_ms: int) -> int: ...


class ConsumeQueue:
    """One consume queue in ``dir_path``; see the module docstring for the layout and threads."""

    def __init__(self, dir_path: str, units_per_file: int = 300_000):
        assert units_per_file > 0
        self._dir = dir_path
        self._upf = units_per_file
        self._lock = threading.Lock()
        self._fd_lock = threading.Lock()
        self._buffer = bytearray()  # units [_written, _max_offset), packed
        self._fds: collections.OrderedDict[int, int] = collections.OrderedDict()  # file start -> fd
        self._dirty_files: set[int] = set()
        self._dir_dirty = False
        self._gen = 0
        self._closed = False
        os.makedirs(dir_path, exist_ok=True)
        starts, written, min_offset, stored_min = self._recover()
        self._file_starts = starts  # guarded by _fd_lock
        self._written = written
        self._max_offset = written
        self._min_offset = min_offset
        self._stored_min = stored_min

    # -- recovery ----------------------------------------------------------------------------

    def _recover(self) -> tuple[list[int], int, int, int | None]:
        try:
            os.unlink(self._path(MIN_OFFSET_FILE + ".tmp"))
        except FileNotFoundError:
            pass
        stored_min = self._load_min_offset()
        starts = sorted(int(n) for n in os.listdir(self._dir) if _is_file_name(n))
        if not starts:
            base = stored_min or 0
            return [], base, base, stored_min
        file_bytes = self._upf * UNIT_SIZE
        for prev, cur in itertools.pairwise(starts):
            if cur != prev + self._upf:
                raise ConsumeQueueDamaged(
                    self._path(file_name(cur)), f"gap: expected {file_name(prev + self._upf)} after it"
                )
        for start in starts[:-1]:
            size = os.path.getsize(self._path(file_name(start)))
            if size != file_bytes:
                raise ConsumeQueueDamaged(self._path(file_name(start)), f"size {size} != {file_bytes}")
        last = starts[-1]
        written = last + self._repair_last_file(last) // UNIT_SIZE
        min_offset = max(stored_min or 0, starts[0])
        # Finish an interrupted retention: files that hold only units below min_offset go.
        while starts and min(starts[0] + self._upf, written) <= min_offset:
            log.warning("deleting %s: below min_offset %d", self._path(file_name(starts[0])), min_offset)
            os.unlink(self._path(file_name(starts.pop(0))))
            self._dir_dirty = True
        if not starts:
            written = max(written, min_offset)
        return starts, written, min_offset, stored_min

    def _repair_last_file(self, start: int) -> int:
        """Cut the last file to whole, non-zero-tailed units; returns its byte length."""
        path = self._path(file_name(start))
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size > self._upf * UNIT_SIZE:
                raise ConsumeQueueDamaged(path, f"size {size} > {self._upf * UNIT_SIZE}")
            whole = size - size % UNIT_SIZE
            if whole != size:
                log.warning("%s: torn unit at byte %d (size %d), truncating", path, whole, size)
            end = _last_nonzero_unit_end(fd, whole)
            if end != whole:
                dropped = (whole - end) // UNIT_SIZE
                log.warning("%s: dropping %d trailing zero units from byte %d", path, dropped, end)
            if end != size:
                os.ftruncate(fd, end)
                os.fsync(fd)
            return end
        finally:
            os.close(fd)

    def _load_min_offset(self) -> int | None:
        path = self._path(MIN_OFFSET_FILE)
        try:
            with open(path, "rb") as f:
                raw = f.read(64)
        except FileNotFoundError:
            return None
        body = raw[: MIN_OFFSET_RECORD.size]
        if len(raw) != len(body) + _CRC.size or _CRC.unpack_from(raw, len(body))[0] != zlib.crc32(body):
            raise ConsumeQueueDamaged(path, "bad min_offset record")
        magic, offset = MIN_OFFSET_RECORD.unpack(body)
        if magic != MIN_OFFSET_MAGIC:
            raise ConsumeQueueDamaged(path, "bad min_offset magic")
        return int(offset)

    def _store_min_offset(self, offset: int) -> None:
        body = MIN_OFFSET_RECORD.pack(MIN_OFFSET_MAGIC, offset)
        tmp = self._path(MIN_OFFSET_FILE + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _pwrite_all(fd, body + _CRC.pack(zlib.crc32(body)), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self._path(MIN_OFFSET_FILE))
        fsync_dir(self._dir)
        self._stored_min = offset

    # -- properties --------------------------------------------------------------------------

    @property
    def dir_path(self) -> str:
        return self._dir

    @property
    def min_offset(self) -> int:
        return self._min_offset

    @property
    def max_offset(self) -> int:
        return self._max_offset

    # -- writing -----------------------------------------------------------------------------

    def append(self, position: int, size: int, tag_hash: int, store_ts: int) -> int:
        """Buffer one unit; returns its offset. Readers see it at once; files after write_out. (Every
        replica appends every message here: the lock taken with acquire/release, a fifth cheaper
        than ``with``, the packer bound at import.)"""
        packed = _pack_unit(position, size, tag_hash, store_ts)
        lock = self._lock
        lock.acquire()
        try:
            offset = self._max_offset
            self._buffer += packed
            self._max_offset = offset + 1
        finally:
            lock.release()
        if offset + 1 - self._written >= BUFFER_UNITS_MAX:
            self.write_out()
        return offset

    def write_out(self) -> None:
        """Write the buffered units to the files (page cache, no fsync): one pwrite per file touched."""
        with self._lock:
            if not self._buffer:
                return
            data = bytes(self._buffer)
            first = self._written
        count = len(data) // UNIT_SIZE
        with self._fd_lock:
            done = 0
            while done < count:
                offset = first + done
                start = self._file_for_write(offset)
                n = min(count - done, start + self._upf - offset)
                fd = self._fd(start, create=True)
                _pwrite_all(fd, data[done * UNIT_SIZE : (done + n) * UNIT_SIZE], (offset - start) * UNIT_SIZE)
                self._dirty_files.add(start)
                done += n
        with self._lock:
            del self._buffer[: len(data)]
            self._written = first + count

    def flush(self) -> None:
        """write_out, fsync the files written since the last flush, release cached fds."""
        finish_flush(self.begin_flush())

    def begin_flush(self) -> PendingSync:
        """The writer's half of ``flush``: write_out and take the files to sync. ``finish_flush``
        (any thread; it only fsyncs) makes what was written so far durable."""
        self.write_out()
        with self._fd_lock:
            dirty = sorted(self._dirty_files)
            self._dirty_files.clear()
            dups = [os.dup(self._fd(start, create=False)) for start in dirty if start in self._file_starts]
            self._close_fds()
            dir_dirty, self._dir_dirty = self._dir_dirty, False
        return PendingSync(dups, self._dir if dir_dirty else None)

    def set_base(self, offset: int) -> None:
        """Make an empty queue continue at ``offset`` (durably; files left over are removed)."""
        if offset < 0:
            raise ValueError(f"negative base {offset}")
        with self._lock:
            if self._max_offset != self._min_offset:
                raise ValueError(f"set_base on a non-empty queue [{self._min_offset}, {self._max_offset})")
            self._gen += 1
            with self._fd_lock:
                self._delete_files(len(self._file_starts))
            self._buffer.clear()
            self._written = self._max_offset = self._min_offset = offset
        self._store_min_offset(offset)

    def truncate(self, new_max_offset: int) -> None:
        """Drop units >= new_max_offset, buffered or written (clamped to [min_offset, max_offset])."""
        with self._lock:
            new_max = min(max(new_max_offset, self._min_offset), self._max_offset)
            if new_max == self._max_offset:
                return
            self._gen += 1
            if new_max >= self._written:
                del self._buffer[(new_max - self._written) * UNIT_SIZE :]
            else:
                self._buffer.clear()
                with self._fd_lock:
                    self._truncate_files(new_max)
                self._written = new_max
            self._max_offset = new_max
            emptied = not self._file_starts
        if emptied and self._min_offset != (self._stored_min or 0):  # what recovery would assume
            self._store_min_offset(self._min_offset)

    def _truncate_files(self, new_end: int) -> None:
        keep = bisect.bisect_left(self._file_starts, new_end)  # files starting below new_end stay
        self._delete_files(len(self._file_starts) - keep, from_tail=True)
        if self._file_starts:
            start = self._file_starts[-1]
            os.ftruncate(self._fd(start, create=False), (new_end - start) * UNIT_SIZE)
            self._dirty_files.add(start)

    def truncate_after_position(self, position: int) -> int:
        """Drop tail units whose log position is > ``position``; returns the new max_offset."""
        cut = self._lower_bound(lambda u: u.position > position)
        self.truncate(cut)
        return self._max_offset

    def delete_before_position(self, log_first_position: int) -> int:
        """Retention: raise min_offset to the first unit at or past ``log_first_position`` and delete
        the files below it; returns the number of files removed."""
        new_min = self._lower_bound(lambda u: u.position >= log_first_position)
        if new_min <= self._min_offset:
            return 0
        self._store_min_offset(new_min)  # durable first: recovery finishes the deletion
        with self._lock:
            self._min_offset = new_min
            with self._fd_lock:
                doomed = 0
                for start in self._file_starts:
                    if min(start + self._upf, self._written) > new_min:
                        break
                    doomed += 1
                self._delete_files(doomed)
        return doomed

    def _delete_files(self, count: int, from_tail: bool = False) -> None:
        """Delete ``count`` files from the head (or tail). Caller holds _fd_lock."""
        for _ in range(count):
            start = self._file_starts.pop() if from_tail else self._file_starts.pop(0)
            fd = self._fds.pop(start, None)
            if fd is not None:
                os.close(fd)
            self._dirty_files.discard(start)
            os.unlink(self._path(file_name(start)))
            self._dir_dirty = True

    def destroy(self) -> None:
        """Close and delete the queue's directory (its topic was deleted)."""
        with self._lock:
            self._gen += 1
            self._closed = True
            self._buffer.clear()
            with self._fd_lock:
                self._close_fds()
                self._file_starts = []
                self._dirty_files.clear()
            self._written = self._max_offset = self._min_offset
        shutil.rmtree(self._dir, ignore_errors=True)

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True

    # -- reading -----------------------------------------------------------------------------

    def get(self, offset: int) -> Unit | None:
        units = self.read(offset, 1)
        return units[0] if units else None

    def read(self, offset: int, max_count: int) -> list[Unit]:
        """Units from ``offset``, at most ``max_count``; [] below min_offset or at/after the end."""
        return unpack_units(self._read_bytes(offset, max_count), offset)

    def last_unit(self) -> Unit | None:
        with self._lock:
            last = self._max_offset - 1
            if last < self._min_offset:
                return None
        return self.get(last)

    def search_by_position(self, position: int) -> int | None:
        """Offset of the unit whose log position is exactly ``position``, or None."""
        offset = self._lower_bound(lambda u: u.position >= position)
        unit = self.get(offset)
        return offset if unit is not None and unit.position == position else None

    def search_by_time(self, ts_ms: int) -> int:
        """First offset whose store_ts >= ts_ms (max_offset when none)."""
        return self._lower_bound(lambda u: u.store_ts >= ts_ms)

    def _lower_bound(self, pred: Callable[[Unit], bool]) -> int:
        """First offset in [min_offset, max_offset) whose unit satisfies ``pred`` (monotone), else
        max_offset."""
        with self._lock:
            lo, hi = self._min_offset, self._max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            unit = self.get(mid)
            if unit is None:  # raced with retention (below) or truncation (above)
                if mid < self._min_offset:
                    lo = mid + 1
                else:
                    hi = mid
            elif pred(unit):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _read_bytes(self, offset: int, max_count: int) -> bytes:
        for _ in range(_READ_ATTEMPTS):
            with self._lock:
                plan = self._plan_read(offset, max_count)
            if plan is None:
                return b""
            gen, files_end, buffered = plan
            from_files = self._pread_units(offset, files_end)
            if from_files is not None:
                with self._lock:
                    if self._gen == gen:
                        return from_files + buffered
        with self._lock:  # kept racing with truncation: hold the writer off for this one read
            plan = self._plan_read(offset, max_count)
            if plan is None:
                return b""
            _, files_end, buffered = plan
            from_files = self._pread_units(offset, files_end)
        assert from_files is not None, f"{self._dir}: read at {offset} failed under the lock"
        return from_files + buffered

    def _plan_read(self, offset: int, max_count: int) -> tuple[int, int, bytes] | None:
        """(generation, end of the part to pread, buffered bytes) for a read; None when it is empty.
        Caller holds _lock."""
        end = min(offset + max(max_count, 0), self._max_offset)
        if offset < self._min_offset or offset >= end:
            return None
        written = self._written
        buffered = b""
        if end > written:
            lo = max(offset, written) - written
            buffered = bytes(self._buffer[lo * UNIT_SIZE : (end - written) * UNIT_SIZE])
        return self._gen, min(end, written), buffered

    def _pread_units(self, begin: int, end: int) -> bytes | None:
        """Units [begin, end) from the files; None if a file vanished or came up short (a race)."""
        parts: list[bytes] = []
        offset = begin
        while offset < end:
            with self._fd_lock:
                if not self._file_starts or offset < self._file_starts[0]:
                    return None
                first = self._file_starts[0]
                start = first + (offset - first) // self._upf * self._upf
                if start > self._file_starts[-1]:
                    return None
                n = min(end - offset, start + self._upf - offset)
                try:
                    fd = self._fd(start, create=False)
                except FileNotFoundError:
                    return None
                data = os.pread(fd, n * UNIT_SIZE, (offset - start) * UNIT_SIZE)
            if len(data) != n * UNIT_SIZE:
                return None
            parts.append(data)
            offset += n
        return b"".join(parts)

    # -- files and fds -----------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self._dir, name)

    def _file_for_write(self, offset: int) -> int:
        """Start of the file that takes ``offset`` (registering a new one). Caller holds _fd_lock."""
        if not self._file_starts:
            self._file_starts.append(offset)
            self._dir_dirty = True
            return offset
        last = self._file_starts[-1]
        if offset < last + self._upf:
            assert offset >= last, (offset, last)
            return last
        assert offset == last + self._upf, (offset, last)
        self._file_starts.append(offset)
        self._dir_dirty = True
        return offset

    def _fd(self, start: int, create: bool) -> int:
        """Cached fd of the file starting at ``start``. Caller holds _fd_lock."""
        fd = self._fds.get(start)
        if fd is not None:
            self._fds.move_to_end(start)
            return fd
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(self._path(file_name(start)), flags, 0o644)
        self._fds[start] = fd
        while len(self._fds) > FD_CACHE_MAX:
            _, old = self._fds.popitem(last=False)
            os.close(old)
        return fd

    def _close_fds(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])


# ---------------------------------------------------------------------------------------------


class ConsumeQueueStore:
    """Every consume queue under ``root`` (``<root>/<topic>/<queue_id>/``), opened at start-up.

    Queues that fail to open are listed in ``damaged`` and left out of ``queues()``;
    ``get_or_create`` refuses them until ``reset_queue`` replaced them with an empty queue.
    """

    def __init__(self, root: str, units_per_file: int = 300_000):
        self._root = root
        self._upf = units_per_file
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.damaged: list[tuple[str, int, str]] = []
        os.makedirs(root, exist_ok=True)
        self._discover()

    def _discover(self) -> None:
        for topic in sorted(os.listdir(self._root)):
            topic_dir = os.path.join(self._root, topic)
            if not os.path.isdir(topic_dir) or not is_topic(topic):
                log.warning("ignoring %s: not a topic directory", topic_dir)
                continue
            for name in sorted(os.listdir(topic_dir)):
                if not is_decimal(name) or not os.path.isdir(os.path.join(topic_dir, name)):
                    log.warning("ignoring %s: not a queue directory", os.path.join(topic_dir, name))
                    continue
                try:
                    self._queues[(topic, int(name))] = ConsumeQueue(
                        os.path.join(topic_dir, name), self._upf
                    )
                except ConsumeQueueDamaged as e:
                    log.error("consume queue %s/%s damaged: %s", topic, name, e)
                    self.damaged.append((topic, int(name), e.reason))

    def _queue_dir(self, topic: str, queue_id: int) -> str:
        if not is_topic(topic) or queue_id < 0:
            raise ValueError(f"bad queue {topic!r}/{queue_id}")
        return os.path.join(self._root, topic, str(queue_id))

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        with self._lock:
            return self._queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        with self._lock:
            queue = self._queues.get((topic, queue_id))
            if queue is not None:
                return queue
            for t, q, reason in self.damaged:
                if (t, q) == (topic, queue_id):
                    raise ConsumeQueueDamaged(self._queue_dir(topic, queue_id), reason)
            queue = ConsumeQueue(self._queue_dir(topic, queue_id), self._upf)
            self._queues[(topic, queue_id)] = queue
            return queue

    def reset_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """Replace a (damaged or live) queue by an empty one, ready to be rebuilt from the log."""
        path = self._queue_dir(topic, queue_id)
        with self._lock:
            old = self._queues.pop((topic, queue_id), None)
            if old is not None:
                old.destroy()
            shutil.rmtree(path, ignore_errors=True)
            self.damaged = [d for d in self.damaged if (d[0], d[1]) != (topic, queue_id)]
            queue = ConsumeQueue(path, self._upf)
            self._queues[(topic, queue_id)] = queue
            return queue

    def queues(self) -> list[tuple[str, int, ConsumeQueue]]:
        with self._lock:
            return [(t, q, cq) for (t, q), cq in sorted(self._queues.items(), key=lambda kv: kv[0])]

    def topics(self) -> list[str]:
        with self._lock:
            return sorted({t for t, _ in self._queues})

    def delete_topic(self, topic: str) -> None:
        with self._lock:
            for key in [k for k in self._queues if k[0] == topic]:
                self._queues.pop(key).destroy()
            self.damaged = [d for d in self.damaged if d[0] != topic]
        if is_topic(topic):
            shutil.rmtree(os.path.join(self._root, topic), ignore_errors=True)

    def write_out_all(self) -> None:
        for _, _, queue in self.queues():
            queue.write_out()

    def flush_all(self) -> None:
        for _, _, queue in self.queues():
            queue.flush()

    def begin_flush_all(self) -> list[PendingSync]:
        """The writer's half of ``flush_all``; pass the result to ``finish_flush`` (any thread)."""
        return [queue.begin_flush() for _, _, queue in self.queues()]

    def delete_before_position(self, log_first_position: int) -> int:
        return sum(queue.delete_before_position(log_first_position) for _, _, queue in self.queues())

    def close(self) -> None:
        for _, _, queue in self.queues():
            queue.close()
        with self._lock:
            self._queues.clear()
