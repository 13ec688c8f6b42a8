"""Key index: lookups, collisions, order and limits, time ranges, rolling, recovery from unflushed
puts and damaged headers, retention."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from broker.store.key_index import (
    HEADER_SIZE,
    STATE_CLOSED,
    STATE_OPEN,
    STATE_SEALED,
    IndexHeader,
    KeyIndex,
    KeyIndexClosedError,
    decode_header,
    encode_header,
    key_hash,
)

# Two keys of topic "T" whose hashes collide in all 32 bits (found by search).
COLLIDING = ("k7", "k22763470")


def index_files(root: Path) -> list[Path]:
    return sorted(root.glob("*.kidx"))


def header_of(path: Path) -> IndexHeader:
    with open(path, "rb") as f:
        return decode_header(f.read(HEADER_SIZE))


def test_header_codec_round_trip_and_crc() -> None:
    h = IndexHeader(STATE_OPEN, 7, 9, 3, 1_000, 1_000, 1_200, 50, 90)
    raw = encode_header(h)
    assert len(raw) == HEADER_SIZE and decode_header(raw) == h
    for i in range(60):  # any flipped bit in the covered bytes is caught
        with pytest.raises(ValueError):
            decode_header(raw[:i] + bytes([raw[i] ^ 0x10]) + raw[i + 1 :])


def test_put_and_query_many_keys(tmp_path: Path) -> None:
    idx = KeyIndex(str(tmp_path), slots=512, entries_per_file=10_000)
    assert idx.max_position() == -1 and idx.query("T", "nothing") == []
    for i in range(3_000):
        idx.put("T", f"key-{i}", 100 + i * 10, 1_000 + i)
    for i in range(3_000):
        assert idx.query("T", f"key-{i}") == [100 + i * 10]
    assert idx.query("T", "key-3000") == [] and idx.query("U", "key-1") == []
    assert idx.max_position() == 100 + 2_999 * 10
    idx.close()


def test_bucket_collisions_return_only_matching_hashes(tmp_path: Path) -> None:
    idx = KeyIndex(str(tmp_path), slots=1, entries_per_file=1_000)  # one bucket holds everything
    for i in range(200):
        idx.put("T", f"key-{i % 20}", i, 5_000)
    for k in range(20):
        assert idx.query("T", f"key-{k}") == list(range(180 + k, -1, -20))
    idx.close()


def test_full_hash_collision_gives_candidates_including_the_right_ones(tmp_path: Path) -> None:
    a, b = COLLIDING
    assert key_hash("T", a) == key_hash("T", b)
    idx = KeyIndex(str(tmp_path), slots=4, entries_per_file=100)
    idx.put("T", a, 10, 1)
    idx.put("T", b, 20, 2)
    idx.put("T", "other", 30, 3)
    assert idx.query("T", a) == [20, 10]  # the caller reads both and keeps position 10
    assert idx.query("T", b) == [20, 10]
    idx.close()


def test_newest_first_dedup_and_max_count(tmp_path: Path) -> None:
    idx = KeyIndex(str(tmp_path), slots=8, entries_per_file=100)
    for position in range(100, 1_000, 100):
        idx.put("T", "order-1", position, position)
        idx.put("T", "uniq", position + 1, position)
    idx.put("T", "order-1", 500, 500)  # a re-put after recovery: deduplicated
    assert idx.query("T", "order-1") == list(range(900, 0, -100))
    assert idx.query("T", "order-1", max_count=3) == [900, 800, 700]
    assert idx.query("T", "order-1", max_count=0) == []
    idx.close()


def test_time_range_filter(tmp_path: Path) -> None:
    idx = KeyIndex(str(tmp_path), slots=16, entries_per_file=100)
    for i in range(10):
        idx.put("T", "k", 1_000 + i, 1_700_000_000_000 + i * 1_000)
    assert idx.query("T", "k", begin_ts=1_700_000_003_000, end_ts=1_700_000_005_000) == [1005, 1004, 1003]
    assert idx.query("T", "k", begin_ts=1_700_000_003_001, end_ts=1_700_000_004_999) == [1004]  # ms exact
    assert idx.query("T", "k", end_ts=1_699_999_999_999) == []
    assert idx.query("T", "k", begin_ts=1_700_000_009_001) == []
    idx.close()


def test_roll_over_and_query_across_files(tmp_path: Path) -> None:
    idx = KeyIndex(str(tmp_path), slots=4, entries_per_file=10)
    for i in range(35):
        idx.put("T", f"k{i % 3}", i * 10, 1_000 + i)
    files = index_files(tmp_path)
    assert [p.name for p in files] == [f"{n:010d}.kidx" for n in range(4)]
    assert [header_of(p).state for p in files] == [STATE_SEALED] * 3 + [STATE_OPEN]
    assert [h.count for h in map(header_of, files[:3])] == [10, 10, 10]
    assert idx.query("T", "k1", max_count=100) == [i * 10 for i in range(34, -1, -1) if i % 3 == 1]
    assert idx.query("T", "k2", max_count=4) == [320, 290, 260, 230]  # spans the last two files
    assert idx.query("T", "k0", begin_ts=1_012, end_ts=1_015) == [150, 120]
    idx.close()


def test_put_many_writes_what_puts_one_by_one_write(tmp_path: Path) -> None:
    """``put_many`` (the store's apply: one lock per batch) leaves the same files as ``put`` called
    for each in turn: entries, slot chains, counts, ranges and order flags, across rolls (full
    files, a store time too far from a file's base) and out-of-order positions."""
    puts = [("T", f"k{i % 5}", (i * 37) % 101 * 10, 1_000 + (i * 13) % 17) for i in range(45)]
    puts += [("T", "late", 5, 1_000 + 2**31), ("U", "k1", 3, 1_000 + 2**31 - 1), ("T", "k1", 9_999, 1_020)]
    one, many = tmp_path / "one", tmp_path / "many"
    a = KeyIndex(str(one), slots=4, entries_per_file=10)
    b = KeyIndex(str(many), slots=4, entries_per_file=10)
    for p in puts:
        a.put(*p)
    b.put_many(puts[:7])
    b.put_many([])
    b.put_many(puts[7:])
    for key in ("k0", "k1", "k2", "k3", "k4", "late"):
        assert b.query("T", key, max_count=100) == a.query("T", key, max_count=100)
    a.close()
    b.close()
    files_a, files_b = index_files(one), index_files(many)
    assert [p.name for p in files_a] == [p.name for p in files_b] and len(files_a) >= 5
    for fa, fb in zip(files_a, files_b, strict=True):
        assert fa.read_bytes() == fb.read_bytes(), fa.name


def test_roll_when_the_ts_diff_does_not_fit(tmp_path: Path) -> None:
    idx = KeyIndex(str(tmp_path), slots=4, entries_per_file=100)
    idx.put("T", "k", 1, 10_000_000_000)
    idx.put("T", "k", 2, 10_000_000_000 - 5_000)  # a little behind the base: same file
    idx.put("T", "k", 3, 10_000_000_000 + 2**31)  # 24.8 days later: new file
    assert len(index_files(tmp_path)) == 2
    assert idx.query("T", "k", begin_ts=10_000_000_000 + 2**31) == [3]
    assert idx.query("T", "k", end_ts=10_000_000_000 - 5_000) == [2]
    idx.close()


def test_reopen_after_close(tmp_path: Path) -> None:
    idx = KeyIndex(str(tmp_path), slots=16, entries_per_file=20)
    for i in range(50):
        idx.put("T", f"k{i % 5}", i, 1_000 + i)
    idx.close()
    assert header_of(index_files(tmp_path)[-1]).state == STATE_CLOSED

    idx = KeyIndex(str(tmp_path), slots=16, entries_per_file=20)
    assert idx.needs_rebuild_from() is None and idx.max_position() == 49
    assert header_of(index_files(tmp_path)[-1]).state == STATE_OPEN  # marked before any put
    assert idx.query("T", "k3", max_count=100) == list(range(48, -1, -5))
    for i in range(50, 60):  # the last file continues, then rolls
        idx.put("T", f"k{i % 5}", i, 1_000 + i)
    assert idx.query("T", "k3", max_count=3) == [58, 53, 48]
    idx.close()
    with pytest.raises(KeyIndexClosedError):
        idx.put("T", "k", 61, 1_061)


def test_unflushed_puts_are_ignored_and_flagged(tmp_path: Path) -> None:
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    idx = KeyIndex(str(live), slots=8, entries_per_file=100)
    for i in range(10):
        idx.put("T", f"k{i % 4}", 100 + i, 1_000 + i)
    idx.flush()
    for i in range(10, 16):  # never flushed; their slot updates sit in the same pages
        idx.put("T", f"k{i % 4}", 100 + i, 1_000 + i)
        idx.put("T", f"new{i}", 100 + i, 1_000 + i)
    shutil.copytree(live, crashed)  # the page cache as a crash would leave it
    idx.close()

    idx = KeyIndex(str(crashed), slots=8, entries_per_file=100)
    assert idx.needs_rebuild_from() == 110 and idx.max_position() == 109
    assert idx.query("T", "k1", max_count=100) == [109, 105, 101]  # only the flushed entries
    assert idx.query("T", "new12") == []
    for i in range(10, 16):  # the dispatcher re-indexes from needs_rebuild_from
        idx.put("T", f"k{i % 4}", 100 + i, 1_000 + i)
        idx.put("T", f"new{i}", 100 + i, 1_000 + i)
    idx.put("T", "k1", 109, 1_009)  # a re-put of an indexed entry is harmless
    assert idx.query("T", "k1", max_count=100) == [113, 109, 105, 101]
    assert idx.query("T", "new12") == [112]
    idx.close()
    assert KeyIndex(str(crashed), slots=8, entries_per_file=100).needs_rebuild_from() is None


def test_crash_before_any_flush_of_a_new_file(tmp_path: Path) -> None:
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    idx = KeyIndex(str(live), slots=8, entries_per_file=5)
    for i in range(7):  # file 0 sealed (flushed by the roll), file 1 holds 2 unflushed entries
        idx.put("T", "k", 10 + i, 1_000 + i)
    shutil.copytree(live, crashed)
    idx.close()
    idx = KeyIndex(str(crashed), slots=8, entries_per_file=5)
    assert idx.needs_rebuild_from() == 15 and idx.max_position() == 14
    assert idx.query("T", "k", max_count=10) == [14, 13, 12, 11, 10]
    idx.close()


def corrupt_header(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(30)
        byte = f.read(1)
        f.seek(30)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_corrupted_header_discards_the_file(tmp_path: Path) -> None:
    idx = KeyIndex(str(tmp_path), slots=4, entries_per_file=10)
    for i in range(30):
        idx.put("T", "k", 100 + i, 1_000 + i)
    idx.close()
    files = index_files(tmp_path)
    corrupt_header(files[1])  # positions 110..119

    idx = KeyIndex(str(tmp_path), slots=4, entries_per_file=10)
    assert idx.needs_rebuild_from() == 110
    assert not files[1].exists()
    got = idx.query("T", "k", max_count=100)
    assert got == [*range(129, 119, -1), *range(109, 99, -1)]  # no garbage, no exception
    idx.close()


def test_corrupted_header_of_the_only_file(tmp_path: Path) -> None:
    idx = KeyIndex(str(tmp_path), slots=4, entries_per_file=10)
    idx.put("T", "k", 100, 1_000)
    idx.close()
    (only,) = index_files(tmp_path)
    corrupt_header(only)
    idx = KeyIndex(str(tmp_path), slots=4, entries_per_file=10)
    assert idx.needs_rebuild_from() == 0 and idx.max_position() == -1 and idx.query("T", "k") == []
    idx.put("T", "k", 100, 1_000)
    assert idx.query("T", "k") == [100]
    idx.close()


def test_wrong_file_size_is_detected(tmp_path: Path) -> None:
    idx = KeyIndex(str(tmp_path), slots=4, entries_per_file=10)
    idx.put("T", "k", 100, 1_000)
    idx.close()
    (only,) = index_files(tmp_path)
    os.truncate(only, 200)
    idx = KeyIndex(str(tmp_path), slots=4, entries_per_file=10)
    assert idx.needs_rebuild_from() == 0 and idx.query("T", "k") == []
    idx.close()


def test_delete_before_position(tmp_path: Path) -> None:
    idx = KeyIndex(str(tmp_path), slots=4, entries_per_file=10)
    for i in range(35):
        idx.put("T", "k", 100 + i, 1_000 + i)
    assert idx.delete_before_position(100) == 0
    assert idx.delete_before_position(125) == 2  # files ending at 109 and 119; 120..129 keeps 125
    assert len(index_files(tmp_path)) == 2
    assert idx.query("T", "k", max_count=100) == list(range(134, 119, -1))
    assert idx.delete_before_position(10_000) == 2  # the active file too: the next put starts one
    assert idx.max_position() == -1 and index_files(tmp_path) == []
    idx.put("T", "k", 200, 2_000)
    assert idx.query("T", "k") == [200]
    idx.close()
    idx = KeyIndex(str(tmp_path), slots=4, entries_per_file=10)
    assert idx.query("T", "k") == [200] and [p.name for p in index_files(tmp_path)] == ["0000000004.kidx"]
    idx.close()


def test_reindexed_older_positions_still_come_back_highest_first(tmp_path: Path) -> None:
    idx = KeyIndex(str(tmp_path), slots=8, entries_per_file=100)
    for position in (500, 600, 700):
        idx.put("T", "k", position, position)
    assert header_of(index_files(tmp_path)[0]).ordered
    for position in (100, 200, 300):  # re-indexed after a discarded file: older positions, newer entries
        idx.put("T", "k", position, position)
    assert idx.query("T", "k", max_count=2) == [700, 600]
    idx.close()
    assert not header_of(index_files(tmp_path)[0]).ordered  # recorded, so it holds after reopen
    idx = KeyIndex(str(tmp_path), slots=8, entries_per_file=100)
    assert idx.query("T", "k", max_count=4) == [700, 600, 500, 300]
    idx.close()


def test_concurrent_queries_see_only_whole_entries(tmp_path: Path) -> None:
    idx = KeyIndex(str(tmp_path), slots=16, entries_per_file=500)  # rolls every 500 puts
    keys = 7
    total = 6_000
    writer_done = threading.Event()
    errors: list[str] = []
    queries = [0]

    def reader() -> None:
        while True:
            finished = writer_done.is_set()
            for k in range(keys):
                got = idx.query("T", f"k{k}", max_count=20)
                if got != sorted(set(got), reverse=True) or any(p % keys != k for p in got):
                    errors.append(f"k{k}: {got}")
                    return
            queries[0] += 1
            if finished:
                return

    thread = threading.Thread(target=reader)
    thread.start()
    for position in range(total):
        idx.put("T", f"k{position % keys}", position, 1_000 + position)
        if position % 1_000 == 999:
            idx.flush()
    writer_done.set()
    thread.join(timeout=30)
    assert not thread.is_alive() and errors == [] and queries[0] > 0
    assert idx.query("T", "k3", max_count=2) == [5_995, 5_988]
    idx.close()
