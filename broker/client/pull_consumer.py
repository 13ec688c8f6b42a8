"""The pull consumer: the caller lists queues, pulls at offsets and keeps offsets (remote, for its
group); RocketMQ's ``DefaultMQPullConsumer`` over the v1 HTTP API. Pulls go to the leader first,
else to a follower (any replica serves committed reads).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from broker.client.consumer_common import pull_from, queue_min_max, search_offset_at
from broker.client.message import MessageQueue, PullResult, PullStatus, check_group
from broker.client.message_selector import Selector, pull_filter
from broker.client.offset_store import RemoteOffsetStore
from broker.client.route_cache import RouteCache, read_order, subscribe_queues
from broker.client.transport import (
    FROM_ENV,
    ClientError,
    CredentialsArg,
    NamesrvClient,
    TlsArg,
    Transport,
    resolve_security,
)

log = logging.getLogger(__name__)


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
        read_from_followers: bool = False,
    ):
        self.group = check_group(group)
        self.read_from_followers = read_from_followers
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
        """From the leader, else from a follower (any replica serves committed reads); with
        ``read_from_followers``, from a follower first and from the leader when the followers fail
        or lag behind ``offset``. ``tags`` is a tag expression or a ``MessageSelector``."""
        route = await self.routes.get(mq.topic, self.timeout_s)
        addrs = read_order(
            self.routes.replicas(route, mq.broker_name), from_followers=self.read_from_followers, spread=mq.queue_id
        )
        if not addrs:
            raise ClientError("NO_ROUTE", f"no replica address for {mq}")
        expr, sql = pull_filter(tags)
        last: ClientError | None = None
        for i, addr in enumerate(addrs):
            try:
                result = await pull_from(
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
                if result.status is PullStatus.OFFSET_OVERFLOW and self.read_from_followers and i < len(addrs) - 1:
                    continue  # this follower has not applied that far yet: ask the next replica
                return result
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
