"""The entry store's files: segment and index files that readers pin, and small I/O helpers.

Names: segments and index files are named by a 20-digit number (a segment's first global byte
position; an index file's first Raft index), so ``ls`` sorts them in log order.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence

log = logging.getLogger("dledger.entry_store")

NAME_DIGITS = 20
SCAN_CHUNK_BYTES = 1 << 20
IOV_MAX = 512


class SegmentFile:
    """An open file that readers pin while they pread; closed once retired and unpinned."""

    __slots__ = ("fd", "path", "pins", "retired")

    def __init__(self, path: str, fd: int):
        self.path = path
        self.fd = fd
        self.pins = 0
        self.retired = False


class Segment:
    __slots__ = ("file", "first_index", "last_index", "sealed", "sealed_wall_s", "size", "start")

    def __init__(self, start: int, file: SegmentFile, size: int, first_index: int):
        self.start = start
        self.file = file
        self.size = size  # bytes published to readers (entries, and the BLANK marker once sealed)
        self.first_index = first_index
        self.last_index = first_index - 1  # empty until an entry is published
        self.sealed = False  # ends with BLANK or is full: the next entry goes to a new segment
        self.sealed_wall_s: float | None = None  # when it was sealed, on the store's clock


def file_name(n: int) -> str:
    return f"{n:0{NAME_DIGITS}d}"


def numbered(directory: str) -> list[int]:
    names = os.listdir(directory)
    odd = [n for n in names if not (len(n) == NAME_DIGITS and n.isdigit()) and not n.endswith(".tmp")]
    if odd:
        log.warning("ignoring unexpected files in %s: %s", directory, sorted(odd))
    return sorted(int(n) for n in names if len(n) == NAME_DIGITS and n.isdigit())


def pwrite_all(fd: int, parts: Sequence[bytes], offset: int, total: int = -1) -> None:
    """Write ``parts`` back to back at ``offset`` (``total``: their summed size, when known)."""
    if total >= 0 and len(parts) <= IOV_MAX and os.pwritev(fd, parts, offset) == total:
        return  # the common case: one syscall, complete
    for k in range(0, len(parts), IOV_MAX):
        chunk = parts[k : k + IOV_MAX]
        want = sum(len(p) for p in chunk)
        done = os.pwritev(fd, chunk, offset)
        if done < want:  # short write (rare on regular files): finish it byte-wise
            rest = memoryview(b"".join(chunk))[done:]
            while rest:
                n = os.pwrite(fd, rest, offset + done)
                done += n
                rest = rest[n:]
        offset += want


def age_on_filesystem_clock(fd: int) -> float:
    """Seconds since the file was last written, measured on the clock that stamped its mtime.

    File times come from the kernel's wall clock, not from the store's injected clock: the age is
    taken on the kernel's clock (the one deliberate read of it here) and only the age, a duration,
    crosses over to the injected clock (recovery turns it into a seal time on that clock).
    """
    return max(0.0, time.time() - os.fstat(fd).st_mtime)


class Chunks:
    """Sequential positioned reads of ``fd`` in chunks of ``chunk_bytes`` (default 1 MiB; whole
    records when they are larger). Reads only: the Spark replica reader uses it too."""

    def __init__(self, fd: int, chunk_bytes: int = SCAN_CHUNK_BYTES):
        self._fd = fd
        self._chunk_bytes = chunk_bytes
        self._buf = b""
        self._start = 0

    def view(self, offset: int, size: int) -> memoryview:
        if not (self._start <= offset and offset + size <= self._start + len(self._buf)):
            self._buf = os.pread(self._fd, max(size, self._chunk_bytes), offset)
            self._start = offset
        at = offset - self._start
        return memoryview(self._buf)[at : at + size]
