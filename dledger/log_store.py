"""The log-store interface: what the Raft journal, the node and the broker ask of the entry log.

Two implementations keep the same contract and pass one conformance suite
(tests/dledger/test_log_store_conformance.py):

- ``dledger.entry_store.EntryStore``: segmented, checksummed files (production);
- ``dledger.memory_store.MemoryLogStore``: in memory, with a model of what a crash keeps (the
  deterministic simulator and fast tests).

Contract (both):
- Entries ``anchor_index + 1 .. last_index``, contiguous, terms non-decreasing; each entry's chain
  CRC is derived from the one before (the first from the anchor's). ``anchor`` stands for everything
  before the first held entry (retention or a re-anchor removed it).
- Positions are global byte positions of entry headers, laid out the same way by both
  implementations (``header_bytes`` + body per entry, segments of ``segment_bytes`` with a BLANK
  marker where it fits): a message's position is the same whichever store holds it.
- ``append``/``append_many`` reach volatile storage; ``flush`` makes everything appended durable.
  ``truncate_suffix``, ``reset`` and ``delete_segments_before`` are durable when they return.
- One writer thread; ``flush`` and reads may come from any thread.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dledger.entry_codec import CorruptEntryError, StoreError

__all__ = [
    "CorruptEntryError",
    "CorruptStoreError",
    "Entry",
    "EntryTooLargeError",
    "IndexOutOfRangeError",
    "LogStore",
    "PositionOutOfRangeError",
    "SegmentInfo",
    "StaleReadError",
    "StoreClosedError",
    "StoreError",
    "StoreFailedError",
    "StoreFullError",
]

# errnos that mean "the file system has no room for this write" (EFBIG: the file size limit,
# RLIMIT_FSIZE with SIGXFSZ ignored): refused and undone, not fatal.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class CorruptStoreError(StoreError):
    """The store's files contradict each other in a way a crash cannot explain; not repaired."""

    code = "STORE_CORRUPT"

    def __init__(self, message: str, path: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.path = path
        self.offset = offset


class EntryTooLargeError(StoreError):
    code = "STORE_ENTRY_TOO_LARGE"


class IndexOutOfRangeError(StoreError):
    code = "STORE_INDEX_OUT_OF_RANGE"


class PositionOutOfRangeError(IndexOutOfRangeError):
    code = "STORE_POSITION_OUT_OF_RANGE"


class StaleReadError(StoreError):
    """A read kept racing with truncate_suffix/reset; retry later."""

    code = "STORE_STALE_READ"


class StoreClosedError(StoreError):
    code = "STORE_CLOSED"


class StoreFullError(StoreError):
    """The file system had no room for a write (``FULL_ERRNOS``): the write was undone (no partial
    entry is left, in memory or on disk) and the store takes writes again once there is room.
    ``needed``: the bytes the refused write wanted."""

    code = "STORE_FULL"

    def __init__(self, message: str, needed: int = 0, errno_: int = errno.ENOSPC):
        super().__init__(message)
        self.needed = needed
        self.errno = errno_

    def __reduce__(self) -> tuple[object, ...]:
        return type(self), (self.args[0], self.needed, self.errno), self.__dict__


class StoreFailedError(StoreError):
    """A write, fdatasync or fsync of the log failed in a way that leaves what is on disk unknown
    (EIO, ...). The store refuses every later write and flush with this error: a failed fsync is
    never retried (after it the kernel may have dropped the dirty pages and marked them clean, so a
    second fsync can succeed without the data: "fsyncgate"). The replica fails stop on it."""

    code = "STORE_FAILED"


def describe_os_error(exc: OSError) -> str:
    """``[Errno 5] EIO (Input/output error)``: the number, its name and the system's text."""
    num = exc.errno if exc.errno is not None else 0
    name = errno.errorcode.get(num, "?")
    return f"[Errno {num}] {name} ({exc.strerror or os.strerror(num)})"


@dataclass(frozen=True, slots=True)
class Entry:
    index: int
    term: int
    position: int
    body: bytes
    chain_crc: int


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    start_position: int
    first_index: int  # last_index + 1 when the segment holds no entry
    last_index: int
    size_bytes: int
    # When the segment was sealed (no more appends), on the store's injected wall clock; None for
    # the segment being written. Retention compares it with the same clock, never with file times.
    sealed_wall_s: float | None
    path: str


class LogReader(Protocol):
    """What a state machine (the broker's message store) may use of its replica's log: reads of
    committed entries and records by position, and ``flush`` so that a snapshot never claims more
    than the log holds on disk (any thread: the store's snapshot thread calls it; what was written
    before the call is durable when it returns). ``DLedgerNode.log``."""

    header_bytes: int

    @property
    def first_index(self) -> int: ...

    @property
    def last_index(self) -> int: ...

    @property
    def next_position(self) -> int: ...

    @property
    def dirty(self) -> bool: ...

    def read(self, index: int) -> Entry: ...

    def read_range(self, first: int, max_count: int, max_bytes: int) -> list[Entry]: ...

    def position_at(self, index: int) -> int: ...

    def read_at_position(self, position: int, size: int) -> bytes: ...

    def flush(self) -> None: ...


class LogStore(LogReader, Protocol):
    """The whole log (the replica's own use): LogReader's reads plus appends, truncation,
    anchors and retention."""

    segment_bytes: int

    @property
    def anchor(self) -> tuple[int, int, int]: ...

    @property
    def last_term(self) -> int: ...

    @property
    def last_chain_crc(self) -> int: ...

    @property
    def bytes_stored(self) -> int: ...

    def term_at(self, index: int) -> int: ...

    def chain_crc_at(self, index: int) -> int: ...

    def append(self, index: int, term: int, body: bytes) -> int: ...

    def append_many(self, entries: Sequence[tuple[int, int, bytes]]) -> list[int]: ...

    def truncate_suffix(self, from_index: int) -> None: ...

    def reset(self, anchor_index: int, anchor_term: int, anchor_chain_crc: int) -> None: ...

    def segments(self) -> list[SegmentInfo]: ...

    def delete_segments_before(self, index_floor: int) -> int: ...

    def close(self) -> None: ...
