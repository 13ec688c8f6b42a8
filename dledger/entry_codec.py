"""Binary layout of log entries and index records (pure functions, no I/O).

Entry = 44-byte header + body, little-endian::

    magic u32 | total_size u32 | index u64 | term u64 | position u64 |
    body_crc u32 | chain_crc u32 | header_crc u32

- ``position``: the entry's global byte position in this replica's log (segment start + offset).
- ``body_crc = crc32(body)``.
- ``chain_crc = crc32(pack('<QQI', index, term, body_crc), prev_chain_crc)``, with 0 before the
  first entry ever: two replicas that agree on one entry's chain CRC agree on the whole prefix.
  Positions are per replica and deliberately outside the chain.
- ``header_crc = crc32(first 40 header bytes)``: a torn or flipped header is detected before its
  size is trusted.

A BLANK marker (magic ``BLANK_MAGIC`` + u32 size) pads the end of a segment when the next entry
does not fit; readers move on to the next segment.

Index record (24 bytes, one per Raft index): ``position u64 | term u64 | total_size u32 | chain_crc u32``.
An all-zero record means "no entry here".
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

MAGIC = 0xD1ED6E01
BLANK_MAGIC = 0xD1ED0B1A
_HEADER = struct.Struct("<IIQQQIII")
HEADER_SIZE = _HEADER.size  # 44
_BLANK = struct.Struct("<II")
BLANK_SIZE = _BLANK.size
_CHAIN = struct.Struct("<QQI")
_INDEX = struct.Struct("<QQII")
INDEX_RECORD_SIZE = _INDEX.size  # 24
MAX_ENTRY_BYTES = 0xFFFFFFFF


class StoreError(Exception):
    """Base of every storage error."""


class CorruptEntryError(StoreError):
    """A record whose bytes do not check out."""


class CorruptStoreError(StoreError):
    """Damage before the tail of the log: the store refuses to open rather than guess."""


class EntryTooLargeError(StoreError):
    pass


class IndexOutOfRangeError(StoreError):
    pass


@dataclass(frozen=True)
class EntryHeader:
    total_size: int
    index: int
    term: int
    position: int
    body_crc: int
    chain_crc: int

    @property
    def body_size(self) -> int:
        return self.total_size - HEADER_SIZE


@dataclass(frozen=True)
class IndexRecord:
    position: int
    term: int
    total_size: int
    chain_crc: int


def chain_crc(prev_chain_crc: int, index: int, term: int, body_crc: int) -> int:
    return zlib.crc32(_CHAIN.pack(index, term, body_crc), prev_chain_crc)


def encode_entry(
    index: int, term: int, position: int, body: bytes, prev_chain_crc: int
) -> tuple[bytes, EntryHeader]:
    total = HEADER_SIZE + len(body)
    if total > MAX_ENTRY_BYTES:
        raise EntryTooLargeError(f"entry of {total} bytes exceeds the format limit")
    body_crc = zlib.crc32(body)
    chain = chain_crc(prev_chain_crc, index, term, body_crc)
    head = _HEADER.pack(MAGIC, total, index, term, position, body_crc, chain, 0)[:-4]
    header = head + struct.pack("<I", zlib.crc32(head))
    return header + body, EntryHeader(total, index, term, position, body_crc, chain)


def decode_header(buf: bytes | memoryview) -> EntryHeader:
    if len(buf) < HEADER_SIZE:
        raise CorruptEntryError(f"header truncated ({len(buf)} of {HEADER_SIZE} bytes)")
    magic, total, index, term, position, body_crc, chain, header_crc = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise CorruptEntryError(f"bad magic 0x{magic:08x}")
    if zlib.crc32(bytes(buf[: HEADER_SIZE - 4])) != header_crc:
        raise CorruptEntryError("header checksum mismatch")
    if total < HEADER_SIZE:
        raise CorruptEntryError(f"impossible entry size {total}")
    return EntryHeader(total, index, term, position, body_crc, chain)


def is_blank(buf: bytes | memoryview) -> bool:
    return len(buf) >= 4 and struct.unpack_from("<I", buf, 0)[0] == BLANK_MAGIC


def encode_blank(size: int) -> bytes:
    return _BLANK.pack(BLANK_MAGIC, size)


def encode_index(rec: IndexRecord) -> bytes:
    return _INDEX.pack(rec.position, rec.term, rec.total_size, rec.chain_crc)


def decode_index(buf: bytes) -> IndexRecord | None:
    if len(buf) < INDEX_RECORD_SIZE or buf[:INDEX_RECORD_SIZE] == bytes(INDEX_RECORD_SIZE):
        return None
    return IndexRecord(*_INDEX.unpack_from(buf, 0))
