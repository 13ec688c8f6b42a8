"""EntryStore: append, read, segment roll, recovery, torn tail, corruption, truncation, retention."""

from __future__ import annotations

import itertools
import logging
import os
import resource
import zlib
from typing import Any

import pytest

from dledger.entry_codec import HEADER_SIZE, chain_crc
from dledger.entry_store import (
    CorruptStoreError,
    EntryStore,
    EntryTooLargeError,
    IndexOutOfRangeError,
)

SEG = 4096


def body(i: int, size: int = 100) -> bytes:
    return (f"entry-{i:08d}-".encode() * (size // 15 + 1))[:size]


def filled(path: str, n: int, size: int = 100, term: int = 1, **kw: Any) -> EntryStore:
    s = EntryStore(path, segment_bytes=SEG, index_records_per_file=64, **kw)
    for i in range(1, n + 1):
        s.append(i, term, body(i, size))
    s.flush()
    return s


def test_round_trip_and_chain(tmp_path: Any) -> None:
    s = filled(str(tmp_path), 50)
    prev = 0
    for i in range(1, 51):
        e = s.read(i)
        assert (e.index, e.term, e.body) == (i, 1, body(i))
        prev = chain_crc(prev, i, 1, zlib.crc32(body(i)))
        assert e.chain_crc == prev == s.chain_crc_at(i)
        assert s.read_at_position(e.position + HEADER_SIZE, len(e.body)) == e.body
    assert s.last_index == 50 and s.last_chain_crc == prev
    with pytest.raises(IndexOutOfRangeError):
        s.read(51)
    with pytest.raises(ValueError):
        s.append(60, 1, b"gap")
    s.close()


def test_same_input_same_chain_on_two_stores(tmp_path: Any) -> None:
    a = filled(str(tmp_path / "a"), 80)
    b = EntryStore(str(tmp_path / "b"), segment_bytes=1 << 20)  # other segment size: other positions
    for i in range(1, 81):
        b.append(i, 1, body(i))
    assert [a.chain_crc_at(i) for i in range(1, 81)] == [b.chain_crc_at(i) for i in range(1, 81)]


def test_read_range_limits(tmp_path: Any) -> None:
    s = filled(str(tmp_path), 30)
    assert [e.index for e in s.read_range(5, 10, 1 << 20)] == list(range(5, 15))
    assert [e.index for e in s.read_range(5, 100, 250)] == [5, 6, 7]  # stops once 250 B reached
    assert [e.index for e in s.read_range(30, 10, 1)] == [30]
    assert s.read_range(31, 10, 1 << 20) == []


def test_segments_roll_with_blank_padding(tmp_path: Any) -> None:
    s = filled(str(tmp_path), 100, size=300)
    segs = s.segments()
    assert len(segs) > 5
    for a, b in itertools.pairwise(segs):
        assert b.first_index == a.last_index + 1 and b.start_position == a.start_position + SEG
        assert a.size_bytes <= SEG
    # an entry that exactly fills a fresh segment
    exact = SEG - HEADER_SIZE - 8
    s.append(101, 1, b"x" * exact)
    assert s.read(101).body == b"x" * exact
    with pytest.raises(EntryTooLargeError):
        s.append(102, 1, b"y" * SEG)
    s.close()
    r = EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    assert r.last_index == 101 and r.read(57).body == body(57, 300)


def test_restart_recovers_identically(tmp_path: Any) -> None:
    s = filled(str(tmp_path), 120, size=200)
    state = (s.last_index, s.last_term, s.last_chain_crc, s.next_position)
    s.close()
    r = EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    assert (r.last_index, r.last_term, r.last_chain_crc, r.next_position) == state
    r.append(121, 2, b"after restart")
    assert r.read(121).chain_crc == chain_crc(state[2], 121, 2, zlib.crc32(b"after restart"))


def last_segment(path: Any) -> str:
    log_dir = os.path.join(str(path), "log")
    return os.path.join(log_dir, sorted(os.listdir(log_dir))[-1])


@pytest.mark.parametrize("damage", ["cut-mid-record", "garbage-appended", "zeros-appended", "flipped-last-body"])
def test_torn_tail_is_repaired_and_logged(tmp_path: Any, caplog: Any, damage: str) -> None:
    s = filled(str(tmp_path), 40)
    s.read(40)
    s.close()
    seg = last_segment(tmp_path)
    size = os.path.getsize(seg)
    with open(seg, "r+b") as f:
        if damage == "cut-mid-record":
            f.truncate(size - 30)
        elif damage == "garbage-appended":
            f.seek(size)
            f.write(os.urandom(77))
        elif damage == "zeros-appended":
            f.seek(size)
            f.write(bytes(500))
        else:
            f.seek(size - 5)
            f.write(b"\xff\xff\xff\xff\xff")
    caplog.set_level(logging.WARNING)
    r = EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    expect = 40 if damage in ("garbage-appended", "zeros-appended") else 39
    assert r.last_index == expect
    assert r.read(expect).index == expect
    assert "torn tail" in caplog.text and seg in caplog.text
    r.append(expect + 1, 1, b"continues")  # and the log goes on, chained correctly
    assert r.read(expect + 1).chain_crc == chain_crc(r.chain_crc_at(expect), expect + 1, 1, zlib.crc32(b"continues"))


def test_corruption_before_the_tail_refuses_to_open(tmp_path: Any) -> None:
    s = filled(str(tmp_path), 40)
    victim = s.read(s.segments()[-1].first_index + 1)  # inside the last segment, not its last record
    seg_start = s.segments()[-1].start_position
    s.close()
    seg = last_segment(tmp_path)
    offset = victim.position - seg_start + HEADER_SIZE + 3
    with open(seg, "r+b") as f:
        f.seek(offset)
        f.write(b"\x00")
    with pytest.raises(CorruptStoreError) as err:
        EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    assert seg in str(err.value) and f"offset {victim.position - seg_start}" in str(err.value)


def test_corruption_in_an_earlier_segment_is_found_when_index_is_lost(tmp_path: Any) -> None:
    s = filled(str(tmp_path), 60, size=300)
    first = s.segments()[0]
    s.close()
    with open(first.path, "r+b") as f:
        f.seek(HEADER_SIZE + 10)
        f.write(b"!")
    for name in os.listdir(tmp_path / "index"):
        os.remove(tmp_path / "index" / name)
    with pytest.raises(CorruptStoreError, match=first.path):
        EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)


def test_lost_or_short_index_is_rebuilt(tmp_path: Any) -> None:
    s = filled(str(tmp_path), 200)
    chains = [s.chain_crc_at(i) for i in range(1, 201)]
    s.close()
    index_dir = tmp_path / "index"
    names = sorted(os.listdir(index_dir))
    os.remove(index_dir / names[-1])
    with open(index_dir / names[0], "r+b") as f:
        f.truncate(100)
    r = EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    assert r.last_index == 200
    assert [r.chain_crc_at(i) for i in range(1, 201)] == chains
    assert all(r.read(i).body == body(i) for i in range(1, 201))


def test_truncate_suffix_across_segments_then_continue(tmp_path: Any) -> None:
    s = filled(str(tmp_path / "s"), 100, size=300)
    seg_first = s.segments()[3].first_index
    s.truncate_suffix(seg_first)  # exactly at a segment boundary
    assert s.last_index == seg_first - 1
    s.truncate_suffix(seg_first - 5)  # and inside a segment
    for i in range(seg_first - 5, 121):
        s.append(i, 2, body(i, 300))
    ref = EntryStore(str(tmp_path / "ref"), segment_bytes=1 << 20)
    for i in range(1, 121):
        ref.append(i, 1 if i < seg_first - 5 else 2, body(i, 300))
    assert [s.chain_crc_at(i) for i in range(1, 121)] == [ref.chain_crc_at(i) for i in range(1, 121)]
    s.close()
    r = EntryStore(str(tmp_path / "s"), segment_bytes=SEG, index_records_per_file=64)
    assert r.last_index == 120 and r.last_chain_crc == ref.last_chain_crc
    r.truncate_suffix(1)  # everything
    assert r.last_index == 0
    r.append(1, 3, b"fresh")
    assert r.read(1).body == b"fresh"


def test_reset_to_anchor(tmp_path: Any) -> None:
    s = filled(str(tmp_path), 30)
    s.reset(500, 7, 0xABCDEF)
    assert (s.first_index, s.last_index, s.term_at(500), s.chain_crc_at(500)) == (501, 500, 7, 0xABCDEF)
    s.append(501, 7, b"after anchor")
    assert s.read(501).chain_crc == chain_crc(0xABCDEF, 501, 7, zlib.crc32(b"after anchor"))
    with pytest.raises(IndexOutOfRangeError):
        s.read(30)
    s.close()
    r = EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    assert (r.anchor, r.last_index) == ((500, 7, 0xABCDEF), 501)


def test_retention_removes_whole_old_segments(tmp_path: Any) -> None:
    s = filled(str(tmp_path), 200, size=300)
    segs = s.segments()
    floor = segs[3].first_index + 2  # inside segment 3: segments 0..2 may go
    anchor_chain = s.chain_crc_at(segs[2].last_index)
    assert s.delete_segments_before(floor) == 3
    assert s.anchor == (segs[2].last_index, 1, anchor_chain)
    assert s.first_index == segs[3].first_index
    with pytest.raises(IndexOutOfRangeError):
        s.read(segs[2].last_index)
    assert s.read(s.first_index).body == body(s.first_index, 300)
    assert s.delete_segments_before(10**9) == len(segs) - 4  # never the last segment
    s.close()
    r = EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    assert r.last_index == 200 and r.first_index == r.segments()[0].first_index
    assert r.read(200).body == body(200, 300)


@pytest.mark.slow
def test_memory_does_not_grow_with_bytes_stored(tmp_path: Any) -> None:
    s = EntryStore(str(tmp_path), segment_bytes=8 << 20)
    payload = os.urandom(1024)
    for i in range(1, 20_001):
        s.append(i, 1, payload)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for i in range(20_001, 220_001):  # +200 MB
        s.append(i, 1, payload)
        if i % 1000 == 0:
            s.flush()
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 30, f"RSS grew {grown_mb:.1f} MB while 200 MB were stored"
