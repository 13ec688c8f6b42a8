"""HTTP handlers of consumer retries and DLQs (broker/retry.py): ``POST /v1/consumer/sendback`` and
``POST /v1/dlq/resend``. Kept apart from broker/api.py; registered by ``BrokerApi.app``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker.acl import Perm
from broker.codec import ApiError, answer, check_fields, read_body
from broker.message import check_group, check_int, encode_message, make_msg_id, parse_msg_id
from broker.metadata import TopicConfig
from broker.protocol.properties import DLQ_PREFIX, dlq_topic, retry_topic
from broker.retry import (
    DEFAULT_MAX_RECONSUME_TIMES,
    DLQ_PERM,
    RETRY_PERM,
    RETRY_QUEUE_NUMS,
    resend_from_dlq,
    send_back,
)
from broker.store import MessageNotFound

if TYPE_CHECKING:
    from broker.api import BrokerApi


class RetryApi:
    def __init__(self, api: BrokerApi):
        self.api = api
        self.s = api.s

    def add_routes(self, r: web.UrlDispatcher) -> None:
        r.add_post("/v1/consumer/sendback", self.sendback)
        r.add_post("/v1/dlq/resend", self.resend)

    async def _ensure_topic(self, topic: str, perm: int) -> TopicConfig:
        tc = self.s.store.topic(topic)
        if tc is None:
            await self.api._command(
                {"op": "topic.put", "topic": topic, "read_queue_nums": RETRY_QUEUE_NUMS,
                 "write_queue_nums": RETRY_QUEUE_NUMS, "perm": perm}
            )
            tc = self.s.store.topic(topic)
        if tc is None:
            raise ApiError(503, "SERVICE_UNAVAILABLE", f"topic {topic!r} could not be created")
        if not tc.writable:
            raise ApiError(403, "NO_PERMISSION", f"topic {topic!r} is not writable (perm {tc.perm})")
        return tc

    def _position(self, body: dict[str, Any]) -> int:
        if body.get("msg_id") is not None:
            if not isinstance(body["msg_id"], str):
                raise ApiError(400, "INVALID_MSG_ID", "msg_id must be a string")
            name, position = parse_msg_id(body["msg_id"])
            if name != self.s.cfg.broker_name:
                raise ApiError(400, "INVALID_MSG_ID", f"msg id of {name!r}, this is {self.s.cfg.broker_name!r}")
            return position
        if body.get("position") is None:
            raise ApiError(400, "BAD_REQUEST", "give msg_id or position")
        return check_int(body["position"], "position", 0, 2**63 - 1)

    def _read(self, position: int) -> Any:
        try:
            return self.s.store.read_message(position)
        except MessageNotFound:
            raise ApiError(404, "MESSAGE_NOT_FOUND", f"no message at position {position}") from None

    async def _append(self, m: Any) -> int:
        locs = await self.s.node.append([encode_message(m)], timeout_s=self.s.send_timeout_s)
        self.s.counters["messages_sent"] += 1
        return locs[0].position

    async def sendback(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(body, frozenset({"group", "msg_id", "position", "max_reconsume_times", "dlq"}), ("group",))
        group = check_group(body["group"])
        self.api.sec.require(request, groups={group: Perm.SUB})
        self.api._require_writable()
        position = self._position(body)
        to_dlq = body.get("dlq", False)
        if not isinstance(to_dlq, bool):
            raise ApiError(400, "BAD_REQUEST", "dlq must be a boolean")
        if body.get("max_reconsume_times") is not None:
            max_times = check_int(body["max_reconsume_times"], "max_reconsume_times", 0, 1000)
        else:
            gc = self.s.store.group(group)
            max_times = gc.retry_max_times if gc is not None else DEFAULT_MAX_RECONSUME_TIMES
        m = self._read(position)
        sb = send_back(
            m, make_msg_id(self.s.cfg.broker_name, position), group=group, max_reconsume_times=max_times,
            to_dlq=to_dlq, store_ts=self.s.wall_ms(), levels=len(self.s.schedule.policy.levels_ms),
        )
        await self._ensure_topic(sb.topic, DLQ_PERM if sb.dlq else RETRY_PERM)
        record = self.s.schedule.policy.prepare(sb.message, "sendback")
        new_position = await self._append(record)
        self.s.counters["sendback_dlq" if sb.dlq else "sendback_retry"] += 1
        return answer(
            request,
            {"topic": sb.topic, "dlq": sb.dlq, "reconsume_times": sb.reconsume_times,
             "msg_id": make_msg_id(self.s.cfg.broker_name, new_position)},
        )

    async def resend(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(body, frozenset({"group", "msg_id", "position"}), ("group",))
        group = check_group(body["group"])
        self.api.sec.require(request, admin=True)
        self.api._require_writable()
        position = self._position(body)
        m = self._read(position)
        if m.topic != dlq_topic(group):
            raise ApiError(400, "NOT_IN_DLQ", f"the message at {position} is in {m.topic!r}, not {DLQ_PREFIX}{group}")
        await self._ensure_topic(retry_topic(group), RETRY_PERM)
        new_position = await self._append(resend_from_dlq(m, group, self.s.wall_ms()))
        return answer(
            request, {"topic": retry_topic(group), "msg_id": make_msg_id(self.s.cfg.broker_name, new_position)}
        )
