"""``dledger-namesrv -c conf/namesrv.conf``: the NameServer process, a thin aiohttp shell over
``RouteTable``.

Endpoints (bodies: msgpack or JSON by Content-Type, every body carries ``"v": 1``; answers are
msgpack when the request asks for it by Accept or sent msgpack, JSON otherwise; errors are always
JSON ``{v, code, message}``)::

    POST   /v1/brokers/register     BrokerRegistration  -> {v, accepted, changed, namesrv_time_ms, ...}
    POST   /v1/brokers/unregister   {cluster, broker_name, address} -> {v, removed}
    POST   /v1/brokers/perm         {broker_name, write} (admin) -> {v, broker_name, write, topics}
    POST   /v1/config               {key, value} (admin) -> {v, key, value}  (updateNamesrvConfig)
    GET    /v1/routes/{topic}       TopicRouteData, or 404 TOPIC_NOT_EXIST
    GET    /v1/clusters             {v, clusters: {cluster: [names]}, brokers: {name: BrokerData}}
    GET    /v1/topics               {v, topics: [...]}
    DELETE /v1/topics/{topic}       {v, topic, deleted: true}, or 404 TOPIC_NOT_EXIST
    GET    /v1/status               uptime, counts, totals, live brokers, config
    GET    /metrics                 Prometheus text exposition (namesrv/metrics.py)

With ``aclEnable=true`` (docs/SECURITY.md) registrations and unregistrations must be signed by an
account whose ``brokerNames`` lists the group, and route deletions by an admin account; reads stay
open (routes are what every client needs first). Errors are 401 (unsigned, bad signature, stale
timestamp, replay) or 403 (signed, but not allowed).

The port sits behind ``broker.serving.http_edge`` (connection cap, request-receipt timeouts, bounded bodies,
JSON errors from the HTTP parser) and serves HTTPS with ``tlsEnable=true``. The same port speaks
RocketMQ's remoting protocol to the official clients and mqadmin (``namesrv.remoting``): a
connection's first byte tells the two apart (``broker.serving.sniff``).

Ownership: one task (``TableOwner``) owns the RouteTable, the KV config and the counters. Handlers of
both protocols only decode, submit a closure to its bounded queue (through the service methods both
share) and encode the answer; the scan task submits a scan every ``scanNotActiveBrokerInterval`` ms.
The table's clock is injected (monotonic ms by default).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import secrets
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from aiohttp import web

from broker.protocol import route_wire as wire
from broker.protocol.auth import namesrv_scope
from broker.protocol.errors import ProtocolError
from broker.protocol.rocketmq.command import Bounds
from broker.protocol.routes import WIRE_VERSION, BrokerRegistration, RegisterResult
from broker.serving.acl import AclConfig, AclError, AclWatcher
from broker.serving.http_edge import (
    ErrorAnswer,
    Guard,
    Limits,
    error_middleware,
    guarded_app,
    server_ssl_context,
)
from broker.serving.process_main import run_until_signalled, setup_logging
from broker.serving.remoting_acl import AclV1Policy, RemotingAuthenticator
from broker.serving.remoting_server import ByteBudget, RemotingLimits, RemotingServer
from broker.serving.security import Security
from broker.serving.sniff import SniffingSite, SniffLimits, TlsMode, start_dual_server
from dledger.clock import process_clock
from dledger.config import ConfigError
from namesrv.config import NamesrvConfig, load_namesrv_config, parse_namesrv_config
from namesrv.kv_config import KvConfigTable
from namesrv.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from namesrv.metrics import NamesrvMetrics
from namesrv.remoting import NamesrvRemoting
from namesrv.route_table import (
    ConflictError,
    ExpiredBroker,
    InvalidRecordError,
    NamesrvError,
    NotFoundError,
    RouteTable,
    TableFullError,
    validate_registration,
    validate_topic,
    validate_unregister,
)

log = logging.getLogger("namesrv")

# what updateNamesrvConfig may change on a running NameServer
HOT_KEYS: Final = ("scanNotActiveBrokerInterval", "brokerChannelMaxIdleTime", "orderMessageEnable")

BODY_BYTES_MAX: Final = 4 << 20
REMOTING_FRAME_BYTES_MAX: Final = BODY_BYTES_MAX  # the NameServer's requests are small (a KV value: 64 KiB)
UNAUTHENTICATED_BYTES_MAX: Final = 64 << 20  # bodies in flight (HTTP) and unauthenticated frames (remoting)
QUEUE_JOBS_MAX: Final = 1024
SUBMIT_TIMEOUT_S: Final = 5.0
T = TypeVar("T")
Clock = Callable[[], int]


class BusyError(NamesrvError):
    """The table task's queue stayed full for SUBMIT_TIMEOUT_S."""


_STATUS_BY_ERROR: Final[dict[type[ProtocolError], int]] = {
    InvalidRecordError: 400,
    wire.WireError: 400,
    wire.UnsupportedMediaTypeError: 415,
    NotFoundError: 404,
    ConflictError: 409,
    TableFullError: 429,
    BusyError: 503,
}


def monotonic_ms() -> int:
    return int(process_clock().monotonic() * 1000)


def wall_ms() -> int:
    return int(process_clock().wall() * 1000)


class TableOwner:
    """The one task that touches the RouteTable. ``call(fn)`` runs ``fn(table, now_ms)`` there."""

    def __init__(self, table: RouteTable, clock_ms: Clock, jobs_max: int = QUEUE_JOBS_MAX):
        self.table = table
        self._clock_ms = clock_ms
        self._jobs: asyncio.Queue[tuple[Callable[[RouteTable, int], Any], asyncio.Future[Any]]] = (
            asyncio.Queue(jobs_max)
        )
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        self._task = asyncio.create_task(self._run(), name="namesrv-table")

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        while not self._jobs.empty():  # jobs that will never run: tell their callers
            _, future = self._jobs.get_nowait()
            if not future.done():
                future.set_exception(BusyError("SHUTTING_DOWN", "the NameServer is stopping"))

    async def call(self, fn: Callable[[RouteTable, int], T]) -> T:
        assert self._task is not None, "TableOwner.call before startup"
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self._jobs.put((fn, future)), SUBMIT_TIMEOUT_S)
        except TimeoutError:
            raise BusyError("BUSY", f"the route table task is {QUEUE_JOBS_MAX} jobs behind") from None
        return await future

    async def _run(self) -> None:
        while True:
            fn, future = await self._jobs.get()
            try:
                result = fn(self.table, self._clock_ms())
            except NamesrvError as exc:
                if not future.done():
                    future.set_exception(exc)
            except Exception as exc:  # a bug: the caller gets a 500 (logged there), serving goes on
                if not future.done():
                    future.set_exception(exc)
            else:
                if not future.done():
                    future.set_result(result)


class NamesrvService:
    """The NameServer: its table task, its scan task and the HTTP handlers."""

    def __init__(
        self,
        cfg: NamesrvConfig,
        *,
        clock_ms: Clock = monotonic_ms,
        wall_clock_ms: Clock = wall_ms,
        run_scanner: bool = True,
    ):
        self.cfg = cfg
        self.owner = TableOwner(RouteTable(cfg.broker_channel_max_idle_time_ms), clock_ms)
        self._wall_clock_ms = wall_clock_ms
        self._run_scanner = run_scanner
        self._scanner: asyncio.Task[None] | None = None
        self._acl_task: asyncio.Task[None] | None = None
        self.guard = Guard(
            Limits(
                connections_max=cfg.connections_max,
                header_timeout_s=cfg.header_timeout_ms / 1000,
                idle_timeout_s=cfg.idle_timeout_ms / 1000,
                body_timeout_s=cfg.body_timeout_ms / 1000,
                body_bytes_in_flight_max=64 << 20,
                client_max_size=BODY_BYTES_MAX,
            ),
            wire.error_to_dict,
        )
        # A signature names this NameServer process (a random instance id: its table and its nonce
        # window live in memory only, so a request signed for an earlier process is void).
        self.security = Security(
            cfg.acl_file, wall_clock_ms, self.guard, scope=namesrv_scope(secrets.token_hex(8)),
            anonymous=lambda request: request.method in ("GET", "HEAD"),
        )
        self.kv = KvConfigTable()  # owned by the table task, like the RouteTable
        self.authenticator = RemotingAuthenticator(self._acl_rules, AclV1Policy(cfg.remoting_acl_v1))
        self.remoting = RemotingServer(
            authenticator=self.authenticator,
            limits=RemotingLimits(
                bounds=Bounds(frame_bytes_max=REMOTING_FRAME_BYTES_MAX),
                connections_max=cfg.connections_max,
                first_frame_timeout_s=cfg.header_timeout_ms / 1000,
                frame_timeout_s=cfg.body_timeout_ms / 1000,
                idle_timeout_s=cfg.idle_timeout_ms / 1000,
            ),
            budget=ByteBudget(UNAUTHENTICATED_BYTES_MAX),
        )
        NamesrvRemoting(self).install(self.remoting)
        self.site: SniffingSite | None = None  # set by serve()
        self._started_ms = clock_ms()
        self.metrics = NamesrvMetrics()
        self._started_wall_ms = wall_clock_ms()
        # Owned by the table task (updated only inside closures it runs).
        self.totals = dict.fromkeys(
            ("registrations", "route_changes", "stale_ignored", "unregistrations", "expired", "scans"), 0
        )

    def app(self) -> web.Application:
        app = guarded_app(self.guard, [_errors, self.security.middleware])
        app.router.add_post("/v1/brokers/register", self.handle_register)
        app.router.add_post("/v1/brokers/unregister", self.handle_unregister)
        app.router.add_post("/v1/brokers/perm", self.handle_broker_perm)
        app.router.add_post("/v1/config", self.handle_config_update)
        app.router.add_get("/v1/routes/{topic}", self.handle_route)
        app.router.add_get("/v1/clusters", self.handle_clusters)
        app.router.add_get("/v1/topics", self.handle_topics)
        app.router.add_delete("/v1/topics/{topic}", self.handle_delete_topic)
        app.router.add_get("/v1/status", self.handle_status)
        app.router.add_get("/metrics", self.handle_metrics)  # Prometheus exposition (namesrv/metrics.py)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def startup(self) -> None:
        await self.owner.startup()
        if self._run_scanner:
            self._scanner = asyncio.create_task(self._scan_loop(), name="namesrv-scan")
        if self.security.enabled:
            self._acl_task = asyncio.create_task(self.security.run(), name="namesrv-acl")

    async def shutdown(self) -> None:
        await self.remoting.stop()
        for task in (self._scanner, self._acl_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._scanner = self._acl_task = None
        await self.owner.shutdown()

    async def serve(self, host: str, port: int) -> tuple[web.AppRunner, str]:
        """Start serving HTTP and RocketMQ remoting on ``host:port`` behind the edge guard (TLS when
        configured, ``tlsMode``); returns the runner (``cleanup()`` stops both) and the bound
        ``host:port``."""
        ssl_ctx = (
            server_ssl_context(self.cfg.tls_cert_file, self.cfg.tls_key_file or "")
            if self.cfg.tls_cert_file
            else None
        )
        limits = SniffLimits(pending_max=self.cfg.connections_max,
                             first_byte_timeout_s=self.cfg.header_timeout_ms / 1000,
                             tls_handshake_timeout_s=self.guard.limits.tls_handshake_timeout_s)
        runner, site = await start_dual_server(self.app(), self.guard, host, port, remoting=self.remoting,
                                               limits=limits, ssl_context=ssl_ctx, tls_mode=TlsMode(self.cfg.tls_mode))
        self.site = site
        return runner, f"{host}:{site.bound_port}"

    def _acl_rules(self) -> AclConfig | None:
        watcher = self.security.watcher
        return None if watcher is None else watcher.current

    async def _on_startup(self, app: web.Application) -> None:
        await self.startup()

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.shutdown()

    # -- expiry ------------------------------------------------------------------------------
    async def scan_now(self) -> list[ExpiredBroker]:
        """Expire brokers idle past their timeout (the scan task calls this every interval)."""
        return await self.owner.call(self._scan)

    def _scan(self, table: RouteTable, now_ms: int) -> list[ExpiredBroker]:
        expired = table.scan_expired(now_ms)
        self.totals["scans"] += 1
        self.totals["expired"] += len(expired)
        for e in expired:
            log.warning(
                "expired %s/%d at %s (cluster %s): no heartbeat for %d ms > %d ms",
                e.broker_name,
                e.broker_id,
                e.address,
                e.cluster,
                e.idle_ms,
                e.heartbeat_timeout_ms,
            )
        return expired

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.scan_not_active_broker_interval_ms / 1000)  # updatable at run time
            try:
                await self.scan_now()
            except NamesrvError as exc:
                log.warning("scan skipped: %s", exc)
            except Exception:  # a bug in the scan must not end expiry for good
                log.exception("scan failed")

    # -- handlers ----------------------------------------------------------------------------
    async def handle_register(self, request: web.Request) -> web.Response:
        fmt = wire.format_for_content_type(request.content_type)
        reg = wire.registration_from_dict(wire.parse_body(await self.guard.read_body(request), fmt))
        validate_registration(reg)
        self.security.require_broker(request, reg.broker_name)
        result = await self.owner.call(lambda table, now_ms: self._register(table, reg, now_ms))
        body = wire.register_response_to_dict(wire.RegisterResponse(result, self._wall_clock_ms()))
        return _reply(request, body)

    def _register(self, table: RouteTable, reg: BrokerRegistration, now_ms: int) -> RegisterResult:
        result = table.register(reg, now_ms)
        self.totals["registrations"] += 1
        who = f"{reg.broker_name}/{reg.broker_id} at {reg.address} ({reg.role}, term {reg.term})"
        if result.ignored_reason is not None:
            self.totals["stale_ignored"] += 1
            log.warning(
                "ignored %s registration of %s: group leader %s at term %d",
                result.ignored_reason,
                who,
                result.leader_address,
                result.leader_term,
            )
        elif result.changed:
            self.totals["route_changes"] += 1
            log.info("route change: %s [%s]", "; ".join(result.changes), who)
        return result

    async def handle_unregister(self, request: web.Request) -> web.Response:
        fmt = wire.format_for_content_type(request.content_type)
        req = wire.unregister_from_dict(wire.parse_body(await self.guard.read_body(request), fmt))
        validate_unregister(req)
        self.security.require_broker(request, req.broker_name)

        def job(table: RouteTable, now_ms: int) -> bool:
            removed = table.unregister(req.cluster, req.broker_name, req.address)
            if removed:
                self.totals["unregistrations"] += 1
                log.info("unregistered %s/%s at %s", req.cluster, req.broker_name, req.address)
            return removed

        return _reply(request, {"v": WIRE_VERSION, "removed": await self.owner.call(job)})

    async def handle_broker_perm(self, request: web.Request) -> web.Response:
        """``{v, broker_name, write: bool}`` (admin): mqadmin wipeWritePerm / addWritePerm."""
        fmt = wire.format_for_content_type(request.content_type)
        body = wire.parse_body(await self.guard.read_body(request), fmt)
        self.security.require(request, admin=True)
        name, write = body.get("broker_name"), body.get("write")
        if not isinstance(name, str) or not isinstance(write, bool) or set(body) - {"v", "broker_name", "write"}:
            raise InvalidRecordError("BAD_REQUEST", "body must be {v, broker_name, write: true|false}")
        count = await self.set_write_perm(name, write)
        return _reply(request, {"v": WIRE_VERSION, "broker_name": name, "write": write, "topics": count})

    async def handle_config_update(self, request: web.Request) -> web.Response:
        """``{v, key, value}`` (admin): mqadmin updateNamesrvConfig (``update_config``)."""
        fmt = wire.format_for_content_type(request.content_type)
        body = wire.parse_body(await self.guard.read_body(request), fmt)
        self.security.require(request, admin=True)
        key, value = body.get("key"), body.get("value")
        if not isinstance(key, str) or not isinstance(value, str) or set(body) - {"v", "key", "value"}:
            raise InvalidRecordError("BAD_REQUEST", "body must be {v, key, value} with string key and value")
        effective = await self.update_config({key: value})
        return _reply(request, {"v": WIRE_VERSION, "key": key, "value": effective[key]})

    async def handle_route(self, request: web.Request) -> web.Response:
        topic = _topic_param(request)
        route = await self.owner.call(lambda table, now_ms: table.topic_route(topic))
        if route is None:
            raise NotFoundError("TOPIC_NOT_EXIST", f"no route for topic {topic}")
        return _reply(request, wire.topic_route_to_dict(route))

    async def handle_clusters(self, request: web.Request) -> web.Response:
        _check_query_version(request)
        info = await self.owner.call(lambda table, now_ms: table.cluster_info())
        return _reply(request, wire.cluster_info_to_dict(info))

    async def handle_topics(self, request: web.Request) -> web.Response:
        _check_query_version(request)
        topics = await self.owner.call(lambda table, now_ms: table.topic_list())
        return _reply(request, wire.topic_list_to_dict(topics))

    async def handle_delete_topic(self, request: web.Request) -> web.Response:
        topic = _topic_param(request)
        self.security.require(request, admin=True)
        if not await self.delete_topic(topic):
            raise NotFoundError("TOPIC_NOT_EXIST", f"topic {topic} is not in the route table")
        return _reply(request, {"v": WIRE_VERSION, "topic": topic, "deleted": True})

    # -- what both protocols do (HTTP above, remoting in namesrv/remoting.py) ----------------------
    async def set_write_perm(self, broker_name: str, write: bool) -> int:
        """Route every queue of a group without (or again with) write permission until changed back
        (mqadmin wipeWritePerm / addWritePerm; the group's own registrations do not undo it; kept in
        memory like the routes). Returns the group's topic count; NotFoundError for an unknown group."""

        def job(table: RouteTable, now_ms: int) -> int:
            count = table.set_write_perm(broker_name, write)
            log.warning("%s write permission of broker group %s (%d topics)", "added" if write else "wiped",
                        broker_name, count)
            return count

        return await self.owner.call(job)

    async def update_config(self, changes: Mapping[str, str]) -> dict[str, str]:
        """mqadmin updateNamesrvConfig for the keys a running NameServer can change (``HOT_KEYS``),
        checked like the config file, all or none; in memory until restart. Returns the effective
        values of the changed keys."""
        for key in changes:
            if key not in HOT_KEYS:
                raise InvalidRecordError(
                    "NOT_UPDATABLE",
                    f"{key[:80]!r} cannot change on a running NameServer (updatable: {', '.join(HOT_KEYS)}); "
                    "edit its config file and restart it",
                )
        current = self.cfg.as_properties()
        props = {k: _property_text(current[k]) for k in HOT_KEYS} | {k: v[:64] for k, v in changes.items()}
        try:
            parsed = parse_namesrv_config(props, source="updateNamesrvConfig")
        except ConfigError as exc:
            raise InvalidRecordError("BAD_PARAMETER", str(exc)) from None
        self.cfg = dataclasses.replace(
            self.cfg,
            scan_not_active_broker_interval_ms=parsed.scan_not_active_broker_interval_ms,
            broker_channel_max_idle_time_ms=parsed.broker_channel_max_idle_time_ms,
            order_message_enable=parsed.order_message_enable,
        )
        idle_ms = parsed.broker_channel_max_idle_time_ms

        def job(table: RouteTable, now_ms: int) -> None:
            table.heartbeat_timeout_ms_default = idle_ms  # brokers that send none get it at their next heartbeat

        await self.owner.call(job)
        effective = self.cfg.as_properties()
        for key, value in changes.items():
            log.warning("config %s set to %s by updateNamesrvConfig (until restart)", key, value[:64])
        return {key: _property_text(effective[key]) for key in changes}

    def config_text(self) -> dict[str, str]:
        """Every setting as ``key -> text`` (GET_NAMESRV_CONFIG, mqadmin getNamesrvConfig)."""
        return {key: _property_text(value) for key, value in self.cfg.as_properties().items()}

    async def delete_topic(self, topic: str, cluster: str | None = None) -> bool:
        """Forget ``topic`` (in ``cluster``'s groups only, when given); False when it was not there."""

        def job(table: RouteTable, now_ms: int) -> bool:
            deleted = table.delete_topic(topic, cluster)
            if deleted:
                log.info("deleted topic %s%s (brokers still holding it re-announce it)", topic,
                         f" in cluster {cluster}" if cluster else "")
            return deleted

        return await self.owner.call(job)

    async def put_kv(self, namespace: str, key: str, value: str) -> None:
        def job(table: RouteTable, now_ms: int) -> None:
            if self.kv.put(namespace, key, value):
                log.info("KV config %s/%s set (%d bytes)", namespace[:80], key[:80], len(value))

        await self.owner.call(job)

    async def delete_kv(self, namespace: str, key: str) -> bool:
        def job(table: RouteTable, now_ms: int) -> bool:
            deleted = self.kv.delete(namespace, key)
            if deleted:
                log.info("KV config %s/%s deleted", namespace[:80], key[:80])
            return deleted

        return await self.owner.call(job)

    async def handle_status(self, request: web.Request) -> web.Response:
        _check_query_version(request)
        return _reply(request, await self.owner.call(self._status))

    async def handle_metrics(self, request: web.Request) -> web.Response:
        status = await self.owner.call(self._status)
        return web.Response(body=self.metrics.render(status), headers={"Content-Type": METRICS_CONTENT_TYPE})

    def _status(self, table: RouteTable, now_ms: int) -> dict[str, Any]:
        return {
            "v": WIRE_VERSION,
            "uptime_ms": now_ms - self._started_ms,
            "started_at_ms": self._started_wall_ms,
            "namesrv_time_ms": self._wall_clock_ms(),
            "counts": table.counts(),
            "write_wiped": list(table.write_wiped()),
            "totals": dict(self.totals),
            "brokers": [
                {
                    "address": b.address,
                    "cluster": b.cluster,
                    "broker_name": b.broker_name,
                    "broker_id": b.broker_id,
                    "role": b.role,
                    "term": b.term,
                    "data_version": b.data_version,
                    "idle_ms": now_ms - b.last_update_ms,
                    "heartbeat_timeout_ms": b.heartbeat_timeout_ms,
                }
                for b in table.live_brokers()
            ],
            "config": self.cfg.as_properties(),
            "kv_config": self.kv.counts(),
            "remoting": {
                **self.remoting.status(),
                "acl_refused": dict(self.authenticator.refused),
                "sniff": self.site.listener.stats.as_dict() if self.site is not None else None,
            },
            "security": {
                "acl": self.security.enabled,
                "scope": self.security.scope,
                "tls": self.cfg.tls_cert_file is not None,
                "refused": dict(self.security.refused),
                "edge": self.guard.stats(),
            },
        }


# -- HTTP helpers --------------------------------------------------------------------------------
def _property_text(value: Any) -> str:
    """A setting as Java's properties write it (booleans in lower case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _wants_msgpack(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    if any(t in accept for t in wire.MSGPACK_TYPES):
        return True
    return wire.JSON_TYPE not in accept and request.content_type in wire.MSGPACK_TYPES


def _reply(request: web.Request, body: dict[str, Any], status: int = 200) -> web.Response:
    fmt: wire.Format = "msgpack" if _wants_msgpack(request) else "json"
    content_type = wire.MSGPACK_TYPE if fmt == "msgpack" else wire.JSON_TYPE
    return web.Response(body=wire.dump_body(body, fmt), status=status, content_type=content_type)


def error_response(status: int, code: str, message: str, **extra: Any) -> web.Response:
    body = wire.dump_body({**wire.error_to_dict(code, message), **extra}, "json")
    return web.Response(body=body, status=status, content_type=wire.JSON_TYPE)


def _check_query_version(request: web.Request) -> None:
    raw = request.query.get("v")
    if raw is not None and raw != str(WIRE_VERSION):
        raise wire.WireError("UNSUPPORTED_VERSION", f"schema version {raw!r:.20} is not supported (v1 only)")


def _topic_param(request: web.Request) -> str:
    _check_query_version(request)
    topic = request.match_info["topic"]
    validate_topic(topic)
    return topic


def _classify(exc: Exception) -> ErrorAnswer | None:
    """The status of the NameServer's coded errors, which carry none (``error_middleware`` answers
    those that do, ACL's refusals among them, aiohttp's errors and unmapped ones)."""
    if isinstance(exc, ProtocolError):
        status = next((_STATUS_BY_ERROR[c] for c in type(exc).__mro__ if c in _STATUS_BY_ERROR), 500)
        return ErrorAnswer(status, exc.code, exc.message)
    return None


def _respond(request: web.Request, answer: ErrorAnswer) -> web.Response:
    return error_response(answer.status, answer.code, answer.message, **answer.extra)


def _internal(exc: Exception) -> ErrorAnswer:  # a bug, not bad input: still answer JSON, and keep serving
    return ErrorAnswer(500, "INTERNAL_ERROR", f"{type(exc).__name__}: {exc!s:.200}")


_errors: Final = error_middleware(_classify, _respond, internal=_internal, logger=log)


# -- process -------------------------------------------------------------------------------------
async def serve(cfg: NamesrvConfig, stop: asyncio.Event) -> None:
    service = NamesrvService(cfg)
    runner, bound = await service.serve(cfg.bind_address, cfg.listen_port)
    try:
        log.info(
            "NameServer listening on %s (%s and RocketMQ remoting, ACL %s, config %s)",
            bound,
            f"https, tlsMode={cfg.tls_mode}" if cfg.tls_cert_file else "http",
            f"on, remotingAclV1={cfg.remoting_acl_v1}" if service.security.enabled else "off",
            cfg.source,
        )
        await stop.wait()
    finally:
        await runner.cleanup()
    log.info("NameServer stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dledger-namesrv", description="Run a NameServer (route registry).")
    parser.add_argument("-c", "--config", help="properties file (see conf/namesrv.conf); defaults if omitted")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    os.umask(0o077)  # nothing this process writes is for other users
    try:
        cfg = load_namesrv_config(args.config) if args.config else NamesrvConfig()
        if cfg.acl_file:
            AclWatcher(cfg.acl_file)  # a broken ACL file stops the start, with its reason
    except (ConfigError, OSError, AclError) as exc:
        print(f"dledger-namesrv: {exc}", file=sys.stderr)
        return 2

    try:
        run_until_signalled(lambda stop: serve(cfg, stop))
    except OSError as exc:  # e.g. the port is taken
        print(
            f"dledger-namesrv: cannot serve on {cfg.bind_address}:{cfg.listen_port}: {exc}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
