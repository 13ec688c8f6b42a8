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


def decode_batch(entry_body: bytes) -> list[tuple[int, bytes]]:
    """``[(offset_in_entry_body, body), ...]``; raises CommandCodecError on a malformed batch."""
    if not is_batch(entry_body):
        raise CommandCodecError("not a dledger batch entry")
    _type, version, count = _PREFIX.unpack_from(entry_body, 0)
    if version != BATCH_VERSION:
        raise CommandCodecError(f"unsupported batch version {version}")
    out: list[tuple[int, bytes]] = []
    offset = PREFIX_BYTES
    view = memoryview(entry_body)
    for _ in range(count):
        if offset + LEN_BYTES > len(entry_body):
            raise CommandCodecError("batch truncated in a length field")
        (size,) = _LEN.unpack_from(entry_body, offset)
        offset += LEN_BYTES
        if offset + size > len(entry_body):
            raise CommandCodecError("batch truncated in a body")
        out.append((offset, bytes(view[offset : offset + size])))
        offset += size
    if offset != len(entry_body):
        raise CommandCodecError("trailing bytes after the last body")
    return out
