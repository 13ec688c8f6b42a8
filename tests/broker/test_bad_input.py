"""Issue 10, findings 3, 6 and 8 at the HTTP ports: each input that used to answer 500, hang, leak
memory or log a traceback now gets a 4xx with ``{code, message}`` and nothing worse.

A broker group and a NameServer run in-process with short edge timeouts; raw sockets send what no
SDK would.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.client.transport import Transport
from namesrv.server import NamesrvService
from tests.broker.harness import BrokerCluster
from tests.dledger.harness import wait_until

EDGE = {
    "serverHeaderTimeoutMs": 400,
    "serverIdleTimeoutMs": 2000,
    "serverBodyTimeoutMs": 400,
    "serverConnectionsMax": 40,
    "serverBodyBytesInFlightMax": 1 << 20,
}


@pytest.fixture
async def cluster(tmp_path: Any) -> AsyncIterator[BrokerCluster]:
    c = BrokerCluster(str(tmp_path), **EDGE)
    ns = c.namesrvs[0]
    ns.cfg = dataclasses.replace(ns.cfg, header_timeout_ms=400, body_timeout_ms=400, idle_timeout_ms=2000)
    ns.service = NamesrvService(ns.cfg)
    await c.start()
    t = Transport(timeout_s=5.0, credentials=None, tls=None)
    leader = c.writable_leader()
    assert leader is not None
    await t.call(leader.cfg.address, "POST", "/v1/topics", {"topic": "T", "read_queue_nums": 2, "write_queue_nums": 2})
    await t.close()
    try:
        yield c
    finally:
        await c.stop()


async def exchange(addr: str, data: bytes, *, read_timeout_s: float = 5.0) -> list[tuple[int, dict[str, Any]]]:
    """Send raw bytes; read every answer until the server closes the connection."""
    host, _, port = addr.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    answers = []
    try:
        writer.write(data)
        await writer.drain()
        while True:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), read_timeout_s)
            except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
                break
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            answers.append((int(lines[0].split()[1]), json.loads(body) if body else {}))
            if headers.get("connection", "").lower() == "close":
                break
    finally:
        writer.close()
    return answers


def post(path: str, body: bytes, ctype: str = "application/json", extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def assert_coded(answers: list[tuple[int, dict[str, Any]]], status: int, code: str | None = None) -> None:
    assert answers, "no answer"
    st, body = answers[0]
    assert st == status and isinstance(body.get("code"), str) and isinstance(body.get("message"), str), answers
    if code is not None:
        assert body["code"] == code, answers


async def test_fuzz_findings_answer_4xx_with_a_code(cluster: BrokerCluster, caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)
    leader = cluster.writable_leader()
    assert leader is not None
    b, ns = leader.cfg.address, cluster.namesrvs[0].addr
    # a unicode superscript digit as a queue id (str.isdigit() accepts it, int() raises)
    for path, body in (("/v1/offsets", {"group": "g", "topic": "T", "offsets": {"²": 1}}),
                       ("/v1/offsets/reset", {"group": "g", "topic": "T", "offsets": {"²": 1}})):
        assert_coded(await exchange(b, post(path, json.dumps(body).encode())), 400, "INVALID_QUEUE_ID")
    # a lone surrogate in a pull's tag filter
    raw = b'{"topic": "T", "queue_id": 0, "offset": 0, "tags": "\\ud800"}'
    assert_coded(await exchange(b, post("/v1/pull", raw)), 400, "INVALID_TAGS")
    # an invalid gzip body, on the broker and the NameServer (which echoed zlib's exception text)
    for addr, path in ((b, "/v1/topics"), (ns, "/v1/brokers/register"), (b, "/v1/send")):
        assert_coded(await exchange(addr, post(path, b"not gzip at all", extra="Content-Encoding: gzip\r\n")),
                     415, "UNSUPPORTED_CONTENT_ENCODING")
        bomb = gzip.compress(b"{" * 1000)
        assert_coded(await exchange(addr, post(path, bomb, extra="Content-Encoding: gzip\r\n")), 415)
    # finding 3 at the API: a topic with a trailing newline
    assert_coded(await exchange(b, post("/v1/topics", json.dumps({"topic": "Evil\n"}).encode())), 400,
                 "INVALID_TOPIC")
    # the HTTP parser's own errors: JSON with a code, on both ports
    for addr in (b, ns):
        for garbage in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),
                        b"GET / HTTP/1.1\r\nHost: x\r\nBroken header line\r\n\r\n",
                        b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                        b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(100)) + b"\r\n",
                        b"POST /v1/pull HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
                        b"POST /v1/pull HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"):
            answers = await exchange(addr, garbage)
            assert answers and 400 <= answers[0][0] < 500, (addr, garbage[:40], answers)
            assert isinstance(answers[0][1].get("code"), str), (garbage[:40], answers)
    # a body after CONNECT is not parsed as a second request
    smuggled = b"CONNECT x:443 HTTP/1.1\r\nHost: x\r\n\r\nDELETE /v1/topics/T HTTP/1.1\r\nHost: x\r\n\r\n"
    answers = await exchange(b, smuggled)
    assert len(answers) == 1 and answers[0][0] == 405, answers
    t = Transport(timeout_s=5.0, credentials=None, tls=None)
    assert (await t.call(b, "GET", "/v1/topics/T"))["topic"] == "T"  # not deleted
    # a client that leaves mid-body: no error logged
    host, _, port = b.rpartition(":")
    _r, w = await asyncio.open_connection(host, int(port))
    w.write(post("/v1/topics", b'{"topic": "T9"}')[:-5])
    await w.drain()
    w.close()
    await t.call(b, "GET", "/v1/status")
    await t.close()
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or (r.exc_info and r.levelno >= logging.WARNING)]
    assert not bad, [(r.name, r.getMessage()) for r in bad]


async def open_idle(addr: str, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, _, port = addr.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    await writer.drain()
    return reader, writer


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), 10)


async def test_slowloris_slow_bodies_and_the_connection_cap(cluster: BrokerCluster) -> None:
    leader = cluster.writable_leader()
    assert leader is not None
    b = leader.cfg.address
    # half a request head, then nothing: closed after serverHeaderTimeoutMs
    slow = [await open_idle(b, b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Slow: ") for _ in range(10)]
    for reader, writer in slow:
        assert await closed_by_server(reader) == b""
        writer.close()
    # a body that never finishes: 408 within serverBodyTimeoutMs, then the connection closes
    reader, writer = await open_idle(b, post("/v1/topics", b'{"topic": "T7"}')[:-3])
    answer = await closed_by_server(reader)
    assert b" 408 " in answer.split(b"\r\n")[0] and b"REQUEST_TIMEOUT" in answer
    writer.close()
    # bodies in flight are bounded all together: a second big unfinished body gets 503 BUSY
    big = b"x" * 700_000
    _r1, w1 = await open_idle(b, post("/v1/send", big, "application/x-msgpack")[:-1000])

    async def second_is_busy() -> bool:
        answers = await exchange(b, post("/v1/send", big, "application/x-msgpack"))
        return bool(answers) and answers[0][0] == 503 and answers[0][1]["code"] == "BUSY"

    await wait_until(second_is_busy, 5, "a second large body refused while the first is in flight")
    w1.close()
    async def status_ok() -> bool:
        try:
            answers = await exchange(b, b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n", read_timeout_s=2)
        except OSError:
            return False
        return bool(answers) and answers[0][0] == 200

    # 40 silent connections (the cap): they may hold 3/4 of the slots, so a client that sends a
    # request closes the oldest of them and is served (issue 23: before, it was closed at once)
    conns = [await open_idle(b, b"") for _ in range(40)]
    assert await status_ok()
    assert leader.guard.evicted_connections >= 10 and len(leader.guard.unproven) <= 30
    for _r, w in conns:
        w.close()
    # the connection cap itself: 40 connections that each sent a request hold every slot; the 41st
    # is closed at once, and once the others go it works again
    await wait_until(lambda: leader.guard.connections == 0, 10, "the silent connections gone")
    conns = [await open_idle(b, b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n") for _ in range(40)]
    await wait_until(lambda: leader.guard.connections == 40 and not leader.guard.unproven, 10,
                     "40 connections that sent a request")
    assert not await status_ok()
    for _r, w in conns:
        w.close()
    await wait_until(status_ok, 10, "a connection accepted once the others closed")
    st = await Transport(timeout_s=5.0, credentials=None, tls=None).call(b, "GET", "/v1/status")
    edge = st["security"]["edge"]
    assert edge["timed_out_connections"] >= 10 and edge["refused_connections"] >= 1 and edge["busy_refusals"] >= 1


async def test_heartbeats_cannot_grow_the_broker_without_bound(cluster: BrokerCluster) -> None:
    leader = cluster.writable_leader()
    assert leader is not None
    t = Transport(timeout_s=10.0, credentials=None, tls=None)
    # 64 groups x 1024 topics from one client id: ~10 MiB of state each before, refused now
    groups = [{"group": f"g{i}", "topics": [f"t{j}" for j in range(1024)]} for i in range(64)]
    with pytest.raises(Exception) as e:
        await t.call(leader.cfg.address, "POST", "/v1/heartbeat", {"client_id": "c", "groups": groups})
    assert getattr(e.value, "code", "") == "TOO_MANY_SUBSCRIPTIONS"
    ok = await t.call(leader.cfg.address, "POST", "/v1/heartbeat",
                      {"client_id": "c", "groups": [{"group": "g", "topics": ["T"]}]})
    assert ok == {"ok": True}
    await t.close()
