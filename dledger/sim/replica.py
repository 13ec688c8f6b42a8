"""One simulated replica: the production ReplicaCore on the in-memory twins, its clock and its faults."""

from __future__ import annotations

import dataclasses
import errno
import random
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Final

from dledger import clock as dl_clock
from dledger.clock import Clock
from dledger.flusher import Done
from dledger.inproc import InProcTransport
from dledger.memory_store import MemoryLogStore
from dledger.meta_store import MemoryMetaStore
from dledger.records import CommittedEntry, RaftSettings, Refused, RoleChange
from dledger.replica import ReplicaCore
from dledger.sim.checker import Checker
from dledger.sim.network import SimNetwork

FSYNC_DELAY_S = 0.0002  # a flush job, unless the nemesis slows the node's disk down


class SimClock:
    """A node's clock in simulated time: its own offset, running fast or slow by ``drift``."""

    def __init__(self, now: Callable[[], float], offset_s: float, drift: float, wall_base_s: float):
        self._now = now
        self.offset_s = offset_s
        self.drift = drift
        self._wall_base_s = wall_base_s

    def monotonic(self) -> float:
        return self.offset_s + self._now() * (1.0 + self.drift)

    def wall(self) -> float:
        return self._wall_base_s + self.monotonic()


POISON: Final = b"\xffPOISON"  # a body the state machine cannot apply (the client plants some)


def refusal_of(body: bytes) -> Refused | None:
    """The simulated state machine's admission (as ``broker/store/record_rules.py`` is the broker's): a
    decision from the body alone. A poison body stands for a record whose effects would raise (a name
    no consume queue can have): it is refused, on every replica alike."""
    if body.startswith(POISON):
        return Refused("POISON", f"poison body of {len(body)} bytes")
    return None


class SimStateMachine:
    """Applies entries in order; its durable checkpoint (every few entries) is what a crash keeps.
    Every body's outcome (its CRC, or its refusal) goes to the checker, which requires every replica
    to reach the same outcome for every committed entry."""

    def __init__(self, node: str, checker: Checker, checkpoint_every: int, commit_index: Callable[[], int]):
        self.node = node
        self.checker = checker
        self._commit_index = commit_index
        self.applied = 0
        self.durable_applied = 0
        self.checkpoint_every = checkpoint_every
        self.count = 0

    def applied_index(self) -> int:
        return self.applied

    def durable_applied_index(self) -> int:
        return self.durable_applied

    def checkpoint(self) -> None:
        self.durable_applied = self.applied

    def apply(self, entries: Sequence[CommittedEntry]) -> Sequence[Sequence[Any] | None] | None:
        out: list[Sequence[Any] | None] = []
        commit = self._commit_index()
        for e in entries:
            if e.index > commit:
                self.checker.fail(f"{self.node} applied index {e.index} beyond its commit index {commit}")
            self.checker.on_commit(self.node, e.index, e.term, e.chain_crc)
            self.checker.on_apply(self.node, e.index, self.applied + 1, e.chain_crc)
            results: list[Any] = []
            for _position, body in e.bodies:
                refusal = refusal_of(body)
                results.append(zlib.crc32(body) if refusal is None else refusal)
            self.checker.on_outcome(self.node, e.index, tuple(results))
            self.applied = e.index
            self.count += 1
            out.append(results or None)
            if self.count % self.checkpoint_every == 0:
                self.durable_applied = self.applied
        return out

    def on_install(self, anchor_index: int) -> None:
        self.applied = anchor_index
        self.durable_applied = anchor_index

    def crash_image(self) -> SimStateMachine:
        image = SimStateMachine(self.node, self.checker, self.checkpoint_every, self._commit_index)
        image.applied = image.durable_applied = self.durable_applied
        return image


class SimReplica:
    def __init__(
        self,
        node_id: str,
        settings: RaftSettings,
        network: SimNetwork,
        checker: Checker,
        clock: SimClock,
        rng: random.Random,
        poke: Callable[[str], None],
        segment_bytes: int,
        after: Callable[[float, Callable[[], None]], None],
    ):
        self.id = node_id
        self.address = settings.peers[node_id]
        self.settings = settings
        self.network = network
        self.checker = checker
        self.clock: Clock = clock
        self.rng = rng
        self._poke = poke
        self.after = after  # the world's event queue: (delay from now, action)
        self.fsync_delay_s = FSYNC_DELAY_S  # how long a flush job takes (the nemesis slows it down)
        self.fsync_fails_next = False  # the next flush job fails with EIO (the fsync-error fault)
        # The world's fail-stop: the replica raised out of a flush completion (its process exits).
        self.on_fatal: Callable[[BaseException], None] | None = None
        self.store = MemoryLogStore(segment_bytes, clock, name=node_id)
        self.meta = MemoryMetaStore()
        self.sm = SimStateMachine(node_id, checker, rng.randint(1, 20), self._commit_index)
        self.core: ReplicaCore | None = None
        self.transport: InProcTransport | None = None
        self.paused_until = 0.0
        self.verified_upto = 0  # entries up to here were shown to the checker
        self.committed_upto = 0
        self.was_leader_term = -1
        self.leader_commit: tuple[int, int] = (-1, 0)  # (term, commit index) last seen as leader
        self.crashes = 0

    def _commit_index(self) -> int:
        core = self.core
        return int(core.sync.raftCommitIndex) if core is not None and core.sync is not None else 0

    @property
    def alive(self) -> bool:
        return self.core is not None

    def poke(self) -> None:
        self._poke(self.id)

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        def make_transport(sync_obj: Any, self_node: Any, other_nodes: Any) -> InProcTransport:
            self.transport = InProcTransport(
                self.network, sync_obj, self_node, other_nodes, wake=lambda: self._poke(self.id)
            )
            return self.transport

        core = ReplicaCore(
            self.settings,
            self.store,
            self.meta,
            self.sm,
            clock=self.clock,
            transport_factory=make_transport,
            events=self,
            rng=random.Random(self.rng.getrandbits(64)),
            disk_used_ratio=lambda _p: 0.1,
        )
        self.core = core
        sync = core.open(poller=_SimPoller(self), flusher=_SimFlusher(self))
        core.journal.on_truncate = self._on_truncate
        self.checker.on_restart(self.id, sync.raftCurrentTerm)
        self.verified_upto = min(self.verified_upto, self.store.anchor[0])
        self.committed_upto = min(self.committed_upto, self.store.last_index)

    def crash(self) -> None:
        """Power loss: the process is gone; what was not flushed may be lost."""
        if self.core is None:
            return
        if self.transport is not None:
            self.transport.destroy()
        self.core = None
        self.transport = None
        self.crashes += 1
        self.store = self.store.crash_image(self.rng)
        self.meta = self.meta.crash_image(self.rng)
        self.sm = self.sm.crash_image()
        self.verified_upto = self.store.anchor[0]
        self.committed_upto = 0

    # -- CoreEvents -----------------------------------------------------------------------------------
    def role_changed(self, change: RoleChange) -> None:
        pass

    # -- checks after each step ---------------------------------------------------------------------
    def _on_truncate(self, from_index: int) -> None:
        assert self.core is not None
        self.checker.on_truncate(self.id, from_index, self.core.sync.raftCommitIndex if self.core.sync else 0)
        self.verified_upto = min(self.verified_upto, from_index - 1)

    def observe(self) -> None:
        """Show the checker what changed on this replica since the last step."""
        core = self.core
        if core is None or core.sync is None:
            return
        store = self.store
        if self.verified_upto < store.anchor[0]:
            self.verified_upto = store.anchor[0]  # re-anchored (install): nothing below to check
        for e in (
            store.read_range(self.verified_upto + 1, 1 << 30, 1 << 40)
            if store.last_index > self.verified_upto
            else []
        ):
            self.checker.on_entry(self.id, e.index, e.term, e.chain_crc)
        self.verified_upto = store.last_index
        commit = min(core.sync.raftCommitIndex, store.last_index)
        if commit > self.committed_upto:
            first = max(self.committed_upto + 1, store.first_index)
            for e in store.read_range(first, commit - first + 1, 1 << 40):
                self.checker.on_commit(self.id, e.index, e.term, e.chain_crc)
            self.committed_upto = commit
        sync = core.sync
        if sync.dl_state == 2:
            term, commit = sync.raftCurrentTerm, sync.raftCommitIndex
            if self.leader_commit[0] == term and commit > self.leader_commit[1]:
                self.checker.on_leader_commit(self.id, term, commit, store.term_at(commit))
            self.leader_commit = (term, commit)
        if sync.dl_state == 2 and self.was_leader_term != sync.raftCurrentTerm:
            self.was_leader_term = sync.raftCurrentTerm
            holds: dict[int, tuple[int, int] | None] = {}
            top = self.checker.max_committed
            for index in (top,) if top >= store.first_index else ():
                holds[index] = (
                    (store.term_at(index), store.chain_crc_at(index)) if index <= store.last_index else None
                )
            if top > store.last_index:
                holds[top] = None
            self.checker.on_become_leader(self.id, sync.raftCurrentTerm, holds)


class _SimPoller:
    """pysyncobj's poller in the simulator: 'waiting for input' is reading the inbox, never blocking."""

    def __init__(self, replica: SimReplica):
        self._replica = replica

    def subscribe(self, descr: Any, callback: Any, event_mask: int) -> None:
        pass

    def unsubscribe(self, descr: Any) -> None:
        pass

    def poll(self, timeout: float) -> None:
        self.read_pending()

    def read_pending(self) -> None:
        """Before campaigning, and at the end of every tick: what already arrived."""
        transport = self._replica.transport
        if transport is not None:
            transport.drain()


class _SimFlusher:
    """The flusher in simulated time: a job completes ``fsync_delay_s`` after it was submitted
    (the nemesis makes that slow), on the world's one thread; a crash meanwhile loses it (and
    whatever it would have made durable, as the memory store's crash model decides)."""

    def __init__(self, replica: SimReplica):
        self._replica = replica

    def submit(self, job: Callable[[], None], done: Done) -> None:
        r = self._replica
        core = r.core

        def complete() -> None:
            if r.core is not core:
                return  # crashed (and maybe restarted) meanwhile: the job died with the process
            dl_clock.use(r.clock)
            if r.fsync_fails_next:  # EIO: nothing synced, and the unsynced pages are gone
                r.fsync_fails_next = False
                r.store.lose_unsynced()
                try:
                    done(OSError(errno.EIO, "Input/output error (simulated fsync failure)"))
                except Exception as exc:  # the replica fails stop, as DLedgerNode.fatal does
                    if r.on_fatal is None:
                        raise
                    r.on_fatal(exc)
                    return
            else:
                job()
                done(None)
            r.poke()

        r.after(r.fsync_delay_s, complete)

    def close(self) -> None:
        pass


@dataclasses.dataclass
class ClientOp:
    op_id: int
    node: str
    submitted_at: float
    outcome: str = "pending"  # ok | failed | unknown
    index: int = 0
    term: int = 0
