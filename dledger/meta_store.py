"""Raft's persistent metadata beside the log: current term and vote (durable), commit index (a hint).

- ``save_term_vote`` is durable when it returns: a node must never forget a vote it sent (two
  votes in one term can elect two leaders). ``FileMetaStore`` writes ``raft_term`` atomically
  with fsync; ``MemoryMetaStore`` keeps a durable copy that a crash returns to.
- ``save_commit_hint`` is not synced: a restarted node learns the commit index from the leader
  again. Using a stale or a newer hint is safe: the journal caps it at the log's last index, and
  entries up to it are a prefix of what the node held when it was committed.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import struct
import zlib
from typing import Protocol

from dledger.durable import replace_reserving

log = logging.getLogger("dledger.journal")

_TERM_FILE = "raft_term"
_COMMIT_FILE = "raft_commit"
_MEMBERSHIP_FILE = "membership"
TERM_RECORD = struct.Struct("<QH")  # term, length of votedFor, then votedFor utf-8, then crc32
COMMIT_RECORD = struct.Struct("<QI")  # commit index, crc32


class JournalError(RuntimeError):
    """The journal's durable metadata is unreadable."""


class MetaStore(Protocol):
    def load(self) -> tuple[int, str | None, int]:
        """(current term, voted for, commit index hint)."""
        ...

    def save_term_vote(self, term: int, voted_for: str | None) -> None: ...

    def save_commit_hint(self, commit_index: int) -> None: ...

    def save_membership(self, record: bytes) -> None:
        """The group's memberships as the log set them (``membership.MembershipHistory``): durable
        on return (a restart must not fall back to dLegerPeers once retention dropped the entry)."""
        ...

    def load_membership(self) -> bytes | None: ...


class FileMetaStore:
    def __init__(self, meta_dir: str):
        self._dir = meta_dir
        self._hint_skipped = False
        os.makedirs(meta_dir, exist_ok=True)

    def load(self) -> tuple[int, str | None, int]:
        term, vote = self._load_term()
        return term, vote, self._load_commit()

    def save_term_vote(self, term: int, voted_for: str | None) -> None:
        raw_vote = (voted_for or "").encode()
        payload = TERM_RECORD.pack(term, len(raw_vote)) + raw_vote
        # With a spare beside it (replace_reserving): a vote is recorded on a full file system too.
        replace_reserving(os.path.join(self._dir, _TERM_FILE), payload + struct.pack("<I", zlib.crc32(payload)))

    def save_commit_hint(self, commit_index: int) -> None:
        payload = struct.pack("<Q", commit_index)
        path = os.path.join(self._dir, _COMMIT_FILE)
        # Rewritten in place (it is a hint: a torn record fails its crc and reads as 0), so it needs
        # no free space once it exists; a hint that finds no room is skipped, never fatal.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.pwrite(fd, COMMIT_RECORD.pack(commit_index, zlib.crc32(payload)), 0)
            finally:
                os.close(fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise
            if not self._hint_skipped:
                log.warning("%s: no room to record the commit-index hint (skipped until there is)", path)
            self._hint_skipped = True
        else:
            self._hint_skipped = False

    def save_membership(self, record: bytes) -> None:
        replace_reserving(os.path.join(self._dir, _MEMBERSHIP_FILE), record)

    def load_membership(self) -> bytes | None:
        try:
            with open(os.path.join(self._dir, _MEMBERSHIP_FILE), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _load_term(self) -> tuple[int, str | None]:
        path = os.path.join(self._dir, _TERM_FILE)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return 0, None
        if len(raw) < TERM_RECORD.size + 4:
            raise JournalError(f"{path}: truncated term/vote file ({len(raw)} bytes)")
        payload, (crc,) = raw[:-4], struct.unpack("<I", raw[-4:])
        if zlib.crc32(payload) != crc:
            raise JournalError(f"{path}: term/vote checksum mismatch")
        term, vote_len = TERM_RECORD.unpack_from(payload, 0)
        vote = payload[TERM_RECORD.size : TERM_RECORD.size + vote_len].decode()
        return term, (vote or None)

    def _load_commit(self) -> int:
        path = os.path.join(self._dir, _COMMIT_FILE)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return 0
        if len(raw) != COMMIT_RECORD.size:
            log.warning("%s: ignoring a damaged commit-index hint", path)
            return 0
        commit, crc = COMMIT_RECORD.unpack(raw)
        if zlib.crc32(struct.pack("<Q", commit)) != crc:
            log.warning("%s: ignoring a commit-index hint with a bad checksum", path)
            return 0
        return int(commit)


class MemoryMetaStore:
    """In memory; ``crash_image`` is what a restart finds (the durable copy)."""

    def __init__(self) -> None:
        self.term = 0
        self.voted_for: str | None = None
        self.commit_hint = 0
        self.membership: bytes | None = None  # durable when saved (fsynced in the file store)
        self._durable: tuple[int, str | None] = (0, None)
        self._durable_commit = 0
        # The simulator's planted "vote not durable" bug sets this: votes reach memory only.
        self.sync_votes = True

    def load(self) -> tuple[int, str | None, int]:
        return self.term, self.voted_for, self.commit_hint

    def save_term_vote(self, term: int, voted_for: str | None) -> None:
        self.term, self.voted_for = term, voted_for
        if self.sync_votes:
            self._durable = (term, voted_for)

    def sync(self) -> None:
        """Make everything durable (a later fsync of the file, in the planted-bug model)."""
        self._durable = (self.term, self.voted_for)

    def save_commit_hint(self, commit_index: int) -> None:
        self._durable_commit, self.commit_hint = self.commit_hint, commit_index

    def save_membership(self, record: bytes) -> None:
        self.membership = record

    def load_membership(self) -> bytes | None:
        return self.membership

    def crash_image(self, rng: random.Random | None = None) -> MemoryMetaStore:
        image = MemoryMetaStore()
        image.membership = self.membership
        image.term, image.voted_for = self._durable
        image._durable = self._durable
        # The hint is written without fsync: the new value may or may not have reached the disk.
        keep_new = rng.random() < 0.5 if rng is not None else False
        image.commit_hint = self.commit_hint if keep_new else self._durable_commit
        image._durable_commit = image.commit_hint
        image.sync_votes = self.sync_votes
        return image
