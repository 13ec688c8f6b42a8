"""The client's per-send fast paths (issue 26, one synchronous sender) give what the slow paths give.

- ``Signer.sign``/``Signer.header`` make ``broker.protocol.auth.authorization``'s header byte for byte
  (the same HMAC, the fixed parts made once) and draw nonces like ``auth.new_nonce``.
- ``RemotingConnection``: a call with a free slot and an open connection waits for its answer under
  one timer, any other wait under ``asyncio.timeout_at``; every wait ends at the call's deadline.
- ``AutoBatcher``: a batch opened with nothing in flight is sent by the task made with it, once,
  also when ``close`` or its limits flushed it before that task started.
"""

from __future__ import annotations

import asyncio
import enum
import io
import json
import os
import random
import re
from types import SimpleNamespace
from typing import Any

import pytest

from broker.client import ClientError, MessageQueue
from broker.client.autobatch import AutoBatcher
from broker.client.remoting import RemotingConnection
from broker.client.signer import NONCE_POOL_BYTES, Signer
from broker.protocol.auth import UNKNOWN_SCOPE, Credentials, authorization, parse_authorization
from broker.protocol.frames import FLAG_RESPONSE, FrameDecoder, Op, encode, pack_body, unpack_body

SEED = int(os.environ.get("TEST_SEED", random.randrange(1 << 30)))


@pytest.fixture
def rng() -> random.Random:
    print(f"seed {SEED}")
    return random.Random(SEED)


def test_the_signers_header_is_authorizations_byte_for_byte(rng: random.Random) -> None:
    for _ in range(200):
        creds = Credentials("ak" + str(rng.randrange(10**6)), "".join(rng.choice("abcXYZ019+/=é") for _ in range(40)))
        signer = Signer(creds)
        addr = f"127.0.0.{rng.randrange(1, 9)}:{rng.randrange(1024, 65536)}"
        scope = rng.choice([UNKNOWN_SCOPE, "RaftNode00-n1", "namesrv-0"])
        if scope != UNKNOWN_SCOPE:
            signer.learn_scope(addr, scope)
        method = rng.choice(["REMOTING", "POST", "get"])
        target = rng.choice(["SEND", "/v1/send", "/v1/routes/T%C3%A9?v=1", "PULL"])
        body = rng.randbytes(rng.randrange(0, 3000))
        ts = rng.randrange(1, 2**41)
        nonce = rng.randbytes(16).hex()
        assert signer.header(addr, method, target, body, ts, nonce) == authorization(
            creds, method, target, body, ts, nonce, scope=scope)


def test_sign_stamps_now_and_a_fresh_nonce_for_the_learnt_scope() -> None:
    creds = Credentials("bench", "s" * 32)
    signer = Signer(creds)
    signer.learn_scope("h:1", "RaftNode00-n1")
    nonces = set()
    for _ in range(NONCE_POOL_BYTES // 16 * 2 + 3):  # across refills of the pool
        value = signer.sign("h:1", "REMOTING", "SEND", b"body")
        assert value is not None
        head = parse_authorization(value)
        assert head.scope == "RaftNode00-n1" and re.fullmatch(r"[0-9a-f]{32}", head.nonce)
        assert value == signer.header("h:1", "REMOTING", "SEND", b"body", head.timestamp_ms, head.nonce)
        nonces.add(head.nonce)
    assert len(nonces) == NONCE_POOL_BYTES // 16 * 2 + 3
    assert Signer(None).sign("h:1", "REMOTING", "SEND", b"") is None


class _Server:
    """A broker's binary port that answers every request with ``{}`` (or never answers)."""

    def __init__(self, answer: bool, hold: bool = False) -> None:
        self.answer = answer
        self.hold = hold  # answers wait for release()
        self.held: list[tuple[asyncio.StreamWriter, bytes]] = []
        self.received: list[int] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        decoder = FrameDecoder()
        while data := await reader.read(1 << 16):
            decoder.feed(data)
            while (frame := decoder.next()) is not None:
                self.received.append(unpack_body(frame.body).get("n", -1))
                answer = encode(frame.op, frame.request_id, pack_body({}), flags=FLAG_RESPONSE)
                if self.hold:
                    self.held.append((writer, answer))
                elif self.answer:
                    writer.write(answer)

    def release(self) -> None:
        writer, answer = self.held.pop(0)
        writer.write(answer)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()
        for w in self.writers:
            try:
                await w.wait_closed()
            except OSError:
                pass
        await self.server.wait_closed()


async def _until(cond: Any) -> None:
    for _ in range(5000):  # bounded: 5 s of 1 ms steps
        if cond():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the expected state did not come")


async def test_every_wait_of_a_call_ends_at_its_deadline() -> None:
    server = _Server(answer=False)
    addr = await server.start()
    conn = RemotingConnection(addr, error=ClientError, in_flight_max=1)
    try:
        held = asyncio.create_task(conn.call(Op.SEND, {"n": 1}, 30.0))  # connects, holds the one slot
        await _until(lambda: conn.in_flight == 1)
        with pytest.raises(ClientError) as e:  # waits for a slot: bounded as well
            await conn.call(Op.SEND, {"n": 2}, 0.1)
        assert e.value.code == "TIMEOUT" and e.value.outcome_unknown and conn.in_flight == 1
        held.cancel()
        with pytest.raises(asyncio.CancelledError):
            await held
        assert conn.in_flight == 0
        with pytest.raises(ClientError) as e:  # a free slot, the open connection: the answer's timer
            await conn.call(Op.SEND, {"n": 3}, 0.1)
        assert e.value.code == "TIMEOUT" and conn.in_flight == 0 and conn.connects == 1
    finally:
        await conn.close()
        await server.stop()


async def test_the_slot_cap_holds_and_slots_go_to_waiting_calls_in_order() -> None:
    server = _Server(answer=True, hold=True)
    addr = await server.start()
    conn = RemotingConnection(addr, error=ClientError, in_flight_max=2)
    try:
        loop = asyncio.get_running_loop()
        calls = [loop.create_task(conn.call(Op.SEND, {"n": i}, 10.0)) for i in range(6)]
        await _until(lambda: len(server.received) == 2)
        calls[3].cancel()  # a caller waiting for a slot leaves: no slot is lost with it
        for got in (3, 4, 5):  # each answer lets exactly one waiting call in, in order
            server.release()
            await _until(lambda got=got: len(server.received) == got)
            await asyncio.sleep(0.02)  # (room for a call over the cap to show up: none may)
            assert len(server.received) == got and conn.in_flight <= 2
        while server.held:
            server.release()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert isinstance(results[3], asyncio.CancelledError)
        assert [r for i, r in enumerate(results) if i != 3] == [{}] * 5
        assert server.received == [0, 1, 2, 4, 5] and conn.in_flight == 0 and conn.connects == 1
    finally:
        await conn.close()
        await server.stop()


async def test_calls_on_an_open_connection_get_their_answers() -> None:
    server = _Server(answer=True)
    addr = await server.start()
    conn = RemotingConnection(addr, error=ClientError)
    try:
        assert await asyncio.gather(*(conn.call(Op.PING, None, 5.0) for _ in range(5))) == [{}] * 5
        for _ in range(3):
            assert await conn.call(Op.SEND, {"n": 1}, 5.0) == {}
        assert conn.connects == 1 and conn.in_flight == 0
    finally:
        await conn.close()
        await server.stop()


async def test_a_batch_flushed_before_its_task_started_is_sent_once() -> None:
    requests: list[list[dict[str, Any]]] = []

    async def send_items(mq: MessageQueue, items: list[dict[str, Any]], deadline: float) -> Any:
        requests.append(items)
        return {"status": "SEND_OK", "results": [
            {"msg_id": f"M{i}", "unique_id": it["unique_id"], "queue_offset": i} for i, it in enumerate(items)]}

    mq = MessageQueue("T", "RaftNode00", 0)
    b = AutoBatcher(send_items, max_delay_ms=60_000)
    loop = asyncio.get_running_loop()
    sends = [loop.create_task(b.send(mq, {"body": b"x", "unique_id": f"U{i}"}, loop.time() + 5)) for i in range(2)]
    for _ in range(20):  # loop turns, no wall time: both joined the batch the first opened
        await asyncio.sleep(0)
    assert len(requests) == 1 and [it["unique_id"] for it in requests[0]] == ["U0", "U1"]
    assert [r.queue_offset for r in await asyncio.gather(*sends)] == [0, 1]
    third = loop.create_task(b.send(mq, {"body": b"x", "unique_id": "U2"}, loop.time() + 5))
    await asyncio.sleep(0)  # the third send opened a batch (nothing in flight) ...
    await b.close()  # ... which close flushes before its task starts: it goes once
    assert (await third).unique_id == "U2"
    assert [[it["unique_id"] for it in r] for r in requests] == [["U0", "U1"], ["U2"]]


class _BenchProducer:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.sent = 0

    async def start(self) -> None:
        pass

    async def shutdown(self) -> None:
        pass

    async def send(self, msg: Any, *, timeout_s: float | None = None) -> Any:
        self.sent += 1
        return SimpleNamespace(status=self.answers[(self.sent - 1) % len(self.answers)])


class _Status(enum.Enum):
    SEND_OK = "ok"
    FLUSH_DISK_TIMEOUT = "late"


async def _bench(answers: list[Any], send_status: Any) -> dict[str, Any]:
    from broker.tools.mqbench import build_parser, run_produce

    producer = _BenchProducer(answers)
    sdk = SimpleNamespace(Producer=lambda *a, **kw: producer, Message=lambda topic, body, **kw: SimpleNamespace(),
                          **({"SendStatus": send_status} if send_status is not None else {}))
    args = build_parser().parse_args(["produce", "-n", "127.0.0.1:1", "--rate", "400", "--duration", "0.05",
                                      "--json", "-s", "10"])
    out = io.StringIO()
    assert await run_produce(args, sdk=sdk, out=out, err=io.StringIO()) == 0
    summary: dict[str, Any] = json.loads(out.getvalue())
    assert summary["calls"] == producer.sent == 20  # tickets 0..19 are due before 0.05 s at 400/s
    return summary


async def test_mq_bench_counts_exactly_the_sdks_send_ok_as_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    """mq-bench's sender knows the SDK's SEND_OK member by identity; any other status (a member
    of the same enum, a plain string, an SDK without SendStatus) is judged by its name as before."""
    from broker.tools import mqbench

    async def no_namesrv(args: Any, err: Any) -> dict[str, Any]:
        return {}

    monkeypatch.setattr(mqbench, "checked_security", no_namesrv)  # a stand-in producer: no NameServer
    answers = [_Status.SEND_OK, _Status.FLUSH_DISK_TIMEOUT, "SEND_OK", "SLAVE_NOT_AVAILABLE"]
    summary = await _bench(answers, _Status)
    assert (summary["messages"], summary["response_failed"]) == (10, 10)
    summary = await _bench(answers[:3], None)  # no SendStatus: names only
    assert (summary["messages"], summary["response_failed"]) == (13, 7)


class _Gated:
    """send_items that waits (for ``gate``, and at most until the deadline it is given: the
    producer's bound, ``call_leader``'s timeout) and then answers like /v1/send."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.requests: list[list[dict[str, Any]]] = []

    async def __call__(self, mq: MessageQueue, items: list[dict[str, Any]], deadline: float) -> Any:
        self.requests.append(items)
        try:
            async with asyncio.timeout_at(deadline):
                await self.gate.wait()
        except TimeoutError:
            raise ClientError("TIMEOUT", "no answer within the request's time", addr="a:1") from None
        return {"status": "SEND_OK", "results": [
            {"msg_id": f"M{i}", "unique_id": it["unique_id"], "queue_offset": i} for i, it in enumerate(items)]}


_MQ = MessageQueue("T", "RaftNode00", 0)


def _item(i: int) -> dict[str, Any]:
    return {"body": b"x", "unique_id": f"U{i}"}


async def test_a_lone_send_is_made_by_its_caller_and_answered_alike() -> None:
    broker = _Gated()
    broker.gate.set()
    b = AutoBatcher(broker, max_delay_ms=60_000)
    loop = asyncio.get_running_loop()
    tasks_before = len(asyncio.all_tasks())

    async def watch() -> int:  # how many tasks run while the lone send is in flight
        return len(asyncio.all_tasks())

    result = await b.send(_MQ, _item(0), loop.time() + 5)
    assert (result.unique_id, result.queue_offset, result.message_queue) == ("U0", 0, _MQ)
    assert broker.requests == [[_item(0)]] and (b.batches, b.messages) == (1, 1)
    broker.gate.clear()
    lone = loop.create_task(b.send(_MQ, _item(1), loop.time() + 5))
    while len(broker.requests) < 2:
        await asyncio.sleep(0)
    assert await watch() == tasks_before + 1  # this test's and the lone send's: no batch task
    broker.gate.set()
    assert (await lone).unique_id == "U1"


async def test_a_lone_sends_timeout_is_the_batchers_own() -> None:
    """The same error as when a batch task sent it: the caller's TIMEOUT from the batch's timer."""
    broker = _Gated()
    b = AutoBatcher(broker, max_delay_ms=60_000)
    loop = asyncio.get_running_loop()
    with pytest.raises(ClientError) as e:
        await b.send(_MQ, _item(0), loop.time() + 0.1)
    assert (e.value.code, e.value.message, e.value.addr) == (
        "TIMEOUT", "no answer before the send's deadline (auto-batched)", None)
    assert e.value.outcome_unknown


async def test_close_waits_for_a_lone_send_in_flight() -> None:
    broker = _Gated()
    b = AutoBatcher(broker, max_delay_ms=60_000)
    loop = asyncio.get_running_loop()
    lone = loop.create_task(b.send(_MQ, _item(0), loop.time() + 5))
    while not broker.requests:
        await asyncio.sleep(0)
    closing = loop.create_task(b.close())
    for _ in range(20):  # loop turns, no wall time
        await asyncio.sleep(0)
    assert not closing.done()
    broker.gate.set()
    await closing
    assert lone.done() and lone.result().unique_id == "U0"


async def test_a_caller_cancelled_before_its_batch_went_leaves_it_to_go() -> None:
    broker = _Gated()
    broker.gate.set()
    b = AutoBatcher(broker, max_delay_ms=60_000)
    loop = asyncio.get_running_loop()
    cancelled = loop.create_task(b.send(_MQ, _item(0), loop.time() + 5))
    await asyncio.sleep(0)  # it opened the batch; the batch goes at the end of that loop turn
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    for _ in range(20):  # loop turns, no wall time
        await asyncio.sleep(0)
    assert broker.requests == [[_item(0)]]
    await b.close()


def test_mq_bench_stats_total_is_the_taken_intervals_and_the_current_one(rng: random.Random) -> None:
    """mq-bench counts a latency once (in its interval); the run's total is the same histogram as
    counting every value in it as well."""
    from broker.tools.mqbench import Stats
    from dledger.apps.stats import LatencyHistogram

    for consumer in (False, True):
        s = Stats()
        ref, ref2 = LatencyHistogram(), LatencyHistogram()
        seen = 0
        for i in range(3000):
            if consumer:
                b2c, s2c = rng.randrange(1, 50_000), (rng.randrange(1, 50_000) if i % 3 else None)
                s.record_consumed(b2c, s2c)
                ref.record_us(b2c)
                if s2c is not None:
                    ref2.record_us(s2c)
            else:
                rt = rng.lognormvariate(-6.7, 0.5)
                s.record_ok(rt, 1)
                ref.record_s(rt)
            if i % 701 == 700:
                n, h, _ = s.take_interval()
                seen += n
                assert h.count == n
        assert seen + s.interval_msgs == 3000
        for got, want in ((s.total, ref), (s.total2, ref2)):
            assert (got.count, got.sum_us, got.max_us) == (want.count, want.sum_us, want.max_us)
            assert got.summary_ms() == want.summary_ms()
