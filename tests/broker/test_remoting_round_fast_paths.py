"""The RocketMQ edge's per-request work made cheaper (issue 26, the official Java client): each fast
path gives exactly what the plain code it replaced gives — the same bytes on the wire, the same
answers and errors."""

from __future__ import annotations

import asyncio
import json
import random
import struct
from typing import Any

from broker.edge.rocketmq import send as rmq_send
from broker.edge.rocketmq.edge import RocketMQEdge
from broker.protocol.rocketmq import command as rc
from broker.protocol.rocketmq import header_fields, headers
from broker.protocol.rocketmq import properties as rp
from broker.protocol.rocketmq.codes import (
    LANGUAGE_BY_NAME,
    LanguageCode,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from broker.protocol.rocketmq.command import Bounds, RemotingCommand
from broker.protocol.rocketmq.errors import RemotingError
from broker.protocol.rocketmq.fastjson import quote
from broker.protocol.rocketmq.message import Host
from broker.serving.remoting_acl import needs_of
from broker.serving.remoting_server import RemotingServer, Request

ECHO = 9001  # a test code: answers its body back


class FakeTransport:
    """Records every ``writelines`` call (one call = one system call on a real transport)."""

    def __init__(self) -> None:
        self.writes: list[list[bytes]] = []
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def writelines(self, chunks: list[bytes]) -> None:
        assert not self.closed, "written after close"
        self.writes.append([bytes(c) for c in chunks])

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _NoService:
    """A broker service of which the edge's handlers use nothing here (registration only)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _echo_server() -> RemotingServer:
    server = RemotingServer()

    async def echo(req: Request) -> RemotingCommand:
        return req.ok(ext_fields={"n": req.cmd.ext("n") or ""}, body=req.cmd.body)

    server.route(ECHO, echo)
    return server


def _requests(n: int) -> list[RemotingCommand]:
    return [RemotingCommand(code=ECHO, opaque=i + 1, version=409, ext_fields={"n": str(i)},
                            body=b"b" * (i % 3), serialize_type=SerializeType(i % 2)) for i in range(n)]


def _expected(reqs: list[RemotingCommand]) -> bytes:
    """What writing each answer at once wrote: its frame, in order."""
    return b"".join(rc.encode(rc.response_to(r, 0, None, {"n": r.ext("n") or ""}, r.body)) for r in reqs)


async def _settle(transport: FakeTransport, nbytes: int) -> None:
    for _ in range(100):
        if sum(len(c) for w in transport.writes for c in w) >= nbytes:
            return
        await asyncio.sleep(0)
    raise AssertionError("the answers did not go out")


def test_answers_of_one_loop_turn_leave_in_one_write_with_the_same_bytes() -> None:
    async def scenario() -> None:
        server = _echo_server()
        conn = server()
        transport = FakeTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        reqs = _requests(7)
        conn.data_received(b"".join(rc.encode(r) for r in reqs))
        want = _expected(reqs)
        await _settle(transport, len(want))
        assert len(transport.writes) == 1  # one write for the turn's seven answers
        assert b"".join(transport.writes[0]) == want
        # a later turn's answer is a write of its own
        more = _requests(9)[7:]
        conn.data_received(b"".join(rc.encode(r) for r in more))
        await _settle(transport, len(want) + len(_expected(more)))
        assert len(transport.writes) == 2 and b"".join(transport.writes[1]) == _expected(more)
        conn.close()
        conn.connection_lost(None)

    asyncio.run(scenario())


def test_answers_made_before_a_close_still_go_out_before_it() -> None:
    async def scenario() -> None:
        server = _echo_server()
        conn = server()
        transport = FakeTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        reqs = _requests(3)
        conn.data_received(b"".join(rc.encode(r) for r in reqs))
        # One turn: the handlers' tasks (scheduled by data_received) answer, then this task runs;
        # the flush they scheduled comes after it.
        await asyncio.sleep(0)
        assert conn.in_flight == 0 and not transport.writes and conn._out
        conn.close()  # e.g. a bad frame that followed: what was answered leaves first
        assert transport.closed
        assert b"".join(c for w in transport.writes for c in w) == _expected(reqs)
        conn.connection_lost(None)
        await asyncio.sleep(0)
        assert len(transport.writes) == 1  # the scheduled flush finds nothing more to write

    asyncio.run(scenario())


def test_only_a_heartbeat_needs_its_body_read_for_the_acl_check() -> None:
    """The edge's guard skips ``needs_of`` for a principal that may do everything (ACL off) on every
    code but HEART_BEAT: that is the same only while ``needs_of`` reads no other code's body (a bad
    one would be refused before the handler) — pinned here for every request code."""
    garbage = [b"", b"\xff\x00not json", b"{", b"[1,2]", b'{"consumerDataSet": 5}']
    exts: list[dict[str, str] | None] = [None, {}, {"b": "%RETRY%g", "a": "g", "topic": "T", "consumerGroup": ""}]
    raised = set()
    for code in RequestCode:
        for body in garbage:
            for ext in exts:
                try:
                    needs_of(int(code), ext, body)
                except RemotingError:
                    raised.add(int(code))
    assert raised == {RequestCode.HEART_BEAT}


def test_with_acl_off_a_bad_heartbeat_is_still_refused_before_its_handler() -> None:
    async def scenario() -> None:
        ran: list[int] = []
        edge = RocketMQEdge(_NoService(),  # type: ignore[arg-type]
                            broker_name="B", store_host=Host(b"\x7f\x00\x00\x01", 10911))
        edge.server.routes.pop(RequestCode.HEART_BEAT)

        async def handler(req: Request) -> RemotingCommand:
            ran.append(req.cmd.code)
            return req.ok()

        edge.route(RequestCode.HEART_BEAT, handler)
        conn = edge.server()
        transport = FakeTransport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        bad = RemotingCommand(code=RequestCode.HEART_BEAT, opaque=5, version=409, body=b"{")
        conn.data_received(rc.encode(bad))
        await _settle(transport, 1)
        answer = rc.decode(b"".join(transport.writes[0]))
        assert answer.code == ResponseCode.SYSTEM_ERROR and (answer.remark or "").startswith("BAD_JSON")
        assert ran == []
        conn.close()
        conn.connection_lost(None)

    asyncio.run(scenario())


# -- the JSON header writer ---------------------------------------------------------------------------
def _encode_json_header_plain(cmd: RemotingCommand) -> bytes:
    """``encode_json_header`` as it was: each key and value quoted, the enums' names looked up."""

    def language_name(language: int) -> str:
        try:
            return LanguageCode(language).name
        except ValueError:
            return LanguageCode.OTHER.name

    parts = ['{"code":', str(cmd.code)]
    if cmd.ext_fields is not None:
        parts.append(',"extFields":{')
        parts.append(",".join(f"{quote(k)}:{quote(v)}" for k, v in cmd.ext_fields.items()))
        parts.append("}")
    parts.append(f',"flag":{cmd.flag},"language":"{language_name(cmd.language)}","opaque":{cmd.opaque}')
    if cmd.remark is not None:
        parts.append(',"remark":')
        parts.append(quote(cmd.remark))
    parts.append(f',"serializeTypeCurrentRPC":"{SerializeType(cmd.serialize_type).name}","version":{cmd.version}}}')
    return "".join(parts).encode("utf-8", "replace")


_ESCAPED = [chr(c) for c in [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, 0x22, 0x5C]]
_PLAIN = ["a", "Z", "0", "_", "%", ":", "/", " ", "é", "中", "\U0001F600", "\ud800", ",", "{", "}"]


def _text(rnd: random.Random) -> str:
    n = rnd.choice([0, 1, 2, 5, 20])
    pool = _PLAIN + (_ESCAPED if rnd.random() < 0.3 else [])
    return "".join(rnd.choice(pool) for _ in range(n))


def test_json_header_writer_equals_the_plain_one() -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rnd = random.Random(seed)
    codes = [0, 1, 310, ResponseCode.SUCCESS, RequestCode.SEND_MESSAGE_V2, -5, 2**31 - 1]
    languages = [*LanguageCode, 0, 12, 99, -1]
    for _ in range(3000):
        ext: dict[str, str] | None = None
        if rnd.random() < 0.9:
            ext = {_text(rnd): _text(rnd) for _ in range(rnd.choice([0, 1, 3, 8]))}
        cmd = RemotingCommand(code=rnd.choice(codes), opaque=rnd.randrange(-(2**31), 2**31),
                              flag=rnd.choice([0, 1, 2, 3]), language=rnd.choice(languages),
                              version=rnd.choice([0, 399, 409, 475]),
                              remark=None if rnd.random() < 0.6 else _text(rnd), ext_fields=ext,
                              serialize_type=rnd.choice(list(SerializeType)))
        assert rc.encode_json_header(cmd) == _encode_json_header_plain(cmd), cmd
    # the 4.9.8 send answer (tests/wire/vectors) is one of them, byte for byte
    answer = RemotingCommand(code=0, opaque=7, flag=1, version=409, ext_fields={
        "queueId": "3", "TRACE_ON": "true", "MSG_REGION": "DefaultRegion",
        "msgId": "7F00000100002A9F0000000000001F40", "queueOffset": "1234567890123"})
    assert rc.encode_json_header(answer) == _encode_json_header_plain(answer)


# -- the send answer's header ---------------------------------------------------------------------------
def test_send_answer_ext_equals_the_header_class() -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rnd = random.Random(seed)
    for _ in range(2000):
        msg_id = rnd.choice(["", "7F00000100002A9F0000000000001F40",
                             ",".join(["7F000001000027170000000000000000"] * 3)])
        queue_id = rnd.choice([0, 3, 1023, 2**31 - 1])
        queue_offset = rnd.choice([-1, 0, 42, 2**63 - 1])
        txn = rnd.choice([None, "", "7F0000010001B4AAC2B5", _text(rnd)])
        header = headers.SendMessageResponseHeader(msg_id=msg_id, queue_id=queue_id, queue_offset=queue_offset,
                                                   transaction_id=txn)
        plain = {**headers.to_ext(header), rp.MSG_REGION: rmq_send.MSG_REGION, rp.TRACE_ON: "true"}
        fast = rmq_send.answer_ext(msg_id, queue_id, queue_offset, txn)
        assert list(fast.items()) == list(plain.items())  # same fields, same order: same bytes


# -- the V2 send header reader -------------------------------------------------------------------------
def _parse_send_header_plain(code: int, ext: dict[str, str] | None) -> Any:
    """``parse_send_header`` as it was: ``parse_value`` for every field."""
    if code not in headers.SEND_V2_CODES:
        return header_fields.parse(headers.SendMessageRequestHeader, ext)
    ext = ext or {}
    kwargs: dict[str, Any] = {}
    for field in headers._SEND_V2_FIELDS:
        raw = ext.get(field.wire)
        if raw is None:
            if field.required:
                long_name = headers.SEND_V2_NAMES[field.wire]
                raise RemotingError("MISSING_FIELD", f"the header field {field.wire} ({long_name}) is missing")
            continue
        try:
            kwargs[field.attr] = header_fields.parse_value(field, raw)
        except RemotingError as exc:
            raise RemotingError(exc.code, f"{exc.message} ({headers.SEND_V2_NAMES[field.wire]})") from None
    return headers.SendMessageRequestHeader(**kwargs)


_NUMBERS = ["0", "7", "-1", "+5", "--5", "+-5", "1-", " 5", "5 ", "", "x", "1_0", "٣", "²", "0x10", "00042",
            "2147483647", "2147483648", "-2147483648", "-2147483649", "9223372036854775807",
            "9223372036854775808", "-9223372036854775808", "999999999999999999", "1000000000000000000",
            "99999999999999999999", "123456789012345678901", "1700000000123", "TRUE", "true", "False"]


def _outcome_of(f: Any, *args: Any) -> Any:
    try:
        return ("ok", f(*args))
    except RemotingError as exc:
        return ("error", exc.code, exc.message)


def test_send_header_reader_equals_parse_value_per_field() -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rnd = random.Random(seed)
    good = {"a": "pg", "b": "bench_1k", "c": "TBW102", "d": "4", "e": "3", "f": "0", "g": "1700000000123", "h": "0",
            "i": "UNIQ_KEY\x01AB\x02WAIT\x01true", "j": "0", "k": "false", "l": "16", "m": "false", "n": "B"}
    codes = [RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2]
    seen = set()
    for _ in range(6000):
        ext: dict[str, str] | None = dict(good)
        assert ext is not None
        for key in rnd.sample(sorted(good), rnd.choice([0, 1, 2, 4])):
            roll = rnd.random()
            if roll < 0.15:
                del ext[key]
            elif roll < 0.8:
                ext[key] = rnd.choice(_NUMBERS)
            else:
                ext[key] = _text(rnd)
        if rnd.random() < 0.01:
            ext = rnd.choice([None, {}])
        code = rnd.choice(codes)
        fast = _outcome_of(headers.parse_send_header, code, ext)
        plain = _outcome_of(_parse_send_header_plain, code, ext)
        assert fast == plain, (ext, fast, plain)
        seen.add(fast[0] if fast[0] == "ok" else fast[1])
    assert seen == {"ok", "MISSING_FIELD", "BAD_FIELD"}


# -- the JSON header reader ----------------------------------------------------------------------------
def _decode_json_header_plain(raw: bytes, bounds: Bounds) -> dict[str, Any]:
    """``decode_json_header`` as it was: every ext field checked in Python."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RemotingError("BAD_HEADER", f"the JSON header cannot be read: {str(exc)[:120]}") from None
    if not isinstance(obj, dict):
        raise RemotingError("BAD_HEADER", "the JSON header must be an object")
    if "code" not in obj:
        raise RemotingError("BAD_HEADER", "the JSON header has no code")
    fields: dict[str, Any] = {"code": rc._check_int32(obj["code"], "code")}
    for name in ("opaque", "flag", "version"):
        value = obj.get(name)
        fields[name] = 0 if value is None else rc._check_int32(value, name)
    language = obj.get("language")
    if isinstance(language, str):
        fields["language"] = LANGUAGE_BY_NAME.get(language, LanguageCode.OTHER)
    elif language is None:
        fields["language"] = LanguageCode.JAVA
    else:
        fields["language"] = rc._check_int32(language, "language")
    remark = obj.get("remark")
    if remark is not None and not isinstance(remark, str):
        raise RemotingError("BAD_HEADER", "remark must be a string")
    fields["remark"] = remark
    ext = obj.get("extFields")
    if ext is None:
        fields["ext_fields"] = None
    elif not isinstance(ext, dict):
        raise RemotingError("BAD_HEADER", "extFields must be an object")
    else:
        if len(ext) > bounds.ext_fields_max:
            raise RemotingError("BAD_HEADER", f"{len(ext)} ext fields exceed {bounds.ext_fields_max}")
        checked: dict[str, str] = {}
        for key, value in ext.items():
            if len(key) > bounds.ext_key_bytes_max:
                raise RemotingError("BAD_HEADER", f"an ext field name of {len(key)} characters is too long")
            if isinstance(value, str):
                pass
            elif value is None:
                continue
            elif isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, int):
                value = str(value)
            else:
                raise RemotingError("BAD_HEADER", f"ext field {key[:64]!r} must be a string")
            if len(value) > bounds.ext_value_bytes_max:
                raise RemotingError("BAD_HEADER", f"ext field {key[:64]!r} is longer than {bounds.ext_value_bytes_max}")
            checked[key] = value
        fields["ext_fields"] = checked
    return fields


def _json_value(rnd: random.Random) -> Any:
    return rnd.choice([_text(rnd), _text(rnd), "x" * rnd.choice([7, 8, 9]), None, True, False, 0, -3, 2**40,
                       1.5, [], {}, "true"])


def test_json_header_reader_equals_the_plain_one() -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rnd = random.Random(seed)
    bounds = Bounds(ext_fields_max=6, ext_key_bytes_max=8, ext_value_bytes_max=8)
    ints = [0, 7, -1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, True, None, "5", 1.0]
    seen = set()
    for _ in range(5000):
        obj: dict[str, Any] = {"code": rnd.choice([310, 310, 310, *ints])}
        for name in ("opaque", "flag", "version", "language", "remark"):
            if rnd.random() < 0.8:
                obj[name] = rnd.choice(ints + (["JAVA", "GO", "NOPE", 3] if name == "language" else []))
        if rnd.random() < 0.3:
            obj["remark"] = _text(rnd)
        if rnd.random() < 0.9:
            if rnd.random() < 0.03:
                obj["extFields"] = rnd.choice([[], "x", 5])
            else:
                keys = [rnd.choice(["a", "b", "queueId", "k" * rnd.choice([8, 9]), _text(rnd)])
                        for _ in range(rnd.choice([0, 1, 3, 6, 7]))]
                obj["extFields"] = {k: (_json_value(rnd) if rnd.random() < 0.3 else _text(rnd)[:8]) for k in keys}
        if rnd.random() < 0.02:
            del obj["code"]
        raw = json.dumps(obj, ensure_ascii=rnd.random() < 0.5).encode("utf-8", "surrogatepass")
        fast = _outcome_of(rc.decode_json_header, raw, bounds)
        plain = _outcome_of(_decode_json_header_plain, raw, bounds)
        assert fast == plain, (raw, fast, plain)
        if fast[0] == "ok":
            assert list(fast[1]) == list(plain[1])  # the same fields, in the same order
            ext = fast[1]["ext_fields"]
            assert ext is None or list(ext.items()) == list(plain[1]["ext_fields"].items())
        seen.add(fast[0] if fast[0] == "ok" else fast[1])
    assert seen == {"ok", "BAD_HEADER"}


# -- the frame decoder ---------------------------------------------------------------------------------
class _PlainFrameDecoder(rc.FrameDecoder):
    """``FrameDecoder.next`` as it was: the frame's content handed to ``decode_frame_content``."""

    def next(self) -> RemotingCommand | None:
        buf = self._buf
        if len(buf) < 4:
            return None
        (length,) = struct.unpack_from(">I", buf, 0)
        if length < 4:
            raise RemotingError("BAD_FRAME", f"frame length {length} is below the 4-byte header length")
        if length + 4 > self.bounds.frame_bytes_max:
            raise RemotingError("FRAME_TOO_LARGE",
                                f"a frame of {length + 4} bytes exceeds {self.bounds.frame_bytes_max}")
        if len(buf) >= 8:
            (word,) = struct.unpack_from(">I", buf, 4)
            header_len = word & 0xFFFFFF
            if header_len > length - 4:
                raise RemotingError("BAD_FRAME", f"header length {header_len} exceeds the frame ({length - 4})")
            if header_len > self.bounds.header_bytes_max:
                raise RemotingError("HEADER_TOO_LARGE",
                                    f"a header of {header_len} bytes exceeds {self.bounds.header_bytes_max}")
            if word >> 24 > SerializeType.ROCKETMQ:
                raise RemotingError("BAD_FRAME", f"serialize type {word >> 24} is neither JSON (0) nor ROCKETMQ (1)")
        end = 4 + length
        if len(buf) < end:
            return None
        with memoryview(buf) as view:
            content = view[4:end]
            try:
                cmd = rc.decode_frame_content(content, self.bounds)
            finally:
                content.release()
        del buf[:end]
        return cmd


def _random_frame(rnd: random.Random) -> bytes:
    cmd = RemotingCommand(code=rnd.choice([310, 11, 34]), opaque=rnd.randrange(1 << 20), version=409,
                          remark=None if rnd.random() < 0.7 else _text(rnd),
                          ext_fields=None if rnd.random() < 0.1 else {_text(rnd): _text(rnd) for _ in range(3)},
                          body=rnd.randbytes(rnd.choice([0, 1, 5, 300])),
                          serialize_type=rnd.choice(list(SerializeType)))
    frame = bytearray(rc.encode(cmd))
    roll = rnd.random()
    if roll < 0.05:  # a garbage length, header length, serialize type or header byte
        frame[rnd.randrange(len(frame))] = rnd.randrange(256)
    elif roll < 0.08:
        frame[4] = rnd.choice([2, 7, 255])
    elif roll < 0.11:
        frame[5:8] = rnd.randrange(1 << 24).to_bytes(3, "big")
    elif roll < 0.13:
        frame[0:4] = rnd.choice([0, 3, 7, 1 << 20]).to_bytes(4, "big")
    return bytes(frame)


def _drain(decoder: rc.FrameDecoder, chunks: list[bytes]) -> list[Any]:
    out: list[Any] = []
    for chunk in chunks:
        decoder.feed(chunk)
        while True:
            try:
                cmd = decoder.next()
            except RemotingError as exc:
                out.append(("error", exc.code, exc.message, decoder.buffered))
                return out
            if cmd is None:
                break
            out.append(("ok", cmd))
        out.append(("wait", decoder.buffered, decoder.mid_frame))
    return out


def test_frame_decoder_equals_the_plain_one() -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rnd = random.Random(seed)
    bounds = Bounds(frame_bytes_max=4096, header_bytes_max=1024)
    outcomes: set[str] = set()
    for _ in range(1500):
        stream = b"".join(_random_frame(rnd) for _ in range(rnd.choice([1, 2, 5])))
        cuts = sorted(rnd.sample(range(1, len(stream)), min(len(stream) - 1, rnd.choice([0, 1, 3, 10]))))
        chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
        fast = _drain(rc.FrameDecoder(bounds), chunks)
        plain = _drain(_PlainFrameDecoder(bounds), chunks)
        assert fast == plain
        outcomes.update(o[0] if o[0] != "error" else o[1] for o in fast)
    assert {"ok", "wait", "BAD_FRAME", "BAD_HEADER"} <= outcomes


# -- the properties string ------------------------------------------------------------------------------
def _decode_properties_plain(text: str, entries_max: int = rp.PROPERTIES_ENTRIES_MAX) -> dict[str, str]:
    """``decode_properties`` as it was: every entry read by the loop."""
    props: dict[str, str] = {}
    if not text:
        return props
    segments = text.split(rp.PROPERTY_SEPARATOR)
    if len(segments) > entries_max + 1:
        raise RemotingError("BAD_PROPERTIES", f"more than {entries_max} properties")
    for segment in segments:
        i = segment.find(rp.NAME_VALUE_SEPARATOR)
        if 0 < i < len(segment) - 1:
            props[segment[:i]] = segment[i + 1:]
    if len(props) > entries_max:
        raise RemotingError("BAD_PROPERTIES", f"more than {entries_max} properties")
    return props


def test_properties_reader_equals_the_loop() -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rnd = random.Random(seed)
    atoms = ["A", "B", "UNIQ_KEY", "x", "", "é", "\x01", "\x02", "\x01\x02", "7F00"]
    fast_seen = 0
    for _ in range(20000):
        text = "".join(rnd.choice(atoms) for _ in range(rnd.choice([0, 1, 2, 4, 8, 16])))
        if rnd.random() < 0.3:  # entries with empty names or values among repeated names (the loop's skips)
            entries = [rnd.choice(["A", "B", ""]) + rnd.choice(["\x01", ""]) + rnd.choice(["", "x", "x\x01y"])
                       for _ in range(rnd.randint(1, 6))]
            text = "\x02".join(entries) + rnd.choice(["", "\x02", "\x01"])
        elif rnd.random() < 0.6:  # well-formed entries (the fast path), sometimes with 5.x's final separator
            entries = [rnd.choice(["A", "B", "KEYS", "é"]) + "\x01" + rnd.choice(["1", "x\x01y", "v"])
                       for _ in range(rnd.randint(1, 6))]  # names may repeat: the last value, the first place
            text = "\x02".join(entries) + ("\x02" if rnd.random() < 0.5 else "")
            fast_seen += 1
        entries_max = rnd.choice([2, 3, rp.PROPERTIES_ENTRIES_MAX])
        fast = _outcome_of(rp.decode_properties, text, entries_max)
        plain = _outcome_of(_decode_properties_plain, text, entries_max)
        assert fast == plain, (text, fast, plain)
        if fast[0] == "ok":
            assert list(fast[1].items()) == list(plain[1].items()), text  # the same order too
    assert fast_seen
    # an entry skipped for its empty value does not place its name: the name goes where it is first read
    assert list(rp.decode_properties("A\x01\x02B\x01y\x02A\x01x")) == ["B", "A"]
