"""The one error middleware and integer-parameter parser every HTTP server uses
(``broker.serving.http_edge.error_middleware`` / ``query_int``: the broker, the NameServer, dledger-node)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from broker.protocol.errors import ProtocolError
from broker.serving.http_edge import ErrorAnswer, coded_answer, error_middleware, query_int


class _Mine(Exception):
    pass


def _classify(exc: Exception) -> ErrorAnswer | None:
    return ErrorAnswer(409, "MINE", str(exc), {"hint": 1}) if isinstance(exc, _Mine) else None


async def _client() -> TestClient[Any, Any]:
    async def number(request: web.Request) -> web.Response:
        return web.json_response({"n": query_int(request, "n", None, -5, 1000)})

    async def mine(request: web.Request) -> web.Response:
        raise _Mine("refused")

    async def bug(request: web.Request) -> web.Response:
        raise KeyError("secret detail")

    app = web.Application(middlewares=[error_middleware(_classify)])
    app.router.add_get("/n", number)
    app.router.add_get("/mine", mine)
    app.router.add_get("/bug", bug)
    client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    return client


@pytest.mark.parametrize(
    ("query", "status", "code"),
    [
        ("n=7", 200, None),
        ("n=-5", 200, None),
        ("", 400, "MISSING_FIELD"),
        ("n=x", 400, "BAD_PARAMETER"),
        ("n=1001", 400, "BAD_PARAMETER"),
        ("n=-6", 400, "BAD_PARAMETER"),
        ("n=+7", 400, "BAD_PARAMETER"),  # int() would take these three; a parameter is plain digits
        ("n=%207", 400, "BAD_PARAMETER"),
        ("n=1_0", 400, "BAD_PARAMETER"),
        ("n=" + "9" * 5000, 400, "BAD_PARAMETER"),  # never converted: bounded before int()
    ],
)
async def test_query_int_answers_a_coded_400_for_anything_but_a_bounded_integer(
    query: str, status: int, code: str | None
) -> None:
    client = await _client()
    try:
        r = await client.get("/n?" + query)
        body = await r.json()
        assert r.status == status, body
        if code is None:
            assert body == {"n": int(query.split("=")[1])}
        else:
            assert body["code"] == code and body["message"]
    finally:
        await client.close()


async def test_errors_are_classified_mapped_or_logged_as_a_500_without_details() -> None:
    client = await _client()
    try:
        r = await client.get("/mine")
        assert (r.status, await r.json()) == (409, {"code": "MINE", "message": "refused", "hint": 1})
        r = await client.get("/nope")
        body = await r.json()
        assert (r.status, body["code"]) == (404, "NOT_FOUND")
        r = await client.post("/n")
        assert (r.status, (await r.json())["code"]) == (405, "METHOD_NOT_ALLOWED")
        r = await client.get("/bug")
        body = await r.json()
        assert (r.status, body["code"]) == (500, "INTERNAL") and "secret" not in body["message"]
    finally:
        await client.close()


def test_the_coded_error_carries_its_answer() -> None:
    exc = ProtocolError("BAD_PARAMETER", "n must be ...", 400, field="n")
    assert exc.body() == {"code": "BAD_PARAMETER", "message": "n must be ...", "field": "n"}
    answer = coded_answer(exc)
    assert answer is not None and (answer.status, answer.body()) == (400, exc.body())
    assert coded_answer(ProtocolError("NOT_FOUND", "no status given")) is None  # the server's classify maps it
