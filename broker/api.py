"""The broker's HTTP API v1 handlers (docs/API.md). Thin: validate, then call the store,
the dledger node or the long-poll registry owned by ``BrokerServer``.

ACL (docs/SECURITY.md): the security middleware authenticates every request but ``GET /v1/status``;
each handler asks ``self.sec.require(...)`` for what it touches before it acts — PUB on the topic to
send; SUB on the topic (and group) to pull, query messages or read/commit offsets; SUB on the group
to heartbeat, list its consumers or its progress; admin for topic/group create/delete, offset
reset and leadership transfer; a consumer may unregister only its own client id (admin: any)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker import export
from broker.acl import Perm
from broker.admin_config import ConfigError, NotUpdatable, config_view
from broker.admin_config import update as update_config
from broker.codec import ApiError, answer, check_fields, error, read_body
from broker.consume_queue import ConsumeQueue
from broker.consumers import MembershipError
from broker.dedup import FirstSend, SendDeduper
from broker.http_edge import ClientGone, EdgeError, guarded_app
from broker.message import (
    InvalidInput,
    StoredMessage,
    build_messages,
    check_group,
    check_int,
    check_keys,
    check_topic,
    check_unique_id,
    encodable,
    encode_command,
    encode_message,
    message_view,
    parse_msg_id,
    tag_hash,
)
from broker.metadata import REFUSED_OFFSET_RESET, REFUSED_TOPIC_RECREATED, TopicConfig
from broker.metrics import CONTENT_TYPE
from broker.protocol.auth import AuthError
from broker.protocol.names import is_client_id, is_decimal
from broker.protocol.sql_filter import SqlFilter, SqlFilterError, compile_filter, message_properties
from broker.retry_api import RetryApi
from broker.store import CorruptMessage, MessageNotFound
from broker.transaction_api import TransactionApi
from dledger.node import (
    AppendFailedError,
    AppendTimeoutError,
    BusyError,
    DiskFullError,
    DLedgerError,
    EntryRemovedError,
    EntryTooLargeError,
    NotLeaderError,
)

if TYPE_CHECKING:
    from broker.server import BrokerServer

log = logging.getLogger("broker.api")

INT64_MAX = 2**63 - 1
MAX_PULL_COUNT = 1024
MAX_SCAN_UNITS = 16_384
MAX_SQL_SCAN_UNITS = 2048  # an SQL filter reads every unit it scans from the log: fewer per pull
MAX_QUERY = 512
PULLED_KEY: web.RequestKey[tuple[int, int]] = web.RequestKey("api.pulled", tuple)  # (messages, bytes)
_PULL_FIELDS = frozenset(
    {"topic", "queue_id", "offset", "max_count", "max_bytes", "tags", "suspend_ms", "consumer_group", "sql"}
)

_DLEDGER_ERRORS: dict[type[DLedgerError], tuple[int, str]] = {
    AppendFailedError: (409, "APPEND_FAILED"),
    AppendTimeoutError: (504, "SEND_TIMEOUT"),
    BusyError: (429, "BUSY"),
    DiskFullError: (507, "DISK_FULL"),
    EntryTooLargeError: (413, "MESSAGE_TOO_LARGE"),
    EntryRemovedError: (410, "MESSAGE_REMOVED"),
}


def _int_query(request: web.Request, name: str, default: int | None, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        if default is None:
            raise ApiError(400, "MISSING_FIELD", f"query parameter {name!r} is required")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, "BAD_PARAMETER", f"{name} must be an integer, got {raw[:40]!r}") from None
    if not lo <= value <= hi:
        raise ApiError(400, "BAD_PARAMETER", f"{name} must be in [{lo}, {hi}], got {value}")
    return value


def _tag_filter(expr: Any) -> tuple[set[int], set[str]] | None:
    """None = every message; else (tag hashes, tags)."""
    if expr is None or expr in ("", "*"):
        return None
    if not isinstance(expr, str) or len(expr) > 4096 or not encodable(expr):
        raise ApiError(400, "INVALID_TAGS", "tags must be '*' or 'a||b' (at most 4096 UTF-8 chars)")
    tags = {t.strip() for t in expr.split("||") if t.strip()}
    if not tags:
        return None
    return {tag_hash(t) for t in tags}, tags


def _sql_filter(expr: Any, tags: Any, enabled: bool) -> SqlFilter | None:
    """The compiled SQL92 filter of a pull (cached per expression), or None."""
    if expr is None:
        return None
    if not enabled:
        raise ApiError(400, "FILTER_NOT_SUPPORTED", "this broker does not filter by SQL92 (enablePropertyFilter=false)")
    if tags not in (None, "", "*"):
        raise ApiError(400, "BAD_REQUEST", "a pull filters by tags or by sql, not both")
    if not isinstance(expr, str) or not encodable(expr):
        raise ApiError(400, "SUBSCRIPTION_PARSE_FAILED", "sql must be a UTF-8 string", position=0)
    try:
        return compile_filter(expr)
    except SqlFilterError as exc:
        raise ApiError(400, "SUBSCRIPTION_PARSE_FAILED", str(exc), position=exc.position) from None


def _offsets_answer(offsets: dict[int, int]) -> dict[str, int]:
    return {str(q): o for q, o in sorted(offsets.items())}


class BrokerApi:
    def __init__(self, server: BrokerServer):
        self.s = server
        self.sec = server.security
        self.dedup = SendDeduper(  # idempotent sends (broker/dedup.py)
            server.store.dedup,
            log_end=lambda: server.node.store.last_index,
            applied=server.store.applied_index,
            term=lambda: server.node.term,
            monotonic=server.clock.monotonic,
        )

    def app(self) -> web.Application:
        app = guarded_app(self.s.guard, [self._errors, self.sec.middleware])
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
        RetryApi(self).add_routes(r)  # consumer retries and DLQs (broker/retry_api.py)
        TransactionApi(self).add_routes(r)  # transactional messages (broker/transaction_api.py)
        export.register(r, self)  # GET /v1/replica/files, /v1/replica/file (read-only, admin)
        r.add_get("/v1/admin/config", self.config_get)
        r.add_post("/v1/admin/clean-expired-cq", self.clean_expired_cq)
        r.add_post("/v1/admin/config", self.config_update)
        r.add_get("/metrics", self.metrics)  # Prometheus exposition, anonymous like /v1/status
        return app

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except ApiError as exc:
            return error(request, exc.status, exc.code, exc.message, **exc.extra)
        except AuthError as exc:
            return error(request, exc.status, exc.code, exc.message)
        except MembershipError as exc:
            return error(request, exc.status, exc.code, exc.message)
        except (EdgeError, ClientGone):
            raise  # answered by the edge guard's middleware
        except InvalidInput as exc:
            return error(request, exc.status, exc.code, exc.message)
        except NotLeaderError:
            return self._not_leader(request)
        except DLedgerError as exc:
            status, code = _DLEDGER_ERRORS.get(type(exc), (503, "SERVICE_UNAVAILABLE"))
            return error(request, status, code, str(exc))
        except CorruptMessage as exc:  # logged by the store; other replicas hold a good copy
            return error(request, 500, "STORE_CORRUPT", f"{exc}: read it from another replica")
        except TimeoutError:  # the replica's apply thread did not answer in time
            return error(request, 503, "SERVICE_UNAVAILABLE", "the replica is busy; retry shortly")
        except web.HTTPException as exc:
            if exc.status >= 400:
                code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "BODY_TOO_LARGE"}.get(
                    exc.status, exc.reason.upper().replace(" ", "_")
                )
                return error(request, exc.status, code, exc.text or exc.reason)
            raise
        except Exception:
            log.exception("unexpected error in %s %s", request.method, request.path)
            return error(request, 500, "INTERNAL", "internal error (logged by the broker)")

    def _not_leader(self, request: web.Request) -> web.Response:
        leader_id = self.s.node.leader_id
        return error(
            request,
            409,
            "NOT_LEADER",
            f"this broker ({self.s.node.settings.self_id}) is not the leader; leader is {leader_id}",
            leader_addr=self.s.client_addr_of(leader_id),
            leader_id=leader_id,
        )

    # -- writes ---------------------------------------------------------------------------------
    def _require_state(self) -> None:
        if self.s.store.needs_state_after is not None:
            raise ApiError(503, "NOT_READY", "this replica is waiting for state from the leader; ask another replica")

    def _require_writable(self) -> None:
        if self.s.node.role != "LEADER":
            raise NotLeaderError(self.s.node.leader_id)
        if not self.s.ready:
            raise ApiError(503, "NOT_READY", "new leader is still applying committed entries; retry shortly")

    async def _command(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self._require_writable()
        locs = await self.s.node.append([encode_command(cmd)], timeout_s=self.s.send_timeout_s)
        result = locs[0].result
        if not isinstance(result, dict):  # applied, but not as a command (never expected)
            raise ApiError(500, "INTERNAL", f"command {cmd.get('op')!r} was applied without a result")
        if "error" in result:
            raise ApiError(400, "BAD_COMMAND", str(result["error"]))
        return dict(result)

    async def _topic_for_send(self, topic: str) -> TopicConfig:
        tc = self.s.store.topic(topic)
        if tc is not None:
            return tc
        if not self.s.cfg.auto_create_topic:
            raise ApiError(404, "TOPIC_NOT_EXIST", f"topic {topic!r} does not exist (autoCreateTopicEnable=false)")
        pending = self.s.creating.get(topic)
        if pending is None:
            n = self.s.cfg.default_topic_queue_nums
            cmd = {"op": "topic.put", "topic": topic, "read_queue_nums": n, "write_queue_nums": n, "perm": 6}
            pending = self.s.loop.create_task(self._command(cmd))
            self.s.creating[topic] = pending
            pending.add_done_callback(lambda _t: self.s.creating.pop(topic, None))
        await pending
        tc = self.s.store.topic(topic)
        if tc is None:
            raise ApiError(503, "SERVICE_UNAVAILABLE", f"topic {topic!r} could not be created")
        return tc

    async def send(self, request: web.Request) -> web.Response:
        try:
            return await self._send(request)
        except NotLeaderError:
            self.s.metrics.send_failed("NOT_LEADER")
            raise
        except (ApiError, InvalidInput, AuthError) as exc:
            self.s.metrics.send_failed(exc.code)
            raise
        except DLedgerError as exc:
            self.s.metrics.send_failed(_DLEDGER_ERRORS.get(type(exc), (503, "SERVICE_UNAVAILABLE"))[1])
            raise

    async def _send(self, request: web.Request) -> web.Response:
        started = self.s.clock.monotonic()
        body = await read_body(request, binary=True)
        check_fields(body, frozenset({"topic", "queue_id", "producer_group", "messages"}), ("topic", "messages"))
        topic = check_topic(body["topic"])
        self.sec.require(request, topics={topic: Perm.PUB})
        if body.get("producer_group") is not None:
            check_group(body["producer_group"])
        self._require_writable()
        # Everything about the request is checked before an unknown topic gets auto-created.
        known = self.s.store.topic(topic)
        queue_nums = known.write_queue_nums if known is not None else self.s.cfg.default_topic_queue_nums
        qid = check_int(body.get("queue_id", 0), "queue_id", 0, queue_nums - 1, "INVALID_QUEUE_ID")
        store_ts = self.s.wall_ms()
        peer = request.remote or ""
        msgs = build_messages(
            topic,
            qid,
            body["messages"],
            store_ts=store_ts,
            max_size=self.s.cfg.max_message_size,
            new_unique_id=lambda: uuid.uuid4().hex.upper(),
            default_born_host=peer,
        )
        # Delayed and timed messages go to the schedule topic until due (broker/schedule.py).
        msgs = [self.s.schedule.policy.prepare(m, f"messages[{i}]") for i, m in enumerate(msgs)]
        records = [encode_message(m) for m in msgs]
        tc = known or await self._topic_for_send(topic)
        if not tc.writable:
            raise ApiError(403, "NO_PERMISSION", f"topic {topic!r} is not writable (perm {tc.perm})")
        if qid >= tc.write_queue_nums:
            raise ApiError(400, "INVALID_QUEUE_ID", f"queue_id {qid} >= write_queue_nums {tc.write_queue_nums}")
        self.s.counters["send_requests"] += 1
        uids = [m.unique_id for m in msgs]
        waited_from = self.s.clock.monotonic()
        await self.dedup.wait_in_flight(topic, uids, self.s.send_timeout_s)
        append_timeout_s = max(0.05, self.s.send_timeout_s - (self.s.clock.monotonic() - waited_from))
        firsts = self.dedup.known(topic, uids)
        fresh = [i for i, k in enumerate(firsts) if k is None]
        locs: list[Any] = []
        if fresh:
            locs = await self.dedup.appending(
                topic,
                [uids[i] for i in fresh],
                lambda: self.s.node.append([records[i] for i in fresh], timeout_s=append_timeout_s),
            )
        self.s.counters["messages_sent"] += len(fresh)
        self.s.counters["duplicate_messages"] += len(msgs) - len(fresh)
        self.s.metrics.sent(
            topic, len(fresh), sum(len(records[i]) for i in fresh), self.s.clock.monotonic() - started
        )
        if body.get("producer_group") is not None:
            self.s.producers.sent(body["producer_group"], peer, topic, self.s.monotonic_ms())
        # A retried send is answered with its first result (stored once); fresh messages as usual.
        results = [self._first_result(m.unique_id, k) for m, k in zip(msgs, firsts, strict=True)]
        if not fresh:
            first = firsts[0]
            assert first is not None
            qid, store_ts = first.queue_id, first.store_ts
        for i, loc in zip(fresh, locs, strict=True):
            offset = loc.result  # the queue offset its apply assigned (results travel with the call)
            results[i] = {
                "msg_id": f"{self.s.cfg.broker_name}:{loc.position:016X}",
                "unique_id": msgs[i].unique_id,
                "queue_offset": offset,
                "position": loc.position,
            }
        return answer(
            request,
            {
                "status": "SEND_OK",
                "broker_name": self.s.cfg.broker_name,
                "queue_id": qid,
                "store_ts": store_ts,
                "results": results,
            },
        )

    def _first_result(self, unique_id: str, first: FirstSend | None) -> dict[str, Any] | None:
        if first is None:
            return None
        return {
            "msg_id": f"{self.s.cfg.broker_name}:{first.position:016X}",
            "unique_id": unique_id,
            "queue_offset": first.queue_offset,
            "position": first.position,
            "duplicate": True,
        }

    # -- pull -------------------------------------------------------------------------------------
    async def pull(self, request: web.Request) -> web.Response:
        started = self.s.clock.monotonic()
        body = await read_body(request)
        check_fields(body, _PULL_FIELDS, ("topic", "queue_id", "offset"))
        topic = check_topic(body["topic"])
        group = check_group(body["consumer_group"]) if body.get("consumer_group") is not None else None
        self.sec.require(request, topics={topic: Perm.SUB}, groups={group: Perm.SUB} if group else None)
        self._require_state()
        if group is not None:
            gc = self.s.store.group(group)
            if gc is not None and not gc.consume_enable:
                raise ApiError(403, "NO_PERMISSION", f"group {gc.group!r} has consume_enable=false")
        tc = self._topic(topic)
        if not tc.readable:
            raise ApiError(403, "NO_PERMISSION", f"topic {topic!r} is not readable (perm {tc.perm})")
        qid = check_int(body["queue_id"], "queue_id", 0, tc.read_queue_nums - 1, "INVALID_QUEUE_ID")
        offset = check_int(body["offset"], "offset", 0, INT64_MAX)
        max_count = check_int(body.get("max_count", 32), "max_count", 1, MAX_PULL_COUNT)
        max_bytes = check_int(body.get("max_bytes", 4 << 20), "max_bytes", 1, 64 << 20)
        # Held at most longPollingMaxMs, like RocketMQ clamps the suspend time (not an error).
        suspend_ms = check_int(body.get("suspend_ms", 0), "suspend_ms", 0, 3_600_000)
        suspend_ms = min(suspend_ms, self.s.cfg.long_polling_max_ms)
        flt = _tag_filter(body.get("tags"))
        sql = None
        if body.get("sql") is not None:
            sql = _sql_filter(body["sql"], body.get("tags"), self.s.cfg.enable_property_filter)
        deadline = self.s.clock.monotonic() + suspend_ms / 1000
        while True:
            cq = self.s.store.cqs.get(topic, qid)
            lo, hi = (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)
            if offset < lo:
                return self._pull_answer(request, topic, "OFFSET_TOO_SMALL", lo, lo, hi, [])
            if offset > hi:
                return self._pull_answer(request, topic, "OFFSET_OVERFLOW", hi, lo, hi, [])
            if offset == hi or cq is None:
                remaining = deadline - self.s.clock.monotonic()
                if remaining <= 0 or self.s.stopping:
                    return self._pull_answer(request, topic, "NO_NEW_MSG", offset, lo, hi, [])
                await self.s.wait_for_queue(topic, qid, remaining)
                continue
            response = self._read_queue(request, topic, cq, offset, max_count, max_bytes, flt, lo, sql)
            count, nbytes = request.get(PULLED_KEY, (0, 0))
            if count:
                self.s.metrics.pulled(topic, group, count, nbytes, self.s.clock.monotonic() - started)
            return response

    def _read_queue(
        self,
        request: web.Request,
        topic: str,
        cq: ConsumeQueue,
        offset: int,
        max_count: int,
        max_bytes: int,
        flt: tuple[set[int], set[str]] | None,
        lo: int,
        sql: SqlFilter | None = None,
    ) -> web.Response:
        scan = max_count if flt is None and sql is None else min(MAX_SCAN_UNITS, max_count * 64)
        if sql is not None:
            scan = min(scan, MAX_SQL_SCAN_UNITS)
        units = cq.read(offset, scan)
        out: list[dict[str, Any]] = []
        total = 0
        next_offset = offset
        for u in units:
            if flt is not None and u.tag_hash not in flt[0]:
                next_offset = u.offset + 1
                continue
            try:
                m = self.s.store.read_message(u.position, u.size)
            except MessageNotFound:
                if u.position < self.s.first_log_position():  # removed by retention: skip it
                    next_offset = u.offset + 1
                    continue
                break  # not readable yet (being applied): stop here, never skip it

            if flt is not None and m.tags not in flt[1]:
                next_offset = u.offset + 1
                continue
            if sql is not None and not sql.matches(message_properties(m.properties, m.tags, m.keys)):
                next_offset = u.offset + 1
                continue
            if out and total + len(m.body) > max_bytes:
                break
            total += len(m.body)
            out.append(self._view(m, u.position, u.size, u.offset))
            next_offset = u.offset + 1
            if len(out) >= max_count:
                break
        hi = cq.max_offset
        status = "FOUND" if out else ("NO_MATCHED_MSG" if next_offset > offset else "NO_NEW_MSG")
        return self._pull_answer(request, topic, status, next_offset, max(lo, cq.min_offset), hi, out)

    def _pull_answer(
        self,
        request: web.Request,
        topic: str,
        status: str,
        next_offset: int,
        lo: int,
        hi: int,
        msgs: list[dict[str, Any]],
    ) -> web.Response:
        self.s.counters["pulls"] += 1
        self.s.counters["messages_pulled"] += len(msgs)
        request[PULLED_KEY] = (len(msgs), sum(m.get("size", 0) for m in msgs))
        # Read after the queue: an answer never pairs a new incarnation's offsets with an older epoch.
        epoch = self.s.store.topic_epoch(topic)
        return answer(
            request,
            {"status": status, "next_offset": next_offset, "min_offset": lo, "max_offset": hi, "messages": msgs,
             "topic_epoch": epoch},
        )

    def _view(self, m: StoredMessage, position: int, size: int, offset: int | None) -> dict[str, Any]:
        return message_view(m, broker_name=self.s.cfg.broker_name, position=position, size=size, queue_offset=offset)

    def _topic(self, topic: str) -> TopicConfig:
        tc = self.s.store.topic(topic)
        if tc is None:
            raise ApiError(404, "TOPIC_NOT_EXIST", f"topic {topic!r} does not exist")
        return tc

    # -- queries ---------------------------------------------------------------------------------
    def _message_at(self, position: int) -> dict[str, Any]:
        try:
            m = self.s.store.read_message(position)
        except MessageNotFound:
            if position < self.s.store.applied_end_position and position < self.s.first_log_position():
                raise ApiError(410, "MESSAGE_REMOVED", f"position {position} was removed by retention") from None
            raise ApiError(404, "MESSAGE_NOT_FOUND", f"no message at position {position}") from None
        cq = self.s.store.cqs.get(m.topic, m.queue_id)
        offset = cq.search_by_position(position) if cq is not None else None
        if offset is None:
            raise ApiError(404, "MESSAGE_NOT_FOUND", f"no message at position {position}")
        unit = cq.get(offset) if cq is not None else None
        return self._view(m, position, unit.size if unit else 0, offset)

    async def msg_by_id(self, request: web.Request) -> web.Response:
        self._require_state()
        name, position = parse_msg_id(request.match_info["msg_id"])
        if name != self.s.cfg.broker_name:
            raise ApiError(404, "MESSAGE_NOT_FOUND", f"msg id belongs to broker group {name!r}, this is "
                           f"{self.s.cfg.broker_name!r}")
        view = self._message_at(position)
        self.sec.require(request, topics={view["topic"]: Perm.SUB})
        return answer(request, view)

    def _by_index(self, request: web.Request, key: str, *, unique: bool) -> list[dict[str, Any]]:
        topic = check_topic(request.query.get("topic"))
        self.sec.require(request, topics={topic: Perm.SUB})
        max_n = _int_query(request, "max", 64, 1, MAX_QUERY)
        begin = _int_query(request, "begin_ts", 0, 0, INT64_MAX)
        end = _int_query(request, "end_ts", INT64_MAX, 0, INT64_MAX)
        out = []
        for position in self.s.store.index.query(topic, key, max_n * 2, begin, end):
            try:
                m = self.s.store.read_message(position)
            except MessageNotFound:
                continue
            if m.topic != topic or (m.unique_id != key if unique else key not in m.keys):
                continue  # a hash collision
            cq = self.s.store.cqs.get(m.topic, m.queue_id)
            offset = cq.search_by_position(position) if cq is not None else None
            unit = cq.get(offset) if cq is not None and offset is not None else None
            out.append(self._view(m, position, unit.size if unit else 0, offset))
            if len(out) >= max_n:
                break
        return out

    async def msg_by_key(self, request: web.Request) -> web.Response:
        self._require_state()
        key = request.query.get("key", "")
        if not key:
            raise ApiError(400, "INVALID_KEYS", "key must be 1..255 chars without whitespace")
        check_keys([key])
        return answer(request, {"messages": self._by_index(request, key, unique=False)})

    async def msg_by_unique(self, request: web.Request) -> web.Response:
        self._require_state()
        uid = check_unique_id(request.query.get("unique_id"))
        return answer(request, {"messages": self._by_index(request, uid, unique=True)})

    async def msg_by_offset(self, request: web.Request) -> web.Response:
        self._require_state()
        topic = check_topic(request.query.get("topic"))
        self.sec.require(request, topics={topic: Perm.SUB})
        tc = self._topic(topic)
        qid = _int_query(request, "queue_id", None, 0, max(tc.read_queue_nums, tc.write_queue_nums) - 1)
        offset = _int_query(request, "offset", None, 0, INT64_MAX)
        cq = self.s.store.cqs.get(topic, qid)
        unit = cq.get(offset) if cq is not None else None
        if unit is None:
            raise ApiError(404, "MESSAGE_NOT_FOUND", f"no message at {topic}/{qid} offset {offset}")
        try:
            m = self.s.store.read_message(unit.position, unit.size)
        except MessageNotFound:
            raise ApiError(410, "MESSAGE_REMOVED", f"{topic}/{qid} offset {offset} was removed") from None
        return answer(request, self._view(m, unit.position, unit.size, offset))

    async def offset_search(self, request: web.Request) -> web.Response:
        self._require_state()
        topic = check_topic(request.query.get("topic"))
        self.sec.require(request, topics={topic: Perm.SUB})
        tc = self._topic(topic)
        qid = _int_query(request, "queue_id", None, 0, max(tc.read_queue_nums, tc.write_queue_nums) - 1)
        ts = _int_query(request, "ts", None, 0, INT64_MAX)
        cq = self.s.store.cqs.get(topic, qid)
        return answer(request, {"offset": cq.search_by_time(ts) if cq is not None else 0})

    # -- topics ------------------------------------------------------------------------------------
    async def topic_put(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(
            body, frozenset({"topic", "read_queue_nums", "write_queue_nums", "perm", "order"}), ("topic",)
        )
        topic = check_topic(body["topic"])
        self.sec.require(request, admin=True)
        cmd = {
            "op": "topic.put",
            "topic": topic,
            "read_queue_nums": check_int(body.get("read_queue_nums", 4), "read_queue_nums", 1, 1024,
                                         "INVALID_QUEUE_NUMS"),
            "write_queue_nums": check_int(body.get("write_queue_nums", 4), "write_queue_nums", 1, 1024,
                                          "INVALID_QUEUE_NUMS"),
            "perm": check_int(body.get("perm", 6), "perm", 0, 7, "INVALID_PERM"),
            "order": body.get("order", False),
        }
        if not isinstance(cmd["order"], bool):
            raise ApiError(400, "BAD_REQUEST", "order must be a boolean")
        result = await self._command(cmd)
        return answer(request, result.get("topic", {}))

    async def topic_list(self, request: web.Request) -> web.Response:
        self.sec.require_signed(request)
        self._require_state()
        md = self.s.store.metadata_view()
        return answer(request, {"topics": [tc.to_dict() for _, tc in sorted(md.topics.items())]})

    async def topic_get(self, request: web.Request) -> web.Response:
        self.sec.require_signed(request)
        self._require_state()
        topic = check_topic(request.match_info["topic"])
        return answer(request, self._topic(topic).to_dict())

    async def topic_delete(self, request: web.Request) -> web.Response:
        topic = check_topic(request.match_info["topic"])
        self.sec.require(request, admin=True)
        self._topic(topic)
        await self._command({"op": "topic.delete", "topic": topic})
        return answer(request, {"topic": topic, "deleted": True})

    async def topic_status(self, request: web.Request) -> web.Response:
        self.sec.require_signed(request)
        self._require_state()
        topic = check_topic(request.match_info["topic"])
        tc = self._topic(topic)
        queues = []
        for qid in range(max(tc.read_queue_nums, tc.write_queue_nums)):
            cq = self.s.store.cqs.get(topic, qid)
            last = cq.last_unit() if cq is not None else None
            queues.append(
                {
                    "queue_id": qid,
                    "min_offset": cq.min_offset if cq else 0,
                    "max_offset": cq.max_offset if cq else 0,
                    "last_store_ts": last.store_ts if last else 0,
                }
            )
        return answer(
            request,
            {"topic": topic, "broker_name": self.s.cfg.broker_name, "queues": queues,
             "topic_epoch": self.s.store.topic_epoch(topic)},
        )

    # -- groups and offsets -------------------------------------------------------------------------
    async def group_put(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(
            body, frozenset({"group", "consume_enable", "consume_broadcast_enable", "retry_max_times"}), ("group",)
        )
        cmd: dict[str, Any] = {"op": "group.put", "group": check_group(body["group"])}
        self.sec.require(request, admin=True)
        for flag in ("consume_enable", "consume_broadcast_enable"):
            value = body.get(flag, True)
            if not isinstance(value, bool):
                raise ApiError(400, "BAD_REQUEST", f"{flag} must be a boolean")
            cmd[flag] = value
        cmd["retry_max_times"] = check_int(body.get("retry_max_times", 16), "retry_max_times", 0, 1000)
        result = await self._command(cmd)
        return answer(request, result.get("group", {}))

    async def group_list(self, request: web.Request) -> web.Response:
        self.sec.require_signed(request)
        self._require_state()
        md = self.s.store.metadata_view()
        return answer(request, {"groups": [g.to_dict() for _, g in sorted(md.groups.items())]})

    async def group_delete(self, request: web.Request) -> web.Response:
        group = check_group(request.match_info["group"])
        self.sec.require(request, admin=True)
        result = await self._command({"op": "group.delete", "group": group})
        return answer(request, {"group": group, "deleted": bool(result.get("deleted"))})

    def _offsets_map(self, raw: Any, tc: TopicConfig) -> dict[int, int]:
        if not isinstance(raw, dict) or len(raw) > 1024:
            raise ApiError(400, "BAD_REQUEST", "offsets must be a map of queue id -> offset (≤ 1024 entries)")
        out = {}
        for k, v in raw.items():
            if isinstance(k, bool) or not (isinstance(k, int) or (is_decimal(k) and len(k) < 8)):
                raise ApiError(400, "INVALID_QUEUE_ID", f"queue id {str(k)[:20]!r} is not an integer")
            qid = int(k)
            check_int(qid, "queue id", 0, max(tc.read_queue_nums, tc.write_queue_nums) - 1, "INVALID_QUEUE_ID")
            out[qid] = check_int(v, f"offsets[{qid}]", 0, INT64_MAX, "INVALID_OFFSET")
        return out

    async def offsets_commit(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(
            body, frozenset({"group", "topic", "offsets", "reset_generation", "topic_epoch"}),
            ("group", "topic", "offsets"),
        )
        group, topic = check_group(body["group"]), check_topic(body["topic"])
        self.sec.require(request, topics={topic: Perm.SUB}, groups={group: Perm.SUB})
        offsets = self._offsets_map(body["offsets"], self._topic(topic))
        cmd: dict[str, Any] = {"op": "offset.commit", "group": group, "topic": topic, "offsets": offsets}
        fence: int | None = None
        if body.get("reset_generation") is not None:
            fence = cmd["reset_generation"] = check_int(body["reset_generation"], "reset_generation", 0, INT64_MAX)
        if body.get("topic_epoch") is not None:
            cmd["topic_epoch"] = check_int(body["topic_epoch"], "topic_epoch", 0, INT64_MAX)
        result = await self._command(cmd)
        if not result:  # the apply result is gone (not tracked): decide from what was applied since
            md = self.s.store.metadata_view()
            current = md.reset_generation(group, topic)
            if "topic_epoch" in cmd and cmd["topic_epoch"] != md.topic_epoch(topic):
                result = {"refused": REFUSED_TOPIC_RECREATED, "topic_epoch": md.topic_epoch(topic)}
            elif fence is not None and fence < current:
                result = {
                    "refused": REFUSED_OFFSET_RESET,
                    "reset_generation": current,
                    "offsets": md.group_offsets(group, topic),
                }
            else:
                result = {"reset_generation": current}
        if result.get("refused") == REFUSED_TOPIC_RECREATED:
            raise ApiError(
                409,
                "TOPIC_RECREATED",
                f"topic {topic!r} was deleted and created again (epoch {result.get('topic_epoch')}) after "
                f"this client read its offsets (epoch {cmd['topic_epoch']}): they belong to the old topic",
                topic_epoch=result.get("topic_epoch"),
            )
        if result.get("refused") == REFUSED_OFFSET_RESET:
            generation = int(result["reset_generation"])
            raise ApiError(
                409,
                "OFFSET_RESET",
                f"the offsets of {group!r} on {topic!r} were reset (generation {generation}) after this "
                f"client read them (generation {fence}): read them again",
                reset_generation=generation,
                offsets=_offsets_answer(result["offsets"]),
            )
        return answer(
            request, {"updated": int(result.get("updated", 0)), "reset_generation": result.get("reset_generation")}
        )

    async def offsets_get(self, request: web.Request) -> web.Response:
        group = check_group(request.query.get("group"))
        topic = check_topic(request.query.get("topic"))
        self.sec.require(request, topics={topic: Perm.SUB}, groups={group: Perm.SUB})
        self._require_state()
        md = self.s.store.metadata_view()
        return answer(
            request,
            {
                "offsets": _offsets_answer(md.group_offsets(group, topic)),
                "reset_generation": md.reset_generation(group, topic),
                "topic_epoch": md.topic_epoch(topic),
            },
        )

    async def offsets_reset(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(body, frozenset({"group", "topic", "ts", "offsets"}), ("group", "topic"))
        group, topic = check_group(body["group"]), check_topic(body["topic"])
        self.sec.require(request, admin=True)
        tc = self._topic(topic)
        if ("ts" in body) == ("offsets" in body):
            raise ApiError(400, "BAD_REQUEST", "give exactly one of ts or offsets")
        if "ts" in body:
            ts = check_int(body["ts"], "ts", 0, INT64_MAX)
            offsets = {}
            for qid in range(tc.read_queue_nums):
                cq = self.s.store.cqs.get(topic, qid)
                offsets[qid] = cq.search_by_time(ts) if cq is not None else 0
        else:
            offsets = self._offsets_map(body["offsets"], tc)
        result = await self._command({"op": "offset.reset", "group": group, "topic": topic, "offsets": offsets})
        generation = result.get("reset_generation")
        if generation is None:  # the apply result is gone (not tracked): this reset's, or a later one's
            generation = self.s.store.metadata_view().reset_generation(group, topic)
        return answer(request, {"offsets": _offsets_answer(offsets), "reset_generation": generation})

    async def group_progress(self, request: web.Request) -> web.Response:
        group = check_group(request.match_info["group"])
        self.sec.require(request, groups={group: Perm.SUB})
        self._require_state()
        only = request.query.get("topic")
        md = self.s.store.metadata_view()
        topics = set(md.group_topics(group))
        for m in self.s.consumers.members(group, self.s.monotonic_ms()):
            topics.update(m.topics)
        if only is not None:
            topics = {check_topic(only)}
        out, total = [], 0
        for topic in sorted(topics):
            tc = md.topics.get(topic)
            if tc is None:
                continue
            offsets = md.group_offsets(group, topic)
            queues = []
            for qid in range(tc.read_queue_nums):
                cq = self.s.store.cqs.get(topic, qid)
                broker_offset = cq.max_offset if cq is not None else 0
                committed = offsets.get(qid)  # None: the group never committed this queue
                consumer_offset = committed if committed is not None else (cq.min_offset if cq is not None else 0)
                lag = max(0, broker_offset - consumer_offset)
                total += lag
                last = cq.get(consumer_offset - 1) if cq is not None and consumer_offset > 0 else None
                queues.append(
                    {
                        "queue_id": qid,
                        "broker_offset": broker_offset,
                        "consumer_offset": committed,
                        "lag": lag,
                        "last_ts": last.store_ts if last else 0,
                    }
                )
            out.append({"topic": topic, "queues": queues})
        return answer(
            request, {"group": group, "broker_name": self.s.cfg.broker_name, "topics": out, "total_lag": total}
        )

    # -- membership -------------------------------------------------------------------------------
    async def heartbeat(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(body, frozenset({"client_id", "groups"}), ("client_id", "groups"))
        cid = body["client_id"]
        if not is_client_id(cid):
            raise ApiError(400, "INVALID_CLIENT_ID", "client_id must be 1..255 printable ASCII chars without spaces")
        groups = body["groups"]
        if not isinstance(groups, list) or len(groups) > 64:
            raise ApiError(400, "BAD_REQUEST", "groups must be a list of at most 64 entries")
        parsed = []
        for i, g in enumerate(groups):
            if not isinstance(g, dict):
                raise ApiError(400, "BAD_REQUEST", f"groups[{i}] must be a map")
            check_fields(g, frozenset({"group", "topics", "model"}), ("group",))
            model = g.get("model", "CLUSTERING")
            if model not in ("CLUSTERING", "BROADCASTING"):
                raise ApiError(400, "BAD_REQUEST", f"groups[{i}].model must be CLUSTERING or BROADCASTING")
            topics = g.get("topics", [])
            if not isinstance(topics, list) or len(topics) > 1024:
                raise ApiError(400, "BAD_REQUEST", f"groups[{i}].topics must be a list (≤ 1024)")
            parsed.append((check_group(g["group"]), model, tuple(check_topic(t) for t in topics)))
        self.sec.require(
            request,
            topics={t: Perm.SUB for _g, _m, ts in parsed for t in ts},
            groups={g: Perm.SUB for g, _m, _ts in parsed},
        )
        principal = self.sec.principal(request)
        if not self.s.consumers.heartbeat(
            cid, parsed, self.s.monotonic_ms(), principal.name, admin=self.sec.is_admin(request)
        ):
            raise ApiError(429, "TOO_MANY_CLIENTS", "the broker tracks too many clients")
        return answer(request, {"ok": True})

    async def unregister(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        check_fields(body, frozenset({"client_id"}), ("client_id",))
        if not is_client_id(body["client_id"]):
            raise ApiError(400, "INVALID_CLIENT_ID", "client_id must be 1..255 printable ASCII chars without spaces")
        self.sec.require_signed(request)
        removed = self.s.consumers.unregister(
            body["client_id"], self.sec.principal(request).name, admin=self.sec.is_admin(request)
        )
        return answer(request, {"removed": removed})

    async def group_consumers(self, request: web.Request) -> web.Response:
        group = check_group(request.match_info["group"])
        self.sec.require(request, groups={group: Perm.SUB})
        members = self.s.consumers.members(group, self.s.monotonic_ms())
        return answer(
            request,
            {
                "group": group,
                "client_ids": [m.client_id for m in members],
                "members": [{"client_id": m.client_id, "model": m.model, "topics": list(m.topics)} for m in members],
            },
        )

    # -- broker -------------------------------------------------------------------------------------
    async def status(self, request: web.Request) -> web.Response:
        return answer(request, await self.s.status())

    async def producer_connections(self, request: web.Request) -> web.Response:
        """Producers of a group seen sending here lately (``mqadmin producerConnection``); admin."""
        group = check_group(request.match_info["group"])
        self.sec.require(request, admin=True)
        connections = self.s.producers.connections(group, self.s.monotonic_ms())
        return answer(request, {"group": group, "connections": connections})

    async def config_get(self, request: web.Request) -> web.Response:
        """The replica's configuration (``mqadmin getBrokerConfig``), secrets left out; admin only."""
        self.sec.require(request, admin=True)
        return answer(request, {"config": config_view(self.s.cfg)})

    async def config_update(self, request: web.Request) -> web.Response:
        """``{key, value}`` (admin): change one hot key on this replica until it restarts."""
        self.sec.require(request, admin=True)
        body = await read_body(request)
        check_fields(body, frozenset({"key", "value"}), ("key", "value"))
        key, value = body["key"], body["value"]
        if not isinstance(key, str) or not isinstance(value, str) or len(key) > 128 or len(value) > 1024:
            raise ApiError(400, "BAD_REQUEST", "key and value must be strings (≤ 128 and ≤ 1024 chars)")
        try:
            self.s.cfg = update_config(self.s.cfg, key, value)
        except NotUpdatable as exc:
            raise ApiError(400, "NOT_UPDATABLE", str(exc)) from None
        except ConfigError as exc:
            raise ApiError(400, "BAD_PARAMETER", str(exc)) from None
        log.warning("config %s set to %s by updateBrokerConfig (until restart)", key, value)
        self.s.registrar.trigger()  # autoCreateTopicEnable changes what the registration announces
        return answer(request, {"key": key, "value": config_view(self.s.cfg).get(key)})

    async def metrics(self, request: web.Request) -> web.Response:
        try:
            text = await self.s.metrics.scrape()
        except TimeoutError:
            raise ApiError(503, "SERVICE_UNAVAILABLE", "the replica did not answer its status in time") from None
        return web.Response(body=text, headers={"Content-Type": CONTENT_TYPE})

    async def clean_expired_cq(self, request: web.Request) -> web.Response:
        """``mqadmin cleanExpiredCQ`` on this replica (admin): remove the consume queues of topics
        that no longer exist; runs between two ticks (the store's owner thread)."""
        self.sec.require(request, admin=True)
        removed = await self.s.node.run_on_tick_thread(self.s.store.clean_expired_queues, 10.0)
        return answer(request, {"removed": [{"topic": t, "queue_id": q} for t, q in removed]})

    async def transfer(self, request: web.Request) -> web.Response:
        self.sec.require(request, admin=True)
        target = None
        if request.body_exists:  # (not can_read_body: the ACL check may have read it already)
            body = await read_body(request)
            check_fields(body, frozenset({"target"}))
            target = body.get("target")
            if target is not None and (not isinstance(target, str) or target not in self.s.node.settings.peers):
                raise ApiError(400, "BAD_REQUEST", f"target must be one of {sorted(self.s.node.settings.peers)}")
        if target is not None and target == self.s.node.leader_id == self.s.node.settings.self_id:
            return answer(request, {"leader_id": target})  # already there: nothing to do
        leader = await self.s.node.transfer_leadership(target)
        return answer(request, {"leader_id": leader})
