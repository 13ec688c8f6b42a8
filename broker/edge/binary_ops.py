"""The broker's binary-protocol operations (broker/edge/binary.py): decode a frame's map, check the
ACL with the frame's principal, call the broker service (broker/service/broker_service.py), answer its map.

Each op takes exactly the map its HTTP route takes and answers exactly the HTTP answer's map
(docs/API.md), so the SDK decodes both alike:

    SEND  = POST /v1/send   PUB on the topic
    PULL  = POST /v1/pull   SUB on the topic (and on the group when given)
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Protocol

from broker.edge.binary import Call
from broker.protocol.auth import AuthError
from broker.protocol.errors import ProtocolError
from broker.protocol.frames import Op
from broker.service.requests import pull_request, send_request
from broker.serving.acl import Perm, check

if TYPE_CHECKING:
    from broker.service.base import ServiceConfig, ServiceMetrics
    from broker.service.broker_service import BrokerService
    from broker.serving.security import Security

class OpsHost(Protocol):
    """What the binary ops use of the replica they serve (``BrokerServer`` is one)."""

    @property
    def service(self) -> BrokerService: ...
    @property
    def security(self) -> Security: ...  # its refusal counters
    @property
    def metrics(self) -> ServiceMetrics: ...
    @property
    def cfg(self) -> ServiceConfig: ...


class RemotingOps:
    def __init__(self, server: OpsHost):
        self.s = server

    def _require(self, call: Call, *, topics: dict[str, Perm], groups: dict[str, Perm] | None = None) -> None:
        p = call.principal
        if p.everything:
            return
        if p.account is None:
            raise AuthError(401, "NO_CREDENTIALS", "this request must be signed (ACL is enabled)")
        try:
            check(p.account, topics=topics, groups=groups or {}, admin=False)
        except AuthError as exc:
            refused = self.s.security.refused
            refused[exc.code] = refused.get(exc.code, 0) + 1
            raise

    async def dispatch(self, call: Call) -> dict[str, Any]:
        if call.op is Op.SEND:
            return await self.send(call)
        if call.op is Op.PULL:
            return await self.pull(call)
        raise ProtocolError("UNKNOWN_OP", f"op {call.op.name} is not served on this port", 400)

    async def send(self, call: Call) -> dict[str, Any]:
        return await send_request(
            self.s.service,
            call.body,
            require=functools.partial(self._require, call),
            client_addr=call.peer,
            refused=self.s.metrics.send_failed,
        )

    async def pull(self, call: Call) -> dict[str, Any]:
        require = functools.partial(self._require, call)
        return await pull_request(self.s.service, call.body, require=require, broker_name=self.s.cfg.broker_name)
