"""One assigned queue of a push consumer (``QueueWorker``): its ``ProcessQueue``, its pull loop and
its consume tasks. The worker owns its ProcessQueue and offsets; consume tasks report back into that
ProcessQueue. What it needs of its consumer is the ``QueueOwner`` protocol below (the
``PushConsumer``); listener calls go through the consumer, which bounds them consumer-wide.

Pull loop of one queue::

    ┌─▶ in flight > cap? ──yes──▶ wait for space ─┐
    │        │ no                                  │
    │   POST /v1/pull (leader first; suspend_ms; timeout suspend + 3 s)
    │        ├─ FOUND ──────────▶ filter tags, put in ProcessQueue, dispatch to the listener
    │        ├─ NO_NEW_MSG ─────▶ (pull again at once)
    │        ├─ NO_MATCHED_MSG / OFFSET_TOO_SMALL ─▶ move forward
    │        └─ error ──────────▶ next replica, refresh route, back off (0.1 s … 3 s)
    └────────────────────────────────────────────────┘

Concurrent mode: each pulled batch of ``consume_batch_max`` runs as its own task; a failed one is
handed back to the consumer (send-back, or local redelivery after ``redeliver_backoff_s``). Orderly
mode: one loop consumes the lowest offsets in order and retries a failed batch in place.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Protocol

from broker.client.consumer_common import ConsumeContext, pull_from, wait_event
from broker.client.message import (
    ConsumeStatus,
    MessageExt,
    MessageModel,
    MessageQueue,
    PullResult,
    PullStatus,
    tags_expression,
)
from broker.client.offset_store import OffsetStore
from broker.client.process_queue import ProcessQueue, backoff_s
from broker.client.route_cache import RouteCache, read_order
from broker.client.transport import ClientError, Transport
from broker.protocol.properties import PROP_RETRY_TOPIC, RETRY_PREFIX

log = logging.getLogger(__name__)

LONG_POLL_MARGIN_S = 3.0
PULL_BACKOFF_S = 0.1
PULL_BACKOFF_MAX_S = 3.0
FOLLOWER_LAG_PAUSE_S = 0.2
ORDERLY_DEFAULT_MAX_RECONSUME = 16
OVERFLOW_WARN_EVERY_S = 30.0  # a leader short of our offset (same topic epoch) is waited for, with a warning
LEADER_RETRY_S = 10.0  # after this long on a follower, try the leader again
FLOW_CONTROL_WAIT_S = 1.0


class QueueOwner(Protocol):
    """What a worker reads and calls on its consumer (``PushConsumer``)."""

    group: str
    orderly: bool
    message_model: MessageModel
    pull_batch_size: int
    consume_batch_max: int
    suspend_ms: int
    pull_threshold_msgs: int
    pull_threshold_bytes: int
    max_reconsume_times: int | None
    redeliver_backoff_s: tuple[float, ...]
    orderly_retry_s: float
    read_from_followers: bool
    consumed: int
    reconsumed: int
    _slots: asyncio.Semaphore | None

    @property
    def routes(self) -> RouteCache: ...
    @property
    def transport(self) -> Transport: ...
    @property
    def store(self) -> OffsetStore: ...
    def sql_of(self, topic: str) -> str | None: ...
    def _topic_recreated(self, mq: MessageQueue, epoch: int) -> None: ...
    async def _invoke(self, msgs: list[MessageExt], ctx: ConsumeContext) -> ConsumeStatus: ...
    async def _send_back(
        self, mq: MessageQueue, msgs: list[MessageExt], *, dlq: bool = False
    ) -> list[MessageExt]: ...


class QueueWorker:
    """One assigned queue: its ProcessQueue, its pull loop and its consume tasks."""

    def __init__(
        self,
        owner: QueueOwner,
        mq: MessageQueue,
        start_offset: int,
        tags: frozenset[str] | None,
        epoch: int | None = None,
    ):
        self.owner = owner
        self.epoch = epoch  # the topic incarnation start_offset belongs to (None: the first answer's)
        self.mq = mq
        self.pq = ProcessQueue(mq, start_offset)
        self.next_offset = start_offset
        self.tags = tags
        self.tags_expr = tags_expression(tags)
        self.ctx = ConsumeContext(mq, owner.group, owner.orderly)
        self.dropped = False
        self.stopped = asyncio.Event()
        self.space = asyncio.Event()
        self.space.set()
        self.wake = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.pull_task: asyncio.Task[None] | None = None
        # Which replica to pull from: an offset into the read order (``read_order``: the leader first,
        # or a follower first with follower reads). 0 is the queue's home replica; the worker moves
        # on after a failure and comes home after LEADER_RETRY_S.
        self.replica_index = 0
        self.on_follower_since = 0.0  # when the worker left its home replica
        self.leader_slot = 0  # where the leader is in the current read order
        self.overflow_since: float | None = None  # when the leader first answered OFFSET_OVERFLOW
        self.overflow_logged = 0.0

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.pull_task = loop.create_task(self._pull_loop())
        if self.owner.orderly:
            self._spawn(self._orderly_loop())

    async def stop(self, timeout_s: float) -> int:
        """Stop pulling; let listener calls in flight finish (bounded); returns the committable offset."""
        self.dropped = True
        self.stopped.set()
        self.wake.set()
        self.space.set()
        if self.pull_task is not None:
            self.pull_task.cancel()
            await asyncio.gather(self.pull_task, return_exceptions=True)
        if self.tasks:
            _done, left = await asyncio.wait(list(self.tasks), timeout=timeout_s)
            for t in left:
                t.cancel()
            await asyncio.gather(*left, return_exceptions=True)
        return self.pq.committable()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _over_threshold(self) -> bool:
        owner = self.owner
        return (
            self.pq.count >= owner.pull_threshold_msgs or self.pq.pending_bytes >= owner.pull_threshold_bytes
        )

    async def _pause(self, delay_s: float) -> bool:
        """Wait ``delay_s`` unless stopped first; True when stopped."""
        await wait_event(self.stopped, delay_s)
        return self.dropped

    # -- pulling --------------------------------------------------------------------------------------
    async def _pull_loop(self) -> None:
        failures = 0
        while not self.dropped:
            if self._over_threshold():
                self.space.clear()
                await wait_event(self.space, FLOW_CONTROL_WAIT_S)
                continue
            try:
                wait_s = await self._pull_once()
                failures = 0
            except ClientError as exc:
                failures += 1
                self.replica_index += 1
                self.on_follower_since = asyncio.get_running_loop().time()
                self.owner.routes.refresh_in_background(self.mq.topic)
                wait_s = min(PULL_BACKOFF_S * 2 ** min(failures - 1, 6), PULL_BACKOFF_MAX_S)
                log.info("pull of %s failed (%s): next replica in %.2f s", self.mq, exc, wait_s)
            if wait_s > 0 and await self._pause(wait_s):
                return

    async def _pull_once(self) -> float:
        owner, loop = self.owner, asyncio.get_running_loop()
        route = await owner.routes.get(self.mq.topic)
        addrs = read_order(
            owner.routes.replicas(route, self.mq.broker_name),
            from_followers=owner.read_from_followers,
            spread=self.mq.queue_id,
        )
        if not addrs:
            raise ClientError("NO_ROUTE", f"no replica address for {self.mq}")
        self.leader_slot = len(addrs) - 1 if owner.read_from_followers else 0
        if self.replica_index % len(addrs) and loop.time() - self.on_follower_since > LEADER_RETRY_S:
            self.replica_index = 0
        addr = addrs[self.replica_index % len(addrs)]
        from_leader = addr == owner.routes.leader_addr(route, self.mq.broker_name)
        started = loop.time()
        result = await pull_from(
            owner.transport,
            addr,
            self.mq,
            self.next_offset,
            max_count=owner.pull_batch_size,
            tags=self.tags_expr,
            suspend_ms=owner.suspend_ms,
            group=owner.group,
            timeout_s=LONG_POLL_MARGIN_S,
            sql=owner.sql_of(self.mq.topic),
        )
        if self.dropped:
            return 0.0
        return self._apply(result, from_leader, loop.time() - started)

    def _apply(self, result: PullResult, from_leader: bool, elapsed_s: float) -> float:
        """Take in one pull answer; returns how long to wait before the next pull."""
        status = result.status
        epoch = result.topic_epoch
        if epoch is not None and self.epoch is None:
            self.epoch = epoch
        elif epoch is not None and self.epoch is not None and epoch != self.epoch:
            if epoch > self.epoch:
                # The topic was deleted and created again: these offsets mean nothing in the new
                # queue. The owner restarts the queue at the new queue's minimum (never at its max).
                if not self.dropped:
                    self.owner._topic_recreated(self.mq, epoch)
                return FOLLOWER_LAG_PAUSE_S
            self._to_leader()  # a replica that has not applied the re-creation yet
            return FOLLOWER_LAG_PAUSE_S
        if status is PullStatus.FOUND:
            self.overflow_since = None
            msgs = [m for m in result.messages if self.tags is None or m.tags in self.tags]
            if self.mq.topic.startswith(RETRY_PREFIX):  # shown under the topic it was sent to
                msgs = [dataclasses.replace(m, topic=m.properties.get(PROP_RETRY_TOPIC, m.topic)) for m in msgs]
            added = self.pq.put(msgs, result.next_offset)
            self.next_offset = max(self.next_offset, result.next_offset)
            self._record_progress()
            self._dispatch(added)
            return 0.0
        if status is PullStatus.OFFSET_OVERFLOW:
            if not from_leader:
                self._to_leader()  # a lagging follower: to the leader for a while
                return FOLLOWER_LAG_PAUSE_S
            # Same topic epoch: a leader behind the offset this worker reached is a new leader
            # still dispatching committed entries, or a stale route naming a restarted old one. The
            # messages already handed to the listener must not come again and none stored may be
            # skipped, so wait and pull again (a re-created topic shows as a newer epoch, above).
            now = asyncio.get_running_loop().time()
            if self.overflow_since is None:
                self.overflow_since = self.overflow_logged = now
                log.info("%s: offset %d is past the leader's max %d: waiting for it to catch up",
                         self.mq, self.next_offset, result.next_offset)
            elif now - self.overflow_logged >= OVERFLOW_WARN_EVERY_S:
                self.overflow_logged = now
                log.warning("%s: offset %d has been past the leader's max %d for %.0f s (same topic epoch): "
                            "still waiting", self.mq, self.next_offset, result.next_offset, now - self.overflow_since)
            return FOLLOWER_LAG_PAUSE_S
        self.overflow_since = None
        if result.next_offset > self.next_offset:  # NO_MATCHED_MSG, OFFSET_TOO_SMALL
            self.next_offset = result.next_offset
            self.pq.advance(result.next_offset)
            self._record_progress()
        if status is PullStatus.NO_NEW_MSG and elapsed_s < self.owner.suspend_ms / 2000:
            return FOLLOWER_LAG_PAUSE_S / 4  # answered early (a short poll): do not spin
        return 0.0

    def _to_leader(self) -> None:
        if self.replica_index != self.leader_slot:
            self.replica_index = self.leader_slot
            self.on_follower_since = asyncio.get_running_loop().time()

    def _record_progress(self) -> None:
        if self.dropped:  # the owner takes the final position (or, after a reset, throws it away)
            return
        self.owner.store.update(self.mq, self.pq.committable())

    def _dispatch(self, added: list[MessageExt]) -> None:
        if not added:
            return
        if self.owner.orderly:
            self.wake.set()
            return
        n = self.owner.consume_batch_max
        for i in range(0, len(added), n):
            self._spawn(self._consume_concurrently(added[i : i + n]))

    # -- consuming ------------------------------------------------------------------------------------
    def _done(self, batch: list[MessageExt], *, consumed: bool = True) -> None:
        self.pq.remove(m.queue_offset for m in batch)
        if consumed:  # not when sent back to the broker (retry topic, DLQ)
            self.owner.consumed += len(batch)
        self._record_progress()
        if not self._over_threshold():
            self.space.set()

    def _give_up(self, batch: list[MessageExt]) -> bool:
        limit = self.owner.max_reconsume_times
        if limit is None or batch[0].reconsume_times < limit:
            return False
        log.error(
            "%s: giving up on offsets %s after %d attempts",
            self.mq,
            [m.queue_offset for m in batch],
            batch[0].reconsume_times + 1,
        )
        return True

    def _orderly_limit_reached(self, batch: list[MessageExt]) -> bool:
        """Orderly: retried in place ``max_reconsume_times`` times (16 when unset), then the DLQ."""
        limit = self.owner.max_reconsume_times
        if batch[0].reconsume_times < (limit if limit is not None else ORDERLY_DEFAULT_MAX_RECONSUME):
            return False
        log.error("%s: offsets %s failed %d times in order: to the dead-letter queue",
                  self.mq, [m.queue_offset for m in batch], batch[0].reconsume_times + 1)
        return True

    async def _call(self, batch: list[MessageExt]) -> ConsumeStatus | None:
        """One listener call under the consumer-wide concurrency bound; None when dropped first."""
        assert self.owner._slots is not None
        async with self.owner._slots:
            if self.dropped:
                return None
            return await self.owner._invoke(list(batch), self.ctx)

    async def _consume_concurrently(self, batch: list[MessageExt]) -> None:
        while True:
            status = await self._call(batch)
            if status is None:
                return
            if status is ConsumeStatus.CONSUME_SUCCESS:
                self._done(batch)
                return
            self.owner.reconsumed += len(batch)
            if self.owner.message_model is MessageModel.CLUSTERING:
                left = await self.owner._send_back(self.mq, batch)
                taken = [m for m in batch if m not in left]
                if taken:
                    self._done(taken, consumed=False)  # stored in the retry topic (or the DLQ): this offset is done
                if not left or self.dropped:
                    return
                batch = left  # the broker did not take them: consume them again here
            elif self._give_up(batch):
                self._done(batch)
                return
            delay_s = backoff_s(batch[0].reconsume_times, self.owner.redeliver_backoff_s)
            batch = [dataclasses.replace(m, reconsume_times=m.reconsume_times + 1) for m in batch]
            if await self._pause(delay_s):
                return

    async def _orderly_loop(self) -> None:
        while not self.dropped:
            batch = self.pq.lowest(self.owner.consume_batch_max)
            if not batch:
                self.wake.clear()
                await wait_event(self.wake, FLOW_CONTROL_WAIT_S)
                continue
            while True:
                status = await self._call(batch)
                if status is None:
                    return
                if status is ConsumeStatus.CONSUME_SUCCESS:
                    self._done(batch)
                    break
                if self._orderly_limit_reached(batch):
                    if self.owner.message_model is not MessageModel.CLUSTERING:
                        self._done(batch)  # broadcasting: no DLQ, given up (logged)
                        break
                    left = await self.owner._send_back(self.mq, batch, dlq=True)
                    if not left:
                        self._done(batch, consumed=False)
                        break
                self.owner.reconsumed += len(batch)
                batch = [dataclasses.replace(m, reconsume_times=m.reconsume_times + 1) for m in batch]
                if await self._pause(self.owner.orderly_retry_s):
                    return

