"""HTTP handlers of transactional messages (the broker service's ``send_half``, ``end_transaction``,
``transaction_checks``, ``pending_halves``: broker/service/txn.py), registered by ``BrokerApi.app``:

- ``POST /v1/transaction/half``   store a half message (PUB on the topic)
- ``POST /v1/transaction/end``    COMMIT_MESSAGE / ROLLBACK_MESSAGE / UNKNOW for a half (PUB on the topic)
- ``POST /v1/transaction/checks`` long poll of a producer group for check-backs (PUB on each topic named)
- ``GET  /v1/transaction/halves`` pending halves (admin; ``mqadmin queryTransactionHalf``)"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from broker.edge.http_codec import answer, read_body
from broker.protocol.errors import ProtocolError
from broker.service.requests import check_fields
from broker.service.txn import CHECK_TOPICS_MAX, HALVES_LIMIT_MAX
from broker.serving.acl import Perm
from broker.store.message import check_topic

if TYPE_CHECKING:
    from broker.service.broker_service import BrokerService
    from broker.serving.security import Security


class TransactionApi:
    def __init__(self, svc: BrokerService, sec: Security):
        self.svc = svc
        self.sec = sec

    def add_routes(self, r: web.UrlDispatcher) -> None:
        r.add_post("/v1/transaction/half", self.half)
        r.add_post("/v1/transaction/end", self.end)
        r.add_post("/v1/transaction/checks", self.checks)
        r.add_get("/v1/transaction/halves", self.halves)

    async def half(self, request: web.Request) -> web.Response:
        body = await read_body(request, binary=True)
        check_fields(body, frozenset({"topic", "queue_id", "producer_group", "messages"}),
                     ("topic", "producer_group", "messages"))
        topic = check_topic(body["topic"])
        self.sec.require(request, topics={topic: Perm.PUB})
        sent = await self.svc.send_half(topic, body.get("queue_id", 0), body["messages"],
                                        producer_group=body["producer_group"], client_addr=request.remote or "")
        return answer(request, sent.to_dict())

    async def end(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(body, frozenset({"producer_group", "topic", "msg_id", "transaction_id", "state", "from_check"}),
                     ("producer_group", "topic", "msg_id", "state"))
        topic = check_topic(body["topic"])
        self.sec.require(request, topics={topic: Perm.PUB})
        done = await self.svc.end_transaction(
            body["producer_group"], topic, body["msg_id"], body["state"],
            transaction_id=body.get("transaction_id"), from_check=body.get("from_check", False),
        )
        return answer(request, done.to_dict())

    async def checks(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(body, frozenset({"producer_group", "topics", "max_count", "wait_ms"}),
                     ("producer_group", "topics"))
        raw = body["topics"]
        if not isinstance(raw, list) or not 1 <= len(raw) <= CHECK_TOPICS_MAX:
            raise ProtocolError("BAD_REQUEST", f"topics must be a list of 1..{CHECK_TOPICS_MAX} topics", 400)
        topics = [check_topic(t) for t in raw]
        self.sec.require(request, topics=dict.fromkeys(topics, Perm.PUB))  # a check carries the half's body
        got = await self.svc.transaction_checks(body["producer_group"], topics, max_count=body.get("max_count", 32),
                                                wait_ms=body.get("wait_ms", 0))
        return answer(request, {"checks": got})

    async def halves(self, request: web.Request) -> web.Response:
        self.sec.require(request, admin=True)
        q = request.query
        raw = q.get("limit", "100")
        if not raw.isdigit() or len(raw) > 6:
            raise ProtocolError("BAD_REQUEST", f"limit must be an integer 1..{HALVES_LIMIT_MAX}", 400)
        return answer(request, self.svc.pending_halves(group=q.get("group") or None, topic=q.get("topic") or None,
                                                       limit=int(raw)))
