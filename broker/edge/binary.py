"""The broker's binary listener (``remotingListenPort``): the frames of ``broker.protocol.frames``
on asyncio protocols, many requests in flight per connection, answers in completion order.

Bounds (each connection):

- a frame is at most ``frame_bytes_max`` (the HTTP body cap); beyond, or a malformed header: an
  error frame ``{code, message}`` (request id 0) and the connection is closed;
- at most ``in_flight_max`` requests being handled: at the cap the protocol stops reading the
  socket (TCP back-pressure reaches the client) until an answer goes out;
- the first complete frame must arrive within ``handshake_timeout_s`` of the connect; a frame
  once started must be complete within ``frame_timeout_s``; a connection with nothing in flight
  and nothing received for ``idle_timeout_s`` is closed;
- at most ``connections_max`` connections at once (more are closed at once);
- written answers waiting in the socket buffer pause the handling of new requests (the
  transport's write flow control) so a client that does not read cannot grow the broker's memory.

Authentication: with the ACL on, every request frame carries the HTTP scheme's signature
(``broker.protocol.auth``, method ``REMOTING``, target the op's name, over the body) and is verified
by the broker's ``Security`` exactly like an HTTP request (white list, signature, timestamp
window, nonce window); the dispatcher then checks permissions with the principal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, cast

from broker.protocol.auth import AuthError
from broker.protocol.frames import (
    AUTH_METHOD,
    FLAG_ERROR,
    FLAG_RESPONSE,
    FRAME_BYTES_MAX_DEFAULT,
    Frame,
    FrameDecoder,
    FrameError,
    Op,
    encode,
    error_body,
    op_name,
    pack_body,
    unpack_body,
)
from broker.serving.security import ALL, Principal, Security

log = logging.getLogger("broker.remoting")


@dataclasses.dataclass(frozen=True, slots=True)
class RemotingLimits:
    frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT
    in_flight_max: int = 256
    connections_max: int = 1024
    handshake_timeout_s: float = 10.0
    frame_timeout_s: float = 30.0
    idle_timeout_s: float = 60.0
    tls_handshake_timeout_s: float = 10.0


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """One request as the dispatcher sees it."""

    op: Op
    principal: Principal
    peer: str  # the client's IP address
    body: dict[str, Any]


class CallError(Exception):
    """An error answer: ``status`` (HTTP's meaning), ``code``, message and extra fields."""

    def __init__(self, status: int, code: str, message: str, **extra: Any):
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra


Dispatch = Callable[[Call], Awaitable[dict[str, Any]]]
ErrorMapper = Callable[[BaseException], CallError | None]


class Stats:
    def __init__(self) -> None:
        self.connections = 0
        self.refused_connections = 0
        self.timed_out_connections = 0
        self.bad_frames = 0
        self.requests = 0
        self.auth_refused = 0
        self.paused = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class Authenticator:
    """A request frame's principal, checked like ``Security.authenticate`` checks HTTP requests."""

    def __init__(self, security: Security | None):
        self.security = security

    def principal(self, frame: Frame, peer: str) -> Principal:
        sec = self.security
        if sec is None or sec.watcher is None:
            return ALL
        acl = sec.watcher.current
        if acl.white_listed(peer):
            return ALL
        access_key = sec.verifier.verify(
            frame.auth or None, AUTH_METHOD, op_name(frame.op), frame.body, sec._wall_ms()
        )
        account = acl.accounts.get(access_key)
        if account is None:  # removed by a reload between the two reads
            raise AuthError(401, "SIGNATURE_INVALID", "unknown access key or wrong signature")
        return Principal(account)


class _Connection(asyncio.Protocol):
    def __init__(self, server: RemotingServer):
        self.server = server
        self.limits = server.limits
        self.decoder = FrameDecoder(server.limits.frame_bytes_max)
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.in_flight = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.reading_paused = False
        self.writing_paused = False
        self.write_resumed: asyncio.Event | None = None
        self.closed = False
        self.accepted = False
        self.got_frame = False
        self.failing: bytes | None = None  # the error frame to send once the answers in flight are out
        self._timer: asyncio.TimerHandle | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance check here.
        transport = cast(asyncio.Transport, transport)
        stats = self.server.stats
        if stats.connections >= self.limits.connections_max:
            stats.refused_connections += 1
            transport.close()
            self.closed = True
            return
        self.accepted = True
        stats.connections += 1
        self.server.connections.add(self)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self._arm(self.limits.handshake_timeout_s)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self._disarm()
        if self.accepted:
            self.accepted = False
            self.server.stats.connections -= 1
            self.server.connections.discard(self)
        # Requests being handled run to their end (like HTTP handlers, never cancelled half-way
        # through an append); their answers are dropped.
        if self.write_resumed is not None:
            self.write_resumed.set()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    # -- timers -----------------------------------------------------------------------------------
    def _arm(self, timeout_s: float) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.failing is not None:
            self.close()
            return
        if self.in_flight and not self.decoder.mid_frame:
            return  # answers pending: the next one re-arms the idle timer
        if not self.got_frame or self.decoder.mid_frame:
            self.server.stats.timed_out_connections += 1
            log.debug("closing a remoting connection from %s: no complete frame in time", self.peer)
        self.close()

    def _rearm(self) -> None:
        if self.decoder.mid_frame:
            self._arm(self.limits.frame_timeout_s if self.got_frame else self.limits.handshake_timeout_s)
        elif self.in_flight == 0:
            self._arm(self.limits.idle_timeout_s)
        else:
            self._disarm()

    # -- reading ----------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        was_mid = self.decoder.mid_frame
        self.decoder.feed(data)
        self._drain_frames()
        if not self.closed and (not was_mid or not self.decoder.mid_frame):
            self._rearm()

    def eof_received(self) -> bool | None:
        if self.decoder.mid_frame:
            log.debug("remoting connection from %s ended mid-frame", self.peer)
        return False  # close our side too (answers in flight are dropped with the connection)

    def _drain_frames(self) -> None:
        while not self.closed and self.failing is None and self.in_flight < self.limits.in_flight_max:
            try:
                frame = self.decoder.next()
            except FrameError as exc:
                self._fatal(exc.code, exc.message)
                return
            if frame is None:
                return
            self.got_frame = True
            self._start(frame)
        if self.in_flight >= self.limits.in_flight_max and not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.server.stats.paused += 1
            self.transport.pause_reading()

    def _fatal(self, code: str, message: str) -> None:
        self.server.stats.bad_frames += 1
        log.debug("bad frame from %s: %s: %s", self.peer, code, message)
        self.failing = encode(0, 0, error_body(code, message, 400), flags=FLAG_RESPONSE | FLAG_ERROR)
        if self.in_flight:  # answer what was read before the bad frame, then refuse and close
            if self.transport is not None and not self.reading_paused:
                self.reading_paused = True
                self.transport.pause_reading()
            self._arm(self.limits.frame_timeout_s)
            return
        self._refuse()

    def _refuse(self) -> None:
        if self.transport is not None and not self.closed and self.failing is not None:
            self.transport.write(self.failing)
        self.close()

    def _start(self, frame: Frame) -> None:
        if frame.is_response:
            self._fatal("BAD_FRAME", "a client sends requests only")
            return
        self.in_flight += 1
        self._disarm()
        task = asyncio.get_running_loop().create_task(self._handle(frame))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _handle(self, frame: Frame) -> None:
        try:
            flags, body = FLAG_RESPONSE, await self.server.handle(frame, self.peer)
        except CallError as exc:
            flags, body = FLAG_RESPONSE | FLAG_ERROR, error_body(exc.code, exc.message, exc.status, **exc.extra)
        try:
            await self._write(encode(frame.op, frame.request_id, body, flags=flags))
        finally:
            self._done()

    def _done(self) -> None:
        self.in_flight -= 1
        if self.closed:
            return
        if self.failing is not None:
            if self.in_flight == 0:
                self._refuse()
            return
        if self.reading_paused and self.in_flight < self.limits.in_flight_max:
            self.reading_paused = False
            assert self.transport is not None
            self.transport.resume_reading()
            self._drain_frames()  # frames that arrived before the pause
        if not self.closed and self.in_flight == 0:
            self._rearm()

    # -- writing (flow control: a client that does not read holds no more than the socket buffers)
    async def _write(self, data: bytes) -> None:
        while self.writing_paused and not self.closed:
            if self.write_resumed is None:
                self.write_resumed = asyncio.Event()
            await self.write_resumed.wait()
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.write_resumed is not None:
            self.write_resumed.set()
            self.write_resumed = None


class RemotingServer:
    """Serves ``dispatch`` on a TCP port. ``map_error`` turns the dispatcher's exceptions into error
    answers (None: unexpected, logged, answered INTERNAL)."""

    def __init__(
        self,
        dispatch: Dispatch,
        *,
        security: Security | None,
        limits: RemotingLimits | None = None,
        map_error: ErrorMapper | None = None,
    ):
        self.dispatch = dispatch
        self.auth = Authenticator(security)
        self.limits = limits or RemotingLimits()
        self.map_error = map_error or (lambda exc: None)
        self.stats = Stats()
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self.bound_port = 0

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self),
            host,
            port,
            ssl=ssl_context,
            ssl_handshake_timeout=self.limits.tls_handshake_timeout_s if ssl_context else None,
            backlog=1024,
            reuse_address=True,
        )
        self.bound_port = int(self._server.sockets[0].getsockname()[1]) if self._server.sockets else port
        return self.bound_port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            try:
                async with asyncio.timeout(5.0):
                    await self._server.wait_closed()
            except TimeoutError:
                log.warning("remoting connections did not close within 5 s")
            self._server = None

    async def handle(self, frame: Frame, peer: str) -> bytes:
        """The answer body of one request frame, or ``CallError``."""
        self.stats.requests += 1
        try:
            op = Op(frame.op)
        except ValueError:
            raise CallError(400, "UNKNOWN_OP", f"op {frame.op} is not served") from None
        try:
            principal = self.auth.principal(frame, peer)
        except AuthError as exc:
            self.stats.auth_refused += 1
            raise CallError(exc.status, exc.code, exc.message) from None
        try:
            body = unpack_body(frame.body)
        except FrameError as exc:
            raise CallError(400, exc.code, exc.message) from None
        if op is Op.PING:
            return pack_body({})
        try:
            return pack_body(await self.dispatch(Call(op, principal, peer, body)))
        except CallError:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            mapped = self.map_error(exc)
            if mapped is None:
                log.exception("unexpected error in remoting op %s", op.name)
                raise CallError(500, "INTERNAL", "internal error (logged by the broker)") from None
            raise mapped from None
