"""Recovery of the entry store on open, and its anchor file (see ``entry_store`` for the layout).

Recovery fully scans only the last segment. Earlier segments are checked at their boundaries
(first header, last index record and header, file end) and scanned only when these disagree. A
torn tail of the last segment (an incomplete or bad record with no valid header after it) is cut
off with a WARNING; any other damage raises CorruptStoreError naming file and offset. Index
records are derived: rebuilt from the segments where missing, short or stale. A retention or
reset that stopped after writing the anchor is finished (files below the anchor's floor go).

``StoreRecovery`` is a mixin of ``EntryStore``: it works on the store's tables while the store is
being opened, before any reader or writer can see it.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING

from dledger.clock import Clock
from dledger.durable import replace_reserving
from dledger.entry_codec import (
    ANCHOR_FILE,
    BLANK_SIZE,
    HEADER_SIZE,
    INDEX_RECORD_SIZE,
    AnchorFormatError,
    CorruptEntryError,
    EntryHeader,
    IndexRecord,
    check_record,
    decode_anchor,
    decode_header,
    decode_index_record,
    encode_anchor,
    follows,
    is_blank,
    pack_index_record,
    valid_header_after,
)
from dledger.log_store import CorruptStoreError
from dledger.segment_files import (
    SCAN_CHUNK_BYTES,
    Chunks,
    Segment,
    SegmentFile,
    age_on_filesystem_clock,
    file_name,
    numbered,
    pwrite_all,
)

log = logging.getLogger("dledger.entry_store")

RANGE_CHUNK_RECORDS = 4096


class StoreRecovery:
    # The store's tables (defined by EntryStore.__init__).
    path: str
    index_records_per_file: int
    _log_dir: str
    _index_dir: str
    _lock: threading.Lock
    _segments: list[Segment]
    _starts: list[int]
    _index_files: dict[int, SegmentFile]
    _dirty_files: set[SegmentFile]
    _dirty_dirs: set[str]
    _anchor: tuple[int, int, int]
    _floor_position: int
    _last: tuple[int, int, int]
    _clock: Clock

    if TYPE_CHECKING:

        @staticmethod
        def _open_file(path: str, flags: int = 0) -> SegmentFile: ...

        def _retire(self, f: SegmentFile) -> None: ...

        def _index_base(self, index: int) -> int: ...

        def _index_slot(self, index: int) -> int: ...

        def _index_file_for_write(self, base: int) -> SegmentFile: ...

        def flush(self) -> None: ...

    # -- anchor file ----------------------------------------------------------------------------
    def _write_anchor(self, index: int, term: int, chain: int, floor: int) -> None:
        path = os.path.join(self.path, ANCHOR_FILE)
        # With a spare beside it: retention can replace the anchor (and so free segments) on a
        # full file system.
        replace_reserving(path, encode_anchor(index, term, chain, floor), 0o644)

    def _read_anchor(self) -> tuple[int, int, int, int] | None:
        path = os.path.join(self.path, ANCHOR_FILE)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        try:
            return decode_anchor(raw)
        except AnchorFormatError as exc:
            raise CorruptStoreError(f"{path}: {exc}", path, 0) from None

    # -- recovery -------------------------------------------------------------------------------
    def _recover(self) -> None:
        os.makedirs(self._log_dir, exist_ok=True)
        os.makedirs(self._index_dir, exist_ok=True)
        anchor_path = os.path.join(self.path, ANCHOR_FILE)
        # anchor.tmp, if any, is the spare of replace_reserving (or an anchor write that never
        # reached its rename): never read, rewritten in place by the next anchor write.
        anchor = self._read_anchor()
        starts = numbered(self._log_dir)
        if anchor is None and starts:
            log.warning("%s is missing: the log must start at index 1", anchor_path)
        a_index, a_term, a_chain, floor = anchor if anchor is not None else (0, 0, 0, 0)
        self._anchor = (a_index, a_term, a_chain)
        self._last = self._anchor
        self._floor_position = floor
        self._open_segments([s for s in starts if s >= floor], [s for s in starts if s < floor])
        self._open_index_files(a_index)
        prev = self._anchor
        for k, seg in enumerate(self._segments):
            if k == len(self._segments) - 1:
                prev = self._scan(seg, prev, tail=True)
                continue
            agreed = self._boundaries_agree(seg, self._segments[k + 1], prev)
            if agreed is None:
                log.info("%s: index and segment boundaries disagree; scanning it", seg.file.path)
                agreed = self._scan(seg, prev, tail=False)
            prev = agreed
        self._last = prev
        self._trim_index_after(prev[0])
        for seg in self._segments:
            if seg.sealed or seg is not self._segments[-1]:
                seg.sealed = True
                seg.sealed_wall_s = self._clock.wall() - age_on_filesystem_clock(seg.file.fd)
        if anchor is None:
            self._write_anchor(a_index, a_term, a_chain, floor)
        self.flush()

    def _open_segments(self, starts: list[int], below_floor: list[int]) -> None:
        for start in below_floor:  # a retention or reset that stopped after writing the anchor
            log.info(
                "removing segment %s below the anchor's floor %d", file_name(start), self._floor_position
            )
            os.unlink(os.path.join(self._log_dir, file_name(start)))
            self._dirty_dirs.add(self._log_dir)
        for start in starts:
            f = self._open_file(os.path.join(self._log_dir, file_name(start)))
            self._segments.append(Segment(start, f, os.fstat(f.fd).st_size, 0))
            self._starts.append(start)
        for seg, nxt in zip(self._segments, self._segments[1:], strict=False):
            if seg.start + seg.size > nxt.start:
                raise CorruptStoreError(
                    f"{seg.file.path} at offset {nxt.start - seg.start}: runs into the next segment "
                    f"{nxt.file.path}",
                    seg.file.path,
                    nxt.start - seg.start,
                )
            if seg.size == 0:
                raise CorruptStoreError(
                    f"{seg.file.path} at offset 0: empty segment before the last one", seg.file.path, 0
                )

    def _open_index_files(self, anchor_index: int) -> None:
        per_file = self.index_records_per_file
        for base in numbered(self._index_dir):
            path = os.path.join(self._index_dir, file_name(base))
            if base % per_file:
                raise CorruptStoreError(
                    f"{path} at offset 0: name is not a multiple of index_records_per_file={per_file} "
                    "(was the setting changed? delete the index directory to rebuild it)",
                    path,
                    0,
                )
            if base + per_file - 1 <= anchor_index:  # covers removed entries only
                os.unlink(path)
                self._dirty_dirs.add(self._index_dir)
                continue
            self._index_files[base] = self._open_file(path)

    def _header_at(self, seg: Segment, offset: int) -> EntryHeader:
        return decode_header(os.pread(seg.file.fd, HEADER_SIZE, offset))

    def _record_at(self, index: int) -> IndexRecord:
        f = self._index_files.get(self._index_base(index))
        if f is None:
            raise CorruptEntryError(f"no index file for {index}")
        return decode_index_record(os.pread(f.fd, INDEX_RECORD_SIZE, self._index_slot(index)))

    def _index_covers(self, first: int, last: int) -> bool:
        per_file = self.index_records_per_file
        for base in range(self._index_base(first), self._index_base(last) + 1, per_file):
            f = self._index_files.get(base)
            if f is None:
                return False
            if os.fstat(f.fd).st_size < (min(last, base + per_file - 1) - base + 1) * INDEX_RECORD_SIZE:
                return False
        return True

    def _boundaries_agree(
        self, seg: Segment, nxt: Segment, prev: tuple[int, int, int]
    ) -> tuple[int, int, int] | None:
        """The last entry of a segment that is not the last one, taken from the index when its first
        header, first and last index records, last header and file end agree; else None."""
        try:
            head = self._header_at(seg, 0)
            if follows(head, seg.start, prev) is not None:
                return None
            last = self._header_at(nxt, 0).index - 1
            if last < head.index or not self._index_covers(head.index, last):
                return None
            if self._record_at(head.index) != IndexRecord(
                seg.start, head.term, head.total_size, head.chain_crc
            ):
                return None
            rec = self._record_at(last)
            offset = rec.position - seg.start
            if not 0 <= offset <= seg.size - rec.total_size:
                return None
            tail = self._header_at(seg, offset)
            if (tail.index, tail.term, tail.position, tail.total_size, tail.chain_crc) != (
                last,
                rec.term,
                rec.position,
                rec.total_size,
                rec.chain_crc,
            ):
                return None
            end = offset + tail.total_size
            if seg.size != end and not (
                seg.size == end + BLANK_SIZE and is_blank(os.pread(seg.file.fd, BLANK_SIZE, end))
            ):
                return None
        except CorruptEntryError:
            return None
        seg.first_index, seg.last_index, seg.sealed = head.index, last, True
        return last, tail.term, tail.chain_crc

    def _scan(self, seg: Segment, prev: tuple[int, int, int], tail: bool) -> tuple[int, int, int]:
        """Verify every record of ``seg`` and rewrite index records that differ. In the last
        segment (``tail``) a torn end is cut off; any other damage raises CorruptStoreError."""
        path = seg.file.path
        chunks = Chunks(seg.file.fd)
        seg.first_index = prev[0] + 1
        records: list[bytes] = []
        offset = 0
        while offset < seg.size:
            rest = seg.size - offset
            if is_blank(chunks.view(offset, BLANK_SIZE)):
                if rest > BLANK_SIZE:
                    self._bad_record(
                        seg, offset + BLANK_SIZE, f"{rest - BLANK_SIZE} byte(s) after BLANK", tail
                    )
                seg.sealed = True
                break
            head, problem = check_record(chunks, offset, rest)
            if head is None:
                self._bad_record(seg, offset, problem, tail)
                break
            # Header and body verify, so we wrote this record: a gap here is damage, not a tear.
            gap = follows(head, seg.start + offset, prev)
            if gap is not None:
                raise CorruptStoreError(f"{path} at offset {offset}: {gap}", path, offset)
            records.append(pack_index_record(head.position, head.term, head.total_size, head.chain_crc))
            if len(records) == RANGE_CHUNK_RECORDS:
                self._rewrite_records(head.index - len(records) + 1, records)
                records = []
            prev = (head.index, head.term, head.chain_crc)
            offset += head.total_size
        self._rewrite_records(prev[0] - len(records) + 1, records)
        seg.last_index = prev[0]
        return prev

    def _bad_record(self, seg: Segment, offset: int, problem: str, tail: bool) -> None:
        path = seg.file.path
        if not tail:
            raise CorruptStoreError(
                f"{path} at offset {offset}: {problem} (not the last segment, so not a torn write)",
                path,
                offset,
            )
        if valid_header_after(seg.file.fd, seg.size, offset + 1, SCAN_CHUNK_BYTES):
            raise CorruptStoreError(
                f"{path} at offset {offset}: {problem}; valid records follow it, so this is not a torn "
                "tail. Refusing to open: restore this replica from a healthy one.",
                path,
                offset,
            )
        log.warning(
            "torn tail in %s at offset %d (%s): truncating %d byte(s)",
            path,
            offset,
            problem,
            seg.size - offset,
        )
        os.ftruncate(seg.file.fd, offset)
        os.fdatasync(seg.file.fd)
        seg.size = offset

    def _rewrite_records(self, first: int, records: list[bytes]) -> None:
        """Write index records rebuilt from the log, skipping those already on disk."""
        k = 0
        while k < len(records):
            index = first + k
            base = self._index_base(index)
            n = min(len(records) - k, base + self.index_records_per_file - index)
            chunk = b"".join(records[k : k + n])
            f = self._index_file_for_write(base)
            if os.pread(f.fd, len(chunk), self._index_slot(index)) != chunk:
                pwrite_all(f.fd, [chunk], self._index_slot(index))
                self._dirty_files.add(f)
            k += n

    def _trim_index_after(self, last_index: int) -> None:
        """Drop index records of entries past ``last_index`` (truncated or torn)."""
        base = self._index_base(last_index + 1)
        for b in [b for b in self._index_files if b > base]:
            doomed = self._index_files.pop(b)
            self._retire(doomed)
            os.unlink(doomed.path)
            self._dirty_dirs.add(self._index_dir)
        f = self._index_files.get(base)
        keep = self._index_slot(last_index + 1)
        if f is not None and os.fstat(f.fd).st_size > keep:
            os.ftruncate(f.fd, keep)
            self._dirty_files.add(f)
