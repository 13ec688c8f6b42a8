"""Copy every replica's audit inputs from a running cluster, through the brokers (``--from-cluster``).

The audit's replica checks read the files a replica keeps — the Raft log, its meta records, the
consume queues and the store snapshot — with its own verifying reader (``replica_reader``), never
through the broker's code: that is what makes it an independent check. When the data directories
are on other machines, ``fetch_cluster`` asks the NameServers for every broker group and replica
(``GET /v1/clusters``), and each replica for exactly those files through its read-only export
routes (``broker/edge/export.py``: ``GET /v1/replica/files``, ``GET /v1/replica/file``, admin only),
into ``DEST/<group>/dledger-<node_id>/``: the layout of ``RUN_DIR/cluster/data``. The audit then
runs as on local files.

Consistency: each replica's listing comes with its commit index, read before the listing, so the
files hold at least the entries it names. Files that only grow (log segments, consume-queue files)
are copied up to their listed size; the small files written whole (anchor, meta records, snapshot,
``min_offset``) as they are when read. A segment that disappears meanwhile (retention) restarts that
replica's copy (at most ``ATTEMPTS`` times). Copying a cluster under load is like reading the local
directories of a running cluster: a moment's picture per replica, not one instant for all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
from collections.abc import Mapping
from typing import Any

from broker.client.transport import ClientError, NamesrvClient, Transport
from broker.edge.export import MAX_BYTES, exported_path

__all__ = ["FetchedReplica", "fetch_cluster"]

ATTEMPTS = 3
REPLICAS_IN_FLIGHT = 3
CALL_TIMEOUT_S = 30.0
_WHOLE = ("store/anchor", "meta/raft_commit", "meta/raft_term", "broker/snapshot")


@dataclasses.dataclass(frozen=True)
class FetchedReplica:
    group: str
    node_id: str
    addr: str
    path: str
    commit_index: int | None
    role: str | None
    term: int | None
    files: int
    bytes: int


def _whole(path: str) -> bool:
    return path in _WHOLE or path.endswith("/min_offset")


async def _list(t: Transport, addr: str) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    files: list[tuple[str, int]] = []
    after = ""
    head: dict[str, Any] = {}
    while True:
        page = await t.call(addr, "GET", "/v1/replica/files", params={"after": after}, timeout_s=CALL_TIMEOUT_S)
        if not head:
            head = dict(page)
        for f in page["files"]:
            path = str(f["path"])
            if not exported_path(path):
                raise RuntimeError(f"{addr} listed {path[:120]!r}, which is no replica file")
            files.append((path, int(f["size"])))
        if not page.get("more") or not page["files"]:
            return head, files
        after = files[-1][0]


async def _copy(t: Transport, addr: str, rel: str, size: int, dest: str) -> int:
    target = os.path.join(dest, *rel.split("/"))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    done = 0
    with open(target, "wb") as f:
        while True:
            want = MAX_BYTES if _whole(rel) else min(MAX_BYTES, size - done)
            if want <= 0:
                break
            part = await t.call(
                addr, "GET", "/v1/replica/file", params={"path": rel, "offset": done, "max_bytes": want},
                timeout_s=CALL_TIMEOUT_S,
            )  # fmt: skip
            data = bytes(part["data"])
            f.write(data)
            done += len(data)
            if not data or (_whole(rel) and done >= int(part["size"])):
                break
    return done


async def _fetch_replica(t: Transport, addr: str, dest_root: str) -> FetchedReplica:
    last: Exception | None = None
    for _ in range(ATTEMPTS):
        head, files = await _list(t, addr)
        group, node_id = str(head["group"]), str(head["node_id"])
        if "/" in group or "/" in node_id or group in (".", "..") or node_id in (".", ".."):
            raise RuntimeError(f"{addr} names itself {group!r}/{node_id!r}")
        dest = os.path.join(dest_root, group, f"dledger-{node_id}")
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        try:
            total = 0
            for rel, size in files:
                total += await _copy(t, addr, rel, size, dest)
        except ClientError as exc:
            if exc.code != "FILE_GONE":
                raise
            last = exc  # retention removed a file meanwhile: list again
            continue
        commit = head.get("commit_index")
        return FetchedReplica(
            group, node_id, addr, dest, commit if isinstance(commit, int) else None,
            head.get("role"), head.get("term"), len(files), total,
        )  # fmt: skip
    raise RuntimeError(f"{addr}: files kept disappearing while copied ({last})")


async def fetch_cluster(
    namesrv: str, dest_root: str, *, credentials: Any = None, tls: Any = None,
    security: Mapping[str, Any] | None = None,
) -> tuple[list[FetchedReplica], list[str]]:
    """Copy every registered replica's files under ``dest_root``; returns the copies and what
    could not be copied (one message per replica). ``security``: ``Transport`` keyword arguments
    (``credentials=``, ``tls=``), else the environment's."""
    kwargs = dict(security or {})
    if credentials is not None:
        kwargs["credentials"] = credentials
    if tls is not None:
        kwargs["tls"] = tls
    t = Transport(timeout_s=CALL_TIMEOUT_S, **kwargs)
    try:
        info = await NamesrvClient(namesrv, t).clusters(timeout_s=CALL_TIMEOUT_S)
        addrs = sorted({a for bd in info.brokers.values() for a in bd.broker_addrs.values()})
        if not addrs:
            raise RuntimeError(f"the NameServers at {namesrv} know no broker")
        gate = asyncio.Semaphore(REPLICAS_IN_FLIGHT)

        async def one(addr: str) -> FetchedReplica | str:
            async with gate:
                try:
                    return await _fetch_replica(t, addr, dest_root)
                except (ClientError, RuntimeError, OSError, KeyError, TypeError, ValueError) as exc:
                    return f"{addr}: {exc}"

        got = await asyncio.gather(*(one(a) for a in addrs))
    finally:
        await t.close()
    fetched = sorted((g for g in got if isinstance(g, FetchedReplica)), key=lambda r: (r.group, r.node_id))
    errors = [g for g in got if isinstance(g, str)]
    seen: dict[tuple[str, str], str] = {}
    for r in fetched:
        if (r.group, r.node_id) in seen:
            raise RuntimeError(f"{seen[(r.group, r.node_id)]} and {r.addr} both say they are {r.group}/{r.node_id}")
        seen[(r.group, r.node_id)] = r.addr
    return fetched, errors
