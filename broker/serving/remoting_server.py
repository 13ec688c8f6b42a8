"""RocketMQ's remoting protocol served on asyncio: connections, the dispatch table and the bounds.

``RemotingServer`` is the protocol factory a listener hands connections to (``sniff`` on a shared
port). Each ``RemotingConnection`` decodes frames with ``FrameDecoder`` and starts one task per
request, so many requests are in flight per connection and their answers go out in completion order
(the client matches them by ``opaque``). A oneway request is handled and never answered. The server
may send a client requests of its own (``invoke``: CHECK_TRANSACTION_STATE, NOTIFY_CONSUMER_IDS_CHANGED)
with opaques it picks and a bounded wait for the answer.

Dispatch: ``RemotingServer.route(code, handler, ...)`` registers ``async handler(Request) ->
RemotingCommand | None``. Per request, in one place (``dispatch``):

- an unregistered code answers REQUEST_CODE_NOT_SUPPORTED with RocketMQ's remark;
- the sender is authenticated (``remoting_acl.RemotingAuthenticator``) before the handler runs; a
  refusal answers NO_PERMISSION with the reason as remark (as RocketMQ 5.3's authorization does; its
  ACL 1.0 check answers SYSTEM_ERROR with the exception text);
- a handler's ``CommandError`` answers its response code and remark (a RocketMQ answer the handler
  chose); the coded ``ProtocolError`` (the project's one error type: a ``RemotingError`` from reading a
  header or body, the NameServer's and the service's refusals) is mapped here and only here
  (``response_code``): SYSTEM_BUSY for the codes in ``RESPONSE_CODES``, the codes a server adds
  (``response_codes=``: the broker's RocketMQ edge gives its table, broker/edge/rocketmq/errors.py)
  theirs, SYSTEM_ERROR for the rest, the remark ``CODE: message``; anything else is a bug: logged
  with its traceback, answered SYSTEM_ERROR.

Bounds (``RemotingLimits``), each connection unless said otherwise:

- a frame is at most ``bounds.frame_bytes_max`` (checked from its length prefix, before buffering);
  a frame that cannot be decoded (garbage, a bad header) closes the connection at once, as RocketMQ's
  decoder does: after a bad frame nothing that follows can be trusted to be aligned;
- at most ``connections_max`` connections; more are closed at once;
- the first frame must be complete within ``first_frame_timeout_s`` of the connect; a frame once
  started within ``frame_timeout_s`` (bytes trickling in do not extend it); a connection with nothing
  in flight and nothing buffered is closed after ``idle_timeout_s``;
- at most ``in_flight_max`` requests handled at once: at the cap the connection stops reading the
  socket (``pause_reading``: TCP back-pressure reaches the client) until an answer goes out; answers
  wait while the transport's write buffer is full, so a client that does not read holds no more than
  the in-flight answers (the answers made in one loop turn leave in one write at its end);
- at most ``server_requests_max`` requests of the server awaiting a client's answer;
- process-wide: the bytes received but not yet authenticated (partial frames, and whole frames until
  their sender is checked) share one ``ByteBudget``; a connection whose next bytes would exceed it is
  closed (``budget_refusals``). One ``RemotingServer`` serves every port of a process, so its budget is
  the process's.

Ownership: everything here runs on the event loop; a connection's counters belong to it, the
server's to the server. No locks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar, cast

from broker.protocol.auth import AuthError
from broker.protocol.errors import ProtocolError
from broker.protocol.rocketmq import command as rc
from broker.protocol.rocketmq import header_fields
from broker.protocol.rocketmq.codes import (
    ResponseCode,
    SerializeType,
    not_supported_remark,
    request_code_name,
)
from broker.protocol.rocketmq.command import DEFAULT_BOUNDS, Bounds, FrameDecoder, RemotingCommand
from broker.protocol.rocketmq.errors import RemotingError
from broker.serving.acl import Perm, check
from broker.serving.security import ALL, Principal

log = logging.getLogger("broker.serving.remoting")

H = TypeVar("H")
INTERNAL_REMARK: Final = "internal error (logged by the server)"
UNAUTHENTICATED_BYTES_MAX_DEFAULT: Final = 64 << 20


class CommandError(Exception):
    """An answer other than SUCCESS that a handler chose: a RocketMQ response ``code`` (an int of
    ``ResponseCode``, not one of the project's error codes) and its ``remark``. Not a coded error: a
    refusal the project names raises ``ProtocolError``, answered by ``response_code``."""

    def __init__(self, code: int, remark: str):
        super().__init__(f"{code}: {remark}")
        self.code = code
        self.remark = remark


# The response code of a coded error (``ProtocolError.code``) that a client should treat otherwise than
# SYSTEM_ERROR: back-pressure is SYSTEM_BUSY (RocketMQ's clients retry it later).
RESPONSE_CODES: Final[Mapping[str, int]] = {"BUSY": ResponseCode.SYSTEM_BUSY, "SHUTTING_DOWN": ResponseCode.SYSTEM_BUSY}


def response_code(exc: ProtocolError, codes: Mapping[str, int] = RESPONSE_CODES) -> int:
    """The one mapping of the coded error to a RocketMQ response code (the remark is ``CODE: message``):
    a refused signature or permission is NO_PERMISSION, the codes of ``codes`` theirs (a server's
    table: ``RESPONSE_CODES`` and what it adds, as the broker's RocketMQ edge does), the rest
    SYSTEM_ERROR."""
    if isinstance(exc, AuthError):
        return ResponseCode.NO_PERMISSION
    return codes.get(exc.code, ResponseCode.SYSTEM_ERROR)


@dataclasses.dataclass(frozen=True, slots=True)
class RemotingLimits:
    bounds: Bounds = DEFAULT_BOUNDS
    connections_max: int = 1024
    in_flight_max: int = 256
    first_frame_timeout_s: float = 10.0
    frame_timeout_s: float = 30.0
    idle_timeout_s: float = 120.0  # RocketMQ's serverChannelMaxIdleTimeSeconds
    server_requests_max: int = 256


class ByteBudget:
    """Bytes held across connections before their request is authenticated. ``try_reserve`` refuses
    (and counts) rather than waits: a holder never needs more budget to give back what it holds."""

    def __init__(self, bytes_max: int = UNAUTHENTICATED_BYTES_MAX_DEFAULT):
        assert bytes_max > 0
        self.bytes_max = bytes_max
        self.used = 0
        self.refusals = 0

    def try_reserve(self, nbytes: int) -> bool:
        if self.used + nbytes > self.bytes_max:
            self.refusals += 1
            return False
        self.used += nbytes
        return True

    def release(self, nbytes: int) -> None:
        self.used -= nbytes
        assert self.used >= 0, "byte budget released more than it reserved"


class Stats:
    def __init__(self) -> None:
        self.connections = 0
        self.refused_connections = 0
        self.timed_out_connections = 0
        self.bad_frames = 0
        self.budget_refusals = 0
        self.requests = 0
        self.not_supported = 0
        self.auth_refused = 0
        self.errors = 0
        self.paused = 0
        self.server_requests = 0
        self.server_request_timeouts = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


# -- requests and the dispatch table ------------------------------------------------------------------
@dataclasses.dataclass(slots=True)
class Request:
    """One request as a handler sees it: the command, who sent it, on which connection."""

    cmd: RemotingCommand
    principal: Principal
    connection: RemotingConnection

    @property
    def peer(self) -> str:
        return self.connection.peer

    def header(self, cls: type[H]) -> H:
        """The typed header (``RemotingError`` MISSING_FIELD / BAD_FIELD: answered SYSTEM_ERROR)."""
        return header_fields.parse(cls, self.cmd.ext_fields)

    def require(self, *, topics: Mapping[str, Perm] | None = None, groups: Mapping[str, Perm] | None = None,
                admin: bool = False) -> None:
        """Raise ``AuthError`` (answered NO_PERMISSION) unless the sender may do this."""
        if self.principal.everything:
            return
        if self.principal.account is None:
            raise AuthError(401, "NO_CREDENTIALS", "this request must be signed (ACL is enabled)")
        check(self.principal.account, topics=topics or {}, groups=groups or {}, admin=admin)

    def ok(self, *, ext_fields: Mapping[str, str] | None = None, body: bytes = b"") -> RemotingCommand:
        return rc.response_to(self.cmd, ResponseCode.SUCCESS, None, ext_fields, body)

    def answer(self, code: int, remark: str | None = None, *, ext_fields: Mapping[str, str] | None = None,
               body: bytes = b"") -> RemotingCommand:
        return rc.response_to(self.cmd, code, remark, ext_fields, body)


Handler = Callable[[Request], Awaitable[RemotingCommand | None]]


class Authenticator:
    """What ``RemotingServer`` asks before a handler runs (``remoting_acl.RemotingAuthenticator``)."""

    def authenticate(self, cmd: RemotingCommand, peer: str, route: Route) -> Principal:
        return ALL


@dataclasses.dataclass(frozen=True, slots=True)
class Route:
    """A served request code. ``anonymous``: with ACL on, answered unsigned too (the NameServer's
    reads, as its HTTP reads); ``writes``: changes state (what ``remotingAclV1=readonly`` refuses)."""

    code: int
    handler: Handler
    anonymous: bool = False
    writes: bool = False


# -- the server -----------------------------------------------------------------------------------------
class RemotingServer:
    """Serves the registered routes to every connection made with it (it is the protocol factory)."""

    def __init__(self, *, authenticator: Authenticator | None = None, limits: RemotingLimits | None = None,
                 budget: ByteBudget | None = None, response_codes: Mapping[str, int] | None = None):
        self.limits = limits or RemotingLimits()
        # coded error -> response code (``response_code``): RESPONSE_CODES and the server's own
        self.response_codes: Mapping[str, int] = {**RESPONSE_CODES, **(response_codes or {})}
        self.authenticator = authenticator or Authenticator()
        self.budget = budget or ByteBudget()
        self.routes: dict[int, Route] = {}
        self.connections: set[RemotingConnection] = set()
        self.stats = Stats()
        self._tasks: set[asyncio.Task[None]] = set()

    def route(self, code: int, handler: Handler, *, anonymous: bool = False, writes: bool = False) -> None:
        assert code not in self.routes, f"code {code} routed twice"
        self.routes[code] = Route(code, handler, anonymous, writes)

    def __call__(self) -> RemotingConnection:
        return RemotingConnection(self)

    def status(self) -> dict[str, Any]:
        return {**self.stats.as_dict(), "unauthenticated_bytes": self.budget.used,
                "unauthenticated_bytes_max": self.budget.bytes_max}

    async def stop(self, grace_s: float = 5.0) -> None:
        """Close every connection; requests being handled get ``grace_s`` to end, then are cancelled."""
        for conn in list(self.connections):
            conn.close()
        tasks = [t for t in self._tasks if not t.done()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def dispatch(self, conn: RemotingConnection, cmd: RemotingCommand, held_bytes: int) -> RemotingCommand | None:
        """The answer to ``cmd`` (None: no answer, the request was oneway or the handler gave none).
        ``held_bytes`` of the budget are given back once the sender is authenticated."""
        self.stats.requests += 1
        route = self.routes.get(cmd.code)
        try:
            try:
                if route is None:
                    self.stats.not_supported += 1
                    log.debug("%s sent request code %d, which is not served here", conn.peer, cmd.code)
                    return rc.response_to(cmd, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                          not_supported_remark(cmd.code))
                principal = self.authenticator.authenticate(cmd, conn.peer, route)
            finally:
                self.budget.release(held_bytes)  # checked (or refused): no longer unauthenticated input
            return await route.handler(Request(cmd, principal, conn))
        except CommandError as exc:
            return rc.response_to(cmd, exc.code, exc.remark)
        except ProtocolError as exc:
            if isinstance(exc, AuthError):
                self.stats.auth_refused += 1
                log.debug("%s: %s refused: %s", conn.peer, request_code_name(cmd.code), exc)
            else:
                self.stats.errors += 1
            return rc.response_to(cmd, response_code(exc, self.response_codes), f"{exc.code}: {exc.message}")
        except asyncio.CancelledError:
            raise
        except Exception:
            self.stats.errors += 1
            log.exception("unexpected error in remoting request %s from %s", request_code_name(cmd.code), conn.peer)
            return rc.response_to(cmd, ResponseCode.SYSTEM_ERROR, INTERNAL_REMARK)


# -- one connection ---------------------------------------------------------------------------------------
class RemotingConnection(asyncio.Protocol):
    """One client connection. Timers: ``first`` (the first frame), ``frame`` (a started frame), ``idle``."""

    def __init__(self, server: RemotingServer):
        self.server = server
        self.limits = server.limits
        self.decoder = FrameDecoder(server.limits.bounds)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.closed = False
        self.accepted = False
        self.in_flight = 0
        self.held_bytes = 0  # of the budget: what the decoder holds (== decoder.buffered between calls)
        self.got_frame = False
        self.reading_paused = False
        self.writing_paused = False
        self._write_resumed: asyncio.Event | None = None
        self._out: list[bytes] = []  # frames made this loop turn, written together at its end (``_flush``)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_kind = ""
        self._next_opaque = 1 << 30  # the server's own requests: apart from the client's small numbers
        self._waiting: dict[int, asyncio.Future[RemotingCommand]] = {}
        self.serialize_type = SerializeType.JSON  # of the client's last request: used for ours

    # -- lifecycle ------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance check.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        stats = self.server.stats
        if stats.connections >= self.limits.connections_max:
            stats.refused_connections += 1
            if stats.refused_connections % 1000 == 1:
                log.warning("remoting connection refused: %d open (limit %d)", stats.connections,
                            self.limits.connections_max)
            self.closed = True
            transport.close()
            return
        self.accepted = True
        stats.connections += 1
        self.server.connections.add(self)
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self._arm(self.limits.first_frame_timeout_s, "first")

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self._disarm()
        if self.held_bytes:
            self.server.budget.release(self.held_bytes)
            self.held_bytes = 0
        if self.accepted:
            self.accepted = False
            self.server.stats.connections -= 1
            self.server.connections.discard(self)
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(ConnectionError("the client connection closed"))
        self._waiting.clear()
        if self._write_resumed is not None:
            self._write_resumed.set()

    def eof_received(self) -> bool | None:
        if self.decoder.mid_frame:
            log.debug("remoting connection from %s ended mid-frame", self.peer)
        return False

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self._flush()  # frames already made go out first, as when each was written at once
            self.closed = True
            self.transport.close()

    # -- timers ---------------------------------------------------------------------------------------
    def _arm(self, timeout_s: float, kind: str) -> None:
        self._disarm()
        self._timer_kind = kind
        self._timer = asyncio.get_running_loop().call_later(timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_kind = ""

    def _expired(self) -> None:
        kind, self._timer, self._timer_kind = self._timer_kind, None, ""
        if kind in ("first", "frame"):
            self.server.stats.timed_out_connections += 1
            log.debug("closing the remoting connection from %s: no complete frame in time", self.peer)
        self.close()

    def _rearm(self, frame_started: bool) -> None:
        if self.closed:
            return
        if self.reading_paused:
            self._disarm()  # the client waits for us (in-flight cap): its bytes are not late
        elif self.decoder.mid_frame:
            if not self.got_frame:
                return  # the first frame's timer runs from the connect
            if frame_started or self._timer_kind != "frame":
                self._arm(self.limits.frame_timeout_s, "frame")
        elif self.in_flight or self._waiting:
            self._disarm()  # the server owes an answer, or awaits one (bounded by its own time-out)
        elif self._timer_kind != "idle":
            self._arm(self.limits.idle_timeout_s, "idle")

    # -- reading --------------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if not self.server.budget.try_reserve(len(data)):
            self.server.stats.budget_refusals += 1
            log.info("closing the remoting connection from %s: %d bytes of unauthenticated input are held "
                     "already (limit %d)", self.peer, self.server.budget.used, self.server.budget.bytes_max)
            self.close()
            return
        self.held_bytes += len(data)
        self.decoder.feed(data)
        self._drain()

    def _drain(self) -> None:
        started = False
        while not self.closed and self.in_flight < self.limits.in_flight_max:
            before = self.decoder.buffered
            try:
                cmd = self.decoder.next()
            except RemotingError as exc:
                self.server.stats.bad_frames += 1
                log.debug("closing the remoting connection from %s: %s: %s", self.peer, exc.code, exc.message)
                self.close()
                return
            if cmd is None:
                break
            consumed = before - self.decoder.buffered
            self.held_bytes -= consumed
            started = True
            self._frame(cmd, consumed)
        if self.closed:
            return
        if self.in_flight >= self.limits.in_flight_max and not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.server.stats.paused += 1
            self.transport.pause_reading()
        self._rearm(started)

    def _frame(self, cmd: RemotingCommand, held: int) -> None:
        self.got_frame = True
        if cmd.is_response:
            self.server.budget.release(held)  # an answer to the server's own request: nothing to check
            fut = self._waiting.pop(cmd.opaque, None)
            if fut is None:
                log.debug("%s answered opaque %d, which the server is not waiting for", self.peer, cmd.opaque)
            elif not fut.done():
                fut.set_result(cmd)
            return
        self.serialize_type = cmd.serialize_type
        self.in_flight += 1
        self.server.track(asyncio.get_running_loop().create_task(self._handle(cmd, held)))

    async def _handle(self, cmd: RemotingCommand, held: int) -> None:
        try:
            answer = await self.server.dispatch(self, cmd, held)
            if answer is not None and not cmd.is_oneway:
                await self._write(answer)
            elif answer is not None and answer.code != ResponseCode.SUCCESS:
                log.debug("oneway %s from %s failed: %s %s", request_code_name(cmd.code), self.peer,
                          answer.code, answer.remark)
        finally:
            self._done()

    def _done(self) -> None:
        self.in_flight -= 1
        if self.closed:
            return
        if self.reading_paused and self.in_flight < self.limits.in_flight_max:
            self.reading_paused = False
            assert self.transport is not None
            self.transport.resume_reading()
            self._drain()  # frames that arrived before the pause
        elif self.in_flight == 0:
            self._rearm(False)

    # -- writing (a client that does not read holds no more than the in-flight answers) ---------------
    async def _write(self, cmd: RemotingCommand) -> None:
        while self.writing_paused and not self.closed:
            if self._write_resumed is None:
                self._write_resumed = asyncio.Event()
            await self._write_resumed.wait()
        if self.closed or self.transport is None:
            return
        try:
            header = rc.encode_header(cmd)
        except ValueError as exc:  # a code or version beyond the ROCKETMQ header's int16: a bug of ours
            log.error("cannot encode the answer to %s: %s", self.peer, exc)
            return
        # The answers of one loop turn (an entry's commit resolves many sends at once) leave in one
        # write: one system call instead of one per answer, the same bytes in the same order.
        out = self._out
        if not out:
            asyncio.get_running_loop().call_soon(self._flush)
        out.append(header)
        if cmd.body:
            out.append(cmd.body)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if out and not self.closed and self.transport is not None:
            self.transport.writelines(out)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self._write_resumed is not None:
            self._write_resumed.set()
            self._write_resumed = None

    # -- the server's own requests ---------------------------------------------------------------------
    def _request(self, code: int, ext_fields: Mapping[str, str] | None, body: bytes, oneway: bool) -> RemotingCommand:
        opaque = self._next_opaque
        self._next_opaque = opaque + 1 if opaque < 2**31 - 1 else 1 << 30
        return rc.request(code, opaque, ext_fields, body, oneway=oneway, serialize_type=self.serialize_type)

    async def invoke(self, code: int, ext_fields: Mapping[str, str] | None = None, body: bytes = b"", *,
                     timeout_s: float) -> RemotingCommand:
        """Send the client a request and wait at most ``timeout_s`` for its answer (``TimeoutError``;
        ``ConnectionError`` when the connection is gone; ``CommandError`` SYSTEM_BUSY when
        ``server_requests_max`` answers are awaited already)."""
        if self.closed:
            raise ConnectionError("the client connection is closed")
        if len(self._waiting) >= self.limits.server_requests_max:
            raise CommandError(ResponseCode.SYSTEM_BUSY,
                               f"{len(self._waiting)} requests to {self.peer} await an answer already")
        cmd = self._request(code, ext_fields, body, oneway=False)
        fut: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        self._waiting[cmd.opaque] = fut
        self.server.stats.server_requests += 1
        self._rearm(False)
        try:
            await self._write(cmd)
            async with asyncio.timeout(timeout_s):
                return await fut
        except TimeoutError:
            self.server.stats.server_request_timeouts += 1
            raise
        finally:
            self._waiting.pop(cmd.opaque, None)
            if not self.closed and not self.in_flight and not self.decoder.mid_frame:
                self._rearm(False)

    async def invoke_oneway(self, code: int, ext_fields: Mapping[str, str] | None = None, body: bytes = b"") -> None:
        """Send the client a oneway request (no answer is expected); nothing if the connection is gone."""
        if self.closed:
            return
        self.server.stats.server_requests += 1
        await self._write(self._request(code, ext_fields, body, oneway=True))
