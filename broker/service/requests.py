"""Send and pull requests as both transports receive them (a msgpack map: HTTP ``/v1/send`` and
``/v1/pull`` bodies, binary SEND and PULL frames carry the same map): fields checked, the caller's
ACL check run, the service called, the answer map built. One definition, so the two ports cannot
drift apart. ``require(topics=..., groups=...)`` is the transport's ACL check for its caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from broker.protocol.errors import ProtocolError
from broker.serving.acl import Perm
from broker.store.message import check_group, check_topic

if TYPE_CHECKING:
    from broker.service.broker_service import BrokerService

SEND_FIELDS = frozenset({"topic", "queue_id", "producer_group", "messages"})
PULL_FIELDS = frozenset(
    {"topic", "queue_id", "offset", "max_count", "max_bytes", "tags", "suspend_ms", "consumer_group", "sql"}
)


def check_fields(body: dict[str, Any], allowed: frozenset[str], required: tuple[str, ...] = ()) -> None:
    """A request map's fields: every ``required`` one present, none outside ``allowed``."""
    for name in required:
        if name not in body:
            raise ProtocolError("MISSING_FIELD", f"field {name!r} is required", 400)
    unknown = [str(k) for k in body if k not in allowed]
    if unknown:
        raise ProtocolError("UNKNOWN_FIELD", f"unknown field(s) {sorted(unknown)[:5]}", 400)


class Require(Protocol):
    def __call__(self, *, topics: dict[str, Perm], groups: dict[str, Perm] | None = None) -> None: ...


async def send_request(
    svc: BrokerService,
    body: dict[str, Any],
    *,
    require: Require,
    client_addr: str,
    refused: Callable[[str], None],
) -> dict[str, Any]:
    """``refused(code)`` counts a refusal before the service (the service counts its own)."""
    try:
        check_fields(body, SEND_FIELDS, ("topic", "messages"))
        topic = check_topic(body["topic"])
        require(topics={topic: Perm.PUB})
    except ProtocolError as exc:  # AuthError included
        refused(exc.code)
        raise
    sent = await svc.send(
        topic,
        body.get("queue_id", 0),
        body["messages"],
        producer_group=body.get("producer_group"),
        client_addr=client_addr,
    )
    return sent.to_dict()


async def pull_request(
    svc: BrokerService, body: dict[str, Any], *, require: Require, broker_name: str
) -> dict[str, Any]:
    check_fields(body, PULL_FIELDS, ("topic", "queue_id", "offset"))
    topic = check_topic(body["topic"])
    group = check_group(body["consumer_group"]) if body.get("consumer_group") is not None else None
    require(topics={topic: Perm.SUB}, groups={group: Perm.SUB} if group else None)
    pulled = await svc.pull(
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
    return pulled.to_dict(broker_name)
