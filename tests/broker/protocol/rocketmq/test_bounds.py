"""Hostile input to the remoting decoders: every bound holds, garbage is a coded ``RemotingError``
(never another exception), and a bounded random fuzz over mutated real frames, messages and bodies.
The fuzz prints its seed; ``REMOTING_FUZZ_SEED=<seed>`` replays it."""

from __future__ import annotations

import os
import random
import struct
import zlib
from collections.abc import Callable
from typing import Any

import pytest

from broker.protocol.rocketmq import bodies, command, fastjson, headers, message, properties
from broker.protocol.rocketmq.codes import RequestCode, SerializeType
from broker.protocol.rocketmq.errors import RemotingError
from tests.broker.protocol.rocketmq.test_vectors import BODY_TYPES
from tests.broker.protocol.rocketmq.vectors import load


def _code(fn: Callable[[], Any]) -> str:
    with pytest.raises(RemotingError) as info:
        fn()
    return info.value.code


def _frame(kind: int, header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(header) + len(body), (kind << 24) | len(header)) + header + body


# -- frames -----------------------------------------------------------------------------------------
def test_a_frame_beyond_the_cap_is_refused_from_its_length_alone() -> None:
    decoder = command.FrameDecoder(command.Bounds(frame_bytes_max=1024))
    decoder.feed(struct.pack(">I", 2000))  # four bytes: nothing else buffered or allocated
    assert _code(decoder.next) == "FRAME_TOO_LARGE"


def test_a_header_beyond_its_cap_is_refused_before_the_frame_arrives() -> None:
    decoder = command.FrameDecoder(command.Bounds(header_bytes_max=100))
    decoder.feed(struct.pack(">II", 10_000, 5000))
    assert _code(decoder.next) == "HEADER_TOO_LARGE"


@pytest.mark.parametrize("prefix,code", [
    (struct.pack(">II", 2, 0), "BAD_FRAME"),  # length below the header-length word
    (struct.pack(">II", 8, 9), "BAD_FRAME"),  # header longer than the frame
    (struct.pack(">II", 8, 2 << 24), "BAD_FRAME"),  # serialize type 2
])
def test_bad_prefixes(prefix: bytes, code: str) -> None:
    decoder = command.FrameDecoder()
    decoder.feed(prefix)
    assert _code(decoder.next) == code


def test_the_decoder_waits_for_a_whole_frame_and_keeps_what_follows() -> None:
    one = command.encode(command.request(RequestCode.HEART_BEAT, 1, body=b"x" * 100))
    two = command.encode(command.request(RequestCode.HEART_BEAT, 2, oneway=True))
    decoder = command.FrameDecoder()
    decoder.feed(one[:50])
    assert decoder.next() is None and decoder.mid_frame
    decoder.feed(one[50:] + two[:3])
    got = decoder.next()
    assert got is not None and got.opaque == 1 and got.body == b"x" * 100
    assert decoder.next() is None and decoder.buffered == 3
    decoder.feed(two[3:])
    got = decoder.next()
    assert got is not None and got.is_oneway and decoder.buffered == 0


@pytest.mark.parametrize("header,code", [
    (b"not json", "BAD_HEADER"),
    (b"[1,2]", "BAD_HEADER"),
    (b'{"opaque":1}', "BAD_HEADER"),  # no code
    (b'{"code":"x"}', "BAD_HEADER"),
    (b'{"code":4294967296}', "BAD_HEADER"),
    (b'{"code":1,"extFields":[]}', "BAD_HEADER"),
    (b'{"code":1,"extFields":{"a":{"b":1}}}', "BAD_HEADER"),
    (b'{"code":1,"remark":5}', "BAD_HEADER"),
    (b'\xff\xfe{}', "BAD_HEADER"),
    (b"[" * 100_000, "BAD_HEADER"),  # deep nesting: no RecursionError escapes
])
def test_bad_json_headers(header: bytes, code: str) -> None:
    assert _code(lambda: command.decode(_frame(0, header))) == code


def test_json_header_leniency_matches_fastjson() -> None:
    cmd = command.decode(_frame(0, b'{"code":34,"language":"GO","extFields":{"a":1,"b":true,"c":null},"remark":""}'))
    assert (cmd.language, cmd.ext_fields, cmd.remark, cmd.opaque) == (9, {"a": "1", "b": "true"}, "", 0)


def _rmq_header(ext: bytes = b"", remark: bytes = b"", ext_len: int | None = None) -> bytes:
    return (struct.pack(">hBhiiI", 10, 0, 0, 1, 0, len(remark)) + remark
            + struct.pack(">I", len(ext) if ext_len is None else ext_len) + ext)


@pytest.mark.parametrize("header", [
    b"\x00\x01",  # shorter than the fixed part
    struct.pack(">hBhiiI", 10, 0, 0, 1, 0, 1000) + b"\x00" * 4,  # remark beyond the header
    _rmq_header(ext_len=5),  # ext length beyond the header
    _rmq_header(b"\x00\x05ab"),  # key beyond the map
    _rmq_header(b"\x00\x01a\x00\x00\x10\x00v"),  # value beyond the map
    _rmq_header(b"\x00\x01\xff\x00\x00\x00\x00"),  # key not UTF-8
    _rmq_header(b"\x00\x01a\x00\x00"),  # truncated value length
    _rmq_header(remark=b"\xc3"),  # remark not UTF-8
])
def test_bad_rocketmq_headers(header: bytes) -> None:
    assert _code(lambda: command.decode(_frame(1, header))) == "BAD_HEADER"


def test_ext_field_count_and_length_caps() -> None:
    many = b"".join(struct.pack(">H", 2) + f"{i:02d}".encode() + struct.pack(">I", 1) + b"v" for i in range(40))
    bounds = command.Bounds(ext_fields_max=30, ext_key_bytes_max=8, ext_value_bytes_max=16)
    assert _code(lambda: command.decode(_frame(1, _rmq_header(many)), bounds)) == "BAD_HEADER"
    long_key = struct.pack(">H", 9) + b"k" * 9 + struct.pack(">I", 1) + b"v"
    assert _code(lambda: command.decode(_frame(1, _rmq_header(long_key)), bounds)) == "BAD_HEADER"
    long_value = struct.pack(">H", 1) + b"k" + struct.pack(">I", 17) + b"v" * 17
    assert _code(lambda: command.decode(_frame(1, _rmq_header(long_value)), bounds)) == "BAD_HEADER"
    json_many = ("{" + ",".join(f'"k{i}":"v"' for i in range(31)) + "}").encode()
    assert _code(lambda: command.decode(_frame(0, b'{"code":1,"extFields":' + json_many + b"}"), bounds)) == \
        "BAD_HEADER"
    json_long = b'{"code":1,"extFields":{"k":"' + b"v" * 17 + b'"}}'
    assert _code(lambda: command.decode(_frame(0, json_long), bounds)) == "BAD_HEADER"


def test_encoding_refuses_what_the_binary_header_cannot_hold() -> None:
    cmd = command.RemotingCommand(code=RequestCode.POP_MESSAGE, opaque=1, serialize_type=SerializeType.ROCKETMQ)
    with pytest.raises(ValueError):
        command.encode(cmd)


# -- headers ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("ext,code,field", [
    ({}, "MISSING_FIELD", "consumerGroup"),
    ({"consumerGroup": "g", "topic": "t", "queueId": "x1", "commitOffset": "1"}, "BAD_FIELD", "queueId"),
    ({"consumerGroup": "g", "topic": "t", "queueId": "-1", "commitOffset": "1"}, "BAD_FIELD", "queueId"),
    ({"consumerGroup": "g", "topic": "t", "queueId": "2147483648", "commitOffset": "1"}, "BAD_FIELD", "queueId"),
    ({"consumerGroup": "g", "topic": "t", "queueId": "1", "commitOffset": "9223372036854775808"}, "BAD_FIELD",
     "commitOffset"),
    ({"consumerGroup": "g", "topic": "t", "queueId": " 1", "commitOffset": "1"}, "BAD_FIELD", "queueId"),
    ({"consumerGroup": "g", "topic": "t", "queueId": "1_0", "commitOffset": "1"}, "BAD_FIELD", "queueId"),
    ({"consumerGroup": "g", "topic": "t", "queueId": "1" * 5000, "commitOffset": "1"}, "BAD_FIELD", "queueId"),
])
def test_header_errors_name_the_field(ext: dict[str, str], code: str, field: str) -> None:
    with pytest.raises(RemotingError) as info:
        headers.parse(headers.UpdateConsumerOffsetRequestHeader, ext)
    assert info.value.code == code and field in info.value.message


def test_send_v2_errors_name_both_field_names() -> None:
    with pytest.raises(RemotingError) as info:
        headers.parse_send_header(RequestCode.SEND_MESSAGE_V2, {"a": "pg"})
    assert info.value.code == "MISSING_FIELD" and "b (topic)" in info.value.message
    ext = {"a": "pg", "b": "t", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "x", "h": "0"}
    with pytest.raises(RemotingError) as info:
        headers.parse_send_header(RequestCode.SEND_MESSAGE_V2, ext)
    assert info.value.code == "BAD_FIELD" and "bornTimestamp" in info.value.message


def test_java_number_and_boolean_spellings() -> None:
    h = headers.parse(headers.ResetOffsetRequestHeader,
                      {"topic": "t", "group": "g", "timestamp": "+5", "isForce": "TRUE", "queueId": "-1"})
    assert (h.timestamp, h.is_force, h.queue_id) == (5, True, -1)
    h = headers.parse(headers.ResetOffsetRequestHeader,
                      {"topic": "t", "group": "g", "timestamp": "0", "isForce": "yes"})
    assert h.is_force is False


# -- messages ---------------------------------------------------------------------------------------
def test_a_decompression_bomb_stops_at_its_bound() -> None:
    bomb = zlib.compress(b"\0" * (10 << 20), 9)
    assert len(bomb) < 20_000
    assert _code(lambda: message.decompress_body(bomb, properties.COMPRESSED_FLAG, 1 << 20)) == "BODY_TOO_LARGE"
    assert message.decompress_body(bomb, properties.COMPRESSED_FLAG, 10 << 20) == b"\0" * (10 << 20)
    assert _code(lambda: message.decompress_body(bomb[:-10], properties.COMPRESSED_FLAG)) == "BAD_MESSAGE"
    assert _code(lambda: message.decompress_body(b"garbage", properties.COMPRESSED_FLAG)) == "BAD_MESSAGE"


@pytest.mark.parametrize("kind", [properties.COMPRESSION_LZ4_TYPE, properties.COMPRESSION_ZSTD_TYPE, 0x400])
def test_other_compressions_are_refused(kind: int) -> None:
    assert _code(lambda: message.decompress_body(b"x", properties.COMPRESSED_FLAG | kind)) == "UNSUPPORTED_COMPRESSION"


def test_message_and_batch_bounds() -> None:
    raw = bytes.fromhex(load()["messages"]["stored_v4_props"]["hex"])
    assert _code(lambda: message.decode_stored_many(raw * 3, messages_max=2)) == "BAD_MESSAGE"
    batch = bytes.fromhex(load()["messages"]["batch"]["hex"])
    assert _code(lambda: message.decode_batch(batch, messages_max=3)) == "BAD_MESSAGE"
    many = "\x02".join(f"k{i}\x01v" for i in range(10))
    assert _code(lambda: properties.decode_properties(many, entries_max=5)) == "BAD_PROPERTIES"
    assert properties.decode_properties("\x01a\x02b\x01\x02\x02c\x01d\x02e") == {"c": "d"}  # Java's skips
    for bad in ("xyz", "G" * 32, "0" * 30):
        assert _code(lambda bad=bad: message.parse_offset_msg_id(bad)) == "BAD_MESSAGE_ID"


def test_json_bounds() -> None:
    assert _code(lambda: fastjson.loads(b"[" * 40 + b"]" * 40)) == "BAD_JSON"
    assert _code(lambda: fastjson.loads(b"[" + b"1," * 100 + b"1]", values_max=50)) == "BAD_JSON"
    assert _code(lambda: fastjson.loads(b'"x"', bytes_max=2)) == "BAD_JSON"
    assert _code(lambda: fastjson.loads(b"1" * 500)) == "BAD_JSON"
    assert _code(lambda: fastjson.loads(b'{[1]:2}')) == "BAD_JSON"
    assert fastjson.loads(b'{0:"a",-1:"b"}') == {0: "a", -1: "b"}
    assert _code(lambda: bodies.decode(bodies.ConsumeStats, b'{"offsetTable":{"x":{}}}')) == "BAD_BODY"
    assert _code(lambda: bodies.decode(bodies.TopicRouteData, b'{"queueDatas":[{"brokerName":1}]}')) == "BAD_BODY"
    assert _code(lambda: bodies.decode(bodies.HeartbeatData, b"{}")) == "BAD_BODY"  # clientID required


# -- bounded random fuzz ----------------------------------------------------------------------------
def _mutations(rng: random.Random, seed: bytes, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        data = bytearray(seed)
        op = rng.randrange(5)
        if op == 0 and data:  # flip bytes
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif op == 1:  # truncate
            data = data[:rng.randrange(len(data) + 1)]
        elif op == 2:  # random bytes
            data = bytearray(rng.randbytes(rng.randrange(200)))
        elif op == 3 and len(data) > 8:  # an absurd length somewhere
            pos = rng.randrange(len(data) - 4)
            data[pos:pos + 4] = rng.choice([b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff", b"\x00\x00\x00\x00"])
        else:  # extend
            data += rng.randbytes(rng.randrange(64))
        out.append(bytes(data))
    return out


def test_bounded_fuzz_of_every_decoder() -> None:
    seed = int(os.environ.get("REMOTING_FUZZ_SEED", random.randrange(2**32)))
    print(f"REMOTING_FUZZ_SEED={seed}")
    rng = random.Random(seed)
    vec = load()
    bounds = command.Bounds(frame_bytes_max=1 << 16, header_bytes_max=1 << 12)

    def frames(data: bytes) -> None:
        decoder = command.FrameDecoder(bounds)
        decoder.feed(data)
        while decoder.next() is not None:
            pass
        cmd = command.decode(data, bounds)
        if cmd.ext_fields is not None:
            headers.parse_request_header(cmd.code, cmd.ext_fields)

    targets: list[tuple[Callable[[bytes], Any], list[bytes]]] = [
        (frames, [bytes.fromhex(f["hex"]) for f in vec["frames"].values()]),
        (lambda d: message.decode_stored_many(d, 64),
         [bytes.fromhex(m["hex"]) for k, m in vec["messages"].items() if k.startswith("stored")]),
        (lambda d: message.decode_batch(d, messages_max=64), [bytes.fromhex(vec["messages"]["batch"]["hex"])]),
        (lambda d: message.decompress_body(d, properties.COMPRESSED_FLAG, 1 << 16), [zlib.compress(b"abc" * 100)]),
        (lambda d: properties.decode_properties_bytes(d, 64), [b"a\x01b\x02c\x01d"]),
        (lambda d: message.parse_offset_msg_id(d.decode("latin-1")), [b"7F00000100002A9F0000000000001F40"]),
    ]
    targets += [(lambda d, cls=cls: bodies.decode(cls, d, bytes_max=1 << 16),
                 [vec["bodies"][name].encode()]) for name, cls in BODY_TYPES.items()]
    failures: list[str] = []
    runs = 0
    for decode, seeds in targets:
        for seed_bytes in seeds:
            for data in _mutations(rng, seed_bytes, 150):
                runs += 1
                try:
                    decode(data)
                except RemotingError:
                    pass
                except Exception as exc:  # anything else is a bug
                    failures.append(f"{type(exc).__name__}: {exc} on {data[:80].hex()}")
    assert runs > 5000
    assert not failures, f"seed {seed}:\n" + "\n".join(failures[:10])
