"""The broker's HTTP API v1 (docs/API.md): decode a request, check ACL, call the broker service
(broker/service/broker_service.py), encode its answer. No broker logic lives here.

ACL (docs/SECURITY.md): the security middleware authenticates every request but ``GET /v1/status``;
each handler asks ``self.sec.require(...)`` for what it touches before it acts — PUB on the topic to
send; SUB on the topic (and group) to pull, query messages or read/commit offsets; SUB on the group
to heartbeat, list its consumers or its progress; admin for topic/group create/delete, offset
reset and leadership transfer; a consumer may unregister only its own client id (admin: any).

Errors: the service raises the coded ``ProtocolError``, and so do this layer's checks (ACL, body
decoding, the edge guard): ``error_middleware`` answers it as ``{code, message, ...}`` with its
status; what the layers below the service raise here goes through ``BrokerService.translate``."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web

from broker.edge import export
from broker.edge.http_codec import answer, error, read_body
from broker.edge.http_retry import RetryApi
from broker.edge.http_txn import TransactionApi
from broker.protocol.errors import ProtocolError
from broker.protocol.limits import QUERY_MESSAGES_MAX
from broker.protocol.names import is_client_id
from broker.service.base import INT64_MAX, ServiceMetrics
from broker.service.broker_service import BrokerService, PulledMessage, offsets_answer
from broker.service.requests import check_fields, pull_request, send_request
from broker.serving.acl import Perm
from broker.serving.http_edge import ErrorAnswer, coded_answer, error_middleware, guarded_app, query_int
from broker.store.message import check_group, check_int, check_keys, check_topic, check_unique_id

if TYPE_CHECKING:
    from broker.serving.http_edge import Guard
    from broker.serving.security import Security

log = logging.getLogger("broker.api")

def _respond(request: web.Request, answer: ErrorAnswer) -> web.Response:
    return error(request, answer.status, answer.code, answer.message, **answer.extra)


class ApiMetrics(ServiceMetrics, Protocol):
    """The metrics the API reports to and serves (``BrokerMetrics`` is one)."""

    @property
    def content_type(self) -> str: ...  # of what ``scrape`` returns
    async def scrape(self) -> bytes: ...


class ApiHost(export.ExportedReplica, Protocol):
    """What the HTTP API uses of the replica it serves (``BrokerServer`` is one), besides the
    service: its ACL and signatures, the edge guard, its metrics, its configuration and node."""

    @property
    def security(self) -> Security: ...
    @property
    def guard(self) -> Guard: ...
    @property
    def metrics(self) -> ApiMetrics: ...


class BrokerApi:
    def __init__(self, server: ApiHost, service: BrokerService):
        self.s = server
        self.sec = server.security
        self.svc = service

    def app(self) -> web.Application:
        errors = error_middleware(self._classify, _respond, logger=log)
        app = guarded_app(self.s.guard, [errors, self.sec.middleware])
        r = app.router
        r.add_post("/v1/send", self.send)
        r.add_post("/v1/pull", self.pull)
        r.add_get("/v1/msg/id/{msg_id}", self.msg_by_id)
        r.add_get("/v1/msg/key", self.msg_by_key)
        r.add_get("/v1/msg/unique", self.msg_by_unique)
        r.add_get("/v1/msg/offset", self.msg_by_offset)
        r.add_get("/v1/offset/search", self.offset_search)
        r.add_post("/v1/topics", self.topic_put)
        r.add_get("/v1/topics", self.topic_list)
        r.add_get("/v1/topics/{topic}", self.topic_get)
        r.add_delete("/v1/topics/{topic}", self.topic_delete)
        r.add_get("/v1/topics/{topic}/status", self.topic_status)
        r.add_post("/v1/groups", self.group_put)
        r.add_get("/v1/groups", self.group_list)
        r.add_delete("/v1/groups/{group}", self.group_delete)
        r.add_get("/v1/groups/{group}/progress", self.group_progress)
        r.add_get("/v1/groups/{group}/consumers", self.group_consumers)
        r.add_get("/v1/producers/{group}", self.producer_connections)
        r.add_post("/v1/offsets", self.offsets_commit)
        r.add_get("/v1/offsets", self.offsets_get)
        r.add_post("/v1/offsets/reset", self.offsets_reset)
        r.add_post("/v1/heartbeat", self.heartbeat)
        r.add_post("/v1/unregister", self.unregister)
        r.add_get("/v1/status", self.status)
        r.add_post("/v1/admin/transfer", self.transfer)
        r.add_get("/v1/admin/membership", self.membership_get)
        r.add_post("/v1/admin/membership", self.membership_change)
        RetryApi(self.svc, self.sec).add_routes(r)  # consumer retries and DLQs (broker/edge/http_retry.py)
        TransactionApi(self.svc, self.sec).add_routes(r)  # transactional messages (broker/edge/http_txn.py)
        export.register(r, self.sec, self.s)  # GET /v1/replica/files, /v1/replica/file (read-only, admin)
        r.add_get("/v1/admin/config", self.config_get)
        r.add_post("/v1/admin/clean-expired-cq", self.clean_expired_cq)
        r.add_get("/v1/admin/refused", self.refused_records)
        r.add_post("/v1/admin/config", self.config_update)
        r.add_get("/metrics", self.metrics)  # Prometheus exposition, anonymous like /v1/status
        return app

    def _classify(self, exc: Exception) -> ErrorAnswer | None:
        """What the layers below the service raise in this layer (``BrokerService.translate``);
        ``error_middleware`` answers the coded errors itself."""
        mapped = self.svc.translate(exc)
        return None if mapped is None else coded_answer(mapped)

    def _view(self, pm: PulledMessage) -> dict[str, Any]:
        return pm.view(self.s.cfg.broker_name)

    # -- send and pull --------------------------------------------------------------------------------
    async def send(self, request: web.Request) -> web.Response:
        try:
            body = await read_body(request, binary=True)
        except ProtocolError as exc:  # refusals after this point are counted by send_request / the service
            self.s.metrics.send_failed(exc.code)
            raise
        sent = await send_request(
            self.svc,
            body,
            require=functools.partial(self.sec.require, request),
            client_addr=request.remote or "",
            refused=self.s.metrics.send_failed,
        )
        return answer(request, sent)

    async def pull(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        pulled = await pull_request(
            self.svc, body, require=functools.partial(self.sec.require, request), broker_name=self.s.cfg.broker_name
        )
        return answer(request, pulled)

    # -- queries ---------------------------------------------------------------------------------
    async def msg_by_id(self, request: web.Request) -> web.Response:
        view = self._view(self.svc.message_by_id(request.match_info["msg_id"]))
        self.sec.require(request, topics={view["topic"]: Perm.SUB})
        return answer(request, view)

    def _by_index(self, request: web.Request, key: str, *, unique: bool) -> list[dict[str, Any]]:
        topic = check_topic(request.query.get("topic"))
        self.sec.require(request, topics={topic: Perm.SUB})
        found = self.svc.messages_by_key(
            topic,
            key,
            max_n=query_int(request, "max", 64, 1, QUERY_MESSAGES_MAX),
            begin_ts=query_int(request, "begin_ts", 0, 0, INT64_MAX),
            end_ts=query_int(request, "end_ts", INT64_MAX, 0, INT64_MAX),
            unique=unique,
        )
        return [self._view(pm) for pm in found]

    async def msg_by_key(self, request: web.Request) -> web.Response:
        self.svc.require_state()
        key = request.query.get("key", "")
        if not key:
            raise ProtocolError("INVALID_KEYS", "key must be 1..255 chars without whitespace", 400)
        check_keys([key])
        return answer(request, {"messages": self._by_index(request, key, unique=False)})

    async def msg_by_unique(self, request: web.Request) -> web.Response:
        self.svc.require_state()
        uid = check_unique_id(request.query.get("unique_id"))
        return answer(request, {"messages": self._by_index(request, uid, unique=True)})

    def _queue_query(self, request: web.Request, name: str) -> tuple[str, int, int]:
        """(topic, queue id, the integer parameter ``name``) of a per-queue query, ACL checked."""
        self.svc.require_state()
        topic = check_topic(request.query.get("topic"))
        self.sec.require(request, topics={topic: Perm.SUB})
        tc = self.svc.topic(topic)
        qid = query_int(request, "queue_id", None, 0, max(tc.read_queue_nums, tc.write_queue_nums) - 1)
        return topic, qid, query_int(request, name, None, 0, INT64_MAX)

    async def msg_by_offset(self, request: web.Request) -> web.Response:
        topic, qid, offset = self._queue_query(request, "offset")
        return answer(request, self._view(self.svc.message_at_offset(topic, qid, offset)))

    async def offset_search(self, request: web.Request) -> web.Response:
        topic, qid, ts = self._queue_query(request, "ts")
        return answer(request, {"offset": self.svc.search_offset(topic, qid, ts)})

    # -- topics ------------------------------------------------------------------------------------
    async def topic_put(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(
            body, frozenset({"topic", "read_queue_nums", "write_queue_nums", "perm", "order"}), ("topic",)
        )
        topic = check_topic(body["topic"])
        self.sec.require(request, admin=True)
        put = await self.svc.put_topic(
            topic,
            read_queue_nums=body.get("read_queue_nums", 4),
            write_queue_nums=body.get("write_queue_nums", 4),
            perm=body.get("perm", 6),
            order=body.get("order", False),
        )
        return answer(request, put)

    async def topic_list(self, request: web.Request) -> web.Response:
        self.sec.require_signed(request)
        return answer(request, {"topics": [tc.to_dict() for tc in self.svc.topics()]})

    async def topic_get(self, request: web.Request) -> web.Response:
        self.sec.require_signed(request)
        self.svc.require_state()
        return answer(request, self.svc.get_topic(check_topic(request.match_info["topic"])).to_dict())

    async def topic_delete(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]  # checked by the service (a stored older name too)
        self.sec.require(request, admin=True)
        await self.svc.delete_topic(topic)
        return answer(request, {"topic": topic, "deleted": True})

    async def topic_status(self, request: web.Request) -> web.Response:
        self.sec.require_signed(request)
        self.svc.require_state()
        return answer(request, self.svc.topic_status(check_topic(request.match_info["topic"])))

    # -- groups and offsets -------------------------------------------------------------------------
    async def group_put(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(
            body, frozenset({"group", "consume_enable", "consume_broadcast_enable", "retry_max_times"}), ("group",)
        )
        group = check_group(body["group"])
        self.sec.require(request, admin=True)
        put = await self.svc.put_group(
            group,
            consume_enable=body.get("consume_enable", True),
            consume_broadcast_enable=body.get("consume_broadcast_enable", True),
            retry_max_times=body.get("retry_max_times", 16),
        )
        return answer(request, put)

    async def group_list(self, request: web.Request) -> web.Response:
        self.sec.require_signed(request)
        return answer(request, {"groups": [g.to_dict() for g in self.svc.groups()]})

    async def group_delete(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]  # checked by the service (a stored older name too)
        self.sec.require(request, admin=True)
        return answer(request, {"group": group, "deleted": await self.svc.delete_group(group)})

    async def offsets_commit(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(
            body, frozenset({"group", "topic", "offsets", "reset_generation", "topic_epoch"}),
            ("group", "topic", "offsets"),
        )
        group, topic = check_group(body["group"]), check_topic(body["topic"])
        self.sec.require(request, topics={topic: Perm.SUB}, groups={group: Perm.SUB})
        committed = await self.svc.commit_offsets(
            group, topic, body["offsets"],
            reset_generation=body.get("reset_generation"), topic_epoch=body.get("topic_epoch"),
        )
        return answer(request, {"updated": committed.updated, "reset_generation": committed.reset_generation})

    async def offsets_get(self, request: web.Request) -> web.Response:
        group = check_group(request.query.get("group"))
        topic = check_topic(request.query.get("topic"))
        self.sec.require(request, topics={topic: Perm.SUB}, groups={group: Perm.SUB})
        got = self.svc.group_offsets(group, topic)
        return answer(
            request,
            {
                "offsets": offsets_answer(got.offsets),
                "reset_generation": got.reset_generation,
                "topic_epoch": got.topic_epoch,
            },
        )

    async def offsets_reset(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(body, frozenset({"group", "topic", "ts", "offsets"}), ("group", "topic"))
        group, topic = check_group(body["group"]), check_topic(body["topic"])
        self.sec.require(request, admin=True)
        tc = self.svc.topic(topic)
        if ("ts" in body) == ("offsets" in body):
            raise ProtocolError("BAD_REQUEST", "give exactly one of ts or offsets", 400)
        ts = check_int(body["ts"], "ts", 0, INT64_MAX) if "ts" in body else None
        offsets = self.svc.offsets_map(body["offsets"], tc) if "offsets" in body else None
        reset = await self.svc.reset_offsets(group, topic, ts=ts, offsets=offsets)
        return answer(request, {"offsets": offsets_answer(reset.offsets), "reset_generation": reset.reset_generation})

    async def group_progress(self, request: web.Request) -> web.Response:
        group = check_group(request.match_info["group"])
        self.sec.require(request, groups={group: Perm.SUB})
        return answer(request, self.svc.group_progress(group, request.query.get("topic")))

    # -- membership -------------------------------------------------------------------------------
    async def heartbeat(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(body, frozenset({"client_id", "groups"}), ("client_id", "groups"))
        cid = body["client_id"]
        if not is_client_id(cid):
            raise ProtocolError("INVALID_CLIENT_ID",
                                "client_id must be 1..255 printable ASCII chars without spaces", 400)
        groups = body["groups"]
        if not isinstance(groups, list) or len(groups) > 64:
            raise ProtocolError("BAD_REQUEST", "groups must be a list of at most 64 entries", 400)
        parsed = []
        for i, g in enumerate(groups):
            if not isinstance(g, dict):
                raise ProtocolError("BAD_REQUEST", f"groups[{i}] must be a map", 400)
            check_fields(g, frozenset({"group", "topics", "model"}), ("group",))
            model = g.get("model", "CLUSTERING")
            if model not in ("CLUSTERING", "BROADCASTING"):
                raise ProtocolError("BAD_REQUEST", f"groups[{i}].model must be CLUSTERING or BROADCASTING", 400)
            topics = g.get("topics", [])
            if not isinstance(topics, list) or len(topics) > 1024:
                raise ProtocolError("BAD_REQUEST", f"groups[{i}].topics must be a list (≤ 1024)", 400)
            parsed.append((check_group(g["group"]), model, tuple(check_topic(t) for t in topics)))
        self.sec.require(
            request,
            topics={t: Perm.SUB for _g, _m, ts in parsed for t in ts},
            groups={g: Perm.SUB for g, _m, _ts in parsed},
        )
        self.svc.heartbeat(cid, parsed, self.sec.principal(request).name, admin=self.sec.is_admin(request))
        return answer(request, {"ok": True})

    async def unregister(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(body, frozenset({"client_id"}), ("client_id",))
        if not is_client_id(body["client_id"]):
            raise ProtocolError("INVALID_CLIENT_ID",
                                "client_id must be 1..255 printable ASCII chars without spaces", 400)
        self.sec.require_signed(request)
        removed = self.svc.unregister(
            body["client_id"], self.sec.principal(request).name, admin=self.sec.is_admin(request)
        )
        return answer(request, {"removed": removed})

    async def group_consumers(self, request: web.Request) -> web.Response:
        group = check_group(request.match_info["group"])
        self.sec.require(request, groups={group: Perm.SUB})
        return answer(request, self.svc.group_members(group))

    # -- broker -------------------------------------------------------------------------------------
    async def status(self, request: web.Request) -> web.Response:
        return answer(request, await self.svc.status())

    async def producer_connections(self, request: web.Request) -> web.Response:
        """Producers of a group seen sending here lately (``mqadmin producerConnection``); admin."""
        group = check_group(request.match_info["group"])
        self.sec.require(request, admin=True)
        return answer(request, {"group": group, "connections": self.svc.producer_connections(group)})

    async def config_get(self, request: web.Request) -> web.Response:
        """The replica's configuration (``mqadmin getBrokerConfig``), secrets left out; admin only."""
        self.sec.require(request, admin=True)
        return answer(request, {"config": self.svc.config()})

    async def config_update(self, request: web.Request) -> web.Response:
        """``{key, value}`` (admin): change one hot key on this replica until it restarts."""
        self.sec.require(request, admin=True)
        body = await read_body(request)
        check_fields(body, frozenset({"key", "value"}), ("key", "value"))
        key, value = body["key"], body["value"]
        if not isinstance(key, str) or not isinstance(value, str) or len(key) > 128 or len(value) > 1024:
            raise ProtocolError("BAD_REQUEST", "key and value must be strings (≤ 128 and ≤ 1024 chars)", 400)
        return answer(request, {"key": key, "value": self.svc.update_config(key, value)})

    async def metrics(self, request: web.Request) -> web.Response:
        try:
            text = await self.s.metrics.scrape()
        except TimeoutError:
            raise ProtocolError("SERVICE_UNAVAILABLE", "the replica did not answer its status in time", 503) from None
        return web.Response(body=text, headers={"Content-Type": self.s.metrics.content_type})

    async def clean_expired_cq(self, request: web.Request) -> web.Response:
        """``mqadmin cleanExpiredCQ`` on this replica (admin): remove the consume queues of topics
        that no longer exist; runs between two ticks (the store's owner thread)."""
        self.sec.require(request, admin=True)
        removed = await self.svc.clean_expired_queues()
        return answer(request, {"removed": [{"topic": t, "queue_id": q} for t, q in removed]})

    async def refused_records(self, request: web.Request) -> web.Response:
        """The records this replica's apply refused (admin): ``mqadmin refusedRecords``."""
        self.sec.require(request, admin=True)
        return answer(request, self.svc.refused_records())

    async def transfer(self, request: web.Request) -> web.Response:
        self.sec.require(request, admin=True)
        target = None
        if request.body_exists:  # (not can_read_body: the ACL check may have read it already)
            body = await read_body(request)
            check_fields(body, frozenset({"target"}))
            target = body.get("target")
        return answer(request, {"leader_id": await self.svc.transfer_leadership(target)})

    async def membership_get(self, request: web.Request) -> web.Response:
        """The group's membership as this replica holds it (admin; issue 27)."""
        self.sec.require(request, admin=True)
        return answer(request, await self.svc.membership())

    async def membership_change(self, request: web.Request) -> web.Response:
        """``{op: add_learner|promote|remove, id, address?}`` (admin, the leader): one membership
        change through the log; answers once it committed. Codes: NOT_LEADER, LEADER_NOT_READY,
        MEMBERSHIP_CHANGE_PENDING, REMOVE_LEADER, LEARNER_NOT_CAUGHT_UP, NOT_A_LEARNER,
        ALREADY_MEMBER, ADDRESS_IN_USE, UNKNOWN_MEMBER, LAST_VOTER, BAD_REQUEST."""
        self.sec.require(request, admin=True)
        body = await read_body(request)
        return answer(request, await self.svc.change_membership(body))
