"""The replica reader against files the real writers produce: logs (torn tails, damage, retention),
meta files, consume queues, the store snapshot; and it never writes a byte."""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import pytest

from broker.store.consume_queue import ConsumeQueue, ConsumeQueueStore
from broker.store.message import StoredMessage, encode_command, encode_message
from broker.store.snapshot import write_snapshot
from dledger.command_codec import body_offsets, encode_batch
from dledger.entry_codec import HEADER_SIZE, MAGIC
from dledger.entry_store import EntryStore
from dledger.journal import RaftJournal
from spark_jobs.replica_reader import (
    CommandRecord,
    LogReader,
    MessageRecord,
    ReplicaDamaged,
    decode_records,
    read_commit_hint,
    read_consume_queue,
    read_store_snapshot,
    read_term,
)
from spark_jobs.replica_tables import iter_rows, scan_group

SEG = 4096


def body(i: int, size: int = 100) -> bytes:
    return (f"<{i}>".encode() * size)[:size]


def write_log(path: Path, n: int, segment_bytes: int = SEG) -> list[tuple[int, int, bytes, int]]:
    """n entries (index, term, body) in a fresh store; returns (index, term, body, position)."""
    store = EntryStore(str(path), segment_bytes=segment_bytes)
    rows = [(i, 1 + i // 10, body(i)) for i in range(1, n + 1)]
    positions = store.append_many(rows)
    store.close()
    return [(i, t, b, p) for (i, t, b), p in zip(rows, positions, strict=True)]


def last_segment(store_dir: Path) -> Path:
    return max((store_dir / "log").iterdir())


def snapshot_tree(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under root: (size, mtime_ns, sha256)."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            st = os.stat(p)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = (
                    st.st_size,
                    st.st_mtime_ns,
                    hashlib.sha256(f.read()).hexdigest(),
                )
    return out


def test_reads_every_entry_the_store_wrote(tmp_path: Path) -> None:
    written = write_log(tmp_path, 200)
    reader = LogReader(str(tmp_path))
    got = list(reader.entries())
    assert [(e.index, e.term, e.body, e.position) for e in got] == written
    assert len(list((tmp_path / "log").iterdir())) > 3  # several segments, BLANK padding crossed
    assert reader.torn_tail is None
    store = EntryStore(str(tmp_path), segment_bytes=SEG)
    try:
        assert [e.chain_crc for e in got] == [store.chain_crc_at(i) for i in range(1, 201)]
    finally:
        store.close()


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param(struct.pack("<II", MAGIC, 400) + bytes(13), id="half-header"),
        pytest.param(b"\x00" * 7, id="zeros"),
        pytest.param("whole-entry-short-body", id="short-body"),
        pytest.param("bad-body-crc", id="bad-body-crc"),
    ],
)
def test_torn_tail_is_tolerated_and_left_alone(tmp_path: Path, tail: object) -> None:
    """A torn last record is where the store's recovery would cut; the reader stops there and
    never modifies the file (the store itself would truncate it)."""
    written = write_log(tmp_path, 50)
    seg = last_segment(tmp_path)
    size_before = seg.stat().st_size
    if tail == "whole-entry-short-body":
        store = EntryStore(str(tmp_path), segment_bytes=SEG)
        store.append(51, 9, body(51))
        store.close()
        with open(seg, "r+b") as f:
            f.truncate(seg.stat().st_size - 30)
        expected = written
    elif tail == "bad-body-crc":
        store = EntryStore(str(tmp_path), segment_bytes=SEG)
        store.append(51, 9, body(51))
        store.close()
        with open(seg, "r+b") as f:
            f.seek(-1, os.SEEK_END)
            f.write(b"!")
        expected = written
    else:
        assert isinstance(tail, bytes)
        with open(seg, "ab") as f:
            f.write(tail)
        expected = written
    before = snapshot_tree(tmp_path)
    reader = LogReader(str(tmp_path))
    got = [(e.index, e.term, e.body, e.position) for e in reader.entries()]
    assert got == expected
    assert reader.torn_tail is not None
    assert reader.torn_tail.offset == size_before
    assert snapshot_tree(tmp_path) == before


def test_damage_before_the_tail_is_reported_after_the_good_entries(tmp_path: Path) -> None:
    written = write_log(tmp_path, 200)
    first_seg = min((tmp_path / "log").iterdir())
    with open(first_seg, "r+b") as f:  # a body byte of entry 3, in the first (sealed) segment
        f.seek(written[2][3] + HEADER_SIZE + 5)
        f.write(b"#")
    reader = LogReader(str(tmp_path))
    got = []
    with pytest.raises(ReplicaDamaged, match="not the last segment"):
        for e in reader.entries():
            got.append(e.index)
    assert got == [1, 2]


def test_bad_record_followed_by_valid_ones_in_the_last_segment_is_damage(tmp_path: Path) -> None:
    written = write_log(tmp_path, 30, segment_bytes=1 << 20)  # one segment
    seg = last_segment(tmp_path)
    with open(seg, "r+b") as f:
        f.seek(written[10][3] + HEADER_SIZE + 1)
        f.write(b"#")
    with pytest.raises(ReplicaDamaged, match="valid records follow"):
        list(LogReader(str(tmp_path)).entries())


def test_retained_log_starts_after_the_anchor(tmp_path: Path) -> None:
    written = write_log(tmp_path, 200)
    store = EntryStore(str(tmp_path), segment_bytes=SEG)
    removed = store.delete_segments_before(120)
    first = store.first_index
    store.close()
    assert removed > 0 and first > 1
    reader = LogReader(str(tmp_path))
    got = [(e.index, e.body, e.position) for e in reader.entries()]
    assert reader.anchor is not None and reader.first_index == first
    assert got == [(i, b, p) for i, _t, b, p in written if i >= first]


def test_truncated_and_rewritten_suffix(tmp_path: Path) -> None:
    """A follower that truncated a conflicting suffix and appended the leader's entries."""
    write_log(tmp_path, 40)
    store = EntryStore(str(tmp_path), segment_bytes=SEG)
    store.truncate_suffix(31)
    store.append_many([(i, 7, body(i + 1000)) for i in range(31, 46)])
    store.close()
    got = list(LogReader(str(tmp_path)).entries())
    assert [e.index for e in got] == list(range(1, 46))
    assert [e.term for e in got[30:]] == [7] * 15


def test_meta_files_as_the_journal_writes_them(tmp_path: Path) -> None:
    store = EntryStore(str(tmp_path / "store"), segment_bytes=SEG)
    journal = RaftJournal(store, str(tmp_path / "meta"))
    journal.setCurrentTerm(5, "n2")
    journal.setRaftCommitIndex(17)
    journal.onOneSecondTimer()
    journal.close()
    assert read_term(str(tmp_path / "meta")) == (5, "n2")
    assert read_commit_hint(str(tmp_path / "meta")) == 17
    assert read_commit_hint(str(tmp_path / "nowhere")) is None
    (tmp_path / "meta" / "raft_commit").write_bytes(b"\x01\x02")
    assert read_commit_hint(str(tmp_path / "meta")) is None  # damaged: ignored, like the journal does


def test_consume_queue_files(tmp_path: Path) -> None:
    q = ConsumeQueue(str(tmp_path / "q"), units_per_file=10)
    for k in range(35):
        q.append(1000 + 100 * k, 90, 0, 5)
    q.flush()
    q.delete_before_position(1000 + 100 * 12)  # retention: min_offset 12, files below deleted
    q.close()
    got = read_consume_queue(str(tmp_path / "q"), "T", 0)
    assert got.damage is None
    assert got.first_offset == 12 and got.count == 23
    with open(tmp_path / "q" / "00000000000000000030", "ab") as f:
        f.write(bytes(28 * 2) + b"\x01\x02")  # trailing zero units and a torn unit
    again = read_consume_queue(str(tmp_path / "q"), "T", 0)
    assert (again.first_offset, again.count, again.data) == (got.first_offset, got.count, got.data)
    os.unlink(tmp_path / "q" / "00000000000000000020")
    assert read_consume_queue(str(tmp_path / "q"), "T", 0).damage is not None


def test_store_snapshot(tmp_path: Path) -> None:
    snap = {
        "version": 1,
        "applied_index": 9,
        "end_position": 4242,
        "metadata": {},
        "queues": [["T", 0, 3], ["T", 1, 5]],
        "needs_state_after": None,
    }
    write_snapshot(str(tmp_path / "snapshot"), snap)
    got = read_store_snapshot(str(tmp_path))
    assert got is not None
    assert (got.applied_index, got.end_position, got.queues) == (9, 4242, {("T", 0): 3, ("T", 1): 5})
    (tmp_path / "snapshot").write_bytes(b"garbage!")
    assert read_store_snapshot(str(tmp_path)) is None


def message(uid: str, queue_id: int, seq: int) -> StoredMessage:
    return StoredMessage(
        "T",
        queue_id,
        0,
        "tag",
        ("key-1", "other"),
        {"producer": "p0", "seq": str(seq)},
        1000,
        "h",
        2000,
        uid,
        b"body-" + uid.encode(),
    )


def test_decode_records_positions_and_fields(tmp_path: Path) -> None:
    records = [
        encode_message(message("U1", 2, 7)),
        encode_command({"op": "topic.delete", "topic": "T"}),
        encode_message(message("U2", 3, 8)),
        b"X?",
    ]
    store = EntryStore(str(tmp_path), segment_bytes=SEG)
    store.append(1, 1, b"\x01")  # pysyncobj's no-op: no records
    position = store.append(2, 1, encode_batch(records))
    store.close()
    entries = list(LogReader(str(tmp_path)).entries())
    assert decode_records(entries[0]) == ([], 0)
    got, bad = decode_records(entries[1])
    assert bad == 1  # the unknown record kind
    offsets = body_offsets(records)
    m1, cmd, m2 = got
    assert isinstance(m1, MessageRecord) and isinstance(m2, MessageRecord) and isinstance(cmd, CommandRecord)
    assert m1.position == position + HEADER_SIZE + offsets[0]
    assert (m1.topic, m1.queue_id, m1.key, m1.producer, m1.seq, m1.unique_id) == (
        "T",
        2,
        "key-1",
        "p0",
        7,
        "U1",
    )
    assert (m1.born_ms, m1.store_ms, m1.size) == (1000, 2000, len(records[0]))
    assert (cmd.op, cmd.topic, cmd.position) == ("topic.delete", "T", position + HEADER_SIZE + offsets[1])
    assert m2.position == position + HEADER_SIZE + offsets[2]


def test_group_scan_decodes_shared_bodies_once_and_never_writes(tmp_path: Path) -> None:
    """Three replicas, one with a different body at index 3: records hold both versions once;
    entries hold every replica's rows; no file under the replicas changes."""
    data = tmp_path / "data"
    bodies = [encode_batch([encode_message(message(f"U{i}", i % 2, i))]) for i in range(1, 8)]
    for node in ("n0", "n1", "n2"):
        store = EntryStore(str(data / f"dledger-{node}" / "store"), segment_bytes=SEG)
        rows = [(i, 1, b) for i, b in enumerate(bodies, start=1)]
        if node == "n2":
            rows[2] = (3, 1, encode_batch([encode_message(message("UX", 1, 3))]))
        store.append_many(rows)
        store.close()
        cqs = ConsumeQueueStore(str(data / f"dledger-{node}" / "broker" / "consumequeue"))
        cqs.get_or_create("T", 0).append(77, 10, 0, 1)
        cqs.close()
    before = snapshot_tree(data)
    out = tmp_path / "out"
    summaries = scan_group("G", [(n, str(data / f"dledger-{n}")) for n in ("n0", "n1", "n2")], str(out))
    assert snapshot_tree(data) == before
    assert [s.entries for s in summaries] == [7, 7, 7]
    assert [s.messages for s in summaries] == [7, 7, 7]
    records = list(iter_rows(str(out / "records")))
    assert sorted(r["unique_id"] for r in records) == sorted([f"U{i}" for i in range(1, 8)] + ["UX"])
    entries = list(iter_rows(str(out / "entries")))
    assert len(entries) == 21
    units = list(iter_rows(str(out / "cq_units")))
    assert [(u["replica"], u["offset"], u["position"], u["prev_position"]) for u in units] == [
        (n, 0, 77, -1) for n in ("n0", "n1", "n2")
    ]


def test_reader_opens_files_read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file the group scan opens under the replica is opened read-only."""
    rdir = tmp_path / "dledger-n0"
    write_log(rdir / "store", 60)
    cq = ConsumeQueue(str(rdir / "broker" / "consumequeue" / "T" / "0"), units_per_file=10)
    for k in range(25):
        cq.append(100 * k, 90, 0, 5)
    cq.close()
    opened: list[tuple[str, str]] = []
    real_os_open, real_open = os.open, open

    def spy_os_open(path: str, flags: int, *a: object) -> int:
        if str(path).startswith(str(rdir)):
            write = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
            opened.append((str(path), "w" if write else "r"))
        return real_os_open(path, flags, *a)  # type: ignore[arg-type]

    def spy_open(file: object, mode: str = "r", *a: object, **kw: object) -> object:
        if str(file).startswith(str(rdir)):
            opened.append((str(file), "w" if set(mode) & set("wax+") else "r"))
        return real_open(file, mode, *a, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "open", spy_os_open)
    monkeypatch.setattr("builtins.open", spy_open)
    summaries = scan_group("G", [("n0", str(rdir))], str(tmp_path / "out"))
    monkeypatch.undo()
    assert summaries[0].entries == 60 and summaries[0].cq_units == 25
    assert any("/log/" in p for p, _ in opened) and any("consumequeue" in p for p, _ in opened)
    assert all(mode == "r" for _, mode in opened), [p for p, m in opened if m != "r"]


def test_anchor_is_verified(tmp_path: Path) -> None:
    write_log(tmp_path, 100)
    store = EntryStore(str(tmp_path), segment_bytes=SEG)
    store.delete_segments_before(50)
    store.close()
    raw = bytearray((tmp_path / "anchor").read_bytes())
    raw[10] ^= 0xFF
    (tmp_path / "anchor").write_bytes(bytes(raw))
    with pytest.raises(ReplicaDamaged, match="anchor"):
        LogReader(str(tmp_path))
