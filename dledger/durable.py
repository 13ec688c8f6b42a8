"""Small durability helpers shared by every store in the project (the log, consume queues, the key
index, snapshots): fsync of a directory or a file by path, and atomic replacement of a file.

Files written here are 0600 and directories made here 0700: stored messages, offsets and configs
are the broker's alone (issue 10, finding 5). Server processes also run with umask 077, so files
other code creates get the same modes."""

from __future__ import annotations

import os

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: str) -> None:
    """Create ``path`` (and parents) if missing, and make ``path`` itself 0700: nothing below it is
    reachable by other users, whatever the modes of older files inside."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)
    os.chmod(path, DIR_MODE)


def fsync_dir(path: str) -> None:
    """Make the directory's entries (files created, renamed, removed) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: str) -> None:
    """Make the file's dirty pages durable (mapped writes included); releases the GIL meanwhile."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves the old or the new content, durably."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def replace_reserving(path: str, data: bytes, mode: int = FILE_MODE) -> None:
    """``atomic_write`` for a small file rewritten often (a term/vote record, an anchor) that must
    stay writable on a full file system: the temporary file is written in place, not truncated
    (it is the spare left by the previous call, whose blocks are reused), synced and renamed over
    ``path``; then a new spare is made from the blocks the old ``path`` just freed. Once a spare
    exists, a rewrite of at most one block needs no free space (on file systems that overwrite
    in place: ext4, xfs, tmpfs; not copy-on-write ones). A spare that cannot be made (no room) is
    skipped: the next call creates its temporary file as ``atomic_write`` does."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, mode)
    try:
        view = memoryview(data)
        offset = 0
        while offset < len(view):
            offset += os.pwrite(fd, view[offset:], offset)
        os.ftruncate(fd, len(data))  # a longer spare's tail goes (shrinking needs no room)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except OSError:
        return
    try:
        os.pwrite(fd, data, 0)  # content does not matter: a spare is never read
    except OSError:
        pass
    finally:
        os.close(fd)


def disk_used_ratio(path: str) -> float:
    """The used fraction of ``path``'s file system as ``df`` shows it (and RocketMQ 5 computes it):
    used / (used + what an unprivileged writer may still use). Blocks reserved for root count as
    neither: with ext4's reservation (5 % by default, far more on some hosts) ``used / total`` stays
    low while the disk is full, and ``(total - available) / total`` calls a disk full that is not."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    usable = st.f_bavail * st.f_frsize
    return used / (used + usable) if used + usable > 0 else 0.0
