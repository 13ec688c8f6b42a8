"""The push consumer: long-poll loops feeding a listener (RocketMQ's ``DefaultMQPushConsumer``),
over the v1 HTTP API.

Who owns what (all on one event loop):
- ``PushConsumer`` owns the assignment (``_workers``), the offset store and four loops: route
  refresh (30 s), heartbeat + membership check (``heartbeat_interval_s``), rebalance
  (``rebalance_interval_s``, and at once on start and when the group's consumer ids change), and
  commit (``commit_interval_s``).
- One ``QueueWorker`` per assigned queue (broker/client/queue_worker.py, with the pull loop's
  diagram) owns its ``ProcessQueue`` and pull loop; consume tasks report back into that
  ProcessQueue. Sync listeners run in a thread pool of ``max_concurrency`` threads; at most
  ``max_concurrency`` listener calls run at once across all queues.

Delivery guarantees: at least once. The committed offset of a queue is the lowest offset not yet
consumed successfully (``ProcessQueue.committable``), so a crash redelivers, never skips.
``RECONSUME_LATER`` (or an exception, or any other answer) in concurrent clustering mode sends the
messages back to the broker (``%RETRY%<group>``, later ``%DLQ%<group>``; broker/store/retry.py) and moves
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
import logging
from collections.abc import Sequence
from typing import Any

from broker.client.allocate import AllocateStrategy, allocate_averagely
from broker.client.consumer_common import (
    ConsumeContext,
    ConsumerStats,
    Listener,
    QueueStats,
    default_client_id,
    group_consumer_ids,
    invoke_listener,
    known_routes,
    post_to_all,
    wait_event,
)
from broker.client.message import (
    ConsumeFrom,
    ConsumeStatus,
    MessageExt,
    MessageModel,
    MessageQueue,
    check_group,
    parse_tags_expression,
)
from broker.client.message_selector import Selector, as_selector
from broker.client.offset_store import LocalFileOffsetStore, OffsetStore, RemoteOffsetStore
from broker.client.producer import Producer
from broker.client.queue_worker import QueueWorker
from broker.client.retry_sender import RetrySender
from broker.client.route_cache import RouteCache, all_addrs, subscribe_queues
from broker.client.start_position import StartPositions
from broker.client.trace import (
    TRACE_PRODUCER_PREFIX,
    TRACE_TOPIC_DEFAULT,
    TraceDispatcher,
    consume_records,
    wall_ms,
)
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
from broker.protocol.properties import retry_topic

log = logging.getLogger(__name__)

REBALANCE_RETRY_S = 1.0
FAIL_FAST_ROUNDS = 3  # start(fail_fast=True): rebalance rounds before REBALANCE_INCOMPLETE
DEFAULT_OFFSET_DIR = "~/.dledger_mq/offsets"
DEFAULT_REDELIVER_BACKOFF_S = (1.0, 5.0, 10.0, 30.0, 60.0)


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
        enable_msg_trace: bool = False,
        trace_topic: str = TRACE_TOPIC_DEFAULT,
        read_from_followers: bool = False,
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
        self.read_from_followers = read_from_followers  # pull committed data from a follower first
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
        self._workers: dict[MessageQueue, QueueWorker] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._slots: asyncio.Semaphore | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._rebalance_wanted = asyncio.Event()
        self._last_cids: dict[str, tuple[str, ...]] = {}
        self._positions: StartPositions | None = None
        self._local_restart: set[tuple[str, str]] = set()  # broadcasting: re-created keys to restart
        self._retries: RetrySender | None = None
        self._running = False
        self.consumed = 0
        self.reconsumed = 0
        # Message trace (broker/client/trace.py): one Sub record per message of each listener call.
        self.trace: TraceDispatcher | None = None
        if enable_msg_trace:
            inner = Producer(TRACE_PRODUCER_PREFIX + self.group, namesrv, send_timeout_s=timeout_s,
                             credentials=self._credentials, tls=self._tls)
            self.trace = TraceDispatcher(inner, trace_topic)

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

    def sql_of(self, topic: str) -> str | None:
        """The SQL92 expression ``topic`` is subscribed with (None: a tag expression)."""
        return self._sql.get(topic)

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

    @property
    def positions(self) -> StartPositions:
        assert self._positions is not None, "start() the consumer first"
        return self._positions

    async def start(self, *, fail_fast: bool = False) -> None:
        """Start consuming. By default a failure to reach the NameServer or the brokers is logged and
        retried in the background (RocketMQ's behaviour): ``start`` returns and the consumer catches up
        once they answer. ``fail_fast=True`` makes the first round count: every subscribed topic must
        have a route, a replica of each of its broker groups must accept the heartbeat, and the first
        rebalance must complete — else the consumer is shut down again and ``start`` raises the
        ``ClientError`` that stopped it (its code: ``CONNECT_FAILED`` for an unreachable NameServer,
        the broker's refusal for a wrong secret, ``TOPIC_NOT_EXIST``...)."""
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
        self._retries = RetrySender(
            self._transport, self._routes, self.group, max_reconsume_times=self.max_reconsume_times,
            timeout_s=self.timeout_s,
        )
        self._positions = StartPositions(
            self._transport, self._routes, self._store, consume_from=self.consume_from,
            consume_timestamp_ms=self.consume_timestamp_ms, timeout_s=self.timeout_s,
        )
        self._slots = asyncio.Semaphore(self.max_concurrency)
        self._executor = concurrent.futures.ThreadPoolExecutor(self.max_concurrency, f"consume-{self.group}")
        if self.trace is not None:
            await self.trace.start()
        self._running = True
        try:
            complete = await self._first_round(fail_fast)
        except ClientError:
            await self.shutdown()
            raise
        if not complete:
            self._rebalance_wanted.set()
        loop = asyncio.get_running_loop()
        self._loops = [
            loop.create_task(self._routes.run()),
            loop.create_task(self._heartbeat_loop()),
            loop.create_task(self._rebalance_loop()),
            loop.create_task(self._commit_loop()),
        ]

    async def _first_round(self, fail_fast: bool) -> bool:
        """Routes, heartbeat and the first rebalance; with ``fail_fast`` the first error raises."""
        retry = retry_topic(self.group)
        for topic in sorted(self._subscriptions):
            try:
                await self.routes.get(topic)
            except ClientError as exc:
                if fail_fast and topic != retry:
                    raise
                level = logging.DEBUG if topic == retry else logging.WARNING  # the retry topic is made on demand
                log.log(level, "no route for %s yet (rebalance retries): %s", topic, exc)
        if not fail_fast:
            await self._heartbeat_once()
            complete, _error = await self._rebalance_once()
            return complete
        await self._heartbeat_checked()
        for _ in range(FAIL_FAST_ROUNDS):  # a round that found itself missing from the member list heartbeats again
            complete, error = await self._rebalance_once()
            if error is not None:
                raise error
            if complete:
                return True
        raise ClientError(
            "REBALANCE_INCOMPLETE",
            f"{self.client_id} was not in the consumer list of {self.group} after {FAIL_FAST_ROUNDS} rounds",
        )

    async def _heartbeat_checked(self) -> None:
        """The first heartbeat, demanding that a replica of every broker group of the subscribed
        topics accept it (a wrong secret or a refused group raises the broker's code)."""
        topics = sorted(self._subscriptions)
        body = {"client_id": self.client_id,
                "groups": [{"group": self.group, "topics": topics, "model": str(self.message_model)}]}
        for route in await self._subscribed_routes():
            for bd in route.broker_datas:
                addrs = self.routes.replicas(route, bd.broker_name)
                results = await asyncio.gather(
                    *(self.transport.call(a, "POST", "/v1/heartbeat", body, timeout_s=self.timeout_s) for a in addrs),
                    return_exceptions=True,
                )
                errors = [r for r in results if isinstance(r, BaseException)]
                if addrs and len(errors) == len(addrs):
                    first = errors[0]
                    if isinstance(first, ClientError):
                        raise first
                    raise ClientError("CONNECT_FAILED", f"heartbeat to {bd.broker_name}: {first!r}")

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
        if self.trace is not None:
            await self.trace.shutdown()
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
            await wait_event(
                self._rebalance_wanted, self.rebalance_interval_s if complete else REBALANCE_RETRY_S
            )
            self._rebalance_wanted.clear()
            try:
                complete, _error = await self._rebalance_once()
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
        return await known_routes(self.routes, sorted(self._subscriptions))

    async def _heartbeat_once(self) -> None:
        topics = sorted(self._subscriptions)
        groups = [{"group": self.group, "topics": topics, "model": str(self.message_model)}]
        await self._call_all("/v1/heartbeat", {"client_id": self.client_id, "groups": groups})

    async def _call_all(self, path: str, body: dict[str, Any]) -> None:
        """POST to every replica of every group of the subscribed topics; failures are logged."""
        await post_to_all(self.transport, all_addrs(await self._subscribed_routes()), path, body, self.timeout_s)

    async def _consumer_ids(self, route: TopicRoute) -> list[str]:
        return await group_consumer_ids(self.transport, self.routes, route, self.group, self.timeout_s)

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
    async def _rebalance_once(self) -> tuple[bool, ClientError | None]:
        """(complete, the first error): not complete when something failed, so the loop retries soon."""
        complete = await self._take_resets()
        complete &= await self._take_local_recreations()
        first_error: ClientError | None = None
        for topic, tags in sorted(self._subscriptions.items()):
            try:
                if topic == retry_topic(self.group) and self._retries and not await self._retries.route_current():
                    complete = False
                complete &= await self._rebalance_topic(topic, tags)
            except ClientError as exc:
                if topic == retry_topic(self.group) and exc.code in ("TOPIC_NOT_EXIST", "NO_ROUTE"):
                    log.debug("retry topic %s has no route yet: %s", topic, exc)
                    complete &= not (self._retries and self._retries.brokers)  # created by a send-back: soon routed
                    continue
                log.warning("rebalance of %s failed: %s", topic, exc)
                complete = False
                first_error = first_error or exc
        return complete, first_error

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
                start, epoch = await self.positions.start_offset(mq)
            except ClientError as exc:
                log.warning("no start offset for %s yet: %s", mq, exc)
                complete = False
                continue
            if not self._running:
                break
            worker = QueueWorker(self, mq, start, tags, epoch)
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

    # -- topic re-creation ----------------------------------------------------------------------------
    def _topic_recreated(self, mq: MessageQueue, epoch: int) -> None:
        """A pull answer of ``mq`` named a newer topic epoch than its worker started with."""
        store = self._store
        if isinstance(store, RemoteOffsetStore):
            store.topic_recreated(mq, epoch)  # stale: the rebalance loop restarts the key's queues
        elif self.positions.note_recreated(mq, epoch):
            log.warning("%s: topic %s was deleted and created again (epoch %d): restarting its queues",
                        mq, mq.topic, epoch)
            self._local_restart.add((mq.topic, mq.broker_name))
        self._rebalance_wanted.set()

    async def _take_local_recreations(self) -> bool:
        """Broadcasting: restart the queues of re-created topics at the new queues' minimum."""
        complete = True
        for key in sorted(self._local_restart):
            self._local_restart.discard(key)
            mqs = sorted(mq for mq in self._workers if (mq.topic, mq.broker_name) == key)
            await asyncio.gather(*(self._drop_worker(mq) for mq in mqs))
            self.positions.restart_from_min(mqs)
            if key[0] in self._subscriptions and self._running:
                complete &= await self._start_workers(mqs, self._subscriptions[key[0]])
        return complete

    # -- retries (clustering): back to the broker ------------------------------------------------------
    async def _send_back(
        self, mq: MessageQueue, msgs: list[MessageExt], *, dlq: bool = False
    ) -> list[MessageExt]:
        """Send failed messages back (broker/client/retry_sender.py); returns those not taken."""
        assert self._retries is not None
        failed = await self._retries.send(mq, msgs, dlq=dlq)
        retry_groups = {w.broker_name for w in self._workers if w.topic == retry_topic(self.group)}
        if not self._retries.brokers <= retry_groups:
            self._rebalance_wanted.set()  # the retry topic may exist now: take its queues
        return failed

    # -- listener calls -------------------------------------------------------------------------------
    async def _invoke(self, msgs: list[MessageExt], ctx: ConsumeContext) -> ConsumeStatus:
        assert self._listener is not None and self._executor is not None
        if self.trace is None:
            return await invoke_listener(self._listener, self._executor, msgs, ctx)
        loop, time_ms = asyncio.get_running_loop(), wall_ms()
        started = loop.time()
        status = await invoke_listener(self._listener, self._executor, msgs, ctx)
        cost_ms = round((loop.time() - started) * 1000)
        self.trace.append(consume_records(self.group, msgs, status, time_ms=time_ms, cost_ms=cost_ms,
                                          client_host=self.client_id))
        return status
