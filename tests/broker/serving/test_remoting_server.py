"""The remoting server and the port sniffer with a test dispatch table, on the standard loop and on
uvloop: garbage, partial and oversized frames, slow loris, many requests in flight with back-pressure,
answers out of order, oneway requests, requests the server sends a client (answered and timed out),
both header encodings, a connection flood, the unauthenticated-bytes budget, and HTTP beside remoting
on one port (plain and TLS, tlsMode enforcing and permissive).

Every scenario is a coroutine run by ``on_both_loops``; nothing sleeps to synchronise (conditions are
awaited with deadlines, time-outs are short and only their effect is checked)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from broker.protocol.auth import AuthError
from broker.protocol.errors import ProtocolError
from broker.protocol.rocketmq import command as rc
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode, SerializeType, not_supported_remark
from broker.protocol.rocketmq.command import Bounds, RemotingCommand
from broker.serving.certs import make_certs
from broker.serving.http_edge import Guard, Limits, guarded_app, server_ssl_context
from broker.serving.remoting_server import (
    ByteBudget,
    CommandError,
    RemotingConnection,
    RemotingLimits,
    RemotingServer,
    Request,
)
from broker.serving.sniff import Kind, SniffLimits, TlsMode, classify, start_dual_server
from tests.broker.serving.rmq_client import RmqClient
from tests.dledger.harness import HOST, wait_until

ECHO = 9001  # test codes: not RocketMQ's
PARK = 9002
FAIL = 9003
BOOM = 9004
RECORD = 9005
CODED = 9006  # raises the coded error its ext fields name


@pytest.fixture(params=["asyncio", "uvloop"])
def loop_name(request: Any) -> str:
    return str(request.param)


def on_both_loops(loop_name: str, scenario: Callable[[], Awaitable[None]]) -> None:
    if loop_name == "uvloop":
        import uvloop

        uvloop.run(scenario())
    else:
        asyncio.run(scenario())


@dataclasses.dataclass
class Gate:
    """Handlers park on it: ``PARK`` requests wait until the test opens their key."""

    entered: list[str] = dataclasses.field(default_factory=list)
    events: dict[str, asyncio.Event] = dataclasses.field(default_factory=dict)
    recorded: list[RemotingCommand] = dataclasses.field(default_factory=list)
    connections: list[RemotingConnection] = dataclasses.field(default_factory=list)

    def event(self, key: str) -> asyncio.Event:
        return self.events.setdefault(key, asyncio.Event())

    def open(self, key: str) -> None:
        self.event(key).set()


def make_server(gate: Gate, limits: RemotingLimits | None = None, budget: ByteBudget | None = None) -> RemotingServer:
    server = RemotingServer(limits=limits, budget=budget)

    async def echo(req: Request) -> RemotingCommand:
        gate.connections.append(req.connection)
        return req.ok(ext_fields={"echo": req.cmd.ext("x") or ""}, body=req.cmd.body)

    async def park(req: Request) -> RemotingCommand:
        key = req.cmd.ext("key") or ""
        gate.entered.append(key)
        await gate.event(key).wait()
        return req.ok(ext_fields={"key": key})

    async def fail(req: Request) -> RemotingCommand:
        raise CommandError(ResponseCode.TOPIC_NOT_EXIST, "no such topic here")

    async def boom(req: Request) -> RemotingCommand:
        raise RuntimeError("a bug in a handler")

    async def record(req: Request) -> None:
        gate.recorded.append(req.cmd)

    async def coded(req: Request) -> RemotingCommand:
        code = req.cmd.ext("code") or ""
        if req.cmd.ext("auth"):
            raise AuthError(403, code, "not yours")
        raise ProtocolError(code, "refused by the handler", int(req.cmd.ext("status") or 0))

    for code, handler in ((ECHO, echo), (PARK, park), (FAIL, fail), (BOOM, boom), (RECORD, record), (CODED, coded)):
        server.route(code, handler)
    return server


@dataclasses.dataclass
class Served:
    addr: str
    server: RemotingServer
    runner: web.AppRunner
    site: Any


async def serve(gate: Gate, *, limits: RemotingLimits | None = None, sniff: SniffLimits | None = None,
                budget: ByteBudget | None = None, ssl_context: ssl.SSLContext | None = None,
                tls_mode: TlsMode = TlsMode.ENFORCING, http_limits: Limits | None = None) -> Served:
    """The test dispatch table and a one-route HTTP app on one port."""
    server = make_server(gate, limits, budget)
    guard = Guard(http_limits or Limits(), lambda code, message: {"code": code, "message": message})
    app = guarded_app(guard, [])

    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"hello": "http", "secure": request.secure})

    app.router.add_get("/hello", hello)
    runner, site = await start_dual_server(app, guard, HOST, 0, remoting=server, limits=sniff,
                                           ssl_context=ssl_context, tls_mode=tls_mode)
    return Served(f"{HOST}:{site.bound_port}", server, runner, site)


async def stop(s: Served) -> None:
    await s.runner.cleanup()
    await s.server.stop()


async def closed_by_server(reader: asyncio.StreamReader, timeout_s: float = 10.0) -> bytes:
    """What the server sent before closing (a reset, when our unread bytes were in its buffer, is a close)."""
    got = bytearray()
    async with asyncio.timeout(timeout_s):
        try:
            while chunk := await reader.read(65536):
                got += chunk
        except ConnectionResetError:
            pass
    return bytes(got)


async def raw(addr: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, _, port = addr.rpartition(":")
    return await asyncio.open_connection(host, int(port))


def no_errors_logged(caplog: Any) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or (r.exc_info and r.levelno >= logging.WARNING)]
    assert not bad, [(r.name, r.getMessage()) for r in bad]


# -- the sniffer's rule ----------------------------------------------------------------------------------
def test_first_byte_rule() -> None:
    assert classify(0x00, tls=None) is Kind.REMOTING
    assert classify(ord("G"), tls=None) is Kind.HTTP
    assert classify(0x16, tls=None) is Kind.HTTP  # no TLS here: HTTP answers the ClientHello with a coded 400
    assert classify(0xFF, tls=None) is Kind.HTTP
    assert classify(0x16, tls=TlsMode.ENFORCING) is Kind.TLS
    assert classify(0x00, tls=TlsMode.ENFORCING) is Kind.REFUSED
    assert classify(ord("P"), tls=TlsMode.ENFORCING) is Kind.REFUSED
    assert classify(0x00, tls=TlsMode.PERMISSIVE) is Kind.REMOTING
    assert classify(ord("P"), tls=TlsMode.PERMISSIVE) is Kind.HTTP


# -- requests and answers ----------------------------------------------------------------------------------
def test_both_header_encodings_unknown_codes_and_coded_errors(loop_name: str, caplog: Any) -> None:
    async def scenario() -> None:
        s = await serve(Gate())
        try:
            for stype in (SerializeType.JSON, SerializeType.ROCKETMQ):
                c = await RmqClient.connect(s.addr, serialize_type=stype)
                r = await c.call(ECHO, {"x": "é\u0001"}, b"body")
                assert (r.code, r.ext("echo"), r.body, r.serialize_type) == (0, "é\u0001", b"body", stype)
                r = await c.call(4242)
                assert (r.code, r.remark) == (ResponseCode.REQUEST_CODE_NOT_SUPPORTED, not_supported_remark(4242))
                assert r.remark == " request type 4242 not supported"
                r = await c.call(FAIL)
                assert (r.code, r.remark) == (ResponseCode.TOPIC_NOT_EXIST, "no such topic here")
                r = await c.call(BOOM)  # a bug: logged with its traceback, answered, the connection kept
                assert r.code == ResponseCode.SYSTEM_ERROR and "internal error" in (r.remark or "")
                assert (await c.call(ECHO, {"x": "still"})).ext("echo") == "still"
                await c.close()
            assert s.server.stats.not_supported == 2
        finally:
            await stop(s)

    caplog.set_level(logging.DEBUG)
    on_both_loops(loop_name, scenario)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2 and all("unexpected error" in r.getMessage() for r in errors)


def test_a_coded_error_is_answered_in_one_place(loop_name: str, caplog: Any) -> None:
    """A handler's ``ProtocolError`` is answered by the server (``response_code``), never as a bug:
    SYSTEM_BUSY for back-pressure, NO_PERMISSION for an ACL refusal, SYSTEM_ERROR for the rest, the
    remark ``CODE: message`` in each; the connection stays usable."""

    async def scenario() -> None:
        s = await serve(Gate())
        c = await RmqClient.connect(s.addr)
        try:
            for ext, want in (
                ({"code": "BUSY"}, ResponseCode.SYSTEM_BUSY),
                ({"code": "SHUTTING_DOWN", "status": "503"}, ResponseCode.SYSTEM_BUSY),
                ({"code": "NOT_UPDATABLE", "status": "400"}, ResponseCode.SYSTEM_ERROR),
                ({"code": "INVALID_KV"}, ResponseCode.SYSTEM_ERROR),
            ):
                r = await c.call(CODED, ext)
                assert (r.code, r.remark) == (want, f"{ext['code']}: refused by the handler"), ext
            r = await c.call(CODED, {"code": "NO_PERMISSION", "auth": "1"})
            assert (r.code, r.remark) == (ResponseCode.NO_PERMISSION, "NO_PERMISSION: not yours")
            assert (await c.call(ECHO, {"x": "still"})).ext("echo") == "still"
            assert (s.server.stats.errors, s.server.stats.auth_refused) == (4, 1)
        finally:
            await c.close()
            await stop(s)

    on_both_loops(loop_name, scenario)
    no_errors_logged(caplog)


def test_partial_frames_byte_by_byte_and_many_frames_in_one_write(loop_name: str) -> None:
    async def scenario() -> None:
        s = await serve(Gate())
        c = await RmqClient.connect(s.addr)
        try:
            cmd = c.build(ECHO, {"x": "slow"}, b"b" * 300)
            fut = c._waiting.setdefault(cmd.opaque, asyncio.get_running_loop().create_future())
            frame = rc.encode(cmd)
            for i in range(len(frame)):  # one byte per write: the decoder waits for the rest
                c.writer.write(frame[i:i + 1])
                await c.writer.drain()
            assert (await asyncio.wait_for(fut, 10)).ext("echo") == "slow"
            cmds = [c.build(ECHO, {"x": str(i)}) for i in range(50)]
            futs = [c._waiting.setdefault(x.opaque, asyncio.get_running_loop().create_future()) for x in cmds]
            c.writer.write(b"".join(rc.encode(x) for x in cmds))
            answers = await asyncio.wait_for(asyncio.gather(*futs), 10)
            assert [a.ext("echo") for a in answers] == [str(i) for i in range(50)]
        finally:
            await c.close()
            await stop(s)

    on_both_loops(loop_name, scenario)


def test_out_of_order_answers_and_oneway(loop_name: str) -> None:
    async def scenario() -> None:
        gate = Gate()
        s = await serve(gate)
        c = await RmqClient.connect(s.addr)
        try:
            calls = [asyncio.create_task(c.call(PARK, {"key": str(i)})) for i in range(5)]
            await wait_until(lambda: len(gate.entered) == 5, 10, "five requests parked")
            order: list[str] = []
            for i in reversed(range(5)):  # released last to first: answered in that order
                gate.open(str(i))
                answer = await calls[i]
                order.append(answer.ext("key") or "")
                assert answer.opaque == i + 1
            assert order == ["4", "3", "2", "1", "0"]
            # oneway: handled, never answered; the next request's answer is the next thing on the wire
            await c.oneway(RECORD, {"n": "1"})
            await wait_until(lambda: len(gate.recorded) == 1, 10, "the oneway request handled")
            assert gate.recorded[0].is_oneway
            r = await c.call(ECHO, {"x": "after"})
            assert r.ext("echo") == "after" and not c._waiting
        finally:
            await c.close()
            await stop(s)

    on_both_loops(loop_name, scenario)


def test_in_flight_cap_pauses_reading_until_answers_go_out(loop_name: str) -> None:
    async def scenario() -> None:
        gate = Gate()
        s = await serve(gate, limits=RemotingLimits(in_flight_max=4))
        c = await RmqClient.connect(s.addr)
        try:
            calls = [asyncio.create_task(c.call(PARK, {"key": str(i)}, timeout_s=30)) for i in range(40)]
            await wait_until(lambda: len(gate.entered) == 4, 10, "four requests in flight")
            assert s.server.stats.paused >= 1
            conn = next(iter(s.server.connections))
            assert conn.in_flight == 4 and conn.reading_paused
            for i in range(40):
                await wait_until(lambda i=i: str(i) in gate.entered, 10, f"request {i} handled")
                assert conn.in_flight <= 4
                gate.open(str(i))
            answers = await asyncio.gather(*calls)
            assert [a.ext("key") for a in answers] == [str(i) for i in range(40)]
        finally:
            await c.close()
            await stop(s)

    on_both_loops(loop_name, scenario)


# -- the server's own requests ------------------------------------------------------------------------------
def test_server_to_client_request_answered_timed_out_and_oneway(loop_name: str) -> None:
    async def scenario() -> None:
        gate = Gate()
        s = await serve(gate, limits=RemotingLimits(server_requests_max=2))
        c = await RmqClient.connect(s.addr)
        try:
            await c.call(ECHO)  # the server knows the connection from here on
            conn = gate.connections[0]
            ask = asyncio.create_task(conn.invoke(RequestCode.CHECK_TRANSACTION_STATE, {"tranStateTableOffset": "7"},
                                                  b"half", timeout_s=10))
            request = await asyncio.wait_for(c.server_requests.get(), 10)
            assert request.code == RequestCode.CHECK_TRANSACTION_STATE and request.body == b"half"
            assert not request.is_response and request.opaque >= 1 << 30  # apart from the client's own
            await c.reply(request, ResponseCode.SUCCESS, ext={"ok": "yes"})
            assert (await ask).ext("ok") == "yes"
            # unanswered: a bounded wait, then TimeoutError; the late answer is ignored
            with pytest.raises(TimeoutError):
                await conn.invoke(RequestCode.GET_CONSUMER_RUNNING_INFO, {}, timeout_s=0.2)
            late = await asyncio.wait_for(c.server_requests.get(), 10)
            await c.reply(late)
            assert s.server.stats.server_request_timeouts == 1
            # at most server_requests_max awaited at once
            waits = [asyncio.create_task(conn.invoke(RequestCode.GET_CONSUMER_RUNNING_INFO, timeout_s=30))
                     for _ in range(2)]
            await wait_until(lambda: c.server_requests.qsize() == 2, 10, "two requests at the client")
            with pytest.raises(CommandError) as busy:
                await conn.invoke(RequestCode.GET_CONSUMER_RUNNING_INFO, timeout_s=30)
            assert busy.value.code == ResponseCode.SYSTEM_BUSY
            # the connection goes: the waits end with ConnectionError at once
            await c.close()
            for w in waits:
                with pytest.raises(ConnectionError):
                    await asyncio.wait_for(w, 10)
            # oneway to a live client
            c2 = await RmqClient.connect(s.addr)
            await c2.call(ECHO)
            await gate.connections[-1].invoke_oneway(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": "g"})
            note = await asyncio.wait_for(c2.server_requests.get(), 10)
            assert note.is_oneway and note.ext("consumerGroup") == "g"
            await c2.close()
        finally:
            await stop(s)

    on_both_loops(loop_name, scenario)


# -- bad input --------------------------------------------------------------------------------------------
def test_garbage_and_oversized_frames_close_the_connection_and_nothing_else(loop_name: str, caplog: Any) -> None:
    async def scenario() -> None:
        s = await serve(Gate(), limits=RemotingLimits(bounds=Bounds(frame_bytes_max=64 << 10)))
        try:
            cases = (
                struct.pack(">II", 12, (7 << 24) | 4) + b"{}{}" + b"xxxx",  # serialize type 7
                struct.pack(">II", 8, 100) + b"abcd",  # header longer than the frame
                struct.pack(">II", 2, 0),  # a length below the header-length word
                struct.pack(">II", 14, 6) + b"[1, 2]" + b"zzzz",  # a JSON header that is no object
                struct.pack(">II", 10, (1 << 24) | 6) + bytes(6),  # a ROCKETMQ header shorter than its fixed part
                struct.pack(">I", 0x00FFFFF0),  # 16 MiB declared, over this server's 64 KiB: before buffering
                struct.pack(">II", 6, 2) + b"{]",  # a JSON header that is no JSON
            )
            for garbage in cases:
                reader, writer = await raw(s.addr)
                writer.write(garbage)
                await writer.drain()
                assert await closed_by_server(reader) == b"", garbage
                writer.close()
            assert s.server.stats.bad_frames == len(cases)
            assert s.server.budget.used == 0
            c = await RmqClient.connect(s.addr)  # the server serves on
            assert (await c.call(ECHO, {"x": "ok"})).ext("echo") == "ok"
            await c.close()
        finally:
            await stop(s)

    caplog.set_level(logging.DEBUG)
    on_both_loops(loop_name, scenario)
    no_errors_logged(caplog)


def test_slow_loris_and_idle_connections_are_closed(loop_name: str) -> None:
    async def scenario() -> None:
        limits = RemotingLimits(first_frame_timeout_s=0.3, frame_timeout_s=0.3, idle_timeout_s=0.5)
        s = await serve(Gate(), limits=limits, sniff=SniffLimits(first_byte_timeout_s=0.3))
        try:
            frame = rc.encode(rc.request(ECHO, 1, {"x": "y"}))
            # connects and says nothing: the sniffer's first-byte time-out
            silent, w0 = await raw(s.addr)
            # half a first frame, then nothing
            half, w1 = await raw(s.addr)
            w1.write(frame[:10])
            # one whole frame, then half a frame trickled a byte at a time (bytes do not extend the deadline)
            loris, w2 = await raw(s.addr)
            w2.write(frame)
            await w2.drain()
            for reader, _ in ((silent, w0), (half, w1)):
                assert await closed_by_server(reader) == b""
            got = bytearray()

            async def trickle() -> None:
                for i in range(len(frame)):
                    if w2.is_closing():
                        return
                    w2.write(frame[i:i + 1])
                    await asyncio.sleep(0.1)  # pacing the attacker, not synchronising the test

            task = asyncio.create_task(trickle())
            got += await closed_by_server(loris)
            task.cancel()
            assert rc.decode(bytes(got)).ext_fields == {"echo": "y"}  # the answer to the whole frame came first
            # an idle connection: answered, then closed after idle_timeout_s
            c = await RmqClient.connect(s.addr)
            await c.call(ECHO)
            await c.wait_closed()
            await c.close()
            for w in (w0, w1, w2):
                w.close()
            assert s.site.listener.stats.timed_out_connections >= 1
            assert s.server.stats.timed_out_connections >= 2
        finally:
            await stop(s)

    on_both_loops(loop_name, scenario)


def test_connection_flood_is_capped_and_the_server_recovers(loop_name: str) -> None:
    async def scenario() -> None:
        s = await serve(Gate(), limits=RemotingLimits(connections_max=20), sniff=SniffLimits(pending_max=10))
        try:
            # 30 connections that send nothing: 10 wait in the sniffer, the others are closed at once
            silent = [await raw(s.addr) for _ in range(30)]
            await wait_until(lambda: s.site.listener.stats.refused_connections == 20, 10, "20 refused")
            assert s.site.listener.stats.pending == 10
            for _, w in silent:
                w.close()
            await wait_until(lambda: s.site.listener.stats.pending == 0, 10, "silent connections gone")
            # 30 remoting clients, one after the other: 20 served, 10 closed by the remoting server's cap
            clients, served = [], 0
            for _ in range(30):
                c = await RmqClient.connect(s.addr)
                clients.append(c)
                try:
                    served += (await c.call(ECHO, timeout_s=10)).code == 0
                except ConnectionError:
                    pass
            assert served == 20 and s.server.stats.refused_connections == 10
            for c in clients:
                await c.close()
            await wait_until(lambda: s.server.stats.connections == 0, 10, "connections gone")
            c = await RmqClient.connect(s.addr)
            assert (await c.call(ECHO, {"x": "again"})).ext("echo") == "again"
            await c.close()
        finally:
            await stop(s)

    on_both_loops(loop_name, scenario)


def test_unauthenticated_bytes_share_one_budget(loop_name: str) -> None:
    async def scenario() -> None:
        budget = ByteBudget(200_000)
        s = await serve(Gate(), budget=budget)
        try:
            big = rc.encode(rc.request(ECHO, 1, {}, b"x" * 150_000))
            hog_r, hog_w = await raw(s.addr)
            hog_w.write(big[:-1])  # held: the frame is never complete
            await hog_w.drain()
            await wait_until(lambda: budget.used >= 140_000, 10, "the partial frame held against the budget")
            second_r, second_w = await raw(s.addr)
            second_w.write(big)  # would take the budget past its bound: this connection is closed
            await second_w.drain()
            assert await closed_by_server(second_r) == b""
            assert s.server.stats.budget_refusals >= 1
            c = await RmqClient.connect(s.addr)  # small requests still fit
            assert (await c.call(ECHO, {"x": "small"})).ext("echo") == "small"
            hog_w.write(big[-1:])  # completed: authenticated (ACL off), answered, released
            length = struct.unpack(">I", await asyncio.wait_for(hog_r.readexactly(4), 10))[0]
            answer = rc.decode(struct.pack(">I", length) + await asyncio.wait_for(hog_r.readexactly(length), 10))
            assert answer.code == 0 and len(answer.body) == 150_000
            await wait_until(lambda: budget.used == 0, 10, "the budget given back")
            await c.close()
            hog_w.close()
            second_w.close()
        finally:
            await stop(s)

    on_both_loops(loop_name, scenario)


# -- HTTP beside remoting ---------------------------------------------------------------------------------------
def test_http_and_remoting_share_the_port(loop_name: str) -> None:
    async def scenario() -> None:
        s = await serve(Gate())
        try:
            async with aiohttp.ClientSession() as http:
                c = await RmqClient.connect(s.addr)
                for _ in range(3):
                    async with http.get(f"http://{s.addr}/hello") as resp:
                        assert resp.status == 200 and (await resp.json()) == {"hello": "http", "secure": False}
                    assert (await c.call(ECHO, {"x": "r"})).ext("echo") == "r"
                async with http.get(f"http://{s.addr}/nope") as resp:
                    assert resp.status == 404
                await c.close()
            # a TLS ClientHello to a plain port goes to HTTP, which answers a coded 400
            reader, writer = await raw(s.addr)
            writer.write(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.split(b" ")[1] == b"400" and b"application/json" in head
            writer.close()
            st = s.site.listener.stats
            assert st.http >= 2 and st.remoting == 1  # one keep-alive connection for the GETs, one raw
        finally:
            await stop(s)

    on_both_loops(loop_name, scenario)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: Any) -> dict[str, str]:
    return make_certs(str(tmp_path_factory.mktemp("tls")), ["localhost"], ["127.0.0.1"])


def _client_ctx(files: dict[str, str]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=files["ca.pem"])
    return ctx


@pytest.mark.parametrize("mode", [TlsMode.ENFORCING, TlsMode.PERMISSIVE])
def test_tls_port_serves_both_inside_tls_and_plain_by_mode(loop_name: str, mode: TlsMode,
                                                           tls_files: dict[str, str]) -> None:
    async def scenario() -> None:
        server_ctx = server_ssl_context(tls_files["server.pem"], tls_files["server.key"])
        s = await serve(Gate(), ssl_context=server_ctx, tls_mode=mode)
        try:
            ctx = _client_ctx(tls_files)
            c = await RmqClient.connect(s.addr, ssl_context=ctx)
            for stype in (SerializeType.JSON, SerializeType.ROCKETMQ):
                c.serialize_type = stype
                assert (await c.call(ECHO, {"x": "tls"})).ext("echo") == "tls"
            await c.close()
            async with aiohttp.ClientSession() as http:
                async with http.get(f"https://{s.addr}/hello", ssl=ctx) as resp:
                    assert (await resp.json()) == {"hello": "http", "secure": True}
            plain = await RmqClient.connect(s.addr)
            if mode is TlsMode.ENFORCING:
                with pytest.raises(ConnectionError):
                    await plain.call(ECHO)
                assert s.site.listener.stats.plain_refused == 1
            else:
                assert (await plain.call(ECHO, {"x": "plain"})).ext("echo") == "plain"
            await plain.close()
            # a handshake that fails (a client that does not trust the certificate) is the client's problem
            with pytest.raises(ssl.SSLError):
                await RmqClient.connect(s.addr, ssl_context=ssl.create_default_context())
            await wait_until(lambda: s.site.listener.stats.tls_failed == 1, 10, "the failed handshake counted")
            await wait_until(lambda: s.site.listener.stats.pending == 0, 10, "no connection left pending")
        finally:
            await stop(s)

    on_both_loops(loop_name, scenario)


def test_stopping_closes_every_kind_of_connection(loop_name: str) -> None:
    async def scenario() -> None:
        gate = Gate()
        s = await serve(gate)
        c = await RmqClient.connect(s.addr)
        parked = asyncio.create_task(c.call(PARK, {"key": "never"}, timeout_s=30))
        await wait_until(lambda: gate.entered == ["never"], 10, "a request in flight")
        silent_r, silent_w = await raw(s.addr)
        await s.runner.cleanup()
        await s.server.stop(grace_s=0.1)
        assert await closed_by_server(silent_r) == b""
        await c.wait_closed()
        with pytest.raises(ConnectionError):
            await parked
        silent_w.close()
        await c.close()
        with pytest.raises(OSError):
            await raw(s.addr)

    on_both_loops(loop_name, scenario)


def test_port_zero_binds_and_reports_the_port() -> None:
    async def scenario() -> None:
        s = await serve(Gate())
        try:
            port = int(s.addr.rpartition(":")[2])
            assert port > 0
            with socket.create_connection((HOST, port), timeout=5):
                pass
        finally:
            await stop(s)

    asyncio.run(scenario())
