"""The message record's own CRC: a damaged record is refused, never decoded into a wrong message."""

from __future__ import annotations

import struct

import msgpack
import pytest

from broker.store.message import (
    _HEADER_TYPES,
    MESSAGE_MAGIC,
    MESSAGE_MAGIC_V1,
    CorruptRecordError,
    StoredMessage,
    decode_header,
    decode_message,
    encode_message,
    is_message_record,
    record_size,
)


def _message(body: bytes = b"hello world") -> StoredMessage:
    return StoredMessage(
        topic="T", queue_id=1, flag=0, tags="a", keys=("k",), properties={"p": "v"},
        born_ts=1, born_host="127.0.0.1:1", store_ts=2, unique_id="0" * 32, body=body,
    )


def test_a_record_round_trips_and_its_size_is_known_from_the_header() -> None:
    record = encode_message(_message())
    assert record[:1] == MESSAGE_MAGIC and is_message_record(record)
    h, start = decode_header(record)
    hlen = start - 5
    assert record_size(record[:1], hlen, int(h[10])) == len(record)
    assert decode_message(record) == _message()


@pytest.mark.parametrize("where", ["header", "body", "crc"])
def test_any_flipped_bit_is_refused(where: str) -> None:
    record = bytearray(encode_message(_message(b"x" * 64)))
    _, start = decode_header(bytes(record))
    at = {"header": 6, "body": start + 10, "crc": len(record) - 2}[where]
    record[at] ^= 0x04
    with pytest.raises((CorruptRecordError, ValueError)):
        decode_message(bytes(record))


def test_a_truncated_record_is_refused() -> None:
    record = encode_message(_message(b"y" * 32))
    with pytest.raises(CorruptRecordError):
        decode_message(record[:-1])


def test_an_older_unchecked_record_still_decodes() -> None:
    m = _message()
    header = msgpack.packb(
        [m.topic, m.queue_id, m.flag, m.tags, m.keys, m.properties, m.born_ts, m.born_host, m.store_ts,
         m.unique_id, len(m.body)],
        use_bin_type=True,
    )
    v1 = MESSAGE_MAGIC_V1 + struct.pack("<I", len(header)) + header + m.body
    assert decode_message(v1) == m
    assert record_size(MESSAGE_MAGIC_V1, len(header), len(m.body)) == len(v1)
    with pytest.raises(CorruptRecordError):  # its body length is still checked against the header
        decode_message(v1 + b"!")


def _record_with_header(fields: list[object], body: bytes = b"zz") -> bytes:
    header = msgpack.packb(fields, use_bin_type=True)
    return MESSAGE_MAGIC + struct.pack("<I", len(header)) + header + body


@pytest.mark.parametrize("field", range(11))
def test_every_header_field_of_the_wrong_type_is_refused(field: int) -> None:
    # One wrong field at a time, against the types the header declares (_HEADER_TYPES): a record
    # that decodes with, say, a list for a topic must never reach a consume queue.
    good: list[object] = ["T", 1, 0, "a", ["k"], {"p": "v"}, 1, "h:1", 2, "0" * 32, 2]
    decode_header(_record_with_header(good))
    wrong = {str: 7, int: "7", list: "k", dict: ["p"]}[_HEADER_TYPES[field]]
    bad = [*good[:field], wrong, *good[field + 1 :]]
    with pytest.raises(ValueError, match="wrong types"):
        decode_header(_record_with_header(bad))


def test_a_key_that_is_not_a_string_is_refused() -> None:
    fields: list[object] = ["T", 1, 0, "a", ["k", 3], {}, 1, "h:1", 2, "0" * 32, 2]
    with pytest.raises(ValueError, match="wrong types"):
        decode_header(_record_with_header(fields))
