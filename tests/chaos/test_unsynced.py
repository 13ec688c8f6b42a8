"""The crash fault's page-cache model: sizes recorded at each fsync, files cut back after a kill."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from chaos.unsynced import (
    SyncedSizeTable,
    install_hook,
    lose_unsynced,
    read_table,
    synced_at,
    uninstall_hook,
)
from dledger.entry_store import EntryStore


@pytest.fixture
def hooked(tmp_path: Any) -> Iterator[SyncedSizeTable]:
    table = SyncedSizeTable(str(tmp_path / "node.table"), slots=64)
    install_hook(table)
    try:
        yield table
    finally:
        uninstall_hook()
        table.close()


def write(path: str, data: bytes, *, sync: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def test_table_records_raise_lower_forget_and_survive_reopening(tmp_path: Any) -> None:
    path = str(tmp_path / "t.table")
    t = SyncedSizeTable(path, slots=4)
    t.raise_to(1, 10, 100)
    t.raise_to(1, 10, 50)  # a late record of an older fsync never lowers it
    t.raise_to(1, 11, 7)
    t.lower_to(1, 11, 3)  # truncation
    t.lower_to(1, 99, 3)  # unknown inode: nothing
    t.raise_to(1, 12, 1)
    t.forget(1, 12)
    assert t.sizes() == {(1, 10): 100, (1, 11): 3}
    t.close()
    again = SyncedSizeTable(path, slots=4)
    assert again.sizes() == {(1, 10): 100, (1, 11): 3} == read_table(path)
    for ino in range(20, 30):  # more files than slots: later ones go unrecorded (never cut: less harsh)
        again.raise_to(1, ino, 5)
    assert len(again.sizes()) == 4
    again.close()
    assert read_table(str(tmp_path / "missing.table")) == {}


def test_a_crash_keeps_what_was_fsynced_and_nothing_else(tmp_path: Any, hooked: SyncedSizeTable) -> None:
    data = tmp_path / "data"
    os.makedirs(data / "sub")
    log = str(data / "log")
    write(log, b"a" * 100, sync=True)
    write(log, b"b" * 50)  # page cache only
    never = str(data / "sub" / "never-synced")
    write(never, b"c" * 30)
    atomic = str(data / "state")
    write(atomic + ".tmp", b"d" * 20, sync=True)
    os.replace(atomic + ".tmp", atomic)  # the inode keeps its record under the new name
    shrunk = str(data / "shrunk")
    write(shrunk, b"e" * 40, sync=True)
    with open(shrunk, "r+b") as f:
        os.ftruncate(f.fileno(), 10)
        f.seek(10)
        f.write(b"f" * 5)  # unsynced again after the truncation
    with open(str(data / "via-file-object"), "wb") as f:
        f.write(b"g" * 8)
        f.flush()
        os.fsync(f)  # an object with fileno(), as the stdlib allows
        f.write(b"h" * 8)
    report = lose_unsynced(str(data), hooked.path)
    sizes = {name: os.path.getsize(str(data / name)) for name in ("log", "state", "shrunk", "via-file-object")}
    assert sizes == {"log": 100, "state": 20, "shrunk": 10, "via-file-object": 8}
    assert os.path.getsize(never) == 0
    assert report.files_seen == 5 and report.files_cut == 4
    assert report.bytes_lost == 50 + 30 + 5 + 8
    assert ("sub/never-synced", 30, 0) in report.cut


def test_removed_files_lose_their_records(tmp_path: Any, hooked: SyncedSizeTable) -> None:
    def recorded() -> set[int]:
        return {ino for (_dev, ino) in hooked.sizes()}

    a, b, c = str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c")
    write(a, b"x" * 10, sync=True)
    write(b, b"y" * 10, sync=True)
    ino_a, ino_b = os.stat(a).st_ino, os.stat(b).st_ino
    os.unlink(a)
    assert ino_a not in recorded()
    os.rename(b, c)  # renaming keeps the record (same inode, new name)
    assert ino_b in recorded()
    d = str(tmp_path / "d")
    write(d, b"z", sync=True)
    ino_d = os.stat(d).st_ino
    os.replace(d, c)  # replacing c drops the record of the inode it replaced
    assert ino_b not in recorded() and ino_d in recorded()


def test_the_hook_is_installed_once_and_uninstalled_cleanly(tmp_path: Any) -> None:
    originals = (os.fsync, os.fdatasync, os.replace, os.unlink)
    t = SyncedSizeTable(str(tmp_path / "t"), slots=4)
    install_hook(t)
    try:
        assert os.fsync is not originals[0]
        with pytest.raises(RuntimeError):
            install_hook(t)
    finally:
        uninstall_hook()
        t.close()
    assert (os.fsync, os.fdatasync, os.replace, os.unlink) == originals


def test_the_raft_log_comes_back_with_exactly_its_flushed_entries(tmp_path: Any, hooked: SyncedSizeTable) -> None:
    """The model on the real store: acknowledged (flushed) entries survive, unflushed ones go."""
    path = str(tmp_path / "node" / "store")
    store = EntryStore(path, segment_bytes=1 << 20, index_records_per_file=1024)
    for i in range(1, 11):
        store.append(i, 1, b"flushed-%d" % i)
    store.flush()
    for i in range(11, 16):
        store.append(i, 1, b"page-cache-only-%d" % i)
    assert store.last_index == 15
    report = lose_unsynced(str(tmp_path / "node"), hooked.path)  # the "kill": no close, no flush
    assert report.bytes_lost > 0
    store._close_all()
    reopened = EntryStore(path, segment_bytes=1 << 20, index_records_per_file=1024)
    try:
        assert reopened.last_index == 10
        assert reopened.read(10).body == b"flushed-10"
        reopened.append(11, 2, b"after the crash")
        reopened.flush()
        assert reopened.read(11).body == b"after the crash"
    finally:
        reopened.close()


def test_synced_at_says_whether_a_log_position_reached_the_disk(tmp_path: Any, hooked: SyncedSizeTable) -> None:
    """What a gated crash reads: a position inside the fsynced part of the replica's log segment, or
    past it (appended, answered maybe, not fsynced), or not in the log at all."""
    node = str(tmp_path / "node")
    assert not synced_at(node, read_table(hooked.path), 0)  # no log yet
    store = EntryStore(os.path.join(node, "store"), segment_bytes=1 << 20, index_records_per_file=1024)
    try:
        flushed = store.append(1, 1, b"flushed")
        store.flush()
        pending = store.append(2, 1, b"page cache only")
        table = read_table(hooked.path)
        assert synced_at(node, table, flushed)
        assert not synced_at(node, table, pending)
        assert not synced_at(node, table, pending + 10_000)  # never received
        store.flush()
        assert synced_at(node, read_table(hooked.path), pending)
    finally:
        store.close()
