"""One port, two protocols: HTTP (our API, curl, the SDK) and RocketMQ's remoting (the official
clients and mqadmin), told apart by the first byte a client sends, with TLS in front of either.

    first byte        plain port                         TLS configured
    0x00              remoting (a frame's length < 16 MiB) remoting, if tlsMode=permissive
    0x16              HTTP (which answers 400: no TLS)   TLS handshake, then this table again
                                                         inside (0x00 remoting, else HTTP)
    anything else     HTTP (garbage gets its coded 400)  HTTP, if tlsMode=permissive

``tlsMode`` (RocketMQ's ``tls.server.mode``) decides whether a TLS port still takes plain
connections: ``enforcing`` (our default: the port is TLS only, as before) or ``permissive``.

How: the listener accepts sockets itself and *peeks* at the first byte (``MSG_PEEK``: nothing is
consumed), so a plain connection goes to its protocol through ``loop.connect_accepted_socket`` with
its bytes still in the kernel, and a TLS one is handshaken by the same call with ``ssl=``. Inside
TLS there is no peeking: ``_TlsSniffer`` buffers the first decrypted bytes and hands the transport to
the chosen protocol (``set_protocol``, ``connection_made``, then the bytes replayed). Both work on the
standard loop and on uvloop (``DLEDGER_EVENT_LOOP``). (``loop.start_tls`` after reading the first
bytes would need those bytes of the ClientHello fed back into the loop's TLS protocol: not an API.)

Bounds: at most ``pending_max`` connections between accept and hand-over (more are closed at once);
the first byte must come within ``first_byte_timeout_s``; a TLS handshake gets
``tls_handshake_timeout_s`` and then ``first_byte_timeout_s`` for its first record. After the
hand-over each protocol keeps its own bounds (``broker.serving.http_edge``'s guard, ``RemotingServer``).

``SniffingSite`` is the aiohttp site that serves an ``EdgeRunner``'s application and a
``RemotingServer`` this way; ``start_dual_server`` sets both up.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import errno
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any, Final, cast

from aiohttp import web

from broker.serving.http_edge import EdgeRunner, Guard

log = logging.getLogger("broker.serving.sniff")

ProtocolFactory = Callable[[], asyncio.BaseProtocol]
ACCEPT_BATCH_MAX: Final = 64
ACCEPT_RETRY_S: Final = 1.0  # after EMFILE & co., as asyncio's own servers do
_ACCEPT_RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

TLS_RECORD_HANDSHAKE: Final = 0x16
REMOTING_FIRST_BYTE: Final = 0x00


class Kind(enum.Enum):
    HTTP = "http"
    REMOTING = "remoting"
    TLS = "tls"
    REFUSED = "refused"


class TlsMode(enum.Enum):
    PERMISSIVE = "permissive"
    ENFORCING = "enforcing"


TLS_MODES: Final = tuple(m.value for m in TlsMode)


def classify(first: int, *, tls: TlsMode | None) -> Kind:
    """Where a connection whose first byte is ``first`` goes (``tls``: None = no TLS configured)."""
    if tls is not None and first == TLS_RECORD_HANDSHAKE:
        return Kind.TLS
    if tls is TlsMode.ENFORCING:
        return Kind.REFUSED
    return Kind.REMOTING if first == REMOTING_FIRST_BYTE else Kind.HTTP


def classify_inside_tls(first: int) -> Kind:
    return Kind.REMOTING if first == REMOTING_FIRST_BYTE else Kind.HTTP


@dataclasses.dataclass(frozen=True, slots=True)
class SniffLimits:
    pending_max: int = 1024
    first_byte_timeout_s: float = 10.0
    tls_handshake_timeout_s: float = 10.0
    backlog: int = 1024


class SniffStats:
    def __init__(self) -> None:
        self.accepted = 0
        self.pending = 0
        self.refused_connections = 0
        self.timed_out_connections = 0
        self.plain_refused = 0
        self.tls_handshakes = 0
        self.tls_failed = 0
        self.http = 0
        self.remoting = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class _Slot:
    """One connection between accept and hand-over: counted in ``pending`` until released (once)."""

    __slots__ = ("listener", "released", "sock", "timer", "transport")

    def __init__(self, listener: SniffingListener, sock: socket.socket):
        self.listener = listener
        self.sock = sock
        self.timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.BaseTransport | None = None  # once the TLS handshake is done
        self.released = False

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def release(self) -> None:
        self.cancel_timer()
        if not self.released:
            self.released = True
            self.listener.stats.pending -= 1
            self.listener.in_tls.discard(self)


class SniffingListener:
    """Accepts on ``host:port`` and hands each connection to ``http()`` or ``remoting()``."""

    def __init__(self, http: ProtocolFactory, remoting: ProtocolFactory, *, limits: SniffLimits | None = None,
                 ssl_context: ssl.SSLContext | None = None, tls_mode: TlsMode = TlsMode.ENFORCING):
        self.http = http
        self.remoting = remoting
        self.limits = limits or SniffLimits()
        self.ssl_context = ssl_context
        self.tls_mode: TlsMode | None = tls_mode if ssl_context is not None else None
        self.stats = SniffStats()
        self.sockets: list[socket.socket] = []
        self._pending: dict[int, _Slot] = {}  # before the first byte, by file descriptor
        self.in_tls: set[_Slot] = set()  # in the TLS handshake, or waiting for the first record
        self._tasks: set[asyncio.Task[None]] = set()
        self._handshakes: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # -- listening ------------------------------------------------------------------------------------
    async def start(self, host: str, port: int) -> int:
        """Bind and listen; returns the bound port (``port`` 0: any free one)."""
        loop = self._loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        seen: set[tuple[int, Any]] = set()
        try:
            for family, type_, proto, _, addr in infos:
                if (family, addr) in seen:
                    continue
                seen.add((family, addr))
                sock = socket.socket(family, type_, proto)
                self.sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                if port == 0 and len(self.sockets) > 1:  # one port for every address of the name
                    addr = (addr[0], self.sockets[0].getsockname()[1], *addr[2:])
                sock.bind(addr)
                sock.listen(self.limits.backlog)
                sock.setblocking(False)
        except OSError:
            self.close()
            raise
        if not self.sockets:
            raise OSError(f"{host}:{port}: no address to listen on")
        for sock in self.sockets:
            loop.add_reader(sock.fileno(), self._accept, sock)
        return int(self.sockets[0].getsockname()[1])

    def close(self) -> None:
        """Stop accepting; drop connections not yet handed over (handed-over ones are their protocol's)."""
        if self._closed:
            return
        self._closed = True
        loop = self._loop
        for sock in self.sockets:
            if loop is not None:
                loop.remove_reader(sock.fileno())
            sock.close()
        for slot in list(self._pending.values()):
            self._drop(slot)
        for slot in list(self.in_tls):
            if slot.transport is not None:
                slot.transport.close()
        # Handshakes in progress are abandoned; plain hand-overs finish at once (their protocols,
        # not the listener, close them: aiohttp's shutdown, RemotingServer.stop).
        for task in list(self._handshakes):
            task.cancel()

    async def wait_closed(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _accept(self, lsock: socket.socket) -> None:
        loop = self._loop
        assert loop is not None
        for _ in range(ACCEPT_BATCH_MAX):
            try:
                conn, _addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _ACCEPT_RESOURCE_ERRNOS:  # out of descriptors: stop polling a while
                    log.warning("cannot accept on %s: %s; retrying in %.0f s", lsock.getsockname(), exc,
                                ACCEPT_RETRY_S)
                    loop.remove_reader(lsock.fileno())
                    loop.call_later(ACCEPT_RETRY_S, self._resume_accepting, lsock)
                else:
                    log.debug("accept failed: %s", exc)
                return
            self.stats.accepted += 1
            if self.stats.pending >= self.limits.pending_max:
                self.stats.refused_connections += 1
                if self.stats.refused_connections % 1000 == 1:
                    log.warning("connection refused: %d connections sent nothing yet (limit %d)",
                                self.stats.pending, self.limits.pending_max)
                conn.close()
                continue
            conn.setblocking(False)
            slot = _Slot(self, conn)
            self.stats.pending += 1
            self._pending[conn.fileno()] = slot
            slot.timer = loop.call_later(self.limits.first_byte_timeout_s, self._expired, slot)
            loop.add_reader(conn.fileno(), self._readable, slot)

    def _resume_accepting(self, lsock: socket.socket) -> None:
        if not self._closed and self._loop is not None:
            self._loop.add_reader(lsock.fileno(), self._accept, lsock)

    # -- the first byte ---------------------------------------------------------------------------------
    def _readable(self, slot: _Slot) -> None:
        try:
            first = slot.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.debug("connection reset before its first byte: %s", exc)
            self._drop(slot)
            return
        if not first:  # closed before sending anything
            self._drop(slot)
            return
        kind = classify(first[0], tls=self.tls_mode)
        self._unwatch(slot)
        slot.cancel_timer()
        if kind is Kind.REFUSED:
            self.stats.plain_refused += 1
            log.debug("closing a plain connection to a TLS-only port (tlsMode=enforcing)")
            self._drop(slot)
        elif kind is Kind.TLS:
            self.stats.tls_handshakes += 1
            self.in_tls.add(slot)
            task = self._spawn(self._tls(slot))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)
        else:
            slot.release()
            self._spawn(self._attach(slot.sock, kind))

    def _expired(self, slot: _Slot) -> None:
        slot.timer = None
        self.stats.timed_out_connections += 1
        log.debug("closing a connection that sent nothing within %.1f s", self.limits.first_byte_timeout_s)
        self._drop(slot)

    def _unwatch(self, slot: _Slot) -> None:
        fd = slot.sock.fileno()
        if self._pending.pop(fd, None) is not None and self._loop is not None:
            self._loop.remove_reader(fd)

    def _drop(self, slot: _Slot) -> None:
        self._unwatch(slot)
        slot.release()
        slot.sock.close()

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        assert self._loop is not None
        task: asyncio.Task[None] = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- hand-over ----------------------------------------------------------------------------------------
    def factory(self, kind: Kind) -> ProtocolFactory:
        if kind is Kind.REMOTING:
            self.stats.remoting += 1
            return self.remoting
        self.stats.http += 1
        return self.http

    async def _attach(self, sock: socket.socket, kind: Kind) -> None:
        assert self._loop is not None
        try:
            await self._loop.connect_accepted_socket(self.factory(kind), sock)
        except OSError as exc:  # reset in between
            log.debug("connection lost while being handed to %s: %s", kind.value, exc)
            sock.close()

    async def _tls(self, slot: _Slot) -> None:
        assert self._loop is not None and self.ssl_context is not None
        try:
            await self._loop.connect_accepted_socket(
                lambda: _TlsSniffer(self, slot), slot.sock, ssl=self.ssl_context,
                ssl_handshake_timeout=self.limits.tls_handshake_timeout_s)
        except asyncio.CancelledError:
            slot.release()
            raise
        except Exception as exc:  # a failed or stalled handshake: the client's problem, not a fault
            self.stats.tls_failed += 1
            log.debug("TLS handshake failed: %s: %s", type(exc).__name__, exc)
            slot.release()


class _TlsSniffer(asyncio.Protocol):
    """Inside TLS: the first decrypted bytes choose the protocol, which gets the transport and them."""

    def __init__(self, listener: SniffingListener, slot: _Slot):
        self.listener = listener
        self.slot = slot
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.slot.transport = transport
        if self.slot.released:  # the listener closed during the handshake
            transport.close()
            return
        loop = asyncio.get_running_loop()
        self.slot.timer = loop.call_later(self.listener.limits.first_byte_timeout_s, self._expired)

    def _expired(self) -> None:
        self.slot.timer = None
        self.listener.stats.timed_out_connections += 1
        log.debug("closing a TLS connection that sent nothing in time")
        self.slot.release()
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if not data or self.slot.released:
            return
        self.slot.release()
        transport = self.transport
        assert transport is not None
        protocol = self.listener.factory(classify_inside_tls(data[0]))()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if not transport.is_closing():
            cast(asyncio.Protocol, protocol).data_received(data)

    def eof_received(self) -> bool | None:
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self.slot.release()


# -- aiohttp's side ------------------------------------------------------------------------------------------
class SniffingSite(web.BaseSite):
    """An aiohttp site serving the runner's application and ``remoting`` on one port."""

    __slots__ = ("_host", "_limits", "_listener", "_port", "_remoting", "_tls_mode", "bound_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, remoting: ProtocolFactory,
                 limits: SniffLimits | None = None, ssl_context: ssl.SSLContext | None = None,
                 tls_mode: TlsMode = TlsMode.ENFORCING):
        super().__init__(runner, ssl_context=ssl_context)
        self._host = host
        self._port = port
        self._remoting = remoting
        self._limits = limits or SniffLimits()
        self._tls_mode = tls_mode
        self._listener: SniffingListener | None = None
        self.bound_port = port

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}+remoting://{self._host}:{self.bound_port}"

    @property
    def listener(self) -> SniffingListener:
        assert self._listener is not None, "the site is not started"
        return self._listener

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._listener = SniffingListener(cast(ProtocolFactory, server), self._remoting, limits=self._limits,
                                          ssl_context=self._ssl_context, tls_mode=self._tls_mode)
        self.bound_port = await self._listener.start(self._host, self._port)
        self._server = cast(Any, self._listener)  # BaseSite.stop() calls its close()

    async def stop(self) -> None:
        await super().stop()
        if self._listener is not None:
            await self._listener.wait_closed()


async def start_dual_server(app: web.Application, guard: Guard, host: str, port: int, *, remoting: ProtocolFactory,
                            limits: SniffLimits | None = None, ssl_context: ssl.SSLContext | None = None,
                            tls_mode: TlsMode = TlsMode.ENFORCING) -> tuple[EdgeRunner, SniffingSite]:
    """``app`` behind ``guard`` and ``remoting`` on one port; ``runner.cleanup()`` ends both listeners
    (the remoting connections are the ``RemotingServer``'s to close)."""
    runner = EdgeRunner(app, guard)
    await runner.setup()
    site = SniffingSite(runner, host, port, remoting=remoting, limits=limits, ssl_context=ssl_context,
                        tls_mode=tls_mode)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, site
