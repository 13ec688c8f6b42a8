"""Consume queue: round trips, recovery from torn and damaged files, truncation, searches,
retention, set_base, a concurrent reader, and the store's discovery."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

import pytest

from broker.store.consume_queue import (
    BUFFER_UNITS_MAX,
    FD_CACHE_MAX,
    UNIT_SIZE,
    ConsumeQueue,
    ConsumeQueueDamaged,
    ConsumeQueueStore,
    Unit,
    file_name,
    finish_flush,
)

UPF = 4  # units per file: small, so every test crosses file boundaries


def unit_fields(offset: int) -> tuple[int, int, int, int]:
    """Deterministic (position, size, tag_hash, store_ts) for an offset; positions strictly grow."""
    return 1000 + offset * 100, 10 + offset % 50, offset * 7, 5_000 + offset * 10


def expected(offset: int) -> Unit:
    return Unit(offset, *unit_fields(offset))


def fill(q: ConsumeQueue, count: int) -> None:
    for _ in range(count):
        offset = q.max_offset
        assert q.append(*unit_fields(offset)) == offset


def files_in(path: Path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.isdigit())


def test_round_trip_across_file_rolls(tmp_path: Path) -> None:
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    assert (q.min_offset, q.max_offset, q.last_unit()) == (0, 0, None)
    fill(q, 10)
    q.write_out()
    assert files_in(tmp_path) == [file_name(0), file_name(4), file_name(8)]
    assert os.path.getsize(tmp_path / file_name(8)) == 2 * UNIT_SIZE
    assert q.read(0, 100) == [expected(i) for i in range(10)]
    assert q.read(3, 6) == [expected(i) for i in range(3, 9)]  # spans three files
    assert q.get(9) == expected(9) and q.get(10) is None and q.get(-1) is None
    assert q.read(10, 5) == [] and q.read(2, 0) == []
    assert q.last_unit() == expected(9)
    q.close()


def test_reads_see_buffered_units(tmp_path: Path) -> None:
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    fill(q, 6)
    q.write_out()
    fill(q, 5)  # 6..10 only in memory, across a file boundary
    assert os.path.getsize(tmp_path / file_name(4)) == 2 * UNIT_SIZE
    assert q.max_offset == 11
    assert q.read(4, 100) == [expected(i) for i in range(4, 11)]  # half file, half buffer
    assert q.get(10) == expected(10) and q.last_unit() == expected(10)
    q.write_out()
    assert q.read(0, 100) == [expected(i) for i in range(11)]
    q.close()


def test_append_writes_out_when_the_buffer_is_full(tmp_path: Path) -> None:
    q = ConsumeQueue(str(tmp_path), units_per_file=BUFFER_UNITS_MAX * 2)
    fill(q, BUFFER_UNITS_MAX - 1)
    assert files_in(tmp_path) == []  # all still buffered
    fill(q, 1)
    assert os.path.getsize(tmp_path / file_name(0)) == BUFFER_UNITS_MAX * UNIT_SIZE
    q.close()


@pytest.mark.parametrize("how", ["write_out", "flush", "close"])
def test_reopen(tmp_path: Path, how: str) -> None:
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    fill(q, 9)
    getattr(q, how)()
    q2 = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    assert (q2.min_offset, q2.max_offset) == (0, 9)
    assert q2.read(0, 100) == [expected(i) for i in range(9)]
    fill(q2, 2)  # continues in the partly filled last file
    q2.close()
    assert ConsumeQueue(str(tmp_path), units_per_file=UPF).read(7, 10) == [expected(i) for i in range(7, 11)]


def test_torn_tail_is_cut_to_whole_units(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    fill(q, 7)
    q.close()
    last = tmp_path / file_name(4)
    os.truncate(last, 2 * UNIT_SIZE + 11)  # unit 6 torn mid-way
    with caplog.at_level(logging.WARNING):
        q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    assert "torn unit at byte 56" in caplog.text and file_name(4) in caplog.text
    assert q.max_offset == 6 and q.last_unit() == expected(5)
    assert os.path.getsize(last) == 2 * UNIT_SIZE
    assert q.append(*unit_fields(6)) == 6  # the dispatcher re-appends from the log
    q.close()


def test_trailing_zero_units_are_dropped(tmp_path: Path) -> None:
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    fill(q, 5)
    q.close()
    with open(tmp_path / file_name(4), "ab") as f:
        f.write(bytes(2 * UNIT_SIZE + 5))  # preallocated/torn zeros, not even whole units
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    assert q.max_offset == 5 and q.read(0, 10) == [expected(i) for i in range(5)]
    q.close()


def test_last_file_of_only_zeros_reopens_empty_at_its_start(tmp_path: Path) -> None:
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    fill(q, 4)
    q.close()
    (tmp_path / file_name(4)).write_bytes(bytes(3 * UNIT_SIZE))
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    assert q.max_offset == 4 and q.last_unit() == expected(3)
    fill(q, 1)
    q.close()


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda d: os.truncate(d / file_name(4), 3 * UNIT_SIZE), "size 84 != 112"),
        (lambda d: os.unlink(d / file_name(4)), "gap"),
        (lambda d: (d / "min_offset").write_bytes(b"garbage"), "bad min_offset"),
    ],
    ids=["short-middle-file", "missing-middle-file", "bad-min-offset"],
)
def test_damage_is_reported(tmp_path: Path, damage: object, reason: str) -> None:
    qdir = tmp_path / "T" / "0"
    q = ConsumeQueue(str(qdir), units_per_file=UPF)
    fill(q, 10)
    q.close()
    assert callable(damage)
    damage(qdir)
    with pytest.raises(ConsumeQueueDamaged) as info:
        ConsumeQueue(str(qdir), units_per_file=UPF)
    assert reason in info.value.reason and info.value.path.startswith(str(qdir))

    store = ConsumeQueueStore(str(tmp_path), units_per_file=UPF)
    assert store.queues() == [] and [(t, q_id) for t, q_id, _ in store.damaged] == [("T", 0)]
    assert reason in store.damaged[0][2]
    with pytest.raises(ConsumeQueueDamaged):
        store.get_or_create("T", 0)
    fresh = store.reset_queue("T", 0)
    assert (fresh.min_offset, fresh.max_offset, store.damaged) == (0, 0, [])
    assert store.get("T", 0) is fresh
    store.close()


def test_truncate(tmp_path: Path) -> None:
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    fill(q, 10)
    q.write_out()
    fill(q, 3)  # 10..12 buffered
    q.truncate(11)  # only buffered units go
    assert q.max_offset == 11 and q.last_unit() == expected(10)
    q.truncate(6)  # the buffer, file 8 and half of file 4 go
    assert q.max_offset == 6 and files_in(tmp_path) == [file_name(0), file_name(4)]
    assert os.path.getsize(tmp_path / file_name(4)) == 2 * UNIT_SIZE
    assert q.read(0, 100) == [expected(i) for i in range(6)]
    q.truncate(8)  # past the end: no-op
    assert q.max_offset == 6
    fill(q, 4)  # offsets continue at 6, rolling into a new file 8
    q.close()
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    assert q.read(0, 100) == [expected(i) for i in range(10)]
    q.truncate(4)  # at a file boundary: file 4 and later are deleted
    assert files_in(tmp_path) == [file_name(0)] and q.max_offset == 4
    q.truncate(0)
    assert (q.min_offset, q.max_offset, files_in(tmp_path)) == (0, 0, [])
    fill(q, 2)
    q.close()
    assert ConsumeQueue(str(tmp_path), units_per_file=UPF).read(0, 10) == [expected(0), expected(1)]


def test_truncate_after_position(tmp_path: Path) -> None:
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    fill(q, 10)
    q.write_out()
    fill(q, 2)
    assert q.truncate_after_position(unit_fields(11)[0]) == 12  # nothing past it
    assert q.truncate_after_position(unit_fields(5)[0] + 50) == 6  # between two units
    assert q.truncate_after_position(unit_fields(3)[0]) == 4  # exactly a unit's position: kept
    assert q.last_unit() == expected(3)
    assert q.truncate_after_position(0) == 0
    q.close()


def test_search_by_position_and_time(tmp_path: Path) -> None:
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    fill(q, 9)
    q.write_out()
    fill(q, 3)  # the searches also cover buffered units
    for offset in range(12):
        position, _, _, store_ts = unit_fields(offset)
        assert q.search_by_position(position) == offset
        assert q.search_by_position(position + 1) is None
        assert q.search_by_time(store_ts) == offset
        assert q.search_by_time(store_ts - 3) == offset  # first unit at or after
    assert q.search_by_position(0) is None and q.search_by_position(10**12) is None
    assert q.search_by_time(0) == 0
    assert q.search_by_time(10**12) == 12  # none: max_offset
    q.close()
    empty = ConsumeQueue(str(tmp_path / "empty"), units_per_file=UPF)
    assert empty.search_by_time(0) == 0 and empty.search_by_position(1000) is None


def test_set_base(tmp_path: Path) -> None:
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    q.set_base(1000)
    assert (q.min_offset, q.max_offset) == (1000, 1000)
    q.close()
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)  # survives reopen with no unit written
    assert (q.min_offset, q.max_offset) == (1000, 1000)
    fill(q, 6)
    q.close()
    assert files_in(tmp_path) == [file_name(1000), file_name(1004)]
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    assert (q.min_offset, q.max_offset) == (1000, 1006)
    assert q.read(0, 10) == [] and q.get(999) is None
    assert q.read(1000, 10) == [expected(i) for i in range(1000, 1006)]
    with pytest.raises(ValueError):
        q.set_base(5)
    q.close()


def test_delete_before_position(tmp_path: Path) -> None:
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    fill(q, 10)
    q.write_out()
    # Units 0..5 point below unit 6's position: file 0 goes, file 4 stays with min inside it.
    assert q.delete_before_position(unit_fields(6)[0] - 1) == 1
    assert q.min_offset == 6 and files_in(tmp_path) == [file_name(4), file_name(8)]
    assert q.get(5) is None and q.read(4, 10) == [] and q.read(0, 10) == []
    assert q.read(6, 10) == [expected(i) for i in range(6, 10)]
    assert q.search_by_position(unit_fields(5)[0]) is None
    assert q.delete_before_position(unit_fields(6)[0]) == 0  # nothing more to do
    q.close()
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    assert (q.min_offset, q.max_offset) == (6, 10)
    # Everything below the log's first position: every file goes, offsets carry on.
    assert q.delete_before_position(10**12) == 2
    assert (q.min_offset, q.max_offset, files_in(tmp_path)) == (10, 10, [])
    q.close()
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    assert (q.min_offset, q.max_offset) == (10, 10)
    fill(q, 5)
    assert q.read(10, 10) == [expected(i) for i in range(10, 15)]
    q.close()
    assert files_in(tmp_path) == [file_name(10), file_name(14)]


def test_delete_before_position_reaches_into_the_buffer(tmp_path: Path) -> None:
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    fill(q, 3)
    q.write_out()
    fill(q, 3)  # 3..5 buffered
    assert q.delete_before_position(unit_fields(4)[0]) == 1  # the partly filled file 0 goes too
    assert (q.min_offset, q.max_offset, files_in(tmp_path)) == (4, 6, [])
    assert q.read(0, 10) == [] and q.read(4, 10) == [expected(4), expected(5)]
    q.close()
    assert files_in(tmp_path) == [file_name(3)]  # units 3..5 start a new file chain
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    assert (q.min_offset, q.max_offset) == (4, 6) and q.get(4) == expected(4)
    q.close()


def test_interrupted_retention_is_finished_on_open(tmp_path: Path) -> None:
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    fill(q, 10)
    q.close()
    saved = (tmp_path / file_name(0)).read_bytes()
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    assert q.delete_before_position(unit_fields(5)[0]) == 1
    q.close()
    (tmp_path / file_name(0)).write_bytes(saved)  # as if the crash came before the unlink
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    assert q.min_offset == 5 and files_in(tmp_path) == [file_name(4), file_name(8)]
    q.close()


def test_fds_stay_bounded(tmp_path: Path) -> None:
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    fill(q, 40)
    q.write_out()
    for offset in range(0, 40, 3):
        assert q.get(offset) == expected(offset)
        assert len(q._fds) <= FD_CACHE_MAX
    q.flush()
    assert not q._fds  # flush releases them
    q.close()


def test_concurrent_reader_never_sees_a_torn_unit(tmp_path: Path) -> None:
    total = 5_000
    q = ConsumeQueue(str(tmp_path), units_per_file=64)
    errors: list[str] = []
    writer_done = threading.Event()
    reads = [0]

    def reader() -> None:
        offset = 0
        while True:
            finished = writer_done.is_set()  # checked before the pass: the last pass sees every unit
            end = q.max_offset  # only grows: a read below it must come back whole
            got = q.read(offset, 97)
            tail = q.last_unit()
            if len(got) < min(97, end - offset):
                errors.append(f"short read at {offset}: {len(got)} units, max_offset was {end}")
            bad = [u for u in [*got, tail] if u is not None and u != expected(u.offset)]
            if bad:
                errors.append(f"torn units {bad}")
            if errors or finished:
                return
            reads[0] += 1
            offset = (offset + 31) % max(end, 1)

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(total):
        q.append(*unit_fields(i))
        if i % 37 == 0:
            q.write_out()
        if i % 1000 == 999:
            q.flush()
    writer_done.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert errors == [] and reads[0] > 0
    assert q.read(0, total) == [expected(i) for i in range(total)]
    q.close()


@pytest.mark.parametrize("races", [1, 3])  # 3: every unlocked attempt races, the locked one cannot
def test_read_racing_with_truncation_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, races: int
) -> None:
    q = ConsumeQueue(str(tmp_path), units_per_file=UPF)
    fill(q, 8)
    q.write_out()
    real = q._pread_units
    replaced = [Unit(i, 9_000 + i, 1, 0, 1) for i in range(2, 8)]
    done: list[int] = []

    def racing(begin: int, end: int) -> bytes | None:
        data = real(begin, end)
        if len(done) < races:  # the writer replaces units 2..7 after this pread
            done.append(1)
            q.truncate(2)
            for u in replaced:
                q.append(u.position, u.size, u.tag_hash, u.store_ts)
            q.write_out()
        return data

    monkeypatch.setattr(q, "_pread_units", racing)
    assert q.read(0, 8) == [expected(0), expected(1), *replaced]
    assert len(done) == races
    q.close()


def test_store_discovery_and_delete_topic(tmp_path: Path) -> None:
    store = ConsumeQueueStore(str(tmp_path), units_per_file=UPF)
    for topic, qid, count in [("TopicB", 3, 2), ("TopicA", 1, 5), ("TopicA", 0, 6), ("%RETRY%g1", 0, 1)]:
        fill(store.get_or_create(topic, qid), count)
    assert store.get("TopicA", 7) is None
    store.write_out_all()
    store.flush_all()
    store.close()
    (tmp_path / "not a topic").mkdir()
    (tmp_path / "TopicA" / "x").mkdir()

    store = ConsumeQueueStore(str(tmp_path), units_per_file=UPF)
    listing = [(t, q, cq.max_offset) for t, q, cq in store.queues()]
    assert listing == [("%RETRY%g1", 0, 1), ("TopicA", 0, 6), ("TopicA", 1, 5), ("TopicB", 3, 2)]
    assert store.topics() == ["%RETRY%g1", "TopicA", "TopicB"] and store.damaged == []
    queue = store.get("TopicA", 0)
    assert queue is not None and queue.read(0, 10) == [expected(i) for i in range(6)]
    assert store.get_or_create("TopicA", 0) is queue

    # File 0 of TopicA/0 and TopicA/1, and the only files of TopicB/3 and %RETRY%g1.
    assert store.delete_before_position(unit_fields(4)[0]) == 4
    assert [(t, q, cq.min_offset) for t, q, cq in store.queues()][1:3] == [("TopicA", 0, 4), ("TopicA", 1, 4)]
    store.delete_topic("TopicA")
    assert store.topics() == ["%RETRY%g1", "TopicB"] and not (tmp_path / "TopicA").exists()
    with pytest.raises(ValueError):
        store.get_or_create("bad/topic", 0)
    store.close()
    shutil.rmtree(tmp_path / "not a topic")
    assert [t for t, _, _ in ConsumeQueueStore(str(tmp_path), units_per_file=UPF).queues()] == [
        "%RETRY%g1",
        "TopicB",
    ]


def test_a_flush_begun_before_its_topic_was_deleted_finishes(tmp_path: Path) -> None:
    """The store's snapshot takes the queues' files on the apply thread and fsyncs them on its sync
    thread; a topic deleted in between removed the queue directories. Finishing must not fail (it
    did: FileNotFoundError from the directory fsync, so the snapshot failed and the broker's stop
    raised; seen in the in-process mqadmin deleteTopic test)."""
    store = ConsumeQueueStore(str(tmp_path), units_per_file=UPF)
    for qid in range(2):
        fill(store.get_or_create("Gone", qid), 6)
    fill(store.get_or_create("Kept", 0), 3)
    pending = store.begin_flush_all()
    assert all(p.dir_path is not None for p in pending)  # new files: their directories need an fsync
    store.delete_topic("Gone")
    for p in pending:
        finish_flush(p)
    assert store.topics() == ["Kept"]
    kept = store.get("Kept", 0)
    assert kept is not None and kept.read(0, 10) == [expected(i) for i in range(3)]
    store.close()
