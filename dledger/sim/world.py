"""The deterministic simulator: N replicas of the production code in one thread, driven by one seed.

Everything that could differ between two runs comes from the seed: simulated time (an event
queue, no sleeps), each node's clock (offset and drift), the network's delays, losses,
duplicates and partitions, crashes (losing unflushed writes) and restarts, pauses, slow fsyncs,
the client's requests and the election timeouts (each node's own ``random.Random``). The same
seed replays the same run bit for bit (``trace_crc`` says so), whatever PYTHONHASHSEED is.

A run::

    fault phase (``steps`` events: ticks, deliveries, client requests, faults)
      -> heal everything (restart, resume, reconnect, clean network)
      -> liveness: a leader commits a new request within ``liveness_s`` simulated seconds, and
         every replica reaches the same commit index with the same chain CRC
      -> every acknowledged request is in the committed log

The client plants poison bodies (``poison_share`` of its requests, from their own random stream):
bodies the state machine cannot apply. They commit like any other and every replica must refuse
them alike and keep going (docs/DLEDGER.md, "Refused records"); a replica whose apply raises, or
two replicas with different outcomes for one entry, is a violation.

The checker (``checker.py``) runs after every event; a broken property raises ``Violation``.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
import struct
import zlib
from collections.abc import Callable
from typing import Any

from dledger import clock as dl_clock
from dledger import peer_codec
from dledger.records import (
    AppendFailedError,
    AppendTimeoutError,
    BodyLocation,
    DLedgerError,
    NotLeaderError,
    RaftSettings,
    Refused,
    StateMachineError,
)
from dledger.replica import Request
from dledger.sim.checker import Checker, Violation
from dledger.sim.network import LinkModel, SimNetwork
from dledger.sim.replica import FSYNC_DELAY_S, POISON, ClientOp, SimClock, SimReplica

# Failed fsyncs (see SimOptions.fsync_error_every_s): off unless a run (or a plant) asks.
FSYNC_ERROR_EVERY_S = 0.0

TICK_S = 0.010
RAFT_LEADER = 2


@dataclasses.dataclass(frozen=True)
class SimOptions:
    nodes: int = 3
    steps: int = 3000
    faults: bool = True
    liveness_s: float = 30.0
    client_interval_s: float = 0.02
    crash_after_vote: float = 0.05  # chance that a node crashes right after it sends a vote
    crash_after_ack: float = 0.002  # ... right after a follower acknowledges entries
    poison_share: float = 0.03  # client requests whose body the state machine refuses (sim/replica.py)
    # Mean seconds between failed fsyncs (EIO; the pages are lost, sim/replica.py) while faults are
    # on; None: FSYNC_ERROR_EVERY_S (0: off, so existing seeds replay as before).
    fsync_error_every_s: float | None = None
    # Issue 27: membership changes under faults. Two spare replicas (n3, n4 of five) start as
    # learners outside the group; the nemesis asks the leader for single-server changes (add a
    # learner, promote it, remove a voter that does not lead, remove a learner), between 3 and 5
    # voters. Off by default: the other seeds replay as before.
    membership: bool = False


@dataclasses.dataclass
class SimResult:
    seed: int
    ok: bool
    error: str | None
    steps: int
    sim_time_s: float
    acked: int
    elections: int
    crashes: int
    messages: int
    trace_crc: int
    leader_terms: int
    refused: int = 0  # poison bodies committed and refused by every replica
    fail_stops: int = 0  # replicas that failed stop on a failed fsync (and were restarted)
    member_changes: int = 0  # membership changes a leader appended (SimOptions.membership)

    def line(self) -> str:
        status = "ok" if self.ok else f"FAIL: {self.error}"
        return (
            f"seed {self.seed}: {status} | steps {self.steps}, sim {self.sim_time_s:.1f} s, acked {self.acked}, "
            f"refused {self.refused}, "
            f"leader terms {self.leader_terms}, crashes {self.crashes}, messages {self.messages}, "
            f"trace {self.trace_crc:08x}"
        )


class World:
    def __init__(self, seed: int, options: SimOptions = SimOptions()):
        self.seed = seed
        self.opts = options
        every = options.fsync_error_every_s
        self._fsync_error_every_s = FSYNC_ERROR_EVERY_S if every is None else every
        self.fail_stops = 0
        self.member_changes = 0
        self.rng = random.Random(seed)
        self.poison_rng = random.Random(seed ^ 0x9015)  # its own stream: the rest of a run draws as before
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.checker = Checker()
        self.network = SimNetwork(random.Random(self.rng.getrandbits(64)), self.after)
        self.network.model = LinkModel()
        self.trace_crc = 0
        self._next_tick: dict[str, float] = {}
        self._light_pending: set[str] = set()
        self.ops: list[ClientOp] = []
        self.events = 0
        self._faults_on = False
        self._client_on = False
        spares = 2 if options.membership else 0
        ids = [f"n{k}" for k in range(options.nodes + spares)]
        addresses = {nid: f"10.0.0.{k + 1}:40911" for k, nid in enumerate(ids)}
        self.initial_voters = ids[: options.nodes]
        peers = {nid: addresses[nid] for nid in self.initial_voters}
        segment_bytes = self.rng.choice([16 << 10, 64 << 10, 1 << 20])
        retention = self.rng.random() < 0.3
        batch_bytes = self.rng.choice([2048, 16 << 10, 1 << 20])  # small: catch-up in many messages
        self.replicas: dict[str, SimReplica] = {}
        for nid in ids:
            learner = nid not in peers  # a spare: joins as a learner when the group adds it
            settings = RaftSettings(
                group="SimGroup",
                self_id=nid,
                peers={**peers, nid: addresses[nid]} if learner else peers,
                learner=learner,
                data_dir=f"/sim/{nid}",
                password="",
                segment_bytes=segment_bytes,
                entry_target_bytes=4096,
                replication_batch_bytes=batch_bytes,
                max_entry_bytes=8192,
                retention_hours=(2.0 / 3600) if retention else 72.0,
                retention_check_ms=500,
                live_follower_s=2.0,
            )
            clock = SimClock(
                lambda: self.now,
                offset_s=self.rng.choice([1.0, 60.0, 3600.0, 7 * 3600.0]) + self.rng.random() * 100,
                drift=self.rng.uniform(-1e-3, 1e-3),
                wall_base_s=1.8e9,
            )
            self.replicas[nid] = SimReplica(
                nid,
                settings,
                self.network,
                self.checker,
                clock,
                random.Random(self.rng.getrandbits(64)),
                self.poke,
                segment_bytes,
                self.after,
            )
        for nid, r in self.replicas.items():
            r.on_fatal = lambda exc, nid=nid: self._fail_stop(nid, exc)
        self._install_targeted_crashes()

    # -- the event queue ------------------------------------------------------------------------------
    def after(self, delay_s: float, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now + max(0.0, delay_s), self._seq, action))

    def _run_one(self) -> bool:
        if not self._queue:
            return False
        at, _seq, action = heapq.heappop(self._queue)
        self.now = max(self.now, at)
        self.events += 1
        self.checker.step = self.events
        action()
        return True

    def _trace(self, *fields: Any) -> None:
        self.trace_crc = zlib.crc32(repr(fields).encode(), self.trace_crc)

    # -- replicas -----------------------------------------------------------------------------------
    def poke(self, node: str) -> None:
        """Input reached ``node`` (a message, or its flush job returned): as its event loop would,
        it hands the input over and runs a light tick soon (``ReplicaCore.after_input``); the
        timers wait for its full ticks (every TICK_S)."""
        if node in self._light_pending:
            return
        self._light_pending.add(node)
        self.after(0.0005, lambda: self._light_tick(node))

    def _light_tick(self, node: str) -> None:
        self._light_pending.discard(node)
        r = self.replicas[node]
        if r.core is None:
            return
        if self.now < r.paused_until:
            self.after(r.paused_until - self.now, lambda: self.poke(node))
            return
        dl_clock.use(r.clock)
        if r.transport is not None:
            r.transport.drain()
        if r.core is None:  # crashed while handling the input (a targeted crash)
            return
        self._drive(node, r.core.after_input)
        r.observe()
        sync = r.core.sync if r.core is not None else None
        if sync is not None:
            self._trace(
                "l", node, round(self.now, 6), sync.dl_state, sync.raftCurrentTerm, r.store.last_index
            )

    def _drive(self, node: str, step: Callable[[], None]) -> None:
        """Run one step of ``node``'s core: its full tick or its light tick (either applies
        committed entries). A ``StateMachineError`` out of it is the replica stopping (in
        production its process exits 70): a violation, as is the checker's own, raised inside
        ``apply`` and wrapped by the core."""
        try:
            step()
        except StateMachineError as exc:
            if isinstance(exc.__cause__, Violation):
                raise exc.__cause__ from None
            self.checker.on_apply_failed(node, exc)

    def _schedule_tick(self, node: str, delay_s: float) -> None:
        at = self.now + delay_s
        if self._next_tick.get(node, float("inf")) <= at:
            return
        self._next_tick[node] = at
        self.after(delay_s, lambda: self._tick(node, at))

    def _tick(self, node: str, scheduled_at: float) -> None:
        if self._next_tick.get(node) != scheduled_at:
            return  # superseded by an earlier tick
        del self._next_tick[node]
        r = self.replicas[node]
        if r.core is None:
            return
        if self.now < r.paused_until:
            self._schedule_tick(node, r.paused_until - self.now)
            return
        dl_clock.use(r.clock)
        core = r.core
        self._drive(node, lambda: core.tick(0))
        r.observe()
        sync = r.core.sync if r.core is not None else None
        if sync is not None:
            self._trace(
                "t", node, round(self.now, 6), sync.dl_state, sync.raftCurrentTerm, r.store.last_index
            )
        self._schedule_tick(node, TICK_S / (1.0 + r.clock.drift))  # type: ignore[attr-defined]

    def _start(self, node: str) -> None:
        r = self.replicas[node]
        if r.core is not None:
            return
        dl_clock.use(r.clock)
        r.start()
        self._trace("start", node, round(self.now, 6))
        self._schedule_tick(node, 0.0)

    def _crash(self, node: str, restart_after_s: float | None) -> None:
        r = self.replicas[node]
        if r.core is None:
            return
        r.crash()
        self._next_tick.pop(node, None)
        self._trace("crash", node, round(self.now, 6), r.store.last_index)
        if restart_after_s is not None:
            self.after(restart_after_s, lambda: self._start(node))

    def _install_targeted_crashes(self) -> None:
        """Crash a node right after it votes or acknowledges, now and then: the moments where a
        missing fsync would matter."""
        deliver = self.network.deliver

        def deliver_and_maybe_crash(src: str, dst: str, frame: bytes) -> bool:
            sent = deliver(src, dst, frame)
            code = frame[2]  # [VERSION, type_code, ...]: msgpack fixarray, fixint, fixint
            if code == 4:  # response_vote: the voter must remember it (Figure 2)
                voter = next(n for n, r in self.replicas.items() if r.address == src)
                self.checker.on_vote_sent(voter, peer_codec.decode(frame)["term"])
            if not self._faults_on:
                return sent
            p = self.opts.crash_after_vote if code == 4 else self.opts.crash_after_ack if code == 2 else 0.0
            if p and self.rng.random() < p:
                node = next(n for n, r in self.replicas.items() if r.address == src)
                self.after(self.rng.uniform(0, 0.003), lambda: self._crash(node, self.rng.uniform(0.01, 0.5)))
            return sent

        self.network.deliver = deliver_and_maybe_crash  # type: ignore[method-assign]

    # -- the client -------------------------------------------------------------------------------------
    def _client(self) -> None:
        leaders = [r for r in self.replicas.values() if r.core is not None and r.core.role == "LEADER"]
        if leaders:
            r = self.rng.choice(leaders)
            op = ClientOp(len(self.ops), r.id, self.now)
            self.ops.append(op)
            size = self.rng.choice([16, 100, 1000, 5000])
            bodies = [struct.pack("<Q", op.op_id) + bytes(size)]
            if self.poison_rng.random() < self.opts.poison_share:
                bodies = [POISON + bodies[0]]  # committed like any other; refused when applied
            assert r.core is not None
            r.core.submit(Request(bodies, size + 16, self._done_for(op), r.clock.monotonic()))
            self.poke(r.id)
        if self._client_on:
            self.after(self.rng.uniform(0.5, 1.5) * self.opts.client_interval_s, self._client)

    def _done_for(self, op: ClientOp) -> Callable[[list[BodyLocation] | None, BaseException | None], None]:
        return lambda result, exc: self._done(op, result, exc)

    def _done(self, op: ClientOp, result: list[BodyLocation] | None, exc: BaseException | None) -> None:
        if result is not None:
            refused = isinstance(result[0].result, Refused)
            op.outcome, op.index, op.term = "refused" if refused else "ok", result[0].index, result[0].term
            self.checker.on_ack(op.index, op.term)  # committed either way (a refusal is an outcome)
        elif isinstance(exc, (NotLeaderError, AppendFailedError)):
            op.outcome = "failed"
        elif isinstance(exc, AppendTimeoutError):
            op.outcome = "unknown"
        else:
            op.outcome = f"error: {exc!r}"

    # -- faults -------------------------------------------------------------------------------------------
    def _nemesis(self) -> None:
        if not self._faults_on:
            return
        rng = self.rng
        ids = list(self.replicas)
        kind = rng.choices(
            [
                "crash",
                "crash_leader",
                "pause",
                "isolate",
                "split",
                "one_way",
                "network",
                "slow_fsync",
                "none",
                "member",
            ],
            weights=[3, 3, 2, 2, 2, 2, 2, 1, 2, 4 if self.opts.membership else 0],
        )[0]
        duration = rng.uniform(0.05, 3.0)
        self._trace("nemesis", kind, round(self.now, 6))
        if kind in ("crash", "crash_leader"):
            leaders = [n for n, r in self.replicas.items() if r.core is not None and r.core.role == "LEADER"]
            node = rng.choice(leaders) if kind == "crash_leader" and leaders else rng.choice(ids)
            self._crash(node, rng.uniform(0.01, 2.0))
        elif kind == "pause":
            r = self.replicas[rng.choice(ids)]
            r.paused_until = max(r.paused_until, self.now + duration)
        elif kind == "isolate":
            node = self.replicas[rng.choice(ids)].address
            for other in self.replicas.values():
                if other.address != node:
                    self.network.cut(node, other.address)
            self.after(duration, self.network.heal_all)
        elif kind == "split":
            addrs = [r.address for r in self.replicas.values()]
            rng.shuffle(addrs)
            cut_at = rng.randint(1, len(addrs) - 1)
            for a in addrs[:cut_at]:
                for b in addrs[cut_at:]:
                    if len(addrs) >= 5 and rng.random() < 0.2:
                        continue  # a bridge: some links of the cut survive
                    self.network.cut(a, b)
            self.after(duration, self.network.heal_all)
        elif kind == "one_way":
            a, b = rng.sample([r.address for r in self.replicas.values()], 2)
            self.network.cut(a, b, one_way=True)
            self.after(duration, self.network.heal_all)
        elif kind == "network":
            self.network.model = LinkModel(
                delay_max_s=rng.choice([0.002, 0.02, 0.1]),
                loss=rng.choice([0.0, 0.05, 0.3]),
                duplicate=rng.choice([0.0, 0.05, 0.2]),
                spike=rng.choice([0.0, 0.05, 0.2]),
            )
            self.after(duration, self._clean_network)
        elif kind == "member":
            self._member_change()
            if rng.random() < 0.5:
                self._member_change()  # at once: the leader must refuse it while one is pending
        elif kind == "slow_fsync":
            slow = self.replicas[rng.choice(ids)]
            slow.fsync_delay_s = rng.uniform(0.005, 0.2)
            self.after(duration, self._fast_fsync)
        self.after(rng.uniform(0.1, 1.0), self._nemesis)

    def _membership_driver(self) -> None:
        """Membership changes while the faults run (SimOptions.membership): often, sometimes two
        asked at once (the leader must refuse the second while the first is pending)."""
        if not self._faults_on:
            return
        self._member_change()
        if self.rng.random() < 0.5:
            self._member_change()
        self.after(self.rng.uniform(0.05, 0.4), self._membership_driver)

    def _member_change(self) -> None:
        """Ask the leader (if any) for one membership change drawn from what is possible now."""
        leader = next((r for r in self.replicas.values() if r.core is not None and r.core.role == "LEADER"), None)
        if leader is None or leader.core is None:
            return
        m = leader.core.membership.current.membership
        options: list[tuple[str, str]] = []
        options += [("add_learner", n) for n in self.replicas if n not in m.addresses()]
        options += [("promote", n) for n in sorted(m.learner_ids) if len(m.voters) < 5]
        options += [("remove", n) for n in sorted(m.voter_ids) if n != leader.id and len(m.voters) > 3]
        options += [("remove", n) for n in sorted(m.learner_ids)]
        if not options:
            return
        op, node = self.rng.choice(options)
        address = self.replicas[node].address if op == "add_learner" else None
        self._trace("member", op, node, round(self.now, 6))
        try:
            leader.core.propose_membership(op, node, address, lambda _r, _e: None, max_lag=50)
        except DLedgerError:
            return  # refused (pending, not caught up, not ready, no room): what the rules say
        self.member_changes += 1
        self.poke(leader.id)

    def _members(self) -> list[SimReplica]:
        """The replicas the group's leader counts as members (all of them without membership changes)."""
        leader = next((r for r in self.replicas.values() if r.core is not None and r.core.role == "LEADER"), None)
        if leader is None or leader.core is None:
            return list(self.replicas.values())
        members = leader.core.membership.current.membership.addresses()
        return [r for r in self.replicas.values() if r.id in members]

    def _fsync_error(self) -> None:
        """The next flush of a node (the leader half the time) fails with EIO."""
        if not self._faults_on:
            return
        leaders = [r for r in self.replicas.values() if r.core is not None and r.core.role == "LEADER"]
        pool = leaders if leaders and self.rng.random() < 0.5 else list(self.replicas.values())
        r = self.rng.choice(pool)
        r.fsync_fails_next = True
        self._trace("fsync_error", r.id, round(self.now, 6))
        self.after(self.rng.expovariate(1 / self._fsync_error_every_s), self._fsync_error)

    def _fail_stop(self, node: str, exc: BaseException) -> None:
        """A replica raised out of a flush completion (a failed fsync): its process exits and a
        supervisor restarts it from what reached the disk."""
        self.fail_stops += 1
        self._trace("fatal", node, round(self.now, 6), type(exc).__name__)
        self._crash(node, self.rng.uniform(0.05, 1.0))

    def _clean_network(self) -> None:
        self.network.model = LinkModel()

    def _fast_fsync(self) -> None:
        for r in self.replicas.values():
            r.fsync_delay_s = FSYNC_DELAY_S

    def _heal(self) -> None:
        self._faults_on = False
        self.network.heal_all()
        self._clean_network()
        self._fast_fsync()
        for node, r in self.replicas.items():
            r.paused_until = 0.0
            r.fsync_fails_next = False
            if r.core is None:
                self._start(node)
            self._schedule_tick(node, 0.0)

    # -- a run ---------------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        error: str | None = None
        try:
            with dl_clock.restored():
                self._run_phases()
        except Violation as exc:
            error = str(exc)
        elapsed = self.now
        return SimResult(
            seed=self.seed,
            ok=error is None,
            error=error,
            steps=self.events,
            sim_time_s=elapsed,
            acked=sum(1 for op in self.ops if op.outcome == "ok"),
            elections=len(self.checker.leaders),
            crashes=sum(r.crashes for r in self.replicas.values()),
            messages=self.network.sent,
            trace_crc=self.trace_crc,
            leader_terms=len(self.checker.leaders),
            refused=self.checker.refused,
            fail_stops=self.fail_stops,
            member_changes=self.member_changes,
        )

    def _run_phases(self) -> None:
        self._faults_on = self.opts.faults
        self._client_on = True
        for node in self.replicas:
            self._start(node)
        self.after(0.5, self._client)
        if self._faults_on:
            self.after(1.0, self._nemesis)
            if self.opts.membership:
                self.after(0.7, self._membership_driver)
            if self._fsync_error_every_s > 0:
                self.after(self.rng.expovariate(1 / self._fsync_error_every_s), self._fsync_error)
        while self.events < self.opts.steps and self._run_one():
            pass
        self._heal()
        self._client_on = False
        self._await_liveness()
        self._final_checks()

    def _await_liveness(self) -> None:
        deadline = self.now + self.opts.liveness_s
        probe: ClientOp | None = None
        while self.now < deadline:
            leaders = [r for r in self.replicas.values() if r.core is not None and r.core.role == "LEADER"]
            if (probe is None or probe.outcome in ("failed", "unknown")) and leaders:
                r = leaders[0]
                probe = ClientOp(len(self.ops), r.id, self.now)
                self.ops.append(probe)
                assert r.core is not None
                r.core.submit(Request([b"probe"], 16, self._done_for(probe), r.clock.monotonic()))
                self.poke(r.id)
            if probe is not None and probe.outcome == "ok" and self._converged(probe.index):
                return
            if not self._run_one():
                break
        raise Violation(
            f"liveness: no leader committed a request and brought every replica to it within "
            f"{self.opts.liveness_s} s after the faults healed (probe: {probe})"
        )

    def _converged(self, index: int) -> bool:
        states = set()
        for r in self._members():
            if r.core is None or r.core.commit_index < index or r.core.applied_index < index:
                return False
            commit = min(r.core.commit_index, r.store.last_index)
            states.add((commit, r.store.chain_crc_at(commit)))
        return len(states) == 1

    def _final_checks(self) -> None:
        for op in self.ops:
            if op.outcome in ("ok", "refused"):
                committed = self.checker.committed.get(op.index)
                if committed is None or committed[0] != op.term:
                    raise Violation(
                        f"acknowledged op {op.op_id} at ({op.index}, term {op.term}) is not committed"
                    )
        for r in self.replicas.values():
            store = r.store
            for index in (r.core.commit_index if r.core else 0,):
                if store.first_index <= index <= store.last_index:
                    want = self.checker.committed.get(index)
                    if want is not None and want != (store.term_at(index), store.chain_crc_at(index)):
                        raise Violation(f"{r.id}: committed index {index} differs at the end")


    # -- scripted scenarios (tests) ------------------------------------------------------------------
    def start(self) -> None:
        """Start every replica and the client, without faults (then drive the world by hand)."""
        self._faults_on = False
        self._client_on = True
        with dl_clock.restored():
            for node in self.replicas:
                self._start(node)
        self.after(0.5, self._client)

    def run_for(self, seconds: float) -> None:
        end = self.now + seconds
        with dl_clock.restored():
            while self._queue and self._queue[0][0] <= end:
                self._run_one()
        self.now = max(self.now, end)

    def leader(self) -> SimReplica | None:
        leaders = [r for r in self.replicas.values() if r.core is not None and r.core.role == "LEADER"]
        return leaders[0] if len(leaders) == 1 else None

    def isolate(self, node: str) -> None:
        addr = self.replicas[node].address
        for other in self.replicas.values():
            if other.address != addr:
                self.network.cut(addr, other.address)

    def heal(self) -> None:
        self.network.heal_all()

    def pause(self, node: str, seconds: float) -> None:
        r = self.replicas[node]
        r.paused_until = self.now + seconds


def run_seed(seed: int, options: SimOptions = SimOptions()) -> SimResult:
    return World(seed, options).run()
