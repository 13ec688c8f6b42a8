"""Consumers: ``PushConsumer`` (long-poll loops feeding a listener) and ``PullConsumer`` (the caller
pulls), over the v1 HTTP API. RocketMQ's ``DefaultMQPushConsumer`` / ``DefaultMQPullConsumer``.

Who owns what (all on one event loop):
- ``PushConsumer`` owns the assignment (``_workers``), the offset store and four loops: route
  refresh (30 s), heartbeat + membership check (``heartbeat_interval_s``), rebalance
  (``rebalance_interval_s``, and at once on start and when the group's consumer ids change), and
  commit (``commit_interval_s``).
- One ``_QueueWorker`` per assigned queue owns its ``ProcessQueue`` and pull loop; consume tasks
  report back into that ProcessQueue. Sync listeners run in a thread pool of ``max_concurrency``
  threads; at most ``max_concurrency`` listener calls run at once across all queues.

Pull loop of one queue::

    ┌─▶ in flight > cap? ──yes──▶ wait for space ─┐
    │        │ no                                  │
    │   POST /v1/pull (leader first; suspend_ms; timeout suspend + 3 s)
    │        ├─ FOUND ──────────▶ filter tags, put in ProcessQueue, dispatch to the listener
    │        ├─ NO_NEW_MSG ─────▶ (pull again at once)
    │        ├─ NO_MATCHED_MSG / OFFSET_TOO_SMALL ─▶ move forward
    │        └─ error ──────────▶ next replica, refresh route, back off (0.1 s … 3 s)
    └────────────────────────────────────────────────┘

Delivery guarantees: at least once. The committed offset of a queue is the lowest offset not yet
consumed successfully (``ProcessQueue.committable``), so a crash redelivers, never skips.
``RECONSUME_LATER`` (or an exception, or any other answer) in concurrent clustering mode sends the
messages back to the broker (``%RETRY%<group>``, later ``%DLQ%<group>``; broker/retry.py) and moves
on once they are stored; a failed send-back, and broadcasting mode, redeliver the batch locally after
1 s, 5 s, 10 s, 30 s, 60 s… (``redeliver_backoff_s``) while the offset waits at that message. In
orderly mode the same batch is retried after ``orderly_retry_s`` (1 s) and nothing later in that
queue is delivered meanwhile; after ``max_reconsume_times`` (16) it goes to the DLQ. The API has no
queue locks, so in clustering mode a queue that moves to another consumer during a rebalance may
briefly be consumed by both.

Offset resets (clustering): ``mqadmin resetOffsetByTime`` moves the group's offsets backwards on the
brokers. The offset store fences its commits with the reset generation it read (see
``offset_store``); when a commit is refused with ``OFFSET_RESET``, or a check (every rebalance round
and every heartbeat) sees a newer generation, the rebalance loop stops that topic's queues on that
broker group, drops what they had pulled and not committed, reads the offsets again and restarts
them there. Messages already handed to the listener may be delivered again (at least once).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

from broker.client.allocate import AllocateStrategy, allocate_averagely
from broker.client.message import (
    ConsumeFrom,
    ConsumeStatus,
    MessageExt,
    MessageModel,
    MessageQueue,
    PullResult,
    PullStatus,
    check_group,
    local_ip,
    parse_tags_expression,
    pull_request,
    pull_result_from_answer,
    tags_expression,
)
from broker.client.message_selector import Selector, as_selector, pull_filter
from broker.client.offset_store import LocalFileOffsetStore, OffsetStore, RemoteOffsetStore
from broker.client.process_queue import ProcessQueue, backoff_s
from broker.client.route_cache import RouteCache, all_addrs, call_leader, call_replicas, subscribe_queues
from broker.client.transport import (
    FROM_ENV,
    ClientError,
    CredentialsArg,
    NamesrvClient,
    TlsArg,
    TopicRoute,
    Transport,
    resolve_security,
)
from broker.protocol.names import TOPIC_RULE, is_topic
from broker.protocol.properties import PROP_RETRY_TOPIC, RETRY_PREFIX, retry_topic

log = logging.getLogger(__name__)

LONG_POLL_MARGIN_S = 3.0
PULL_BACKOFF_S = 0.1
PULL_BACKOFF_MAX_S = 3.0
FOLLOWER_LAG_PAUSE_S = 0.2
ORDERLY_DEFAULT_MAX_RECONSUME = 16
OVERFLOW_WARN_EVERY_S = 30.0  # a leader short of our offset (same topic epoch) is waited for, with a warning
LEADER_RETRY_S = 10.0  # after this long on a follower, try the leader again
FLOW_CONTROL_WAIT_S = 1.0
REBALANCE_RETRY_S = 1.0
DEFAULT_OFFSET_DIR = "~/.dledger_mq/offsets"
DEFAULT_REDELIVER_BACKOFF_S = (1.0, 5.0, 10.0, 30.0, 60.0)
CONSUME_TIMESTAMP_DEFAULT_AGO_MS = 30 * 60 * 1000  # RocketMQ: half an hour ago

_instance_ids = itertools.count(1)

Listener = Callable[[list[MessageExt], "ConsumeContext"], Any]


@dataclasses.dataclass(frozen=True)
class ConsumeContext:
    message_queue: MessageQueue
    group: str
    orderly: bool


@dataclasses.dataclass(frozen=True)
class QueueStats:
    next_pull_offset: int
    committable_offset: int  # everything below it is consumed
    committed_offset: int | None  # last written to the offset store's backing
    in_flight: int
    consumed: int


@dataclasses.dataclass(frozen=True)
class ConsumerStats:
    client_id: str
    consumed: int  # messages whose listener call succeeded
    reconsumed: int  # messages handed back with RECONSUME_LATER (or an exception)
    queues: dict[MessageQueue, QueueStats]


def default_client_id() -> str:
    """RocketMQ's ``ip@instance``; the counter tells consumers of one process apart."""
    return f"{local_ip()}@{os.getpid()}-{next(_instance_ids)}"


def normalise_status(value: Any) -> ConsumeStatus:
    if value == ConsumeStatus.CONSUME_SUCCESS or value == "SUCCESS":
        return ConsumeStatus.CONSUME_SUCCESS
    if value not in (ConsumeStatus.RECONSUME_LATER, "SUSPEND_CURRENT_QUEUE_A_MOMENT"):
        log.warning("listener returned %r: treated as RECONSUME_LATER", value)
    return ConsumeStatus.RECONSUME_LATER


async def _wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that arrives just
    # as the event is set, and the loop calling this would then outlive shutdown().
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
        return True
    except TimeoutError:
        return False


# -- broker calls shared by both consumers ------------------------------------------------------------
async def pull_from(
    transport: Transport,
    addr: str,
    mq: MessageQueue,
    offset: int,
    *,
    max_count: int,
    tags: str,
    suspend_ms: int,
    group: str | None,
    timeout_s: float,
    sql: str | None = None,
) -> PullResult:
    body = pull_request(
        mq, offset, max_count=max_count, tags=tags, suspend_ms=suspend_ms, consumer_group=group, sql=sql
    )
    answer = await transport.call(addr, "POST", "/v1/pull", body, timeout_s=suspend_ms / 1000 + timeout_s)
    return pull_result_from_answer(answer)


async def queue_min_max(
    transport: Transport, routes: RouteCache, mq: MessageQueue, timeout_s: float
) -> tuple[int, int]:
    lo, hi, _epoch = await queue_status(transport, routes, mq, timeout_s)
    return lo, hi


async def queue_status(
    transport: Transport, routes: RouteCache, mq: MessageQueue, timeout_s: float
) -> tuple[int, int, int | None]:
    """(min offset, max offset, topic epoch or None) of one queue."""
    route = await routes.get(mq.topic, timeout_s)
    _, answer = await call_replicas(
        transport,
        routes.replicas(route, mq.broker_name),
        "GET",
        f"/v1/topics/{quote(mq.topic, safe='')}/status",
        timeout_s=timeout_s,
    )
    epoch = answer.get("topic_epoch")
    for q in answer.get("queues") or ():
        if int(q["queue_id"]) == mq.queue_id:
            return int(q["min_offset"]), int(q["max_offset"]), (int(epoch) if epoch is not None else None)
    raise ClientError("INVALID_QUEUE_ID", f"{mq} is not in the topic status of {mq.broker_name}")


async def search_offset_at(
    transport: Transport, routes: RouteCache, mq: MessageQueue, ts_ms: int, timeout_s: float
) -> int:
    route = await routes.get(mq.topic, timeout_s)
    _, answer = await call_replicas(
        transport,
        routes.replicas(route, mq.broker_name),
        "GET",
        "/v1/offset/search",
        params={"topic": mq.topic, "queue_id": mq.queue_id, "ts": ts_ms},
        timeout_s=timeout_s,
    )
    return int(answer["offset"])


# -- push consumer -------------------------------------------------------------------------------------
class PushConsumer:
    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] | None = None,
        *,
        message_model: str = "CLUSTERING",
        consume_from: str = "LAST",
        consume_timestamp_ms: int | None = None,
        orderly: bool = False,
        pull_batch_size: int = 32,
        consume_batch_max: int = 1,
        suspend_ms: int = 15000,
        rebalance_interval_s: float = 20.0,
        commit_interval_s: float = 5.0,
        heartbeat_interval_s: float = 10.0,
        offset_dir: str | None = None,
        max_concurrency: int = 20,
        client_id: str | None = None,
        allocate: AllocateStrategy[MessageQueue] = allocate_averagely,
        pull_threshold_msgs: int = 1000,
        pull_threshold_bytes: int = 100 << 20,
        redeliver_backoff_s: Sequence[float] = DEFAULT_REDELIVER_BACKOFF_S,
        orderly_retry_s: float = 1.0,
        max_reconsume_times: int | None = None,
        route_refresh_interval_s: float = 30.0,
        timeout_s: float = 3.0,
        shutdown_timeout_s: float = 5.0,
        transport: Transport | None = None,
        credentials: CredentialsArg = FROM_ENV,
        tls: TlsArg = FROM_ENV,
    ):
        if not 1 <= pull_batch_size <= 1024 or not 1 <= consume_batch_max <= 1024:
            raise ValueError("pull_batch_size and consume_batch_max must be in 1..1024")
        if not 0 <= suspend_ms <= 30000:
            raise ValueError("suspend_ms must be in 0..30000")
        if max_concurrency < 1 or pull_threshold_msgs < 1 or not redeliver_backoff_s:
            raise ValueError("max_concurrency, pull_threshold_msgs and redeliver_backoff_s must be positive")
        self.group = check_group(group)
        self.namesrv_addrs = namesrv
        self.message_model = MessageModel(message_model)
        self.consume_from = ConsumeFrom(consume_from)
        self.consume_timestamp_ms = consume_timestamp_ms
        self.orderly = orderly
        self.pull_batch_size = pull_batch_size
        self.consume_batch_max = consume_batch_max
        self.suspend_ms = suspend_ms
        self.rebalance_interval_s = rebalance_interval_s
        self.commit_interval_s = commit_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.offset_dir = offset_dir or DEFAULT_OFFSET_DIR
        self.max_concurrency = max_concurrency
        self.client_id = client_id or default_client_id()
        self.allocate = allocate
        self.pull_threshold_msgs = pull_threshold_msgs
        self.pull_threshold_bytes = pull_threshold_bytes
        self.redeliver_backoff_s = tuple(redeliver_backoff_s)
        self.orderly_retry_s = orderly_retry_s
        self.max_reconsume_times = max_reconsume_times
        self.route_refresh_interval_s = route_refresh_interval_s
        self.timeout_s = timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self._transport = transport
        self._own_transport = transport is None
        self._credentials, self._tls = resolve_security(credentials, tls)
        self._subscriptions: dict[str, frozenset[str] | None] = {}
        self._sql: dict[str, str] = {}  # topic -> SQL92 expression (its tags entry is None: every tag)
        self._listener: Listener | None = None
        self._routes: RouteCache | None = None
        self._store: OffsetStore | None = None
        self._workers: dict[MessageQueue, _QueueWorker] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._slots: asyncio.Semaphore | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._rebalance_wanted = asyncio.Event()
        self._last_cids: dict[str, tuple[str, ...]] = {}
        # Broadcasting: topics seen re-created (newest epoch), keys to restart, queues to start at min.
        self._local_recreated: dict[tuple[str, str], int] = {}
        self._local_restart: set[tuple[str, str]] = set()
        self._local_from_min: set[MessageQueue] = set()
        self._retry_brokers: set[str] = set()  # broker groups that took a send-back (have %RETRY%<group>)
        self._running = False
        self.consumed = 0
        self.reconsumed = 0

    # -- configuration --------------------------------------------------------------------------------
    def subscribe(self, topic: str, tags: Selector = "*") -> None:
        """Consume ``topic``; ``tags`` is ``"*"`` or ``"a||b"`` (filtered by the broker and again here),
        or a ``MessageSelector`` (``by_sql`` is checked here and filtered by the broker)."""
        if not is_topic(topic):
            raise ClientError("INVALID_TOPIC", f"topic {str(topic)[:140]!r} must match {TOPIC_RULE}")
        selector = as_selector(tags)
        self._subscriptions[topic] = None if selector.is_sql else parse_tags_expression(selector.expression)
        if selector.is_sql:
            self._sql[topic] = selector.expression
        else:
            self._sql.pop(topic, None)
        if self._running:
            self._rebalance_wanted.set()

    def register_listener(self, listener: Listener) -> None:
        """``listener(msgs, ctx)`` (sync or async) returns ``"CONSUME_SUCCESS"`` or ``"RECONSUME_LATER"``;
        an exception counts as ``RECONSUME_LATER``."""
        self._listener = listener

    # -- life cycle -----------------------------------------------------------------------------------
    @property
    def routes(self) -> RouteCache:
        assert self._routes is not None, "start() the consumer first"
        return self._routes

    @property
    def store(self) -> OffsetStore:
        assert self._store is not None, "start() the consumer first"
        return self._store

    @property
    def transport(self) -> Transport:
        assert self._transport is not None, "start() the consumer first"
        return self._transport

    async def start(self) -> None:
        if self._running:
            return
        if self._listener is None or not self._subscriptions:
            raise ClientError("NOT_CONFIGURED", "subscribe() and register_listener() before start()")
        if self._transport is None:
            self._transport = Transport(self.timeout_s, credentials=self._credentials, tls=self._tls)
        self._routes = RouteCache(
            NamesrvClient(self.namesrv_addrs, self._transport),
            refresh_interval_s=self.route_refresh_interval_s,
            timeout_s=self.timeout_s,
        )
        if self.message_model is MessageModel.CLUSTERING:
            # RocketMQ: every clustering consumer of a group consumes its retry topic too (created
            # by the broker at the first send-back; until then it has no route).
            self._subscriptions.setdefault(retry_topic(self.group), None)
            self._store = RemoteOffsetStore(
                self._transport,
                self._routes,
                self.group,
                timeout_s=self.timeout_s,
                reset_fencing=True,
                on_reset=lambda _topic, _broker_name: self._rebalance_wanted.set(),
            )
        else:
            self._store = LocalFileOffsetStore(self.offset_dir, self.group)
        await self._store.load()
        self._slots = asyncio.Semaphore(self.max_concurrency)
        self._executor = concurrent.futures.ThreadPoolExecutor(self.max_concurrency, f"consume-{self.group}")
        self._running = True
        for topic in sorted(self._subscriptions):
            try:
                await self._routes.get(topic)
            except ClientError as exc:
                level = logging.DEBUG if topic == retry_topic(self.group) else logging.WARNING  # made on demand
                log.log(level, "no route for %s yet (rebalance retries): %s", topic, exc)
        await self._heartbeat_once()
        complete = await self._rebalance_once()
        if not complete:
            self._rebalance_wanted.set()
        loop = asyncio.get_running_loop()
        self._loops = [
            loop.create_task(self._routes.run()),
            loop.create_task(self._heartbeat_loop()),
            loop.create_task(self._rebalance_loop()),
            loop.create_task(self._commit_loop()),
        ]

    async def shutdown(self) -> None:
        """Stops the loops, lets listener calls in flight finish (≤ ``shutdown_timeout_s``), commits
        offsets, unregisters from the brokers."""
        if not self._running:
            return
        self._running = False
        for t in self._loops:
            t.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops = []
        await asyncio.gather(*(self._stop_worker(mq) for mq in list(self._workers)))
        try:
            await self.store.persist()
        except ClientError as exc:
            log.warning("final offset commit failed: %s", exc)
        await self._call_all("/v1/unregister", {"client_id": self.client_id})
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        await self.routes.close()
        if self._own_transport and self._transport is not None:
            await self._transport.close()
            self._transport = None

    async def __aenter__(self) -> PushConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # -- observation ----------------------------------------------------------------------------------
    def assigned_queues(self) -> list[MessageQueue]:
        return sorted(self._workers)

    def stats(self) -> ConsumerStats:
        queues = {
            mq: QueueStats(
                next_pull_offset=w.next_offset,
                committable_offset=w.pq.committable(),
                committed_offset=self._store.persisted(mq) if self._store else None,
                in_flight=w.pq.count,
                consumed=w.pq.consumed_count,
            )
            for mq, w in sorted(self._workers.items())
        }
        return ConsumerStats(self.client_id, self.consumed, self.reconsumed, queues)

    # -- loops ----------------------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            try:
                await self._heartbeat_once()
                if isinstance(self._store, RemoteOffsetStore):
                    await self._check_membership()
                    await self._store.check_generations()  # a newer one wakes the rebalance loop
            except Exception:
                log.exception("heartbeat round failed")

    async def _rebalance_loop(self) -> None:
        complete = True
        while True:
            await _wait_event(
                self._rebalance_wanted, self.rebalance_interval_s if complete else REBALANCE_RETRY_S
            )
            self._rebalance_wanted.clear()
            try:
                complete = await self._rebalance_once()
            except Exception:
                log.exception("rebalance round failed")
                complete = False

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.commit_interval_s)
            try:
                await self.store.persist(list(self._workers))
            except Exception:
                log.exception("offset commit failed")

    # -- heartbeats and membership --------------------------------------------------------------------
    async def _subscribed_routes(self) -> list[TopicRoute]:
        out: list[TopicRoute] = []
        for topic in sorted(self._subscriptions):
            route = self.routes.cached(topic)
            if route is None:
                try:
                    route = await self.routes.get(topic)
                except ClientError:
                    continue
            out.append(route)
        return out

    async def _heartbeat_once(self) -> None:
        body = {
            "client_id": self.client_id,
            "groups": [
                {"group": self.group, "topics": sorted(self._subscriptions), "model": str(self.message_model)}
            ],
        }
        await self._call_all("/v1/heartbeat", body)

    async def _call_all(self, path: str, body: dict[str, Any]) -> None:
        """POST to every replica of every group of the subscribed topics; failures are logged."""
        addrs = all_addrs(await self._subscribed_routes())
        results = await asyncio.gather(
            *(self.transport.call(a, "POST", path, body, timeout_s=self.timeout_s) for a in addrs),
            return_exceptions=True,
        )
        for addr, res in zip(addrs, results, strict=True):
            if isinstance(res, BaseException):
                log.debug("%s to %s failed: %s", path, addr, res)

    async def _consumer_ids(self, route: TopicRoute) -> list[str]:
        """The group's consumer ids, the union of what one replica of each broker group knows."""
        ids: set[str] = set()
        answered = False
        path = f"/v1/groups/{quote(self.group, safe='')}/consumers"
        for bd in route.broker_datas:
            try:
                _, answer = await call_replicas(
                    self.transport,
                    self.routes.replicas(route, bd.broker_name),
                    "GET",
                    path,
                    timeout_s=self.timeout_s,
                )
            except ClientError as exc:
                log.debug("consumer list from %s failed: %s", bd.broker_name, exc)
                continue
            answered = True
            ids.update(str(c) for c in answer.get("client_ids") or ())
        if not answered:
            raise ClientError(
                "NO_ROUTE", f"no broker of {route.topic} answered the consumer list of {self.group}"
            )
        return sorted(ids)

    async def _check_membership(self) -> None:
        for route in await self._subscribed_routes():
            try:
                cids = tuple(await self._consumer_ids(route))
            except ClientError:
                continue
            if cids != self._last_cids.get(route.topic):
                log.info("consumers of %s on %s changed: %s", self.group, route.topic, cids)
                self._rebalance_wanted.set()

    # -- rebalance ------------------------------------------------------------------------------------
    async def _rebalance_once(self) -> bool:
        """Returns False when something failed, so the loop retries soon."""
        complete = await self._take_resets()
        complete &= await self._take_local_recreations()
        for topic, tags in sorted(self._subscriptions.items()):
            try:
                if topic == retry_topic(self.group) and not await self._retry_route_current():
                    complete = False
                complete &= await self._rebalance_topic(topic, tags)
            except ClientError as exc:
                if topic == retry_topic(self.group) and exc.code in ("TOPIC_NOT_EXIST", "NO_ROUTE"):
                    log.debug("retry topic %s has no route yet: %s", topic, exc)
                    complete &= not self._retry_brokers  # created by a send-back: soon routed
                    continue
                log.warning("rebalance of %s failed: %s", topic, exc)
                complete = False
        return complete

    async def _rebalance_topic(self, topic: str, tags: frozenset[str] | None) -> bool:
        route = await self.routes.get(topic)
        mq_all = subscribe_queues(route)
        if self.message_model is MessageModel.BROADCASTING:
            mine = mq_all
        else:
            cids = await self._consumer_ids(route)
            self._last_cids[topic] = tuple(cids)
            if self.client_id not in cids:
                log.info(
                    "%s is not yet in the consumer list of %s: rebalance later", self.client_id, self.group
                )
                await self._heartbeat_once()
                return False
            mine = self.allocate(self.client_id, mq_all, cids)
        return await self._apply_assignment(topic, tags, set(mine))

    async def _apply_assignment(
        self, topic: str, tags: frozenset[str] | None, mine: set[MessageQueue]
    ) -> bool:
        current = {mq for mq in self._workers if mq.topic == topic}
        lost = sorted(current - mine)
        if lost:
            log.info("%s drops %s", self.client_id, [str(mq) for mq in lost])
            await asyncio.gather(*(self._stop_worker(mq, commit=True) for mq in lost))
        return await self._start_workers(sorted(mine - current), tags)

    async def _start_workers(self, mqs: list[MessageQueue], tags: frozenset[str] | None) -> bool:
        complete = True
        for mq in mqs:
            try:
                start, epoch = await self._start_offset(mq)
            except ClientError as exc:
                log.warning("no start offset for %s yet: %s", mq, exc)
                complete = False
                continue
            if not self._running:
                break
            worker = _QueueWorker(self, mq, start, tags, epoch)
            self._workers[mq] = worker
            worker.start()
            log.info("%s consumes %s from offset %d", self.client_id, mq, start)
        return complete

    async def _stop_worker(self, mq: MessageQueue, *, commit: bool = False) -> None:
        worker = self._workers.get(mq)
        if worker is None:
            return
        committable = await worker.stop(self.shutdown_timeout_s)
        self.store.update(mq, committable)
        self._workers.pop(mq, None)
        if commit:
            try:
                await self.store.persist([mq])
            except ClientError as exc:
                log.warning("commit of dropped %s failed: %s", mq, exc)
            self.store.remove(mq)

    # -- offset resets (clustering) ---------------------------------------------------------------------
    async def _take_resets(self) -> bool:
        """Restart the queues whose offsets were reset on the brokers; False when one did not restart."""
        store = self._store
        if not isinstance(store, RemoteOffsetStore):
            return True  # broadcasting: the offsets are this consumer's own
        await store.check_generations()
        complete = True
        for topic, broker_name in store.stale_keys():
            complete &= await self._restart_reset_queues(store, topic, broker_name)
        return complete

    async def _restart_reset_queues(self, store: RemoteOffsetStore, topic: str, broker_name: str) -> bool:
        """Stop the queues of ``topic`` on ``broker_name``, drop what they pulled and did not commit
        (listener calls in flight may finish, their results are discarded), read the offsets again
        and restart the queues there."""
        mqs = sorted(mq for mq in self._workers if mq.topic == topic and mq.broker_name == broker_name)
        log.warning(
            "%s: offsets of %s on %s were reset (or the topic created again): restarting %d queue(s)",
            self.client_id, topic, broker_name, len(mqs),
        )
        await asyncio.gather(*(self._drop_worker(mq) for mq in mqs))
        # Without queues to fetch again, nothing would clear the fence: forget the generation too
        # (nothing of this key is held, so nothing can be committed from before the reset).
        store.drop(topic, broker_name, refetch=bool(mqs))
        if topic not in self._subscriptions or not self._running:
            return True
        return await self._start_workers(mqs, self._subscriptions[topic])

    async def _drop_worker(self, mq: MessageQueue) -> None:
        """Stop a queue without keeping its position (its offsets are read again)."""
        worker = self._workers.get(mq)
        if worker is None:
            return
        await worker.stop(self.shutdown_timeout_s)
        self._workers.pop(mq, None)

    async def _start_offset(self, mq: MessageQueue) -> tuple[int, int | None]:
        """(offset to start at, the topic epoch it belongs to, None: unknown)."""
        key = (mq.topic, mq.broker_name)
        if mq in self._local_from_min:  # broadcasting: the offsets on disk belong to the old topic
            lo, _hi, epoch = await queue_status(self.transport, self.routes, mq, self.timeout_s)
            if epoch is None or epoch < self._local_recreated[key]:
                raise ClientError("STALE_REPLICA", f"{mq}: a replica behind the topic's re-creation answered")
            self.store.update(mq, lo, increase_only=False)
            self._local_from_min.discard(mq)
            return lo, epoch
        stored = await self.store.fetch(mq)
        store = self._store
        epoch = store.topic_epoch(mq) if isinstance(store, RemoteOffsetStore) else None
        if stored is not None:
            return stored, epoch
        if isinstance(store, RemoteOffsetStore) and store.recreated(mq):
            # A topic deleted and created again: nothing in the new queue was consumed yet.
            lo, _hi, status_epoch = await queue_status(self.transport, self.routes, mq, self.timeout_s)
            if status_epoch != epoch:
                raise ClientError("STALE_REPLICA", f"{mq}: offsets and queue status of different topic epochs")
            log.warning("%s: topic %s was created again: starting at the new queue's minimum %d", mq, mq.topic, lo)
            self.store.update(mq, lo, increase_only=False)
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
        self.store.update(mq, offset, increase_only=False)
        return offset, epoch

    # -- topic re-creation ----------------------------------------------------------------------------
    def _topic_recreated(self, mq: MessageQueue, epoch: int) -> None:
        """A pull answer of ``mq`` named a newer topic epoch than its worker started with."""
        store = self._store
        if isinstance(store, RemoteOffsetStore):
            store.topic_recreated(mq, epoch)  # stale: the rebalance loop restarts the key's queues
        else:
            key = (mq.topic, mq.broker_name)
            if epoch > self._local_recreated.get(key, -1):
                log.warning("%s: topic %s was deleted and created again (epoch %d): restarting its queues",
                            mq, mq.topic, epoch)
                self._local_recreated[key] = epoch
                self._local_restart.add(key)
        self._rebalance_wanted.set()

    async def _take_local_recreations(self) -> bool:
        """Broadcasting: restart the queues of re-created topics at the new queues' minimum."""
        complete = True
        for key in sorted(self._local_restart):
            self._local_restart.discard(key)
            mqs = sorted(mq for mq in self._workers if (mq.topic, mq.broker_name) == key)
            await asyncio.gather(*(self._drop_worker(mq) for mq in mqs))
            for mq in mqs:
                self.store.remove(mq)
            self._local_from_min.update(mqs)
            if key[0] in self._subscriptions and self._running:
                complete &= await self._start_workers(mqs, self._subscriptions[key[0]])
        return complete

    # -- retries (clustering): back to the broker ------------------------------------------------------
    async def _retry_route_current(self) -> bool:
        """The retry topic's route names every broker group this consumer sent messages back to
        (refreshed when not: those groups created it since); False while one is still missing."""
        if not self._retry_brokers:
            return True
        topic = retry_topic(self.group)
        cached = self.routes.cached(topic)
        if cached is not None and self._retry_brokers <= {mq.broker_name for mq in subscribe_queues(cached)}:
            return True
        route = await self.routes.refresh(topic)
        return self._retry_brokers <= {mq.broker_name for mq in subscribe_queues(route)}

    async def _send_back(
        self, mq: MessageQueue, msgs: list[MessageExt], *, dlq: bool = False
    ) -> list[MessageExt]:
        """Send failed messages back to their broker group (``%RETRY%<group>``, or ``%DLQ%<group>``
        after ``max_reconsume_times``); returns those the broker did not take."""
        failed = []
        for m in msgs:
            body: dict[str, Any] = {"group": self.group, "msg_id": m.msg_id, "dlq": dlq}
            if self.max_reconsume_times is not None:
                body["max_reconsume_times"] = self.max_reconsume_times
            try:
                answer = await call_leader(
                    self.transport, self.routes, mq.topic, mq.broker_name, "/v1/consumer/sendback", body,
                    timeout_s=self.timeout_s,
                )
            except ClientError as exc:
                log.warning("%s: send-back of %s failed (consumed again here): %s", mq, m.msg_id, exc)
                failed.append(m)
                continue
            if not answer.get("dlq"):
                self._retry_brokers.add(mq.broker_name)
            if answer.get("dlq"):
                log.warning("%s: %s went to the dead-letter queue %s after %s re-consumptions",
                            mq, m.msg_id, answer.get("topic"), answer.get("reconsume_times"))
        retry_groups = {w.broker_name for w in self._workers if w.topic == retry_topic(self.group)}
        if not self._retry_brokers <= retry_groups:
            self._rebalance_wanted.set()  # the retry topic may exist now: take its queues
        return failed

    # -- listener calls -------------------------------------------------------------------------------
    async def _invoke(self, msgs: list[MessageExt], ctx: ConsumeContext) -> ConsumeStatus:
        listener = self._listener
        assert listener is not None and self._executor is not None
        try:
            if inspect.iscoroutinefunction(listener) or inspect.iscoroutinefunction(
                getattr(listener, "__call__", None)  # noqa: B004 - async callable objects
            ):
                out = await listener(msgs, ctx)
            else:
                loop = asyncio.get_running_loop()
                out = await loop.run_in_executor(self._executor, listener, msgs, ctx)
                if inspect.isawaitable(out):
                    out = await out
        except Exception:
            log.exception("listener failed on %d message(s) of %s", len(msgs), ctx.message_queue)
            return ConsumeStatus.RECONSUME_LATER
        return normalise_status(out)


class _QueueWorker:
    """One assigned queue: its ProcessQueue, its pull loop and its consume tasks."""

    def __init__(
        self,
        owner: PushConsumer,
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
        self.replica_index = 0
        self.on_follower_since = 0.0
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
        await _wait_event(self.stopped, delay_s)
        return self.dropped

    # -- pulling --------------------------------------------------------------------------------------
    async def _pull_loop(self) -> None:
        failures = 0
        while not self.dropped:
            if self._over_threshold():
                self.space.clear()
                await _wait_event(self.space, FLOW_CONTROL_WAIT_S)
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
        addrs = owner.routes.replicas(route, self.mq.broker_name)
        if not addrs:
            raise ClientError("NO_ROUTE", f"no replica address for {self.mq}")
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
            sql=owner._sql.get(self.mq.topic),
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
            self.replica_index = 0  # a replica that has not applied the re-creation yet
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
                self.replica_index = 0  # a lagging follower: back to the leader
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
                await _wait_event(self.wake, FLOW_CONTROL_WAIT_S)
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


# -- pull consumer -------------------------------------------------------------------------------------
class PullConsumer:
    """The caller drives: list queues, pull at offsets, keep offsets (remote, for its group)."""

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] | None = None,
        *,
        timeout_s: float = 3.0,
        route_refresh_interval_s: float = 30.0,
        transport: Transport | None = None,
        credentials: CredentialsArg = FROM_ENV,
        tls: TlsArg = FROM_ENV,
    ):
        self.group = check_group(group)
        self.namesrv_addrs = namesrv
        self.timeout_s = timeout_s
        self.route_refresh_interval_s = route_refresh_interval_s
        self._transport = transport
        self._own_transport = transport is None
        self._credentials, self._tls = resolve_security(credentials, tls)
        self._routes: RouteCache | None = None
        self._store: RemoteOffsetStore | None = None
        self._refresher: asyncio.Task[None] | None = None

    @property
    def routes(self) -> RouteCache:
        assert self._routes is not None, "start() the consumer first"
        return self._routes

    @property
    def store(self) -> RemoteOffsetStore:
        assert self._store is not None, "start() the consumer first"
        return self._store

    @property
    def transport(self) -> Transport:
        assert self._transport is not None, "start() the consumer first"
        return self._transport

    async def start(self) -> None:
        if self._routes is not None:
            return
        if self._transport is None:
            self._transport = Transport(self.timeout_s, credentials=self._credentials, tls=self._tls)
        self._routes = RouteCache(
            NamesrvClient(self.namesrv_addrs, self._transport),
            refresh_interval_s=self.route_refresh_interval_s,
            timeout_s=self.timeout_s,
        )
        self._store = RemoteOffsetStore(self._transport, self._routes, self.group, timeout_s=self.timeout_s)
        self._refresher = asyncio.get_running_loop().create_task(self._routes.run())

    async def shutdown(self) -> None:
        """Commits offsets updated since the last ``commit()``, then closes connections."""
        if self._routes is None:
            return
        try:
            await self.commit()
        except ClientError as exc:
            log.warning("final offset commit failed: %s", exc)
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
        await self._routes.close()
        self._routes = None
        if self._own_transport and self._transport is not None:
            await self._transport.close()
            self._transport = None

    async def __aenter__(self) -> PullConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, sorted by (broker_name, queue_id)."""
        return subscribe_queues(await self.routes.get(topic, self.timeout_s))

    async def pull(
        self, mq: MessageQueue, offset: int, max_count: int = 32, tags: Selector = "*", suspend_ms: int = 0
    ) -> PullResult:
        """From the leader, else from a follower (any replica serves committed reads); ``tags`` is a
        tag expression or a ``MessageSelector``."""
        route = await self.routes.get(mq.topic, self.timeout_s)
        addrs = self.routes.replicas(route, mq.broker_name)
        if not addrs:
            raise ClientError("NO_ROUTE", f"no replica address for {mq}")
        expr, sql = pull_filter(tags)
        last: ClientError | None = None
        for addr in addrs:
            try:
                return await pull_from(
                    self.transport,
                    addr,
                    mq,
                    offset,
                    max_count=max_count,
                    tags=expr,
                    suspend_ms=suspend_ms,
                    group=self.group,
                    timeout_s=self.timeout_s,
                    sql=sql,
                )
            except ClientError as exc:
                if exc.status in (400, 403, 404):
                    raise
                last = exc
                self.routes.refresh_in_background(mq.topic)
        assert last is not None
        raise last

    async def fetch_consume_offset(self, mq: MessageQueue, *, from_store: bool = True) -> int | None:
        """The group's offset of ``mq`` (None: never committed)."""
        if not from_store:
            local = self.store.read(mq)
            if local is not None:
                return local
        return await self.store.fetch(mq)

    def reset_generation(self, mq: MessageQueue) -> int | None:
        """The newest reset generation of ``mq``'s group offsets seen by ``fetch_consume_offset``
        (None: not read yet). Commits do not carry it: a pull consumer is not fenced off resets."""
        return self.store.reset_generation(mq)

    def update_consume_offset(self, mq: MessageQueue, offset: int) -> None:
        """Set the in-memory offset; ``commit()`` (or shutdown) writes it. The broker never moves a
        committed offset backwards."""
        self.store.update(mq, offset, increase_only=False)

    async def commit(self) -> int:
        return await self.store.persist()

    async def search_offset(self, mq: MessageQueue, ts_ms: int) -> int:
        """The first offset stored at or after ``ts_ms`` (the max offset when none)."""
        return await search_offset_at(self.transport, self.routes, mq, ts_ms, self.timeout_s)

    async def min_offset(self, mq: MessageQueue) -> int:
        return (await queue_min_max(self.transport, self.routes, mq, self.timeout_s))[0]

    async def max_offset(self, mq: MessageQueue) -> int:
        return (await queue_min_max(self.transport, self.routes, mq, self.timeout_s))[1]
