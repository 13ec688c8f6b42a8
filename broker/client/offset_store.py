"""Consume offsets: where a consumer group resumes each queue ("the next offset to consume").

One interface, three backings:
- ``RemoteOffsetStore`` (clustering): the group's offsets live on the brokers, replicated through
  the Raft log. Reads go to any replica (leader first); commits go to the group's leader
  (``POST /v1/offsets``) and are monotonic there: a lower value is ignored.
- ``LocalFileOffsetStore`` (broadcasting): every consumer keeps its own offsets in
  ``<offset_dir>/<group>/offsets.json``, written atomically (temp file, fsync, rename, fsync dir).
- ``MemoryOffsetStore``: the reference implementation the tests run the same suite against.

Reset fencing (``RemoteOffsetStore(reset_fencing=True)``, the push consumer in clustering mode):
``offsets/reset`` (mqadmin resetOffsetByTime) moves a group's offsets backwards and bumps the
(group, topic) *reset generation* of that broker group. The store remembers the generation it read
the offsets with and sends it with every commit; a broker that applied a reset since refuses the
commit (409 ``OFFSET_RESET``), so in-memory positions from before a reset can never undo it. A
refused commit, a ``check_generations`` that sees a newer generation, or a ``fetch`` that does, makes
that (topic, broker group) *stale*: it is not committed again until the owner drops its in-memory
offsets (``drop``) and fetches them again, which takes the new generation::

    fetch ──▶ current ──commit refused / newer generation seen──▶ stale ──drop(refetch) + fetch──▶ current

Topic re-creation is fenced the same way. Offsets are read with the topic's *epoch* (its
incarnation: the log position of the command that created it) and commits carry it; a broker whose
topic was deleted and created again since refuses the commit (409 ``TOPIC_RECREATED``). A refused
commit, a newer epoch seen by ``check_generations`` or ``fetch``, or ``topic_recreated`` (a pull
answer with a newer epoch) makes the key stale like a reset does; the fetch after ``drop`` takes the
new epoch, and ``recreated(mq)`` then tells the owner to start queues without a committed offset at
the new queue's minimum (everything in a new incarnation is unconsumed).

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
from collections.abc import Callable, Iterable
from typing import Any

from broker.client.message import MessageQueue
from broker.client.route_cache import RouteCache, call_leader, call_replicas
from broker.client.transport import ClientError, Transport

log = logging.getLogger(__name__)

OFFSET_FILE_VERSION = 1

ResetKey = tuple[str, str]  # (topic, broker_name): one broker group's offsets of one topic


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
    def __init__(
        self,
        transport: Transport,
        routes: RouteCache,
        group: str,
        *,
        timeout_s: float = 3.0,
        reset_fencing: bool = False,
        on_reset: Callable[[str, str], None] | None = None,
    ):
        super().__init__()
        self.transport = transport
        self.routes = routes
        self.group = group
        self.timeout_s = timeout_s
        self.reset_fencing = reset_fencing
        self.on_reset = on_reset  # (topic, broker_name) became stale
        self._generations: dict[ResetKey, int] = {}
        self._epochs: dict[ResetKey, int] = {}  # the topic epoch the held offsets were read with
        self._recreated: dict[ResetKey, int] = {}  # the newest epoch seen replacing a known one
        self._stale: set[ResetKey] = set()

    def topic_epoch(self, mq: MessageQueue) -> int | None:
        """The topic epoch the offsets of ``mq``'s (topic, broker group) were read with (None: unknown)."""
        return self._epochs.get((mq.topic, mq.broker_name))

    def recreated(self, mq: MessageQueue) -> bool:
        """True when the offsets held for ``mq``'s key were read from a topic re-created in this
        session (queues without a committed offset start at the minimum then)."""
        key = (mq.topic, mq.broker_name)
        epoch = self._epochs.get(key)
        return epoch is not None and self._recreated.get(key) == epoch

    def topic_recreated(self, mq: MessageQueue, epoch: int) -> None:
        """A pull answer named a newer epoch of ``mq``'s topic than the held offsets were read with:
        they belong to the old topic (stale until dropped and fetched again)."""
        key = (mq.topic, mq.broker_name)
        known = self._epochs.get(key)
        if known is not None and epoch <= known:
            return
        self._recreated[key] = max(epoch, self._recreated.get(key, epoch))
        self._mark_stale(key)

    def _set_epoch(self, key: ResetKey, epoch: int | None) -> None:
        if epoch is None:
            return
        known = self._epochs.get(key)
        if known is not None and epoch > known:
            self._recreated[key] = max(epoch, self._recreated.get(key, epoch))
        self._epochs[key] = epoch

    def reset_generation(self, mq: MessageQueue) -> int | None:
        """The reset generation the offsets of ``mq``'s (topic, broker group) were read with (None:
        not read yet, or a broker without generations)."""
        return self._generations.get((mq.topic, mq.broker_name))

    def stale_keys(self) -> list[ResetKey]:
        """(topic, broker_name) whose in-memory offsets predate a reset: ``drop`` them and fetch again."""
        return sorted(self._stale)

    def drop(self, topic: str, broker_name: str, *, refetch: bool) -> None:
        """Forget the in-memory offsets of one (topic, broker group). With ``refetch`` it stays fenced
        (stale, its old generation) until ``fetch`` reads the new generation; without, the generation
        is forgotten too and the next fetch starts afresh."""
        key = (topic, broker_name)
        for mq in [mq for mq in self._table if (mq.topic, mq.broker_name) == key]:
            self.remove(mq)
        if not refetch:
            self._generations.pop(key, None)
            self._stale.discard(key)

    def _mark_stale(self, key: ResetKey) -> None:
        if key in self._stale:
            return
        self._stale.add(key)
        log.warning(
            "offsets of %s on %s for %s were reset on the broker: the in-memory ones are stale",
            key[0], key[1], self.group,
        )
        if self.on_reset is not None:
            self.on_reset(*key)

    async def load(self) -> None:
        return None

    async def _read(self, topic: str, broker_name: str) -> tuple[int | None, int | None, dict[int, int]]:
        """(reset generation or None, topic epoch or None, {queue id: offset}) of one (topic, broker group)."""
        route = await self.routes.get(topic, self.timeout_s)
        _, answer = await call_replicas(
            self.transport,
            self.routes.replicas(route, broker_name),
            "GET",
            "/v1/offsets",
            params={"group": self.group, "topic": topic},
            timeout_s=self.timeout_s,
        )
        if not isinstance(answer, dict):
            return None, None, {}
        try:
            offsets = {int(q): int(off) for q, off in dict(answer.get("offsets") or {}).items()}
            raw = answer.get("reset_generation")
            epoch = answer.get("topic_epoch")
            return (int(raw) if raw is not None else None), (int(epoch) if epoch is not None else None), offsets
        except (TypeError, ValueError) as exc:
            raise ClientError("BAD_ANSWER", f"offsets of {topic} from {broker_name}: {exc}") from None

    def _take_generation(self, mq: MessageQueue, generation: int, epoch: int | None = None) -> None:
        """Commits are fenced with the *oldest* generation any held offset of the key was read with,
        and the topic epoch they were read with."""
        key = (mq.topic, mq.broker_name)
        known = self._generations.get(key)
        known_epoch = self._epochs.get(key)
        if known is None or not self.reset_fencing:
            self._generations[key] = max(generation, known or 0)
            self._set_epoch(key, epoch)
            return
        if not any((m.topic, m.broker_name) == key for m in self._table if m != mq):
            self._generations[key] = generation
            self._set_epoch(key, epoch)
            self._stale.discard(key)
        elif epoch is not None and known_epoch is not None and epoch != known_epoch:
            if epoch > known_epoch:  # the offsets held for the other queues belong to the old topic
                self._recreated[key] = max(epoch, self._recreated.get(key, epoch))
                self._mark_stale(key)
            # else: a replica behind the re-creation; the held offsets stay fenced by the newer epoch
        elif generation > known:  # the offsets held for the other queues predate a reset
            self._mark_stale(key)
        elif generation < known:  # a replica behind: its answer fences the commits (refused if stale)
            self._generations[key] = generation

    async def fetch(self, mq: MessageQueue) -> int | None:
        generation, epoch, offsets = await self._read(mq.topic, mq.broker_name)
        if generation is not None:
            self._take_generation(mq, generation, epoch)
        else:
            self._set_epoch((mq.topic, mq.broker_name), epoch)
        value = offsets.get(mq.queue_id)
        if value is None or value < 0:
            return None
        self._adopt(mq, value)
        return value

    async def check_generations(self) -> None:
        """Read the generation of every (topic, broker group) held here; a newer one makes it stale."""
        if not self.reset_fencing:
            return
        held = {(mq.topic, mq.broker_name) for mq in self._table}
        keys = sorted(k for k in held - self._stale if k in self._generations)
        results = await asyncio.gather(*(self._read(t, b) for t, b in keys), return_exceptions=True)
        for key, res in zip(keys, results, strict=True):
            if isinstance(res, ClientError):
                log.debug("reset generation of %s on %s not read: %s", key[0], key[1], res)
                continue
            if isinstance(res, BaseException):
                raise res
            generation, known = res[0], self._generations.get(key)
            epoch, known_epoch = res[1], self._epochs.get(key)
            if epoch is not None and known_epoch is not None and epoch > known_epoch:
                self._recreated[key] = max(epoch, self._recreated.get(key, epoch))
                self._mark_stale(key)
            elif generation is not None and known is not None and generation > known:
                self._mark_stale(key)

    async def persist(self, mqs: Iterable[MessageQueue] | None = None) -> int:
        by_group: dict[tuple[str, str], dict[MessageQueue, int]] = {}
        for mq, off in self.dirty(mqs).items():
            by_group.setdefault((mq.topic, mq.broker_name), {})[mq] = off
        written = 0
        for key, entries in sorted(by_group.items()):
            if key in self._stale:
                continue  # read before a reset: never written (the owner drops and fetches them again)
            topic, broker_name = key
            generation = self._generations.get(key) if self.reset_fencing else None
            epoch = self._epochs.get(key) if self.reset_fencing else None
            body: dict[str, Any] = {
                "group": self.group,
                "topic": topic,
                "offsets": {str(mq.queue_id): off for mq, off in entries.items()},
            }
            if generation is not None:
                body["reset_generation"] = generation
            if epoch is not None:
                body["topic_epoch"] = epoch
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
                if exc.code == "OFFSET_RESET":
                    if self._generations.get(key) == generation:  # not dropped and re-read meanwhile
                        self._mark_stale(key)
                    continue
                if exc.code == "TOPIC_RECREATED":  # these offsets belong to the deleted topic
                    if self._epochs.get(key) == epoch:
                        self._mark_stale(key)
                    continue
                log.warning(
                    "commit of %s offsets to %s failed (kept for the next commit): %s",
                    topic,
                    broker_name,
                    exc,
                )
                continue
            if self.reset_fencing and (
                key in self._stale or self._generations.get(key) != generation or self._epochs.get(key) != epoch
            ):
                continue  # a reset was seen while this was in flight: these values are not kept
            for mq, off in entries.items():
                self._persisted[mq] = off
            written += len(entries)
        return written
