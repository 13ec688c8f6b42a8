"""MemoryLogStore: the log store in memory, with a model of what a crash keeps.

Same contract as the file store (``dledger.log_store``), including positions: entries are laid out
as if written to segments of ``segment_bytes`` (header + body, a BLANK marker where it fits), so a
message has the same position in either store and the broker's consume queues work unchanged.

Crash model (``crash_image``): what was flushed survives; of what was appended since, a random
prefix survives (the page cache wrote some of it back before the power went), the rest is lost; a
record torn in the middle is cut by recovery, which is the same as losing it. ``truncate_suffix``,
``reset`` and ``delete_segments_before`` are durable when they return, as on disk. Slow fsync is
the simulator's business (it charges simulated time per ``flush``: see ``flushes``).

Threads: one writer; ``flush`` and reads from any thread (one lock, held briefly).
"""

from __future__ import annotations

import bisect
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from dledger.clock import SYSTEM, Clock
from dledger.entry_codec import BLANK_SIZE, HEADER_SIZE, encode_header, pack_header
from dledger.log_store import (
    Entry,
    EntryTooLargeError,
    IndexOutOfRangeError,
    PositionOutOfRangeError,
    SegmentInfo,
    StoreClosedError,
)


@dataclass(slots=True)
class _Seg:
    start: int
    size: int
    first_index: int
    last_index: int
    sealed: bool = False
    sealed_wall_s: float | None = None


class MemoryLogStore:
    header_bytes = HEADER_SIZE

    def __init__(self, segment_bytes: int = 1 << 30, clock: Clock = SYSTEM, name: str = "memory"):
        if segment_bytes < 2 * HEADER_SIZE:
            raise ValueError(f"segment_bytes must be at least {2 * HEADER_SIZE}")
        self.segment_bytes = segment_bytes
        self.path = name
        self._clock = clock
        self._lock = threading.Lock()
        self._closed = False
        self._anchor: tuple[int, int, int] = (0, 0, 0)
        self._floor_position = 0
        self._entries: list[Entry] = []  # anchor_index + 1 .. last_index
        self._positions: list[int] = []  # entry positions, for bisect
        self._segs: list[_Seg] = []
        self._synced = 0  # entries[:_synced] are durable
        # (index, term) of entries a failed fsync dropped (fsyncgate): a crash image ends before
        # the first of them, whatever later flushes said (the simulator's fsync-error fault).
        self._lost: set[tuple[int, int]] = set()
        self.flushes = 0

    # -- state --------------------------------------------------------------------------------
    @property
    def anchor(self) -> tuple[int, int, int]:
        return self._anchor

    @property
    def first_index(self) -> int:
        return self._anchor[0] + 1

    @property
    def last_index(self) -> int:
        return self._anchor[0] + len(self._entries)

    @property
    def last_term(self) -> int:
        return self._entries[-1].term if self._entries else self._anchor[1]

    @property
    def last_chain_crc(self) -> int:
        return self._entries[-1].chain_crc if self._entries else self._anchor[2]

    @property
    def next_position(self) -> int:
        with self._lock:
            if not self._segs:
                return self._floor_position
            seg = self._segs[-1]
            return self._next_start(seg) if seg.sealed else seg.start + seg.size

    @property
    def bytes_stored(self) -> int:
        with self._lock:
            return sum(s.size for s in self._segs)

    @property
    def dirty(self) -> bool:
        return self._synced < len(self._entries)

    def _next_start(self, seg: _Seg) -> int:
        return seg.start + max(self.segment_bytes, seg.size)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"memory store {self.path} is closed")

    # -- reads ----------------------------------------------------------------------------------
    def _at(self, index: int) -> Entry:
        k = index - self._anchor[0] - 1
        if not 0 <= k < len(self._entries):
            raise IndexOutOfRangeError(
                f"index {index} outside [{self.first_index}, {self.last_index}] of {self.path}"
            )
        return self._entries[k]

    def read(self, index: int) -> Entry:
        with self._lock:
            self._check_open()
            return self._at(index)

    def read_range(self, first: int, max_count: int, max_bytes: int) -> list[Entry]:
        with self._lock:
            self._check_open()
            if first < self.first_index:
                raise IndexOutOfRangeError(
                    f"index {first} is below the store's first index {self.first_index}"
                )
            out: list[Entry] = []
            size = 0
            k = first - self._anchor[0] - 1
            while k < len(self._entries) and len(out) < max_count:
                e = self._entries[k]
                if out and size + len(e.body) > max_bytes:
                    break
                out.append(e)
                size += len(e.body)
                k += 1
                if size >= max_bytes:
                    break
            return out

    def term_at(self, index: int) -> int:
        with self._lock:
            self._check_open()
            if index == self._anchor[0]:
                return self._anchor[1]
            return self._at(index).term

    def chain_crc_at(self, index: int) -> int:
        with self._lock:
            self._check_open()
            if index == self._anchor[0]:
                return self._anchor[2]
            return self._at(index).chain_crc

    def position_at(self, index: int) -> int:
        with self._lock:
            self._check_open()
            return self._at(index).position

    def read_at_position(self, position: int, size: int) -> bytes:
        with self._lock:
            self._check_open()
            k = bisect.bisect_right(self._positions, position) - 1
            if size < 0 or k < 0:
                raise PositionOutOfRangeError(f"{size} bytes at position {position} are not in the log")
            out = bytearray()
            at = position
            while len(out) < size and k < len(self._entries):
                e = self._entries[k]
                raw = _encoded(e, self._entries[k - 1].chain_crc if k > 0 else self._anchor[2])
                if not e.position <= at < e.position + len(raw):
                    break
                take = raw[at - e.position : at - e.position + size - len(out)]
                out += take
                at += len(take)
                k += 1
            if len(out) != size:
                raise PositionOutOfRangeError(f"{size} bytes at position {position} are not in the log")
            return bytes(out)

    # -- appends --------------------------------------------------------------------------------
    def append(self, index: int, term: int, body: bytes) -> int:
        return self.append_many([(index, term, body)])[0]

    def append_many(self, entries: Sequence[tuple[int, int, bytes]]) -> list[int]:
        self._check_open()
        last_index, last_term, prev_chain = self.last_index, self.last_term, self.last_chain_crc
        for k, (i, t, body) in enumerate(entries):
            if i != last_index + 1 + k:
                raise ValueError(f"append of index {i}: expected {last_index + 1 + k}")
            if t < last_term:
                raise ValueError(f"append of index {i} with term {t} after term {last_term}")
            last_term = t
            if HEADER_SIZE + len(body) > self.segment_bytes:
                raise EntryTooLargeError(
                    f"entry {i} of {len(body)} body bytes does not fit a segment of {self.segment_bytes} "
                    f"bytes (max body {self.segment_bytes - HEADER_SIZE})"
                )
        positions = []
        with self._lock:
            for index, term, body in entries:
                total = HEADER_SIZE + len(body)
                seg = self._segs[-1] if self._segs else None
                if seg is None or seg.sealed or seg.size + total > self.segment_bytes:
                    seg = self._roll_locked(seg)
                position = seg.start + seg.size
                head = encode_header(index, term, position, body, prev_chain)
                entry = Entry(index, term, position, bytes(body), head.chain_crc)
                self._entries.append(entry)
                self._positions.append(position)
                if seg.size == 0:
                    seg.first_index = index
                seg.size += total
                seg.last_index = index
                prev_chain = head.chain_crc
                positions.append(position)
        return positions

    def _roll_locked(self, seg: _Seg | None) -> _Seg:
        if seg is None:
            start = self._floor_position
        else:
            if not seg.sealed:
                if self.segment_bytes - seg.size >= BLANK_SIZE:
                    seg.size += BLANK_SIZE
                seg.sealed = True
            if seg.sealed_wall_s is None:
                seg.sealed_wall_s = self._clock.wall()
            start = self._next_start(seg)
            # As on disk: sealing a segment makes it and everything before it durable.
            self._synced = len(self._entries)
            self.flushes += 1
        new = _Seg(start, 0, self.last_index + 1, self.last_index)
        self._segs.append(new)
        return new

    def flush(self) -> None:
        """Any thread (like the file store's): what was appended before the call is durable."""
        with self._lock:
            if self.dirty:
                self._synced = len(self._entries)
                self.flushes += 1

    def lose_unsynced(self) -> None:
        """A failed fsync: the entries written since the last flush never reach the disk (the
        kernel dropped their pages and marked them clean: a later flush "succeeds" without them)."""
        with self._lock:
            self._lost.update((e.index, e.term) for e in self._entries[self._synced :])

    # -- truncation, reset, retention (durable on return) ---------------------------------------
    def truncate_suffix(self, from_index: int) -> None:
        self._check_open()
        if not self._anchor[0] < from_index <= self.last_index + 1:
            raise IndexOutOfRangeError(
                f"truncate_suffix({from_index}) outside ({self._anchor[0]}, {self.last_index + 1}]"
            )
        if from_index == self.last_index + 1:
            return
        with self._lock:
            cut = self._at(from_index).position
            keep = from_index - self._anchor[0] - 1
            del self._entries[keep:], self._positions[keep:]
            k = max(i for i, s in enumerate(self._segs) if s.start <= cut)
            del self._segs[k + 1 :]
            seg = self._segs[k]
            seg.size, seg.sealed, seg.sealed_wall_s, seg.last_index = (
                cut - seg.start,
                False,
                None,
                from_index - 1,
            )
            if seg.size == 0:
                seg.first_index = from_index
            self._synced = len(self._entries)  # the file store fdatasyncs the cut segment

    def reset(self, anchor_index: int, anchor_term: int, anchor_chain_crc: int) -> None:
        self._check_open()
        if anchor_index < 0 or anchor_term < 0 or not 0 <= anchor_chain_crc <= 0xFFFFFFFF:
            raise ValueError(f"bad anchor {(anchor_index, anchor_term, anchor_chain_crc)}")
        with self._lock:
            floor = self._next_start(self._segs[-1]) if self._segs else self._floor_position
            self._anchor = (anchor_index, anchor_term, anchor_chain_crc)
            self._floor_position = floor
            self._entries.clear()
            self._positions.clear()
            self._segs.clear()
            self._synced = 0

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
                    f"{self.path}/{s.start:020d}",
                )
                for s in self._segs
            ]

    def delete_segments_before(self, index_floor: int) -> int:
        self._check_open()
        with self._lock:
            doomed = 0
            for seg in self._segs[:-1]:
                if seg.size == 0 or seg.last_index >= index_floor or seg.last_index >= self.last_index:
                    break
                doomed += 1
            if not doomed:
                return 0
            anchor_index = self._segs[doomed - 1].last_index
            anchor_entry = self._at(anchor_index)
            drop = anchor_index - self._anchor[0]
            self._anchor = (anchor_index, anchor_entry.term, anchor_entry.chain_crc)
            self._floor_position = self._segs[doomed].start
            del self._entries[:drop], self._positions[:drop], self._segs[:doomed]
            self._synced = max(0, self._synced - drop)
            return doomed

    def close(self) -> None:
        self._closed = True

    # -- crash model ----------------------------------------------------------------------------
    def crash_image(
        self, rng: random.Random | None = None, *, keep_unsynced: int | None = None
    ) -> MemoryLogStore:
        """The store as recovery finds it after a power loss now (this object is left as it was).

        Keeps every flushed entry and a prefix of the unflushed ones: ``keep_unsynced`` of them, or a
        random number drawn from ``rng`` (none when neither is given).
        """
        with self._lock:
            unsynced = len(self._entries) - self._synced
            if keep_unsynced is None:
                keep_unsynced = rng.randint(0, unsynced) if (rng is not None and unsynced) else 0
            keep = self._synced + max(0, min(keep_unsynced, unsynced))
            if self._lost:
                keep = next(
                    (k for k in range(keep) if (self._entries[k].index, self._entries[k].term) in self._lost), keep
                )
            image = MemoryLogStore(self.segment_bytes, self._clock, self.path)
            image._anchor = self._anchor
            image._floor_position = self._floor_position
            image._entries = self._entries[:keep]
            image._positions = self._positions[:keep]
            image._synced = keep  # what recovery found is on disk
            last = image._entries[-1] if image._entries else None
            last_index = image.last_index
            for seg in self._segs:
                if seg.size > 0 and seg.first_index > last_index:
                    break  # written after the cut: gone (never flushed, so never sealed)
                copy = _Seg(
                    seg.start, seg.size, seg.first_index, seg.last_index, seg.sealed, seg.sealed_wall_s
                )
                if seg.size > 0 and seg.last_index > last_index:
                    # The cut falls inside this segment: its tail is gone and it is the last one.
                    assert last is not None and last.index >= seg.first_index
                    copy.size = last.position + HEADER_SIZE + len(last.body) - seg.start
                    copy.last_index = last_index
                    copy.sealed, copy.sealed_wall_s = False, None
                    image._segs.append(copy)
                    break
                image._segs.append(copy)
            return image


def _encoded(entry: Entry, prev_chain_crc: int) -> bytes:
    """The entry's bytes as the file store lays them out (header + body)."""
    head = encode_header(entry.index, entry.term, entry.position, entry.body, prev_chain_crc)
    assert head.chain_crc == entry.chain_crc
    return pack_header(head) + entry.body
