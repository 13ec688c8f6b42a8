"""The broker's RocketMQ edge: RocketMQ's remoting protocol on the broker's ``listenPort`` (and its
VIP channel, ``listenPort - 2``), answered by the one broker service.

    official client ──frame──▶ RemotingServer (broker.serving) ──▶ RocketMQEdge.route's guard
        (ACL 1.0 signature checked)        needs_of(code): PUB/SUB/admin ──▶ handler (send.py, pull.py,
                                                                   clients.py, offsets.py, ...)
        ◀──answer (header, body)── encode ◀── BrokerService method ◀── decode header / body

Per request the handler decodes the header and body with ``broker.protocol.rocketmq``, calls one
``BrokerService`` method (the same the HTTP API and the binary port call; no broker logic here) and
encodes its answer; ``errors.py`` gives a coded ``ProtocolError`` the response code the clients act on.

The dispatch table is extended by modules: each handler module has ``register(edge)``, which calls
``edge.route(code, handler, ...)`` for its codes; ``HANDLER_MODULES`` lists them. ``route`` puts the
ACL check in front of every handler: ``broker.serving.remoting_acl.needs_of`` (RocketMQ's
PlainAccessValidator on our permissions) against the request's principal, before the handler runs
(a handler adds checks only where the needs depend on what it reads, as a send-back does).

The edge also keeps the clients' connections (``channels.ClientChannels``): the broker's own
requests to a client (NOTIFY_CONSUMER_IDS_CHANGED here; CHECK_TRANSACTION_STATE) go over the
connection a client last heartbeated on. A connection that closes takes its clients out of their
consumer groups, and the groups' remaining members are told (as RocketMQ's broker does).

Ownership: everything here runs on the broker's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine
from types import ModuleType
from typing import Any, Final

from broker.edge.rocketmq import admin, clients, offsets, pull, query, send, stats, txn
from broker.edge.rocketmq.channels import Channel, ClientChannels
from broker.edge.rocketmq.errors import CODES
from broker.edge.rocketmq.host import Handler
from broker.edge.rocketmq.messages import HostCache
from broker.protocol.rocketmq import headers
from broker.protocol.rocketmq.codes import RequestCode
from broker.protocol.rocketmq.command import RemotingCommand
from broker.protocol.rocketmq.message import Host
from broker.service.broker_service import BrokerService
from broker.serving.remoting_acl import AclV1Policy, needs_of
from broker.serving.remoting_server import (
    Authenticator,
    ByteBudget,
    RemotingConnection,
    RemotingLimits,
    RemotingServer,
    Request,
)
from broker.serving.security import Principal

log = logging.getLogger("broker.edge.rocketmq")

HANDLER_MODULES: Final[tuple[ModuleType, ...]] = (send, pull, clients, offsets, txn, query, admin, stats)
"""Modules whose ``register(edge)`` adds their codes."""

NOTIFY_TASKS_MAX: Final = 1024  # server-to-client notifications in flight, all connections together


class EdgeConnection(RemotingConnection):
    """A client connection that knows its peer's port (RocketMQ's born host is ``ip:port``) and tells
    the edge when it closes."""

    def __init__(self, server: EdgeServer):
        super().__init__(server)
        self.edge = server.edge
        self.peer_addr = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            host = str(peer[0])
            self.peer_addr = f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self.edge.connection_closed(self)


class EdgeServer(RemotingServer):
    def __init__(self, edge: RocketMQEdge, **kwargs: Any):
        super().__init__(**kwargs)
        self.edge = edge

    def __call__(self) -> EdgeConnection:
        return EdgeConnection(self)


class RocketMQEdge:
    """One per broker replica: the remoting server (its protocol factory is ``server``) and the
    handlers of the codes the broker serves (they see it as an ``EdgeHost``, broker/edge/rocketmq/host.py)."""

    def __init__(self, service: BrokerService, *, broker_name: str, store_host: Host,
                 authenticator: Authenticator | None = None, limits: RemotingLimits | None = None,
                 budget: ByteBudget | None = None):
        self.service = service
        self.broker_name = broker_name
        self.store_host = store_host
        self.hosts = HostCache()
        self.channels = ClientChannels()
        self.authenticator = authenticator or Authenticator()
        self.server = EdgeServer(self, authenticator=self.authenticator, limits=limits, budget=budget,
                                 response_codes=CODES)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.notifications = 0
        self.notifications_dropped = 0
        for module in HANDLER_MODULES:
            module.register(self)

    # -- the dispatch table ---------------------------------------------------------------------------
    def route(self, code: int, handler: Handler, *, writes: bool = False) -> None:
        """Serve ``code`` with ``handler``; RocketMQ's ACL check (``needs_of``) runs first.
        ``writes``: the request changes replicated state (``remotingAclV1=readonly`` refuses it)."""

        # ``needs_of`` reads a request's body only for a heartbeat (a bad one is refused before the
        # handler runs, ACL or not); for every other code its needs matter only to a principal
        # that may not do everything (``Request.require`` passes such one at once): with ACL off
        # they are not worked out.
        reads_body = code == RequestCode.HEART_BEAT

        def guarded(req: Request) -> Awaitable[RemotingCommand | None]:
            # a plain function: a refusal raises here, in the dispatcher's call, before the handler
            # starts; else the handler's own coroutine is what the dispatcher awaits (no frame of
            # ours in between, resumed at every step of a send)
            if reads_body or not req.principal.everything:
                needs = needs_of(req.cmd.code, req.cmd.ext_fields, req.cmd.body)
                req.require(topics=needs.topic_map(), groups=needs.group_map(), admin=needs.admin)
            return handler(req)

        self.server.route(code, guarded, writes=writes)

    # -- what handlers share ----------------------------------------------------------------------------
    @staticmethod
    def peer_addr(req: Request) -> str:
        conn = req.connection
        return conn.peer_addr if isinstance(conn, EdgeConnection) else conn.peer

    @staticmethod
    def is_admin(principal: Principal) -> bool:
        return principal.everything or (principal.account is not None and principal.account.admin)

    def v1_writes_allowed(self, principal: Principal) -> bool:
        """Whether this principal's requests may change state as a side effect (a pull's commit
        flag): not with an ACL 1.0 signature under ``remotingAclV1=readonly``."""
        policy = getattr(self.authenticator, "policy", AclV1Policy.ACCEPT)
        return principal.everything or policy is AclV1Policy.ACCEPT

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> bool:
        """Run ``coro`` in the background (bounded: beyond ``NOTIFY_TASKS_MAX`` it is dropped: False)."""
        if len(self._tasks) >= NOTIFY_TASKS_MAX:
            self.notifications_dropped += 1
            coro.close()
            return False
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    # -- the broker's requests to clients -----------------------------------------------------------------
    def notify_changed(self, groups: set[str]) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED (oneway) to every member of each group with a connection here."""
        for group in groups:
            try:
                members = self.service.group_members(group)["client_ids"]
            except Exception:  # an invalid group name cannot have members: nothing to tell
                continue
            ext = headers.to_ext(headers.ConsumerGroupHeader(consumer_group=group))
            for client_id in members:
                channel = self.channels.get(client_id)
                if channel is not None and not channel.connection.closed:
                    self.notifications += 1
                    self.spawn(channel.connection.invoke_oneway(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ext))

    def connection_closed(self, conn: RemotingConnection) -> None:
        """A connection closed: the clients that heartbeated on it leave their consumer groups here
        (RocketMQ's ClientHousekeepingService), and those groups' other members are told."""
        gone: list[Channel] = self.channels.drop_connection(conn)
        changed: set[str] = set()
        for channel in gone:
            try:
                changed |= self.service.leave(channel.client_id, None, channel.owner, admin=True)
            except Exception as exc:  # never expected: the client id was checked when it was bound
                log.warning("client %s not removed from its groups: %s", channel.client_id, exc)
        if changed:
            self.notify_changed(changed)

    # -- life cycle ---------------------------------------------------------------------------------------
    async def stop(self, grace_s: float = 5.0) -> None:
        await self.server.stop(grace_s)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def status(self) -> dict[str, Any]:
        return {
            **self.server.status(),
            "clients": len(self.channels),
            "notifications": self.notifications,
            "notifications_dropped": self.notifications_dropped,
        }
