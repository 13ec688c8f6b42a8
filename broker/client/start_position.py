"""Where a push consumer's queue starts (``StartPositions``): the group's stored offset, else the
new queue's minimum after a topic was deleted and created again, else ``consume_from`` (FIRST,
LAST, or TIMESTAMP; a retry topic always from its start, as in RocketMQ). Every answer comes with
the topic epoch it belongs to, and a replica that has not applied a re-creation yet is refused
(``STALE_REPLICA``: the rebalance retries). The offset chosen is written into the offset store at
once, so the first commit pins where the group starts even if nothing arrives.

Broadcasting consumers keep their offsets on local disk, so this object also owns the record of
topics seen re-created (the newest epoch per (topic, broker group)) and of the queues that must
start at the new queue's minimum.
"""

from __future__ import annotations

import logging
import time

from broker.client.consumer_common import queue_status, search_offset_at
from broker.client.message import ConsumeFrom, MessageQueue
from broker.client.offset_store import OffsetStore, RemoteOffsetStore
from broker.client.route_cache import RouteCache
from broker.client.transport import ClientError, Transport
from broker.protocol.properties import RETRY_PREFIX

log = logging.getLogger(__name__)

CONSUME_TIMESTAMP_DEFAULT_AGO_MS = 30 * 60 * 1000  # RocketMQ: half an hour ago


class StartPositions:
    def __init__(
        self,
        transport: Transport,
        routes: RouteCache,
        store: OffsetStore,
        *,
        consume_from: ConsumeFrom,
        consume_timestamp_ms: int | None,
        timeout_s: float,
    ):
        self.transport = transport
        self.routes = routes
        self.store = store
        self.consume_from = consume_from
        self.consume_timestamp_ms = consume_timestamp_ms
        self.timeout_s = timeout_s
        # Broadcasting: topics seen re-created (newest epoch), queues to start at their minimum.
        self._recreated: dict[tuple[str, str], int] = {}
        self._from_min: set[MessageQueue] = set()

    def note_recreated(self, mq: MessageQueue, epoch: int) -> bool:
        """Broadcasting: a pull answer named ``epoch`` for ``mq``'s topic; True when it is newer than
        any seen (its queues must restart at the new queues' minimum)."""
        key = (mq.topic, mq.broker_name)
        if epoch <= self._recreated.get(key, -1):
            return False
        self._recreated[key] = epoch
        return True

    def restart_from_min(self, mqs: list[MessageQueue]) -> None:
        """Broadcasting: forget the local offsets of ``mqs``; they start at the new queues' minimum."""
        for mq in mqs:
            self.store.remove(mq)
        self._from_min.update(mqs)

    async def start_offset(self, mq: MessageQueue) -> tuple[int, int | None]:
        """(offset to start at, the topic epoch it belongs to, None: unknown)."""
        if mq in self._from_min:  # broadcasting: the offsets on disk belong to the old topic
            lo, _hi, epoch = await queue_status(self.transport, self.routes, mq, self.timeout_s)
            if epoch is None or epoch < self._recreated[(mq.topic, mq.broker_name)]:
                raise ClientError("STALE_REPLICA", f"{mq}: a replica behind the topic's re-creation answered")
            self.store.update(mq, lo, increase_only=False)
            self._from_min.discard(mq)
            return lo, epoch
        store = self.store
        stored = await store.fetch(mq)
        epoch = store.topic_epoch(mq) if isinstance(store, RemoteOffsetStore) else None
        if stored is not None:
            return stored, epoch
        if isinstance(store, RemoteOffsetStore) and store.recreated(mq):
            # A topic deleted and created again: nothing in the new queue was consumed yet.
            lo, _hi, status_epoch = await queue_status(self.transport, self.routes, mq, self.timeout_s)
            if status_epoch != epoch:
                raise ClientError("STALE_REPLICA", f"{mq}: offsets and queue status of different topic epochs")
            log.warning("%s: topic %s was created again: starting at the new queue's minimum %d", mq, mq.topic, lo)
            store.update(mq, lo, increase_only=False)
            return lo, epoch
        from_first = self.consume_from is ConsumeFrom.FIRST or mq.topic.startswith(RETRY_PREFIX)
        if self.consume_from is ConsumeFrom.TIMESTAMP and not from_first:
            ts = self.consume_timestamp_ms
            if ts is None:
                ts = time.time_ns() // 1_000_000 - CONSUME_TIMESTAMP_DEFAULT_AGO_MS
            offset = await search_offset_at(self.transport, self.routes, mq, ts, self.timeout_s)
        else:
            lo, hi, status_epoch = await queue_status(self.transport, self.routes, mq, self.timeout_s)
            if epoch is not None and status_epoch is not None and status_epoch != epoch:
                raise ClientError("STALE_REPLICA", f"{mq}: offsets and queue status of different topic epochs")
            epoch = status_epoch if epoch is None else epoch
            # A retry topic holds only this group's failed messages: always from its start (RocketMQ).
            offset = lo if from_first else hi
        # Remember it, so the first commit pins where this group starts even if nothing arrives.
        store.update(mq, offset, increase_only=False)
        return offset, epoch
