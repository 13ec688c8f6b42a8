"""RaftJournal: pysyncobj's view of the store (positions, lazy slices) and durable term/vote."""

from __future__ import annotations

import os
from typing import Any

import pytest

from dledger.entry_store import EntryStore
from dledger.journal import JournalError, RaftJournal
from dledger.log_store import IndexOutOfRangeError


def make(tmp_path: Any) -> RaftJournal:
    return RaftJournal(EntryStore(str(tmp_path / "store"), segment_bytes=1 << 20), str(tmp_path / "meta"))


def test_positions_map_to_indexes_and_slices_are_lazy(tmp_path: Any) -> None:
    j = make(tmp_path)
    for i in range(1, 11):
        j.add(f"cmd{i}".encode(), i, 1 if i < 6 else 2)
    assert len(j) == 10
    assert j[0][1] == 1 and j[-1][1] == 10 and j[-1][2] == 2
    part = j[3:]
    assert len(part) == 7 and part[0][1] == 4 and part[1:][0][1] == 5
    assert [e[1] for e in reversed(part)] == list(range(10, 3, -1))
    assert list(j[2:4][0]) == [b"cmd3", 3, 1]


def test_anchor_is_position_zero_after_reset(tmp_path: Any) -> None:
    j = make(tmp_path)
    j.store.reset(100, 4, 1234)
    assert len(j) == 1 and j[0][1] == 100 and j[0][2] == 4 and j[0][0] == b"\x01"
    j.add(b"next", 101, 4)
    assert len(j) == 2 and j[-1][1] == 101


def test_delete_entries_from_and_skip(tmp_path: Any) -> None:
    j = make(tmp_path)
    for i in range(1, 11):
        j.add(b"x", i, 1)
    j.skip_next_truncate = True
    j.deleteEntriesFrom(5)  # swallowed once
    assert len(j) == 10 and j.truncations_skipped == 1 and not j.skip_next_truncate
    j.deleteEntriesFrom(5)  # position 5 = index 6
    assert len(j) == 5 and j.entries_truncated == 5


def test_term_and_vote_survive_restart(tmp_path: Any) -> None:
    j = make(tmp_path)
    j.setCurrentTerm(7, "127.0.0.1:40911")
    j.setRaftCommitIndex(0)
    j.close()
    k = make(tmp_path)
    assert (k.getCurrentTerm(), k.getVotedForNodeId()) == (7, "127.0.0.1:40911")


def test_damaged_term_file_refuses_to_load(tmp_path: Any) -> None:
    j = make(tmp_path)
    j.setCurrentTerm(3, None)
    j.close()
    path = os.path.join(str(tmp_path / "meta"), "raft_term")
    with open(path, "r+b") as f:
        f.write(b"\xff")
    with pytest.raises(JournalError, match="checksum"):
        make(tmp_path)


def test_compaction_entry_points_are_refused(tmp_path: Any) -> None:
    j = make(tmp_path)
    with pytest.raises(JournalError):
        j.deleteEntriesTo(1)
    with pytest.raises(JournalError):
        j.clear()


class _CountingStore:
    """An EntryStore whose term_at calls are counted (the index-file reads behind them)."""

    def __init__(self, store: EntryStore):
        self._store = store
        self.term_reads = 0

    def term_at(self, index: int) -> int:
        self.term_reads += 1
        return self._store.term_at(index)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_an_entry_term_is_read_only_when_used_and_agrees_with_the_store(tmp_path: Any) -> None:
    store = _CountingStore(EntryStore(str(tmp_path / "store"), segment_bytes=1 << 20, recent_bytes=0))
    j = RaftJournal(store, str(tmp_path / "meta"))
    for i in range(1, 11):
        j.add(f"cmd{i}".encode(), i, 1 if i < 6 else 2)
    assert j[0][1] == 1 and store.term_reads == 0  # what SyncObj reads per AppendEntries
    assert [j[p][2] for p in range(10)] == [store.term_at(i) for i in range(1, 11)] == [1] * 5 + [2] * 5
    e = j.entry_at_index(3)
    assert e.term == 1 and tuple(e) == (b"cmd3", 3, 1) and e == (b"cmd3", 3, 1)
    with pytest.raises(IndexOutOfRangeError):  # outside the log: refused at once, as before
        j.entry_at_index(11)
    reopened = RaftJournal(store, str(tmp_path / "meta"))
    assert reopened[4][2] == 1 and reopened[5][2] == 2
