"""Topic routes as clients use them: a per-topic cache over the NameServers, and the queue math.

Invariants:
- Publish candidates are the queues of groups whose route names a leader (``broker_addrs[0]``)
  and grants write permission: ids ``0..write_queue_nums-1`` per group, sorted by
  (broker_name, queue_id). Subscribe queues need read permission: ids ``0..read_queue_nums-1``
  (any replica serves committed reads, so no leader is needed).
- A cached route is served until it is ``refresh_interval_s`` old; then (and whenever a caller
  saw a failure) it is fetched again. Fetches of one topic are coalesced into one request. A
  failed refresh keeps the old route: stale beats nothing.
- A *leader hint* is what a broker said in a ``NOT_LEADER`` answer; it overrides the route's
  leader of that group until the route agrees with it or the hinted address fails.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from broker.client.message import MessageQueue
from broker.client.transport import ClientError, NamesrvClient, TopicRoute, Transport
from broker.protocol.frames import Op
from broker.protocol.routes import PERM_READ, PERM_WRITE, BrokerData

log = logging.getLogger(__name__)

# Answers that another replica would give just the same: asking it is pointless.
FINAL_CODES_STATUS = (400, 403, 404, 413)

RouteFallback = Callable[[str], Awaitable[TopicRoute | None]]


def publish_queues(route: TopicRoute) -> list[MessageQueue]:
    out: list[MessageQueue] = []
    for qd in route.queue_datas:
        bd = route.broker(qd.broker_name)
        if not qd.perm & PERM_WRITE or bd is None or bd.leader_addr is None:
            continue
        out.extend(MessageQueue(route.topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
    return sorted(out)


def subscribe_queues(route: TopicRoute) -> list[MessageQueue]:
    out: list[MessageQueue] = []
    for qd in route.queue_datas:
        if qd.perm & PERM_READ:
            out.extend(MessageQueue(route.topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
    return sorted(out)


def replica_addrs(bd: BrokerData | None) -> list[str]:
    """Every address of a group, the leader (id 0) first, then followers by id."""
    return [] if bd is None else bd.addrs_leader_first()


def read_order(addrs: list[str], *, from_followers: bool, spread: int) -> list[str]:
    """The replicas a reader tries, in order. ``addrs`` is leader first (``RouteCache.replicas``).
    Leader reads keep that order. Follower reads (RocketMQ's slave reads: committed data only, so
    consumption does not load the leader) put one follower first — picked by ``spread`` (e.g. the
    queue id) so the queues of a group spread over its followers — then the other followers, then
    the leader as the fallback."""
    if not from_followers or len(addrs) < 2:
        return list(addrs)
    followers = addrs[1:]
    k = spread % len(followers)
    return [*followers[k:], *followers[:k], addrs[0]]


def all_addrs(routes: list[TopicRoute]) -> list[str]:
    seen: dict[str, None] = {}
    for route in routes:
        for bd in route.broker_datas:
            for addr in replica_addrs(bd):
                seen.setdefault(addr)
    return list(seen)


@dataclasses.dataclass
class _Entry:
    route: TopicRoute
    fetched_at_s: float


class RouteCache:
    def __init__(
        self,
        namesrv: NamesrvClient,
        *,
        refresh_interval_s: float = 30.0,
        timeout_s: float = 3.0,
        clock_s: Callable[[], float] = time.monotonic,
        fallback: RouteFallback | None = None,
    ):
        self.namesrv = namesrv
        self.refresh_interval_s = refresh_interval_s
        self.timeout_s = timeout_s
        self._clock_s = clock_s
        self._fallback = fallback
        self._entries: dict[str, _Entry] = {}
        self._inflight: dict[str, asyncio.Task[TopicRoute]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._hints: dict[str, str] = {}
        self.fetches = 0  # NameServer lookups made (tests and stats)

    # -- reading ----------------------------------------------------------------------------------
    def cached(self, topic: str) -> TopicRoute | None:
        entry = self._entries.get(topic)
        return entry.route if entry else None

    def topics(self) -> list[str]:
        return sorted(self._entries)

    async def get(self, topic: str, timeout_s: float | None = None) -> TopicRoute:
        entry = self._entries.get(topic)
        if entry is not None and self._clock_s() - entry.fetched_at_s < self.refresh_interval_s:
            return entry.route
        try:
            return await self.refresh(topic, timeout_s)
        except ClientError:
            if entry is not None:
                return entry.route
            raise

    def leader_addr(self, route: TopicRoute, broker_name: str) -> str | None:
        hint = self._hints.get(broker_name)
        if hint is not None:
            return hint
        bd = route.broker(broker_name)
        return bd.leader_addr if bd else None

    def replicas(self, route: TopicRoute, broker_name: str) -> list[str]:
        """Addresses to try for reads: the (hinted) leader first, then the followers."""
        addrs = replica_addrs(route.broker(broker_name))
        hint = self._hints.get(broker_name)
        if hint is not None:
            addrs = [hint, *(a for a in addrs if a != hint)]
        return addrs

    # -- leader hints -----------------------------------------------------------------------------
    def note_leader(self, broker_name: str, addr: str) -> None:
        self._hints[broker_name] = addr

    def forget_leader(self, broker_name: str, addr: str) -> None:
        if self._hints.get(broker_name) == addr:
            del self._hints[broker_name]

    async def discover_leader(
        self, transport: Transport, route: TopicRoute, broker_name: str, timeout_s: float
    ) -> str | None:
        """Ask the group's replicas (``/v1/status``) which one is the writable leader, and hint it.

        After a leader dies, the NameServers name it until the new leader registers; the surviving
        replicas know the new leader as soon as it is elected and ready."""
        addrs = replica_addrs(route.broker(broker_name))
        hint = self._hints.get(broker_name)
        if hint is not None and hint not in addrs:
            addrs.append(hint)
        if not addrs:
            return None

        async def ask(addr: str) -> str | None:
            try:
                st = await transport.call(addr, "GET", "/v1/status", timeout_s=timeout_s)
            except ClientError:
                return None
            if isinstance(st, dict) and st.get("writable") and st.get("broker_name") == broker_name:
                return addr
            return None

        for found in await asyncio.gather(*(ask(a) for a in addrs)):
            if found is not None:
                self.note_leader(broker_name, found)
                return found
        return None

    # -- refreshing -------------------------------------------------------------------------------
    async def refresh(self, topic: str, timeout_s: float | None = None) -> TopicRoute:
        task = self._inflight.get(topic)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._fetch(topic, timeout_s))
            self._inflight[topic] = task
            task.add_done_callback(lambda _t: self._inflight.pop(topic, None))
            task.add_done_callback(_retrieve)
        return await asyncio.shield(task)

    def refresh_in_background(self, topic: str) -> None:
        if topic in self._inflight:
            return
        task = asyncio.get_running_loop().create_task(self._refresh_quietly(topic))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _refresh_quietly(self, topic: str) -> None:
        try:
            await self.refresh(topic)
        except ClientError as exc:
            log.debug("route refresh of %s failed: %s", topic, exc)

    async def _fetch(self, topic: str, timeout_s: float | None) -> TopicRoute:
        self.fetches += 1
        try:
            route = await self.namesrv.route(topic, timeout_s or self.timeout_s)
        except ClientError as exc:
            if exc.code != "TOPIC_NOT_EXIST" or self._fallback is None:
                raise
            old = self._entries.get(topic)
            if old is not None:
                return old.route  # an earlier fallback route: keep it until the NameServer knows the topic
            fallback = await self._fallback(topic)
            if fallback is None:
                raise
            route = fallback
        self._store(topic, route)
        return route

    def _store(self, topic: str, route: TopicRoute) -> None:
        self._entries[topic] = _Entry(route, self._clock_s())
        for bd in route.broker_datas:
            hint = self._hints.get(bd.broker_name)
            if hint is not None and bd.leader_addr == hint:
                del self._hints[bd.broker_name]  # the route caught up

    async def run(self) -> None:
        """Refresh every cached topic every ``refresh_interval_s`` (RocketMQ's 30 s route poll)."""
        while True:
            await asyncio.sleep(self.refresh_interval_s)
            for topic in self.topics():
                await self._refresh_quietly(topic)

    async def close(self) -> None:
        tasks = [*self._inflight.values(), *self._background]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # marks it retrieved: the awaiting callers see it


async def call_replicas(
    transport: Transport,
    addrs: list[str],
    method: str,
    path: str,
    *,
    body: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    timeout_s: float | None = None,
) -> tuple[str, Any]:
    """Ask each address in turn until one answers; a definite answer (4xx but 409) ends the search.
    Returns (the address that answered, the answer)."""
    if not addrs:
        raise ClientError("NO_ROUTE", f"no broker address for {path}")
    last: ClientError | None = None
    for addr in addrs:
        try:
            return addr, await transport.call(addr, method, path, body, params=params, timeout_s=timeout_s)
        except ClientError as exc:
            if exc.status in FINAL_CODES_STATUS:
                raise
            last = exc
    assert last is not None
    raise last


async def call_leader(
    transport: Transport,
    routes: RouteCache,
    topic: str,
    broker_name: str,
    target: Op | str,
    body: Mapping[str, Any],
    *,
    timeout_s: float = 3.0,
    leader_hops_max: int = 2,
) -> Any:
    """A write to a group's leader — a data-path operation (``Op.SEND``) or another POST route of the
    HTTP API (a path) — following ``NOT_LEADER`` answers that name the leader (at most
    ``leader_hops_max`` hops, all within ``timeout_s``). A refused leader or a ``NOT_LEADER``
    without a name refreshes the route in the background."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    route = await routes.get(topic, timeout_s)
    addr = routes.leader_addr(route, broker_name)
    if addr is None:
        routes.refresh_in_background(topic)
        raise ClientError("NO_LEADER", f"the route of {topic} names no leader for {broker_name}")
    hops = 0
    while True:
        remaining_s = deadline - loop.time()
        if remaining_s <= 0:
            raise ClientError("TIMEOUT", f"no answer within {timeout_s} s", addr=addr)
        try:
            if isinstance(target, Op):
                return await transport.operation(addr, target, body, timeout_s=remaining_s)
            return await transport.call(addr, "POST", target, body, timeout_s=remaining_s)
        except ClientError as exc:
            if (
                exc.code == "NOT_LEADER"
                and exc.leader_addr
                and exc.leader_addr != addr
                and hops < leader_hops_max
            ):
                hops += 1
                routes.note_leader(broker_name, exc.leader_addr)
                routes.refresh_in_background(topic)
                addr = exc.leader_addr
                continue
            if exc.code in ("CONNECT_FAILED", "NOT_LEADER"):
                routes.forget_leader(broker_name, addr)
                routes.refresh_in_background(topic)
            raise
