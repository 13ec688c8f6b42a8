"""The SDK's side of the broker's binary protocol (``broker.protocol.frames``): one multiplexed
connection per broker address, many requests in flight on it, answers matched by request id.

``RemotingConnection.call`` writes one signed request frame and waits for its answer until the
caller's timeout (its deadline); a timed-out request is forgotten (a late answer is dropped). When
the connection breaks, every request in flight fails with ``CONNECTION_LOST`` (outcome unknown:
the broker may have acted on it) and the next call connects again. At most ``in_flight_max``
requests wait on one connection; more callers wait for a slot (within their own timeout).

Errors are ``ClientError``s with the broker's code and HTTP-equivalent status, so callers handle
them exactly like the HTTP transport's.

Every request frame is signed for the broker's scope with the connection's ``Signer`` (shared with
the HTTP transport: it learns each server's scope and clock from its refusals); a request refused
``WRONG_SCOPE`` or ``TIMESTAMP_OUT_OF_WINDOW`` — refused from its head, before the broker read its
body or acted on it — is signed again and sent once more.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

import msgpack

from broker.client.signer import Signer
from broker.protocol.frames import (
    AUTH_METHOD,
    FLAG_ERROR,
    FRAME_BYTES_MAX_DEFAULT,
    REQUEST_ID_MAX,
    Frame,
    FrameDecoder,
    FrameError,
    encode,
    op_name,
    pack_body,
)

IN_FLIGHT_MAX_DEFAULT: Final = 256
# A connection idle this long is replaced before use: below the broker's idle timeout (60 s), so a
# request is never written into a connection the broker is closing just then.
IDLE_S_DEFAULT: Final = 30.0
TLS_HANDSHAKE_TIMEOUT_S: Final = 10.0

def _time_out(fut: asyncio.Future[Frame]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


# set by broker.client.transport (this module must not import it: transport imports this one)
ErrorFactory = Callable[..., Exception]


class _Protocol(asyncio.Protocol):
    def __init__(self, conn: RemotingConnection):
        self.conn = conn
        self.decoder = FrameDecoder(conn.frame_bytes_max)
        self.transport: asyncio.Transport | None = None
        self.write_ok = asyncio.Event()
        self.write_ok.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses: no isinstance check here.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)
        while True:
            try:
                frame = self.decoder.next()
            except FrameError as exc:
                self.conn._broken(self, f"bad frame from the broker: {exc.message}")
                return
            if frame is None:
                return
            self.conn._answer(self, frame)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.write_ok.set()
        self.conn._broken(self, str(exc) if exc else "the broker closed the connection")

    def pause_writing(self) -> None:
        self.write_ok.clear()

    def resume_writing(self) -> None:
        self.write_ok.set()


class RemotingConnection:
    """One broker address. Not thread-safe: one event loop owns it."""

    def __init__(
        self,
        addr: str,
        *,
        error: ErrorFactory,
        signer: Signer | None = None,
        ssl_context: ssl.SSLContext | None = None,
        in_flight_max: int = IN_FLIGHT_MAX_DEFAULT,
        frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT,
    ):
        self.addr = addr
        self._error = error
        self.signer = signer if signer is not None else Signer(None)
        self.ssl_context = ssl_context
        self.frame_bytes_max = frame_bytes_max
        # At most in_flight_max requests between taking a slot and their answer; callers over it
        # wait in order, each for the slot a finished request hands over (a semaphore, counted here
        # so that taking a free slot is two attribute reads, not a coroutine).
        self._free_slots = in_flight_max
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._proto: _Protocol | None = None
        self._connect_lock = asyncio.Lock()
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._next_id = 0
        self._closed = False
        self.idle_s = IDLE_S_DEFAULT
        self._last_used = 0.0
        self.connects = 0

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def close(self) -> None:
        self._closed = True
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.close()
        self._fail_all(self._error("CONNECTION_LOST", "the client closed the connection", addr=self.addr))

    def _open_proto(self) -> _Protocol | None:
        """The connection to use as it is, or None: none yet, closing, or idle (then closed here:
        the broker may be closing it; nothing is waiting on it)."""
        proto = self._proto
        if proto is not None and not self._pending and time.monotonic() - self._last_used > self.idle_s:
            self._proto = None
            if proto.transport is not None:
                proto.transport.close()
            return None
        if proto is not None and proto.transport is not None and not proto.transport.is_closing():
            return proto
        return None

    async def _connect(self) -> _Protocol:
        proto = self._open_proto()
        if proto is not None:
            return proto
        async with self._connect_lock:
            proto = self._proto
            if proto is None or proto.transport is None or proto.transport.is_closing():
                proto = self._proto = await self._open()
            return proto

    async def _open(self) -> _Protocol:
        host, _, port = self.addr.rpartition(":")
        loop = asyncio.get_running_loop()
        try:
            if self.ssl_context is None:
                _t, proto = await loop.create_connection(lambda: _Protocol(self), host, int(port))
            else:
                _t, proto = await loop.create_connection(
                    lambda: _Protocol(self), host, int(port), ssl=self.ssl_context, server_hostname=host,
                    ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S,
                )
        except ssl.SSLError as exc:
            raise self._error("TLS_FAILED", str(exc) or type(exc).__name__, addr=self.addr) from None
        except (OSError, ValueError) as exc:
            raise self._error("CONNECT_FAILED", str(exc) or type(exc).__name__, addr=self.addr) from None
        self.connects += 1
        return proto

    def _new_id(self) -> int:
        for _ in range(8):
            self._next_id = self._next_id + 1 if self._next_id < REQUEST_ID_MAX else 1
            if self._next_id not in self._pending:
                return self._next_id
        raise self._error("BUSY", "no free request id", addr=self.addr)

    async def call(self, op: int, body: Mapping[str, Any] | None, timeout_s: float) -> Any:
        """Send one request and return the answer's decoded body, or raise the error factory's
        exception (``TIMEOUT`` when no answer within ``timeout_s``)."""
        if self._closed:
            raise self._error("CONNECTION_LOST", "the client is closed", addr=self.addr)
        data = pack_body(body or {})
        if len(data) + 1100 > self.frame_bytes_max:
            raise self._error("BODY_TOO_LARGE", f"a request of {len(data)} bytes exceeds the frame cap",
                              status=413, addr=self.addr)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            frame = await self._exchange(loop, deadline, op, data)
            if frame.flags & FLAG_ERROR and self.signer.credentials is not None:  # (frame.is_error)
                refusal = self._error_map(frame)
                if refusal is not None and self.signer.learn_refusal(
                    self.addr, str(refusal.get("code")), refusal
                ):  # refused from its head, before the broker acted: sign again, once
                    frame = await self._exchange(loop, deadline, op, data)
        except TimeoutError:
            raise self._error("TIMEOUT", f"no answer within {timeout_s} s", addr=self.addr) from None
        return self._decode(frame)

    async def _exchange(self, loop: asyncio.AbstractEventLoop, deadline: float, op: int, data: bytes) -> Frame:
        """One request and its answer; ``TimeoutError`` at ``deadline`` (loop time). The usual case
        (a slot free, the connection open and writable) waits only for the answer, under one timer
        (cheaper per request than an ``asyncio.timeout`` scope); any other wait (a slot, a connect,
        a paused write) runs under ``asyncio.timeout_at(deadline)`` as well."""
        if self._free_slots > 0 and not self._slot_waiters:
            self._free_slots -= 1  # a free slot: taken without waiting
        else:
            await self._wait_for_slot(loop, deadline)
        try:
            proto = self._open_proto()
            if proto is None:
                async with asyncio.timeout_at(deadline):
                    proto = await self._connect()
            rid = self._new_id()
            fut: asyncio.Future[Frame] = loop.create_future()
            self._pending[rid] = fut
            try:
                auth = self.signer.sign(self.addr, AUTH_METHOD, op_name(op), data) or ""
                if not proto.write_ok.is_set():
                    async with asyncio.timeout_at(deadline):
                        await proto.write_ok.wait()
                if proto.transport is None or proto.transport.is_closing():
                    raise self._error("CONNECTION_LOST", "the connection closed", addr=self.addr)
                proto.transport.write(encode(op, rid, data, auth=auth))
                self._last_used = time.monotonic()
                timer = loop.call_at(deadline, _time_out, fut)
                try:
                    frame = await fut
                finally:
                    timer.cancel()
                self._last_used = time.monotonic()
                return frame
            finally:
                self._pending.pop(rid, None)
        finally:
            self._give_slot()

    async def _wait_for_slot(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        waiter: asyncio.Future[None] = loop.create_future()
        self._slot_waiters.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._give_slot()  # handed a slot just as it gave up: the next one gets it
            else:
                waiter.cancel()
                try:
                    self._slot_waiters.remove(waiter)
                except ValueError:
                    pass
            raise

    def _give_slot(self) -> None:
        """A request is done with its slot: the first caller still waiting takes it over."""
        waiters = self._slot_waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free_slots += 1

    @staticmethod
    def _error_map(frame: Frame) -> dict[str, Any] | None:
        try:
            value = msgpack.unpackb(frame.body, raw=False, strict_map_key=False) if frame.body else None
        except Exception:
            return None
        return value if isinstance(value, dict) else None

    def _decode(self, frame: Frame) -> Any:
        try:
            value = msgpack.unpackb(frame.body, raw=False, strict_map_key=False) if frame.body else None
        except Exception:
            raise self._error("BAD_ANSWER", frame.body[:200].decode("utf-8", "replace"), addr=self.addr) from None
        if frame.flags & FLAG_ERROR:  # (frame.is_error)
            if not isinstance(value, dict):
                raise self._error("BAD_ANSWER", "an error frame without {code, message}", addr=self.addr)
            status = value.get("status")
            raise self._error(
                str(value.get("code", "ERROR")),
                str(value.get("message", "")),
                status=int(status) if isinstance(status, int) else 500,
                addr=self.addr,
                leader_addr=value.get("leader_addr"),
                answer=value,
            )
        return value

    # -- called by the protocol ----------------------------------------------------------------------
    def _answer(self, proto: _Protocol, frame: Frame) -> None:
        if frame.request_id == 0 and frame.is_error:  # the broker refused the stream: it closes it
            self._broken(proto, f"the broker refused the connection: {frame.body[:200]!r}")
            return
        fut = self._pending.get(frame.request_id)
        if fut is not None and not fut.done():
            fut.set_result(frame)
        # else: the caller timed out and left; the late answer is dropped

    def _broken(self, proto: _Protocol, why: str) -> None:
        if self._proto is not proto:
            return
        self._proto = None
        if proto.transport is not None:
            proto.transport.close()
        self._fail_all(self._error("CONNECTION_LOST", why[:200], addr=self.addr))

    def _fail_all(self, exc: Exception) -> None:
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # marked retrieved; the caller's await re-raises it
