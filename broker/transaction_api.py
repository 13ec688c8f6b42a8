"""HTTP handlers of transactional messages (broker/transactions.py), registered by ``BrokerApi.app``:

- ``POST /v1/transaction/half``   store a half message (PUB on the topic; one message; idempotent by
  unique id like ``/v1/send``)
- ``POST /v1/transaction/end``    COMMIT_MESSAGE / ROLLBACK_MESSAGE / UNKNOW for a half (PUB on the topic)
- ``POST /v1/transaction/checks`` long poll of a producer group for check-backs (PUB on each topic named)
- ``GET  /v1/transaction/halves`` pending halves (admin; ``mqadmin queryTransactionHalf``)

Writes and check-backs are served by the group's ready leader only (``NOT_LEADER`` elsewhere)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, NoReturn

from aiohttp import web

from broker.acl import Perm
from broker.codec import ApiError, answer, check_fields, read_body
from broker.dedup import half_key
from broker.message import (
    build_messages,
    check_group,
    check_int,
    check_topic,
    check_unique_id,
    encode_message,
    make_msg_id,
    parse_msg_id,
)
from broker.protocol.properties import PROP_PGROUP, PROP_REAL_TOPIC
from broker.store import MessageNotFound
from broker.transactions import COMMIT, ROLLBACK, committed_copy, immunity_ms, to_half
from dledger.node import NotLeaderError

if TYPE_CHECKING:
    from broker.api import BrokerApi

STATES = {"COMMIT_MESSAGE": COMMIT, "ROLLBACK_MESSAGE": ROLLBACK, "UNKNOW": "UNKNOW"}
CHECKS_COUNT_MAX = 256
CHECK_TOPICS_MAX = 64
HALVES_LIMIT_MAX = 1000
_REFUSED = {
    ROLLBACK: ("TRANSACTION_ROLLED_BACK", "was rolled back"),
    "DISCARDED": ("TRANSACTION_DISCARDED", "was discarded after transactionCheckMax check-backs"),
    COMMIT: ("TRANSACTION_COMMITTED", "was committed"),
}


class TransactionApi:
    def __init__(self, api: BrokerApi):
        self.api = api
        self.s = api.s

    def add_routes(self, r: web.UrlDispatcher) -> None:
        r.add_post("/v1/transaction/half", self.half)
        r.add_post("/v1/transaction/end", self.end)
        r.add_post("/v1/transaction/checks", self.checks)
        r.add_get("/v1/transaction/halves", self.halves)

    def _require_leader(self) -> None:
        if self.s.node.role != "LEADER":
            raise NotLeaderError(self.s.node.leader_id)
        if not self.s.ready:
            raise ApiError(503, "NOT_READY", "new leader is still applying committed entries; retry shortly")

    # -- half ------------------------------------------------------------------------------------------
    async def half(self, request: web.Request) -> web.Response:
        body = await read_body(request, binary=True)
        check_fields(body, frozenset({"topic", "queue_id", "producer_group", "messages"}),
                     ("topic", "producer_group", "messages"))
        topic = check_topic(body["topic"])
        self.api.sec.require(request, topics={topic: Perm.PUB})
        group = check_group(body["producer_group"])
        self._require_leader()
        known = self.s.store.topic(topic)
        queue_nums = known.write_queue_nums if known is not None else self.s.cfg.default_topic_queue_nums
        qid = check_int(body.get("queue_id", 0), "queue_id", 0, queue_nums - 1, "INVALID_QUEUE_ID")
        msgs = build_messages(
            topic, qid, body["messages"], store_ts=self.s.wall_ms(), max_size=self.s.cfg.max_message_size,
            new_unique_id=lambda: uuid.uuid4().hex.upper(), default_born_host=request.remote or "",
        )
        if len(msgs) != 1:
            raise ApiError(400, "TRANSACTION_BATCH_UNSUPPORTED", "a transaction sends exactly one message")
        m = msgs[0]
        # RocketMQ: transactional messages are neither delayed nor batched (and reserved names are refused).
        if self.s.schedule.policy.due_of(m.properties, m.store_ts, "messages[0]") is not None:
            raise ApiError(400, "TRANSACTION_DELAY_UNSUPPORTED", "a transactional message cannot be delayed")
        immunity_ms(m.properties, "messages[0]")
        record = encode_message(to_half(m, group))
        tc = known or await self.api._topic_for_send(topic)
        if not tc.writable:
            raise ApiError(403, "NO_PERMISSION", f"topic {topic!r} is not writable (perm {tc.perm})")
        key = half_key(topic)
        dedup = self.api.dedup
        await dedup.wait_in_flight(key, [m.unique_id], self.s.send_timeout_s)
        (first,) = dedup.known(key, [m.unique_id])
        if first is not None:  # a retried half: answered with the first one, stored once
            position, offset, store_ts, duplicate = first.position, first.queue_offset, first.store_ts, True
        else:
            (loc,) = await dedup.appending(
                key, [m.unique_id], lambda: self.s.node.append([record], timeout_s=self.s.send_timeout_s)
            )
            position, offset, store_ts, duplicate = loc.position, loc.result, m.store_ts, False
            self.s.counters["transaction_halves"] += 1
        self.s.producers.sent(group, request.remote or "", topic, self.s.monotonic_ms())
        result = {"msg_id": make_msg_id(self.s.cfg.broker_name, position), "unique_id": m.unique_id,
                  "queue_offset": offset, "position": position, "transaction_id": m.unique_id}
        if duplicate:
            result["duplicate"] = True
        return answer(request, {"status": "SEND_OK", "broker_name": self.s.cfg.broker_name, "queue_id": qid,
                                "store_ts": store_ts, "results": [result]})

    # -- end -------------------------------------------------------------------------------------------
    async def end(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(
            body,
            frozenset({"producer_group", "topic", "msg_id", "transaction_id", "state", "from_check"}),
            ("producer_group", "topic", "msg_id", "state"),
        )
        topic = check_topic(body["topic"])
        self.api.sec.require(request, topics={topic: Perm.PUB})
        group = check_group(body["producer_group"])
        state = STATES.get(body["state"]) if isinstance(body["state"], str) else None
        if state is None:
            raise ApiError(400, "BAD_REQUEST", f"state must be one of {sorted(STATES)}")
        if not isinstance(body["msg_id"], str):
            raise ApiError(400, "INVALID_MSG_ID", "msg_id must be a string")
        name, position = parse_msg_id(body["msg_id"])
        if name != self.s.cfg.broker_name:
            raise ApiError(400, "INVALID_MSG_ID", f"msg id of {name!r}, this is {self.s.cfg.broker_name!r}")
        tid = check_unique_id(body["transaction_id"]) if body.get("transaction_id") is not None else None
        from_check = body.get("from_check", False)
        if not isinstance(from_check, bool):
            raise ApiError(400, "BAD_REQUEST", "from_check must be a boolean")
        self._require_leader()
        self.s.transactions.counters["ends"] += 1
        done = self._resolved(position, state)
        if done is not None:
            return answer(request, done)
        half = self.s.store.txn.half(position)
        if half is None:
            raise ApiError(404, "TRANSACTION_NOT_FOUND", f"no half message at {body['msg_id']}")
        try:
            m = self.s.store.read_message(position, half.size)
        except MessageNotFound:
            raise ApiError(404, "TRANSACTION_NOT_FOUND", f"no half message at {body['msg_id']}") from None
        if m.properties.get(PROP_REAL_TOPIC) != topic or m.properties.get(PROP_PGROUP) != group:
            raise ApiError(400, "TRANSACTION_MISMATCH",
                           f"the half at {body['msg_id']} belongs to topic {half.topic!r}, group {half.group!r}")
        if tid is not None and tid != m.unique_id:
            raise ApiError(400, "TRANSACTION_MISMATCH", f"transaction_id {tid} is not the half's {m.unique_id}")
        if state == "UNKNOW":  # RocketMQ logs it; the half stays pending and is checked back
            return answer(request, {"state": "UNKNOW", "pending": True})
        if state == ROLLBACK:
            locs = await self.s.node.append(
                [_command({"op": "txn.end", "position": position, "state": ROLLBACK, "group": group})],
                timeout_s=self.s.send_timeout_s,
            )
            result = locs[0].result if isinstance(locs[0].result, dict) else {}
            if result.get("outcome") == ROLLBACK:
                return answer(request, {"state": "ROLLBACK_MESSAGE"})
            return answer(request, self._resolved(position, state) or _not_found(body["msg_id"]))
        tc = self.s.store.topic(topic)
        if tc is None:  # deleted since the half was sent: roll back or let the check-backs end it
            raise ApiError(404, "TOPIC_NOT_EXIST", f"topic {topic!r} of the transaction no longer exists")
        copy = committed_copy(m, position, self.s.wall_ms(), tc.write_queue_nums)
        (loc,) = await self.s.node.append([encode_message(copy)], timeout_s=self.s.send_timeout_s)
        if loc.result is not None:  # the first commit: visible now
            self.s.counters["messages_sent"] += 1
            return answer(request, {"state": "COMMIT_MESSAGE", "msg_id": make_msg_id(self.s.cfg.broker_name,
                                    loc.position), "queue_id": copy.queue_id, "queue_offset": loc.result})
        return answer(request, self._resolved(position, state) or _not_found(body["msg_id"]))

    def _resolved(self, position: int, state: str) -> dict[str, Any] | None:
        """The answer for a half resolved already (idempotent commit / rollback), or None."""
        res = self.s.store.txn.resolution(position)
        if res is None:
            return None
        if res.state == state:
            out: dict[str, Any] = {"state": "COMMIT_MESSAGE" if state == COMMIT else "ROLLBACK_MESSAGE",
                                   "duplicate": True}
            if res.copy_position is not None:
                out["msg_id"] = make_msg_id(self.s.cfg.broker_name, res.copy_position)
                out["queue_offset"] = res.queue_offset
            return out
        if state == "UNKNOW":
            return {"state": "UNKNOW", "pending": False, "resolved": res.state}
        code, what = _REFUSED[res.state]
        verb = "committed" if state == COMMIT else "rolled back"
        raise ApiError(409, code, f"the transaction {what}; it cannot be {verb} now")

    # -- check-backs -----------------------------------------------------------------------------------
    async def checks(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(body, frozenset({"producer_group", "topics", "max_count", "wait_ms"}),
                     ("producer_group", "topics"))
        group = check_group(body["producer_group"])
        raw = body["topics"]
        if not isinstance(raw, list) or not 1 <= len(raw) <= CHECK_TOPICS_MAX:
            raise ApiError(400, "BAD_REQUEST", f"topics must be a list of 1..{CHECK_TOPICS_MAX} topics")
        topics = frozenset(check_topic(t) for t in raw)
        self.api.sec.require(request, topics=dict.fromkeys(topics, Perm.PUB))
        max_count = check_int(body.get("max_count", 32), "max_count", 1, CHECKS_COUNT_MAX)
        wait_ms = min(check_int(body.get("wait_ms", 0), "wait_ms", 0, 3_600_000), self.s.cfg.long_polling_max_ms)
        self._require_leader()
        txn = self.s.transactions
        got = await txn.queue.take(
            group, topics, max_count, wait_ms / 1000,
            pending=lambda p: self.s.store.txn.half(p) is not None,
            monotonic=self.s.clock.monotonic, stopping=lambda: self.s.stopping,
        )
        return answer(request, {"checks": [r.view for r in got]})

    async def halves(self, request: web.Request) -> web.Response:
        self.api.sec.require(request, admin=True)
        q = request.query
        group = check_group(q["group"]) if q.get("group") else None
        topic = check_topic(q["topic"]) if q.get("topic") else None
        raw = q.get("limit", "100")
        if not raw.isdigit() or len(raw) > 6:
            raise ApiError(400, "BAD_REQUEST", f"limit must be an integer 1..{HALVES_LIMIT_MAX}")
        limit = check_int(int(raw), "limit", 1, HALVES_LIMIT_MAX)
        rows = self.s.store.txn.pending(group=group, topic=topic, limit=limit)
        now = self.s.wall_ms()
        return answer(request, {
            "broker_name": self.s.cfg.broker_name,
            "pending": self.s.store.txn.pending_count(),
            "halves": [
                {"msg_id": make_msg_id(self.s.cfg.broker_name, h.position), "position": h.position,
                 "producer_group": h.group, "topic": h.topic, "store_ts": h.store_ms, "age_ms": now - h.store_ms,
                 "check_times": h.checks, "immunity_ms": h.immunity_ms}
                for h in rows
            ],
        })


def _command(cmd: dict[str, Any]) -> bytes:
    from broker.message import encode_command

    return encode_command(cmd)


def _not_found(msg_id: str) -> NoReturn:
    raise ApiError(404, "TRANSACTION_NOT_FOUND", f"no half message at {msg_id}")
