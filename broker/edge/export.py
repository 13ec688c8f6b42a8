"""Read-only export of one replica's files, for audits that cannot see the data directory
(docs/API.md, "Replica export"; used by ``python -m spark_jobs.audit --from-cluster``).

Two routes, both **admin only** (ACL on) and both read-only by construction — files are opened
``O_RDONLY``, every path component below the replica's directory with ``O_NOFOLLOW`` (a symbolic
link anywhere on the path is refused, never followed, and listing never descends into one), nothing
is created, repaired or locked:

``GET /v1/replica/files?after=PATH&limit=N``
    The files an audit reads, sorted by path, at most ``limit`` (1..10000, default 10000) after
    ``after``: ``{group, node_id, commit_index, applied_index, last_index, files: [{path, size}],
    more}``. The status fields are read before the listing (so a commit index never names entries
    the files listed later lack).
``GET /v1/replica/file?path=PATH&offset=N&max_bytes=M``
    ``{path, offset, size, data}``: at most ``max_bytes`` (1..4 MiB, default 1 MiB) of the file
    from ``offset``; ``size`` is the file's size now (files grow while the replica runs).

Exported paths (relative to the replica's ``dledger-<id>/`` directory), nothing else:
``store/anchor``, ``store/log/<20 digits>``, ``meta/raft_commit``, ``meta/raft_term``,
``broker/snapshot``, ``broker/consumequeue/<topic>/<queue id>/<20 digits>|min_offset``.
Keys, ACL files, configuration and the derived index are never served. A path that is not one of
these is ``400 BAD_PATH``; one that is gone (retention removed a segment) ``404 FILE_GONE``.
At most ``READS_IN_FLIGHT`` file reads run at once per broker (off the event loop).
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from broker.edge.http_codec import answer
from broker.protocol.errors import ProtocolError
from broker.protocol.names import is_topic
from broker.serving.http_edge import query_int

if TYPE_CHECKING:
    from broker.service.base import ServiceConfig
    from broker.serving.security import Security

__all__ = ["MAX_BYTES", "MAX_FILES", "exported_path", "list_files", "read_part", "register"]

MAX_BYTES = 4 << 20
DEFAULT_BYTES = 1 << 20
MAX_FILES = 10_000
READS_IN_FLIGHT = 2
_DIGITS = r"\d{20}"
_FIXED = re.compile(rf"^(store/anchor|store/log/{_DIGITS}|meta/raft_commit|meta/raft_term|broker/snapshot)$")
_CQ = re.compile(rf"^broker/consumequeue/([^/]+)/(\d{{1,4}})/({_DIGITS}|min_offset)$")


def exported_path(path: str) -> bool:
    """Whether ``path`` (relative, ``/``-separated) is one of the exported files."""
    if len(path) > 512:
        return False
    if _FIXED.match(path):
        return True
    m = _CQ.match(path)
    if m is None:
        return False
    return is_topic(m.group(1)) and m.group(1) not in (".", "..")


def _walk(root: str) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for sub in ("store", "meta", "broker"):
        top = os.path.join(root, sub)
        if os.path.islink(top):  # os.walk would follow a linked top; below it, followlinks=False
            continue
        for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
            dirnames[:] = [d for d in dirnames if d != "index"]
            for name in filenames:
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                if not exported_path(rel):
                    continue
                try:
                    st = os.lstat(full)
                except FileNotFoundError:
                    continue  # removed while listing (retention)
                if os.path.isfile(full) and not os.path.islink(full):
                    out.append((rel, st.st_size))
    out.sort()
    return out


def list_files(root: str, after: str, limit: int) -> tuple[list[tuple[str, int]], bool]:
    """Exported files under ``root`` with a path above ``after``: (at most ``limit``, more left)."""
    rest = [f for f in _walk(root) if f[0] > after]
    return rest[:limit], len(rest) > limit


def read_part(root: str, path: str, offset: int, max_bytes: int) -> tuple[bytes, int]:
    """(up to ``max_bytes`` of ``root/path`` from ``offset``, the file's size). Read-only."""
    if not exported_path(path):
        raise ProtocolError("BAD_PATH", f"{path[:120]!r} is not an exported replica file", 400)
    try:
        fd = _open_below(root, path.split("/"))
    except FileNotFoundError:
        raise ProtocolError("FILE_GONE", f"{path} does not exist (any more)", 404) from None
    except OSError as exc:  # ELOOP / ENOTDIR: a symbolic link on the path
        raise ProtocolError("FILE_GONE", f"{path}: {exc.strerror}", 404) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ProtocolError("FILE_GONE", f"{path} is not a regular file", 404)
        size = st.st_size
        return os.pread(fd, max_bytes, offset) if offset < size else b"", size
    finally:
        os.close(fd)


def _open_below(root: str, parts: list[str]) -> int:
    """``root/parts...`` opened read-only, each component relative to its parent's descriptor and
    with ``O_NOFOLLOW``: a symbolic link at any component raises (ELOOP/ENOTDIR), so what is read
    is always inside ``root`` (``root`` itself may be a link: the operator chose it)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            parent, fd = fd, os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(parent)
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
    finally:
        os.close(fd)


class NodeStatus(Protocol):
    async def status(self) -> dict[str, Any]: ...


class ExportedReplica(Protocol):
    """What the export reads of the replica it serves (``BrokerServer`` is one)."""

    @property
    def cfg(self) -> ServiceConfig: ...
    @property
    def node(self) -> NodeStatus: ...


class ReplicaExport:
    def __init__(self, sec: Security, replica: ExportedReplica):
        self.sec = sec
        self.replica = replica
        self._reads = asyncio.Semaphore(READS_IN_FLIGHT)

    @property
    def root(self) -> str:
        return str(self.replica.cfg.dledger.node_dir)

    async def files(self, request: web.Request) -> web.Response:
        self.sec.require(request, admin=True)
        after = request.query.get("after", "")
        if len(after) > 512:
            raise ProtocolError("BAD_PARAMETER", "after is at most 512 characters", 400)
        limit = query_int(request, "limit", MAX_FILES, 1, MAX_FILES)
        node = await self.replica.node.status()  # before the listing: the files hold at least this
        async with self._reads:
            files, more = await asyncio.to_thread(list_files, self.root, after, limit)
        cfg = self.replica.cfg
        return answer(request, {
            "group": cfg.broker_name, "node_id": cfg.dledger.self_id,
            "commit_index": node["commit_index"], "applied_index": node["applied_index"],
            "last_index": node["last_index"], "role": node["role"], "term": node["term"],
            "files": [{"path": p, "size": s} for p, s in files], "more": more,
        })  # fmt: skip

    async def file(self, request: web.Request) -> web.Response:
        self.sec.require(request, admin=True)
        path = request.query.get("path")
        if path is None:
            raise ProtocolError("MISSING_FIELD", "query parameter 'path' is required", 400)
        offset = query_int(request, "offset", 0, 0, 2**62)
        max_bytes = query_int(request, "max_bytes", DEFAULT_BYTES, 1, MAX_BYTES)
        if not exported_path(path):
            raise ProtocolError("BAD_PATH", f"{path[:120]!r} is not an exported replica file", 400)
        async with self._reads:
            data, size = await asyncio.to_thread(read_part, self.root, path, offset, max_bytes)
        return answer(request, {"path": path, "offset": offset, "size": size, "data": data})


def register(router: web.UrlDispatcher, sec: Security, replica: ExportedReplica) -> None:
    ex = ReplicaExport(sec, replica)
    router.add_get("/v1/replica/files", ex.files)
    router.add_get("/v1/replica/file", ex.file)
