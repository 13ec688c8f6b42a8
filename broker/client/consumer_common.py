"""What the push consumer, its per-queue workers and the pull consumer share: the listener's
context and answers, the consumer statistics, and the broker calls both consumers make (pull,
queue status, offset search, the group's consumer list, send-back). Plain functions over a
``Transport`` and a ``RouteCache``; the consumers own every piece of state.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
import itertools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from broker.client.message import (
    ConsumeStatus,
    MessageExt,
    MessageQueue,
    PullResult,
    local_ip,
    pull_request,
    pull_result_from_answer,
)
from broker.client.route_cache import RouteCache, call_replicas
from broker.client.transport import ClientError, TopicRoute, Transport
from broker.protocol.frames import Op

log = logging.getLogger(__name__)

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


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """True when ``event`` is set within ``timeout_s``."""
    # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that arrives just
    # as the event is set, and the loop calling this would then outlive shutdown().
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
        return True
    except TimeoutError:
        return False


async def invoke_listener(
    listener: Listener,
    executor: concurrent.futures.Executor,
    msgs: list[MessageExt],
    ctx: ConsumeContext,
) -> ConsumeStatus:
    """One listener call: async listeners on the loop, sync ones in ``executor``; an exception
    counts as ``RECONSUME_LATER``."""
    try:
        if inspect.iscoroutinefunction(listener) or inspect.iscoroutinefunction(
            getattr(listener, "__call__", None)  # noqa: B004 - async callable objects
        ):
            out = await listener(msgs, ctx)
        else:
            loop = asyncio.get_running_loop()
            out = await loop.run_in_executor(executor, listener, msgs, ctx)
            if inspect.isawaitable(out):
                out = await out
    except Exception:
        log.exception("listener failed on %d message(s) of %s", len(msgs), ctx.message_queue)
        return ConsumeStatus.RECONSUME_LATER
    return normalise_status(out)


# -- broker calls ----------------------------------------------------------------------------------
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
    answer = await transport.operation(addr, Op.PULL, body, timeout_s=suspend_ms / 1000 + timeout_s)
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


async def known_routes(routes: RouteCache, topics: Sequence[str]) -> list[TopicRoute]:
    """The routes of ``topics`` (cached, else fetched); a topic without a route yet is left out."""
    out: list[TopicRoute] = []
    for topic in topics:
        route = routes.cached(topic)
        if route is None:
            try:
                route = await routes.get(topic)
            except ClientError:
                continue
        out.append(route)
    return out


async def post_to_all(
    transport: Transport, addrs: Sequence[str], path: str, body: Mapping[str, Any], timeout_s: float
) -> None:
    """POST ``body`` to every address at once; failures are logged (heartbeats, unregistering)."""
    results = await asyncio.gather(
        *(transport.call(a, "POST", path, body, timeout_s=timeout_s) for a in addrs), return_exceptions=True
    )
    for addr, res in zip(addrs, results, strict=True):
        if isinstance(res, BaseException):
            log.debug("%s to %s failed: %s", path, addr, res)


async def group_consumer_ids(
    transport: Transport, routes: RouteCache, route: TopicRoute, group: str, timeout_s: float
) -> list[str]:
    """The group's consumer ids, the union of what one replica of each broker group knows."""
    ids: set[str] = set()
    answered = False
    path = f"/v1/groups/{quote(group, safe='')}/consumers"
    for bd in route.broker_datas:
        try:
            _, answer = await call_replicas(
                transport, routes.replicas(route, bd.broker_name), "GET", path, timeout_s=timeout_s
            )
        except ClientError as exc:
            log.debug("consumer list from %s failed: %s", bd.broker_name, exc)
            continue
        answered = True
        ids.update(str(c) for c in answer.get("client_ids") or ())
    if not answered:
        raise ClientError("NO_ROUTE", f"no broker of {route.topic} answered the consumer list of {group}")
    return sorted(ids)
