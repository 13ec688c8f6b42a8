"""The records dledger's replicated log shares with its callers: settings, results, errors."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from dledger import command_codec
from dledger.log_store import Entry, LogReader


# -- errors -----------------------------------------------------------------------------------
class DLedgerError(Exception):
    code = "DLEDGER_ERROR"


class NotLeaderError(DLedgerError):
    code = "NOT_LEADER"

    def __init__(self, leader_id: str | None):
        super().__init__(f"this node is not the leader (leader: {leader_id or 'unknown'})")
        self.leader_id = leader_id

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.leader_id,), self.__dict__


class TransferNotReadyError(DLedgerError):
    """A leadership transfer was refused because its target has not caught up with the leader's
    log yet (it may be retried once it has); other refusals are plain ``DLedgerError``."""

    code = "TRANSFER_NOT_READY"


class AppendFailedError(DLedgerError):
    """The entry is known NOT to be committed (it was overwritten by a newer leader)."""

    code = "APPEND_FAILED"


class AppendTimeoutError(DLedgerError):
    """No answer within the deadline: the entry may or may not commit later."""

    code = "APPEND_TIMEOUT"


class BusyError(DLedgerError):
    code = "BUSY"


class DiskFullError(DLedgerError):
    code = "DISK_FULL"


class EntryTooLargeError(DLedgerError):
    code = "ENTRY_TOO_LARGE"


class NotCommittedError(DLedgerError):
    code = "NOT_COMMITTED"


class StateMachineError(DLedgerError):
    """The state machine raised while applying committed entries (``StateMachine.apply``): a bug or
    an environment failure (disk, memory) the replica cannot decide the same way as its peers. The
    replica fails stop with it (``DLedgerNode.fatal``; the process exits 70): applying on would
    diverge from the group.
    A record the state machine can decide to be inapplicable is *refused* instead (``Refused``)."""

    def __init__(self, first_index: int, last_index: int, cause: BaseException):
        super().__init__(
            f"the state machine raised applying entries {first_index}..{last_index}: {cause!r:.300}; "
            "this replica stops (a bug or a local failure, never a bad record: those are refused)"
        )
        self.first_index = first_index
        self.last_index = last_index
        self.cause = cause

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from what it was made of, not from ``args`` (the message): a simulator worker
        # hands its failure to the parent by pickling it, and a copy must keep the indexes.
        return type(self), (self.first_index, self.last_index, self.cause), self.__dict__


class EntryRemovedError(DLedgerError):
    """The entry was removed by retention (or lies before this replica's anchor)."""

    code = "ENTRY_REMOVED"


# -- settings and results ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RaftSettings:
    group: str
    self_id: str
    peers: dict[str, str]  # peer id -> raft address host:port, self included
    data_dir: str
    password: str
    flush_policy: str = "sync"  # 'sync' | 'async'
    flush_interval_ms: int = 10
    segment_bytes: int = 1 << 30
    election_min_ms: int = 300
    election_max_ms: int = 600
    heartbeat_ms: int = 50
    stepdown_ms: int = 1000
    connection_timeout_ms: int = 1500
    connection_retry_ms: int = 300
    max_entry_bytes: int = (4 << 20) + (64 << 10)
    entry_target_bytes: int = 256 << 10
    max_pending_bytes: int = 64 << 20
    retention_hours: float = 72.0
    disk_max_used_ratio: float = 0.75
    disk_warning_ratio: float = 0.90
    retention_check_ms: int = 10_000
    live_follower_s: float = 10.0
    password_previous: str | None = None  # also accepted from peers (rolling password change)
    replication_batch_bytes: int = 1 << 20  # entries per AppendEntries message, by body bytes
    # How this node reaches each peer's Raft port (defaults to ``peers``; chaos tests route
    # pairs through proxies by giving each node its own view).
    raft_addresses: dict[str, str] | None = None
    # The cluster this replica belongs to (``clusterId``, made by ``dledger-cluster up``); None: a
    # legacy replica without one. Recorded in the data directory and checked in peer handshakes.
    cluster_id: str | None = None
    # This replica joins its group as a learner (issue 27): it receives the log and counts for
    # nothing until a membership change promotes it; ``peers`` are the members it first contacts.
    learner: bool = False

    def view(self) -> dict[str, str]:
        return dict(self.raft_addresses or self.peers)


class BodyLocation(NamedTuple):
    """Where one appended body lives: its Raft entry, its place in the entry, its log position.

    A named tuple, not a dataclass: one is made per acknowledged message on the replica's thread,
    and a frozen dataclass costs three times as much to build."""

    index: int  # type: ignore[assignment]  # shadows tuple.index, which nobody calls on it
    term: int
    slot: int
    position: int
    size: int
    result: Any = None  # what the state machine's apply produced for this body, if anything


@dataclasses.dataclass(frozen=True)
class CommittedEntry:
    index: int
    term: int
    position: int
    chain_crc: int
    bodies: list[tuple[int, bytes]]  # (log position of the body, body); [] for a no-op


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    """What ``StateMachine.apply`` answers for a body it refused to apply: nothing of it was
    applied. A refusal is decided from the body and the replicated state alone, so every replica
    refuses the same body alike; the append that wrote it resolves with this as the body's
    ``BodyLocation.result`` (its caller answers with ``code``, not with a success)."""

    code: str
    reason: str


@dataclasses.dataclass(frozen=True)
class RoleChange:
    role: str
    term: int
    leader_id: str | None
    at: float


class StateMachine(Protocol):
    """Applied on the replica's thread (the loop that serves clients), in log order; keep it fast:
    it runs between client requests. It owns its durability (fsync off that thread).

    ``apply`` may return, per entry, one result per body (what applying it produced, e.g. the
    queue offset a message got); the append that wrote the entry resolves with them
    (``BodyLocation.result``). ``None`` when it has nothing to report.

    Applying never raises for a bad body: a body that cannot be applied is refused (its result is a
    ``Refused``), decided from the body and the replicated state only, so that every replica
    decides alike and keeps going. An exception out of ``apply`` means the state machine is broken
    (a bug, a failing disk): the replica stops loudly (``StateMachineError``).
    """

    def applied_index(self) -> int: ...

    def durable_applied_index(self) -> int:
        """Where applying resumes after a crash: retention never removes an entry above it."""
        ...

    def checkpoint(self) -> None:
        """Called on the replica's thread before each retention check: a chance to make what is
        applied durable when no new entries arrive (an idle state machine would otherwise hold
        retention back for ever)."""
        ...

    def apply(self, entries: Sequence[CommittedEntry]) -> Sequence[Sequence[Any] | None] | None: ...

    def on_install(self, anchor_index: int) -> None: ...


def to_committed(entry: Entry, store: LogReader) -> CommittedEntry:
    """A stored entry as the state machine sees it: its bodies with their log positions."""
    body = entry.body
    if not command_codec.is_batch(body):
        return CommittedEntry(entry.index, entry.term, entry.position, entry.chain_crc, [])
    return CommittedEntry(
        entry.index,
        entry.term,
        entry.position,
        entry.chain_crc,
        command_codec.decode_batch(body, entry.position + store.header_bytes),
    )
