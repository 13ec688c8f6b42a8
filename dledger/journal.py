"""pysyncobj's journal, backed by our EntryStore: the Raft log *is* the store.

SyncObj addresses its journal by list position, not by Raft index, and reads it through
``len()``, ``[i]`` (negative too), slices and iteration. This adapter maps positions onto the
store without ever holding entries in RAM:

    position 0  -> the anchor (a no-op standing for everything retention removed), or
                   Raft index 1 on a log that never lost a prefix
    position p  -> Raft index first_visible + p

Entries are returned as ``LazyEntry`` objects whose command bytes are read from disk only when
``entry[0]`` is used (SyncObj reads ``[-1][1]`` many times per tick).

Durability (the journal's half of invariant 1):
- ``setCurrentTerm`` makes term and vote durable (``MetaStore.save_term_vote``) *before*
  returning: SyncObj sends the vote right after the call.
- Appends go to the page cache; the replica makes them durable (fdatasync, on its flusher thread)
  before anything that tells another party an entry is safe (see ``replica`` and
  ``syncobj_patch``).
- The commit index is a hint (a restarted node learns it again from the leader): it is written
  without fsync, at most once a second.

``skip_next_truncate`` is set by the follower-side fix in ``syncobj_patch`` to swallow the one
``deleteEntriesFrom`` call SyncObj makes for entries that do not conflict (defect 1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from dledger.log_store import LogStore
from dledger.meta_store import FileMetaStore, JournalError, MetaStore

log = logging.getLogger(__name__)

NO_OP = b"\x01"
_MEMBERSHIP_TYPE = 0x4D  # b"M": dledger.membership.MEMBERSHIP_TYPE

__all__ = ["NO_OP", "JournalError", "LazyEntry", "RaftJournal"]


class LazyEntry:
    """A journal entry ``(command, index, term)`` whose command and term are read on first use.

    The term too: SyncObj reads ``journal[0][1]`` (the first index) on every AppendEntries a
    follower takes, and reading the first entry's term there was an index-file pread per message.
    ``term=None``: read from the store when first asked for."""

    __slots__ = ("_command", "_store", "_term", "index")

    def __init__(self, store: LogStore | None, index: int, term: int | None, command: bytes | None = None):
        self._store = store
        self.index = index
        self._term = term
        self._command = command

    @property
    def term(self) -> int:
        if self._term is None:
            assert self._store is not None
            self._term = self._store.term_at(self.index)
        return self._term

    def command(self) -> bytes:
        if self._command is None:
            assert self._store is not None
            self._command = self._store.read(self.index).body
        return self._command

    def __getitem__(self, item: int) -> Any:
        if item == 1 or item == -2:
            return self.index
        if item == 2 or item == -1:
            return self.term
        if item == 0 or item == -3:
            return self.command()
        raise IndexError(item)

    def __len__(self) -> int:
        return 3

    def __iter__(self) -> Iterator[Any]:
        yield self.command()
        yield self.index
        yield self.term

    def __eq__(self, other: object) -> bool:
        try:
            return tuple(self) == tuple(other)  # type: ignore[arg-type]
        except TypeError:
            return NotImplemented

    def __hash__(self) -> int:
        return hash((self.index, self.term))

    def __repr__(self) -> str:
        return f"LazyEntry(index={self.index}, term={self.term})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (tuple, ((self.command(), self.index, self.term),))


class JournalSlice:
    """A lazy ``journal[a:b]``: itself sliceable, indexable, iterable and reversible."""

    def __init__(self, journal: RaftJournal, start: int, stop: int):
        self._journal = journal
        self._start = start
        self._stop = max(start, stop)

    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, item: int | slice) -> Any:
        n = len(self)
        if isinstance(item, slice):
            start, stop, step = item.indices(n)
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return JournalSlice(self._journal, self._start + start, self._start + stop)
        if item < 0:
            item += n
        if not 0 <= item < n:
            raise IndexError(item)
        return self._journal[self._start + item]

    def __iter__(self) -> Iterator[LazyEntry]:
        for pos in range(self._start, self._stop):
            yield self._journal[pos]

    def __reversed__(self) -> Iterator[LazyEntry]:
        for pos in range(self._stop - 1, self._start - 1, -1):
            yield self._journal[pos]

    def __bool__(self) -> bool:
        return len(self) > 0


class RaftJournal:
    """The object SyncObj uses as ``self.__raftLog`` (duck-typed ``pysyncobj.journal.Journal``)."""

    def __init__(self, store: LogStore, meta: MetaStore | str):
        self.store = store
        self._meta: MetaStore = FileMetaStore(meta) if isinstance(meta, str) else meta
        self._term, self._voted_for, self._commit_index = self._meta.load()
        self._commit_written = self._commit_index
        self.skip_next_truncate = False
        # Told the first index of every truncation before it happens (the simulator's checker
        # re-verifies from there), and after it (the replica: flushes in flight and acknowledgements
        # held for them no longer speak for the entries that replaced the cut ones).
        self.on_truncate: Callable[[int], None] | None = None
        self.after_truncate: Callable[[int], None] | None = None
        self.truncations_skipped = 0
        self.entries_truncated = 0
        # Told of every membership entry SyncObj appends (a follower's; the leader appends its own
        # through the replica): ``(index, term, body)``, after the entry is in the store.
        self.on_membership: Callable[[int, int, bytes], None] | None = None
        self.on_membership_undone: Callable[[int], None] | None = None  # its entry could not be stored

    @property
    def meta(self) -> MetaStore:
        return self._meta

    # -- positions <-> indexes --------------------------------------------------------------
    def _first_visible(self) -> int:
        anchor_index = self.store.anchor[0]
        return anchor_index if anchor_index > 0 else 1

    def __len__(self) -> int:
        anchor_index = self.store.anchor[0]
        if anchor_index > 0:
            return self.store.last_index - anchor_index + 1
        return self.store.last_index

    def entry_at_index(self, index: int) -> LazyEntry:
        anchor_index, anchor_term, _ = self.store.anchor
        if anchor_index > 0 and index == anchor_index:
            return LazyEntry(None, index, anchor_term, NO_OP)
        if index == self.store.last_index:
            return LazyEntry(self.store, index, self.store.last_term)
        if not self.store.first_index <= index <= self.store.last_index:
            self.store.term_at(index)  # raises IndexOutOfRangeError, as before (the term is lazy)
        return LazyEntry(self.store, index, None)

    def __getitem__(self, item: int | slice) -> Any:
        n = len(self)
        if isinstance(item, slice):
            start, stop, step = item.indices(n)
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return JournalSlice(self, start, stop)
        if item < 0:
            item += n
        if not 0 <= item < n:
            raise IndexError(item)
        return self.entry_at_index(self._first_visible() + item)

    # -- mutation (the replica's thread only) ------------------------------------------------
    def add(self, command: bytes, idx: int, term: int) -> None:
        if not command or command[0] != _MEMBERSHIP_TYPE or self.on_membership is None:  # one int compare
            self.store.append(idx, term, bytes(command))
            return
        # A membership is saved (durably) before its entry is written: a crash between the two
        # leaves a saved membership whose entry is missing, which a restart drops (the other
        # order would leave an entry in the log whose membership a restart never took).
        self.on_membership(idx, term, bytes(command))
        try:
            self.store.append(idx, term, bytes(command))
        except BaseException:
            if self.on_membership_undone is not None:
                self.on_membership_undone(idx)
            raise

    def clear(self) -> None:
        # SyncObj calls this only when loading a snapshot, which dledger never makes.
        raise JournalError("clear() is not supported: dledger never installs pysyncobj snapshots")

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        index = self._first_visible() + entryFrom
        if self.skip_next_truncate:
            self.skip_next_truncate = False
            self.truncations_skipped += 1
            return
        if index > self.store.last_index:
            return
        if self.on_truncate is not None:
            self.on_truncate(index)
        dropped = self.store.last_index - index + 1
        self.entries_truncated += dropped
        log.info("truncating %d entries from index %d (conflict with the leader)", dropped, index)
        self.store.truncate_suffix(index)
        if self.after_truncate is not None:
            self.after_truncate(index)

    def deleteEntriesTo(self, entryTo: int) -> None:
        # Only pysyncobj's log compaction calls this, and compaction is switched off.
        raise JournalError("deleteEntriesTo() is not supported: retention is done by the store")

    # -- Raft persistent state -------------------------------------------------------------
    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        self._commit_index = raftCommitIndex

    def getRaftCommitIndex(self) -> int:
        return min(self._commit_index, self.store.last_index)

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        voted = None if votedForNodeId is None else str(votedForNodeId)
        if term == self._term and voted == self._voted_for:
            return
        self._meta.save_term_vote(term, voted)  # durable on return: the vote is sent next
        self._term, self._voted_for = term, voted

    def getCurrentTerm(self) -> int:
        return self._term

    def getVotedForNodeId(self) -> str | None:
        return self._voted_for

    def onOneSecondTimer(self) -> None:
        if self._commit_index != self._commit_written:
            self._meta.save_commit_hint(self._commit_index)
            self._commit_written = self._commit_index

    def _destroy(self) -> None:
        self.onOneSecondTimer()

    def close(self) -> None:
        self.onOneSecondTimer()
        self.store.close()
