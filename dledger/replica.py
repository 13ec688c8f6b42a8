"""ReplicaCore: one replica — Raft (DLedgerSyncObj), the log, applying, appends — on one thread.

Single-threaded: every method runs on the thread that opened it (the event loop that serves the
replica's clients, see ``DLedgerNode``; or the simulator's one thread). Nothing here blocks on
another thread or reads a clock other than the injected one: blocking storage work (fdatasync)
goes to a ``Flusher`` and comes back as one call per job. The same code runs in production and
inside the deterministic simulator (``dledger.sim``).

What a tick does (the tick callback, after SyncObj's election/commit/heartbeat work)::

    submitted requests --group--> entries appended (leader only) --> replicate at once
         --> flush job (off the thread; group commit: one in flight, the next covers what was
             written meanwhile) --> commit index --> apply committed entries in log order
         --> resolve appends whose entry is committed (and applied) --> role changes
         --> retention (every retention_check_ms)

    flush job done --> durable index --> leader: counts itself up to it (next tick)
                                     --> follower: acknowledgements held for it leave now

Invariants:
- An append is acknowledged only when the commit index covers its entry *and* the entry at that
  index still carries the term it was written with (so it is the same entry); the leader counts
  itself only up to what it made durable (sync policy), and a follower's success answer leaves
  only once what it acknowledges is durable (held until the flush that covers it returns).
- Entries are applied in log order, once: the state machine's durable ``applied_index()`` is
  where applying resumes after a restart. A body the state machine cannot apply is refused by it
  (``Refused``, the same on every replica); an exception out of ``apply`` is a broken state
  machine, raised as ``StateMachineError`` naming the entries: the replica fails stop, loudly.
- A leader that steps down answers every append still waiting with "outcome unknown" at once
  (the entry may still commit under the next leader): callers retry elsewhere instead of waiting
  for their deadline.
- A log with no room for an entry (``StoreFullError``: nothing of it is kept) refuses it: the
  appends of that entry, and those queued behind it, fail with ``DiskFullError`` (``DISK_FULL``,
  they are known not to be written); the leader steps down (``DLedgerSyncObj.dl_block_writes``) and
  stands for no election until a write succeeds or ``free_bytes`` shows room for the refused write
  again (probed every ``SPACE_PROBE_S``); a follower does not acknowledge what it could not store.
- A failed write or sync whose outcome is unknown (EIO: ``StoreFailedError``, naming the file and
  the errno) is never retried and never acknowledged: the replica fails stop (fsyncgate).
- A flush speaks only for the entries it saw: a truncation or a re-anchor (install) while it was
  in flight voids its result (and the acknowledgements held for it); what remains after a
  truncation is durable (the store syncs it).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import random
import shutil
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from pysyncobj import SyncObjConf

from dledger import command_codec, durable
from dledger import membership as mship
from dledger.clock import Clock
from dledger.flusher import Flusher, SyncFlusher
from dledger.journal import RaftJournal
from dledger.log_store import LogStore, StoreFullError
from dledger.meta_store import MetaStore
from dledger.records import (
    AppendFailedError,
    AppendTimeoutError,
    BodyLocation,
    CommittedEntry,
    DiskFullError,
    DLedgerError,
    NotLeaderError,
    RaftSettings,
    RoleChange,
    StateMachine,
    StateMachineError,
    TransferNotReadyError,
    to_committed,
)
from dledger.retention import retention_target
from dledger.syncobj_patch import RAFT_STATE_CANDIDATE, RAFT_STATE_LEADER, DLedgerSyncObj

log = logging.getLogger("dledger.node")

ROLE_NAMES = {0: "FOLLOWER", 1: "CANDIDATE", 2: "LEADER"}
APPLY_BUDGET_ENTRIES = 512  # per tick: a long catch-up must not starve heartbeats
# Body bytes of its own entries a leader keeps until it applies them (beyond it, it decodes them).
OWN_BODIES_MAX_BYTES = 8 << 20
# A commit the followers have not been told of goes out on its own after this long, unless an
# append (which carries the commit index) goes first: under a steady stream of appends the next
# one carries it and no extra round of messages is spent (measured, one synchronous sender: 680 →
# 776 msgs/s, follower CPU per message 400 → 330 µs); when the stream stops, followers apply and
# serve readers within this delay instead of a heartbeat later.
COMMIT_TELL_DELAY_S = 0.002
# A replica whose log found no room checks the free space this often (injected clock) and takes
# writes again once the refused write would fit (with SPACE_MARGIN_BYTES to spare).
SPACE_PROBE_S = 1.0
SPACE_MARGIN_BYTES = 64 << 10


class Request:
    """One append: its bodies, and where its outcome goes (called once, on the replica's thread)."""

    __slots__ = ("alive", "bodies", "done", "enqueued", "size")

    def __init__(
        self,
        bodies: Sequence[bytes],
        size: int,
        done: Callable[[list[BodyLocation] | None, BaseException | None], None],
        enqueued: float,
        alive: Callable[[], bool] | None = None,
    ):
        self.bodies = bodies
        self.size = size
        self.done = done
        self.enqueued = enqueued
        self.alive = alive  # False once nobody waits any more (timed out): not worth writing


@dataclasses.dataclass
class _Waiting:
    index: int
    term: int
    # (request, slot of its first body): its bodies are slots first .. first + len(bodies) - 1
    requests: list[tuple[Request, int]]
    positions: list[int]  # the log position of each body (slot), in the entry's order
    results: Sequence[Any] | None = None  # per body, from the state machine's apply


class CoreEvents(Protocol):
    """What the core tells its owner (on the replica's thread)."""

    def role_changed(self, change: RoleChange) -> None: ...


TransportFactory = Callable[[Any, Any, Any], Any]


class ReplicaCore:
    def __init__(
        self,
        settings: RaftSettings,
        store: LogStore,
        meta: MetaStore,
        state_machine: StateMachine | None,
        *,
        clock: Clock,
        transport_factory: TransportFactory,
        events: CoreEvents,
        rng: random.Random | None = None,
        disk_used_ratio: Callable[[str], float] | None = None,
        prevote: bool = True,
        free_bytes: Callable[[str], int] | None = None,
    ):
        if settings.self_id not in settings.peers:
            raise ValueError(f"self id {settings.self_id!r} is not among the peers")
        self.settings = settings
        self.store = store
        self.journal = RaftJournal(store, meta)
        self._sm = state_machine
        self._clock = clock
        self._transport_factory = transport_factory
        self._events = events
        self._rng = rng or random.Random()
        self._disk_used_ratio = disk_used_ratio or durable.disk_used_ratio
        self._free_bytes = free_bytes or _free_bytes
        self._space_probe_at: float | None = None
        self._prevote = prevote
        self._addr_to_id = {addr: pid for pid, addr in settings.peers.items()}
        self._self_address = settings.peers[settings.self_id]
        self.membership, self.membership_source = self._load_membership()
        for placed in self.membership.placed:  # leaders named by members dLegerPeers does not list
            for pid, addr in placed.membership.voters + placed.membership.learners:
                self._addr_to_id.setdefault(addr, pid)
        self._install_membership: mship.Placed | None = None  # from the leader, for the next install
        self.sync: DLedgerSyncObj | None = None
        self._owner: int | None = None  # the thread that opened it (see _owned)
        self._queue: collections.deque[Request] = collections.deque()
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._waiting_indexes: set[int] = set()
        # Leader: the bodies of the entries it wrote and has not applied yet, by index:
        # (entry position, entry bytes, [(body position, body)]): what applying them would decode.
        self._own_bodies: dict[int, tuple[int, int, list[tuple[int, bytes]]]] = {}
        self._own_bytes = 0  # entry bytes of _own_bodies (bounded by OWN_BODIES_MAX_BYTES)
        # Published for readers on other threads (plain values: atomic under the GIL).
        self.role = "FOLLOWER"
        self.term = 0
        self.leader_id: str | None = None
        self.commit_index = 0
        self.applied_index = 0
        self.disk_full = False
        self.disk_used = 0.0  # the store's file system, df's Use% as a fraction (last retention check)
        self.leader_floor = 0
        self._own_floor = 0
        self._live_followers: int | None = None
        # Entries up to here are durable (what the log held at open, then what each flush saw).
        self._durable_index = store.last_index
        self._last_flush = clock.monotonic()
        self._flusher: Flusher = SyncFlusher()
        self._flush_in_flight = False
        # Moves when entries are replaced (truncation, install): a flush or an acknowledgement
        # of an older epoch no longer speaks for the log.
        self._log_epoch = 0
        # Follower: success answers waiting for their entries to be durable, per leader node:
        # (next index, term, epoch); the highest only (answers are cumulative).
        self._held_acks: dict[Any, tuple[int, int, int]] = {}
        self._last_retention: float | None = None
        self._commit_tell_at: float | None = None  # when an untold commit goes out on its own
        self.counters: collections.Counter[str] = collections.Counter()
        # enqueue -> commit known on the leader, last 20k acknowledged appends (bounded)
        self.commit_latency_ms: collections.deque[float] = collections.deque(maxlen=20_000)
        # Metrics hook (broker/server/metrics.py), called on the replica's thread: ("fsync_seconds",
        # duration) after every flush, ("batch_bodies", n) per entry written (a group commit of n).
        self.observe: Callable[[str, float], None] = _observe_nothing

    # -- lifecycle (the replica's thread) ----------------------------------------------------------
    def _owned(self) -> None:
        """Every method that changes or reads the replica's state runs on the thread that opened it
        (the node's event loop; the simulator's one thread): enforced, not left to the GIL."""
        if self._owner is not None and threading.get_ident() != self._owner:
            raise RuntimeError(
                f"ReplicaCore {self.settings.self_id} used on thread {threading.current_thread().name!r}, "
                "not the thread that owns it (use DLedgerNode.run_on_replica_thread)"
            )

    def open(self, *, poller: Any = None, flusher: Flusher | None = None) -> DLedgerSyncObj:
        """Start the replica on the calling thread, which owns it from now on. ``poller``: who
        watches the transport's sockets (the node's event loop: ``LoopPoller``; the simulator's);
        ``flusher``: where fdatasync runs (``ThreadFlusher``; default: at once, on this thread)."""
        self._owner = threading.get_ident()
        if flusher is not None:
            self._flusher = flusher
        s = self.settings
        conf = SyncObjConf(
            password=None,  # peers authenticate in the transport (peer_tcp), not in pysyncobj
            raftMinTimeout=s.election_min_ms / 1000,
            raftMaxTimeout=s.election_max_ms / 1000,
            appendEntriesPeriod=s.heartbeat_ms / 1000,
            leaderFallbackTimeout=s.stepdown_ms / 1000,
            connectionTimeout=s.connection_timeout_ms / 1000,
            connectionRetryTime=s.connection_retry_ms / 1000,
            sendBufferSize=4 << 20,
            recvBufferSize=1 << 20,
            commandsWaitLeader=False,
            onStateChanged=None,
        )
        current = self.membership.current.membership
        others = [addr for pid, addr in current.voters if pid != s.self_id]
        learners = [addr for pid, addr in current.learners if pid != s.self_id]
        log.info(
            "membership in force: voters %s, learners %s (%s); this replica is %s",
            sorted(current.voter_ids), sorted(current.learner_ids), self.membership_source,
            current.role_of(s.self_id) or "not a member",
        )
        sync = DLedgerSyncObj(
            self._self_address,
            others,
            conf,
            self.journal,
            self,
            transport_factory=self._transport_factory,
            rng=self._rng,
            prevote=self._prevote,
            batch_bytes=s.replication_batch_bytes,
            poller=poller,
            learner_addresses=learners,
            self_voter=s.self_id in current.voter_ids,
        )
        self.sync = sync
        self.journal.after_truncate = self._after_truncate
        self.journal.on_membership = self._on_membership_entry
        self.journal.on_membership_undone = self._membership_undone
        applied = self._sm.applied_index() if self._sm is not None else 0
        self.applied_index = max(applied, self.store.anchor[0])
        sync.dl_skip_replay(self.applied_index)
        sync.addOnTickCallback(self._on_tick)
        return sync

    def tick(self, wait_s: float) -> None:
        """The full tick: pysyncobj's timers (elections, heartbeats, check-quorum, the stall
        guard), the transport's, then the replica's own work (``_on_tick``)."""
        self._owned()
        assert self.sync is not None
        self.sync.doTick(wait_s)

    def after_input(self) -> None:
        """The light tick, after input or submitted appends: the leader's commit index, then the
        replica's own work (appends, replication, flush, apply, answers); no timers."""
        self._owned()
        sync = self.sync
        assert sync is not None
        sync.dl_after_input()
        self._on_tick()

    @property
    def flush_in_flight(self) -> bool:
        return self._flush_in_flight

    def close(self, before_log_close: Callable[[], None] | None = None) -> None:
        """Stop: appends still waiting get "outcome unknown"; the log is flushed (here, at once:
        the owner waited for the flush in flight); SyncObj destroyed; ``before_log_close`` runs
        (the state machine's last snapshot may still read the log); then the log closes."""
        self._owned()
        self.fail_queue(DLedgerError("node stopped"))
        self._fail_waiting(
            AppendTimeoutError("node stopped before the entry committed: the outcome is unknown")
        )
        try:
            if self.store.dirty:
                self.store.flush()
            if self.sync is not None:
                self.sync._doDestroy()
            if before_log_close is not None:
                before_log_close()
        finally:
            self.journal.close()

    # -- NodeHooks for DLedgerSyncObj (the replica's thread) ---------------------------------------
    def ack_ready(self, node: Any, next_index: int) -> bool:
        """May a success answer for entries below ``next_index`` leave now? Under the sync policy
        only once they are durable: otherwise it is held (the highest per leader) and sent by the
        flush that covers it (``_flush_done``); the tick after this input starts that flush."""
        if self.settings.flush_policy != "sync" or next_index - 1 <= self._durable_index:
            return True
        held = self._held_acks.get(node)
        if held is None or held[0] < next_index:
            assert self.sync is not None
            self._held_acks[node] = (next_index, int(self.sync.raftCurrentTerm), self._log_epoch)
        return False  # the tick that follows this input starts the flush (_on_tick, last)

    def self_match_index(self) -> int:
        """How far the leader may count itself toward a majority: what it made durable (sync)."""
        if self.settings.flush_policy != "sync":
            return int(self.store.last_index)
        return min(self._durable_index, int(self.store.last_index))

    def on_install_anchor(self, anchor_index: int) -> None:
        # The log restarted after the leader's anchor: memberships set by entries we no longer
        # hold are forgotten unless committed (then on the leader's log too); the leader said
        # which one is in force at its anchor (dl_membership), whose entry may be gone everywhere.
        given, self._install_membership = self._install_membership, None
        keep = min(anchor_index, self.commit_index)
        changed = self.membership.truncate_from(keep + 1)
        if given is not None and given.index <= anchor_index and given.index > self.membership.current.index:
            self.membership.append(given)
            changed = True
        if changed:
            self._membership_changed(f"install at the leader's anchor {anchor_index}")
        self.applied_index = anchor_index
        self.commit_index = max(self.commit_index, anchor_index)
        self._durable_index = anchor_index  # reset() is durable when it returns
        self._log_epoch += 1
        self._held_acks.clear()
        self._forget_own_bodies()
        self.counters["installs"] += 1
        if self._sm is not None:
            self._sm.on_install(anchor_index)

    def retention_floor(self) -> int:
        return self._own_floor

    def on_leader_floor(self, floor: int) -> None:
        self.leader_floor = floor

    def _after_truncate(self, from_index: int) -> None:
        """Entries from ``from_index`` on were cut (truncate_suffix syncs what remains): flushes in
        flight and acknowledgements held for them speak for entries that are gone; a membership
        they set gives way to the one before it."""
        if self.membership.truncate_from(from_index):
            self._membership_changed(f"truncation from index {from_index}")
        self._log_epoch += 1
        self._durable_index = min(self._durable_index, from_index - 1)
        self._held_acks.clear()
        self._forget_own_bodies()

    # -- membership (issue 27; the replica's thread) ----------------------------------------------
    def _load_membership(self) -> tuple[mship.MembershipHistory, str]:
        """The memberships saved beside the term and vote, checked against the log; else the
        bootstrap from dLegerPeers (``learner``: this replica joins as a learner)."""
        s = self.settings
        voters = dict(s.peers)
        learners: dict[str, str] = {}
        if s.learner:
            learners[s.self_id] = voters.pop(s.self_id)
        bootstrap = mship.Membership.of(voters, learners)
        raw = self.journal.meta.load_membership()
        if raw is None:
            return mship.MembershipHistory(bootstrap), "dLegerPeers" + (" (joining as a learner)" if s.learner else "")
        try:
            placed = mship.MembershipHistory.decode_placed(raw)
        except mship.MembershipCodecError as exc:
            raise DLedgerError(
                f"{s.data_dir}: the saved membership is damaged ({exc}); restore it or the node"
            ) from exc
        store = self.store
        kept = []
        for p in placed:
            # A change whose entry did not reach the disk before a crash is not in force.
            if p.index > store.last_index:
                continue
            if p.index >= store.first_index and store.term_at(p.index) != p.term:
                continue
            kept.append(p)
        history = mship.MembershipHistory(bootstrap, kept)
        cur = history.current
        source = (
            f"meta/membership: log entry {cur.index} (term {cur.term})" if cur.index else "dLegerPeers"
        )
        return history, source

    def _on_membership_entry(self, index: int, term: int, body: bytes) -> None:
        """A follower appended a membership entry: it is in force from now on (Raft §4.1)."""
        try:
            members = mship.decode(body)
        except mship.MembershipCodecError as exc:
            # The same bytes on every replica: all ignore it alike.
            log.error("ignoring a malformed membership entry at index %d: %s", index, exc)
            return
        self.membership.append(mship.Placed(index, term, members))
        self._membership_changed(f"log entry {index} (term {term})")

    def _membership_undone(self, index: int) -> None:
        """The entry of a membership saved a moment ago could not be stored: it is not in force."""
        if self.membership.truncate_from(index):
            self._membership_changed(f"entry {index} not stored")

    def _membership_changed(self, why: str) -> None:
        cur = self.membership.current
        self.journal.meta.save_membership(self.membership.encode())  # durable before it is used
        self.membership_source = f"{why}" if cur.index else f"dLegerPeers (after {why})"
        m = cur.membership
        for pid, addr in m.voters + m.learners:
            self._addr_to_id[addr] = pid
        sid = self.settings.self_id
        log.warning(
            "membership now: voters %s, learners %s (from %s); this replica is %s",
            sorted(m.voter_ids), sorted(m.learner_ids), why, m.role_of(sid) or "not a member",
        )
        self.counters["membership_changes"] += 1
        if self.sync is not None:
            self.sync.dl_set_members(
                [a for p, a in m.voters if p != sid], [a for p, a in m.learners if p != sid], sid in m.voter_ids
            )

    def membership_for_install(self, anchor_index: int) -> tuple[int, int, bytes] | None:
        placed = self.membership.at(anchor_index)
        if placed.index == 0:
            return None  # the bootstrap: a group that never changed sends nothing new on the wire
        return placed.index, placed.term, mship.encode(placed.membership)

    def on_install_membership(self, index: int, term: int, body: bytes) -> None:
        try:
            self._install_membership = mship.Placed(index, term, mship.decode(body))
        except mship.MembershipCodecError as exc:
            log.error("ignoring a malformed membership from the leader: %s", exc)

    def member_lag(self, peer_id: str) -> tuple[int | None, float | None]:
        """(entries behind the leader's last index, seconds since it last answered) for a member."""
        sync = self.sync
        assert sync is not None
        address = self.membership.current.membership.addresses().get(peer_id)
        node = sync.dl_nodes.get(address) if address is not None else None
        if node is None or self.role != "LEADER":
            return None, None
        match = sync.dl_match_index().get(node)
        heard = sync.dl_last_response().get(node)
        now = self._clock.monotonic()
        return (
            (self.store.last_index - match) if match is not None else None,
            (now - heard) if heard is not None else None,
        )

    def propose_membership(
        self,
        op: str,
        peer_id: str,
        address: str | None,
        done: Callable[[list[BodyLocation] | None, BaseException | None], None],
        *,
        max_lag: int = 1000,
    ) -> tuple[int, mship.Membership]:
        """Append one membership change (the leader only); ``done`` is called once it commits (or
        fails as an append would). Refusals raise ``MembershipError`` (coded), ``NotLeaderError``."""
        self._owned()
        sync = self.sync
        assert sync is not None
        if sync.dl_state != RAFT_STATE_LEADER:
            raise NotLeaderError(self.leader_id)
        new = self._membership_change(op, peer_id, address, max_lag)
        term = int(sync.raftCurrentTerm)
        body = mship.encode(new)
        index = self.store.last_index + 1
        # Saved before the entry is written (see RaftJournal.add): a restart drops a saved
        # membership whose entry is missing, never misses one whose entry is there.
        self.membership.append(mship.Placed(index, term, new))
        self._membership_changed(f"log entry {index} (term {term}), {op} {peer_id}")
        try:
            self.store.append(index, term, body)
        except StoreFullError as exc:
            self._membership_undone(index)
            sync.dl_block_writes(exc)
            raise DiskFullError(f"no room in the log for the membership change ({exc})") from exc
        req = Request([], 0, done, self._clock.monotonic())
        self._waiting.append(_Waiting(index, term, [(req, 0)], []))
        self._waiting_indexes.add(index)
        sync.dl_send_now()
        self._maybe_flush()
        return index, new

    def _membership_change(self, op: str, peer_id: str, address: str | None, max_lag: int) -> mship.Membership:
        """The membership after ``op``, or the coded refusal: one change at a time, after this
        leader's first entry committed, never the leader itself, a learner only once caught up."""
        sync = self.sync
        assert sync is not None
        commit = int(sync.raftCommitIndex)
        term = int(sync.raftCurrentTerm)
        if commit <= self.store.anchor[0] or commit < 1 or sync._dl_term_at(commit) != term:
            raise mship.MembershipError(
                "LEADER_NOT_READY", "this leader's first entry of its term has not committed yet: retry shortly"
            )
        current = self.membership.current
        if current.index > commit:
            raise mship.MembershipError(
                "MEMBERSHIP_CHANGE_PENDING",
                f"the change at index {current.index} has not committed yet (commit index {commit}): "
                "one change at a time",
            )
        if sync.dl_write_blocked is not None or self.disk_full:
            raise DiskFullError("this leader's log refuses writes: no membership change now")
        m = current.membership
        if op == "add_learner":
            if not address:
                raise mship.MembershipError("BAD_REQUEST", "add_learner needs the new member's Raft address")
            new = m.add_learner(peer_id, address)
        elif op == "promote":
            if peer_id not in m.learner_ids:
                raise mship.MembershipError("NOT_A_LEARNER", f"{peer_id} is not a learner of this group")
            lag, quiet = self.member_lag(peer_id)
            # Caught up: it holds the entry that made it a learner (so it has answered since), it is
            # at most max_lag entries behind, and it answered lately.
            holds = lag is not None and self.store.last_index - lag >= current.index
            if not holds or lag is None or quiet is None or lag > max_lag or quiet > self.settings.live_follower_s:
                raise mship.MembershipError(
                    "LEARNER_NOT_CAUGHT_UP",
                    f"learner {peer_id} is {lag if lag is not None else 'an unknown number of'} entries behind "
                    f"(at most {max_lag}, and it must hold entry {current.index}), last answered "
                    f"{'never' if quiet is None else f'{quiet:.1f} s ago'}: wait until it has caught up",
                )
            new = m.promote(peer_id)
        elif op == "remove":
            if peer_id == self.settings.self_id:
                raise mship.MembershipError(
                    "REMOVE_LEADER", f"{peer_id} leads the group: transfer leadership first, then remove it"
                )
            new = m.remove(peer_id)
        else:
            raise mship.MembershipError("BAD_REQUEST", f"unknown membership operation {op!r}")
        return new

    def membership_view(self) -> dict[str, Any]:
        cur = self.membership.current
        m = cur.membership
        return {
            **m.view(),
            "index": cur.index,
            "term": cur.term,
            "committed": cur.index <= self.commit_index,
            "source": self.membership_source,
            "self_role": m.role_of(self.settings.self_id),
        }

    # -- requests (the replica's thread) ------------------------------------------------------------
    def submit(self, request: Request) -> None:
        """Queue one append; it is written at the next tick if this replica leads, else refused.
        The owner runs that tick soon (the node: once per loop turn, so that the appends of one
        turn share an entry)."""
        self._owned()
        self._queue.append(request)

    def fail_queue(self, exc: DLedgerError) -> None:
        while self._queue:
            req = self._queue.popleft()
            req.done(None, exc)

    def _fail_waiting(self, exc: DLedgerError) -> None:
        while self._waiting:
            waiting = self._waiting.popleft()
            self._waiting_indexes.discard(waiting.index)
            for req, _ in waiting.requests:
                req.done(None, exc)

    # -- the tick callback ------------------------------------------------------------------------
    def _on_tick(self) -> None:
        sync = self.sync
        assert sync is not None
        appended = False
        if self._queue:
            if sync.dl_state == RAFT_STATE_LEADER:
                appended = self._append_queued(sync)
            else:
                self.fail_queue(NotLeaderError(self.leader_id))
        if appended:
            # Replicate before the local flush so followers write while the leader syncs. Safe: the
            # leader counts itself only up to what it made durable (self_match_index).
            sync.dl_send_now()
        if sync.dl_write_blocked is not None:
            self._probe_space(sync)
        self.commit_index = sync.raftCommitIndex
        self._tell_commit(sync)
        if self.applied_index < self.commit_index:
            self._apply_committed()
        if self._waiting:
            self._complete_waiting()
        self._publish_role(sync)
        now = self._clock.monotonic()
        if (
            self._last_retention is None
            or now - self._last_retention >= self.settings.retention_check_ms / 1000
        ):
            self._last_retention = now
            self._retention_tick(sync)
        # Last: the flusher wakes as this thread goes back to its loop (and lets go of the GIL),
        # not while it still runs Python here (measured: the hand-over then costs a GIL wait).
        self._maybe_flush()

    @property
    def write_blocked(self) -> StoreFullError | None:
        """Why the log refuses writes for lack of room (then this replica does not lead), or None."""
        return self.sync.dl_write_blocked if self.sync is not None else None

    def _probe_space(self, sync: DLedgerSyncObj) -> None:
        """A blocked replica with no leader feeding it writes learns of freed space here."""
        blocked = sync.dl_write_blocked
        assert blocked is not None
        now = self._clock.monotonic()
        if self._space_probe_at is not None and now < self._space_probe_at:
            return
        self._space_probe_at = now + SPACE_PROBE_S
        try:
            free = self._free_bytes(self.settings.data_dir)
        except OSError as exc:
            log.warning("cannot read the free space of %s: %s", self.settings.data_dir, exc)
            return
        if free >= blocked.needed + SPACE_MARGIN_BYTES:
            self._space_probe_at = None
            sync.dl_unblock_writes(f"{free} bytes free in {self.settings.data_dir}")

    def _refuse_full(self, sync: DLedgerSyncObj, group: list[Request], exc: StoreFullError) -> None:
        """The log had no room for the entry of ``group`` (nothing of it was kept): its appends and
        those queued behind it are refused with DISK_FULL, and this replica stops leading."""
        refusal = DiskFullError(
            f"this replica's log has no room for the entry ({exc}); it stops leading: retry, another "
            "replica takes over"
        )
        for req in group:
            req.done(None, refusal)
        self.fail_queue(refusal)
        self.counters["appends_refused_disk_full"] += len(group)
        self._space_probe_at = self._clock.monotonic() + SPACE_PROBE_S
        sync.dl_block_writes(exc)

    def _tell_commit(self, sync: DLedgerSyncObj) -> None:
        """Followers learn a new commit index from the next append, or from an empty one sent
        COMMIT_TELL_DELAY_S after the commit if no append went first (then they apply, and serve
        the entries to readers, within milliseconds rather than a heartbeat later)."""
        if sync.dl_state != RAFT_STATE_LEADER or self.commit_index <= sync.dl_commit_sent:
            self._commit_tell_at = None
            return
        now = self._clock.monotonic()
        if self._commit_tell_at is None:
            self._commit_tell_at = now + COMMIT_TELL_DELAY_S
        elif now >= self._commit_tell_at:
            self._commit_tell_at = None
            sync.dl_send_now()

    def next_tick_s(self, longest: float) -> float:
        """How long until the next tick is due with no input: ``longest`` at most; sooner for a
        commit to tell, a heartbeat or an election timeout, or the flush interval (async policy).
        Read on the injected clock."""
        now = self._clock.monotonic()
        due = now + longest
        if self._commit_tell_at is not None:
            due = min(due, self._commit_tell_at)
        if self.sync is not None:
            due = min(due, self.sync.dl_next_deadline())
        if self.settings.flush_policy != "sync" and self.store.dirty and not self._flush_in_flight:
            due = min(due, self._last_flush + self.settings.flush_interval_ms / 1000)
        return max(0.0, due - now)

    def commit_may_advance(self) -> bool:
        """Would a light tick move the leader's commit index now? (False on a follower.)"""
        return self.sync is not None and self.sync.dl_commit_may_advance()

    def more_to_apply(self) -> bool:
        """The apply budget of the last tick ran out: the owner ticks again soon (after other work)."""
        return self.applied_index < self.commit_index and self._sm is not None

    def _append_queued(self, sync: DLedgerSyncObj) -> bool:
        term = sync.raftCurrentTerm
        # An entry never outgrows a segment (requests themselves are bounded by max_entry_bytes).
        target = min(self.settings.entry_target_bytes, self.store.segment_bytes - self.store.header_bytes)
        appended = False
        while self._queue:
            group: list[Request] = []
            size = command_codec.PREFIX_BYTES
            while self._queue and (not group or size + self._queue[0].size <= target):
                req = self._queue.popleft()
                if req.alive is not None and not req.alive():
                    req.done(
                        None, AppendTimeoutError("the caller stopped waiting before the entry was written")
                    )
                    continue
                group.append(req)
                size += req.size - command_codec.PREFIX_BYTES
            if not group:
                continue
            bodies = group[0].bodies if len(group) == 1 else [b for req in group for b in req.bodies]
            payload, offsets = command_codec.encode_batch_with_offsets(bodies)
            index = self.store.last_index + 1
            try:
                position = self.store.append(index, term, payload)
            except StoreFullError as exc:
                self._refuse_full(sync, group, exc)
                return appended
            body_base = position + self.store.header_bytes
            positions = [body_base + offset for offset in offsets]
            firsts: list[tuple[Request, int]] = []
            k = 0
            for req in group:
                firsts.append((req, k))
                k += len(req.bodies)
            self._waiting.append(_Waiting(index, term, firsts, positions))
            if (
                self._sm is not None
                and self._own_bytes + len(payload) <= OWN_BODIES_MAX_BYTES
                and all(type(b) is bytes for b in bodies)
            ):
                self._own_bodies[index] = (position, len(payload), list(zip(positions, bodies, strict=True)))
                self._own_bytes += len(payload)
            self._waiting_indexes.add(index)
            self.counters["entries_appended"] += 1
            self.counters["bodies_appended"] += len(bodies)
            self.observe("batch_bodies", len(bodies))
            appended = True
        return appended

    # -- durability (group commit on the flusher) ------------------------------------------------
    def _maybe_flush(self) -> None:
        """Start a flush job if the log has unsynced appends (or appends this replica has not
        seen synced: a store syncs by itself when it seals a segment), none is in flight, and the
        policy asks for one now (sync: always; async: every flush_interval_ms)."""
        if self._flush_in_flight or (not self.store.dirty and self._durable_index >= self.store.last_index):
            return
        if (
            self.settings.flush_policy == "sync"
            or self._clock.monotonic() - self._last_flush >= self.settings.flush_interval_ms / 1000
        ):
            self._start_flush()

    def _start_flush(self) -> None:
        self._flush_in_flight = True
        target, epoch = int(self.store.last_index), self._log_epoch  # written before the job starts
        store, clock = self.store, self._clock
        took: list[float] = []

        def job() -> None:  # the flusher's thread
            started = clock.monotonic()
            store.flush()
            took.append(clock.monotonic() - started)

        self._flusher.submit(job, lambda exc: self._flush_done(target, epoch, took, exc))

    def _flush_done(self, target: int, epoch: int, took: list[float], exc: BaseException | None) -> None:
        """Back on the replica's thread: everything up to ``target`` is durable (unless the log
        was cut meanwhile); held acknowledgements leave; the next job covers what was written
        since (sync policy). A failed fdatasync is fatal: the replica fails stop (raised)."""
        self._flush_in_flight = False
        if exc is not None:
            raise exc
        self._last_flush = self._clock.monotonic()
        self.counters["fsync"] += 1
        if took:
            self.observe("fsync_seconds", took[0])
        if epoch == self._log_epoch and target > self._durable_index:
            self._durable_index = target
        if self._held_acks:
            self._send_held_acks()
        if self.settings.flush_policy == "sync":
            self._maybe_flush()

    def _send_held_acks(self) -> None:
        sync = self.sync
        assert sync is not None
        term = int(sync.raftCurrentTerm)
        for node, (next_index, ack_term, epoch) in list(self._held_acks.items()):
            if ack_term != term or epoch != self._log_epoch:
                del self._held_acks[node]  # stale: the next AppendEntries is answered afresh
            elif next_index - 1 <= self._durable_index:
                del self._held_acks[node]
                sync.dl_send_ack(node, next_index)

    def _complete_waiting(self) -> None:
        store = self.store
        while self._waiting:
            w = self._waiting[0]
            if w.index > store.last_index or (
                w.index >= store.first_index and store.term_at(w.index) != w.term
            ):
                self._waiting.popleft()
                self._waiting_indexes.discard(w.index)
                for req, _ in w.requests:
                    req.done(
                        None, AppendFailedError(f"entry {w.index} was replaced by a newer leader's entry")
                    )
                continue
            # With a state machine, an append resolves once it is applied too: the caller reads
            # what applying it produced (BodyLocation.result).
            if w.index > self.commit_index or (self._sm is not None and w.index > self.applied_index):
                return
            self._waiting.popleft()
            self._waiting_indexes.discard(w.index)
            now = self._clock.monotonic()
            results, positions, index, term = w.results, w.positions, w.index, w.term
            for req, first in w.requests:
                self.commit_latency_ms.append((now - req.enqueued) * 1000)
                if results is None:
                    locations = [
                        BodyLocation(index, term, s, positions[s], len(b))
                        for s, b in enumerate(req.bodies, first)
                    ]
                else:
                    locations = [
                        BodyLocation(index, term, s, positions[s], len(b), results[s])
                        for s, b in enumerate(req.bodies, first)
                    ]
                req.done(locations, None)

    def _apply_committed(self) -> None:
        budget = APPLY_BUDGET_ENTRIES
        while self.applied_index < self.commit_index and budget > 0:
            first = self.applied_index + 1
            count = min(budget, self.commit_index - self.applied_index)
            if self._sm is None:
                self.applied_index += count
                return
            raw = self.store.read_range(first, count, 8 << 20)
            if not raw:
                return
            own = self._own_bodies
            if own:
                # This leader's own entries: the bodies it wrote, not decoded back from the bytes
                # it encoded them into (the same values; an entry at this index and position is
                # the one it wrote: positions are never reused, truncation and install clear it).
                committed = []
                for e in raw:
                    hit = own.pop(e.index, None)
                    if hit is not None:
                        self._own_bytes -= hit[1]
                    if hit is not None and hit[0] == e.position:
                        committed.append(CommittedEntry(e.index, e.term, e.position, e.chain_crc, hit[2]))
                    else:
                        committed.append(to_committed(e, self.store))
            else:
                committed = [to_committed(e, self.store) for e in raw]
            try:
                results = self._sm.apply(committed)
            except Exception as exc:  # a broken state machine: stop loudly, naming the entries
                raise StateMachineError(raw[0].index, raw[-1].index, exc) from exc
            if results is not None and self._waiting_indexes:
                for e, res in zip(raw, results, strict=True):
                    if e.index in self._waiting_indexes:
                        self._attach_results(e.index, res)
            self.applied_index = raw[-1].index
            budget -= len(raw)

    def _forget_own_bodies(self) -> None:
        """The log was cut or restarted: the entries this leader wrote may be gone."""
        self._own_bodies.clear()
        self._own_bytes = 0

    def _attach_results(self, index: int, results: Sequence[Any] | None) -> None:
        for w in self._waiting:
            if w.index == index:
                w.results = results
                return

    def _publish_role(self, sync: DLedgerSyncObj) -> None:
        role = ROLE_NAMES[sync.dl_state]
        leader = sync.dl_leader
        leader_id = self._addr_to_id.get(leader.address) if leader is not None else None
        if sync.dl_state == RAFT_STATE_LEADER:
            leader_id = self.settings.self_id
        term = sync.raftCurrentTerm
        if role == self.role and term == self.term and leader_id == self.leader_id:
            return
        if sync.dl_state == RAFT_STATE_CANDIDATE and self.role == "CANDIDATE" and leader_id == self.leader_id:
            self.term = term  # repeated candidacies: not worth an event each
            return
        if role == "CANDIDATE" and self.role != "CANDIDATE":
            self.counters["elections"] += 1
        was_leader = self.role == "LEADER"
        self.role, self.term, self.leader_id = role, term, leader_id
        log.info("role %s term %d leader %s", role, term, leader_id)
        if role != "LEADER":
            self.fail_queue(NotLeaderError(leader_id))
            if was_leader and self._waiting:
                self._fail_waiting(
                    AppendTimeoutError(
                        "this replica stopped leading before the entry committed: the outcome is unknown"
                    )
                )
        self._events.role_changed(RoleChange(role, term, leader_id, self._clock.wall()))

    # -- retention --------------------------------------------------------------------------------
    def _retention_tick(self, sync: DLedgerSyncObj) -> None:
        s = self.settings
        self.counters["retention_checks"] += 1
        floor = self.applied_index
        if self._sm is not None:
            self._sm.checkpoint()
            # Entries the state machine has applied but not made durable must stay: after a
            # crash it re-applies them from the log (found by the simulator: a restart resumed
            # past entries retention had removed, and skipped them).
            floor = min(floor, self._sm.durable_applied_index())
        if sync.dl_state == RAFT_STATE_LEADER:
            now = self._clock.monotonic()
            responses = sync.dl_last_response()
            live = 0
            for node, match in sync.dl_match_index().items():
                last = responses.get(node)
                if last is not None and now - last <= s.live_follower_s:
                    floor = min(floor, match)
                    live += 1
            self._live_followers = live
        else:
            self._live_followers = None
            floor = min(floor, self.leader_floor)
        self._own_floor = floor
        used = self._disk_used_ratio(s.data_dir)
        full = used >= s.disk_warning_ratio
        if full != self.disk_full:
            if full:
                log.error("%s; free space on that file system or raise the limit", self.disk_full_reason(used))
            else:
                log.warning("disk use of %s is %.1f %%: appends are accepted again", s.data_dir, used * 100)
        self.disk_used = used
        self.disk_full = full
        target = retention_target(
            self.store.segments(),
            keep_floor=floor,
            now_wall_s=self._clock.wall(),
            retention_hours=s.retention_hours,
            disk_used_ratio=used,
            disk_max_used_ratio=s.disk_max_used_ratio,
        )
        if target > self.store.first_index:
            try:
                removed = self.store.delete_segments_before(target)
            except StoreFullError as exc:  # no room even for the new anchor: nothing was removed
                self.counters["retention_refused_disk_full"] += 1
                log.error("retention could not remove segments (%s); free some space on the disk", exc)
                return
            if removed:
                self.counters["segments_removed"] += removed
                log.info(
                    "retention removed %d segment(s); log now starts after index %d (disk %.0f %%)",
                    removed,
                    self.store.anchor[0],
                    used * 100,
                )

    def disk_full_reason(self, used: float | None = None) -> str:
        """Why appends are refused while ``disk_full``: the figures an operator acts on."""
        s = self.settings
        used = self.disk_used if used is None else used
        return (
            f"disk use of {s.data_dir} is {used * 100:.1f} % (df's Use%), at or above "
            f"diskSpaceWarningLevelRatio {s.disk_warning_ratio * 100:.0f} %: appends are refused"
        )

    def run_retention_now(self) -> None:
        self._owned()
        assert self.sync is not None
        self._retention_tick(self.sync)

    # -- status and transfer ----------------------------------------------------------------------
    def installs_sent(self) -> int:
        return int(self.sync.dl_installs_sent) if self.sync is not None else 0

    def start_transfer(self, target_id: str | None) -> str:
        self._owned()
        sync = self.sync
        assert sync is not None
        if sync.dl_state != RAFT_STATE_LEADER:
            raise NotLeaderError(self.leader_id)
        target = None
        if target_id is not None:
            if target_id == self.settings.self_id:
                raise DLedgerError("this node is already the leader")
            m = self.membership.current.membership
            address = m.addresses().get(target_id)
            if address is None:
                raise DLedgerError(f"unknown peer id {target_id!r}")
            if target_id not in m.voter_ids:
                raise DLedgerError(f"transfer refused: {target_id} is a learner, not a voter")
            target = sync.dl_nodes.get(address)
        candidates = [target] if target is not None else list(sync.dl_peers)
        if not any(n is not None and sync.isNodeConnected(n) for n in candidates):
            raise DLedgerError(f"transfer refused: {target_id or 'no follower'} is not connected")
        if not sync.dl_transfer(target):
            # connected (checked above) but its match index is behind our last index: not yet
            raise TransferNotReadyError("transfer refused (target not caught up yet)")
        return target_id or "the most caught-up follower"

    def status(self) -> dict[str, Any]:
        self._owned()
        sync = self.sync
        assert sync is not None
        store = self.store
        peers: dict[str, Any] = {}
        match = {n.address: v for n, v in sync.dl_match_index().items()}
        nxt = {n.address: v for n, v in sync.dl_next_index().items()}
        view = self.settings.view()
        members = self.membership.current.membership
        for pid, addr in sorted(members.addresses().items()):
            if pid == self.settings.self_id:
                continue
            node = sync.dl_nodes.get(addr)
            peers[pid] = {
                "role": members.role_of(pid),
                "address": addr,
                "connect_address": view.get(pid, addr),
                "connected": bool(node is not None and sync.isNodeConnected(node)),
                "match_index": match.get(addr),
                "next_index": nxt.get(addr),
                "lag": (store.last_index - match[addr]) if addr in match and self.role == "LEADER" else None,
            }
        return {
            "group": self.settings.group,
            "self_id": self.settings.self_id,
            "role": self.role,
            "term": self.term,
            "leader_id": self.leader_id,
            "commit_index": self.commit_index,
            "applied_index": self.applied_index,
            "first_index": store.first_index,
            "last_index": store.last_index,
            "last_term": store.last_term,
            "anchor_index": store.anchor[0],
            "chain_crc_at_commit": (
                store.chain_crc_at(self.commit_index)
                if store.anchor[0] <= self.commit_index <= store.last_index
                else None
            ),
            "bytes_stored": store.bytes_stored,
            "segments": len(store.segments()),
            "flush_policy": self.settings.flush_policy,
            "disk_full": self.disk_full or sync.dl_write_blocked is not None,
            "write_blocked": str(sync.dl_write_blocked) if sync.dl_write_blocked is not None else None,
            "retention_floor": self._own_floor,
            "live_followers": self._live_followers,
            "membership": self.membership_view(),
            "peers": peers,
            "counters": {
                **dict(self.counters),
                **sync.dl_counters,
                "truncations_skipped": self.journal.truncations_skipped,
                "entries_truncated": self.journal.entries_truncated,
                "rewinds_prevented": sync.dl_rewinds_prevented,
                "installs_sent": sync.dl_installs_sent,
                "appends_received": sync.dl_appends_received,
            },
            "max_append_gap_ms": round(sync.dl_max_append_gap_s * 1000, 3),
            "waiting_entries": len(self._waiting),
            "queued_requests": len(self._queue),
            "commit_latency_ms": _latency_summary(list(self.commit_latency_ms)),
        }


def _observe_nothing(_name: str, _value: float) -> None:
    pass


def _latency_summary(samples: list[float]) -> dict[str, float | int]:
    if not samples:
        return {"count": 0}
    samples.sort()

    def at(q: float) -> float:
        return round(samples[min(len(samples) - 1, int(q * len(samples)))], 3)

    return {"count": len(samples), "p50": at(0.5), "p99": at(0.99), "max": round(samples[-1], 3)}


def _free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s file system (statvfs f_bavail)."""
    return int(shutil.disk_usage(path).free)
