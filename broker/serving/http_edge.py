"""The network edge shared by the broker's and the NameServer's HTTP ports: bounded connections,
bounded time to send a request, bounded body reads, JSON errors even from the HTTP parser, TLS.

What aiohttp alone leaves open (issue 10, findings 6 and 8), and what this module adds:

- connections: at most ``connections_max`` at once; of them at most 3/4 *unproven* (no complete
  request head yet): a new connection then closes the oldest unproven one, so half-open
  connections (slowloris) churn among themselves and cannot lock out clients that send requests;
  beyond ``connections_max`` of proven ones, new connections are closed at once (``Limits``);
- a request must arrive in time: a new connection, or an idle keep-alive connection once the next
  request's first byte arrived, has ``header_timeout_s`` to deliver a complete request head
  (slowloris); an idle keep-alive connection is closed after ``idle_timeout_s``;
- bodies: read only through ``read_body`` — refused with an encoding (no gzip bombs, no echoed
  zlib errors), read within ``body_timeout_s``, and all bodies in flight together reserve at most
  ``body_bytes_in_flight_max`` (503 BUSY beyond: no RSS blow-up from unfinished bodies);
- the HTTP parser's own errors (a bad request line, an oversized header, garbage) and the errors
  aiohttp raises before any middleware runs (an ``Expect`` it does not serve: 417) answer JSON
  ``{code, message}`` like every other error, and are logged at debug level (a client's mistake is
  not a traceback); ``CONNECT`` and ``Upgrade`` requests are refused and the connection closed,
  so nothing after them is parsed as another request;
- every answer carries ``Guard.response_headers`` (the server's signing scope, broker/serving/security.py);
- TLS: ``server_ssl_context`` (certificate chain + key) and ``client_ssl_context`` (a custom CA).

Timers::

    connect ──header_timeout──▶ request head complete ──(handler runs, body read bounded)──▶ response
       ▲                                                                                        │
       └── first byte of the next request (header_timeout) ◀── idle (idle_timeout) ◀───────────┘

Wiring: ``EdgeRunner(app, guard)`` instead of ``web.AppRunner``, ``EdgeSite`` instead of
``web.TCPSite``, and ``guard.middleware`` first in the app's middlewares.

Errors and parameters, one implementation for every HTTP server of the project (the broker, the
NameServer, the stand-alone ``dledger-node``): ``error_middleware`` answers every exception a
handler raises as ``{code, message, ...}`` (the coded ``ProtocolError`` with its status and
aiohttp's HTTP errors are mapped here, the server's ``classify`` maps its own error types, anything
else is a logged 500), and
``query_int`` parses a bounded integer query parameter (400 ``BAD_PARAMETER`` / ``MISSING_FIELD``).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import logging
import re
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from aiohttp import web
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

from broker.protocol.errors import ProtocolError

log = logging.getLogger("http_edge")

BODY_KEY: Final = web.RequestKey("edge.body", bytes)
_RESERVED_KEY: Final = web.RequestKey("edge.reserved", int)
ErrorBody = Callable[[str, str], dict[str, Any]]


class EdgeError(ProtocolError):
    """A request refused by the edge itself (its encoding, size, the body budget, time, a signature
    refused before the body was read): answered by the guard's middleware (outermost), with
    ``extra`` fields in the answer; ``close``: end the connection after the answer (its body was
    never read, so nothing after it can be parsed)."""

    def __init__(self, status: int, code: str, message: str, *, close: bool = False, **extra: Any):
        super().__init__(code, message, status, **extra)
        self.close = close


class ClientGone(Exception):
    """The client closed the connection while its request was being read: nobody to answer."""


@dataclasses.dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """What an error is answered with: HTTP ``status`` and the body ``{code, message, **extra}``."""

    status: int
    code: str
    message: str
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.extra}


# aiohttp's own HTTP errors (router misses, its body limit) get the codes clients already know
HTTP_ERROR_CODES: Final[Mapping[int, str]] = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 413: "BODY_TOO_LARGE"}
_DECIMAL: Final = re.compile(r"-?[0-9]{1,19}")
Classify = Callable[[Exception], ErrorAnswer | None]
Respond = Callable[[web.Request, ErrorAnswer], web.StreamResponse]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_error(request: web.Request, answer: ErrorAnswer) -> web.Response:
    """The default ``Respond``: the error map as JSON."""
    return web.json_response(answer.body(), status=answer.status)


def internal_error(exc: Exception) -> ErrorAnswer:
    """The default answer to an exception nobody mapped (a bug, not bad input): logged, then 500."""
    return ErrorAnswer(500, "INTERNAL", "internal error (logged by the server)")


def coded_answer(exc: BaseException) -> ErrorAnswer | None:
    """The answer to a ``ProtocolError`` that carries its status (None otherwise): the one mapping
    of the coded error to HTTP."""
    if isinstance(exc, ProtocolError) and exc.status:
        return ErrorAnswer(exc.status, exc.code, exc.message, exc.extra)
    return None


def error_middleware(
    classify: Classify | None = None,
    respond: Respond = json_error,
    *,
    internal: Callable[[Exception], ErrorAnswer] = internal_error,
    logger: logging.Logger = log,
) -> Any:
    """The middleware that turns every exception a handler raises into a ``{code, message}``
    answer: ``EdgeError`` / ``ClientGone`` pass through to the guard's middleware (outermost);
    a ``ProtocolError`` that carries its status is answered with it (``coded_answer``), else
    ``classify(exc)`` answers as it says; aiohttp's HTTP errors (>= 400) keep
    their status with a code from ``HTTP_ERROR_CODES`` (else the reason, upper-cased); anything
    else is logged with its traceback and answered ``internal(exc)``."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except (EdgeError, ClientGone):
            raise
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return respond(request, http_error_answer(exc))
        except Exception as exc:
            answer = coded_answer(exc) or (classify(exc) if classify is not None else None)
            if answer is None:
                logger.exception("unexpected error in %s %s", request.method, request.path)
                answer = internal(exc)
            return respond(request, answer)

    return errors


def query_int(request: web.Request, name: str, default: int | None, lo: int, hi: int) -> int:
    """The integer query parameter ``name`` in ``[lo, hi]``; ``default`` when absent (None: it is
    required). Only plain decimal digits (an optional ``-``, at most 19 digits) are accepted: no
    whitespace, ``+`` or ``_`` that ``int()`` would let through."""
    raw = request.query.get(name)
    if raw is None:
        if default is None:
            raise ProtocolError("MISSING_FIELD", f"query parameter {name!r} is required", 400)
        return default
    if _DECIMAL.fullmatch(raw) is None:
        raise ProtocolError("BAD_PARAMETER", f"{name} must be an integer in [{lo}, {hi}], got {raw[:40]!r}", 400)
    value = int(raw)
    if not lo <= value <= hi:
        raise ProtocolError("BAD_PARAMETER", f"{name} must be in [{lo}, {hi}], got {value}", 400)
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    connections_max: int = 1024
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0
    body_timeout_s: float = 30.0
    body_bytes_in_flight_max: int = 256 << 20
    client_max_size: int = 4 << 20
    tls_handshake_timeout_s: float = 10.0
    # aiohttp's parser limits (bytes of one line / of one header field, number of headers)
    max_line_size: int = 8190
    max_field_size: int = 8190
    max_headers: int = 64

    def handler_args(self) -> dict[str, Any]:
        return {
            "max_line_size": self.max_line_size,
            "max_field_size": self.max_field_size,
            "max_headers": self.max_headers,
            "auto_decompress": False,
            # aiohttp's own idle timer stays behind ours (ours closes first; see the module doc)
            "keepalive_timeout": self.idle_timeout_s * 2 + self.header_timeout_s,
        }


class Guard:
    """Counters shared by every connection of one server: open connections, body bytes reserved.
    One owner: the event loop (no locks)."""

    def __init__(self, limits: Limits, error_body: ErrorBody):
        self.limits = limits
        self.error_body = error_body
        self.connections = 0
        self.refused_connections = 0
        self.timed_out_connections = 0
        self.body_bytes_reserved = 0
        self.busy_refusals = 0
        self.evicted_connections = 0
        self.response_headers: dict[str, str] = {}  # on every answer (the signing scope)
        # connections that have not delivered a complete request head yet, oldest first
        self.unproven: collections.OrderedDict[Any, None] = collections.OrderedDict()

    @property
    def unproven_max(self) -> int:
        return max(1, self.limits.connections_max * 3 // 4)

    def stats(self) -> dict[str, int]:
        return {
            "connections": self.connections,
            "refused_connections": self.refused_connections,
            "timed_out_connections": self.timed_out_connections,
            "body_bytes_reserved": self.body_bytes_reserved,
            "busy_refusals": self.busy_refusals,
            "unproven": len(self.unproven),
            "evicted_connections": self.evicted_connections,
        }

    def json_response(
        self, status: int, code: str, message: str, *, close: bool = False, extra: Mapping[str, Any] | None = None
    ) -> web.Response:
        resp = web.Response(
            body=json.dumps({**self.error_body(code, message), **(extra or {})}).encode(), status=status,
            content_type="application/json", headers=self.response_headers,
        )
        if close:
            resp.force_close()
        return resp

    # -- body bytes in flight (shared with the binary port, broker/edge/binary.py) --------------------
    def reserve(self, nbytes: int) -> bool:
        """Reserve ``nbytes`` of the bodies-in-flight budget (False: over it, refuse with BUSY)."""
        if self.body_bytes_reserved + nbytes > self.limits.body_bytes_in_flight_max:
            self.busy_refusals += 1
            return False
        self.body_bytes_reserved += nbytes
        return True

    def release(self, nbytes: int) -> None:
        self.body_bytes_reserved -= nbytes
        assert self.body_bytes_reserved >= 0

    # -- bodies ----------------------------------------------------------------------------------
    async def read_body(self, request: web.Request) -> bytes:
        """The request body, bounded in size, time and (with every other body) memory. Cached."""
        cached = request.get(BODY_KEY)
        if cached is not None:
            return bytes(cached)
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise EdgeError(415, "UNSUPPORTED_CONTENT_ENCODING", "request bodies are not compressed here "
                            f"(Content-Encoding {encoding[:40]!r})")
        if not request.body_exists:
            request[BODY_KEY] = b""
            return b""
        limit = self.limits.client_max_size
        length = request.content_length
        if length is not None and length > limit:
            raise EdgeError(413, "BODY_TOO_LARGE", f"a body of {length} bytes exceeds {limit}")
        reserve = limit if length is None else length
        if not self.reserve(reserve):
            raise EdgeError(503, "BUSY", "too many request bodies in flight; retry shortly")
        request[_RESERVED_KEY] = reserve
        try:
            async with asyncio.timeout(self.limits.body_timeout_s):
                raw = await request.read()
        except TimeoutError:
            raise EdgeError(
                408, "REQUEST_TIMEOUT", f"the body did not arrive within {self.limits.body_timeout_s} s"
            ) from None
        except web.HTTPRequestEntityTooLarge:
            raise EdgeError(413, "BODY_TOO_LARGE", f"the body exceeds {limit} bytes") from None
        except RequestPayloadError as exc:
            raise EdgeError(400, "BAD_BODY", f"the body is malformed: {str(exc)[:120]}") from None
        except (ConnectionError, OSError) as exc:
            raise ClientGone(str(exc)) from None
        request[BODY_KEY] = raw
        return raw

    def _release(self, request: web.Request) -> None:
        reserved = request.get(_RESERVED_KEY)
        if reserved:
            self.release(reserved)
            request[_RESERVED_KEY] = 0

    # -- the outermost middleware -----------------------------------------------------------------
    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.method == "CONNECT" or "Upgrade" in request.headers:
            # aiohttp would parse whatever follows an upgrade as a new request: close instead.
            return self.json_response(405, "METHOD_NOT_ALLOWED", "CONNECT and protocol upgrades are not served",
                                      close=True)
        try:
            return await handler(request)
        except EdgeError as exc:
            return self.json_response(exc.status, exc.code, exc.message, close=exc.close or exc.status in (408, 413),
                                      extra=exc.extra)
        except ClientGone as exc:
            log.debug("%s %s: the client left mid-request (%s)", request.method, request.path, exc)
            return self.json_response(400, "CLIENT_GONE", "the connection closed mid-request", close=True)
        finally:
            self._release(request)


GUARD_KEY: Final = web.AppKey("edge.guard", Guard)


async def request_body(request: web.Request) -> bytes:
    """The body of ``request``, read through its app's guard (``app[GUARD_KEY]``)."""
    return await request.app[GUARD_KEY].read_body(request)


def guarded_app(guard: Guard, middlewares: list[Any]) -> web.Application:
    """An application whose first middleware is the guard's and whose bodies it bounds."""
    app = web.Application(client_max_size=guard.limits.client_max_size, middlewares=[guard.middleware, *middlewares])
    app[GUARD_KEY] = guard

    async def headers(_request: web.Request, response: web.StreamResponse) -> None:
        for name, value in guard.response_headers.items():
            response.headers.setdefault(name, value)

    app.on_response_prepare.append(headers)
    return app


def http_error_answer(exc: web.HTTPException) -> ErrorAnswer:
    """aiohttp's HTTP error as a coded answer (its status, a code from ``HTTP_ERROR_CODES`` or its
    reason upper-cased: 417 -> ``EXPECTATION_FAILED``)."""
    code = HTTP_ERROR_CODES.get(exc.status, exc.reason.upper().replace(" ", "_"))
    return ErrorAnswer(exc.status, code, (exc.text or exc.reason)[:200])


# -- the protocol: connection cap, request-receipt timers, JSON parser errors ------------------------
class _GuardedHandler(RequestHandler):
    __slots__ = ("_accepted", "_evicted", "_guard", "_idle", "_timer")

    def __init__(self, manager: web.Server, *, guard: Guard, **kwargs: Any):
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._accepted = False
        self._evicted = False
        self._timer: asyncio.TimerHandle | None = None
        self._idle = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        while guard.unproven and (
            guard.connections >= guard.limits.connections_max or len(guard.unproven) >= guard.unproven_max
        ):
            oldest = next(iter(guard.unproven))
            assert isinstance(oldest, _GuardedHandler)
            oldest._evict()
        if guard.connections >= guard.limits.connections_max:
            guard.refused_connections += 1
            if guard.refused_connections % 1000 == 1:
                log.warning("connection refused: %d connections open (limit %d)",
                            guard.connections, guard.limits.connections_max)
            transport.close()
            return
        self._accepted = True
        guard.connections += 1
        guard.unproven[self] = None
        super().connection_made(transport)
        self._arm(guard.limits.header_timeout_s, idle=False)

    def _evict(self) -> None:
        """Closed to make room: its slot is free now (connection_lost comes later)."""
        guard = self._guard
        guard.unproven.pop(self, None)
        guard.evicted_connections += 1
        if self._accepted:
            self._accepted = False
            self._evicted = True
            guard.connections -= 1
        self._disarm()
        self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._guard.unproven.pop(self, None)
        if self._evicted:
            self._evicted = False
            super().connection_lost(exc)
            return
        if not self._accepted:
            return
        self._accepted = False
        self._guard.connections -= 1
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._idle and data:  # the next request started: it has header_timeout to arrive
            self._arm(self._guard.limits.header_timeout_s, idle=False)
        super().data_received(data)

    def request_started(self) -> None:
        self._disarm()
        self._guard.unproven.pop(self, None)  # a complete request head: a client, not a half-open flood

    async def finish_response(self, request: Any, resp: Any, start_time: float | None) -> tuple[Any, bool]:
        result = await super().finish_response(request, resp, start_time)
        if self._accepted:
            self._arm(self._guard.limits.idle_timeout_s, idle=True)
        return result

    def _arm(self, timeout_s: float, *, idle: bool) -> None:
        self._disarm()
        self._idle = idle
        self._timer = asyncio.get_running_loop().call_later(timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if not self._idle:
            self._guard.timed_out_connections += 1
            log.debug("closing a connection that sent no complete request in time")
        self.force_close()

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        """Errors raised before the app saw the request (the HTTP parser's): JSON, no traceback."""
        if status >= 500:
            log.error("HTTP %d before the handler ran: %r", status, exc)
        else:
            log.debug("HTTP %d from the parser: %r", status, exc)
        code = {400: "BAD_HTTP_REQUEST", 413: "BODY_TOO_LARGE", 431: "HEADERS_TOO_LARGE", 504: "TIMEOUT"}.get(
            status, "INTERNAL" if status >= 500 else "BAD_HTTP_REQUEST"
        )
        text = (message or (str(exc) if exc is not None else "") or code)[:200]
        return self._guard.json_response(status, code, text, close=True)


class GuardedServer(web.Server):
    """aiohttp's low-level server, making ``_GuardedHandler`` protocols."""

    def __init__(self, handler: Any, *, guard: Guard, request_factory: Any, handler_args: dict[str, Any],
                 handler_cancellation: bool = False):
        def factory(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
            if isinstance(protocol, _GuardedHandler):
                protocol.request_started()
            return request_factory(message, payload, protocol, writer, task)

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            # What aiohttp raises before the app's middlewares run (its ``Expect`` handling: 417)
            # would go out as plain text: answer it coded like every other error, and close (a body
            # may follow that nothing read).
            try:
                return await handler(request)
            except web.HTTPException as exc:
                if exc.status < 400:
                    raise
                a = http_error_answer(exc)
                log.debug("HTTP %d before the middlewares: %s", a.status, a.message)
                return guard.json_response(a.status, a.code, a.message, close=True)

        super().__init__(handle, request_factory=factory, handler_cancellation=handler_cancellation,
                         **handler_args)
        self._edge_guard = guard
        self._edge_args = handler_args
        self._edge_loop = asyncio.get_running_loop()

    def __call__(self) -> RequestHandler:
        return _GuardedHandler(self, guard=self._edge_guard, loop=self._edge_loop, access_log=None, **self._edge_args)


class EdgeRunner(web.AppRunner):
    """``web.AppRunner`` whose server is a ``GuardedServer`` (the app's startup/cleanup run as usual)."""

    __slots__ = ("_edge_guard",)

    def __init__(self, app: web.Application, guard: Guard):
        super().__init__(app, access_log=None, **guard.limits.handler_args())
        self._edge_guard = guard

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()
        return GuardedServer(
            plain.request_handler,
            guard=self._edge_guard,
            request_factory=plain.request_factory,
            handler_args=self._edge_guard.limits.handler_args(),
            handler_cancellation=plain.handler_cancellation,
        )


class EdgeSite(web.BaseSite):
    """``web.TCPSite`` with a TLS handshake timeout (a client stalling the handshake holds no slot)."""

    __slots__ = ("_edge_handshake_s", "_edge_host", "_edge_port", "bound_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                 handshake_timeout_s: float = 10.0, backlog: int = 1024):
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._edge_host = host
        self._edge_port = port
        self._edge_handshake_s = handshake_timeout_s
        self.bound_port = port

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._edge_host}:{self.bound_port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            server,
            self._edge_host,
            self._edge_port,
            ssl=self._ssl_context,
            ssl_handshake_timeout=self._edge_handshake_s if self._ssl_context else None,
            backlog=self._backlog,
            reuse_address=True,
        )
        if self._server.sockets:
            self.bound_port = self._server.sockets[0].getsockname()[1]


async def start_server(
    app: web.Application, guard: Guard, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> tuple[EdgeRunner, EdgeSite]:
    """Set up and start ``app`` behind ``guard`` on ``host:port``; ``runner.cleanup()`` ends it."""
    runner = EdgeRunner(app, guard)
    await runner.setup()
    site = EdgeSite(runner, host, port, ssl_context=ssl_context,
                    handshake_timeout_s=guard.limits.tls_handshake_timeout_s)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, site


# -- TLS ---------------------------------------------------------------------------------------------
def server_ssl_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    return ctx

