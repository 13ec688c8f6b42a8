"""The SDK's HTTP/1.1 keep-alive transport against real sockets on 127.0.0.1.

Most tests use ``RawServer``: a few lines of HTTP over raw asyncio streams, so a test can misbehave
exactly as it needs to (close an idle connection, read a request and hang up, answer late, answer
without a length, answer garbage) and count what the server saw: accepted connections, parsed
requests, closed connections. aiohttp's server checks the parts where a real server's parsing
matters (query and path decoding, 4 MiB bodies, JSON errors).

"Seen" below means parsed and handled by the server: the property that decides whether a request
may have taken effect, hence whether resending it is safe.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgpack
import pytest
from aiohttp import web

from broker.client import transport as transport_mod
from broker.client.transport import (
    DEFAULT_NAMESRV,
    MSGPACK,
    ClientError,
    NamesrvClient,
    Transport,
    parse_addrs,
)
from tests.dledger.harness import wait_until

HOST = "127.0.0.1"
WAIT_S = 5.0  # every wait on a condition fails after this, never hangs


# -- a raw HTTP/1.1 server -----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    def unpacked(self) -> Any:
        return msgpack.unpackb(self.body, raw=False) if self.body else None


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """One request off the stream; None when the client closed the connection between requests."""
    line = await reader.readline()
    if not line:
        return None
    method, target, _version = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (header := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Request(method, target, headers, body)


def http_answer(
    body: bytes, status: int = 200, *, ctype: str = MSGPACK, length: bool = True, close: bool = False
) -> bytes:
    head = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}", f"Content-Type: {ctype}"]
    if length:
        head.append(f"Content-Length: {len(body)}")
    if close:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def packed(value: Any, status: int = 200, **kwargs: Any) -> bytes:
    return http_answer(msgpack.packb(value, use_bin_type=True), status, **kwargs)


Handler = Callable[[Request], Awaitable[bytes | None]]  # the answer's bytes; None: hang up unanswered
ServeConn = Callable[["RawServer", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def echo(req: Request) -> bytes:
    return packed({"method": req.method, "target": req.target, "body": req.unpacked()})


class RawServer:
    """Answers each request with what ``handler`` returns, on keep-alive connections (unless
    ``close_after_answer``); ``serve_conn`` replaces the whole per-connection behaviour."""

    def __init__(self, handler: Handler, *, close_after_answer: bool = False, serve_conn: ServeConn | None):
        self.handler = handler
        self.close_after_answer = close_after_answer
        self.serve_conn = serve_conn
        self.requests: list[Request] = []
        self.accepted = 0
        self.closed = 0  # connections over, whichever side ended them
        self.answers_written = 0  # including writes that failed because the client had gone
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Condition()

    @classmethod
    async def start(
        cls, handler: Handler = echo, *, close_after_answer: bool = False, serve_conn: ServeConn | None = None
    ) -> RawServer:
        server = cls(handler, close_after_answer=close_after_answer, serve_conn=serve_conn)
        server._server = await asyncio.start_server(server._connection, HOST, 0)
        server.port = server._server.sockets[0].getsockname()[1]
        return server

    @property
    def addr(self) -> str:
        return f"{HOST}:{self.port}"

    async def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        try:
            async with asyncio.timeout(WAIT_S):
                async with self._changed:
                    await self._changed.wait_for(predicate)
        except TimeoutError:
            raise AssertionError(f"timed out after {WAIT_S} s waiting for {what}") from None

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.accepted += 1
        await self._notify()
        try:
            if self.serve_conn is not None:
                await self.serve_conn(self, reader, writer)
            else:
                await self.serve_requests(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or close() at teardown
        finally:
            writer.close()
            self._writers.discard(writer)
            self._tasks.discard(task)
            self.closed += 1
            await self._notify()

    async def serve_requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int | None = None
    ) -> None:
        served = 0
        while limit is None or served < limit:
            req = await read_request(reader)
            if req is None:
                return
            self.requests.append(req)
            await self._notify()
            answer = await self.handler(req)
            if answer is None:
                return
            try:
                writer.write(answer)
                await writer.drain()
            finally:
                self.answers_written += 1
                await self._notify()
            served += 1
            if self.close_after_answer:
                return

    async def stop_listening(self) -> None:
        assert self._server is not None
        self._server.close()  # open connections stay up (Python 3.11 semantics, kept by 3.12)

    async def drop_connections(self) -> None:
        """Close every open connection (as a restarting server would), keep listening."""
        for writer in list(self._writers):
            writer.close()
        await self.wait_for(lambda: not self._writers, "the connections closed")

    async def close(self) -> None:
        await self.stop_listening()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture
async def transport() -> AsyncIterator[Transport]:
    t = Transport(timeout_s=WAIT_S)
    yield t
    await t.close()


ServerFactory = Callable[..., Awaitable[RawServer]]


@pytest.fixture
async def raw_server() -> AsyncIterator[ServerFactory]:
    started: list[RawServer] = []

    async def start(handler: Handler = echo, **kwargs: Any) -> RawServer:
        server = await RawServer.start(handler, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        await server.close()


AppFactory = Callable[[web.Application], Awaitable[str]]


@pytest.fixture
async def aiohttp_server() -> AsyncIterator[AppFactory]:
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app, shutdown_timeout=0.2)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, HOST, 0).start()
        return f"{HOST}:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


async def client_saw_close(transport: Transport, addr: str) -> None:
    """White-box: wait until the client's event loop has read the server's FIN on every pooled
    connection. Without it, "closed while idle" would race with the next request being written."""
    await wait_until(
        lambda: all(c.reader.at_eof() or c.writer.is_closing() for c in transport._idle.get(addr, [])),
        WAIT_S,
        "the client to see its pooled connections closed",
    )


# -- keep-alive and the pool ----------------------------------------------------------------------
async def test_sequential_calls_share_one_connection(transport: Transport, raw_server: ServerFactory) -> None:
    server = await raw_server()
    for i in range(5):
        answer = await transport.call(server.addr, "POST", "/v1/send", {"i": i})
        assert answer == {"method": "POST", "target": "/v1/send", "body": {"i": i}}
    assert await transport.call(server.addr, "GET", "/v1/status") == {
        "method": "GET",
        "target": "/v1/status",
        "body": None,
    }
    assert server.accepted == 1
    assert len(server.requests) == 6
    assert server.requests[0].headers["content-type"] == MSGPACK
    assert server.requests[0].headers["host"] == server.addr
    assert "content-type" not in server.requests[-1].headers  # no body, no type


async def test_concurrent_calls_open_parallel_connections_then_reuse_them(
    transport: Transport, raw_server: ServerFactory
) -> None:
    width = 4
    server: RawServer

    async def answer_when_a_round_is_in(req: Request) -> bytes:
        # Nobody is answered before all ``width`` calls of the round arrived: they must be in flight at
        # once, each on its own connection.
        n = len(server.requests)
        round_end = -(-n // width) * width
        await server.wait_for(lambda: len(server.requests) >= round_end, f"{round_end} requests")
        return packed(req.unpacked())

    server = await raw_server(answer_when_a_round_is_in)
    for round_no in range(3):
        answers = await asyncio.gather(
            *(transport.call(server.addr, "POST", "/v1/send", {"r": round_no, "i": i}) for i in range(width))
        )
        assert answers == [{"r": round_no, "i": i} for i in range(width)]
        assert server.accepted == width  # later rounds run on the pooled connections
    assert server.closed == 0


async def test_pool_keeps_at_most_max_connections_idle(raw_server: ServerFactory) -> None:
    server: RawServer

    async def answer_when_three_are_in(req: Request) -> bytes:
        await server.wait_for(lambda: len(server.requests) >= 3, "3 requests")
        return packed(None)

    server = await raw_server(answer_when_three_are_in)
    t = Transport(timeout_s=WAIT_S, max_connections=2)
    try:
        await asyncio.gather(*(t.call(server.addr, "GET", "/x") for _ in range(3)))
        await server.wait_for(lambda: server.closed == 1, "the connection over the idle limit closed")
        await asyncio.gather(*(t.call(server.addr, "GET", "/x") for _ in range(2)))
        assert server.accepted == 3
    finally:
        await t.close()


async def test_idle_connection_closed_by_the_server_is_replaced_and_the_request_sent_once(
    transport: Transport, raw_server: ServerFactory
) -> None:
    # An idle timeout on the server: it answers (keep-alive, so the client pools the connection), then
    # closes the connection.
    server = await raw_server(close_after_answer=True)
    await transport.call(server.addr, "POST", "/v1/send", {"i": 0})
    await server.wait_for(lambda: server.closed == 1, "the server closing the idle connection")
    await client_saw_close(transport, server.addr)

    assert await transport.call(server.addr, "POST", "/v1/send", {"i": 1}) == {
        "method": "POST",
        "target": "/v1/send",
        "body": {"i": 1},
    }
    assert [r.unpacked() for r in server.requests] == [{"i": 0}, {"i": 1}]
    assert server.accepted == 2


async def test_many_pooled_connections_closed_by_a_restart_do_not_fail_the_next_call(
    transport: Transport, raw_server: ServerFactory
) -> None:
    # A broker restart closes every pooled connection of a busy producer at once, more of them than
    # the stale-connection retries the transport allows per call.
    width = 5
    server: RawServer

    async def answer_when_all_are_in(req: Request) -> bytes:
        await server.wait_for(lambda: len(server.requests) >= width, f"{width} requests")
        return packed("ok")

    server = await raw_server(answer_when_all_are_in)
    await asyncio.gather(*(transport.call(server.addr, "GET", "/v1/status") for _ in range(width)))
    assert server.accepted == width
    await server.drop_connections()
    await client_saw_close(transport, server.addr)

    assert await transport.call(server.addr, "POST", "/v1/send", {"i": 1}) == "ok"
    assert server.accepted == width + 1
    assert sum(r.target == "/v1/send" for r in server.requests) == 1


async def answer_once_then_hang_up_unread(
    server: RawServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Answer one request, then hang up as soon as the next one starts arriving, without parsing it:
    a server closing an idle connection just as the client reuses it."""
    await server.serve_requests(reader, writer, limit=1)
    await reader.read(1)


async def test_get_on_a_connection_closed_as_it_is_reused_is_retried_once(
    transport: Transport, raw_server: ServerFactory
) -> None:
    server = await raw_server(serve_conn=answer_once_then_hang_up_unread)
    await transport.call(server.addr, "GET", "/v1/routes/a")
    answer = await transport.call(server.addr, "GET", "/v1/routes/b")
    assert answer["target"] == "/v1/routes/b"
    assert [r.target for r in server.requests] == ["/v1/routes/a", "/v1/routes/b"]  # b seen once
    assert server.accepted == 2


# -- answers that never come ----------------------------------------------------------------------
async def hang_up_on_drop(req: Request) -> bytes | None:
    return None if req.target == "/v1/drop" else await echo(req)


async def test_request_read_then_connection_closed_is_connection_lost_and_not_resent(
    transport: Transport, raw_server: ServerFactory
) -> None:
    server = await raw_server(hang_up_on_drop)
    with pytest.raises(ClientError) as info:
        await transport.call(server.addr, "POST", "/v1/drop", {"i": 1})
    assert info.value.code == "CONNECTION_LOST"
    assert info.value.outcome_unknown
    assert info.value.status == 0
    assert info.value.addr == server.addr
    assert len(server.requests) == 1
    assert server.accepted == 1


async def test_request_read_then_pooled_connection_closed_is_connection_lost_and_not_resent(
    transport: Transport, raw_server: ServerFactory
) -> None:
    # The same on a reused keep-alive connection (the usual case for a producer): the client cannot tell
    # "closed while idle" from "read, then crashed", so a POST must not be sent again.
    server = await raw_server(hang_up_on_drop)
    await transport.call(server.addr, "POST", "/v1/send", {"i": 0})
    with pytest.raises(ClientError) as info:
        await transport.call(server.addr, "POST", "/v1/drop", {"i": 1})
    assert info.value.code == "CONNECTION_LOST"
    assert info.value.outcome_unknown
    assert [r.target for r in server.requests] == ["/v1/send", "/v1/drop"]


async def test_server_dying_after_reading_a_request_leaves_the_outcome_unknown(
    transport: Transport, raw_server: ServerFactory
) -> None:
    # kill -9 of a leader in the middle of a send, on a pooled connection: the message may be stored,
    # so the error must say so (not CONNECT_FAILED from a resend to the dead address).
    server: RawServer

    async def die_on_send(req: Request) -> bytes | None:
        if req.target == "/v1/send":
            await server.stop_listening()
            return None
        return await echo(req)

    server = await raw_server(die_on_send)
    await transport.call(server.addr, "GET", "/v1/status")
    with pytest.raises(ClientError) as info:
        await transport.call(server.addr, "POST", "/v1/send", {"i": 1})
    assert info.value.code == "CONNECTION_LOST"
    assert info.value.outcome_unknown
    assert sum(r.target == "/v1/send" for r in server.requests) == 1


async def test_timeout_closes_the_connection_so_a_late_answer_is_never_read_by_the_next_call(
    transport: Transport, raw_server: ServerFactory
) -> None:
    release_first = asyncio.Event()
    server: RawServer

    async def first_answer_late(req: Request) -> bytes:
        n = len(server.requests)
        if n == 1:
            await release_first.wait()
        return packed({"n": n})

    server = await raw_server(first_answer_late)
    with pytest.raises(ClientError) as info:
        await transport.call(server.addr, "POST", "/v1/send", {"i": 1}, timeout_s=0.1)
    assert info.value.code == "TIMEOUT"
    assert info.value.outcome_unknown
    assert info.value.status == 0

    release_first.set()  # the late answer goes out on the first connection...
    await server.wait_for(lambda: server.answers_written == 1, "the late answer written")
    # ...which the client must have dropped: had it pooled it, this call would read {"n": 1}.
    assert await transport.call(server.addr, "POST", "/v1/send", {"i": 2}) == {"n": 2}
    assert server.accepted == 2
    await server.wait_for(lambda: server.closed == 1, "the timed-out connection closed")


async def test_timeout_per_call_overrides_the_default(raw_server: ServerFactory) -> None:
    never = asyncio.Event()

    async def hang(req: Request) -> bytes:
        await never.wait()
        return packed(None)

    server = await raw_server(hang)
    t = Transport(timeout_s=0.05)
    try:
        with pytest.raises(ClientError, match="TIMEOUT") as info:
            await t.call(server.addr, "GET", "/x")
        assert "0.05" in info.value.message
    finally:
        await t.close()


async def test_connection_refused_is_connect_failed(transport: Transport) -> None:
    addr = f"{HOST}:{free_port()}"
    with pytest.raises(ClientError) as info:
        await transport.call(addr, "POST", "/v1/send", {"i": 1})
    assert info.value.code == "CONNECT_FAILED"
    assert not info.value.outcome_unknown  # nothing was sent
    assert info.value.status == 0
    assert info.value.addr == addr


async def test_unparsable_address_is_connect_failed(transport: Transport) -> None:
    with pytest.raises(ClientError) as info:
        await transport.call(f"{HOST}:port", "GET", "/x")
    assert info.value.code == "CONNECT_FAILED"


# -- framing --------------------------------------------------------------------------------------
async def test_connection_close_answer_is_honoured(transport: Transport, raw_server: ServerFactory) -> None:
    # The server says "close" but keeps its end open: only the client can end the connection, and a
    # second request on it would show up on the same connection.
    async def say_close(req: Request) -> bytes:
        return packed({"target": req.target}, close=True)

    server = await raw_server(say_close)
    assert await transport.call(server.addr, "GET", "/a") == {"target": "/a"}
    await server.wait_for(lambda: server.closed == 1, "the client closing the connection")
    assert await transport.call(server.addr, "GET", "/b") == {"target": "/b"}
    assert server.accepted == 2


async def test_answer_without_content_length_is_read_to_the_end_of_the_connection(
    transport: Transport, raw_server: ServerFactory
) -> None:
    async def no_length(req: Request) -> bytes:
        return http_answer(msgpack.packb({"target": req.target, "pad": "x" * 100_000}), length=False)

    server = await raw_server(no_length, close_after_answer=True)
    answer = await transport.call(server.addr, "GET", "/a")
    assert answer == {"target": "/a", "pad": "x" * 100_000}
    assert (await transport.call(server.addr, "GET", "/b"))["target"] == "/b"
    assert server.accepted == 2


async def test_empty_answer_is_none(transport: Transport, raw_server: ServerFactory) -> None:
    async def empty(req: Request) -> bytes:
        return http_answer(b"")

    server = await raw_server(empty)
    assert await transport.call(server.addr, "POST", "/v1/offsets", {"o": 1}) is None
    assert await transport.call(server.addr, "POST", "/v1/offsets", {"o": 2}) is None
    assert server.accepted == 1


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(b"HELLO\r\n\r\n", id="no-status-code"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: nine\r\n\r\n", id="bad-length"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10, id="cut-body"),
        pytest.param(b"HTTP/1.1 200", id="cut-status-line"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Len", id="cut-headers"),
    ],
)
async def test_malformed_or_cut_answer_is_connection_lost(
    transport: Transport, raw_server: ServerFactory, answer: bytes
) -> None:
    async def malformed(req: Request) -> bytes:
        return answer

    server = await raw_server(malformed, close_after_answer=True)
    with pytest.raises(ClientError) as info:
        await transport.call(server.addr, "POST", "/v1/send", {"i": 1})
    assert info.value.code == "CONNECTION_LOST"
    assert info.value.outcome_unknown  # the server read the request
    assert len(server.requests) == 1


# -- error answers --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "body", "code", "message", "leader_addr"),
    [
        (404, {"code": "TOPIC_NOT_EXIST", "message": "no topic T"}, "TOPIC_NOT_EXIST", "no topic T", None),
        (
            409,
            {"code": "NOT_LEADER", "message": "", "leader_addr": "127.0.0.2:1"},
            "NOT_LEADER",
            "",
            "127.0.0.2:1",
        ),
        (500, {"code": "INTERNAL", "message": "boom"}, "INTERNAL", "boom", None),
        (503, {"message": "no code"}, "HTTP_503", "no code", None),
        (502, ["not", "a", "dict"], "HTTP_502", "", None),
        (500, None, "HTTP_500", "", None),
        (409, {"code": "APPEND_FAILED", "message": "replaced"}, "APPEND_FAILED", "replaced", None),
        (503, {"code": "NOT_READY", "message": "applying"}, "NOT_READY", "applying", None),
        (504, {"code": "SEND_TIMEOUT", "message": "no commit"}, "SEND_TIMEOUT", "no commit", None),
    ],
)
async def test_error_answers_become_client_errors(
    transport: Transport,
    raw_server: ServerFactory,
    status: int,
    body: Any,
    code: str,
    message: str,
    leader_addr: str | None,
) -> None:
    async def fail(req: Request) -> bytes:
        return http_answer(b"" if body is None else msgpack.packb(body), status)

    server = await raw_server(fail)
    with pytest.raises(ClientError) as info:
        await transport.call(server.addr, "POST", "/v1/send", {"i": 1})
    err = info.value
    assert (err.code, err.status, err.leader_addr, err.addr) == (code, status, leader_addr, server.addr)
    if message:
        assert err.message == message
    # Definite ("cannot be stored") only for a refusal before the broker acted: a 4xx answer other
    # than APPEND_FAILED, or 503 NOT_READY / 507 DISK_FULL. A 5xx may come after the append, and an
    # entry replaced on one replica may still be committed by another (Raft, Figure 8).
    assert err.outcome_unknown == (code in ("APPEND_FAILED", "SEND_TIMEOUT") or (status >= 500 and code != "NOT_READY"))
    with pytest.raises(ClientError):
        await transport.call(server.addr, "POST", "/v1/send", {"i": 2})
    assert server.accepted == 1  # an error answer keeps the connection


async def test_json_answers_and_json_errors_are_decoded(
    transport: Transport, aiohttp_server: AppFactory
) -> None:
    async def not_leader(request: web.Request) -> web.Response:
        return web.json_response({"code": "NOT_LEADER", "message": "ask b", "leader_addr": "b:1"}, status=409)

    async def status(request: web.Request) -> web.Response:
        return web.json_response({"state": "LEADER", "term": 3})

    app = web.Application()
    app.router.add_post("/v1/send", not_leader)
    app.router.add_get("/v1/status", status)
    addr = await aiohttp_server(app)

    assert await transport.call(addr, "GET", "/v1/status") == {"state": "LEADER", "term": 3}
    with pytest.raises(ClientError) as info:
        await transport.call(addr, "POST", "/v1/send", {"i": 1})
    assert (info.value.code, info.value.message, info.value.status, info.value.leader_addr) == (
        "NOT_LEADER",
        "ask b",
        409,
        "b:1",
    )


async def test_garbage_error_answer_is_bad_answer(transport: Transport, raw_server: ServerFactory) -> None:
    # A proxy's HTML error page: a ClientError carrying the status and the start of the page.
    async def html(req: Request) -> bytes:
        return http_answer(b"<html>Bad Gateway</html>", 502, ctype="text/html")

    server = await raw_server(html)
    with pytest.raises(ClientError) as info:
        await transport.call(server.addr, "GET", "/v1/status")
    assert (info.value.code, info.value.status) == ("BAD_ANSWER", 502)
    assert "Bad Gateway" in info.value.message
    assert info.value.outcome_unknown  # whatever the broker behind the proxy did is unreadable


async def test_router_404_without_a_code_is_a_client_error(
    transport: Transport, aiohttp_server: AppFactory
) -> None:
    addr = await aiohttp_server(web.Application())  # every path: aiohttp's text/plain "404: Not Found"
    with pytest.raises(ClientError) as info:
        await transport.call(addr, "GET", "/v1/nothing")
    assert info.value.status == 404
    assert "Not Found" in info.value.message


@pytest.mark.parametrize(
    ("body", "ctype"),
    [
        pytest.param(b"<html>hello</html>", "text/html", id="html"),
        pytest.param(b"\xc1", MSGPACK, id="bad-msgpack"),
        pytest.param(msgpack.packb(1) + b"trailing", MSGPACK, id="msgpack-extra-data"),
        pytest.param(b"{not json", "application/json", id="bad-json"),
    ],
)
async def test_garbage_success_answer_is_bad_answer_not_a_fake_result(
    transport: Transport, raw_server: ServerFactory, body: bytes, ctype: str
) -> None:
    async def garbage(req: Request) -> bytes:
        return http_answer(body, ctype=ctype)

    server = await raw_server(garbage)
    with pytest.raises(ClientError) as info:
        await transport.call(server.addr, "POST", "/v1/send", {"i": 1})
    assert (info.value.code, info.value.status, info.value.addr) == ("BAD_ANSWER", 200, server.addr)
    assert info.value.outcome_unknown  # the server took the request; what it did is unreadable


async def test_garbage_route_answer_is_a_client_error_not_a_key_error(
    transport: Transport, raw_server: ServerFactory
) -> None:
    async def html(req: Request) -> bytes:
        return http_answer(b"<html>captive portal</html>", ctype="text/html")

    server = await raw_server(html)
    with pytest.raises(ClientError, match="BAD_ANSWER"):
        await NamesrvClient(server.addr, transport).route("T")


# -- request encoding -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "params", "target"),
    [
        ("/v1/topics/%25RETRY%25g", None, "/v1/topics/%25RETRY%25g"),
        ("/v1/topics/a b", None, "/v1/topics/a%20b"),
        ("/v1/topics/t\u00f3pico", None, "/v1/topics/t%C3%B3pico"),
        ("/v1/topics/a?b#c", None, "/v1/topics/a%3Fb%23c"),
        ("/v1/offsets", {"v": 1, "group": "g 1", "tags": "a||b&c=d", "skip": None}, None),
        ("/v1/status", {}, "/v1/status"),
    ],
)
async def test_path_and_query_are_encoded(
    transport: Transport,
    raw_server: ServerFactory,
    path: str,
    params: dict[str, Any] | None,
    target: str | None,
) -> None:
    server = await raw_server()
    await transport.call(server.addr, "GET", path, params=params)
    sent = server.requests[0].target
    if target is not None:
        assert sent == target
    else:
        assert sent == "/v1/offsets?v=1&group=g+1&tags=a%7C%7Cb%26c%3Dd"  # None values left out
    assert " " not in sent


async def test_path_and_query_round_trip_through_aiohttp(
    transport: Transport, aiohttp_server: AppFactory
) -> None:
    async def show(request: web.Request) -> web.Response:
        seen = {"topic": request.match_info["topic"], "query": dict(request.query)}
        return web.Response(body=msgpack.packb(seen), content_type=MSGPACK)

    app = web.Application()
    app.router.add_get("/v1/topics/{topic}", show)
    addr = await aiohttp_server(app)
    answer = await transport.call(
        addr, "GET", "/v1/topics/%25RETRY%25g", params={"v": 1, "group": "g 1+2", "tags": "a||b&c"}
    )
    assert answer == {"topic": "%RETRY%g", "query": {"v": "1", "group": "g 1+2", "tags": "a||b&c"}}
    answer = await transport.call(addr, "GET", "/v1/topics/a b")
    assert answer["topic"] == "a b"


async def test_four_mib_bodies_both_ways(transport: Transport, aiohttp_server: AppFactory) -> None:
    payload = bytes(range(256)) * (4 * 1024 * 1024 // 256)

    async def reverse(request: web.Request) -> web.Response:
        data = msgpack.unpackb(await request.read())["data"]
        return web.Response(body=msgpack.packb({"data": data[::-1], "size": len(data)}), content_type=MSGPACK)

    app = web.Application(client_max_size=16 << 20)
    app.router.add_post("/v1/echo", reverse)
    addr = await aiohttp_server(app)
    for _ in range(2):  # the second on the same connection: the first answer was read exactly
        answer = await transport.call(addr, "POST", "/v1/echo", {"data": payload})
        assert answer["size"] == len(payload)
        assert answer["data"] == payload[::-1]


# -- close ----------------------------------------------------------------------------------------
# Dropped without close(), a connection is still closed by the garbage collector: the ResourceWarning
# ("unclosed StreamWriter") tells.
@pytest.mark.filterwarnings("error::ResourceWarning", "error::pytest.PytestUnraisableExceptionWarning")
async def test_close_closes_pooled_connections(raw_server: ServerFactory) -> None:
    width = 3
    server: RawServer

    async def answer_when_all_are_in(req: Request) -> bytes:
        await server.wait_for(lambda: len(server.requests) >= width, f"{width} requests")
        return packed(None)

    server = await raw_server(answer_when_all_are_in)
    t = Transport(timeout_s=WAIT_S)
    await asyncio.gather(*(t.call(server.addr, "GET", "/x") for _ in range(width)))
    assert (server.accepted, server.closed) == (width, 0)
    await t.close()
    await server.wait_for(lambda: server.closed == width, "every pooled connection closed")


@pytest.mark.filterwarnings("error::ResourceWarning", "error::pytest.PytestUnraisableExceptionWarning")
async def test_a_call_in_flight_during_close_is_answered_then_its_connection_closed(
    raw_server: ServerFactory,
) -> None:
    release = asyncio.Event()

    async def held(req: Request) -> bytes:
        await release.wait()
        return packed("late")

    server = await raw_server(held)
    t = Transport(timeout_s=WAIT_S)
    call = asyncio.create_task(t.call(server.addr, "GET", "/x"))
    await server.wait_for(lambda: len(server.requests) == 1, "the request")
    await t.close()
    release.set()
    assert await call == "late"
    await server.wait_for(lambda: server.closed == 1, "the connection closed, not pooled")


# -- parse_addrs ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "addrs"),
    [
        ("a:9876", ["a:9876"]),
        ("a:9876;b:9877", ["a:9876", "b:9877"]),
        ("a:9876,b:9877", ["a:9876", "b:9877"]),
        (" a:9876 ; b:9877, c:1 ;", ["a:9876", "b:9877", "c:1"]),
        (["a:9876", " b:65535 ", ""], ["a:9876", "b:65535"]),
        ("[::1]:9876", ["[::1]:9876"]),
    ],
)
def test_parse_addrs(spec: str | list[str], addrs: list[str]) -> None:
    assert parse_addrs(spec) == addrs


@pytest.mark.parametrize(
    "spec",
    ["a:0", "a:65536", "a:port", "a:-1", "a", "a:", ":9876", "a:9876;b", "", " ; ", []],
)
def test_parse_addrs_rejects_bad_addresses(spec: str | list[str]) -> None:
    with pytest.raises(ValueError):
        parse_addrs(spec)


def test_parse_addrs_falls_back_to_the_environment_then_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAMESRV_ADDR", "n1:9876;n2:9876")
    assert parse_addrs(None) == ["n1:9876", "n2:9876"]
    assert parse_addrs("x:1") == ["x:1"]  # an explicit spec wins
    monkeypatch.setenv("NAMESRV_ADDR", "")
    assert parse_addrs(None) == [DEFAULT_NAMESRV]
    monkeypatch.delenv("NAMESRV_ADDR")
    assert parse_addrs(None) == [DEFAULT_NAMESRV]
    monkeypatch.setenv("NAMESRV_ADDR", "n1:http")
    with pytest.raises(ValueError, match="n1:http"):
        parse_addrs(None)


# -- NamesrvClient --------------------------------------------------------------------------------
ROUTE = {
    "v": 1,
    "topic": "%RETRY%g",
    "order": False,
    "queue_datas": [{"broker_name": "b0", "read_queue_nums": 4, "write_queue_nums": 2, "perm": 6}],
    "broker_datas": [{"cluster": "c", "broker_name": "b0", "broker_addrs": {"0": "h:1", "1": "h:2"}}],
}


async def namesrv(req: Request) -> bytes:
    if req.target.startswith("/v1/routes/"):
        return packed(ROUTE)
    if req.target.startswith("/v1/topics"):
        return packed({"v": 1, "topics": ["T", "%RETRY%g"]})
    if req.target.startswith("/v1/clusters"):
        return packed({"v": 1, "clusters": {"c": ["b0"]}, "brokers": {"b0": ROUTE["broker_datas"][0]}})
    return packed({"code": "NOT_FOUND", "message": req.target}, 404)


async def test_a_route_answer_that_is_not_a_v1_record_is_a_coded_error(
    transport: Transport, raw_server: ServerFactory
) -> None:
    """The SDK decodes routes with the NameServer's own codec (broker/protocol/route_wire.py): an
    answer without its schema version, or with a field of the wrong type, is BAD_RESPONSE."""

    async def odd(req: Request) -> bytes:
        if req.target.startswith("/v1/routes/"):
            return packed({k: v for k, v in ROUTE.items() if k != "v"})
        return packed({**ROUTE, "queue_datas": "none"})

    client = NamesrvClient([(await raw_server(odd)).addr], transport)
    for call in (client.route("T"), client.clusters()):
        with pytest.raises(ClientError) as info:
            await call
        assert info.value.code == "BAD_RESPONSE"


@pytest.fixture
def tried_in_given_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_mod.random, "shuffle", lambda seq: None)


@pytest.mark.usefixtures("tried_in_given_order")
@pytest.mark.parametrize("down_first", [True, False])
async def test_namesrv_client_skips_a_nameserver_that_is_down(
    transport: Transport, raw_server: ServerFactory, down_first: bool
) -> None:
    up = await raw_server(namesrv)
    down = f"{HOST}:{free_port()}"
    client = NamesrvClient([down, up.addr] if down_first else [up.addr, down], transport)

    route = await client.route("%RETRY%g")
    assert route.topic == "%RETRY%g"
    assert route.broker("b0") is not None
    assert route.broker("b0").broker_addrs == {0: "h:1", 1: "h:2"}  # type: ignore[union-attr]
    assert route.broker("b0").leader_addr == "h:1"  # type: ignore[union-attr]
    assert route.queue_datas[0].write_queue_nums == 2
    assert await client.topics() == ["T", "%RETRY%g"]
    info = await client.clusters()
    assert info.clusters == {"c": ("b0",)} and info.brokers["b0"].leader_addr == "h:1"
    assert up.requests[0].target == "/v1/routes/%25RETRY%25g?v=1"


@pytest.mark.usefixtures("tried_in_given_order")
async def test_namesrv_client_raises_the_last_error_when_all_are_down(transport: Transport) -> None:
    addrs = [f"{HOST}:{free_port()}", f"{HOST}:{free_port()}"]
    with pytest.raises(ClientError) as info:
        await NamesrvClient(addrs, transport).route("T")
    assert info.value.code == "CONNECT_FAILED"
    assert info.value.addr == addrs[-1]


@pytest.mark.usefixtures("tried_in_given_order")
async def test_namesrv_client_tries_the_next_nameserver_after_a_5xx(
    transport: Transport, raw_server: ServerFactory
) -> None:
    async def shutting_down(req: Request) -> bytes:
        return packed({"code": "SHUTTING_DOWN", "message": ""}, 503)

    sick = await raw_server(shutting_down)
    up = await raw_server(namesrv)
    route = await NamesrvClient([sick.addr, up.addr], transport).route("T")
    assert route.topic == "%RETRY%g"
    assert len(sick.requests) == len(up.requests) == 1


@pytest.mark.usefixtures("tried_in_given_order")
async def test_namesrv_client_believes_a_404(transport: Transport, raw_server: ServerFactory) -> None:
    async def no_topic(req: Request) -> bytes:
        return packed({"code": "TOPIC_NOT_EXIST", "message": "no route for T"}, 404)

    first = await raw_server(no_topic)
    second = await raw_server(namesrv)
    with pytest.raises(ClientError) as info:
        await NamesrvClient([first.addr, second.addr], transport).route("T")
    assert (info.value.code, info.value.status) == ("TOPIC_NOT_EXIST", 404)
    assert len(first.requests) == 1
    assert second.requests == []  # another NameServer would say the same
