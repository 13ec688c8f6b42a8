"""Consume offsets: where a consumer group resumes each queue ("the next offset to consume").

One interface, three backings:
- ``RemoteOffsetStore`` (clustering): the group's offsets live on the brokers, replicated through
  the Raft log. Reads go to any replica (leader first); commits go to the group's leader
  (``POST /v1/offsets``) and are monotonic there: a lower value is ignored.
- ``LocalFileOffsetStore`` (broadcasting): every consumer keeps its own offsets in
  ``<offset_dir>/<group>/offsets.json``, written atomically (temp file, fsync, rename, fsync dir).
- ``MemoryOffsetStore``: the reference implementation the tests run the same suite against.

The in-memory table is what consumption updates; ``persist`` pushes entries that differ from what
was last persisted. ``update(increase_only=True)`` (the consumption path) never moves an entry
backwards.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import os
import tempfile
from collections.abc import Iterable
from typing import Any

from broker.client.message import MessageQueue
from broker.client.route_cache import RouteCache, call_leader, call_replicas
from broker.client.transport import ClientError, Transport

log = logging.getLogger(__name__)

OFFSET_FILE_VERSION = 1


class OffsetStore(abc.ABC):
    def __init__(self) -> None:
        self._table: dict[MessageQueue, int] = {}
        self._persisted: dict[MessageQueue, int] = {}

    def update(self, mq: MessageQueue, offset: int, *, increase_only: bool = True) -> None:
        assert offset >= 0, f"offset {offset} of {mq} is negative"
        old = self._table.get(mq)
        if old is None or not increase_only or offset > old:
            self._table[mq] = offset

    def read(self, mq: MessageQueue) -> int | None:
        """The in-memory offset (None: unknown here)."""
        return self._table.get(mq)

    def remove(self, mq: MessageQueue) -> None:
        self._table.pop(mq, None)
        self._persisted.pop(mq, None)

    def persisted(self, mq: MessageQueue) -> int | None:
        """The offset last read from or written to the backing store."""
        return self._persisted.get(mq)

    def snapshot(self) -> dict[MessageQueue, int]:
        return dict(self._table)

    def _adopt(self, mq: MessageQueue, stored: int) -> None:
        """Take a value read from the backing store, unless memory holds a newer uncommitted one."""
        if mq not in self._table or self._table[mq] == self._persisted.get(mq):
            self._table[mq] = stored
        self._persisted[mq] = stored

    def dirty(self, mqs: Iterable[MessageQueue] | None = None) -> dict[MessageQueue, int]:
        keys = self._table.keys() if mqs is None else [mq for mq in mqs if mq in self._table]
        return {mq: self._table[mq] for mq in keys if self._persisted.get(mq) != self._table[mq]}

    @abc.abstractmethod
    async def load(self) -> None:
        """Read what the backing store holds (at start)."""

    @abc.abstractmethod
    async def fetch(self, mq: MessageQueue) -> int | None:
        """The stored offset of ``mq`` (None: never committed); also sets the in-memory entry, unless
        that holds a value not yet persisted."""

    @abc.abstractmethod
    async def persist(self, mqs: Iterable[MessageQueue] | None = None) -> int:
        """Write changed entries (of ``mqs``, or all); returns how many were written."""


class MemoryOffsetStore(OffsetStore):
    def __init__(self, backing: dict[MessageQueue, int] | None = None):
        super().__init__()
        self.backing = backing if backing is not None else {}

    async def load(self) -> None:
        return None

    async def fetch(self, mq: MessageQueue) -> int | None:
        value = self.backing.get(mq)
        if value is not None:
            self._adopt(mq, value)
        return value

    async def persist(self, mqs: Iterable[MessageQueue] | None = None) -> int:
        changed = self.dirty(mqs)
        for mq, off in changed.items():
            self.backing[mq] = max(off, self.backing.get(mq, off))
            self._persisted[mq] = off
        return len(changed)


class LocalFileOffsetStore(OffsetStore):
    def __init__(self, offset_dir: str, group: str):
        super().__init__()
        self.group = group
        self.path = os.path.join(os.path.expanduser(offset_dir), group, "offsets.json")
        self._on_disk: dict[MessageQueue, int] = {}

    async def load(self) -> None:
        self._on_disk = await asyncio.to_thread(read_offset_file, self.path)

    async def fetch(self, mq: MessageQueue) -> int | None:
        value = self._on_disk.get(mq)
        if value is not None:
            self._adopt(mq, value)
        return value

    async def persist(self, mqs: Iterable[MessageQueue] | None = None) -> int:
        changed = self.dirty(mqs)
        if not changed:
            return 0
        merged = {**self._on_disk, **changed}
        await asyncio.to_thread(write_offset_file, self.path, self.group, merged)
        self._on_disk = merged
        self._persisted.update(changed)
        return len(changed)


def read_offset_file(path: str) -> dict[MessageQueue, int]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ClientError("BAD_OFFSET_FILE", f"cannot read {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("version") != OFFSET_FILE_VERSION:
        raise ClientError("BAD_OFFSET_FILE", f"{path} is not a version {OFFSET_FILE_VERSION} offset file")
    try:
        return {
            MessageQueue(str(e["topic"]), str(e["broker_name"]), int(e["queue_id"])): int(e["offset"])
            for e in doc["offsets"]
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise ClientError("BAD_OFFSET_FILE", f"{path}: bad entry {exc!r}") from None


def write_offset_file(path: str, group: str, offsets: dict[MessageQueue, int]) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    doc: dict[str, Any] = {
        "version": OFFSET_FILE_VERSION,
        "group": group,
        "offsets": [
            {"topic": mq.topic, "broker_name": mq.broker_name, "queue_id": mq.queue_id, "offset": off}
            for mq, off in sorted(offsets.items())
        ],
    }
    fd, tmp = tempfile.mkstemp(prefix=".offsets.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class RemoteOffsetStore(OffsetStore):
    def __init__(self, transport: Transport, routes: RouteCache, group: str, *, timeout_s: float = 3.0):
        super().__init__()
        self.transport = transport
        self.routes = routes
        self.group = group
        self.timeout_s = timeout_s

    async def load(self) -> None:
        return None

    async def fetch(self, mq: MessageQueue) -> int | None:
        route = await self.routes.get(mq.topic, self.timeout_s)
        _, answer = await call_replicas(
            self.transport,
            self.routes.replicas(route, mq.broker_name),
            "GET",
            "/v1/offsets",
            params={"group": self.group, "topic": mq.topic},
            timeout_s=self.timeout_s,
        )
        offsets = dict(answer.get("offsets") or {}) if isinstance(answer, dict) else {}
        raw = offsets.get(str(mq.queue_id), offsets.get(mq.queue_id))
        if raw is None or int(raw) < 0:
            return None
        value = int(raw)
        self._adopt(mq, value)
        return value

    async def persist(self, mqs: Iterable[MessageQueue] | None = None) -> int:
        by_group: dict[tuple[str, str], dict[MessageQueue, int]] = {}
        for mq, off in self.dirty(mqs).items():
            by_group.setdefault((mq.topic, mq.broker_name), {})[mq] = off
        written = 0
        for (topic, broker_name), entries in sorted(by_group.items()):
            body = {
                "group": self.group,
                "topic": topic,
                "offsets": {str(mq.queue_id): off for mq, off in entries.items()},
            }
            try:
                await call_leader(
                    self.transport,
                    self.routes,
                    topic,
                    broker_name,
                    "/v1/offsets",
                    body,
                    timeout_s=self.timeout_s,
                )
            except ClientError as exc:
                log.warning(
                    "commit of %s offsets to %s failed (kept for the next commit): %s",
                    topic,
                    broker_name,
                    exc,
                )
                continue
            for mq, off in entries.items():
                self._persisted[mq] = off
            written += len(entries)
        return written
