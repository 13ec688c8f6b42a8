"""The batch entry body codec: decode_batch against a plain reference decoder (the one it replaced)."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

import pytest

from dledger import command_codec as cc


def _reference(entry_body: bytes) -> list[tuple[int, bytes]]:
    """The straightforward decoder (a memoryview slice per body, offsets from the entry body)."""
    if not cc.is_batch(entry_body):
        raise cc.CommandCodecError("not a dledger batch entry")
    _type, version, count = struct.unpack_from("<BBI", entry_body, 0)
    if version != cc.BATCH_VERSION:
        raise cc.CommandCodecError("version")
    out = []
    offset = cc.PREFIX_BYTES
    view = memoryview(entry_body)
    for _ in range(count):
        if offset + cc.LEN_BYTES > len(entry_body):
            raise cc.CommandCodecError("length")
        (size,) = struct.unpack_from("<I", entry_body, offset)
        offset += cc.LEN_BYTES
        if offset + size > len(entry_body):
            raise cc.CommandCodecError("body")
        out.append((offset, bytes(view[offset : offset + size])))
        offset += size
    if offset != len(entry_body):
        raise cc.CommandCodecError("trailing")
    return out


def _outcome(fn: Callable[[bytes], object], arg: bytes) -> object:
    try:
        return fn(arg)
    except cc.CommandCodecError:
        return "error"


def test_decode_matches_the_reference_on_good_and_damaged_batches() -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    for _ in range(400):
        bodies = [rng.randbytes(rng.choice((0, 1, 7, 300))) for _ in range(rng.randrange(0, 6))]
        good = cc.encode_batch(bodies)
        assert cc.decode_batch(good) == _reference(good)
        assert [b for _, b in cc.decode_batch(good)] == bodies
        assert [o for o, _ in cc.decode_batch(good)] == cc.body_offsets(bodies)
        damaged = bytearray(good)
        kind = rng.randrange(4)
        if kind == 0 and damaged:
            del damaged[rng.randrange(len(damaged)) :]  # truncated anywhere
        elif kind == 1:
            damaged += rng.randbytes(rng.randrange(1, 4))  # trailing bytes
        elif kind == 2 and len(damaged) > 2:
            damaged[2 + rng.randrange(len(damaged) - 2)] ^= 1 << rng.randrange(8)  # a count/length/body bit
        else:
            damaged[1] = rng.choice((0, 2))  # another version
        assert _outcome(cc.decode_batch, bytes(damaged)) == _outcome(_reference, bytes(damaged))


def test_decode_adds_the_base_and_returns_bytes_for_any_buffer() -> None:
    bodies = [b"a", b"", b"xyz"]
    good = cc.encode_batch(bodies)
    expected = [(1000 + o, b) for o, b in _reference(good)]
    for buf in (good, bytearray(good), memoryview(good)):
        got = cc.decode_batch(buf, 1000)  # type: ignore[arg-type]
        assert got == expected
        assert all(type(b) is bytes for _, b in got)


@pytest.mark.parametrize("bad", [b"", b"D", b"\x01", b"D\x01", b"X\x01\x00\x00\x00\x00"])
def test_not_a_batch_is_refused(bad: bytes) -> None:
    with pytest.raises(cc.CommandCodecError):
        cc.decode_batch(bad)


def test_encode_with_offsets_is_encode_batch_and_body_offsets() -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    for _ in range(200):
        bodies = [rng.randbytes(rng.choice((0, 1, 5, 700))) for _ in range(rng.randrange(0, 40))]
        payload, offsets = cc.encode_batch_with_offsets(bodies)
        assert payload == cc.encode_batch(bodies)  # the bytes stored and replicated: unchanged
        assert offsets == cc.body_offsets(bodies)
