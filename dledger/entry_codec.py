"""The on-disk record formats of the entry store: entry headers, padding and index records.

Pure functions over bytes (the one exception, ``valid_header_after``, preads a file it is given). All
integers are little-endian.

Entry (one Raft log entry, never split across segment files)::

    0       4            8        16       24          32         36          40           44
    +-------+------------+--------+--------+-----------+----------+-----------+------------+------
    | magic | total_size | index  | term   | position  | body_crc | chain_crc | header_crc | body
    | u32   | u32        | u64    | u64    | u64       | u32      | u32       | u32        | ...
    +-------+------------+--------+--------+-----------+----------+-----------+------------+------

- ``magic`` is ``MAGIC``; its low byte is the format version (01).
- ``total_size`` counts header and body; ``position`` is the entry's global byte position in the
  replica's log (segment start + offset), so a record read from the wrong place is detected.
- ``body_crc = crc32(body)``; ``header_crc = crc32(first 40 header bytes)``.
- ``chain_crc = crc32(pack('<QQI', index, term, body_crc), prev_chain_crc)`` with the chain CRC of
  the entry before (0 before the first entry ever). Two replicas that agree on one entry's chain
  CRC agree on the whole prefix up to it.

Padding: when the next entry does not fit the rest of a segment, the writer puts ``BLANK_MAGIC``
(4 bytes, if there is room for them) after the last entry and starts a new segment. A reader
that meets it, or the end of a non-last segment, continues with the next segment.

Index record (fixed width, one per Raft index, slot ``index - file_base``)::

    +----------+------+------------+-----------+
    | position | term | total_size | chain_crc |
    | u64      | u64  | u32        | u32       |     24 bytes; all zero = no record
    +----------+------+------------+-----------+

Anchor (``store/anchor``: where the log starts after retention or a reset), replaced atomically::

    magic u32 | version u16 | reserved u16 | index u64 | term u64 | chain_crc u32 | floor_position u64 | crc32 u32
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from typing import Protocol

MAGIC = 0xD1ED6E01
BLANK_MAGIC = 0xD1ED0B1A

_HEADER = struct.Struct("<IIQQQIII")
_HEADER_CRC_SPAN = _HEADER.size - 4
_CHAIN = struct.Struct("<QQI")
_MAGIC_ONLY = struct.Struct("<I")
_INDEX_RECORD = struct.Struct("<QQII")

HEADER_SIZE = _HEADER.size  # 44
BLANK_SIZE = _MAGIC_ONLY.size  # 4
INDEX_RECORD_SIZE = _INDEX_RECORD.size  # 24
MAX_TOTAL_SIZE = 0xFFFFFFFF
MAGIC_BYTES = _MAGIC_ONLY.pack(MAGIC)
BLANK_BYTES = _MAGIC_ONLY.pack(BLANK_MAGIC)

assert HEADER_SIZE == 44 and INDEX_RECORD_SIZE == 24


class StoreError(Exception):
    """Base of every error the entry store raises on purpose; ``code`` is stable for users."""

    code = "STORE_ERROR"


class CorruptEntryError(StoreError):
    """A record whose bytes do not verify (magic, CRCs, size, or not the record expected)."""

    code = "STORE_CORRUPT_ENTRY"


@dataclass(frozen=True, slots=True)
class EntryHeader:
    magic: int
    total_size: int
    index: int
    term: int
    position: int
    body_crc: int
    chain_crc: int
    header_crc: int

    @property
    def body_size(self) -> int:
        return self.total_size - HEADER_SIZE


@dataclass(frozen=True, slots=True)
class IndexRecord:
    position: int
    term: int
    total_size: int
    chain_crc: int


def chain_crc(prev: int, index: int, term: int, body_crc: int) -> int:
    """The chain CRC of entry ``index`` given the chain CRC of the entry before it."""
    return zlib.crc32(_CHAIN.pack(index, term, body_crc), prev)


def encode_header(index: int, term: int, position: int, body: bytes, prev_chain_crc: int) -> EntryHeader:
    """The header ``body`` gets as entry ``index`` at ``position`` (``pack_header`` packs it)."""
    total_size = HEADER_SIZE + len(body)
    if total_size > MAX_TOTAL_SIZE:
        raise ValueError(f"entry of {total_size} bytes does not fit the u32 size field")
    body_crc = zlib.crc32(body)
    chain = chain_crc(prev_chain_crc, index, term, body_crc)
    head = _HEADER.pack(MAGIC, total_size, index, term, position, body_crc, chain, 0)[:_HEADER_CRC_SPAN]
    return EntryHeader(MAGIC, total_size, index, term, position, body_crc, chain, zlib.crc32(head))


def pack_header(header: EntryHeader) -> bytes:
    """The 44 header bytes of ``header``."""
    h = header
    return _HEADER.pack(
        h.magic, h.total_size, h.index, h.term, h.position, h.body_crc, h.chain_crc, h.header_crc
    )


def encode_entry(
    index: int, term: int, position: int, body: bytes, prev_chain_crc: int
) -> tuple[bytes, EntryHeader]:
    """The full record (header + body) and its header."""
    header = encode_header(index, term, position, body, prev_chain_crc)
    return pack_header(header) + body, header


def decode_header(buf: bytes | bytearray | memoryview, offset: int = 0) -> EntryHeader:
    """Decode and verify the header at ``buf[offset:]``; raises CorruptEntryError."""
    if len(buf) - offset < HEADER_SIZE:
        raise CorruptEntryError(f"short header: {len(buf) - offset} of {HEADER_SIZE} bytes")
    fields = _HEADER.unpack_from(buf, offset)
    magic, total_size = fields[0], fields[1]
    if magic != MAGIC:
        raise CorruptEntryError(f"bad magic 0x{magic:08x} (expected 0x{MAGIC:08x})")
    header_crc = zlib.crc32(memoryview(buf)[offset : offset + _HEADER_CRC_SPAN])
    if header_crc != fields[7]:
        raise CorruptEntryError(f"header crc 0x{fields[7]:08x} does not match computed 0x{header_crc:08x}")
    if total_size < HEADER_SIZE:
        raise CorruptEntryError(f"absurd total_size {total_size} (< header size {HEADER_SIZE})")
    return EntryHeader(*fields)


def verify_body(header: EntryHeader, body: bytes | bytearray | memoryview) -> None:
    """Raise CorruptEntryError unless ``body`` is the body ``header`` describes."""
    if len(body) != header.body_size:
        raise CorruptEntryError(
            f"entry {header.index}: body is {len(body)} bytes, header says {header.body_size}"
        )
    crc = zlib.crc32(body)
    if crc != header.body_crc:
        raise CorruptEntryError(
            f"entry {header.index}: body crc 0x{crc:08x} does not match header 0x{header.body_crc:08x}"
        )


def is_blank(buf: bytes | bytearray | memoryview, offset: int = 0) -> bool:
    """True when the padding marker starts at ``buf[offset:]``."""
    return len(buf) - offset >= BLANK_SIZE and _MAGIC_ONLY.unpack_from(buf, offset)[0] == BLANK_MAGIC


def encode_index_record(record: IndexRecord) -> bytes:
    return _INDEX_RECORD.pack(record.position, record.term, record.total_size, record.chain_crc)


def pack_index_record(position: int, term: int, total_size: int, chain: int) -> bytes:
    return _INDEX_RECORD.pack(position, term, total_size, chain)


def decode_index_record(buf: bytes | bytearray | memoryview, offset: int = 0) -> IndexRecord:
    """Decode one record; an all-zero or short record raises CorruptEntryError (no record)."""
    if len(buf) - offset < INDEX_RECORD_SIZE:
        raise CorruptEntryError(f"short index record: {len(buf) - offset} of {INDEX_RECORD_SIZE} bytes")
    position, term, total_size, chain = _INDEX_RECORD.unpack_from(buf, offset)
    if total_size < HEADER_SIZE:
        raise CorruptEntryError(f"index record holds no entry (total_size {total_size})")
    return IndexRecord(position, term, total_size, chain)


# -- checking records found in a segment file (the store's recovery and the audit's reader) ----------
class RecordView(Protocol):
    def view(self, offset: int, size: int) -> memoryview: ...


def check_record(chunks: RecordView, offset: int, rest: int) -> tuple[EntryHeader | None, str]:
    """The header of a record whose header and body verify, or (None, what is wrong)."""
    if rest < HEADER_SIZE:
        return None, f"incomplete header ({rest} of {HEADER_SIZE} bytes)"
    try:
        head = decode_header(chunks.view(offset, HEADER_SIZE))
    except CorruptEntryError as exc:
        return None, str(exc)
    if head.total_size > rest:
        return None, f"incomplete record ({rest} of {head.total_size} bytes)"
    if zlib.crc32(chunks.view(offset + HEADER_SIZE, head.body_size)) != head.body_crc:
        return None, f"body crc mismatch in entry {head.index}"
    return head, ""


def follows(head: EntryHeader, position: int, prev: tuple[int, int, int]) -> str | None:
    """None when ``head`` (found at ``position``) is the entry after ``prev``; else why not."""
    p_index, p_term, p_chain = prev
    if head.index != p_index + 1:
        return f"entry {head.index} where {p_index + 1} should follow"
    if head.position != position:
        return f"entry {head.index} says position {head.position}, found at {position}"
    if head.term < p_term:
        return f"entry {head.index} has term {head.term} after term {p_term}"
    if head.chain_crc != chain_crc(p_chain, head.index, head.term, head.body_crc):
        return f"entry {head.index}: chain crc 0x{head.chain_crc:08x} does not follow entry {p_index}"
    return None


def valid_header_after(fd: int, size: int, offset: int, chunk_bytes: int) -> bool:
    """Is there a well-formed entry header anywhere in [offset, size)?"""
    while offset < size:
        data = os.pread(fd, min(chunk_bytes + HEADER_SIZE, size - offset), offset)
        at = data.find(MAGIC_BYTES)
        while at != -1:
            try:
                decode_header(data, at)
                return True
            except CorruptEntryError:
                at = data.find(MAGIC_BYTES, at + 1)
        offset += chunk_bytes
    return False


# -- the anchor record -------------------------------------------------------------------------------
ANCHOR_FILE = "anchor"
_ANCHOR = struct.Struct("<IHHQQIQ")  # magic, version, reserved, index, term, chain_crc, floor_position
_ANCHOR_CRC = struct.Struct("<I")
ANCHOR_MAGIC = 0xD1ED0A1C
ANCHOR_VERSION = 1
ANCHOR_BYTES = _ANCHOR.size + _ANCHOR_CRC.size


class AnchorFormatError(ValueError):
    """The bytes are not an anchor record this version writes (damaged, or an unknown format)."""


def encode_anchor(index: int, term: int, chain_crc: int, floor_position: int) -> bytes:
    """The anchor record: the log holds ``index + 1 ..``, the entry at ``index`` had ``term`` and
    ``chain_crc``; segments below ``floor_position`` are gone."""
    payload = _ANCHOR.pack(ANCHOR_MAGIC, ANCHOR_VERSION, 0, index, term, chain_crc, floor_position)
    return payload + _ANCHOR_CRC.pack(zlib.crc32(payload))


def decode_anchor(raw: bytes) -> tuple[int, int, int, int]:
    """``(index, term, chain_crc, floor_position)`` of an anchor record; ``AnchorFormatError``
    when it is damaged or of an unknown format."""
    if len(raw) != ANCHOR_BYTES or zlib.crc32(raw[: _ANCHOR.size]) != _ANCHOR_CRC.unpack_from(raw, _ANCHOR.size)[0]:
        raise AnchorFormatError(f"anchor record is damaged ({len(raw)} bytes)")
    magic, version, _, index, term, chain, floor = _ANCHOR.unpack_from(raw)
    if magic != ANCHOR_MAGIC or version != ANCHOR_VERSION:
        raise AnchorFormatError(f"unknown anchor format 0x{magic:08x} v{version}")
    return index, term, chain, floor
