"""A full or failing disk (issue 27 part 5): faults injected at the system calls the log uses.

``DiskFaults`` stands between the store and ``os``: writes to files under a directory given a
``room`` budget succeed until it is used up (the last one short, as the kernel does), then fail with
ENOSPC; writing within the blocks a file already has takes no room, and a rename over a file frees
its blocks (a model of a file system that overwrites in place, like ext4 or tmpfs; blocks of
``block`` bytes, 1 unless a test says 4096); file creation there fails with ENOSPC when no room is
left; ``fdatasync``/``fsync`` of files under a directory in ``eio`` fail with EIO. The files are
told apart by /proc/self/fd, so one replica of an in-process group can have a full or failing disk
while its peers do not.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from dledger.entry_codec import HEADER_SIZE
from dledger.entry_store import EntryStore, StoreFailedError, StoreFullError
from dledger.meta_store import FileMetaStore
from dledger.node import AppendTimeoutError, DiskFullError, DLedgerError, DLedgerNode
from tests.dledger.harness import InProcCluster, wait_until

SEG = 4096


class DiskFaults:
    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.room: dict[str, int] = {}  # directory -> bytes that may still be written under it
        self.eio: set[str] = set()  # directories whose files fail fdatasync/fsync with EIO
        self.block = 1  # allocation unit: writes inside a file's last block need no room
        self.refused = 0
        self.real_pwritev = os.pwritev
        self.real_pwrite = os.pwrite
        self.real_open = os.open
        self.real_fdatasync = os.fdatasync
        self.real_fsync = os.fsync
        monkeypatch.setattr(os, "pwritev", self.pwritev)
        monkeypatch.setattr(os, "pwrite", self.pwrite)
        monkeypatch.setattr(os, "open", self.open)
        monkeypatch.setattr(os, "fdatasync", self.fdatasync)
        monkeypatch.setattr(os, "fsync", self.fsync)
        self.real_replace = os.replace
        monkeypatch.setattr(os, "replace", self.replace)

    @staticmethod
    def _path(fd: int) -> str:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return ""

    def _budget(self, path: str) -> str | None:
        for d in self.room:
            if path.startswith(d.rstrip("/") + "/"):
                return d
        return None

    def _take(self, fd: int, offset: int, want: int) -> int:
        """How many of ``want`` bytes at ``offset`` may be written to ``fd`` (ENOSPC when none)."""
        d = self._budget(self._path(fd))
        if d is None:
            return want
        size = os.fstat(fd).st_size
        block = self.block
        overwrite = max(0, -(-size // block) * block - offset)  # the file's blocks are its own
        allowed = overwrite + max(0, self.room[d])
        if allowed <= 0 and want > 0:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = min(want, allowed)
        self.room[d] -= max(0, n - overwrite)
        return n

    def pwritev(self, fd: int, buffers: Sequence[bytes], offset: int, /) -> int:
        data = b"".join(bytes(b) for b in buffers)
        n = self._take(fd, offset, len(data))
        return self.real_pwrite(fd, data[:n], offset)

    def pwrite(self, fd: int, data: bytes, offset: int, /) -> int:
        n = self._take(fd, offset, len(data))
        return self.real_pwrite(fd, bytes(data)[:n], offset)

    def open(self, path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        d = self._budget(os.path.abspath(path))
        if d is not None and flags & os.O_CREAT and self.room[d] <= 0 and not os.path.exists(path):
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return self.real_open(path, flags, mode, dir_fd=dir_fd)

    def replace(self, src: str, dst: str) -> None:
        """A rename over ``dst`` frees ``dst``'s blocks."""
        d = self._budget(os.path.abspath(dst))
        freed = os.path.getsize(dst) if d is not None and os.path.exists(dst) else 0
        self.real_replace(src, dst)
        if d is not None:
            self.room[d] += -(-freed // self.block) * self.block

    def _sync(self, real: object, fd: int) -> None:
        path = self._path(fd)
        if any(path == d or path.startswith(d.rstrip("/") + "/") for d in self.eio):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)  # type: ignore[operator]

    def fdatasync(self, fd: int, /) -> None:
        self._sync(self.real_fdatasync, fd)

    def fsync(self, fd: int, /) -> None:
        self._sync(self.real_fsync, fd)


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Iterator[DiskFaults]:
    yield DiskFaults(monkeypatch)


def _segment_sizes(store_dir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted((store_dir / "log").iterdir())}


def _bodies(store: EntryStore) -> list[bytes]:
    return [store.read(i).body for i in range(store.first_index, store.last_index + 1)]


# -- the store --------------------------------------------------------------------------------------
def test_an_entry_that_finds_no_room_is_undone_and_writes_resume_when_room_returns(
    tmp_path: Path, faults: DiskFaults
) -> None:
    """Before: the raw OSError escaped with the entry's first bytes left in the segment."""
    store = EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    kept = [b"a" * 100, b"b" * 100, b"c" * 100]
    for i, body in enumerate(kept, 1):
        store.append(i, 1, body)
    published = _segment_sizes(tmp_path)
    faults.room[str(tmp_path / "log")] = 40  # room for part of the header only: a short write
    with pytest.raises(StoreFullError) as info:
        store.append(4, 1, b"d" * 300)
    assert info.value.code == "STORE_FULL" and info.value.needed == HEADER_SIZE + 300
    assert "entries 4..4" in str(info.value) and "ENOSPC" in str(info.value)
    assert store.last_index == 3 and _bodies(store) == kept
    assert _segment_sizes(tmp_path) == published  # no partial entry on disk
    store.flush()  # the store is not failed: only that write was refused
    del faults.room[str(tmp_path / "log")]
    store.append(4, 1, b"e" * 300)
    store.close()
    reopened = EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    assert _bodies(reopened) == [*kept, b"e" * 300]
    reopened.close()


def test_no_room_for_the_index_record_undoes_the_entry(tmp_path: Path, faults: DiskFaults) -> None:
    store = EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    store.append(1, 1, b"x" * 50)
    published = _segment_sizes(tmp_path)
    faults.room[str(tmp_path / "index")] = 0
    with pytest.raises(StoreFullError):
        store.append(2, 1, b"y" * 50)
    assert store.last_index == 1 and _segment_sizes(tmp_path) == published
    del faults.room[str(tmp_path / "index")]
    store.append(2, 1, b"z" * 50)
    store.close()
    reopened = EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    assert _bodies(reopened) == [b"x" * 50, b"z" * 50]
    reopened.close()


def test_no_room_for_a_new_segment_is_refused_and_the_roll_resumes(tmp_path: Path, faults: DiskFaults) -> None:
    store = EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    body = b"s" * (SEG // 2 - HEADER_SIZE)
    store.append(1, 1, body)
    store.append(2, 1, body)  # the first segment is full: the next entry needs a new one
    faults.room[str(tmp_path / "log")] = 0
    with pytest.raises(StoreFullError) as info:
        store.append(3, 1, b"t" * 10)
    assert "creating the segment" in str(info.value) or "sealing" in str(info.value)
    assert store.last_index == 2
    del faults.room[str(tmp_path / "log")]
    store.append(3, 1, b"t" * 10)
    store.close()
    reopened = EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    assert _bodies(reopened) == [body, body, b"t" * 10] and len(reopened.segments()) == 2
    reopened.close()


def test_a_failed_fdatasync_is_never_retried(tmp_path: Path, faults: DiskFaults) -> None:
    """fsyncgate. Before: the segment went back to the dirty set and the next flush() synced it
    again and returned as if the entry were durable."""
    store = EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    store.append(1, 1, b"first")
    store.flush()
    store.append(2, 1, b"second")
    faults.eio.add(str(tmp_path / "log"))
    with pytest.raises(StoreFailedError) as info:
        store.flush()
    message = str(info.value)
    assert str(tmp_path / "log" / "00000000000000000000") in message and "[Errno 5] EIO" in message
    faults.eio.clear()  # the disk "works" again: a retried fsync would now succeed
    with pytest.raises(StoreFailedError):
        store.flush()
    with pytest.raises(StoreFailedError):
        store.append(3, 1, b"third")
    assert store.failed is info.value
    store.close()  # no flush (and no raise): the failure was raised where it happened


def test_retention_frees_segments_on_a_full_disk(tmp_path: Path, faults: DiskFaults) -> None:
    """Retention replaces the anchor before it removes segments: the anchor keeps a spare file
    (replace_reserving), so that needs no free space. Before: the anchor's temporary file was
    created anew each time, ENOSPC escaped and the replica failed stop, on the full disk that
    retention was there to relieve."""
    store = EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    body = b"r" * (SEG // 2 - HEADER_SIZE)
    for i in range(1, 9):
        store.append(i, 1, body)
    assert store.delete_segments_before(3) > 0  # the first anchor write leaves the spare
    first = store.first_index
    faults.room[str(tmp_path)] = 0  # the whole store is full
    assert store.delete_segments_before(6) > 0 and store.first_index > first
    store.close()
    reopened = EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    assert reopened.first_index == store.first_index and reopened.last_index == 8
    reopened.close()


def test_retention_without_a_spare_and_no_room_removes_nothing(tmp_path: Path, faults: DiskFaults) -> None:
    store = EntryStore(str(tmp_path), segment_bytes=SEG, index_records_per_file=64)
    body = b"r" * (SEG // 2 - HEADER_SIZE)
    for i in range(1, 7):
        store.append(i, 1, body)
    segments = len(store.segments())
    for spare in tmp_path.glob("anchor*.tmp"):
        spare.unlink()
    faults.room[str(tmp_path)] = 0
    with pytest.raises(StoreFullError):
        store.delete_segments_before(5)
    assert store.first_index == 1 and len(store.segments()) == segments
    del faults.room[str(tmp_path)]
    assert store.delete_segments_before(5) > 0
    store.close()


def test_votes_and_commit_hints_are_recorded_on_a_full_disk(tmp_path: Path, faults: DiskFaults) -> None:
    """Before: each vote created a new temporary file and each commit hint too: on a full file
    system the next election or one-second timer raised ENOSPC and the replica failed stop."""
    meta = FileMetaStore(str(tmp_path))
    meta.save_term_vote(3, "n1")  # leaves the spare
    meta.save_commit_hint(10)
    faults.block = 4096  # a longer vote still fits the spare's block
    faults.room[str(tmp_path)] = 0
    meta.save_term_vote(4, "n2-with-a-longer-id")
    meta.save_term_vote(5, None)
    meta.save_commit_hint(12)
    assert FileMetaStore(str(tmp_path)).load() == (5, None, 12)


# -- a group --------------------------------------------------------------------------------------
async def test_a_blocked_replica_ignores_a_transfer_to_it(tmp_path: Path, faults: DiskFaults) -> None:
    """TimeoutNow to a replica that cannot write is ignored. Without that it kept pysyncobj's
    "transfer in progress" flag and, once unblocked, campaigned past the healthy leader's lease."""
    free: dict[str, int] = {}
    c = await _cluster(tmp_path, free)
    try:
        leader = await c.leader()
        await leader.append([b"before"])
        one = c.followers(leader)[0]
        _fill(faults, one, free)
        await leader.append([b"not on one"])
        await wait_until(lambda: one.core.write_blocked is not None, 10, "one to be blocked")
        sync = one.core.sync
        assert sync is not None
        leader_node = next(n for n in sync.otherNodes if n.address == leader.settings.peers[leader.settings.self_id])

        def timeout_now() -> bool:
            sync._SyncObj__onMessageReceived(leader_node, {"type": "timeout_now", "term": sync.raftCurrentTerm})
            return bool(sync._SyncObj__transferInProgress)

        assert await one.run_on_replica_thread(timeout_now) is False
    finally:
        await c.stop()


def _log_dirs(node: DLedgerNode) -> list[str]:
    store = os.path.join(node.settings.data_dir, "store")
    return [os.path.join(store, "log"), os.path.join(store, "index")]


def _fill(faults: DiskFaults, node: DLedgerNode, free: dict[str, int]) -> None:
    for d in _log_dirs(node):
        faults.room[d] = 0
    free[node.settings.self_id] = 0


def _free(faults: DiskFaults, node: DLedgerNode, free: dict[str, int]) -> None:
    for d in _log_dirs(node):
        faults.room.pop(d, None)
    free[node.settings.self_id] = 1 << 40


async def _cluster(tmp_path: Path, free: dict[str, int]) -> InProcCluster:
    c = InProcCluster(str(tmp_path))
    for nid in c.ids:
        free[nid] = 1 << 40
    await c.start()
    for nid, node in c.nodes.items():
        node.core._free_bytes = lambda _path, nid=nid: free[nid]  # type: ignore[misc]
    return c


async def test_a_leader_whose_log_is_full_refuses_with_disk_full_and_steps_down(
    tmp_path: Path, faults: DiskFaults
) -> None:
    """Before: the leader's tick raised the OSError and the replica failed stop."""
    free: dict[str, int] = {}
    c = await _cluster(tmp_path, free)
    try:
        leader = await c.leader()
        await leader.append([b"before"])
        _fill(faults, leader, free)
        with pytest.raises(DiskFullError) as info:
            await leader.append([b"no room"])
        assert info.value.code == "DISK_FULL" and "no room" in str(info.value)
        assert leader.fatal is None  # alive, not leading
        new = await wait_until(
            lambda: next((n for n in c.nodes.values() if n.role == "LEADER" and n is not leader), None),
            10,
            "a replica that can write to lead",
        )
        assert leader.role != "LEADER"
        status = await leader.status()
        assert status["write_blocked"] and status["disk_full"]
        assert status["counters"]["stepdowns_disk_full"] == 1
        for k in range(5):
            await new.append([f"after {k}".encode()])
        # the full replica stored none of them (and so never acknowledged them)
        assert leader.last_index < new.last_index and leader.role == "FOLLOWER"
        _free(faults, leader, free)
        await wait_until(lambda: leader.last_index >= new.last_index, 10, "the freed replica to catch up")
        await wait_until(lambda: leader.core.write_blocked is None, 10, "the block to lift")
        assert leader.fatal is None
    finally:
        await c.stop()


async def test_followers_that_cannot_store_never_acknowledge(tmp_path: Path, faults: DiskFaults) -> None:
    """With both followers full nothing commits (no acknowledgement without the entry on disk);
    when space returns the entry commits."""
    free: dict[str, int] = {}
    c = await _cluster(tmp_path, free)
    try:
        leader = await c.leader()
        await leader.append([b"before"])
        one, two = c.followers(leader)
        _fill(faults, one, free)
        await leader.append([b"committed by the leader and the other follower"])
        assert one.last_index < leader.last_index
        _fill(faults, two, free)
        with pytest.raises(AppendTimeoutError):
            await leader.append([b"nobody can store this"], timeout_s=1.5)
        assert leader.commit_index < leader.last_index
        assert one.last_index < leader.last_index and two.last_index < leader.last_index
        # (the leader may step down meanwhile: followers that answer nothing look gone to its
        # quorum check; blocked followers do not campaign, so it is the only candidate)
        _free(faults, one, free)
        _free(faults, two, free)
        await wait_until(lambda: one.core.write_blocked is None and two.core.write_blocked is None, 10, "unblocked")
        await (await c.leader()).append([b"and writes go on"])
        await wait_until(lambda: leader.commit_index >= leader.last_index, 10, "every entry to commit")
    finally:
        await c.stop()


async def test_a_failed_fdatasync_fails_the_replica_naming_file_and_errno(
    tmp_path: Path, faults: DiskFaults
) -> None:
    """Before: the replica stopped with a bare ``OSError(5)`` naming no file."""
    free: dict[str, int] = {}
    c = await _cluster(tmp_path, free)
    try:
        leader = await c.leader()
        await leader.append([b"before"])
        faults.eio.add(_log_dirs(leader)[0])
        with pytest.raises(DLedgerError):  # never acknowledged: timeout or "node stopped"
            await leader.append([b"synced with EIO"], timeout_s=2.0)
        await wait_until(lambda: leader.fatal is not None, 5, "the leader to fail stop")
        fatal = leader.fatal
        assert isinstance(fatal, StoreFailedError)
        assert _log_dirs(leader)[0] in str(fatal) and "[Errno 5] EIO" in str(fatal)
        others = [n for n in c.nodes.values() if n is not leader]
        await wait_until(lambda: any(n.role == "LEADER" for n in others), 10, "a new leader")
        new = next(n for n in others if n.role == "LEADER")
        await new.append([b"the group goes on"])
    finally:
        faults.eio.clear()
        await c.stop()
