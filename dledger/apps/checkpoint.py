"""ApplyCheckpoint: the standalone node's state machine, and the reference for durable applying.

It keeps three numbers: the last applied Raft index, how many bodies were applied, and a digest
(a CRC32 chained over every applied body in log order). Replicas that applied the same entries
have the same digest, so tests compare state machines across nodes and across restarts.

The record is written to one of two fixed slots, alternating, each with its own CRC and a
sequence number; a torn write spoils at most the slot being written and the other still holds the
previous state. The record *is* the whole state together with the index it reflects, so an entry
is never applied twice: whatever record survives a crash, applying resumes right after the index
stored with that state. (A lost write rolls state and index back together, so ``apply`` need not
fsync; ``close`` does.)

    slot A (offset 0)      slot B (offset 40)
    +-----+-----+-------+--------+------+-----+
    | seq | idx | count | digest | anch | crc |   '<QQQIII' = 36 bytes (+4 pad)
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dledger.node import CommittedEntry

_REC = struct.Struct("<QQQIII")
_SLOT_BYTES = 40


class ApplyCheckpoint:
    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.seq = 0
        self.index = 0
        self.bodies = 0
        self.digest = 0
        self.anchor = 0
        self._load()

    def _load(self) -> None:
        raw = os.pread(self._fd, 2 * _SLOT_BYTES, 0)
        best = None
        for slot in range(2):
            chunk = raw[slot * _SLOT_BYTES : slot * _SLOT_BYTES + _REC.size]
            if len(chunk) < _REC.size:
                continue
            seq, index, bodies, digest, anchor, crc = _REC.unpack(chunk)
            if zlib.crc32(chunk[:-4]) != crc:
                continue
            if best is None or seq > best[0]:
                best = (seq, index, bodies, digest, anchor)
        if best is not None:
            self.seq, self.index, self.bodies, self.digest, self.anchor = best

    def _store(self) -> None:
        self.seq += 1
        body = _REC.pack(self.seq, self.index, self.bodies, self.digest, self.anchor, 0)[:-4]
        record = body + struct.pack("<I", zlib.crc32(body))
        os.pwrite(self._fd, record, (self.seq % 2) * _SLOT_BYTES)

    # -- StateMachine ------------------------------------------------------------------------
    def applied_index(self) -> int:
        return self.index

    def durable_applied_index(self) -> int:
        # Written without fsync: survives a process kill (the record is in the page cache), which
        # is the standalone node's promise; the broker's store snapshots with fsync.
        return self.index

    def checkpoint(self) -> None:
        pass  # every apply already writes the record

    def apply(self, entries: Sequence[CommittedEntry]) -> None:
        for entry in entries:
            assert entry.index == self.index + 1, f"apply out of order: got {entry.index} after {self.index}"
            for _pos, body in entry.bodies:
                self.digest = zlib.crc32(body, self.digest)
                self.bodies += 1
            self.index = entry.index
        self._store()

    def on_install(self, anchor_index: int) -> None:
        # The entries before the anchor are gone everywhere: the digest restarts from there.
        self.index = anchor_index
        self.anchor = anchor_index
        self.bodies = 0
        self.digest = 0
        self._store()

    def close(self) -> None:
        if self._fd >= 0:
            os.fdatasync(self._fd)
            os.close(self._fd)
            self._fd = -1
