"""The leader's send path made cheaper per message (issue 26): each fast path gives exactly what the
plain code it replaced gives — the same record bytes, the same messages, the same answers and errors."""

from __future__ import annotations

import random
import struct
import threading
import zlib
from typing import Any

import msgpack
import pytest

from broker.store.message import MESSAGE_MAGIC, StoredMessage, decode_message, encode_message


def reference_record(m: StoredMessage) -> bytes:
    """The record as encode_message wrote it before (a new list and ``msgpack.packb`` per message)."""
    fields: list[Any] = [m.topic, m.queue_id, m.flag, m.tags, list(m.keys), m.properties, m.born_ts, m.born_host,
                         m.store_ts, m.unique_id, len(m.body)]
    if m.sys_flag:
        fields.append(m.sys_flag)
    header = msgpack.packb(fields, use_bin_type=True)
    record = b"".join((MESSAGE_MAGIC, struct.pack("<I", len(header)), header, m.body))
    return record + struct.pack("<I", zlib.crc32(record))


def random_message(rnd: random.Random) -> StoredMessage:
    def text(n: int) -> str:
        return "".join(rnd.choice("abcXYZ019_-.é漢") for _ in range(rnd.randint(0, n)))

    return StoredMessage(
        topic=text(40) or "T",
        queue_id=rnd.choice([0, 7, 127, 128, 65535, 65536]),
        flag=rnd.choice([0, 1, 2**31 - 1]),
        tags=text(30),
        keys=tuple(text(20) or "k" for _ in range(rnd.randint(0, 4))),
        properties={text(10) or "p": text(300) for _ in range(rnd.randint(0, 4))},
        born_ts=rnd.choice([0, 1764311111111, 2**63 - 1]),
        born_host=text(20),
        store_ts=rnd.choice([0, 1764311111112, 2**32, 2**63 - 1]),
        unique_id=text(64) or "u",
        body=rnd.randbytes(rnd.choice([1, 31, 32, 255, 256, 1024, 65536, 70000])),
        sys_flag=rnd.choice([0, 0, 1, 0x1 | 0x40, 2**31 - 1]),
    )


def test_encode_message_writes_the_bytes_the_plain_encoder_wrote() -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rnd = random.Random(seed)
    for _ in range(500):
        m = random_message(rnd)
        record = encode_message(m)
        assert record == reference_record(m)
        assert decode_message(record) == m


def test_encode_message_keys_as_a_list_give_the_same_record() -> None:
    m = random_message(random.Random(7))._replace(keys=("a", "b"))
    assert encode_message(m._replace(keys=["a", "b"])) == encode_message(m) == reference_record(m)  # type: ignore[arg-type]


def test_encode_message_after_a_refused_value_still_encodes_right() -> None:
    """A value msgpack cannot pack leaves this thread's Packer clean for the next message."""
    m = random_message(random.Random(8))
    with pytest.raises(TypeError):
        encode_message(m._replace(properties={"p": object()}))  # type: ignore[dict-item]
    assert encode_message(m) == reference_record(m)


def test_encode_message_from_many_threads_at_once() -> None:
    rnd = random.Random(9)
    msgs = [random_message(rnd) for _ in range(200)]
    expected = [reference_record(m) for m in msgs]
    bad: list[int] = []

    def run() -> None:
        for _ in range(5):
            bad.extend(i for i, m in enumerate(msgs) if encode_message(m) != expected[i])

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []
