"""The binary protocol (issue 13): the frame codec, the broker's listener and the SDK's multiplexer,
in-process with a stand-in dispatcher (the broker's own ops are driven in tests/broker/client/)."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.client.remoting import RemotingConnection
from broker.client.signer import Signer
from broker.client.transport import ClientError
from broker.edge.binary import Call, RemotingLimits, RemotingServer
from broker.protocol import auth
from broker.protocol.errors import ProtocolError
from broker.protocol.frames import (
    FLAG_ERROR,
    FLAG_RESPONSE,
    HEADER,
    Frame,
    FrameDecoder,
    FrameError,
    Op,
    encode,
    pack_body,
)
from broker.serving.http_edge import Guard, Limits
from broker.serving.security import Security
from tests.acl_fixtures import ADMIN, CONSUMER, PRODUCER, STRANGER, write_acl
from tests.dledger.harness import wait_until

HOST = "127.0.0.1"


# -- the codec --------------------------------------------------------------------------------------
frames_st = st.builds(
    Frame,
    flags=st.sampled_from([0, FLAG_RESPONSE, FLAG_RESPONSE | FLAG_ERROR]),
    op=st.integers(0, 0xFFFF),
    request_id=st.integers(0, 2**32 - 1),
    auth=st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=200),
    body=st.binary(max_size=3000),
)


@settings(max_examples=200, deadline=None)
@given(frames=st.lists(frames_st, max_size=8), cuts=st.lists(st.integers(1, 500), max_size=30))
def test_frames_round_trip_in_any_chunking(frames: list[Frame], cuts: list[int]) -> None:
    stream = b"".join(encode(f.op, f.request_id, f.body, flags=f.flags, auth=f.auth) for f in frames)
    dec = FrameDecoder(1 << 20)
    out: list[Frame] = []
    pos = 0
    for n in [*cuts, len(stream)]:
        dec.feed(stream[pos:pos + n])
        pos += n
        while (frame := dec.next()) is not None:
            out.append(frame)
    assert out == frames
    assert dec.buffered == 0


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400))
def test_garbage_never_crashes_the_decoder(data: bytes) -> None:
    dec = FrameDecoder(4096)
    dec.feed(data)
    try:
        while dec.next() is not None:
            pass
    except FrameError as exc:
        assert exc.code in ("BAD_FRAME", "FRAME_TOO_LARGE", "BAD_VERSION")


@settings(max_examples=100, deadline=None)
@given(frame=frames_st, keep=st.integers(0, 100))
def test_a_truncated_frame_is_never_delivered(frame: Frame, keep: int) -> None:
    raw = encode(frame.op, frame.request_id, frame.body, flags=frame.flags, auth=frame.auth)
    dec = FrameDecoder(1 << 20)
    dec.feed(raw[: min(keep, len(raw) - 1)])
    assert dec.next() is None


def test_bad_headers_are_named() -> None:
    def first_error(raw: bytes, cap: int = 1024) -> str:
        dec = FrameDecoder(cap)
        dec.feed(raw)
        with pytest.raises(FrameError) as e:
            dec.next()
        return e.value.code

    assert first_error(struct.pack(">I", 5000)) == "FRAME_TOO_LARGE"  # refused from the length alone
    assert first_error(struct.pack(">I", 3) + b"\0" * 20) == "BAD_FRAME"
    assert first_error(HEADER.pack(10, 9, 0, 1, 1, 0)) == "BAD_VERSION"
    assert first_error(HEADER.pack(10, 1, 0x80, 1, 1, 0)) == "BAD_FRAME"
    assert first_error(HEADER.pack(12, 1, 0, 1, 1, 5) + b"ab") == "BAD_FRAME"  # auth longer than the frame
    assert first_error(HEADER.pack(12, 1, 0, 1, 1, 2) + b"\xff\xfe") == "BAD_FRAME"  # not ASCII


# -- listener and multiplexer --------------------------------------------------------------------------
class Gate:
    """A dispatcher that parks every SEND until released, to control the order of answers."""

    def __init__(self) -> None:
        self.entered: list[int] = []
        self.release: dict[int, asyncio.Event] = {}
        self.principals: list[str] = []

    async def __call__(self, call: Call) -> dict[str, Any]:
        self.principals.append(call.principal.name)
        n = int(call.body.get("n", 0))
        if call.body.get("fail"):
            raise ProtocolError("NOT_LEADER", "not me", 409, leader_addr="10.0.0.1:1")
        if call.body.get("crash"):
            raise RuntimeError("boom")
        if call.body.get("no_status"):  # the NameServer's kind (its classes give the status): a bug here
            raise ProtocolError("NO_STATUS", "a coded error without a status")
        self.entered.append(n)
        if call.body.get("park"):
            ev = self.release.setdefault(n, asyncio.Event())
            await ev.wait()
        return {"n": n, "echo": call.body.get("payload")}

    def open(self, n: int) -> None:
        self.release.setdefault(n, asyncio.Event()).set()


Serve = Callable[..., Awaitable[tuple[RemotingServer, str]]]


@pytest.fixture
async def serve() -> Any:
    servers: list[RemotingServer] = []

    async def start(dispatch: Any, *, security: Security | None = None, tls: Any = None,
                    **limits: Any) -> tuple[RemotingServer, str]:
        server = RemotingServer(dispatch, security=security, limits=RemotingLimits(**limits))
        port = await server.start(HOST, 0, tls)
        servers.append(server)
        return server, f"{HOST}:{port}"

    yield start
    for s in servers:
        await s.stop()


SCOPE = auth.broker_scope("C", "G", "n0")  # the listener's under test (its Security's)


def client(addr: str, credentials: auth.Credentials | None = None, **kwargs: Any) -> RemotingConnection:
    return RemotingConnection(addr, error=ClientError, signer=Signer(credentials), **kwargs)


async def test_many_requests_on_one_connection_answered_out_of_order(serve: Serve) -> None:
    gate = Gate()
    server, addr = await serve(gate)
    conn = client(addr)
    try:
        calls = [asyncio.create_task(conn.call(Op.SEND, {"n": i, "park": True, "payload": b"x" * i}, 10.0))
                 for i in range(20)]
        await wait_until(lambda: len(gate.entered) == 20, 10.0, "the expected state")
        assert conn.in_flight == 20 and conn.connects == 1 and server.stats.connections == 1
        for i in reversed(range(20)):  # the last request is answered first
            gate.open(i)
            answer = await calls[i]
            assert answer == {"n": i, "echo": b"x" * i}
            assert all(not c.done() for c in calls[:i])
    finally:
        await conn.close()


async def test_errors_arrive_as_client_errors_with_status_and_leader(serve: Serve) -> None:
    _server, addr = await serve(Gate())
    conn = client(addr)
    try:
        with pytest.raises(ClientError) as e:
            await conn.call(Op.SEND, {"fail": True}, 5.0)
        assert (e.value.code, e.value.status, e.value.leader_addr) == ("NOT_LEADER", 409, "10.0.0.1:1")
        assert not e.value.outcome_unknown and e.value.retryable
        assert e.value.answer == {"code": "NOT_LEADER", "message": "not me", "status": 409, "leader_addr": "10.0.0.1:1"}
        for bug in ("crash", "no_status"):
            with pytest.raises(ClientError) as e:
                await conn.call(Op.SEND, {bug: True}, 5.0)
            assert (e.value.code, e.value.status) == ("INTERNAL", 500)
        with pytest.raises(ClientError) as e:
            await conn.call(999, {}, 5.0)
        assert e.value.code == "UNKNOWN_OP"
        assert await conn.call(Op.PING, None, 5.0) == {}  # the connection survived every error answer
        assert conn.connects == 1
    finally:
        await conn.close()


async def test_a_timed_out_call_is_forgotten_and_the_connection_lives_on(serve: Serve) -> None:
    gate = Gate()
    _server, addr = await serve(gate)
    conn = client(addr)
    try:
        with pytest.raises(ClientError) as e:
            await conn.call(Op.SEND, {"n": 1, "park": True}, 0.2)
        assert e.value.code == "TIMEOUT" and e.value.outcome_unknown
        assert conn.in_flight == 0
        gate.open(1)  # its late answer arrives and is dropped
        assert await conn.call(Op.SEND, {"n": 2}, 5.0) == {"n": 2, "echo": None}
        assert conn.connects == 1
    finally:
        await conn.close()


async def test_in_flight_cap_stops_reading_until_answers_go_out(serve: Serve) -> None:
    gate = Gate()
    server, addr = await serve(gate, in_flight_max=3)
    conn = client(addr)
    try:
        calls = [asyncio.create_task(conn.call(Op.SEND, {"n": i, "park": True}, 20.0)) for i in range(10)]
        await wait_until(lambda: len(gate.entered) == 3, 10.0, "the expected state")
        # reading paused at the cap: the other 7 requests stay in the socket, none can start
        await wait_until(lambda: server.stats.paused >= 1, 10.0, "reading paused at the cap")
        assert len(gate.entered) == 3
        for i in range(10):
            await wait_until(lambda i=i: i in gate.entered, 10.0, "the expected state")
            assert len(gate.entered) - i <= 3  # never more than 3 handled at once
            gate.open(i)
            assert (await calls[i])["n"] == i
    finally:
        await conn.close()


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass


async def raw_exchange(addr: str, data: bytes) -> tuple[list[Frame], bool]:
    """Write ``data``, read until the broker closes: the frames it answered, and whether it closed."""
    host, _, port = addr.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    await writer.drain()
    got = b""
    try:
        async with asyncio.timeout(10.0):
            while chunk := await reader.read(65536):
                got += chunk
        closed = True
    except TimeoutError:
        closed = False
    await close_writer(writer)
    dec = FrameDecoder()
    dec.feed(got)
    frames = []
    while (f := dec.next()) is not None:
        frames.append(f)
    return frames, closed


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (struct.pack(">I", 1 << 30), "FRAME_TOO_LARGE"),
        (HEADER.pack(10, 7, 0, 1, 1, 0), "BAD_VERSION"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "FRAME_TOO_LARGE"),  # "GET " read as a length
        (encode(Op.PING, 5, b"", flags=FLAG_RESPONSE), "BAD_FRAME"),  # a client sends requests only
    ],
)
async def test_bad_frames_get_an_error_frame_then_the_connection_closes(serve: Serve, data: bytes, code: str) -> None:
    server, addr = await serve(Gate(), frame_bytes_max=1 << 16)
    frames, closed = await raw_exchange(addr, encode(Op.PING, 1, b"") + data)
    assert closed
    assert [f.request_id for f in frames] == [1, 0]  # the good frame before it was answered
    err = msgpack.unpackb(frames[1].body)
    assert frames[1].is_error and err["code"] == code and err["message"]
    assert server.stats.bad_frames == 1
    await wait_until(lambda: server.stats.connections == 0, 10.0, "the expected state")


async def test_bad_msgpack_body_is_an_error_answer_not_a_closed_connection(serve: Serve) -> None:
    _server, addr = await serve(Gate())
    host, _, port = addr.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(encode(Op.SEND, 7, b"\xc1") + encode(Op.SEND, 8, pack_body([1, 2])) + encode(Op.PING, 9, b""))
        dec = FrameDecoder()
        got: list[Frame] = []
        async with asyncio.timeout(10.0):
            while len(got) < 3:
                dec.feed(await reader.read(65536))
                while (f := dec.next()) is not None:
                    got.append(f)
        by_id = {f.request_id: f for f in got}
        assert msgpack.unpackb(by_id[7].body)["code"] == "BAD_MSGPACK"
        assert msgpack.unpackb(by_id[8].body)["code"] == "BAD_REQUEST"
        assert not by_id[9].is_error
    finally:
        await close_writer(writer)


async def test_silent_and_stalled_connections_are_closed(serve: Serve) -> None:
    server, addr = await serve(Gate(), handshake_timeout_s=0.3, frame_timeout_s=0.3, idle_timeout_s=0.5)
    frames, closed = await raw_exchange(addr, b"")  # never sends a frame
    assert closed and frames == []
    frames, closed = await raw_exchange(addr, encode(Op.PING, 1, b"")[:9])  # half a frame, then nothing
    assert closed and frames == []
    frames, closed = await raw_exchange(addr, encode(Op.PING, 1, b""))  # answered, then idle
    assert closed and [f.request_id for f in frames] == [1]
    assert server.stats.timed_out_connections >= 2


async def test_the_client_reconnects_after_the_broker_drops_it(serve: Serve) -> None:
    gate = Gate()
    server, addr = await serve(gate)
    conn = client(addr)
    try:
        parked = asyncio.create_task(conn.call(Op.SEND, {"n": 1, "park": True}, 10.0))
        await wait_until(lambda: gate.entered == [1], 10.0, "the expected state")
        for c in list(server.connections):
            c.close()
        with pytest.raises(ClientError) as e:
            await parked
        assert e.value.code == "CONNECTION_LOST" and e.value.outcome_unknown
        assert await conn.call(Op.SEND, {"n": 2}, 5.0) == {"n": 2, "echo": None}
        assert conn.connects == 2
    finally:
        await conn.close()


async def test_connect_failure_is_connect_failed() -> None:
    from tests.dledger.harness import free_ports

    conn = client(f"{HOST}:{free_ports(1)[0]}")
    with pytest.raises(ClientError) as e:
        await conn.call(Op.PING, None, 5.0)
    assert e.value.code == "CONNECT_FAILED" and not e.value.outcome_unknown


# -- ACL: every frame signed, verified like an HTTP request ---------------------------------------------
@pytest.fixture
def security(tmp_path: Any) -> Security:
    acl = write_acl(os.path.join(str(tmp_path), "plain_acl.yml"))
    guard = Guard(Limits(), lambda code, message: {"code": code, "message": message})
    return Security(acl, lambda: int(time.time() * 1000), guard, scope=SCOPE)


async def test_acl_refuses_unsigned_wrongly_signed_and_replayed_frames(serve: Serve, security: Security) -> None:
    gate = Gate()
    server, addr = await serve(gate, security=security)
    host, _, port = addr.rpartition(":")
    signed = client(addr, credentials=PRODUCER)
    unsigned = client(addr)
    stranger = client(addr, credentials=STRANGER)
    try:
        assert (await signed.call(Op.SEND, {"n": 1}, 5.0))["n"] == 1
        assert gate.principals == [PRODUCER.access_key]
        for conn, code in ((unsigned, "NO_CREDENTIALS"), (stranger, "SIGNATURE_INVALID")):
            with pytest.raises(ClientError) as e:
                await conn.call(Op.SEND, {"n": 2}, 5.0)
            assert (e.value.code, e.value.status) == (code, 401)
        # A signature over another body, or another op, does not verify.
        body = pack_body({"n": 3})
        sig = auth.authorization(ADMIN, "REMOTING", "SEND", body, int(time.time() * 1000), scope=SCOPE)
        tampered = encode(Op.SEND, 1, pack_body({"n": 4}), auth=sig)
        other_op = encode(Op.PULL, 2, body, auth=sig)
        # The same signed frame twice: the second is a replay.
        sig2 = auth.authorization(ADMIN, "REMOTING", "SEND", body, int(time.time() * 1000), scope=SCOPE)
        first = encode(Op.SEND, 3, body, auth=sig2)
        replay = encode(Op.SEND, 4, body, auth=sig2)
        stale_sig = auth.authorization(ADMIN, "REMOTING", "SEND", body, int(time.time() * 1000) - 600_000,
                                       scope=SCOPE)
        stale = encode(Op.SEND, 5, body, auth=stale_sig)  # signed 10 minutes ago: outside the ±5 min window
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(tampered + other_op + first + replay + stale)
        dec = FrameDecoder()
        got: dict[int, Frame] = {}
        async with asyncio.timeout(10.0):
            while len(got) < 5:
                dec.feed(await reader.read(65536))
                while (f := dec.next()) is not None:
                    got[f.request_id] = f
        await close_writer(writer)
        codes = {rid: msgpack.unpackb(f.body).get("code") if f.is_error else "OK" for rid, f in got.items()}
        assert codes == {1: "BODY_DIGEST_MISMATCH", 2: "SIGNATURE_INVALID", 3: "OK", 4: "REPLAYED_REQUEST",
                         5: "TIMESTAMP_OUT_OF_WINDOW"}
        assert gate.entered == [1, 3]  # refused frames never reached the dispatcher
        # the two signing clients' first frames were refused WRONG_SCOPE (then signed for SCOPE)
        assert server.stats.auth_refused == 8
    finally:
        for c in (signed, unsigned, stranger):
            await c.close()


async def test_an_idle_connection_is_replaced_before_use(serve: Serve) -> None:
    _server, addr = await serve(Gate())
    conn = client(addr)
    try:
        assert await conn.call(Op.PING, None, 5.0) == {}
        assert await conn.call(Op.PING, None, 5.0) == {}
        assert conn.connects == 1
        conn.idle_s = 0.0  # every connection now counts as idle between calls
        assert await conn.call(Op.PING, None, 5.0) == {}
        assert conn.connects == 2
    finally:
        await conn.close()


async def test_tls_when_the_broker_serves_tls(serve: Serve, tmp_path: Any) -> None:
    from broker.client.transport import client_ssl_context
    from broker.serving.certs import make_certs
    from broker.serving.http_edge import server_ssl_context

    paths = make_certs(str(tmp_path / "tls"), ["localhost"], ["127.0.0.1"])
    _server, addr = await serve(Gate(), tls=server_ssl_context(paths["server.pem"], paths["server.key"]),
                                handshake_timeout_s=1.0)
    trusted = client(addr, ssl_context=client_ssl_context(paths["ca.pem"]))
    plain = client(addr)
    other = make_certs(str(tmp_path / "other"), ["localhost"], ["127.0.0.1"])
    stranger = client(addr, ssl_context=client_ssl_context(other["ca.pem"]))
    try:
        assert await trusted.call(Op.SEND, {"n": 1}, 5.0) == {"n": 1, "echo": None}
        with pytest.raises(ClientError) as e:
            await plain.call(Op.PING, None, 5.0)
        assert e.value.code in ("CONNECTION_LOST", "TIMEOUT")
        with pytest.raises(ClientError) as e:
            await stranger.call(Op.PING, None, 5.0)
        assert e.value.code == "TLS_FAILED"
    finally:
        for c in (trusted, plain, stranger):
            await c.close()


async def test_random_bytes_never_take_the_listener_down(serve: Serve) -> None:
    import random

    rng = random.Random(1313)
    server, addr = await serve(Gate(), frame_bytes_max=1 << 16, handshake_timeout_s=0.5, frame_timeout_s=0.5)
    for i in range(30):
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
        if i % 3 == 0:  # a well-formed frame first, then junk: the frame is still answered
            junk = encode(Op.PING, 77, b"") + junk
        frames, closed = await raw_exchange(addr, junk)
        assert closed
        assert all(f.request_id in (0, 77) for f in frames)
        assert all(msgpack.unpackb(f.body).get("code") for f in frames if f.is_error)
    conn = client(addr)
    try:
        assert await conn.call(Op.PING, None, 5.0) == {}
    finally:
        await conn.close()
    await wait_until(lambda: server.stats.connections == 0, 10.0, "every junk connection closed")


def test_routes_carry_the_remoting_addresses_registered() -> None:
    from broker.client.transport import Transport
    from broker.protocol import route_wire
    from broker.protocol.routes import BrokerRegistration, TopicConfig
    from namesrv.route_table import InvalidRecordError, RouteTable

    table = RouteTable()

    def reg(addr: str, bid: int, role: Any, remoting: str | None) -> BrokerRegistration:
        return BrokerRegistration("C", "G", bid, addr, role, 1, (TopicConfig("T"),), data_version=1,
                                  remoting_address=remoting)

    table.register(reg("h:1", 0, "LEADER", "h:2"), 0)
    table.register(reg("h:11", 1, "FOLLOWER", None), 0)  # an older broker: HTTP only
    wire = route_wire.topic_route_to_dict(table.topic_route("T"))  # type: ignore[arg-type]
    assert wire["broker_datas"][0]["remoting_addrs"] == {"0": "h:2"}
    route = route_wire.topic_route_from_dict(wire)
    t = Transport()
    t.learn_route(route)
    assert (t.remoting_addr("h:1"), t.remoting_addr("h:11")) == ("h:2", None)
    assert Transport(protocol="http").remoting_addr("h:1") is None
    table.register(dataclasses.replace(reg("h:1", 0, "LEADER", None), data_version=2), 0)  # turned off
    t.learn_route(route_wire.topic_route_from_dict(route_wire.topic_route_to_dict(table.topic_route("T"))))  # type: ignore[arg-type]
    assert t.remoting_addr("h:1") is None
    # a registration's remoting address round-trips and is validated like the address
    body = route_wire.registration_to_dict(reg("h:1", 0, "LEADER", "h:2"))
    assert route_wire.registration_from_dict(body).remoting_address == "h:2"
    assert "remoting_address" not in route_wire.registration_to_dict(reg("h:1", 0, "LEADER", None))
    with pytest.raises(InvalidRecordError):
        table.register(reg("h:1", 0, "LEADER", "no-port"), 0)


def test_remoting_port_config() -> None:
    from broker.server.config import parse_broker_config
    from dledger.config import ConfigError
    from tests.broker.test_config import BASE

    def parse(**changes: str) -> Any:
        return parse_broker_config({**BASE, **changes}, source="<t>", env={})

    cfg = parse(listenPort="10911")
    assert (cfg.remoting_listen_port, cfg.remoting_in_flight_max) == (10912, 256)  # listenPort + 1
    assert cfg.remoting_address(10912) == f"{cfg.dledger.http_host}:10912"
    assert parse(listenPort="10911", remotingListenPort="-1").remoting_address(10912) is None  # off
    assert parse(listenPort="10911", remotingListenPort="0").remoting_address(40001).endswith(":40001")
    # behind a proxy for the HTTP port: not advertised unless its own advertised port is set
    proxied = parse(listenPort="10911", brokerAdvertisedPort="20911")
    assert proxied.remoting_address(10912) is None
    assert parse(listenPort="10911", brokerAdvertisedPort="20911",
                 remotingAdvertisedPort="20912").remoting_address(10912).endswith(":20912")
    for key, bad in (("remotingListenPort", "-2"), ("remotingListenPort", "70000"), ("remotingInFlightMax", "0"),
                     ("remotingAdvertisedPort", "0")):
        with pytest.raises(ConfigError):
            parse(**{key: bad})


def test_listener_and_client_under_uvloop() -> None:
    """Brokers and the SDK's tools run on uvloop, whose transports are not asyncio.Transport
    subclasses (the multi-process test found the listener refusing every connection there)."""
    import uvloop

    async def run() -> None:
        gate = Gate()
        server = RemotingServer(gate, security=None, limits=RemotingLimits(in_flight_max=2))
        port = await server.start(HOST, 0)
        conn = client(f"{HOST}:{port}")
        try:
            calls = [asyncio.create_task(conn.call(Op.SEND, {"n": i, "park": True}, 10.0)) for i in range(4)]
            await wait_until(lambda: len(gate.entered) == 2, 10.0, "two requests handled")
            for i in range(4):
                await wait_until(lambda i=i: i in gate.entered, 10.0, f"request {i} handled")
                gate.open(i)
                assert (await calls[i])["n"] == i
            assert server.stats.paused >= 1
        finally:
            await conn.close()
            await server.stop()

    uvloop.run(run())


# -- issue 23, finding 5: what an unauthenticated (or any) client can make the listener hold ---------------
async def open_raw(addr: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, _, port = addr.rpartition(":")
    return await asyncio.open_connection(host, int(port))


def partial_frame(body_bytes: int, sent_bytes: int, auth_value: str = "") -> bytes:
    """A SEND frame's head claiming ``body_bytes`` of body, and the first ``sent_bytes`` of it."""
    raw_auth = auth_value.encode()
    head = HEADER.pack(10 + len(raw_auth) + body_bytes, 1, 0, int(Op.SEND), 1, len(raw_auth)) + raw_auth
    return head + b"\0" * sent_bytes


def held(server: RemotingServer) -> int:
    """Bytes the listener's connections hold in their decoders now."""
    return sum(c.decoder.buffered for c in server.connections)


async def test_unsigned_partial_frames_hold_nothing_of_their_bodies(serve: Serve, security: Security) -> None:
    """The attack of the finding: 30 connections each send a frame head claiming 11 MiB and 1 MiB of
    it, unsigned. Before, every byte was buffered until the frame was complete (30 MiB here, 11 GiB
    with 1,024 connections of 11 MiB); now each head is refused when it is complete and its body
    is discarded as it arrives."""
    server, addr = await serve(Gate(), security=security, frame_bytes_max=12 << 20)
    conns = [await open_raw(addr) for _ in range(30)]
    try:
        for _r, w in conns:
            w.write(partial_frame(11 << 20, 1 << 20))
        for _r, w in conns:
            await w.drain()
        await wait_until(lambda: server.stats.skipped_body_bytes >= 30 << 20 or server.stats.auth_refused >= 30,
                         10.0, "every head refused")
        await wait_until(lambda: server.stats.skipped_body_bytes == 30 * (11 << 20), 10.0, "the bodies skipped")
        assert held(server) < 30 * 1024, held(server)  # nothing of the 30 MiB sent is held
        assert server.stats.unauthenticated_bytes <= server.limits.unauthenticated_bytes_max
        assert server.body_bytes_reserved == 0
        for r, _w in conns[:1]:  # each was answered NO_CREDENTIALS from its head alone
            dec = FrameDecoder()
            while (f := dec.next()) is None:
                dec.feed(await r.read(65536))
            assert f.is_error and msgpack.unpackb(f.body)["code"] == "NO_CREDENTIALS"
    finally:
        for _r, w in conns:
            await close_writer(w)


async def test_unauthenticated_heads_are_bounded_per_connection_and_in_total(
    serve: Serve, security: Security
) -> None:
    server, addr = await serve(Gate(), security=security, unauthenticated_bytes_max=4096,
                               handshake_timeout_s=30.0)
    conns = [await open_raw(addr) for _ in range(10)]
    try:
        for _r, w in conns:  # each: 600 bytes of a head whose signature (1,000 bytes) never completes
            w.write(HEADER.pack(5000, 1, 0, int(Op.SEND), 1, 1000) + b"D" * 586)
            await w.drain()
        await wait_until(lambda: server.stats.over_budget_connections >= 4, 10.0, "connections over the budget closed")
        assert server.stats.unauthenticated_bytes <= 4096 and server.stats.unauthenticated_bytes_peak <= 4096
        assert held(server) <= 4096
    finally:
        for _r, w in conns:
            await close_writer(w)


async def test_signed_partial_frames_are_bounded_by_the_bodies_in_flight_budget(serve: Serve, tmp_path: Any) -> None:
    """An account may start frames too; their bodies reserve the broker's budget of bodies in flight
    (shared with HTTP) when their head verifies, and a frame over it is refused BUSY, unread."""
    acl = write_acl(os.path.join(str(tmp_path), "plain_acl.yml"))
    guard = Guard(Limits(body_bytes_in_flight_max=8 << 20), lambda code, message: {"code": code, "message": message})
    sec = Security(acl, lambda: int(time.time() * 1000), guard, scope=SCOPE)
    server = RemotingServer(Gate(), security=sec, limits=RemotingLimits(frame_bytes_max=12 << 20), guard=guard)
    port = await server.start(HOST, 0)
    addr = f"{HOST}:{port}"
    conns = [await open_raw(addr) for _ in range(5)]
    try:
        for _r, w in conns:
            body = b"\0" * (3 << 20)  # each signs 3 MiB and sends only 1 MiB of it
            sig = auth.authorization(ADMIN, "REMOTING", "SEND", body, int(time.time() * 1000), scope=SCOPE)
            w.write(partial_frame(3 << 20, 1 << 20, sig))
            await w.drain()
        await wait_until(lambda: server.stats.busy_refused + len([c for c in server.connections if c.pending]) == 5,
                         10.0, "every head verified or refused")
        assert guard.body_bytes_reserved <= 8 << 20 and server.stats.busy_refused == 3  # 2 x 3 MiB fit in 8 MiB
        assert held(server) <= 2 * (1 << 20) + 4 * 65536
    finally:
        for _r, w in conns:
            await close_writer(w)
        await server.stop()
    await wait_until(lambda: guard.body_bytes_reserved == 0, 10.0, "the reservations released")


async def test_a_signed_client_connects_while_half_open_connections_hold_the_unauthenticated_slots(
    serve: Serve, security: Security
) -> None:
    """Half-open connections (connected, silent) may hold the unauthenticated slots only: a new
    connection closes the oldest of them, and the slots beyond stay for signed clients. Before,
    ten such connections held all ten slots and a signed client could not connect."""
    server, addr = await serve(Gate(), security=security, connections_max=10, unauthenticated_connections_max=6,
                               handshake_timeout_s=60.0)
    idle = [await open_raw(addr) for _ in range(10)]
    try:
        await wait_until(lambda: server.stats.evicted_connections >= 4, 10.0, "the oldest half-open ones closed")
        assert server.stats.unauthenticated <= 6
        signed = client(addr, credentials=PRODUCER)
        try:
            assert (await signed.call(Op.SEND, {"n": 1}, 10.0))["n"] == 1
            more = [await open_raw(addr) for _ in range(10)]  # the flood goes on: the signed client stays
            idle += more
            await wait_until(lambda: server.stats.evicted_connections >= 14, 10.0, "more half-open ones closed")
            assert (await signed.call(Op.SEND, {"n": 2}, 10.0))["n"] == 2
            assert signed.connects == 1
        finally:
            await signed.close()
    finally:
        for _r, w in idle:
            await close_writer(w)


async def test_a_sub_accounts_future_stamped_pings_fail_alone(serve: Serve, tmp_path: Any) -> None:
    """Issue 23, finding 4, over the wire: a SUB account floods PINGs stamped +290 s (refused: more
    than 10 s ahead) and +9 s (accepted, filling its own key's window far past its cap); the other
    accounts' requests, signed now, all pass. Before, the window and its floor were shared: once full
    of the +290 s pings every other account got REQUEST_TOO_OLD for about five minutes."""
    acl = write_acl(os.path.join(str(tmp_path), "plain_acl.yml"))
    guard = Guard(Limits(), lambda code, message: {"code": code, "message": message})
    sec = Security(acl, lambda: int(time.time() * 1000), guard, scope=SCOPE, nonces_per_key_max=50)
    gate = Gate()
    _server, addr = await serve(gate, security=sec)
    reader, writer = await open_raw(addr)
    try:
        frames = []
        for i in range(300):
            ahead_ms = 290_000 if i % 2 else 9_000
            sig = auth.authorization(CONSUMER, "REMOTING", "PING", b"", int(time.time() * 1000) + ahead_ms, scope=SCOPE)
            frames.append(encode(Op.PING, i + 1, b"", auth=sig))
        writer.write(b"".join(frames))
        await writer.drain()
        dec = FrameDecoder()
        got: dict[int, Frame] = {}
        async with asyncio.timeout(10.0):
            while len(got) < 300:
                dec.feed(await reader.read(65536))
                while (f := dec.next()) is not None:
                    got[f.request_id] = f
        codes = collections.Counter(msgpack.unpackb(f.body)["code"] if f.is_error else "OK" for f in got.values())
        assert codes["TIMESTAMP_OUT_OF_WINDOW"] == 150 and codes["OK"] >= 50, codes  # its own floor refuses the rest
    finally:
        await close_writer(writer)
    assert sec.verifier.nonces.floor_of(CONSUMER.access_key) > int(time.time() * 1000)  # its floor, in the future
    for creds in (ADMIN, PRODUCER):
        conn = client(addr, credentials=creds)
        try:
            for n in range(20):
                assert (await conn.call(Op.SEND, {"n": n}, 5.0))["n"] == n
        finally:
            await conn.close()
