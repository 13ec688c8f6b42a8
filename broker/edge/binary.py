"""The broker's binary listener (``remotingListenPort``): the frames of ``broker.protocol.frames``
on asyncio protocols, many requests in flight per connection, answers in completion order.

Bounds (each connection, and the listener as a whole):

- a frame is at most ``frame_bytes_max`` (the HTTP body cap); beyond, or a malformed header: an
  error frame ``{code, message}`` (request id 0) and the connection is closed;
- **a frame's signature is checked from its head** (14 bytes and the signature, at most 1,038
  bytes) before a byte of its body is kept: a refused frame is answered with its error and its
  body is discarded unread as it arrives; an accepted one reserves its body's bytes from the
  broker's budget of bodies in flight (``serverBodyBytesInFlightMax``, shared with the HTTP port:
  503 ``BUSY`` and the body discarded when it is spent);
- **unauthenticated connections** — those that have not yet sent one frame whose head verified —
  hold at most one partial head each, together at most ``unauthenticated_bytes_max`` (beyond, the
  connection that would pass it is closed), and at most ``unauthenticated_connections_max`` of
  them are open: a new connection then closes the oldest unauthenticated one, so a flood of
  half-open connections churns among itself and the remaining slots of ``connections_max`` stay
  for connections that authenticated (signed clients are never locked out by it);
- at most ``in_flight_max`` requests being handled: at the cap the protocol stops reading the
  socket (TCP back-pressure reaches the client) until an answer goes out;
- the first frame head must verify within ``handshake_timeout_s`` of the connect; a frame once
  started must be complete within ``frame_timeout_s``; a connection with nothing in flight and
  nothing received for ``idle_timeout_s`` is closed;
- written answers waiting in the socket buffer pause the handling of new requests and the reading
  of the socket (the transport's write flow control) so a client that does not read cannot grow
  the broker's memory.

Authentication: with the ACL on, every request frame carries the HTTP scheme's signature
(``broker.protocol.auth``, method ``REMOTING``, target the op's name, the broker's scope, the body's
declared hash) and is verified by the broker's ``Security`` exactly like an HTTP request (white
list, scope, signature, timestamp window, nonce windows); the dispatcher then checks permissions
with the principal.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, cast

from broker.protocol.auth import AuthError, SignedHeader, check_body
from broker.protocol.errors import ProtocolError
from broker.protocol.frames import (
    AUTH_METHOD,
    FLAG_ERROR,
    FLAG_RESPONSE,
    FRAME_BYTES_MAX_DEFAULT,
    OPS,
    FrameDecoder,
    FrameError,
    FrameHead,
    Op,
    encode,
    error_body,
    op_name,
    pack_body,
    unpack_body,
)
from broker.serving.http_edge import Guard
from broker.serving.security import ALL, SIGNED, Principal, Security, SignedRequest

log = logging.getLogger("broker.remoting")


@dataclasses.dataclass(frozen=True, slots=True)
class RemotingLimits:
    frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT
    in_flight_max: int = 256
    connections_max: int = 1024
    # Of connections_max, how many may be unauthenticated at once (the rest stay for connections
    # that proved an account), and the bytes they may make the broker hold together.
    unauthenticated_connections_max: int = 768
    unauthenticated_bytes_max: int = 1 << 20
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


Dispatch = Callable[[Call], Awaitable[dict[str, Any]]]


class Stats:
    def __init__(self) -> None:
        self.connections = 0
        self.unauthenticated = 0  # connections open that have not verified a frame yet
        self.unauthenticated_bytes = 0  # what those hold (partial heads)
        self.unauthenticated_bytes_peak = 0
        self.refused_connections = 0
        self.evicted_connections = 0  # unauthenticated ones closed to make room (see the module doc)
        self.over_budget_connections = 0
        self.timed_out_connections = 0
        self.bad_frames = 0
        self.requests = 0
        self.auth_refused = 0
        self.busy_refused = 0
        self.skipped_body_bytes = 0
        self.paused = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


@dataclasses.dataclass(frozen=True, slots=True)
class Verified:
    """A frame head that passed: who sent it, and the signature its body must match (None: ACL off
    or a white-listed address)."""

    principal: Principal
    signed: SignedHeader | None


class Authenticator:
    """A request frame's principal, checked from its head like ``Security.authenticate`` checks an
    HTTP request's head; the body is compared with the declared hash once it is in."""

    def __init__(self, security: Security | None):
        self.security = security

    def verify_head(self, head: FrameHead, peer: str) -> Verified:
        sec = self.security
        if sec is None or sec.watcher is None:
            return Verified(ALL, None)
        acl = sec.watcher.current
        if acl.white_listed(peer):
            return Verified(ALL, None)
        signed = sec.verifier.verify_head(head.auth or None, AUTH_METHOD, op_name(head.op), sec.wall_ms())
        account = acl.accounts.get(signed.access_key)
        if account is None:  # removed by a reload between the two reads
            raise AuthError(401, "SIGNATURE_INVALID", "unknown access key or wrong signature")
        return Verified(Principal(account), signed)


@dataclasses.dataclass(slots=True)
class _Pending:
    """A frame whose head verified and whose body is arriving (its bytes reserved)."""

    head: FrameHead
    verified: Verified
    reserved: int


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
        self.authenticated = False  # a frame head verified (see the module doc)
        self.counted_bytes = 0  # what this connection adds to stats.unauthenticated_bytes
        self.pending: _Pending | None = None
        self.failing: bytes | None = None  # the error frame to send once the answers in flight are out
        # One timer at a time (see "timers"); the protocol is made by the loop, in the loop.
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # when the armed timer fires (the loop's clock)
        self._idle_deadline = 0.0  # when the connection closes if nothing arrives (set as the last answer goes)

    # -- lifecycle --------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance check here.
        transport = cast(asyncio.Transport, transport)
        server = self.server
        if not server.admit(self):
            transport.close()
            self.closed = True
            return
        self.accepted = True
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self._arm(self.limits.handshake_timeout_s)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self._disarm()
        if self.accepted:
            self.accepted = False
            self.server.forget(self)
        if self.pending is not None:  # a body that will never complete
            self._release_pending()
        # Requests being handled run to their end (like HTTP handlers, never cancelled half-way
        # through an append); their answers are dropped.
        if self.write_resumed is not None:
            self.write_resumed.set()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    def _release_pending(self) -> None:
        p, self.pending = self.pending, None
        if p is not None and p.reserved:
            self.server.release(p.reserved)

    # -- timers -----------------------------------------------------------------------------------
    # The handshake and frame timers are armed when their wait starts. The idle timer is lazy: a
    # request does not cancel the armed timer, and its answer only moves ``_idle_deadline``
    # (a timer firing before it arms another for the rest), so a busy connection makes no timer per
    # request and an idle one still closes ``idle_timeout_s`` after its last answer.
    def _arm(self, timeout_s: float) -> None:
        self._arm_at(self._loop.time() + timeout_s)

    def _arm_at(self, when: float) -> None:
        self._disarm()
        self._timer_at = when
        self._timer = self._loop.call_at(when, self._expired)

    def _arm_idle(self) -> None:
        self._idle_deadline = deadline = self._loop.time() + self.limits.idle_timeout_s
        if self._timer is None or self._timer_at > deadline:
            self._arm_at(deadline)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.failing is not None:
            self.close()
            return
        if self.authenticated and not self.decoder.mid_frame:
            if self.in_flight:
                return  # answers pending: the last one arms the idle timer
            if self._loop.time() < self._idle_deadline:  # answered since this timer was armed
                self._arm_at(self._idle_deadline)
                return
            self.close()
            return
        self.server.stats.timed_out_connections += 1
        log.debug("closing a remoting connection from %s: no (complete, verified) frame in time", self.peer)
        self.close()

    def _rearm(self) -> None:
        if not self.authenticated:
            return  # the handshake timer armed at the connect runs on: refused heads do not extend it
        if self.decoder.mid_frame:
            self._arm(self.limits.frame_timeout_s)
        elif self.in_flight == 0:
            self._arm_idle()
        # else: requests in flight; a timer firing meanwhile stands down (_expired)

    # -- reading ----------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        was_mid = self.decoder.mid_frame
        self.decoder.feed(data)
        self._drain_frames()
        # what an unauthenticated connection holds at rest: part of one head (the process's budget)
        if not self.closed and not self.authenticated and not self.server.count_unauthenticated(
            self, self.decoder.buffered
        ):
            self.close()
            return
        if not self.closed and (not was_mid or not self.decoder.mid_frame):
            self._rearm()

    def eof_received(self) -> bool | None:
        if self.decoder.mid_frame:
            log.debug("remoting connection from %s ended mid-frame", self.peer)
        return False  # close our side too (answers in flight are dropped with the connection)

    def _drain_frames(self) -> None:
        while (not self.closed and self.failing is None and not self.writing_paused
               and self.in_flight < self.limits.in_flight_max):
            try:
                if self.pending is None:
                    head = self.decoder.next_head()
                    if head is None:
                        break
                    self._on_head(head)
                    continue
                body = self.decoder.next_body()
            except FrameError as exc:
                self._fatal(exc.code, exc.message)
                return
            if body is None:
                break
            pending, self.pending = self.pending, None
            self._start(pending, body)
        self._update_reading()

    def _on_head(self, head: FrameHead) -> None:
        if head.is_response:
            self._fatal("BAD_FRAME", "a client sends requests only")
            return
        server = self.server
        try:
            verified = server.auth.verify_head(head, self.peer)
        except AuthError as exc:
            server.stats.auth_refused += 1
            self._refuse_frame(head, exc.status, exc.code, exc.message, **exc.extra)
            return
        if not self.authenticated:
            self.authenticated = True
            server.authenticated(self)
            self._disarm()
        if head.body_bytes and not server.reserve(head.body_bytes):
            server.stats.busy_refused += 1
            self._refuse_frame(head, 503, "BUSY", "too many request bodies in flight; retry shortly")
            return
        self.pending = _Pending(head, verified, head.body_bytes)

    def _refuse_frame(self, head: FrameHead, status: int, code: str, message: str, **extra: Any) -> None:
        """Answer one frame from its head and discard its body unread (the connection stays)."""
        self.server.stats.skipped_body_bytes += head.body_bytes
        self.decoder.skip_body()
        if self.transport is not None and not self.closed:
            self.transport.write(encode(head.op, head.request_id, error_body(code, message, status, **extra),
                                        flags=FLAG_RESPONSE | FLAG_ERROR))

    def _update_reading(self) -> None:
        """Read while fewer than in_flight_max requests are handled and the answers drain."""
        if self.transport is None or self.closed:
            return
        want_pause = self.in_flight >= self.limits.in_flight_max or self.writing_paused or self.failing is not None
        if want_pause and not self.reading_paused:
            self.reading_paused = True
            self.server.stats.paused += 1
            self.transport.pause_reading()
        elif not want_pause and self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()
            self._drain_frames()  # frames that arrived before the pause

    def _fatal(self, code: str, message: str) -> None:
        self.server.stats.bad_frames += 1
        log.debug("bad frame from %s: %s: %s", self.peer, code, message)
        self.failing = encode(0, 0, error_body(code, message, 400), flags=FLAG_RESPONSE | FLAG_ERROR)
        if self.in_flight:  # answer what was read before the bad frame, then refuse and close
            self._update_reading()
            self._arm(self.limits.frame_timeout_s)
            return
        self._refuse()

    def _refuse(self) -> None:
        if self.transport is not None and not self.closed and self.failing is not None:
            self.transport.write(self.failing)
        self.close()

    def _start(self, pending: _Pending, body: bytes) -> None:
        self.in_flight += 1  # the armed timer stays (see "timers")
        task = self._loop.create_task(self._handle(pending, body))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _handle(self, pending: _Pending, body: bytes) -> None:
        head = pending.head
        try:
            try:
                flags, answer = FLAG_RESPONSE, await self.server.handle(head, pending.verified, body, self.peer)
            except ProtocolError as exc:
                flags, answer = FLAG_RESPONSE | FLAG_ERROR, error_body(exc.code, exc.message, exc.status, **exc.extra)
            await self._write(encode(head.op, head.request_id, answer, flags=flags))
        finally:
            if pending.reserved:
                self.server.release(pending.reserved)
            self._done()

    def _done(self) -> None:
        self.in_flight -= 1
        if self.closed:
            return
        if self.failing is not None:
            if self.in_flight == 0:
                self._refuse()
            return
        self._update_reading()
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
        self._update_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.write_resumed is not None:
            self.write_resumed.set()
            self.write_resumed = None
        self._update_reading()


class RemotingServer:
    """Serves ``dispatch`` on a TCP port. The dispatcher's coded errors (``ProtocolError`` with a
    status) are answered as they say; anything else is unexpected: logged, answered INTERNAL.
    ``guard``: the broker's HTTP edge, whose budget of bodies in flight frames share (None: a budget
    of this listener's own, for tests)."""

    def __init__(
        self,
        dispatch: Dispatch,
        *,
        security: Security | None,
        limits: RemotingLimits | None = None,
        guard: Guard | None = None,
    ):
        self.dispatch = dispatch
        self.auth = Authenticator(security)
        self.limits = limits or RemotingLimits()
        self.guard = guard
        self.body_bytes_reserved = 0  # without a guard
        self.body_bytes_max = 256 << 20
        self.stats = Stats()
        self.connections: set[_Connection] = set()
        # unauthenticated connections, oldest first (the one a new connection closes when full)
        self._unauthenticated: collections.OrderedDict[_Connection, None] = collections.OrderedDict()
        self._server: asyncio.Server | None = None
        self.bound_port = 0

    # -- connection slots and the unauthenticated budget ----------------------------------------------
    def admit(self, conn: _Connection) -> bool:
        """A new connection: take a slot, closing the oldest unauthenticated connection when the
        unauthenticated ones (or all) are at their cap. False: every slot is held by authenticated
        connections."""
        stats, limits = self.stats, self.limits
        while self._unauthenticated and (
            stats.connections >= limits.connections_max
            or len(self._unauthenticated) >= limits.unauthenticated_connections_max
        ):
            oldest = next(iter(self._unauthenticated))
            stats.evicted_connections += 1
            self.forget(oldest)
            oldest.accepted = False
            oldest.close()
        if stats.connections >= limits.connections_max:
            stats.refused_connections += 1
            return False
        stats.connections += 1
        self.connections.add(conn)
        self._unauthenticated[conn] = None
        stats.unauthenticated = len(self._unauthenticated)
        return True

    def forget(self, conn: _Connection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            self.stats.connections -= 1
        if self._unauthenticated.pop(conn, 0) is None:
            self.stats.unauthenticated = len(self._unauthenticated)
        self._uncount(conn)

    def authenticated(self, conn: _Connection) -> None:
        if self._unauthenticated.pop(conn, 0) is None:
            self.stats.unauthenticated = len(self._unauthenticated)
        self._uncount(conn)

    def count_unauthenticated(self, conn: _Connection, nbytes: int) -> bool:
        """Set what an unauthenticated connection holds; False when the process's budget would pass."""
        stats = self.stats
        total = stats.unauthenticated_bytes - conn.counted_bytes + nbytes
        if total > self.limits.unauthenticated_bytes_max:
            stats.over_budget_connections += 1
            self._uncount(conn)
            return False
        stats.unauthenticated_bytes = total
        stats.unauthenticated_bytes_peak = max(stats.unauthenticated_bytes_peak, total)
        conn.counted_bytes = nbytes
        return True

    def _uncount(self, conn: _Connection) -> None:
        self.stats.unauthenticated_bytes -= conn.counted_bytes
        conn.counted_bytes = 0

    # -- bodies in flight -------------------------------------------------------------------------------
    def reserve(self, nbytes: int) -> bool:
        if self.guard is not None:
            return self.guard.reserve(nbytes)
        if self.body_bytes_reserved + nbytes > self.body_bytes_max:
            return False
        self.body_bytes_reserved += nbytes
        return True

    def release(self, nbytes: int) -> None:
        if self.guard is not None:
            self.guard.release(nbytes)
        else:
            self.body_bytes_reserved -= nbytes

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

    async def handle(self, head: FrameHead, verified: Verified, raw: bytes, peer: str) -> bytes:
        """The answer body of one request frame (its head verified), or the ``ProtocolError`` to answer."""
        self.stats.requests += 1
        op = OPS.get(head.op)
        if op is None:
            raise ProtocolError("UNKNOWN_OP", f"op {head.op} is not served", 400)
        if verified.signed is not None:
            try:
                check_body(verified.signed, raw)
            except AuthError as exc:
                self.stats.auth_refused += 1
                raise ProtocolError(exc.code, exc.message, exc.status) from None
            SIGNED.set(SignedRequest(verified.signed))  # this task's: the replay guard reads it
        try:
            body = unpack_body(raw)
        except FrameError as exc:
            raise ProtocolError(exc.code, exc.message, 400) from None
        if op is Op.PING:
            return pack_body({})
        try:
            return pack_body(await self.dispatch(Call(op, verified.principal, peer, body)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, ProtocolError) and exc.status:
                raise  # the coded error: answered with its code, status and extra (``_Connection._handle``)
            log.exception("unexpected error in remoting op %s", op.name)
            raise ProtocolError("INTERNAL", "internal error (logged by the broker)", 500) from None
