"""One conformance suite for both log stores (dledger.log_store): the file store and the memory twin.

Every test runs against each implementation (the file store with its recent-entries window and
without it); the differential test runs the same random script of operations on all of them and
requires identical answers (positions, chain CRCs, segment layout, reads).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dledger.clock import ManualClock
from dledger.entry_codec import HEADER_SIZE, decode_header
from dledger.entry_store import EntryStore
from dledger.log_store import (
    EntryTooLargeError,
    IndexOutOfRangeError,
    LogStore,
    PositionOutOfRangeError,
    StoreClosedError,
)
from dledger.memory_store import MemoryLogStore

SEG = 4096


def body(i: int, term: int = 1, size: int = 100) -> bytes:
    return (f"<{i}:{term}>".encode() * (size // 6 + 1))[:size]


# file: every entry a test writes stays in the recent-entries window (reads come from memory);
# file-uncached: no window (reads come from disk); file-small-window: about ten 100-byte entries.
RECENT_BYTES = {"file": 16 << 20, "file-uncached": 0, "file-small-window": 1000}


class Impl:
    """Makes a store and reopens it as a restart would (everything flushed survives)."""

    def __init__(self, kind: str, root: Path, clock: ManualClock):
        self.kind = kind
        self.root = root / kind
        self.clock = clock

    def make(self, segment_bytes: int = SEG) -> Any:
        if self.kind in RECENT_BYTES:
            return self._open(segment_bytes)
        return MemoryLogStore(segment_bytes, clock=self.clock)

    def _open(self, segment_bytes: int) -> EntryStore:
        return EntryStore(
            str(self.root / "store"),
            segment_bytes=segment_bytes,
            index_records_per_file=64,
            clock=self.clock,
            recent_bytes=RECENT_BYTES[self.kind],
        )

    def reopen(self, store: Any) -> Any:
        store.flush()
        if self.kind in RECENT_BYTES:
            store.close()
            return self._open(store.segment_bytes)
        return store.crash_image(keep_unsynced=0)


@pytest.fixture(params=["file", "file-uncached", "memory"])
def impl(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Impl]:
    yield Impl(request.param, tmp_path, ManualClock())


def fill(store: LogStore, first: int, last: int, term: int = 1, size: int = 100) -> list[int]:
    return store.append_many([(i, term, body(i, term, size)) for i in range(first, last + 1)])


# -- the contract ---------------------------------------------------------------------------------
def test_round_trip(impl: Impl) -> None:
    s = impl.make()
    assert (s.first_index, s.last_index, s.last_term, s.anchor) == (1, 0, 0, (0, 0, 0))
    positions = fill(s, 1, 30)
    assert positions[0] == 0 and s.last_index == 30
    for i in (1, 7, 30):
        e = s.read(i)
        assert (e.index, e.term, e.body, e.position) == (i, 1, body(i), positions[i - 1])
        assert s.term_at(i) == 1 and s.chain_crc_at(i) == e.chain_crc and s.position_at(i) == e.position
    assert s.last_chain_crc == s.read(30).chain_crc
    with pytest.raises(IndexOutOfRangeError):
        s.read(31)
    with pytest.raises(IndexOutOfRangeError):
        s.read(0)


def test_append_is_checked(impl: Impl) -> None:
    s = impl.make()
    fill(s, 1, 3, term=2)
    with pytest.raises(ValueError, match="expected 4"):
        s.append(5, 2, b"x")
    with pytest.raises(ValueError, match="term"):
        s.append(4, 1, b"x")
    with pytest.raises(EntryTooLargeError):
        s.append(4, 2, b"x" * SEG)
    assert s.last_index == 3


def test_read_range_limits(impl: Impl) -> None:
    s = impl.make()
    fill(s, 1, 50, size=100)
    assert [e.index for e in s.read_range(10, 5, 1 << 20)] == [10, 11, 12, 13, 14]
    assert [e.index for e in s.read_range(10, 100, 250)] == [10, 11]  # 200 <= 250 < 300
    assert [e.index for e in s.read_range(10, 100, 1)] == [10]  # at least one
    assert s.read_range(51, 10, 1 << 20) == []


def test_flush_clears_dirty(impl: Impl) -> None:
    s = impl.make()
    assert not s.dirty
    fill(s, 1, 3)
    assert s.dirty
    s.flush()
    assert not s.dirty


def test_segments_roll_with_padding_and_seal_times(impl: Impl) -> None:
    s = impl.make()
    fill(s, 1, 100, size=300)
    segs = s.segments()
    assert len(segs) > 5
    assert [g.start_position for g in segs] == [k * SEG for k in range(len(segs))]
    for g, nxt in itertools.pairwise(segs):
        assert nxt.first_index == g.last_index + 1
        end = s.position_at(g.last_index) + HEADER_SIZE + len(s.read(g.last_index).body)
        assert g.size_bytes in (end - g.start_position, end - g.start_position + 4)  # BLANK if it fits
        assert SEG - (end - g.start_position) < HEADER_SIZE + len(s.read(nxt.first_index).body)
    assert all(g.sealed_wall_s == impl.clock.wall() for g in segs[:-1]) and segs[-1].sealed_wall_s is None
    assert s.next_position == segs[-1].start_position + segs[-1].size_bytes
    assert s.bytes_stored == sum(g.size_bytes for g in segs)


def test_read_at_position_returns_the_log_bytes(impl: Impl) -> None:
    s = impl.make()
    fill(s, 1, 20)
    e = s.read(5)
    raw = s.read_at_position(e.position, HEADER_SIZE + len(e.body))
    head = decode_header(raw)
    assert (head.index, head.term, head.position, head.chain_crc) == (5, 1, e.position, e.chain_crc)
    assert raw[HEADER_SIZE:] == e.body
    assert s.read_at_position(e.position + HEADER_SIZE + 10, 20) == e.body[10:30]
    with pytest.raises(PositionOutOfRangeError):
        s.read_at_position(s.next_position + 100, 10)


def test_truncate_suffix_then_continue(impl: Impl) -> None:
    s = impl.make()
    fill(s, 1, 60, size=300)
    cut_position = s.position_at(25)
    s.truncate_suffix(25)
    assert s.last_index == 24 and not s.dirty
    with pytest.raises(IndexOutOfRangeError):
        s.read(25)
    assert fill(s, 25, 30, term=2)[0] == cut_position
    assert s.read(30).body == body(30, 2, 100) and s.term_at(24) == 1
    with pytest.raises(IndexOutOfRangeError):
        s.truncate_suffix(0)


def test_reset_then_append_after_the_anchor(impl: Impl) -> None:
    s = impl.make()
    fill(s, 1, 20)
    s.reset(500, 7, 0xABCDEF)
    assert (s.anchor, s.first_index, s.last_index, s.last_term, s.segments()) == (
        (500, 7, 0xABCDEF),
        501,
        500,
        7,
        [],
    )
    assert (s.term_at(500), s.chain_crc_at(500)) == (7, 0xABCDEF)
    positions = fill(s, 501, 503, term=7)
    assert positions[0] == SEG  # continues at the next segment boundary
    s = impl.reopen(s)
    assert (s.anchor, s.last_index, s.read(503).body) == ((500, 7, 0xABCDEF), 503, body(503, 7))


def test_delete_segments_before_moves_the_anchor(impl: Impl) -> None:
    s = impl.make()
    fill(s, 1, 100, size=300)
    segs = s.segments()
    removed = s.delete_segments_before(segs[3].first_index)
    assert removed == 3
    assert s.anchor[0] == segs[2].last_index and s.first_index == segs[3].first_index
    with pytest.raises(IndexOutOfRangeError):
        s.read(segs[2].last_index)
    assert s.term_at(s.anchor[0]) == 1
    s = impl.reopen(s)
    assert s.first_index == segs[3].first_index and s.read(100).body == body(100, 1, 300)
    held = len(s.segments())
    assert s.delete_segments_before(10**9) == held - 1  # never the last segment
    assert s.last_index == 100


def test_restart_keeps_everything_flushed(impl: Impl) -> None:
    s = impl.make()
    fill(s, 1, 40, size=300)
    before = [(e.index, e.term, e.position, e.chain_crc, e.body) for e in s.read_range(1, 100, 1 << 30)]
    s = impl.reopen(s)
    after = [(e.index, e.term, e.position, e.chain_crc, e.body) for e in s.read_range(1, 100, 1 << 30)]
    assert before == after
    assert fill(s, 41, 41)[0] == s.position_at(41)


def test_closed_store_refuses(impl: Impl) -> None:
    s = impl.make()
    fill(s, 1, 2)
    s.close()
    with pytest.raises(StoreClosedError):
        s.read(1)


# -- differential: same script, same answers ----------------------------------------------------
def _script(rng: random.Random, steps: int) -> Iterator[tuple[str, int, int]]:
    for _ in range(steps):
        yield (
            rng.choice(["append", "append", "append", "flush", "truncate", "retain", "reset"]),
            rng.randint(1, 40),
            rng.randint(0, 900),
        )


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_both_stores_answer_alike(tmp_path: Path, seed: int) -> None:
    clock = ManualClock()
    impls = [Impl(kind, tmp_path, clock) for kind in ("memory", "file-uncached", "file-small-window", "file")]
    stores = [i.make() for i in impls]
    rng = random.Random(seed)
    term = 1

    def observe(s: Any) -> tuple[Any, ...]:
        segs = [(g.start_position, g.first_index, g.last_index, g.size_bytes) for g in s.segments()]
        entries = [
            (e.index, e.term, e.position, e.chain_crc, e.body)
            for e in s.read_range(s.first_index, 10_000, 1 << 30)
        ]
        # Point reads and bounded ranges near the tail, where the recent-entries window answers.
        probes: list[Any] = []
        for index in range(max(s.first_index, s.last_index - 25), s.last_index + 1):
            e = s.read(index)
            probes.append((e.index, e.term, e.position, e.chain_crc, e.body))
            probes.append((s.term_at(index), s.chain_crc_at(index), s.position_at(index)))
            probes.append([e.index for e in s.read_range(index, 7, 350)])
        return (s.anchor, s.last_index, s.last_term, s.last_chain_crc, s.next_position, segs, entries, probes)

    for op, n, size in _script(rng, 120):
        last = stores[0].last_index
        do: Callable[[Any], Any]
        if op == "append":
            if rng.random() < 0.2:
                term += 1
            batch = [(last + 1 + k, term, body(last + 1 + k, term, size)) for k in range(n)]
            do = lambda s, b=batch: s.append_many(b)  # noqa: E731
        elif op == "flush":
            do = lambda s: s.flush()  # noqa: E731
        elif op == "truncate" and last > stores[0].anchor[0]:
            at = rng.randint(stores[0].anchor[0] + 1, last)
            do = lambda s, a=at: s.truncate_suffix(a)  # noqa: E731
        elif op == "retain" and last:
            floor = rng.randint(stores[0].first_index, last + 1)
            do = lambda s, f=floor: s.delete_segments_before(f)  # noqa: E731
        elif op == "reset" and rng.random() < 0.2:
            anchor = (last + rng.randint(0, 50), term, rng.randint(0, 0xFFFFFFFF))
            do = lambda s, a=anchor: s.reset(*a)  # noqa: E731
        else:
            continue
        answers = [do(s) for s in stores]
        assert all(a == answers[0] for a in answers), (seed, op)
        seen = [observe(s) for s in stores]
        assert all(o == seen[0] for o in seen), (seed, op)
    stores = [i.reopen(s) for i, s in zip(impls, stores, strict=True)]
    seen = [observe(s) for s in stores]
    assert all(o == seen[0] for o in seen)
