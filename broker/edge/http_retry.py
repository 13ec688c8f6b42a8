"""HTTP handlers of consumer retries and DLQs (broker/store/retry.py, done by the broker service's
``send_back`` / ``resend_dlq``): ``POST /v1/consumer/sendback`` and ``POST /v1/dlq/resend``.
Kept apart from broker/edge/http_api.py; registered by ``BrokerApi.app``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker.edge.http_codec import answer, read_body
from broker.protocol.errors import ProtocolError
from broker.service.requests import check_fields
from broker.serving.acl import Perm
from broker.store.message import check_group, check_int

if TYPE_CHECKING:
    from broker.service.broker_service import BrokerService
    from broker.serving.security import Security


class RetryApi:
    def __init__(self, svc: BrokerService, sec: Security):
        self.svc = svc
        self.sec = sec

    def add_routes(self, r: web.UrlDispatcher) -> None:
        r.add_post("/v1/consumer/sendback", self.sendback)
        r.add_post("/v1/dlq/resend", self.resend)

    def _position(self, body: dict[str, Any]) -> int:
        if body.get("msg_id") is not None:
            if not isinstance(body["msg_id"], str):
                raise ProtocolError("INVALID_MSG_ID", "msg_id must be a string", 400)
            return self.svc.position_of(body["msg_id"])
        if body.get("position") is None:
            raise ProtocolError("BAD_REQUEST", "give msg_id or position", 400)
        return check_int(body["position"], "position", 0, 2**63 - 1)

    async def sendback(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(body, frozenset({"group", "msg_id", "position", "max_reconsume_times", "dlq"}), ("group",))
        group = check_group(body["group"])
        self.sec.require(request, groups={group: Perm.SUB})  # and SUB on the message's topic: below
        self.svc.require_writable()
        position = self._position(body)
        to_dlq = body.get("dlq", False)
        if not isinstance(to_dlq, bool):
            raise ProtocolError("BAD_REQUEST", "dlq must be a boolean", 400)
        max_times = None
        if body.get("max_reconsume_times") is not None:
            max_times = check_int(body["max_reconsume_times"], "max_reconsume_times", 0, 1000)
        sb = await self.svc.send_back(
            group, position, max_reconsume_times=max_times, to_dlq=to_dlq,
            # the stored message's topic: the caller must be allowed to read it (issue 23, finding 2)
            may_read=lambda topic: self.sec.require(request, topics={topic: Perm.SUB}),
        )
        return answer(
            request,
            {"topic": sb.topic, "dlq": sb.dlq, "reconsume_times": sb.reconsume_times, "msg_id": sb.msg_id},
        )

    async def resend(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(body, frozenset({"group", "msg_id", "position"}), ("group",))
        group = check_group(body["group"])
        self.sec.require(request, admin=True)
        self.svc.require_writable()
        sent = await self.svc.resend_dlq(group, self._position(body))
        return answer(request, {"topic": sent.topic, "msg_id": sent.msg_id})
