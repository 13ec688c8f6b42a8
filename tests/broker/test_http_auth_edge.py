"""The HTTP ports' edge with the ACL on (issue 23): a request's signature is checked from its head
before its body is read (finding 5's HTTP side: bodies were buffered, up to 256 MiB together,
before any signature was checked), every answer names the server's signing scope, and what aiohttp
answers before any middleware runs (an ``Expect`` it does not serve) is a coded JSON error too
(finding 7). The real edge (``broker.serving.http_edge``) and ``Security`` on a small app."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from broker.protocol import auth
from broker.serving.http_edge import (
    ErrorAnswer,
    Guard,
    Limits,
    error_middleware,
    guarded_app,
    request_body,
    start_server,
)
from broker.serving.security import Security
from tests.acl_fixtures import ADMIN, write_acl

HOST = "127.0.0.1"
SCOPE = auth.broker_scope("C", "RaftNode00", "n0")


class Edge:
    def __init__(self, guard: Guard, addr: str):
        self.guard = guard
        self.addr = addr
        self.bodies: list[int] = []


@pytest.fixture
async def edge(tmp_path: Any) -> AsyncIterator[Edge]:
    async for e in serve_edge(tmp_path, Limits(client_max_size=16 << 20, body_timeout_s=30.0)):
        yield e


async def serve_edge(tmp_path: Any, limits: Limits) -> AsyncIterator[Edge]:
    acl = write_acl(os.path.join(str(tmp_path), "plain_acl.yml"))
    guard = Guard(limits, lambda code, message: {"code": code, "message": message})
    sec = Security(acl, lambda: int(time.time() * 1000), guard, scope=SCOPE)

    def classify(exc: Exception) -> ErrorAnswer | None:
        if isinstance(exc, auth.AuthError):
            return ErrorAnswer(exc.status, exc.code, exc.message, exc.extra)
        return None

    got: list[int] = []

    async def send(request: web.Request) -> web.Response:
        got.append(len(await request_body(request)))
        return web.json_response({"ok": True})

    app = guarded_app(guard, [error_middleware(classify), sec.middleware])
    app.router.add_post("/v1/send", send)
    runner, site = await start_server(app, guard, HOST, 0)
    e = Edge(guard, f"{HOST}:{site.bound_port}")
    e.bodies = got
    try:
        yield e
    finally:
        await runner.cleanup()


async def exchange(addr: str, head: list[str], body: bytes) -> tuple[int, dict[str, str], bytes]:
    """Write a head and (part of) a body; read one answer: (status, headers, body)."""
    host, _, port = addr.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        await writer.drain()
        async with asyncio.timeout(10.0):
            status_line = await reader.readline()
            headers: dict[str, str] = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                k, _, v = line.decode().partition(":")
                headers[k.strip().lower()] = v.strip()
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
        return int(status_line.split()[1]), headers, raw
    finally:
        writer.close()


async def test_an_unsigned_request_is_refused_before_its_body_is_read(edge: Edge) -> None:
    """8 MiB announced, 1 MiB sent, unsigned or signed for another server: answered 401 at once
    from the head, the connection closed, nothing of the body reserved or read. (Before: the body
    was reserved and read first, and the answer waited for the whole body or the body timeout.)"""
    head = ["POST /v1/send HTTP/1.1", f"Host: {edge.addr}", "Content-Type: application/x-msgpack",
            f"Content-Length: {8 << 20}"]
    status, headers, raw = await exchange(edge.addr, head, b"\0" * (1 << 20))
    assert (status, json.loads(raw)["code"]) == (401, "NO_CREDENTIALS")
    assert headers.get("connection", "").lower() == "close"
    assert edge.guard.body_bytes_reserved == 0 and edge.bodies == []
    body = b"\0" * (8 << 20)
    other = auth.authorization(ADMIN, "POST", "/v1/send", body, int(time.time() * 1000),
                               scope=auth.broker_scope("C", "RaftNode00", "n1"))
    status, headers, raw = await exchange(edge.addr, [*head, f"Authorization: {other}"], body[: 1 << 20])
    answer = json.loads(raw)
    assert (status, answer["code"], answer["scope"], headers["dledger-scope"]) == (401, "WRONG_SCOPE", SCOPE, SCOPE)
    assert edge.guard.body_bytes_reserved == 0 and edge.bodies == []
    # signed for this server: the body is read (and must be the one signed)
    good = auth.authorization(ADMIN, "POST", "/v1/send", body, int(time.time() * 1000), scope=SCOPE)
    status, _h, raw = await exchange(edge.addr, [*head, f"Authorization: {good}"], body)
    assert status == 200 and edge.bodies == [8 << 20]
    good = auth.authorization(ADMIN, "POST", "/v1/send", body, int(time.time() * 1000), scope=SCOPE)
    status, _h, raw = await exchange(edge.addr, [*head, f"Authorization: {good}"], b"\1" + body[1:])
    assert (status, json.loads(raw)["code"]) == (401, "BODY_DIGEST_MISMATCH")
    assert edge.bodies == [8 << 20]


async def test_an_expectation_aiohttp_does_not_serve_is_a_coded_json_error(edge: Edge) -> None:
    """aiohttp answers ``Expect`` itself, before any middleware: it was a plain-text 417."""
    head = ["POST /v1/send HTTP/1.1", f"Host: {edge.addr}", "Expect: 200-ok", "Content-Length: 2"]
    status, headers, raw = await exchange(edge.addr, head, b"{}")
    assert status == 417 and headers["content-type"].startswith("application/json")
    answer = json.loads(raw)
    assert answer["code"] == "EXPECTATION_FAILED" and answer["message"]
    assert headers["dledger-scope"] == SCOPE


async def test_half_open_connections_cannot_lock_signed_clients_out(tmp_path: Any) -> None:
    """The slots of the HTTP port: connections that have not sent a complete request head may hold
    3/4 of them; a new connection closes the oldest such one. Before, eight silent connections held
    all eight slots and a signed client's connection was closed at once."""
    from broker.client.transport import Transport

    async for e in serve_edge(tmp_path, Limits(connections_max=8, header_timeout_s=60.0)):
        host, _, port = e.addr.rpartition(":")
        silent = [await asyncio.open_connection(host, int(port)) for _ in range(8)]
        t = Transport(credentials=ADMIN, tls=None, protocol="http")
        try:
            answer = await t.call(e.addr, "POST", "/v1/send", {"n": 1})
            assert answer == {"ok": True} and e.bodies
            assert e.guard.stats()["evicted_connections"] >= 2 and e.guard.stats()["unproven"] <= 6
            more = [await asyncio.open_connection(host, int(port)) for _ in range(8)]  # the flood goes on
            silent += more
            assert await t.call(e.addr, "POST", "/v1/send", {"n": 2}) == {"ok": True}  # its kept-alive connection
        finally:
            await t.close()
            for _r, w in silent:
                w.close()
