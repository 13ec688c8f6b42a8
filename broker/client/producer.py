"""The producer: picks a queue, sends to its group's leader, retries elsewhere (RocketMQ's
``DefaultMQProducer`` over the v1 HTTP API).

One send, step by step::

    set unique ids (once) ─▶ route (cached ≤ 30 s) ─▶ pick a queue ─▶ POST /v1/send to the leader
                                   ▲                    (avoid the group      │
                                   │                     that just failed)    ├─ NOT_LEADER + leader_addr:
                                   │                                          │   follow at once (no retry)
                                   └── refresh on NOT_READY / CONNECT_FAILED ─┤
                                       / TIMEOUT, then retry (≤ 2, sync)      └─ SEND_OK ─▶ SendResult

- ``timeout_s`` (3 s) bounds the whole send, retries included (RocketMQ's semantics).
- Every attempt of one message carries the same ``unique_id``. With ``enable_idempotence`` (the
  default) an attempt whose outcome is unknown (a timeout, a lost connection, a failover) is retried
  on the same queue, whose broker group keeps a de-duplication window by unique id
  (broker/store/dedup.py): the retry is stored once and answered with the first attempt's result.
  Without it, the retry goes to another group and may be stored twice (consumers can tell).
- With ``queue=`` or ``selector=``, retries go to that same queue (after a route refresh) so per-key
  order holds; RocketMQ would not retry at all there.
- Auto-batching (``batch_max_delay_ms``, 1 ms; 0 = off; broker/client/autobatch.py): concurrent
  single sends to one broker group's queues of a topic share one request (each message keeps its
  queue); each caller gets its own result or error.
- ``send_async`` / ``send_oneway`` run as tasks; at most ``async_in_flight_max`` at a time (over
  that: ``BUSY`` at once, no unbounded backlog). One-way sends make one attempt; errors are logged.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from broker.client.autobatch import (
    BATCH_MAX_BYTES_DEFAULT,
    BATCH_MAX_COUNT_DEFAULT,
    BATCH_MAX_DELAY_MS_DEFAULT,
    AutoBatcher,
    batchable,
)
from broker.client.latency import FaultStrategy
from broker.client.message import (
    Message,
    MessageQueue,
    SendResult,
    UniqueIdGenerator,
    check_batch,
    check_group,
    local_ip,
    send_request,
    send_result_from_answer,
)
from broker.client.route_cache import RouteCache, call_leader, publish_queues
from broker.client.selector import QueueSelector, RoundRobinSelector
from broker.client.trace import (
    TRACE_PRODUCER_PREFIX,
    TRACE_TOPIC_DEFAULT,
    TraceDispatcher,
    send_records,
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
from broker.protocol.frames import Op
from broker.protocol.routes import PERM_READ, PERM_WRITE, QueueData

log = logging.getLogger(__name__)

DEFAULT_TOPIC = "TBW102"  # RocketMQ's template topic for auto-created topics
DEFAULT_TOPIC_QUEUE_NUMS = 4
RETRY_PAUSE_MAX_S = 1.0
PUBLISHABLE_TOPICS_MAX = 1024  # topics whose writable queue list a producer keeps
DISCOVERY_STEP_S = 0.1  # how often a paused retry asks the group's replicas for the new leader

# Errors that say the cached route may be wrong: refresh it before the next attempt.
REFRESH_CODES = frozenset(
    {
        "NOT_READY",
        "CONNECT_FAILED",
        "CONNECTION_LOST",
        "TIMEOUT",
        "SEND_TIMEOUT",
        "NO_LEADER",
        "NO_ROUTE",
        "NOT_LEADER",
        "SHUTTING_DOWN",
        "TOPIC_NOT_EXIST",
    }
)
# Errors where the same group may answer differently a moment later (a leader being elected).
PAUSE_CODES = frozenset(
    {
        "BUSY",
        "NOT_READY",
        "NO_LEADER",
        "NO_ROUTE",
        "SHUTTING_DOWN",
        "CONNECT_FAILED",
        "CONNECTION_LOST",
        "NOT_LEADER",
        "APPEND_FAILED",
    }
)

SendCallback = Callable[[SendResult | None, BaseException | None], Any]


def send_outcome_unknown(earlier_unknown: bool, exc: ClientError) -> bool:
    """Whether a send whose latest attempt failed with ``exc`` may have stored its messages: when
    that attempt's outcome is unknown, or any earlier attempt's was (``earlier_unknown``). A send is
    reported as definitely failed only when no attempt can have stored it."""
    return earlier_unknown or exc.outcome_unknown


class Producer:
    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] | None = None,
        *,
        send_timeout_s: float = 3.0,
        retry_times: int = 2,
        send_latency_fault_enable: bool = False,
        route_refresh_interval_s: float = 30.0,
        async_in_flight_max: int = 4096,
        transport: Transport | None = None,
        credentials: CredentialsArg = FROM_ENV,
        tls: TlsArg = FROM_ENV,
        clock_ms: Callable[[], int] | None = None,
        rng: random.Random | None = None,
        unique_ids: UniqueIdGenerator | None = None,
        born_host: str | None = None,
        enable_idempotence: bool = True,
        batch_max_delay_ms: float = BATCH_MAX_DELAY_MS_DEFAULT,
        batch_max_count: int = BATCH_MAX_COUNT_DEFAULT,
        batch_max_bytes: int = BATCH_MAX_BYTES_DEFAULT,
        enable_msg_trace: bool = False,
        trace_topic: str = TRACE_TOPIC_DEFAULT,
    ):
        assert 0 <= retry_times <= 16, "retry_times is bounded"
        assert batch_max_delay_ms >= 0, "batch_max_delay_ms: 0 turns auto-batching off"
        assert async_in_flight_max > 0
        self.group = check_group(group)
        self.namesrv_addrs = namesrv
        self.send_timeout_s = send_timeout_s
        self.retry_times = retry_times
        self.enable_idempotence = enable_idempotence
        self.route_refresh_interval_s = route_refresh_interval_s
        self.async_in_flight_max = async_in_flight_max
        self._transport = transport
        self._own_transport = transport is None
        # ACL credentials and TLS (docs/SECURITY.md): explicit, else from the environment.
        self._credentials, self._tls = resolve_security(credentials, tls)
        fault_kwargs: dict[str, Any] = {"rng": rng}
        if clock_ms is not None:
            fault_kwargs["clock_ms"] = clock_ms
        self._fault = FaultStrategy(send_latency_fault_enable, **fault_kwargs)
        self._round_robin = RoundRobinSelector(rng)
        # topic -> (the route object, its writable queues): routes are immutable and replaced on a
        # refresh, so the queue list is computed once per route, not once per send
        self._publishable: dict[str, tuple[TopicRoute, list[MessageQueue]]] = {}
        self._ids = unique_ids or UniqueIdGenerator()
        self._born_host = born_host or local_ip()
        self._routes: RouteCache | None = None
        self._namesrv: NamesrvClient | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._refresher: asyncio.Task[None] | None = None
        self._running = False
        # Auto-batching (broker/client/autobatch.py): concurrent single sends to one group's queues
        # share a request; batch_max_delay_ms=0 turns it off.
        self._batcher = AutoBatcher(
            self._send_items, max_delay_ms=batch_max_delay_ms, max_count=batch_max_count, max_bytes=batch_max_bytes
        ) if batch_max_delay_ms > 0 else None
        # Message trace (broker/client/trace.py): records go out through a producer of their own.
        self.trace_topic = trace_topic
        self.trace: TraceDispatcher | None = None
        if enable_msg_trace:
            inner = Producer(TRACE_PRODUCER_PREFIX + self.group, namesrv, send_timeout_s=send_timeout_s,
                             credentials=self._credentials, tls=self._tls)
            self.trace = TraceDispatcher(inner, trace_topic)

    # -- life cycle -----------------------------------------------------------------------------------
    @property
    def send_latency_fault_enable(self) -> bool:
        return self._fault.enabled

    @send_latency_fault_enable.setter
    def send_latency_fault_enable(self, value: bool) -> None:
        self._fault.enabled = value

    @property
    def routes(self) -> RouteCache:
        assert self._routes is not None, "start() the producer first"
        return self._routes

    @property
    def fault_strategy(self) -> FaultStrategy:
        return self._fault

    async def start(self) -> None:
        if self._running:
            return
        if self._transport is None:
            self._transport = Transport(self.send_timeout_s, credentials=self._credentials, tls=self._tls)
        self._namesrv = NamesrvClient(self.namesrv_addrs, self._transport)
        self._routes = RouteCache(
            self._namesrv,
            refresh_interval_s=self.route_refresh_interval_s,
            timeout_s=self.send_timeout_s,
            fallback=self._new_topic_route,
        )
        self._refresher = asyncio.get_running_loop().create_task(self._routes.run())
        if self.trace is not None:
            await self.trace.start()
        self._running = True

    async def shutdown(self) -> None:
        """Waits (bounded) for async and one-way sends in flight, then closes connections."""
        if not self._running:
            return
        self._running = False
        pending = list(self._tasks)
        if pending:
            _done, left = await asyncio.wait(pending, timeout=self.send_timeout_s + 1.0)
            for t in left:
                t.cancel()
            await asyncio.gather(*left, return_exceptions=True)
        if self._batcher is not None:
            await self._batcher.close()
        if self.trace is not None:
            await self.trace.shutdown()
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
        if self._routes is not None:
            await self._routes.close()
        if self._own_transport and self._transport is not None:
            await self._transport.close()
            self._transport = None

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def _check_running(self) -> None:
        if not self._running:
            raise ClientError("NOT_STARTED", f"producer {self.group} is not started")

    # -- sends ----------------------------------------------------------------------------------------
    async def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
        timeout_s: float | None = None,
    ) -> SendResult:
        """A synchronous send: returns once the group's majority stored it."""
        self._check_running()
        topic = self._prepare([msg])
        return await self._send([msg], topic, queue, selector, arg, timeout_s, self.retry_times)

    async def send_batch(
        self,
        msgs: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
        timeout_s: float | None = None,
    ) -> SendResult:
        """Messages of one topic in one request, to one queue (the selector sees the first)."""
        self._check_running()
        msgs = list(msgs)
        topic = self._prepare(msgs)
        return await self._send(msgs, topic, queue, selector, arg, timeout_s, self.retry_times)

    def send_async(
        self,
        msg: Message,
        callback: SendCallback | None = None,
        *,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
        timeout_s: float | None = None,
    ) -> asyncio.Task[SendResult]:
        """Start a send; the task's result is the SendResult. ``callback(result, error)`` (sync or
        async) runs when it ends. Call from the producer's event loop."""
        self._check_running()
        topic = self._prepare([msg])
        self._check_capacity()
        coro = self._send([msg], topic, queue, selector, arg, timeout_s, self.retry_times)
        return self._spawn(self._with_callback(coro, callback))

    def send_oneway(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
    ) -> None:
        """Fire and forget: one attempt in the background; a failure is only logged."""
        self._check_running()
        topic = self._prepare([msg])
        self._check_capacity()
        self._spawn(self._oneway(msg, topic, queue, selector, arg))

    async def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        self._check_running()
        return publish_queues(await self.routes.get(topic))

    # -- internals ------------------------------------------------------------------------------------
    def _prepare(self, msgs: list[Message]) -> str:
        topic = check_batch(msgs)
        for m in msgs:
            if m.unique_id is None:
                m.unique_id = self._ids.next()
        return topic

    def _check_capacity(self) -> None:
        if len(self._tasks) >= self.async_in_flight_max:
            raise ClientError(
                "BUSY", f"{len(self._tasks)} async sends in flight (max {self.async_in_flight_max})"
            )

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_mark_retrieved)
        return task

    async def _with_callback(self, coro: Any, callback: SendCallback | None) -> SendResult:
        try:
            result: SendResult = await coro
        except Exception as exc:
            await _run_callback(callback, None, exc)
            raise
        await _run_callback(callback, result, None)
        return result

    async def _oneway(
        self, msg: Message, topic: str, queue: MessageQueue | None, selector: QueueSelector | None, arg: Any
    ) -> None:
        try:
            await self._send([msg], topic, queue, selector, arg, None, 0)
        except Exception as exc:
            log.warning("one-way send of %s to %s failed: %s", msg.unique_id, topic, exc)

    def _publish_queues(self, topic: str, route: TopicRoute) -> list[MessageQueue]:
        """``publish_queues(route)``, computed once per route object (read-only: do not change it)."""
        cached = self._publishable.get(topic)
        if cached is not None and cached[0] is route:
            return cached[1]
        mqs = publish_queues(route)
        if len(self._publishable) >= PUBLISHABLE_TOPICS_MAX and topic not in self._publishable:
            self._publishable.clear()  # bounded: a producer sending to very many topics recomputes
        self._publishable[topic] = (route, mqs)
        return mqs

    async def _send(
        self,
        msgs: list[Message],
        topic: str,
        queue: MessageQueue | None,
        selector: QueueSelector | None,
        arg: Any,
        timeout_s: float | None,
        retries: int,
        target: Op | str = Op.SEND,  # TransactionProducer's halves: "/v1/transaction/half"
    ) -> SendResult:
        loop = asyncio.get_running_loop()
        timeout_s = self.send_timeout_s if timeout_s is None else timeout_s
        deadline = loop.time() + timeout_s
        born_ts = time.time_ns() // 1_000_000
        started = loop.time()
        fixed = queue
        last_broker: str | None = None
        last_exc: ClientError | None = None
        maybe_stored = False  # an attempt whose outcome is unknown may have stored the messages
        for attempt in range(1 + retries):
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                break
            mq: MessageQueue | None = None
            try:
                route = await self.routes.get(topic, remaining_s)
                if fixed is None:
                    mqs = self._publish_queues(topic, route)
                    if not mqs:
                        raise ClientError("NO_ROUTE", f"no writable queue of {topic} has a leader")
                    if selector is not None:
                        fixed = selector(list(mqs), msgs[0], arg)  # a copy: user code may change it
                    if fixed is None and last_broker is None and not self._fault.enabled:
                        # what _fault.select (select_avoiding, no group to avoid) picks: round robin
                        mq = mqs[self._round_robin.next_index(topic) % len(mqs)]
                    else:
                        next_index = functools.partial(self._round_robin.next_index, topic)
                        mq = fixed or self._fault.select(mqs, next_index, last_broker)
                else:
                    mq = fixed
                result = await self._send_to(mq, msgs, born_ts, deadline, target)
                if self.trace is not None and topic != self.trace_topic and target is Op.SEND:
                    self._trace_send(msgs, result, born_ts, loop.time() - started)
                return result
            except ClientError as exc:
                if self.enable_idempotence and exc.outcome_unknown and fixed is None and mq is not None:
                    fixed = mq  # where it may be stored: that group's window answers the retry
                maybe_stored = send_outcome_unknown(maybe_stored, exc)
                exc.outcome_unknown = maybe_stored
                if not exc.retryable:
                    raise
                last_exc = exc
                last_broker = mq.broker_name if mq is not None else last_broker
                out_of_time = deadline - loop.time() <= 0
                if exc.code in REFRESH_CODES and (attempt >= retries or out_of_time):
                    self.routes.refresh_in_background(topic)  # for the next send
                if attempt >= retries or out_of_time:
                    break
                log.info(
                    "send to %s failed (%s), attempt %d of %d", mq or topic, exc, attempt + 1, 1 + retries
                )
                await self._before_retry(
                    topic, exc, deadline, retries - attempt, last_broker, fixed is not None
                )
        if last_exc is None:
            raise ClientError("TIMEOUT", f"send to {topic} found no time left within {timeout_s} s")
        raise last_exc

    async def _send_to(
        self, mq: MessageQueue, msgs: list[Message], born_ts: int, deadline: float, target: Op | str = Op.SEND
    ) -> SendResult:
        body = send_request(mq, msgs, producer_group=self.group, born_ts=born_ts, born_host=self._born_host)
        if target is Op.SEND and self._batcher is not None and len(msgs) == 1 and batchable(msgs[0]):
            return await self._batcher.send(mq, body["messages"][0], deadline)
        return send_result_from_answer(await self._send_body(mq, body, deadline, target), mq)

    async def _send_items(self, mq: MessageQueue, items: list[dict[str, Any]], deadline: float) -> Any:
        """One auto-batch: the messages of several callers in one request (its answer, whole)."""
        body = {"topic": mq.topic, "queue_id": mq.queue_id, "producer_group": self.group, "messages": items}
        return await self._send_body(mq, body, deadline)

    async def _send_body(
        self, mq: MessageQueue, body: dict[str, Any], deadline: float, target: Op | str = Op.SEND
    ) -> Any:
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            answer = await call_leader(
                self._transport_checked(),
                self.routes,
                mq.topic,
                mq.broker_name,
                target,
                body,
                timeout_s=max(deadline - start, 0.001),
            )
        except ClientError as exc:
            self._fault.update(mq.broker_name, (loop.time() - start) * 1000, isolation=exc.retryable)
            raise
        self._fault.update(mq.broker_name, (loop.time() - start) * 1000, isolation=False)
        return answer

    async def _before_retry(
        self,
        topic: str,
        exc: ClientError,
        deadline: float,
        retries_left: int,
        last_broker: str | None,
        pinned: bool,
    ) -> None:
        """Refresh the route when it may be stale; when the next attempt can only go back to the
        group that just failed (one group, or a fixed queue), spread the remaining attempts over
        the time left — a leader election takes a moment, and instant retries would all fail."""
        loop = asyncio.get_running_loop()
        if exc.code in REFRESH_CODES and deadline - loop.time() > 0:
            try:
                await self.routes.refresh(topic, deadline - loop.time())
            except ClientError as refresh_exc:
                log.debug("route refresh of %s failed: %s", topic, refresh_exc)
        if exc.code not in PAUSE_CODES:
            return
        route = self.routes.cached(topic)
        groups = {mq.broker_name for mq in publish_queues(route)} if route is not None else set()
        if not pinned and groups - {last_broker}:
            return  # the retry goes to another group: at once
        pause_s = min(RETRY_PAUSE_MAX_S, max(deadline - loop.time(), 0.0) / (retries_left + 1))
        if route is None or last_broker is None:
            await asyncio.sleep(pause_s)
            return
        # Look for the new leader among the group's replicas rather than sleeping blindly: a
        # failover is over as soon as one of them is writable (typically well under a second).
        until = loop.time() + pause_s
        while True:
            step_s = min(DISCOVERY_STEP_S, max(until - loop.time(), 0.0))
            if step_s <= 0:
                return
            started = loop.time()
            if await self.routes.discover_leader(self._transport_checked(), route, last_broker, step_s):
                return
            await asyncio.sleep(max(0.0, step_s - (loop.time() - started)))

    def _trace_send(self, msgs: list[Message], result: SendResult, born_ts: int, cost_s: float) -> None:
        assert self.trace is not None
        route = self.routes.cached(result.message_queue.topic)
        broker_name = result.message_queue.broker_name
        store_host = (self.routes.leader_addr(route, broker_name) if route else None) or broker_name
        self.trace.append(send_records(self.group, msgs, result, time_ms=born_ts, cost_ms=round(cost_s * 1000),
                                       store_host=store_host, client_host=self._born_host))

    def _transport_checked(self) -> Transport:
        assert self._transport is not None
        return self._transport

    async def _new_topic_route(self, topic: str) -> TopicRoute | None:
        """A topic the NameServers do not know yet: send where the broker would auto-create it —
        the groups of ``TBW102`` (RocketMQ's way), else every group with a leader, 4 queues each."""
        assert self._namesrv is not None
        try:
            template = await self._namesrv.route(DEFAULT_TOPIC)
            return TopicRoute(
                topic=topic,
                queue_datas=tuple(
                    QueueData(
                        q.broker_name,
                        min(q.read_queue_nums, DEFAULT_TOPIC_QUEUE_NUMS),
                        min(q.write_queue_nums, DEFAULT_TOPIC_QUEUE_NUMS),
                        q.perm,
                    )
                    for q in template.queue_datas
                ),
                broker_datas=template.broker_datas,
            )
        except ClientError as exc:
            if exc.code != "TOPIC_NOT_EXIST":
                raise
        info = await self._namesrv.clusters()
        brokers = [bd for _name, bd in sorted(info.brokers.items()) if bd.leader_addr is not None]
        if not brokers:
            return None
        n = DEFAULT_TOPIC_QUEUE_NUMS
        return TopicRoute(
            topic=topic,
            queue_datas=tuple(QueueData(b.broker_name, n, n, PERM_READ | PERM_WRITE) for b in brokers),
            broker_datas=tuple(brokers),
        )


async def _run_callback(
    callback: SendCallback | None, result: SendResult | None, exc: BaseException | None
) -> None:
    if callback is None:
        return
    try:
        out = callback(result, exc)
        if inspect.isawaitable(out):
            await out
    except Exception:
        log.exception("send callback failed")


def _mark_retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
