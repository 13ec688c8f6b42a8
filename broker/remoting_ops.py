"""The broker's binary-protocol operations (broker/remoting.py): decode a frame's map, check the
ACL with the frame's principal, call the broker service (broker/service.py), answer its map.

Each op takes exactly the map its HTTP route takes and answers exactly the HTTP answer's map
(docs/API.md), so the SDK decodes both alike:

    SEND  = POST /v1/send   PUB on the topic
    PULL  = POST /v1/pull   SUB on the topic (and on the group when given)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.acl import Perm, check
from broker.codec import check_fields
from broker.message import InvalidInput, check_group, check_topic
from broker.protocol.auth import AuthError
from broker.protocol.frames import Op
from broker.remoting import Call, CallError
from broker.service import ServiceError

if TYPE_CHECKING:
    from broker.server import BrokerServer

SEND_FIELDS = frozenset({"topic", "queue_id", "producer_group", "messages"})
PULL_FIELDS = frozenset(
    {"topic", "queue_id", "offset", "max_count", "max_bytes", "tags", "suspend_ms", "consumer_group", "sql"}
)


def remoting_error(exc: BaseException) -> CallError | None:
    """The error answer for what a dispatch raised (None: unexpected)."""
    if isinstance(exc, ServiceError):
        return CallError(exc.status, exc.code, exc.message, **exc.extra)
    if isinstance(exc, InvalidInput):  # the request's own checks (ApiError included)
        return CallError(exc.status, exc.code, exc.message, **getattr(exc, "extra", {}))
    if isinstance(exc, AuthError):
        return CallError(exc.status, exc.code, exc.message)
    return None


class RemotingOps:
    def __init__(self, server: BrokerServer):
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
        raise CallError(400, "UNKNOWN_OP", f"op {call.op.name} is not served on this port")

    async def send(self, call: Call) -> dict[str, Any]:
        body = call.body
        try:
            check_fields(body, SEND_FIELDS, ("topic", "messages"))
            topic = check_topic(body["topic"])
            self._require(call, topics={topic: Perm.PUB})
        except (InvalidInput, AuthError) as exc:  # refusals after this point are counted by the service
            self.s.metrics.send_failed(exc.code)
            raise
        sent = await self.s.service.send(
            topic,
            body.get("queue_id", 0),
            body["messages"],
            producer_group=body.get("producer_group"),
            client_addr=call.peer,
        )
        return sent.to_dict()

    async def pull(self, call: Call) -> dict[str, Any]:
        body = call.body
        check_fields(body, PULL_FIELDS, ("topic", "queue_id", "offset"))
        topic = check_topic(body["topic"])
        group = check_group(body["consumer_group"]) if body.get("consumer_group") is not None else None
        self._require(call, topics={topic: Perm.SUB}, groups={group: Perm.SUB} if group else None)
        pulled = await self.s.service.pull(
            topic,
            body["queue_id"],
            body["offset"],
            group=group,
            max_count=body.get("max_count", 32),
            max_bytes=body.get("max_bytes", 4 << 20),
            tags=body.get("tags"),
            sql=body.get("sql"),
            suspend_ms=body.get("suspend_ms", 0),
        )
        return pulled.to_dict(self.s.cfg.broker_name)
