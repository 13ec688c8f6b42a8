"""The broker's per-request work at one request in flight made cheaper (issue 26, one synchronous
sender): each fast path gives exactly what the plain code it replaced gives — the same decisions,
the same bytes, the same answers and errors."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import random
import threading
import types
from typing import Any

import msgpack
import pytest

from broker.edge.binary import Call, RemotingLimits, RemotingServer, _Connection
from broker.protocol import auth
from broker.protocol.auth import AuthError
from broker.protocol.frames import OPS, Op, encode, pack_body
from broker.server.broker_server import BrokerServer
from broker.server.config import parse_broker_config
from broker.serving import acl
from broker.serving.acl import Account, Perm
from broker.store.message import decode_message
from dledger.node import DLedgerNode
from dledger.records import BodyLocation
from tests.broker.harness import broker_props

PERMS = [Perm.DENY, Perm.PUB, Perm.SUB, Perm.ANY]


def _check_plain(account: Account, topics: dict[str, Perm], groups: dict[str, Perm], admin: bool) -> None:
    """``acl.check`` as it was: the permissions compared with Perm's own operators."""
    if admin and not account.admin:
        raise AuthError(403, "NO_PERMISSION", f"{account.access_key!r} is not an admin account")
    for topic, need in topics.items():
        if need & ~acl.topic_perm(account, topic):
            raise AuthError(403, "NO_PERMISSION", f"{account.access_key!r} may not {acl._verb(need)} topic {topic!r}")
    for group, need in groups.items():
        if need & ~acl.group_perm(account, group):
            raise AuthError(403, "NO_PERMISSION", f"{account.access_key!r} may not {acl._verb(need)} group {group!r}")


def _check_fast(account: Account, topics: Any, groups: Any, admin: bool) -> None:
    acl.check(account, topics=topics, groups=groups, admin=admin)


def _outcome(f: Any, *args: Any) -> Any:
    try:
        return ("ok", f(*args))
    except AuthError as exc:
        return ("refused", exc.status, exc.code, exc.message)


@pytest.mark.parametrize("is_admin", [False, True])
def test_acl_check_decides_as_the_flag_operators_did(is_admin: bool) -> None:
    decided = 0
    for default_topic, default_group, listed_topic, listed_group in itertools.product(PERMS, PERMS, PERMS, PERMS):
        account = Account("ak", "secret-key-1", admin=is_admin, default_topic_perm=default_topic,
                          default_group_perm=default_group, topic_perms={"Listed": listed_topic},
                          group_perms={"G": listed_group})
        for topic, group, need_t, need_g, admin in itertools.product(
            ["Listed", "Other", "%RETRY%G", "%DLQ%H"], ["G", "H"], PERMS, PERMS, [False, True]
        ):
            topics, groups = {topic: need_t}, {group: need_g}
            got = _outcome(_check_fast, account, topics, groups, admin)
            assert got == _outcome(_check_plain, account, topics, groups, admin)
            # the same needs as a sequence of pairs and as a read-only mapping decide alike
            assert _outcome(_check_fast, account, list(topics.items()), tuple(groups.items()), admin) == got
            assert _outcome(_check_fast, account, types.MappingProxyType(topics), groups, admin) == got
            decided += got[0] == "refused"
    assert decided  # both outcomes were seen


# -- signatures: HMAC-SHA256 from the secret's hashed pads ---------------------------------------------
def _signature_plain(secret_key: str, message: bytes) -> str:
    """``auth.signature`` as it was: a new HMAC keyed per call."""
    return base64.b64encode(hmac.new(secret_key.encode("utf-8"), message, hashlib.sha256).digest()).decode("ascii")


def test_signature_is_the_hmac_modules() -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rnd = random.Random(seed)
    lengths = [0, 1, 8, 31, 32, 63, 64, 65, 100, 128, 129, 300]
    for _ in range(400):
        n = rnd.choice(lengths)
        secret = "".join(rnd.choice("aZ09-_é漢\x00") for _ in range(n))  # multi-byte: past 64 bytes sooner
        for _ in range(3):  # the same secret again: its pads are reused
            message = rnd.randbytes(rnd.choice([0, 1, 55, 56, 64, 300, 5000]))
            assert auth.signature(secret, message) == _signature_plain(secret, message)


def test_signature_of_a_secret_that_cannot_be_encoded_fails_as_before() -> None:
    with pytest.raises(UnicodeEncodeError):
        _signature_plain("bad\ud800secret", b"m")
    with pytest.raises(UnicodeEncodeError):
        auth.signature("bad\ud800secret", b"m")


def test_signature_from_many_threads_at_once() -> None:
    rnd = random.Random(11)
    cases = [(f"secret-{i % 3}-key", rnd.randbytes(200)) for i in range(300)]
    expected = [_signature_plain(s, m) for s, m in cases]
    bad: list[int] = []

    def run() -> None:
        for _ in range(5):
            bad.extend(i for i, (s, m) in enumerate(cases) if auth.signature(s, m) != expected[i])

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


# -- the edge's op lookup ---------------------------------------------------------------------------------
def test_ops_table_gives_what_op_gives() -> None:
    for n in [*range(-2, 70), 0xFFFF, 2**32]:
        try:
            expected: Op | None = Op(n)
        except ValueError:
            expected = None
        assert OPS.get(n) is expected


# -- the connection's timers: the idle timer is lazy --------------------------------------------------------
class _Handle:
    def __init__(self, when: float, callback: Any) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class _ManualTimers:
    """The loop as the connection's timers see it, on a clock the test moves; tasks run on the real loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.now, self.handles = loop, 1000.0, []  # type: ignore[var-annotated]

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any) -> _Handle:
        h = _Handle(when, callback)
        self.handles.append(h)
        return h

    def create_task(self, coro: Any) -> Any:
        return self.loop.create_task(coro)

    def armed(self) -> list[_Handle]:
        return [h for h in self.handles if not h.cancelled]

    def advance_to(self, t: float) -> None:
        """Fire, in order, every timer due by ``t`` (and those they arm that are due by then)."""
        while True:
            due = sorted((h for h in self.armed() if h.when <= t), key=lambda h: h.when)
            if not due:
                break
            h = due[0]
            h.cancelled = True
            self.now = max(self.now, h.when)
            h.callback()
        self.now = t


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name == "peername" else default

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _connection(idle_s: float, frame_s: float) -> tuple[Any, _Transport, _ManualTimers, dict[int, Any]]:
    """A connection whose requests wait for the test: body {"n": k} waits for parked[k] when parked."""
    loop = asyncio.get_running_loop()
    parked: dict[int, Any] = {}

    async def dispatch(call: Call) -> dict[str, Any]:
        n = call.body["n"]
        if call.body.get("park"):
            parked[n] = loop.create_future()
            await parked[n]
        return {"n": n}

    server = RemotingServer(dispatch, security=None,
                            limits=RemotingLimits(idle_timeout_s=idle_s, frame_timeout_s=frame_s))
    conn = _Connection(server)
    timers = _ManualTimers(loop)
    conn._loop = timers  # type: ignore[assignment]  # before connection_made: every timer on the test's clock
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport, timers, parked


async def _settle(conn: Any) -> None:
    for _ in range(1000):
        if not conn.in_flight:
            return
        await asyncio.sleep(0)
    raise AssertionError("requests did not finish")


def _request(n: int, park: bool = False) -> bytes:
    return encode(Op.SEND, n, pack_body({"n": n, "park": park}))


@pytest.mark.parametrize(("idle_s", "frame_s"), [(60.0, 30.0), (5.0, 30.0)])
def test_an_idle_connection_closes_idle_timeout_after_its_last_answer(idle_s: float, frame_s: float) -> None:
    async def scenario() -> None:
        conn, transport, timers, parked = await _connection(idle_s, frame_s)
        t0 = timers.now
        # requests answered at once, every idle_s / 3 for a while: never closed, at most one timer armed
        for i in range(12):
            conn.data_received(_request(i))
            await _settle(conn)
            assert len(timers.armed()) <= 1
            timers.advance_to(t0 + (i + 1) * idle_s / 3)
            assert not transport.closed
        last = t0 + 11 * idle_s / 3  # the last answer went at this time
        timers.advance_to(last + idle_s - 0.001)
        assert not transport.closed
        timers.advance_to(last + idle_s)
        assert transport.closed and conn.server.stats.timed_out_connections == 0

        # a request in flight far past the idle timeout keeps the connection; its answer starts the wait
        conn, transport, timers, parked = await _connection(idle_s, frame_s)
        conn.data_received(_request(1, park=True))
        await asyncio.sleep(0)
        timers.advance_to(timers.now + 10 * idle_s)
        assert not transport.closed and conn.in_flight == 1
        answered = timers.now
        parked[1].set_result(None)
        await _settle(conn)
        timers.advance_to(answered + idle_s - 0.001)
        assert not transport.closed
        timers.advance_to(answered + idle_s)
        assert transport.closed

        # half a frame after an answer: closed frame_timeout after that frame started, counted
        conn, transport, timers, parked = await _connection(idle_s, frame_s)
        conn.data_received(_request(1))
        await _settle(conn)
        started = timers.now + 1.0
        timers.advance_to(started)
        conn.data_received(_request(2)[:9])
        timers.advance_to(started + frame_s - 0.001)
        assert not transport.closed
        timers.advance_to(started + frame_s)
        assert transport.closed and conn.server.stats.timed_out_connections == 1

        # a frame that came in two reads (its frame timer armed), answered: the idle wait from the answer
        conn, transport, timers, parked = await _connection(idle_s, frame_s)
        frame = _request(1)
        conn.data_received(frame[:9])
        timers.advance_to(timers.now + 1.0)
        conn.data_received(frame[9:])
        await _settle(conn)
        answered = timers.now
        timers.advance_to(answered + idle_s - 0.001)
        assert not transport.closed
        timers.advance_to(answered + idle_s)
        assert transport.closed and conn.server.stats.timed_out_connections == 0

    asyncio.run(scenario())


def _parse_plain(value: str | None) -> Any:
    """``auth.parse_authorization`` as it was: the fields read one ``group`` call each."""
    if value is None or value == "":
        raise AuthError(401, "NO_CREDENTIALS", "x")
    m = auth._HEADER_RE.fullmatch(value) if len(value) <= auth.HEADER_CHARS_MAX else None
    if m is None:
        raise AuthError(401, "BAD_AUTHORIZATION", "x")
    return auth.SignedHeader(m.group(1), m.group(2), int(m.group(3)), m.group(4), m.group(5), m.group(6))


def test_parse_authorization_reads_the_fields_group_read() -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rnd = random.Random(seed)
    creds = auth.Credentials("ak-" + "x" * rnd.randrange(40), "secret-key-1")
    for _ in range(300):
        value = auth.authorization(creds, "REMOTING", "SEND", rnd.randbytes(rnd.randrange(3000)),
                                   rnd.choice([0, 1, 1764311111111, 10**15 - 1]),
                                   scope=rnd.choice(["broker:C/G/n0", "namesrv:abc", "-"]))
        for v in (value, value[:-1], value + " ", value.replace("Nonce=", "Nonce=0")):
            got = _outcome(auth.parse_authorization, v)
            want = _outcome(_parse_plain, v)
            assert got[0] == want[0] and (got[0] != "ok" or got == want)


# -- the send: every message fresh (the usual send) and some sent before --------------------------------------
class _Appends(DLedgerNode):
    """A leader that commits every append at once and keeps what it was given."""

    role = "LEADER"
    term = 1
    leader_id = "n0"
    last_index = 0

    async def append(self, bodies: Any, timeout_s: float = 3.0) -> list[BodyLocation]:
        self.appended.append(list(bodies))  # type: ignore[attr-defined]
        self.last_index += 1
        index = self.last_index
        return [BodyLocation(index, 1, i, 1000 * index + i, len(b), i) for i, b in enumerate(bodies)]


async def test_a_send_appends_and_answers_its_fresh_messages_only(tmp_path: Any) -> None:
    root = str(tmp_path)
    props = broker_props(root, "n0", [1, 2, 3], [4, 5, 6], [0, 0, 0], ["127.0.0.1:9"])
    server = BrokerServer(parse_broker_config(props, source="<test>", env={}))
    node = _Appends.__new__(_Appends)
    node.appended = []  # type: ignore[attr-defined]
    server.node = node
    server._ready_term = 1
    server.store.metadata.apply({"op": "topic.put", "topic": "T", "read_queue_nums": 4, "write_queue_nums": 4,
                                 "perm": 6})
    svc = server.service

    def batch(*uids: str) -> list[dict[str, Any]]:
        return [{"body": u.encode(), "unique_id": u} for u in uids]

    def appended_uids() -> list[str]:
        return [decode_message(r).unique_id for r in node.appended[-1]]  # type: ignore[attr-defined]

    first = await svc.send("T", 1, batch("A", "B", "C", "D"))
    assert appended_uids() == ["A", "B", "C", "D"] and not any(r.duplicate for r in first.results)
    assert [r.position for r in first.results] == [1000, 1001, 1002, 1003]
    assert server.counters["messages_sent"] == 4 and server.counters["duplicate_messages"] == 0
    for n, r in enumerate(first.results):  # as the apply would: the window learns the first send
        server.store.dedup.add("T", r.unique_id, position=r.position, queue_id=1, queue_offset=n,
                               store_ts=first.store_ts, index=1)
    calls = len(node.appended)  # type: ignore[attr-defined]

    again = await svc.send("T", 1, batch("A", "E", "C", "F"))
    assert appended_uids() == ["E", "F"]
    assert [(r.unique_id, r.duplicate) for r in again.results] == [("A", True), ("E", False), ("C", True),
                                                                      ("F", False)]
    assert again.results[0].position == 1000 and again.results[2].position == 1002
    assert [again.results[1].position, again.results[3].position] == [2000, 2001]
    assert server.counters["messages_sent"] == 6 and server.counters["duplicate_messages"] == 2

    known = await svc.send("T", 1, batch("B", "D"))
    assert len(node.appended) == calls + 1  # type: ignore[attr-defined]  # nothing appended for it
    assert [(r.position, r.duplicate) for r in known.results] == [(1001, True), (1003, True)]
    assert server.counters["messages_sent"] == 6 and server.counters["duplicate_messages"] == 4
    assert server.metrics.messages_in.labels(**server.metrics.base, topic="T")._value.get() == 6


# -- frame bodies packed with this thread's Packer ---------------------------------------------------------
def _random_value(rnd: random.Random, depth: int = 0) -> Any:
    kind = rnd.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return rnd.choice([None, True, False])
    if kind == 1:
        return rnd.choice([0, -1, 127, 128, -33, 2**31, 2**63 - 1, -(2**63), 2**64 - 1])
    if kind == 2:
        return rnd.random() * 10**rnd.randrange(-5, 20)
    if kind == 3:
        return rnd.choice("ab é漢\x00") * rnd.choice([0, 1, 31, 32, 255, 256, 70000 if depth == 0 else 3])
    if kind in (4, 5):
        return rnd.randbytes(rnd.choice([0, 1, 255, 256, 65535, 65536] if depth == 0 else [0, 1, 255, 256]))
    if kind == 6:
        return [_random_value(rnd, depth + 1) for _ in range(rnd.choice([0, 1, 15, 16, 20]))]
    if kind == 7:
        return tuple(_random_value(rnd, depth + 1) for _ in range(rnd.randrange(4)))
    return {f"k{i}": _random_value(rnd, depth + 1) for i in range(rnd.choice([0, 1, 15, 16, 20]))}


def test_pack_body_writes_what_packb_wrote() -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rnd = random.Random(seed)
    for _ in range(300):
        value = {"v": _random_value(rnd)}
        assert pack_body(value) == msgpack.packb(value, use_bin_type=True)


def test_pack_body_after_a_refused_value_still_packs_right() -> None:
    value = {"status": "SEND_OK", "results": [{"msg_id": "B:0000000000000001", "queue_offset": 3}]}
    with pytest.raises(TypeError):
        pack_body({"a": 1, "b": object()})
    with pytest.raises((OverflowError, TypeError, ValueError)):
        pack_body({"a": [1, 2, 2**64]})
    assert pack_body(value) == msgpack.packb(value, use_bin_type=True)


def test_pack_body_from_many_threads_at_once() -> None:
    rnd = random.Random(12)
    values = [{"v": _random_value(rnd)} for _ in range(100)]
    expected = [msgpack.packb(v, use_bin_type=True) for v in values]
    bad: list[int] = []

    def run() -> None:
        for _ in range(5):
            bad.extend(i for i, v in enumerate(values) if pack_body(v) != expected[i])

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []
