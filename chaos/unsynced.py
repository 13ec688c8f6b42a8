"""The crash fault's model of a lost page cache: what a node had fsynced survives, nothing else.

``kill -9`` alone keeps everything a process wrote (the page cache outlives it), and dropping the
page cache (``/proc/sys/vm/drop_caches``) writes dirty pages back instead of losing them, so
neither loses unflushed writes. This module does, per file:

1. Inside the broker (opt-in: ``python -m chaos.launch --synced-table PATH ...`` installs
   ``install_hook``), every ``os.fsync`` / ``os.fdatasync`` of a regular file records the file's
   size *taken before the call* (everything written before the call is covered by it) in a table
   keyed by (device, inode). ``os.ftruncate`` / ``os.truncate`` lower a record; ``os.unlink``,
   ``os.remove``, ``os.replace`` and ``os.rename`` drop the record of the inode they remove.
   The record is written before the fsync call returns to its caller, so before anything the
   caller does after it (an acknowledgement): a kill can only leave a record *higher* than needed,
   never lower.
2. After the kill (every victim of a crash at one instant: ``LocalTarget.kill_all``, so none of
   them syncs anything after another one died), ``lose_unsynced`` truncates every file of the
   node's data directory to its recorded size: bytes appended since the file's last fsync are gone.
   A file without a record was never fsynced (the hook runs from the node's first start, so it saw
   every file being made) and is emptied, as a delayed-allocation file system leaves a file whose
   data never reached the disk (its name survives when its directory was synced).

``synced_at`` answers, for a frozen or dead node, whether a log position had reached its disk: what
a gated crash (``chaos.faults.wait_for_unsynced_ack``) reads before it fires.

The table is a small file of fixed 32-byte slots, mmapped by the broker (a record is a few memory
stores, no system call; a SIGKILL cannot lose it: the page cache holds it for the reader). It lives
outside the data directory and outlasts restarts, so a restarted node keeps its older records.

Every unsynced byte is lost — one of the states a real crash can leave (it may also keep some).
What the model does not do (each makes it less harsh than a real power cut, never harsher, so a
loss it reports is real): bytes overwritten in place inside an already-synced range are not
reverted (mmapped key-index pages, checkpoint slots); truncation by ``open(..., O_TRUNC)`` is not
seen (the record stays high); directory entries are not rolled back (created, renamed and removed
names stay as they are). With ``SYNC_FLUSH`` the Raft log's segments and term file are
fsynced before every acknowledgement, so no acknowledged message may be lost (its index files are
synced at seal only; this model empties their unsynced tails and recovery rebuilds them).
"""

from __future__ import annotations

import dataclasses
import logging
import mmap
import os
import stat
import struct
import threading
from collections.abc import Callable
from typing import Any

from dledger.segment_files import NAME_DIGITS, file_name

log = logging.getLogger(__name__)

_SLOT = struct.Struct("<QQQQ")  # magic (0: free), st_dev, st_ino, size
_MAGIC = 0x31434E5953534843  # b"CHSSYNC1" little endian
SLOTS_DEFAULT = 8192


class SyncedSizeTable:
    """Durable sizes per (device, inode); thread-safe; written by one process at a time."""

    def __init__(self, path: str, slots: int = SLOTS_DEFAULT):
        self.path = path
        self.slots = slots
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < slots * _SLOT.size:
                os.ftruncate(fd, slots * _SLOT.size)
            self._mm = mmap.mmap(fd, slots * _SLOT.size)
        finally:
            os.close(fd)
        self._lock = threading.Lock()
        self._index: dict[tuple[int, int], int] = {}
        self._free: list[int] = []
        self._full_warned = False
        for slot in range(slots - 1, -1, -1):
            magic, dev, ino, _ = _SLOT.unpack_from(self._mm, slot * _SLOT.size)
            if magic == _MAGIC:
                self._index[(dev, ino)] = slot
            else:
                self._free.append(slot)

    def _size_at(self, slot: int) -> int:
        return int(struct.unpack_from("<Q", self._mm, slot * _SLOT.size + 24)[0])

    def _set_size(self, slot: int, size: int) -> None:
        struct.pack_into("<Q", self._mm, slot * _SLOT.size + 24, size)

    def raise_to(self, dev: int, ino: int, size: int) -> None:
        with self._lock:
            slot = self._index.get((dev, ino))
            if slot is not None:
                if size > self._size_at(slot):
                    self._set_size(slot, size)
                return
            if not self._free:
                if not self._full_warned:
                    log.warning("synced-size table %s is full: later files are not cut by a crash", self.path)
                    self._full_warned = True
                return
            slot = self._free.pop()
            off = slot * _SLOT.size
            struct.pack_into("<QQQ", self._mm, off + 8, dev, ino, size)
            struct.pack_into("<Q", self._mm, off, _MAGIC)  # last: the slot is valid once complete
            self._index[(dev, ino)] = slot

    def lower_to(self, dev: int, ino: int, size: int) -> None:
        with self._lock:
            slot = self._index.get((dev, ino))
            if slot is not None and size < self._size_at(slot):
                self._set_size(slot, size)

    def forget(self, dev: int, ino: int) -> None:
        with self._lock:
            slot = self._index.pop((dev, ino), None)
            if slot is not None:
                struct.pack_into("<Q", self._mm, slot * _SLOT.size, 0)
                self._free.append(slot)

    def sizes(self) -> dict[tuple[int, int], int]:
        with self._lock:
            return {key: self._size_at(slot) for key, slot in self._index.items()}

    def close(self) -> None:
        with self._lock:
            self._mm.close()


def read_table(path: str) -> dict[tuple[int, int], int]:
    """The records of a table file (another process's, after it died)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return {}
    whole = len(raw) - len(raw) % _SLOT.size
    return {(dev, ino): size for magic, dev, ino, size in _SLOT.iter_unpack(raw[:whole]) if magic == _MAGIC}


def synced_at(data_dir: str, sizes: dict[tuple[int, int], int], position: int) -> bool:
    """Whether the Raft log record at global byte ``position`` had reached the disk on this replica:
    the log segment holding it (``store/log/<first position>``) has an fsynced size past it.
    False when no segment holds it yet (the replica never received it). Reads the directory and
    one ``stat``; ``sizes`` is the replica's table (``read_table``)."""
    log_dir = os.path.join(data_dir, "store", "log")
    try:
        starts = [int(n) for n in os.listdir(log_dir) if len(n) == NAME_DIGITS and n.isdigit()]
    except FileNotFoundError:
        return False
    holding = max((s for s in starts if s <= position), default=None)
    if holding is None:
        return False
    try:
        st = os.stat(os.path.join(log_dir, file_name(holding)))
    except FileNotFoundError:
        return False
    return sizes.get((st.st_dev, st.st_ino), 0) > position - holding


@dataclasses.dataclass(frozen=True)
class LossReport:
    files_seen: int
    files_cut: int
    bytes_lost: int
    cut: tuple[tuple[str, int, int], ...]  # (path relative to the data dir, size before, size after)

    def detail(self) -> dict[str, Any]:
        return {
            "files_seen": self.files_seen, "files_cut": self.files_cut, "bytes_lost": self.bytes_lost,
            "cut": [{"file": p, "from": a, "to": b} for p, a, b in self.cut[:50]],
        }


def lose_unsynced(data_dir: str, table_path: str) -> LossReport:
    """Cut every file under ``data_dir`` back to its last fsynced size (never fsynced: empty). Call
    only while the node that wrote them is dead, and only on nodes that ran with the hook from their
    first start."""
    sizes = read_table(table_path)
    seen, cut, lost = 0, [], 0
    for dirpath, _dirs, files in os.walk(data_dir):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            seen += 1
            durable = sizes.get((st.st_dev, st.st_ino), 0)
            if st.st_size > durable:
                os.truncate(path, durable)
                cut.append((os.path.relpath(path, data_dir), st.st_size, durable))
                lost += st.st_size - durable
    return LossReport(seen, len(cut), lost, tuple(sorted(cut)))


# -- the hook (runs inside the broker process) ----------------------------------------------------
_originals: dict[str, Callable[..., Any]] = {}
_table: SyncedSizeTable | None = None


def _fd_of(fd: Any) -> int:
    return fd if isinstance(fd, int) else int(fd.fileno())


def _stat_quiet(call: Callable[[], os.stat_result]) -> os.stat_result | None:
    try:
        st = call()
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def install_hook(table: SyncedSizeTable) -> None:
    """Wrap the ``os`` functions that make data durable or remove it (see the module doc)."""
    global _table
    if _table is not None:
        raise RuntimeError("the synced-size hook is already installed")
    _table = table
    real = {name: getattr(os, name) for name in (
        "fsync", "fdatasync", "ftruncate", "truncate", "unlink", "remove", "replace", "rename")}
    _originals.update(real)

    def make_sync(name: str) -> Callable[[Any], None]:
        def synced(fd: Any) -> None:
            st = _stat_quiet(lambda: os.fstat(_fd_of(fd)))
            real[name](fd)
            if st is not None:
                table.raise_to(st.st_dev, st.st_ino, st.st_size)
        return synced

    def ftruncate(fd: int, length: int) -> None:
        real["ftruncate"](fd, length)
        st = _stat_quiet(lambda: os.fstat(fd))
        if st is not None:
            table.lower_to(st.st_dev, st.st_ino, length)

    def truncate(path: Any, length: int) -> None:
        real["truncate"](path, length)
        st = _stat_quiet(lambda: os.stat(path))
        if st is not None:
            table.lower_to(st.st_dev, st.st_ino, length)

    def make_remove(name: str) -> Callable[..., None]:
        def removed(path: Any, *, dir_fd: int | None = None) -> None:
            st = _stat_quiet(lambda: os.stat(path, dir_fd=dir_fd, follow_symlinks=False))
            real[name](path, dir_fd=dir_fd)
            if st is not None:
                table.forget(st.st_dev, st.st_ino)
        return removed

    def make_move(name: str) -> Callable[..., None]:
        def moved(src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> None:
            old = _stat_quiet(lambda: os.stat(dst, dir_fd=dst_dir_fd, follow_symlinks=False))
            real[name](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
            new = _stat_quiet(lambda: os.stat(dst, dir_fd=dst_dir_fd, follow_symlinks=False))
            if old is not None and (new is None or (old.st_dev, old.st_ino) != (new.st_dev, new.st_ino)):
                table.forget(old.st_dev, old.st_ino)
        return moved

    wrappers: dict[str, Callable[..., Any]] = {
        "fsync": make_sync("fsync"), "fdatasync": make_sync("fdatasync"), "ftruncate": ftruncate,
        "truncate": truncate, "unlink": make_remove("unlink"), "remove": make_remove("remove"),
        "replace": make_move("replace"), "rename": make_move("rename"),
    }
    for name, fn in wrappers.items():
        setattr(os, name, fn)


def uninstall_hook() -> None:
    """Restore the ``os`` functions (tests)."""
    global _table
    for name, fn in _originals.items():
        setattr(os, name, fn)
    _originals.clear()
    _table = None
