"""The body format of a dledger Raft entry: one entry carries a batch of application bodies.

Layout (little-endian)::

    +------+---------+-----------+-----------------+-----------------+----
    | 'D'  | version | count u32 | len u32 | body0 | len u32 | body1 | ...
    +------+---------+-----------+-----------------+-----------------+----
      1 B     1 B        4 B

The first byte is a command type that pysyncobj does not know (it knows 0..3), so its own apply
loop skips our entries; we apply them ourselves from the store. Every body stays addressable on
its own: its offset inside the entry body is fixed by the bodies before it, so a reader that
knows the entry's position can read one body with a single positioned read.

pysyncobj's own leader no-op is the single byte ``b'\\x01'``: ``is_batch`` tells the two apart.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

BATCH_TYPE = 0x44  # 'D'
BATCH_VERSION = 1
_PREFIX = struct.Struct("<BBI")
_LEN = struct.Struct("<I")
PREFIX_BYTES = _PREFIX.size
LEN_BYTES = _LEN.size


class CommandCodecError(ValueError):
    """An entry body that is not a well-formed batch."""


def encode_batch(bodies: Sequence[bytes]) -> bytes:
    """One entry body holding ``bodies`` in order."""
    parts: list[bytes] = [_PREFIX.pack(BATCH_TYPE, BATCH_VERSION, len(bodies))]
    for body in bodies:
        parts.append(_LEN.pack(len(body)))
        parts.append(body)
    return b"".join(parts)


def encode_batch_with_offsets(bodies: Sequence[bytes]) -> tuple[bytes, list[int]]:
    """``encode_batch(bodies)`` and ``body_offsets(bodies)`` in one pass (the leader's write)."""
    parts: list[bytes] = [_PREFIX.pack(BATCH_TYPE, BATCH_VERSION, len(bodies))]
    offsets: list[int] = []
    pack_len = _LEN.pack
    offset = PREFIX_BYTES
    for body in bodies:
        size = len(body)
        parts += (pack_len(size), body)
        offset += LEN_BYTES
        offsets.append(offset)
        offset += size
    return b"".join(parts), offsets


def batch_overhead(count: int) -> int:
    """Bytes an entry body adds around ``count`` bodies."""
    return PREFIX_BYTES + LEN_BYTES * count


def body_offsets(bodies: Sequence[bytes]) -> list[int]:
    """Offset of each body inside the encoded entry body (pure arithmetic, no encoding)."""
    offsets = []
    offset = PREFIX_BYTES
    for body in bodies:
        offset += LEN_BYTES
        offsets.append(offset)
        offset += len(body)
    return offsets


def is_batch(entry_body: bytes) -> bool:
    return len(entry_body) >= PREFIX_BYTES and entry_body[0] == BATCH_TYPE


def decode_batch(entry_body: bytes, base: int = 0) -> list[tuple[int, bytes]]:
    """``[(base + offset_in_entry_body, body), ...]``; raises CommandCodecError on a malformed
    batch. ``base``: added to each offset (a caller's log position of the entry body).

    One copy per body (a slice of the entry's bytes) and no other object per body than its
    tuple: every replica decodes every entry it applies (0.29 -> ~0.1 µs per body)."""
    if type(entry_body) is not bytes:
        entry_body = bytes(entry_body)  # slices of a bytearray or memoryview would not be bytes
    n = len(entry_body)
    if n < PREFIX_BYTES or entry_body[0] != BATCH_TYPE:
        raise CommandCodecError("not a dledger batch entry")
    _type, version, count = _PREFIX.unpack_from(entry_body, 0)
    if version != BATCH_VERSION:
        raise CommandCodecError(f"unsupported batch version {version}")
    out: list[tuple[int, bytes]] = []
    append = out.append
    unpack_len = _LEN.unpack_from
    offset = PREFIX_BYTES
    for _ in range(count):
        start = offset + LEN_BYTES
        if start > n:
            raise CommandCodecError("batch truncated in a length field")
        offset = start + unpack_len(entry_body, start - LEN_BYTES)[0]
        if offset > n:
            raise CommandCodecError("batch truncated in a body")
        append((base + start, entry_body[start:offset]))
    if offset != n:
        raise CommandCodecError("trailing bytes after the last body")
    return out
