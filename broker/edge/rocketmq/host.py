"""What the handler modules use of the RocketMQ edge (``EdgeHost``; ``RocketMQEdge`` in ``edge`` is
one): the service, the broker's identity, the clients' connections and the dispatch table. The
handlers are typed against it, not against ``RocketMQEdge``, which imports them to register their
codes: so no handler module imports ``edge`` back (tests/test_layering.py: no import cycle)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from broker.edge.rocketmq.channels import ClientChannels
    from broker.edge.rocketmq.messages import HostCache
    from broker.protocol.rocketmq.command import RemotingCommand
    from broker.protocol.rocketmq.message import Host
    from broker.service.broker_service import BrokerService
    from broker.serving.remoting_server import RemotingConnection, Request
    from broker.serving.security import Principal

Handler = Callable[["Request"], Awaitable["RemotingCommand | None"]]


class EdgeHost(Protocol):
    """The edge as its handlers see it (broker/edge/rocketmq/edge.py documents each member)."""

    service: BrokerService
    broker_name: str
    store_host: Host  # in offset msg ids (resolved by the server at start)
    hosts: HostCache
    channels: ClientChannels

    def route(self, code: int, handler: Handler, *, writes: bool = False) -> None: ...
    def peer_addr(self, req: Request) -> str: ...
    def is_admin(self, principal: Principal) -> bool: ...
    def v1_writes_allowed(self, principal: Principal) -> bool: ...
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> bool: ...
    def notify_changed(self, groups: set[str]) -> None: ...
    def connection_closed(self, conn: RemotingConnection) -> None: ...
