"""EntryStore and entry_codec: round trips, segment roll, recovery, truncation, reset, retention, RSS."""

from __future__ import annotations

import itertools
import logging
import os
import resource
import shutil
import struct
import threading
import zlib
from pathlib import Path

import pytest

from dledger.entry_codec import (
    BLANK_BYTES,
    HEADER_SIZE,
    MAGIC,
    CorruptEntryError,
    StoreError,
    chain_crc,
    decode_header,
    encode_entry,
)
from dledger.entry_store import (
    CorruptStoreError,
    EntryStore,
    EntryTooLargeError,
    IndexOutOfRangeError,
    PositionOutOfRangeError,
    StaleReadError,
    StoreClosedError,
)

SEG = 4096
PER_FILE = 64  # small index files, so tests cross index-file boundaries too


def body(i: int, term: int = 1, size: int = 100) -> bytes:
    """Deterministic and self-describing: a reader can check it got the entry it asked for."""
    return (f"<{i}:{term}>".encode() * (size // 6 + 1))[:size]


def open_store(path: Path, segment_bytes: int = SEG) -> EntryStore:
    return EntryStore(str(path), segment_bytes=segment_bytes, index_records_per_file=PER_FILE)


def filled(path: Path, n: int, size: int = 100, segment_bytes: int = SEG) -> EntryStore:
    s = open_store(path, segment_bytes)
    s.append_many([(i, 1, body(i, 1, size)) for i in range(1, n + 1)])
    s.flush()
    return s


def expected_chain(n: int, size: int = 100) -> list[int]:
    chain, out = 0, []
    for i in range(1, n + 1):
        chain = chain_crc(chain, i, 1, zlib.crc32(body(i, 1, size)))
        out.append(chain)
    return out


def last_segment(path: Path) -> Path:
    return sorted((path / "log").iterdir())[-1]


# -- codec ----------------------------------------------------------------------------------------
def test_codec_round_trip_and_typed_errors() -> None:
    raw, head = encode_entry(7, 3, 4096, b"hello", prev_chain_crc=0x1234)
    assert len(raw) == HEADER_SIZE + 5 and decode_header(raw) == head
    assert head.chain_crc == zlib.crc32(struct.pack("<QQI", 7, 3, zlib.crc32(b"hello")), 0x1234)
    assert (head.magic, head.index, head.term, head.position, head.total_size) == (MAGIC, 7, 3, 4096, 49)
    with pytest.raises(CorruptEntryError, match="magic"):
        decode_header(b"\x00" * 4 + raw[4:])
    with pytest.raises(CorruptEntryError, match="header crc"):
        decode_header(raw[:20] + b"\xff" + raw[21:])
    with pytest.raises(CorruptEntryError, match="short header"):
        decode_header(raw[:10])
    assert isinstance(CorruptEntryError("x"), StoreError)


# -- append and read --------------------------------------------------------------------------------
def test_append_read_round_trip(tmp_path: Path) -> None:
    s = filled(tmp_path, 50)
    chains = expected_chain(50)
    for i in range(1, 51):
        e = s.read(i)
        assert (e.index, e.term, e.body, e.chain_crc) == (i, 1, body(i), chains[i - 1])
        assert (s.term_at(i), s.chain_crc_at(i), s.position_at(i)) == (1, chains[i - 1], e.position)
        assert s.read_at_position(e.position + s.header_bytes, len(e.body)) == e.body
    assert (s.first_index, s.last_index, s.last_term, s.last_chain_crc) == (1, 50, 1, chains[-1])
    assert (s.term_at(0), s.chain_crc_at(0)) == (0, 0)  # the anchor of a fresh store
    with pytest.raises(IndexOutOfRangeError):
        s.read(51)
    with pytest.raises(ValueError, match="expected 51"):
        s.append(60, 1, b"gap")
    with pytest.raises(ValueError, match="term"):
        s.append(51, 0, b"older term")
    with pytest.raises(PositionOutOfRangeError):
        s.read_at_position(s.next_position, 1)
    s.close()


def test_append_many_matches_single_appends(tmp_path: Path) -> None:
    a = open_store(tmp_path / "a")
    b = open_store(tmp_path / "b")
    entries = [(i, 1 + i // 40, body(i, 1 + i // 40, 50 + i * 7 % 300)) for i in range(1, 121)]
    positions = [a.append(*e) for e in entries]
    assert b.append_many(entries[:70]) + b.append_many(entries[70:]) == positions
    assert [a.chain_crc_at(i) for i in range(1, 121)] == [b.chain_crc_at(i) for i in range(1, 121)]
    assert len(b.segments()) > 3 and b.read(120).body == entries[-1][2]


def test_read_range_limits(tmp_path: Path) -> None:
    s = filled(tmp_path, 100)  # 100-byte bodies, crossing segments and index files
    assert [e.index for e in s.read_range(5, 70, 1 << 20)] == list(range(5, 75))
    assert [e.index for e in s.read_range(5, 100, 250)] == [5, 6]  # bodies total at most 250 bytes
    assert [e.index for e in s.read_range(5, 100, 300)] == [5, 6, 7]
    assert [e.index for e in s.read_range(100, 10, 1)] == [100]  # at least one
    assert s.read_range(101, 10, 1 << 20) == []
    assert [e.body for e in s.read_range(60, 10, 1 << 20)] == [body(i) for i in range(60, 70)]
    with pytest.raises(IndexOutOfRangeError):
        s.read_range(0, 10, 1 << 20)


def test_flush_clears_dirty(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    s.append(1, 1, b"x")
    assert s.dirty
    s.flush()
    assert not s.dirty
    s.flush()  # no-op


def test_same_entries_same_chain_on_every_replica(tmp_path: Path) -> None:
    """Two stores fed the same (index, term, body) agree at every index, whatever their layout."""
    a = filled(tmp_path / "a", 150, segment_bytes=SEG)
    b = EntryStore(str(tmp_path / "b"), segment_bytes=1 << 20)
    for i in range(1, 151):
        b.append(i, 1, body(i))
    assert [a.chain_crc_at(i) for i in range(1, 151)] == [b.chain_crc_at(i) for i in range(1, 151)]
    assert a.position_at(150) != b.position_at(150)  # positions are per replica


# -- segments -----------------------------------------------------------------------------------------
def test_segment_roll_blank_padding_and_exact_fit(tmp_path: Path) -> None:
    s = filled(tmp_path, 60, size=300)
    segs = s.segments()
    assert len(segs) > 4
    for a, b in itertools.pairwise(segs):
        assert b.first_index == a.last_index + 1 and b.start_position == a.start_position + SEG
        assert a.size_bytes <= SEG
        end = s.position_at(a.last_index) + HEADER_SIZE + 300 - a.start_position  # after its last entry
        if SEG - end >= len(BLANK_BYTES):  # room was left: a BLANK marker ends the segment
            assert Path(a.path).read_bytes()[end:] == BLANK_BYTES and a.size_bytes == end + len(BLANK_BYTES)
        else:
            assert a.size_bytes == end
    assert os.path.basename(segs[1].path) == f"{SEG:020d}"
    # Fill the rest of the current segment exactly: no BLANK, the next entry starts a new segment.
    room = SEG - segs[-1].size_bytes
    s.append(61, 1, b"e" * (room - HEADER_SIZE))
    assert s.segments()[-1].size_bytes == SEG and len(s.segments()) == len(segs)
    s.append(62, 1, b"next")
    assert s.position_at(62) == segs[-1].start_position + SEG
    # The largest entry a segment can take, and one byte more.
    s.append(63, 1, b"m" * (SEG - HEADER_SIZE))
    assert s.read(63).body == b"m" * (SEG - HEADER_SIZE)
    with pytest.raises(EntryTooLargeError):
        s.append(64, 1, b"m" * (SEG - HEADER_SIZE + 1))
    s.close()
    r = open_store(tmp_path)
    assert r.last_index == 63 and r.read(61).body == b"e" * (room - HEADER_SIZE)
    assert [e.index for e in r.read_range(55, 100, 1 << 20)] == list(range(55, 64))


# -- recovery -------------------------------------------------------------------------------------------
def test_restart_recovers_identically(tmp_path: Path) -> None:
    s = filled(tmp_path, 120, size=200)
    state = (s.last_index, s.last_term, s.last_chain_crc, s.next_position, s.bytes_stored, s.anchor)
    s.close()
    s.close()  # idempotent
    with pytest.raises(StoreClosedError):
        s.read(1)
    r = open_store(tmp_path)
    assert (r.last_index, r.last_term, r.last_chain_crc, r.next_position, r.bytes_stored, r.anchor) == state
    r.append(121, 2, b"after restart")
    assert r.read(121).chain_crc == chain_crc(state[2], 121, 2, zlib.crc32(b"after restart"))


@pytest.mark.parametrize(
    "damage", ["cut-mid-body", "cut-mid-header", "garbage-appended", "flipped-last-body"]
)
def test_torn_tail_is_cut_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    s = filled(tmp_path, 40)
    last_offset = s.position_at(40) - s.segments()[-1].start_position
    s.close()
    seg = last_segment(tmp_path)
    size = seg.stat().st_size
    with open(seg, "r+b") as f:
        if damage == "cut-mid-body":
            f.truncate(size - 30)
        elif damage == "cut-mid-header":
            f.truncate(last_offset + 20)
        elif damage == "garbage-appended":
            f.seek(size)
            f.write(bytes(range(256)) * 3)
        else:
            f.seek(size - 5)
            f.write(b"\xff" * 5)
    caplog.set_level(logging.WARNING)
    r = open_store(tmp_path)
    expect = 40 if damage == "garbage-appended" else 39
    cut_at = size if damage == "garbage-appended" else last_offset
    assert r.last_index == expect and r.read(expect).body == body(expect)
    assert "torn tail" in caplog.text and str(seg) in caplog.text and f"offset {cut_at}" in caplog.text
    assert seg.stat().st_size == cut_at
    r.append(expect + 1, 1, b"continues")
    assert r.chain_crc_at(expect + 1) == chain_crc(
        expected_chain(expect)[-1], expect + 1, 1, zlib.crc32(b"continues")
    )


def test_corruption_before_the_tail_refuses_to_open(tmp_path: Path) -> None:
    s = filled(tmp_path, 40, segment_bytes=1 << 20)  # one segment: recovery scans all of it
    victim = s.position_at(5)
    s.close()
    seg = last_segment(tmp_path)
    with open(seg, "r+b") as f:
        f.seek(victim + HEADER_SIZE + 3)
        f.write(b"\x00")
    with pytest.raises(CorruptStoreError) as err:
        open_store(tmp_path, segment_bytes=1 << 20)
    assert str(seg) in str(err.value) and f"offset {victim}" in str(err.value)
    assert (err.value.path, err.value.offset) == (str(seg), victim)


def test_recent_entries_come_from_memory_older_ones_are_verified_on_disk(tmp_path: Path) -> None:
    # A window of 500 body bytes holds the last five 100-byte entries: they are read back as
    # written; an older entry is read from its segment and its CRC checked.
    s = EntryStore(str(tmp_path), segment_bytes=1 << 20, index_records_per_file=PER_FILE, recent_bytes=500)
    s.append_many([(i, 1, body(i)) for i in range(1, 41)])
    old, new = s.position_at(10), s.position_at(40)
    with open(last_segment(tmp_path), "r+b") as f:
        for victim in (old, new):
            f.seek(victim + HEADER_SIZE + 3)
            f.write(b"\x00")
    assert [e.body for e in s.read_range(36, 10, 1 << 20)] == [body(i) for i in range(36, 41)]
    with pytest.raises(CorruptEntryError, match="body crc mismatch in entry 10"):
        s.read(10)
    assert [e.body for e in s.read_range(30, 10, 1 << 20)] == [body(i) for i in range(30, 40)]
    s.close()
    with pytest.raises(CorruptStoreError):  # after a restart the damaged entries are found
        open_store(tmp_path, segment_bytes=1 << 20)


def test_damaged_boundary_of_an_earlier_segment_refuses_to_open(tmp_path: Path) -> None:
    s = filled(tmp_path, 60, size=300)
    first = s.segments()[1]
    s.close()
    with open(first.path, "r+b") as f:
        f.seek(10)  # inside the first header
        f.write(b"!")
    with pytest.raises(CorruptStoreError, match=f"{first.path} at offset 0"):
        open_store(tmp_path)


def test_chain_discontinuity_refuses_to_open(tmp_path: Path) -> None:
    s = filled(tmp_path, 10, segment_bytes=1 << 20)
    pos = s.position_at(6)
    s.close()
    # Re-encode entry 6 with a valid header and body but a chain from the wrong predecessor.
    raw, _ = encode_entry(6, 1, pos, body(6), prev_chain_crc=0xBAD)
    with open(last_segment(tmp_path), "r+b") as f:
        f.seek(pos)
        f.write(raw)
    with pytest.raises(CorruptStoreError, match=f"offset {pos}: entry 6: chain crc"):
        open_store(tmp_path, segment_bytes=1 << 20)


def test_lost_short_or_stale_index_is_rebuilt(tmp_path: Path) -> None:
    s = filled(tmp_path, 200)
    positions = [s.position_at(i) for i in range(1, 201)]
    s.close()
    index_dir = tmp_path / "index"
    names = sorted(index_dir.iterdir())
    names[-1].unlink()
    with open(names[0], "r+b") as f:
        f.truncate(100)
    (index_dir / f"{10 * PER_FILE:020d}").write_bytes(b"\x07" * 24 * 5)  # records past the log
    r = open_store(tmp_path)
    assert r.last_index == 200
    assert [r.position_at(i) for i in range(1, 201)] == positions
    assert [r.read(i).body for i in range(1, 201)] == [body(i) for i in range(1, 201)]
    assert not (index_dir / f"{10 * PER_FILE:020d}").exists()


def test_an_acknowledged_append_costs_one_fdatasync_and_survives_losing_its_index_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Index records are derived data: ``flush`` (the per-append sync on the ack path) syncs the
    segment only (it synced the index file too: two fdatasyncs per acknowledged append). A crash
    that loses the unsynced index pages loses nothing: recovery rebuilds them from the segment."""
    s = open_store(tmp_path, segment_bytes=1 << 20)
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    for i in range(1, 151):
        s.append(i, 1, body(i))
        s.flush()
    assert len(synced) == 150  # one per append, whatever index files the appends wrote
    positions = [s.position_at(i) for i in range(1, 151)]
    for f in (tmp_path / "index").iterdir():  # the crash: no index page ever reached the disk
        f.write_bytes(b"")
    s._close_all()  # without the closing flush
    r = open_store(tmp_path, segment_bytes=1 << 20)
    assert r.last_index == 150
    assert [r.position_at(i) for i in range(1, 151)] == positions
    assert [r.read(i).body for i in range(1, 151)] == [body(i) for i in range(1, 151)]


def test_index_records_past_a_cut_tail_are_dropped(tmp_path: Path) -> None:
    s = filled(tmp_path, 50, segment_bytes=1 << 20)
    cut = s.position_at(45)
    s.close()
    with open(last_segment(tmp_path), "r+b") as f:
        f.truncate(cut + 3)
    r = open_store(tmp_path, segment_bytes=1 << 20)
    assert r.last_index == 44
    r.append(45, 2, b"new 45")
    assert r.read(45).body == b"new 45" and r.position_at(45) == cut
    with pytest.raises(IndexOutOfRangeError):
        r.read(46)


def test_empty_trailing_segment_from_a_crash_during_roll(tmp_path: Path) -> None:
    s = filled(tmp_path, 30, size=300)
    state = (s.last_index, s.last_chain_crc)
    nxt = s.segments()[-1].start_position + SEG
    s.close()
    (tmp_path / "log" / f"{nxt:020d}").write_bytes(b"")
    r = open_store(tmp_path)
    assert (r.last_index, r.last_chain_crc) == state
    r.append_many([(i, 1, body(i, 1, 300)) for i in range(31, 60)])
    assert r.read(59).body == body(59, 1, 300)


# -- truncate, reset, retention ----------------------------------------------------------------------
def test_truncate_suffix_across_segments_then_continue(tmp_path: Path) -> None:
    s = filled(tmp_path / "s", 100, size=300)
    boundary = s.segments()[3].first_index
    s.truncate_suffix(boundary)  # exactly at a segment boundary
    assert (s.last_index, s.segments()[-1].size_bytes) == (boundary - 1, 0)
    s.truncate_suffix(boundary - 5)  # and inside the segment before
    assert s.last_index == boundary - 6 and len(s.segments()) == 3
    for i in range(boundary - 5, 121):
        s.append(i, 2, body(i, 2, 300))
    ref = EntryStore(str(tmp_path / "ref"), segment_bytes=1 << 20)
    for i in range(1, 121):
        term = 1 if i < boundary - 5 else 2
        ref.append(i, term, body(i, term, 300))
    assert [s.chain_crc_at(i) for i in range(1, 121)] == [ref.chain_crc_at(i) for i in range(1, 121)]
    s.close()
    r = open_store(tmp_path / "s")
    assert (r.last_index, r.last_term, r.last_chain_crc) == (120, 2, ref.last_chain_crc)
    r.truncate_suffix(1)  # everything
    assert (r.last_index, r.last_chain_crc) == (0, 0)
    r.append(1, 3, b"fresh")
    assert r.read(1).chain_crc == chain_crc(0, 1, 3, zlib.crc32(b"fresh"))
    with pytest.raises(IndexOutOfRangeError):
        r.truncate_suffix(5)


def test_reset_to_anchor_then_append(tmp_path: Path) -> None:
    s = filled(tmp_path, 30)
    old_next = s.next_position
    s.reset(500, 7, 0xABCDEF)
    assert (s.anchor, s.first_index, s.last_index, s.last_term) == ((500, 7, 0xABCDEF), 501, 500, 7)
    assert (s.term_at(500), s.chain_crc_at(500), s.segments()) == (7, 0xABCDEF, [])
    with pytest.raises(ValueError):
        s.append(31, 7, b"old numbering")
    pos = s.append(501, 7, b"after anchor")
    assert pos >= old_next  # positions never go back, even across a reset
    assert s.read(501).chain_crc == chain_crc(0xABCDEF, 501, 7, zlib.crc32(b"after anchor"))
    with pytest.raises(IndexOutOfRangeError):
        s.read(30)
    s.close()
    r = open_store(tmp_path)
    assert (r.anchor, r.last_index, r.read(501).body) == ((500, 7, 0xABCDEF), 501, b"after anchor")


def test_delete_segments_before_moves_the_anchor_and_survives_restart(tmp_path: Path) -> None:
    s = filled(tmp_path, 200, size=300)
    segs = s.segments()
    gone = segs[2].last_index
    anchor = (gone, 1, s.chain_crc_at(gone))
    assert s.delete_segments_before(segs[3].first_index + 2) == 3  # floor inside segment 3
    assert (s.anchor, s.first_index, s.term_at(gone), s.chain_crc_at(gone)) == (
        anchor,
        gone + 1,
        1,
        anchor[2],
    )
    for i in (1, gone):
        with pytest.raises(IndexOutOfRangeError):
            s.read(i)
    assert not Path(segs[0].path).exists()
    assert s.read(gone + 1).body == body(gone + 1, 1, 300)
    assert s.delete_segments_before(10**9) == len(segs) - 4  # never the segment holding last_index
    assert s.segments()[0].last_index == 200
    s.close()
    r = open_store(tmp_path)
    assert (r.last_index, r.first_index) == (200, r.segments()[0].first_index)
    assert r.term_at(r.anchor[0]) == 1 and r.read(200).body == body(200, 1, 300)
    assert r.chain_crc_at(200) == expected_chain(200, 300)[-1]


def test_retention_interrupted_after_the_anchor_write_completes_on_open(tmp_path: Path) -> None:
    s = filled(tmp_path, 100, size=300)
    backup = tmp_path.parent / (tmp_path.name + "-copy")
    shutil.copytree(tmp_path / "log", backup)
    s.delete_segments_before(s.segments()[2].first_index)
    anchor = s.anchor
    s.close()
    for f in backup.iterdir():  # the unlinks "did not happen"
        if not (tmp_path / "log" / f.name).exists():
            shutil.copy(f, tmp_path / "log" / f.name)
    r = open_store(tmp_path)
    assert r.anchor == anchor and r.first_index == anchor[0] + 1 and r.last_index == 100
    assert len(list((tmp_path / "log").iterdir())) == len(r.segments())


def test_reset_interrupted_after_the_anchor_write_completes_on_open(tmp_path: Path) -> None:
    s = filled(tmp_path, 80, size=300)
    backup = tmp_path.parent / (tmp_path.name + "-copy")
    shutil.copytree(tmp_path / "log", backup)
    s.reset(40, 3, 0x5EED)  # our entry 40 has term 1: the leader's history differs from here
    s.close()
    for f in backup.iterdir():  # the unlinks "did not happen"
        shutil.copy(f, tmp_path / "log" / f.name)
    r = open_store(tmp_path)
    assert (r.anchor, r.last_index, r.segments()) == ((40, 3, 0x5EED), 40, [])
    assert list((tmp_path / "log").iterdir()) == []
    r.append(41, 3, b"leader's 41")
    assert r.position_at(41) > max(int(f.name) for f in backup.iterdir())
    assert r.read_range(41, 10, 1 << 20)[0].body == b"leader's 41"


# -- threads --------------------------------------------------------------------------------------------
def test_concurrent_reads_never_return_replaced_entries(tmp_path: Path) -> None:
    """Readers race a writer that appends, truncates and deletes segments: every read either
    returns the entry asked for (its body names index and term) or says it is gone."""
    s = open_store(tmp_path)
    done = threading.Event()
    failures: list[str] = []
    reads = [0]

    def reader() -> None:
        try:
            read_until_done()
        except BaseException as exc:  # a thread's exception must fail the test, not just warn
            failures.append(f"reader died: {exc!r}")

    def read_until_done() -> None:
        while not done.is_set():
            last, first = s.last_index, s.first_index
            for i in (first, (first + last) // 2, last):
                try:
                    got = [s.read(i), *s.read_range(i, 30, 1000)]
                    term = s.term_at(i)
                except (IndexOutOfRangeError, StaleReadError):
                    continue  # the entry went away meanwhile: a typed answer, fine
                except StoreError as exc:
                    failures.append(f"read({i}) raised {exc!r}")
                    continue
                reads[0] += 1
                if got[0].index != i or term < 1:
                    failures.append(f"read({i}) returned {got[0]}, term_at {term}")
                failures.extend(f"read {e}" for e in got if e.body != body(e.index, e.term, 64))

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        term = 1
        for round_ in range(60):
            start = s.last_index + 1
            s.append_many([(i, term, body(i, term, 64)) for i in range(start, start + 40)])
            if round_ % 3 == 2:
                term += 1
                s.truncate_suffix(s.last_index - 25)
            if round_ % 10 == 9:
                s.delete_segments_before(s.last_index - 100)
    finally:
        done.set()
        for t in threads:
            t.join(timeout=30)
    assert not failures, failures[:3]
    assert reads[0] > 0


# -- memory ----------------------------------------------------------------------------------------------
def rss_now_mb() -> float:
    """Resident set size now (Linux); ``ru_maxrss`` alone is a high-water mark that earlier tests
    in the same process may already have raised."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


@pytest.mark.slow
def test_rss_does_not_grow_with_bytes_stored(tmp_path: Path) -> None:
    s = EntryStore(str(tmp_path), segment_bytes=16 << 20)
    payload = b"p" * 200
    s.append_many([(i, 1, payload) for i in range(1, 5_001)])
    before_max, before_now = max_rss_mb(), rss_now_mb()
    for i in range(5_001, 205_001):  # about 50 MB of log
        s.append(i, 1, payload)
        if i % 1000 == 0:
            s.flush()
    assert [e.index for e in s.read_range(100_000, 1000, 1 << 20)][-1] == 100_999
    assert s.read(7).body == payload
    s.close()
    r = EntryStore(str(tmp_path), segment_bytes=16 << 20)  # recovery does not load it all either
    assert r.last_index == 205_000 and len(r.segments()) == 3
    grown_max, grown_now = max_rss_mb() - before_max, rss_now_mb() - before_now
    assert grown_max < 30 and grown_now < 30, f"RSS grew {grown_now:.1f} MB (peak +{grown_max:.1f} MB)"
