"""Everything dledger changes inside pysyncobj, pinned to pysyncobj 0.3.17 and kept in one place.

pysyncobj supplies Raft's message handlers and the log bookkeeping; dledger owns the tick loop
(``_onTick``), the storage (our journal), the transport (TCP: ``peer_tcp``; in-process:
``inproc``; simulated: ``dledger.sim``), the clock (``dledger.clock``) and the randomness (one
seeded ``random.Random`` per node). Every change answers a measured defect
(../shared/notes/pysyncobj.md) and has a test that fails without it (tests/dledger/
test_syncobj_patch.py, test_sim.py's pre-vote scenarios and the simulator's planted bugs).

1. Journal seam: ``pysyncobj.syncobj.createJournal`` returns our ``RaftJournal`` when one is
   passed as ``journalFile``. Log compaction is off; pysyncobj's own apply loop is skipped (it read
   every committed entry back from disk only to ignore it): the node applies entries itself.
2. Follower truncation (defect 1): ``align_append_entries`` rewrites an AppendEntries so SyncObj
   truncates only at the first *conflicting* entry (Raft §5.3) and caps the commit index at the
   last entry the message verified (Figure 2: "commitIndex = min(leaderCommit, index of last new
   entry)").
3. Leader nextIndex rewind (defect 1, leader half): a success ack for an older batch no longer
   moves ``nextIndex`` back over batches still in flight.
4. Fair replication (defect 2) and no chunked path (defect 3): followers are served in rotating
   order with a per-call byte budget and a cap on bytes queued per link; every entry goes in one
   message. A follower whose next entry was removed by retention gets ``dl_install``.
5. The tick loop (defect 4), ``_onTick``:
   - pre-vote (Raft thesis §9.6): a node whose election timer fires first asks whether it could
     win (``dl_pre_vote`` for term+1, its term unchanged); only a majority of grants starts a real
     election. A voter grants only if it has not heard from a leader within the minimum election
     timeout and the candidate's log is at least as up to date as its own. A node that rejoins
     after a partition, or a follower that was paused, no longer deposes a healthy leader.
   - votes ignored within the lease: a RequestVote for a higher term is ignored (the term is not
     adopted) while the voter hears from a leader, unless it comes from a leadership transfer.
   - a follower that sees an AppendEntries from an older term answers ``dl_stale_term``, so a
     leader on an older term learns that it is stale (pre-vote alone could leave a node whose term
     rose during a partition unable to rejoin).
   - before campaigning, input already received is read first: a replica whose thread stalled must
     not call an election while the leader's heartbeats wait in its socket buffer.
   - a stall is not a failure: a tick that comes more than half the minimum election timeout after
     the previous one (``STALL_FRACTION``: the replica's thread did not run — its event loop held
     by a long handler, a garbage collection, a starved or suspended process, every replica of an
     in-process group at once; the loop ticks at least every 50 ms while it runs) restarts the election
     timer, keeps the lease of a known leader for another minimum timeout (votes and pre-votes
     refused), and gives a leader's quorum check one more ``leaderFallbackTimeout``: the node could
     not have heard its peers, so their silence proves nothing. A peer that really failed meanwhile
     is replaced one timeout later.
   - check-quorum: a leader that has not heard from a majority within ``leaderFallbackTimeout``
     steps down (dLegerLeaderStepDownMs).
   - the commit index is ``quorum_commit_index``: the highest index held by a majority, counting the
     leader only up to what it has made durable (``NodeHooks.self_match_index``), and only when
     that entry is of the leader's current term (Raft §5.4.2).
   - votes are counted per voter (a duplicated answer counts once).
6. Durability before acknowledgement: a follower's ``next_node_idx`` success leaves only when
   ``NodeHooks.ack_ready`` says the entries it covers are durable; otherwise the replica holds it
   and sends it (``dl_send_ack``) when the flush that covers them returns, whatever the transport.
7. Time and randomness: every deadline reads ``dledger.clock`` (the thread's injected clock);
   election timeouts come from the node's own ``random.Random`` (seeded in the simulator); peers
   are ``PeerNode`` objects whose hash does not depend on PYTHONHASHSEED, so iteration orders are
   the same in every run.

8. The poller: the replica's owner decides who watches the transport's descriptors (the event
   loop: ``dledger.loop_poller``; the simulator: its inboxes): ``dl_poller``, which the transport
   and the tick use (SyncObj's own poller is left unused).

9. A log with no room (``StoreFullError``, issue 27): a replica whose store refused a write for
   lack of space blocks its writes (``dl_block_writes``): a leader hands leadership to its most
   caught-up follower if one is fully caught up (TimeoutNow) and steps down at once; a follower
   answers nothing for the message it could not store (it never acknowledges what it did not
   store; the leader sends it again); a blocked replica does not campaign and ignores
   TimeoutNow. The first entries it stores again, or the replica seeing room again
   (``dl_unblock_writes``), lift the block.

10. Membership (issue 27): the voters (``dl_peers``) and learners (``dl_learners``) are ours, set by
   the replica from the log (``dl_set_members``, ``dledger/membership.py``); pysyncobj's own
   membership commands (pickled, applied by its apply loop, which we skip) stay off. Only voters
   count for commit, check-quorum and elections; learners get the log (``dl_targets``); a node
   that is not a voter does not campaign, vote or grant a pre-vote; votes and pre-votes from a
   node that is not a voter are ignored. Leadership transfer is ours (``dl_transfer``: a caught-up
   connected *voter*; pysyncobj's ``transferLeadership`` knows only the peers it started with).

Thread ownership: all of this runs on the replica's thread (the event loop that serves its
clients; the simulator's one thread).
"""

from __future__ import annotations

import logging
import random
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import pysyncobj.syncobj as _syncobj_mod
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.node import TCPNode
from pysyncobj.transport import TransportNotReadyError
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

from dledger import clock as dl_clock
from dledger import peer_codec
from dledger.journal import RaftJournal
from dledger.log_store import StoreFullError

log = logging.getLogger(__name__)

PINNED_VERSION = "0.3.17"
RAFT_STATE_FOLLOWER, RAFT_STATE_CANDIDATE, RAFT_STATE_LEADER = 0, 1, 2


class PatchError(RuntimeError):
    """pysyncobj is not the version these patches were written and tested against."""


def check_pinned_version() -> None:
    if PYSYNCOBJ_VERSION != PINNED_VERSION:
        raise PatchError(
            f"dledger patches pysyncobj internals and is pinned to {PINNED_VERSION}; "
            f"found {PYSYNCOBJ_VERSION}. Install pysyncobj=={PINNED_VERSION}."
        )


_original_create_journal = _syncobj_mod.createJournal
# A tick later than this fraction of the minimum election timeout after the previous one is a stall
# of this replica's thread (its loop ticks at least every 50 ms while it runs: DLedgerNode
# TICK_MAX_S), not a silence of its peers.
STALL_FRACTION = 0.5

_installed = False


def _create_journal(journal_file: Any) -> Any:
    if isinstance(journal_file, RaftJournal):
        return journal_file
    return _original_create_journal(journal_file)


def install() -> None:
    """Apply the process-wide patches (idempotent)."""
    global _installed
    check_pinned_version()
    if _installed:
        return
    dl_clock.bind_pysyncobj()
    _syncobj_mod.createJournal = _create_journal
    _installed = True


class PeerNode(TCPNode):
    """A peer known by its address, hashed the same way in every process (no PYTHONHASHSEED)."""

    def __hash__(self) -> int:
        # Hashed on every dict lookup of the Raft state (next/match index per peer): computed once.
        h: int | None = self.__dict__.get("_dl_hash")
        if h is None:
            h = self.__dict__["_dl_hash"] = zlib.crc32(self.address.encode())
        return h


class NodeHooks(Protocol):
    """What DLedgerSyncObj asks of the replica that owns it (all called on the replica's thread)."""

    def ack_ready(self, node: Any, next_index: int) -> bool: ...

    def self_match_index(self) -> int: ...

    def on_install_anchor(self, anchor_index: int) -> None: ...

    def retention_floor(self) -> int: ...

    def on_leader_floor(self, floor: int) -> None: ...

    # Membership hooks (optional: a hand-built object's hooks may lack them).
    # membership_for_install(anchor) -> (index, term, body) | None: what the leader sends with dl_install.
    # on_install_membership(index, term, body): a follower is told the membership at the leader's anchor.


def quorum_commit_index(
    commit_index: int,
    self_match: int,
    peer_match: Sequence[int],
    current_term: int,
    term_at: Callable[[int], int],
    count_self: bool = True,
) -> int:
    """The leader's commit index after counting matches (pure).

    The highest index a majority holds (the leader counted up to ``self_match``, what it made
    durable), if it is above ``commit_index`` and of ``current_term``: Raft §5.4.2, "Raft never
    commits log entries from previous terms by counting replicas"; older entries commit with it.
    Terms never decrease along a log, so no lower index can be of the current term either.
    """
    ranked = sorted([self_match, *peer_match] if count_self else list(peer_match), reverse=True)
    if not ranked:
        return commit_index
    candidate = ranked[len(ranked) // 2]
    if candidate <= commit_index or term_at(candidate) != current_term:
        return commit_index
    return candidate


def align_append_entries(
    message: dict[str, Any], last_index: int, first_index: int, term_at: Callable[[int], int]
) -> tuple[dict[str, Any], bool]:
    """Rewrite an AppendEntries so SyncObj truncates only on a real conflict.

    Returns ``(message, skip_truncate)``. ``term_at(i)`` answers for ``first_index <= i <=
    last_index`` (``first_index`` is the oldest entry SyncObj can see, the anchor included).
    ``skip_truncate`` asks the journal to ignore the one ``deleteEntriesFrom`` SyncObj will call
    for entries after a fully matching message. Pure: no I/O besides ``term_at``.
    """
    prev = message.get("prevLogIdx")
    if prev is None or prev > last_index or prev < first_index:
        return message, False  # SyncObj answers "reset" by itself
    if term_at(prev) != message.get("prevLogTerm"):
        return message, False  # mismatch at prev: SyncObj answers "reset" at prev
    entries = message.get("entries") or []
    matched = 0
    for entry in entries:
        index, term = entry[1], entry[2]
        if index > last_index or term_at(index) != term:
            break
        matched += 1
    if matched == 0 and prev == last_index:
        return message, False  # plain append at the end: stock path is right
    verified = prev + matched
    out = dict(message)
    out["prevLogIdx"] = verified
    out["prevLogTerm"] = entries[matched - 1][2] if matched else message["prevLogTerm"]
    out["entries"] = entries[matched:]
    if matched == len(entries):
        # Every entry matched: nothing to add. SyncObj would still delete (verified, last];
        # those entries are unverified, not conflicting, so they stay (skip) and the commit
        # index may not pass what this message verified.
        out["commit_index"] = min(message["commit_index"], verified)
        return out, verified < last_index
    # A conflict (or the end of our log) at verified+1: SyncObj truncates exactly there.
    return out, False


class DLedgerSyncObj(SyncObj):
    """SyncObj with dledger's corrections; ticked by its owner (autoTick off).

    ``transport_factory(sync_obj, self_node, other_nodes)`` builds the peer transport (pysyncobj's
    ``Transport`` interface); ``rng`` draws election timeouts.
    """

    # Messages handled that moved nothing a light tick reads (a leader's success answer that
    # neither lets the commit index advance nor ends a probe): a transport that handed over only
    # such messages in one read tells its poller so, and the owner skips the light tick after it
    # (``LoopPoller``). Counted, so a transport compares before and after a read.
    dl_quiet_messages = 0

    def __init__(
        self,
        self_address: str,
        other_addresses: list[str],
        conf: SyncObjConf,
        journal: RaftJournal,
        hooks: NodeHooks,
        *,
        transport_factory: Callable[[Any, Any, Any], Any],
        rng: random.Random | None = None,
        prevote: bool = True,
        per_call_budget_bytes: int = 4 << 20,
        max_queued_bytes: int = 8 << 20,
        batch_bytes: int = 1 << 20,
        poller: Any = None,
        learner_addresses: Sequence[str] = (),
        self_voter: bool = True,
    ):
        install()
        conf.journalFile = journal
        conf.bindAddress = conf.bindAddress or self_address  # never 0.0.0.0
        conf.autoTick = False
        conf.fullDumpFile = None
        conf.logCompactionMinEntries = 2**62
        conf.logCompactionMinTime = 10**12
        conf.dynamicMembershipChange = False
        conf.maxBindRetries = conf.maxBindRetries or 5
        conf.appendEntriesBatchSizeBytes = max(conf.appendEntriesBatchSizeBytes, batch_bytes)
        self.dl_conf: SyncObjConf = conf  # SyncObj's __init__ already draws a timeout from it
        self.dl_journal = journal
        self.dl_hooks = hooks
        self.dl_rng = rng or random.Random()
        self.dl_prevote = prevote
        self.dl_per_call_budget_bytes = per_call_budget_bytes
        self.dl_max_queued_bytes = max_queued_bytes
        self.dl_batch_bytes = batch_bytes
        self.dl_rotation = 0
        # The first append_entries of each next index during one replication round (see
        # _SyncObj__sendAppendEntries); None outside a round.
        self.dl_round_messages: dict[int, Any] | None = None
        self.dl_commit_sent = 0  # the commit index the last round of appends told the followers
        self.dl_rewinds_prevented = 0
        self.dl_installs_sent = 0
        self.dl_last_install: dict[Any, float] = {}
        self.dl_appends_received = 0
        self.dl_last_append_at: float | None = None
        self.dl_max_append_gap_s = 0.0
        self.dl_last_leader_contact: float | None = None
        self.dl_last_tick_at: float | None = None
        self.dl_next_second = float("-inf")  # the journal's one-second timer (commit hint)
        self.dl_tick_callbacks: list[Callable[[], None]] = []
        self.dl_stall_grace_until = float("-inf")  # after a stall: lease kept / quorum check waits
        self.dl_prevote_round = 0
        self.dl_prevote_term: int | None = None
        self.dl_prevote_grants: set[Any] = set()
        self.dl_voters: set[Any] = set()
        # Followers whose log position the leader does not know yet: sent one probe at a time,
        # nextIndex moved only by their answers (etcd's probe state); the others get pipelined.
        self.dl_probing: set[Any] = set()
        self.dl_counters: dict[str, int] = dict.fromkeys(
            (
                "prevotes_started",
                "elections_started",
                "became_leader",
                "stepdowns_check_quorum",
                "stepdowns_stale_term",
                "votes_ignored_in_lease",
                "prevotes_granted",
                "prevotes_refused",
                "stalls",
                "stepdowns_disk_full",
                "writes_refused_disk_full",
                "votes_ignored_not_voter",
                "stepdowns_not_a_voter",
            ),
            0,
        )
        # Why this replica's log refuses writes (no room), or None: it does not campaign then.
        self.dl_write_blocked: StoreFullError | None = None
        # Who watches the transport's descriptors (item 8): the owner's (the event loop's), or, for
        # an object built by hand (unit tests), the poller SyncObj made for itself.
        self.dl_poller: Any = poller
        made: list[Any] = []

        def make_transport(sync_obj: Any, self_node: Any, other_nodes: Any) -> Any:
            if self.dl_poller is None:
                self.dl_poller = sync_obj._poller
            made.append(transport_factory(sync_obj, self_node, other_nodes))
            return made[-1]

        learners = [a for a in learner_addresses if a not in other_addresses]
        super().__init__(
            self_address,
            [*other_addresses, *learners],
            conf=conf,
            nodeClass=PeerNode,
            transportClass=make_transport,
        )
        self.dl_transport: Any = made[0]
        # The group's other members (item 10), in one order for every process: voters count,
        # learners only receive the log. Changed by the replica from the log (dl_set_members).
        self.dl_nodes: dict[str, Any] = {n.address: n for n in self.otherNodes}
        voters = set(other_addresses)
        self.dl_peers: tuple[Any, ...] = tuple(
            sorted((n for n in self.otherNodes if n.address in voters), key=lambda n: n.id)
        )
        self.dl_learners: tuple[Any, ...] = tuple(
            sorted((n for n in self.otherNodes if n.address not in voters), key=lambda n: n.id)
        )
        self.dl_targets: tuple[Any, ...] = self.dl_peers + self.dl_learners
        self.dl_self_voter = self_voter

    # -- read-only views of SyncObj state (the replica's thread only) -------------------------
    @property
    def dl_state(self) -> int:
        return int(self._SyncObj__raftState)

    @property
    def dl_leader(self) -> Any:
        return self._SyncObj__raftLeader

    def dl_match_index(self) -> dict[Any, int]:
        return dict(self._SyncObj__raftMatchIndex)

    def dl_next_index(self) -> dict[Any, int]:
        return dict(self._SyncObj__raftNextIndex)

    def dl_last_response(self) -> dict[Any, float]:
        return dict(self._SyncObj__lastResponseTime)

    def dl_others(self) -> tuple[Any, ...]:
        return self.dl_peers

    def dl_set_members(
        self, voter_addresses: Sequence[str], learner_addresses: Sequence[str], self_voter: bool
    ) -> None:
        """The membership in force changed (item 10): links to new members are opened, links to
        removed ones closed; a leader starts probing the new ones."""
        wanted = {*voter_addresses, *learner_addresses}
        wanted.discard(self.selfNode.address)
        for address in sorted(wanted - set(self.dl_nodes)):
            node = PeerNode(address)
            self.dl_nodes[address] = node
            self.dl_transport.addNode(node)
            if self.dl_state == RAFT_STATE_LEADER:
                self._SyncObj__raftNextIndex[node] = self._SyncObj__getCurrentLogIndex() + 1
                self._SyncObj__raftMatchIndex[node] = 0
                self._SyncObj__lastResponseTime[node] = dl_clock.current_monotonic()
                self.dl_probing.add(node)
        for address in sorted(set(self.dl_nodes) - wanted):
            node = self.dl_nodes.pop(address)
            self.dl_transport.dropNode(node)
            self._dl_forget(node)
        voters = set(voter_addresses)
        nodes = sorted(self.dl_nodes.values(), key=lambda n: n.id)
        self.dl_peers = tuple(n for n in nodes if n.address in voters)
        self.dl_learners = tuple(n for n in nodes if n.address not in voters)
        self.dl_targets = self.dl_peers + self.dl_learners
        self.dl_self_voter = self_voter
        if not self_voter and self.dl_state != RAFT_STATE_LEADER and self.dl_prevote_term is not None:
            self.dl_prevote_term = None
        if not self_voter and self.dl_state == RAFT_STATE_CANDIDATE:  # a candidate that is no longer a voter
            self._dl_step_down(None, "not_a_voter")

    def dl_node_for(self, address: str) -> Any:
        """The node object for a peer that authenticated with the group's password: a member's, or
        a new one for a peer this replica does not count as a member (yet): a leader whose
        membership entry has not reached this replica, a removed member. Such a peer's messages
        are handled as Raft says (its AppendEntries followed if its term is current, its votes and
        pre-votes ignored: it is no voter here), which lets a replica that missed a change catch up
        from a new member that leads."""
        node = self.dl_nodes.get(address)
        return node if node is not None else PeerNode(address)

    def _dl_forget(self, node: Any) -> None:
        self._SyncObj__raftNextIndex.pop(node, None)
        self._SyncObj__raftMatchIndex.pop(node, None)
        self._SyncObj__lastResponseTime.pop(node, None)
        self.dl_probing.discard(node)
        self.dl_last_install.pop(node, None)

    def dl_transfer(self, target: Any = None) -> bool:
        """Leadership transfer (Raft TimeoutNow) to ``target`` or the most caught-up connected
        voter; False (nothing sent) when it is not a connected voter whose log is complete."""
        if self.dl_state != RAFT_STATE_LEADER:
            return False
        match = self._SyncObj__raftMatchIndex
        if target is None:
            candidates = [(match.get(n, 0), n.id, n) for n in self.dl_peers if self.isNodeConnected(n)]
            if not candidates:
                return False
            target = max(candidates)[2]
        if target not in self.dl_peers or not self.isNodeConnected(target):
            return False
        if match.get(target, 0) != self._SyncObj__getCurrentLogIndex():
            return False
        return bool(self.dl_transport.send(target, {"type": "timeout_now", "term": self._SyncObj__raftCurrentTerm}))

    def dl_skip_replay(self, applied_index: int) -> None:
        """Before the first tick: SyncObj need not re-run entries that are already applied."""
        store = self.dl_journal.store
        floor = max(1, store.anchor[0])
        applied = max(floor, min(applied_index, store.last_index))
        self._SyncObj__raftLastApplied = applied
        self._SyncObj__raftCommitIndex = max(int(self.raftCommitIndex), applied)

    def dl_send_now(self) -> None:
        if self.dl_state == RAFT_STATE_LEADER:
            self._SyncObj__sendAppendEntries()

    def dl_block_writes(self, exc: StoreFullError) -> None:
        """The log had no room for a write: stop leading (hand over first when a follower is fully
        caught up) and stand for no election until writes succeed again."""
        first = self.dl_write_blocked is None
        self.dl_write_blocked = exc
        self.dl_counters["writes_refused_disk_full"] += 1
        if first:
            log.error("the log refuses writes (no room): %s", exc)
        if self.dl_state == RAFT_STATE_LEADER:
            self.dl_transfer(None)  # best effort: denied unless one is caught up
            self._dl_step_down(None, "disk_full")
        elif self.dl_state == RAFT_STATE_CANDIDATE:
            self._dl_step_down(None, "disk_full")

    def dl_unblock_writes(self, why: str) -> None:
        if self.dl_write_blocked is not None:
            self.dl_write_blocked = None
            log.warning("the log takes writes again: %s", why)

    def dl_next_deadline(self) -> float:
        """When the Raft timer next needs a tick (on the node's clock): a leader's next heartbeat,
        or a follower's (candidate's) election timeout."""
        if self.dl_state == RAFT_STATE_LEADER:
            return float(self._SyncObj__newAppendEntriesTime)
        return float(self._SyncObj__raftElectionDeadline)

    def dl_send_ack(self, node: Any, next_index: int) -> None:
        """A success answer the replica held until its entries were durable (item 6)."""
        self.dl_transport.send(
            node, {"type": "next_node_idx", "next_node_idx": next_index, "reset": False, "success": True}
        )

    def _dl_read_pending(self) -> None:
        read = getattr(self.dl_poller, "read_pending", None)
        if read is not None:
            read()
        else:  # pysyncobj's own pollers (unit tests that build a DLedgerSyncObj by hand)
            self.dl_poller.poll(0)

    # -- item 5: the tick loop --------------------------------------------------------------
    def _onTick(self, timeToWait: float = 0.0) -> None:
        transport = self.dl_transport
        if not transport.ready:
            try:
                transport.tryGetReady()
            except TransportNotReadyError:
                pass
            if not transport.ready:
                self.dl_poller.poll(timeToWait)
                return
        now = dl_clock.current_monotonic()
        last_tick, self.dl_last_tick_at = self.dl_last_tick_at, now
        if last_tick is not None and now - last_tick > STALL_FRACTION * self.dl_conf.raftMinTimeout:
            self._dl_after_stall(now, now - last_tick)
        if now >= self.dl_next_second:
            self.dl_next_second = now + 1.0
            self.dl_journal.onOneSecondTimer()
        if self.dl_state != RAFT_STATE_LEADER and self._SyncObj__raftElectionDeadline < now:
            self._dl_read_pending()  # heartbeats that already arrived come first
            now = dl_clock.current_monotonic()
            if (
                self.dl_state != RAFT_STATE_LEADER
                and self._SyncObj__raftElectionDeadline < now
                and self.dl_self_voter  # a learner or a removed member never campaigns
                and (not self.dl_peers or any(self.isNodeConnected(n) for n in self.dl_peers))
                and self.dl_write_blocked is None  # a replica that cannot write must not lead
            ):
                self._dl_campaign(now)
        if self.dl_state == RAFT_STATE_LEADER:
            self._dl_advance_commit()
            self._dl_check_quorum(now)
        # pysyncobj's apply loop would read every committed entry back only to skip it (our
        # entries are not pysyncobj commands): the node applies them itself.
        if self._SyncObj__raftCommitIndex > self._SyncObj__raftLastApplied:
            self._SyncObj__raftLastApplied = self._SyncObj__raftCommitIndex
        if self.dl_state == RAFT_STATE_LEADER and now > self._SyncObj__newAppendEntriesTime:
            self._SyncObj__sendAppendEntries()
        for callback in self.dl_tick_callbacks:
            callback()
        self.dl_poller.poll(timeToWait)

    def dl_after_input(self) -> None:
        """The light tick, after input or appends (the replica's own work follows it): what input
        may have moved — a leader's commit index, from answers or its own flush. The timers
        (elections, heartbeats, check-quorum, the stall guard, the transport's keep-alives and
        connects) wait for the full tick (``_onTick``), which the owner runs at least every 50 ms."""
        if self.dl_state == RAFT_STATE_LEADER:
            self._dl_advance_commit()
        if self._SyncObj__raftCommitIndex > self._SyncObj__raftLastApplied:
            self._SyncObj__raftLastApplied = self._SyncObj__raftCommitIndex

    # Tick callbacks (ours, the transport's) in a list of our own: the full tick runs them.
    def addOnTickCallback(self, callback: Callable[[], None]) -> None:
        self.dl_tick_callbacks.append(callback)

    def removeOnTickCallback(self, callback: Callable[[], None]) -> None:
        if callback in self.dl_tick_callbacks:
            self.dl_tick_callbacks.remove(callback)

    # The log's end, read from the store (SyncObj reads it through the journal, an object per call).
    def _SyncObj__getCurrentLogIndex(self) -> int:
        return int(self.dl_journal.store.last_index)

    def _SyncObj__getCurrentLogTerm(self) -> int:
        return int(self.dl_journal.store.last_term)

    def _SyncObj__generateRaftTimeout(self) -> float:
        low, high = self.dl_conf.raftMinTimeout, self.dl_conf.raftMaxTimeout
        return float(low + (high - low) * self.dl_rng.random())

    def _dl_majority(self, count: int) -> bool:
        return count > (len(self.dl_peers) + (1 if self.dl_self_voter else 0)) / 2

    def _dl_in_lease(self, now: float) -> bool:
        """Heard from a live leader within the minimum election timeout (or is the leader)."""
        if self.dl_state == RAFT_STATE_LEADER:
            return True
        if self._SyncObj__raftLeader is not None and now < self.dl_stall_grace_until:
            return True  # this node stalled: its leader's silence proves nothing yet
        contact = self.dl_last_leader_contact
        return (
            self._SyncObj__raftLeader is not None
            and contact is not None
            and now - contact < self.dl_conf.raftMinTimeout
        )

    def _dl_log_ok(self, last_log_index: int, last_log_term: int) -> bool:
        """The candidate's log is at least as up to date as ours (Raft §5.4.1)."""
        my_term = self._SyncObj__getCurrentLogTerm()
        return last_log_term > my_term or (
            last_log_term == my_term and last_log_index >= self._SyncObj__getCurrentLogIndex()
        )

    def _dl_campaign(self, now: float) -> None:
        self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()
        if self._SyncObj__transferInProgress or not self.dl_prevote:
            self._dl_start_election(transfer=bool(self._SyncObj__transferInProgress))
            return
        self.dl_counters["prevotes_started"] += 1
        self.dl_prevote_round += 1
        self.dl_prevote_term = self._SyncObj__raftCurrentTerm + 1
        self.dl_prevote_grants = set()
        if self.dl_leader is not None:
            self._SyncObj__raftLeader = None
            self._SyncObj__onLeaderChanged()
        message = {
            "type": "dl_pre_vote",
            "term": self.dl_prevote_term,
            "last_log_index": self._SyncObj__getCurrentLogIndex(),
            "last_log_term": self._SyncObj__getCurrentLogTerm(),
            "round": self.dl_prevote_round,
        }
        for node in self.dl_others():
            self.dl_transport.send(node, message)
        if self._dl_majority(1):
            self._dl_start_election(transfer=False)

    def _dl_after_stall(self, now: float, gap_s: float) -> None:
        """This replica's thread did not run for ``gap_s``: restart what measured the peers' silence."""
        self.dl_counters["stalls"] += 1
        if self.dl_state == RAFT_STATE_LEADER:
            self.dl_stall_grace_until = now + self.dl_conf.leaderFallbackTimeout
        else:
            restarted = now + self._SyncObj__generateRaftTimeout()
            if self._SyncObj__raftElectionDeadline < restarted:
                self._SyncObj__raftElectionDeadline = restarted
            self.dl_stall_grace_until = now + self.dl_conf.raftMinTimeout
        log.warning(
            "the replica's thread did not tick for %.0f ms (%s): election timer and quorum check restarted",
            gap_s * 1000, "leader" if self.dl_state == RAFT_STATE_LEADER else "follower",
        )

    def _dl_start_election(self, transfer: bool) -> None:
        self.dl_counters["elections_started"] += 1
        self.dl_prevote_term = None
        self._SyncObj__transferInProgress = False
        self._SyncObj__raftLeader = None
        self._SyncObj__setState(RAFT_STATE_CANDIDATE)
        # Durable before the request leaves: our own vote is a vote like any other.
        self._SyncObj__setCurrentTerm(self._SyncObj__raftCurrentTerm + 1, self.selfNode.id)
        self._SyncObj__votesCount = 1
        self.dl_voters = set()
        message = {
            "type": "request_vote",
            "term": self._SyncObj__raftCurrentTerm,
            "last_log_index": self._SyncObj__getCurrentLogIndex(),
            "last_log_term": self._SyncObj__getCurrentLogTerm(),
            "dl_transfer": transfer,
        }
        for node in self.dl_others():
            self.dl_transport.send(node, message)
        self._SyncObj__onLeaderChanged()
        if self._dl_majority(1):
            self._dl_become_leader()

    def _dl_become_leader(self) -> None:
        self.dl_counters["became_leader"] += 1
        self.dl_probing = set(self.dl_targets)
        # Stock sets up the peers it started with and then replicates (our sender, to the members
        # in force, item 10): the members it does not know are set up first.
        last = self._SyncObj__getCurrentLogIndex()
        for node in self.dl_targets:
            self._SyncObj__raftNextIndex[node] = last + 1
            self._SyncObj__raftMatchIndex[node] = 0
        self._SyncObj__onBecomeLeader()
        now = dl_clock.current_monotonic()
        for node in self.dl_targets:
            self._SyncObj__lastResponseTime.setdefault(node, now)
        targets = set(self.dl_targets)
        for node in [n for n in self._SyncObj__raftMatchIndex if n not in targets]:
            self._dl_forget(node)

    def _dl_step_down(self, term: int | None, reason: str) -> None:
        if term is not None and term > self._SyncObj__raftCurrentTerm:
            self._SyncObj__setCurrentTerm(term, None)
        was_leader = self.dl_state == RAFT_STATE_LEADER
        self._SyncObj__setState(RAFT_STATE_FOLLOWER)
        self._SyncObj__raftLeader = None
        self.dl_prevote_term = None
        if was_leader:
            self.dl_counters[f"stepdowns_{reason}"] += 1
            log.warning("stepping down as leader: %s", reason.replace("_", " "))

    def _dl_quorum_commit(self) -> int:
        match = self._SyncObj__raftMatchIndex
        return quorum_commit_index(
            self._SyncObj__raftCommitIndex,
            min(self.dl_hooks.self_match_index(), self._SyncObj__getCurrentLogIndex()),
            [match.get(n, 0) for n in self.dl_peers],
            self._SyncObj__raftCurrentTerm,
            self._dl_term_at,
            count_self=self.dl_self_voter,
        )

    def dl_commit_may_advance(self) -> bool:
        """Would the light tick move this leader's commit index now (``_dl_advance_commit``)?
        Exact: a majority of the voters above the commit index first (cheap, and false at most
        calls: a second answer after the commit moved, the leader's own flush before any answer),
        then the commit rule itself."""
        if self._SyncObj__raftState != RAFT_STATE_LEADER:
            return False
        commit = self._SyncObj__raftCommitIndex
        match = self._SyncObj__raftMatchIndex
        above = 1 if self.dl_self_voter and self.dl_hooks.self_match_index() > commit else 0
        for node in self.dl_peers:
            if match.get(node, 0) > commit:
                above += 1
        return self._dl_majority(above) and self._dl_quorum_commit() != commit

    def _dl_advance_commit(self) -> None:
        commit = self._SyncObj__raftCommitIndex
        new = self._dl_quorum_commit()
        if new != commit:
            self._SyncObj__raftCommitIndex = new
            self.dl_journal.setRaftCommitIndex(new)
        self._SyncObj__leaderCommitIndex = new

    def _dl_check_quorum(self, now: float) -> None:
        if now < self.dl_stall_grace_until:
            return  # this leader stalled: the followers' answers have not had time to come
        deadline = now - self.dl_conf.leaderFallbackTimeout
        responses = self._SyncObj__lastResponseTime
        heard = 1 + sum(1 for n in self.dl_peers if responses.get(n, deadline) > deadline)
        if not self._dl_majority(heard):
            self._dl_step_down(None, "check_quorum")

    # -- incoming messages (items 2, 3, 5 and the install message) -------------------------------
    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        mtype = message.get("type") if type(message) is dict else None
        if mtype == "append_entries" or mtype == "dl_install":
            try:
                if mtype == "append_entries":
                    self._dl_on_append_entries(node, message)
                else:
                    self._dl_on_install(node, message)
            except StoreFullError as exc:
                # Nothing of the entry that found no room was kept, and no answer leaves: this
                # replica never acknowledges what it did not store; the leader sends it again.
                self.dl_block_writes(exc)
        elif mtype == "next_node_idx":
            if node in self.dl_nodes.values():  # not from a member removed meanwhile
                self._dl_on_next_node_idx(node, message)
        elif mtype in ("request_vote", "dl_pre_vote") and (not self.dl_self_voter or node not in self.dl_peers):
            # Item 10: a learner or a removed member neither votes nor asks for votes.
            self.dl_counters["votes_ignored_not_voter"] += 1
        elif mtype == "request_vote":
            now = dl_clock.current_monotonic()
            if (
                message["term"] > self._SyncObj__raftCurrentTerm
                and not message.get("dl_transfer")
                and self._dl_in_lease(now)
            ):
                self.dl_counters["votes_ignored_in_lease"] += 1
                return
            SyncObj._SyncObj__onMessageReceived(self, node, message)
        elif mtype == "response_vote":
            # Count each voter once (a duplicated answer must not make a majority).
            if (
                self.dl_state == RAFT_STATE_CANDIDATE
                and message["term"] == self._SyncObj__raftCurrentTerm
                and node not in self.dl_voters
                and node in self.dl_peers
            ):
                self.dl_voters.add(node)
                self._SyncObj__votesCount += 1
                if self._dl_majority(self._SyncObj__votesCount):
                    self._dl_become_leader()
        elif mtype == "dl_pre_vote":
            self._dl_on_pre_vote(node, message)
        elif mtype == "dl_pre_vote_response":
            if node in self.dl_peers:
                self._dl_on_pre_vote_response(node, message)
        elif mtype == "dl_membership":
            on_membership = getattr(self.dl_hooks, "on_install_membership", None)
            if on_membership is not None and message["term"] >= self._SyncObj__raftCurrentTerm:
                on_membership(message["index"], message["entry_term"], message["config"])
        elif mtype == "dl_stale_term":
            if message["term"] > self._SyncObj__raftCurrentTerm:
                self._dl_step_down(message["term"], "stale_term")
        elif mtype == "timeout_now":
            if self.dl_write_blocked is not None or not self.dl_self_voter:
                return  # it cannot write (or vote): no transfer to it
            SyncObj._SyncObj__onMessageReceived(self, node, message)
        else:
            log.warning("ignoring a peer message of type %r from %s", mtype, node)

    def _dl_on_append_entries(self, node: Any, message: dict[str, Any]) -> None:
        term = message["term"]
        if term < self._SyncObj__raftCurrentTerm:
            # A leader of an older term: tell it (it steps down), instead of ignoring it silently.
            self.dl_transport.send(node, {"type": "dl_stale_term", "term": self._SyncObj__raftCurrentTerm})
            return
        if "transmission" in message or "serialized" in message:
            log.error(
                "dropping a chunked/snapshot append_entries from %s: dledger peers never send them", node
            )
            return
        now = dl_clock.current_monotonic()
        self.dl_last_leader_contact = now
        self.dl_prevote_term = None
        self._dl_note_append(now)
        floor = message.get("dl_floor")
        if floor is not None:
            self.dl_hooks.on_leader_floor(int(floor))
        if "prevLogIdx" in message:
            store = self.dl_journal.store
            first = store.anchor[0] if store.anchor[0] > 0 else 1
            message, skip = align_append_entries(message, store.last_index, first, self._dl_term_at)
            self.dl_journal.skip_next_truncate = skip
        applied = self._SyncObj__raftLastApplied
        last_before = self.dl_journal.store.last_index
        if self.dl_journal.skip_next_truncate:
            # SyncObj logs CRITICAL "truncating already-applied entries" before the truncation we
            # skip (nothing is truncated): keep it from crying wolf.
            self._SyncObj__raftLastApplied = 0
        try:
            SyncObj._SyncObj__onMessageReceived(self, node, message)
        finally:
            self.dl_journal.skip_next_truncate = False
            self._SyncObj__raftLastApplied = max(applied, self._SyncObj__raftLastApplied)
        if self.dl_write_blocked is not None and self.dl_journal.store.last_index > last_before:
            self.dl_unblock_writes("entries from the leader were stored")

    def _dl_note_append(self, now: float) -> None:
        # Heartbeat spacing as this follower sees it (its own clock): the figure that shows a
        # leader's heartbeats keep their period whatever the clocks of the hosts do.
        last = self.dl_last_append_at
        if last is not None:
            self.dl_max_append_gap_s = max(self.dl_max_append_gap_s, now - last)
        self.dl_last_append_at = now
        self.dl_appends_received += 1

    def _dl_on_next_node_idx(self, node: Any, message: dict[str, Any]) -> None:
        if self.dl_state != RAFT_STATE_LEADER:
            return
        next_index = self._SyncObj__raftNextIndex
        if message["reset"]:
            # A follower's answer to a probe: its log does not match at (or ends before) the hint.
            # Answers to probes sent one after another arrive in any order; taking the lowest keeps
            # nextIndex walking back instead of bouncing between two of them (found by the
            # simulator: a leader and a follower with a stale tail probed 64 and 65 for ever).
            # Only the answer to dl_install moves it forward: the follower restarted its log there.
            hint = message["next_node_idx"]
            current = next_index.get(node, hint)
            next_index[node] = hint if message.get("installed") else min(current, hint)
            self.dl_probing.add(node)
            self._SyncObj__lastResponseTime[node] = dl_clock.current_monotonic()
            return
        success = message["success"]
        probing = node in self.dl_probing
        if success and probing:
            self.dl_probing.discard(node)
        before = next_index.get(node)
        SyncObj._SyncObj__onMessageReceived(self, node, message)
        after = next_index.get(node)
        if success and before is not None and after is not None and after < before:
            next_index[node] = before
            self.dl_rewinds_prevented += 1
        if success and not probing and not self.dl_commit_may_advance():
            # Nothing the light tick reads moved: no new commit to count, no probe ended (the
            # answer only moved this follower's match and its last response time, read by full
            # ticks). The owner may skip the light tick after this input (see dl_quiet_messages).
            self.dl_quiet_messages += 1

    def _SyncObj__sendNextNodeIdx(
        self, node: Any, reset: bool = False, nextNodeIdx: int | None = None, success: bool = False
    ) -> None:
        if nextNodeIdx is None:
            nextNodeIdx = self._SyncObj__getCurrentLogIndex() + 1
        if success and not self.dl_hooks.ack_ready(node, nextNodeIdx):
            return  # item 6: held until durable; the replica sends it (dl_send_ack)
        self.dl_transport.send(
            node, {"type": "next_node_idx", "next_node_idx": nextNodeIdx, "reset": reset, "success": success}
        )

    def _dl_on_pre_vote(self, node: Any, message: dict[str, Any]) -> None:
        now = dl_clock.current_monotonic()
        current = self._SyncObj__raftCurrentTerm
        granted = (
            message["term"] > current
            and not self._dl_in_lease(now)
            and self._dl_log_ok(message["last_log_index"], message["last_log_term"])
        )
        self.dl_counters["prevotes_granted" if granted else "prevotes_refused"] += 1
        self.dl_transport.send(
            node,
            {
                "type": "dl_pre_vote_response",
                "term": message["term"],
                "granted": granted,
                "current_term": current,
                "round": message["round"],
            },
        )

    def _dl_on_pre_vote_response(self, node: Any, message: dict[str, Any]) -> None:
        if not message["granted"] and message["current_term"] > self._SyncObj__raftCurrentTerm:
            # The voter is on a newer term: follow it there (without a vote) so we can rejoin.
            self._dl_step_down(message["current_term"], "stale_term")
            return
        if (
            self.dl_state == RAFT_STATE_LEADER
            or self.dl_prevote_term is None
            or message["round"] != self.dl_prevote_round
            or message["term"] != self.dl_prevote_term
            or not message["granted"]
        ):
            return
        self.dl_prevote_grants.add(node)
        if self._dl_majority(1 + len(self.dl_prevote_grants)):
            self._dl_start_election(transfer=False)

    def _dl_term_at(self, index: int) -> int:
        store = self.dl_journal.store
        if index == store.last_index:
            return int(store.last_term)
        return int(self.dl_journal.entry_at_index(index).term)

    def _dl_on_install(self, node: Any, message: dict[str, Any]) -> None:
        term = message["term"]
        if term < self._SyncObj__raftCurrentTerm:
            self.dl_transport.send(node, {"type": "dl_stale_term", "term": self._SyncObj__raftCurrentTerm})
            return
        # Like an AppendEntries: only the leader of this term sends it, so follow it.
        if term > self._SyncObj__raftCurrentTerm:
            self._SyncObj__setCurrentTerm(term, None)
        self._SyncObj__setState(RAFT_STATE_FOLLOWER)
        if self.dl_leader != node:
            self._SyncObj__onLeaderChanged()
            self._SyncObj__raftLeader = node
        self.dl_prevote_term = None
        anchor_index, anchor_term, anchor_chain = message["anchor"]
        store = self.dl_journal.store
        has_anchor = (
            store.anchor[0] <= anchor_index <= store.last_index
            and self._dl_term_at(anchor_index) == anchor_term
        )
        if not has_anchor:
            log.warning(
                "leader %s no longer holds our next entry: restarting the log after its anchor %d (term %d)",
                node,
                anchor_index,
                anchor_term,
            )
            store.reset(anchor_index, anchor_term, anchor_chain)
            self._SyncObj__raftLastApplied = anchor_index
            self._SyncObj__raftCommitIndex = max(self._SyncObj__raftCommitIndex, anchor_index)
            self.dl_journal.setRaftCommitIndex(self._SyncObj__raftCommitIndex)
            self.dl_hooks.on_install_anchor(anchor_index)
        now = dl_clock.current_monotonic()
        self.dl_last_leader_contact = now
        self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()
        self.dl_transport.send(
            node,
            {
                "type": "next_node_idx",
                "next_node_idx": anchor_index + 1,
                "reset": True,
                "success": False,
                "installed": True,
            },
        )

    # -- item 4: replication --------------------------------------------------------------------
    def _SyncObj__sendAppendEntries(self) -> None:
        self._SyncObj__newAppendEntriesTime = dl_clock.current_monotonic() + self.dl_conf.appendEntriesPeriod
        self.dl_commit_sent = int(self._SyncObj__raftCommitIndex)
        nodes = self.dl_targets
        if not nodes:
            return
        self.dl_rotation = (self.dl_rotation + 1) % len(nodes)
        # Followers at the same next index get the same first message (same entries, term,
        # commit index and floor: nothing moves during the round): read and encoded once.
        self.dl_round_messages = {}
        try:
            for node in nodes[self.dl_rotation :] + nodes[: self.dl_rotation]:
                if self.isNodeConnected(node):
                    self._dl_replicate_to(node)
        finally:
            self.dl_round_messages = None

    def _dl_replicate_to(self, node: Any) -> None:
        store = self.dl_journal.store
        transport = self.dl_transport
        if transport.pending_bytes(node) > self.dl_max_queued_bytes:
            return  # the connection is clogged: anything more would only queue in RAM
        next_index = max(1, min(self._SyncObj__raftNextIndex[node], store.last_index + 1))
        self._SyncObj__raftNextIndex[node] = next_index
        probing = node in self.dl_probing
        anchor_index = store.anchor[0]
        if anchor_index > 0 and next_index <= anchor_index:
            self._dl_send_install(node)
            return
        term = self._SyncObj__raftCurrentTerm
        floor: int | None = None
        sent_bytes = 0
        first_message = True
        memo = self.dl_round_messages
        while True:
            message = memo.get(next_index) if first_message and memo is not None else None
            if message is not None:
                entries = message["entries"]
            else:
                prev = next_index - 1
                visible_first = anchor_index if anchor_index > 0 else 1
                prev_term = self._dl_term_at(prev) if prev >= visible_first else None
                entries = []
                if next_index <= store.last_index:
                    batch = store.read_range(next_index, 100_000, self.dl_batch_bytes)
                    entries = [(e.body, e.index, e.term) for e in batch]
                if not entries and not first_message:
                    return
                if floor is None:
                    floor = self.dl_hooks.retention_floor()
                message = peer_codec.SharedMessage(
                    type="append_entries",
                    term=term,
                    commit_index=int(self._SyncObj__raftCommitIndex),
                    entries=entries,
                    prevLogIdx=prev if prev_term is not None else None,
                    prevLogTerm=prev_term,
                    dl_floor=floor,
                )
                if first_message and memo is not None:
                    memo[next_index] = message
            if not transport.send(node, message):
                return
            first_message = False
            if not entries or probing:
                return
            next_index = entries[-1][1] + 1
            self._SyncObj__raftNextIndex[node] = next_index
            sent_bytes += sum(len(e[0]) for e in entries)
            if (
                sent_bytes >= self.dl_per_call_budget_bytes
                or transport.pending_bytes(node) > self.dl_max_queued_bytes
            ):
                return

    def _dl_send_install(self, node: Any) -> None:
        now = dl_clock.current_monotonic()
        last = self.dl_last_install.get(node)
        if last is not None and now - last < 1.0:
            return
        self.dl_last_install[node] = now
        self.dl_installs_sent += 1
        anchor = self.dl_journal.store.anchor
        log.info("follower %s needs entries before our anchor %d: sending dl_install", node, anchor[0])
        for_install = getattr(self.dl_hooks, "membership_for_install", None)
        placed = for_install(anchor[0]) if for_install is not None else None
        if placed is not None:  # the membership in force at the anchor (its entry may be gone)
            index, entry_term, config = placed
            self.dl_transport.send(
                node,
                {
                    "type": "dl_membership",
                    "term": self._SyncObj__raftCurrentTerm,
                    "index": index,
                    "entry_term": entry_term,
                    "config": config,
                },
            )
        self.dl_transport.send(
            node, {"type": "dl_install", "term": self._SyncObj__raftCurrentTerm, "anchor": tuple(anchor)}
        )
