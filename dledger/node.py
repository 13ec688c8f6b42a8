"""DLedgerNode: one replica of a dledger group, owned by the event loop that serves its clients.

One thread owns a replica: the event loop thread runs Raft (pysyncobj's handlers and our tick),
the peer transport's sockets, the log writes and the state machine's apply. Nothing on the send
path waits for a hand-off between threads; blocking storage work runs on the replica's flusher
thread and comes back as one callback per job (group commit)::

    event loop thread: owns the ReplicaCore (SyncObj, store         flusher thread
    writes, apply, peer sockets); reads the node's injected clock   (dledger-flush-<id>)
    -------------------------------------------------------------   ------------------------
    append(bodies) -> core.submit -> tick soon (once per loop turn,
                                     so one turn's appends share an entry)
    tick: group requests into an entry -> store.append (pwrite)
          -> AppendEntries to the followers (socket send, this turn)
          -> flush job --------------------------- SimpleQueue ------>  fdatasync of what was
                                                                         written before the job
    peer socket readable (loop reader) -> frame -> SyncObj handler       (one job in flight; the
          (follower: append, answer held until durable) -> tick soon     next covers what was
          (not after a quiet read: answers that move no commit)          written meanwhile)
    flush done <---------------- one call_soon_threadsafe per job -----
          leader: counts itself up to what is durable -> tick soon, if the commit may advance
          follower: the answers held for it leave
    tick: commit index -> apply (state machine) -> futures of appends resolved (this thread)
    timer (call_later; due times read on the injected clock, at most TICK_MAX_S apart): the full
          tick: heartbeats, elections, check-quorum, the stall guard, retention, transport
          keep-alives; how late it fires is the loop's lag (``status()['loop']``). The ticks after
          input or appends are light (``ReplicaCore.after_input``): no timers.

Ownership is enforced: ``append``, ``status``, ``transfer_leadership`` and ``run_on_replica_thread``
raise ``RuntimeError`` on another thread than the loop's (``run_on_replica_thread`` called from
another thread hands the call to the loop instead), and so does every ``ReplicaCore`` method.

The stall guard (``syncobj_patch``): a tick later than half the minimum election timeout after the
previous one means this thread did not run (the loop was blocked by a long handler, a garbage
collection, a paused or starved process): the election timer and the quorum check restart. The
loop ticks at least every ``TICK_MAX_S`` while it runs, so a gap is a stall, not an idle loop;
the lateness of each timer tick is measured (``loop_lag_ms_max``, ``loop_stalls_100ms``).

Every wait is bounded: ``append`` has a deadline (after which the outcome is *unknown*: the entry
may still commit); queued appends are bounded by bytes. A replica whose tick, socket handler or
flush fails stops taking part (``fatal`` says why; the broker and ``dledger-node`` exit with 70 for
their supervisor).

Transports: TCP between processes (``peer_tcp``), or an ``InProcNetwork`` when every replica of
the group lives in this process (tests, the in-process broker cluster).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

from dledger import clock as dl_clock
from dledger import command_codec
from dledger.clock import Clock
from dledger.cluster_id import check_cluster_id
from dledger.entry_store import EntryStore
from dledger.flusher import Done, ThreadFlusher
from dledger.inproc import InProcNetwork, InProcTransport
from dledger.log_store import LogReader, LogStore
from dledger.loop_poller import LoopPoller
from dledger.membership import MembershipError
from dledger.meta_store import FileMetaStore, MetaStore
from dledger.peer_tcp import TcpPeerTransport
from dledger.records import (
    AppendFailedError,
    AppendTimeoutError,
    BodyLocation,
    BusyError,
    CommittedEntry,
    DiskFullError,
    DLedgerError,
    EntryRemovedError,
    EntryTooLargeError,
    NotCommittedError,
    NotLeaderError,
    RaftSettings,
    Refused,
    RoleChange,
    StateMachine,
    StateMachineError,
    TransferNotReadyError,
    to_committed,
)
from dledger.replica import ROLE_NAMES, ReplicaCore, Request

log = logging.getLogger("dledger.node")

__all__ = [
    "ROLE_NAMES",
    "AppendFailedError",
    "AppendTimeoutError",
    "BodyLocation",
    "BusyError",
    "CommittedEntry",
    "DLedgerError",
    "DLedgerNode",
    "DiskFullError",
    "EntryRemovedError",
    "EntryTooLargeError",
    "NotCommittedError",
    "NotLeaderError",
    "RaftSettings",
    "Refused",
    "RoleChange",
    "StateMachine",
    "StateMachineError",
    "TransferNotReadyError",
]

TICK_MAX_S = 0.05  # the longest the loop goes without a tick (the stall guard's premise)
# An armed timer earlier than needed by more than this is moved later (re-armed): under a steady
# stream of appends a commit told by the next append no longer needs its timer, and a full tick
# for nothing would wake the loop once per round (measured: the leader's one wasted full tick per
# round at 32 senders; see _arm_timer).
TIMER_POSTPONE_S = 0.001
# The loop's timers have a millisecond's resolution (uvloop: libuv truncates the delay to whole
# milliseconds and counts from the loop turn's cached time), so a timer often fires up to ~1 ms
# before its due time on the injected clock. A full tick that early finds nothing due yet (the
# commit it was armed to tell is due 0.3 ms later) and costs a whole tick for nothing: the timer
# is armed once more for the rest instead (at most once per due time, so a clock that does not
# advance cannot hold the tick back).
TIMER_EARLY_S = 0.0002
LAG_STALL_S = 0.1  # a timer tick this late counts in loop_stalls_100ms
TRANSFER_RETRY_S = 0.005  # a transfer refused because the target is behind is asked again after this


class DLedgerNode:
    def __init__(
        self,
        settings: RaftSettings,
        state_machine: StateMachine | None = None,
        *,
        clock: Clock | None = None,
        disk_used_ratio: Callable[[str], float] | None = None,
        free_bytes: Callable[[str], int] | None = None,
        network: InProcNetwork | None = None,
        store: LogStore | None = None,
        meta: MetaStore | None = None,
        rng: random.Random | None = None,
    ):
        if settings.self_id not in settings.peers:
            raise ValueError(f"self id {settings.self_id!r} is not among the peers")
        if network is None and not settings.password:
            raise DLedgerError("a peer password is required for the TCP peer transport")
        self.settings = settings
        self._clock: Clock = clock if clock is not None else dl_clock.process_clock()
        self._network = network
        os.makedirs(settings.data_dir, exist_ok=True)
        if settings.cluster_id is not None:
            check_cluster_id(settings.data_dir, settings.cluster_id)
        self.store: LogStore = (
            store
            if store is not None
            else EntryStore(
                os.path.join(settings.data_dir, "store"),
                segment_bytes=settings.segment_bytes,
                clock=self._clock,
            )
        )
        self.core = ReplicaCore(
            settings,
            self.store,
            meta if meta is not None else FileMetaStore(os.path.join(settings.data_dir, "meta")),
            state_machine,
            clock=self._clock,
            transport_factory=self._make_transport,
            events=self,
            rng=rng,
            disk_used_ratio=disk_used_ratio,
            free_bytes=free_bytes,
        )
        self.journal = self.core.journal
        self._loop: asyncio.AbstractEventLoop | None = None
        self._owner: int | None = None  # the loop's thread, from start() on
        self._poller: LoopPoller | None = None
        self._flusher: ThreadFlusher | None = None
        self._flush_idle: asyncio.Future[None] | None = None  # set while a flush job is out
        self._running = False
        self._stopped = False
        self._tick_pending = False
        self._drain_pending = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due = float("inf")  # on the injected clock
        self._full_due = float("inf")  # the last full tick + TICK_MAX_S: no timer is armed later
        self._timer_rearmed = False  # the armed timer is the second one for its due time
        self._queued_bytes = 0  # bytes of appends submitted and not answered yet
        self._listeners: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[RoleChange]]] = []
        # Set while a leadership transfer runs: new appends wait for it (Raft thesis §3.10: the
        # leader stops taking requests, so the target can catch up), then go on or get NOT_LEADER.
        self._transfer_hold: asyncio.Future[None] | None = None
        self._fatal: BaseException | None = None
        self.loop_lag_ms_max = 0.0  # how late a timer tick fired, at most
        self.loop_stalls = 0  # timer ticks later than LAG_STALL_S

    # -- published state (plain values, written on the loop's thread) --------------------------
    @property
    def role(self) -> str:
        return self.core.role

    @property
    def term(self) -> int:
        return self.core.term

    @property
    def leader_id(self) -> str | None:
        return self.core.leader_id

    @property
    def log(self) -> LogReader:
        """The replica's log as its state machine may read it (``dledger.log_store.LogReader``)."""
        return self.store

    @property
    def last_index(self) -> int:
        return self.store.last_index

    @property
    def commit_index(self) -> int:
        return self.core.commit_index

    @property
    def applied_index(self) -> int:
        return self.core.applied_index

    @property
    def disk_full(self) -> bool:
        return self.core.disk_full or self.core.write_blocked is not None

    @property
    def leader_floor(self) -> int:
        return self.core.leader_floor

    @property
    def commit_latency_ms(self) -> collections.deque[float]:
        return self.core.commit_latency_ms

    def set_observer(self, observe: Callable[[str, float], None]) -> None:
        """Where the replica reports its measurements (``observe(name, value)``: ``batch_bodies``,
        ``fsync_seconds``), called on the loop's thread; set it before ``start``. The broker's
        Prometheus metrics take them."""
        self.core.observe = observe

    @property
    def _sync(self) -> Any:
        return self.core.sync

    def installs_sent(self) -> int:
        return self.core.installs_sent()

    # -- lifecycle --------------------------------------------------------------------------
    def _make_transport(self, sync_obj: Any, self_node: Any, other_nodes: Any) -> Any:
        if self._network is not None:
            return InProcTransport(self._network, sync_obj, self_node, other_nodes, wake=self._inproc_wake)
        s = self.settings
        view = s.view()
        return TcpPeerTransport(
            sync_obj,
            self_node,
            other_nodes,
            password=s.password,
            previous_password=s.password_previous,
            group=s.group,
            connect_via={
                addr: view[pid]
                for pid, addr in s.peers.items()
                if pid != s.self_id and view.get(pid, addr) != addr
            },
            max_frame_bytes=s.max_entry_bytes + s.replication_batch_bytes + (4 << 20),
            idle_timeout_s=s.connection_timeout_ms / 1000,
            connect_retry_s=s.connection_retry_ms / 1000,
            cluster_id=s.cluster_id,
        )

    async def start(self, timeout_s: float = 10.0) -> None:
        """Open the replica on the running loop, whose thread owns it from now on."""
        if self._owner is not None:
            raise DLedgerError("the node was started already")
        loop = asyncio.get_running_loop()
        self._loop, self._owner = loop, threading.get_ident()
        self._enter()
        self._poller = LoopPoller(loop, enter=self._enter, after_input=self._tick_soon, fail=self._die)
        self._flusher = ThreadFlusher(loop, f"dledger-flush-{self.settings.self_id}")
        try:
            sync = self.core.open(poller=self._poller, flusher=_LoopFlusher(self, self._flusher))
        except BaseException as exc:
            self._fatal = exc
            self._poller.close()
            self._flusher.close()
            raise
        if isinstance(sync.dl_transport, InProcTransport):
            self._poller.drains.append(sync.dl_transport.drain)
        self._running = True
        self._tick(full=True)

    @property
    def fatal(self) -> BaseException | None:
        """Why the replica stopped taking part (None while it runs): its process should exit so
        that a supervisor restarts it from its log."""
        return self._fatal

    async def stop(self, before_log_close: Callable[[], None] | None = None) -> None:
        """Stop: waits for the flush in flight, closes the replica; ``before_log_close`` runs after
        the last apply, while the log is still open (a state machine's final snapshot)."""
        if self._stopped:
            return
        self._stopped = True
        self._running = False
        self._cancel_timer()
        if self._owner is None:  # never started: the log was opened by the constructor
            try:
                if before_log_close is not None:
                    before_log_close()
            finally:
                self.journal.close()
            return
        self._check_owner()
        if self._flush_idle is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._flush_idle), 10.0)
            except TimeoutError:
                log.error("a flush of the log did not return within 10 s of stopping")
        self._enter()
        try:
            self.core.close(before_log_close)
        except Exception:
            if self._fatal is None:
                raise
            log.exception("closing a replica that had failed")
        finally:
            if self._poller is not None:
                self._poller.close()
            if self._flusher is not None:
                await asyncio.get_running_loop().run_in_executor(None, self._flusher.close)

    def _die(self, exc: BaseException) -> None:
        """Fail stop: the replica no longer ticks, reads its sockets or writes; ``fatal`` tells
        why. ``stop`` still closes it."""
        if self._fatal is None:
            log.critical("the replica failed and stops taking part: %s", exc, exc_info=exc)
            self._fatal = exc
        self._running = False
        self._cancel_timer()
        if self._poller is not None:
            self._poller.close()

    # -- the loop drives the core ---------------------------------------------------------------
    def _enter(self) -> None:
        dl_clock.use(self._clock)  # pysyncobj reads the node's clock (several nodes per loop: each its own)

    def _check_owner(self) -> None:
        if threading.get_ident() != self._owner:
            raise RuntimeError(
                f"DLedgerNode {self.settings.self_id} used on thread {threading.current_thread().name!r}, not "
                "on its event loop's thread (use run_on_replica_thread)"
            )

    def _tick_soon(self) -> None:
        """One light tick after this loop turn's callbacks (the appends and input of one turn
        share it): ``ReplicaCore.after_input``."""
        if not self._tick_pending and self._running:
            self._tick_pending = True
            assert self._loop is not None
            self._loop.call_soon(self._light_tick)

    def _light_tick(self) -> None:
        self._tick_pending = False
        if self._running:
            self._tick(full=False)

    def _tick(self, *, full: bool) -> None:
        self._enter()
        core = self.core
        try:
            if full:
                self._full_due = self._clock.monotonic() + TICK_MAX_S
                core.tick(0)
            else:
                core.after_input()
        except BaseException as exc:
            self._die(exc)
            return
        self._arm_timer(core.next_tick_s(TICK_MAX_S))
        if core.more_to_apply():
            self._tick_soon()  # after what else is ready: a long catch-up never starves the loop

    def _arm_timer(self, delay_s: float) -> None:
        """The full tick's timer, due in ``delay_s`` (what the core next needs) but never later
        than TICK_MAX_S after the last full tick (the stall guard's premise, the transport's and
        retention's timers). An armed timer that comes first, or as good as, stays; one that is
        due more than TIMER_POSTPONE_S earlier than needed is moved (what it was armed for went
        away: a commit the next append told, a heartbeat an append replaced)."""
        now = self._clock.monotonic()
        due = min(now + delay_s, self._full_due)
        if self._timer is not None:
            if due - TIMER_POSTPONE_S <= self._timer_due <= due + 0.0005:
                return
            self._timer.cancel()
        assert self._loop is not None
        self._timer_due = due
        self._timer_rearmed = False
        self._timer = self._loop.call_later(max(0.0, due - now), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        late_s = self._clock.monotonic() - self._timer_due
        if late_s < -TIMER_EARLY_S and not self._timer_rearmed and self._running:
            assert self._loop is not None  # fired early: once more for the rest (TIMER_EARLY_S)
            self._timer_rearmed = True
            self._timer = self._loop.call_later(max(-late_s, 0.001), self._on_timer)
            return
        if late_s > 0:
            self.loop_lag_ms_max = max(self.loop_lag_ms_max, late_s * 1000)
            if late_s >= LAG_STALL_S:
                self.loop_stalls += 1
        self._timer_due = float("inf")
        if self._running:
            self._tick(full=True)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_due = float("inf")

    def _inproc_wake(self) -> None:
        """The in-process network queued input for this replica (from any thread)."""
        if threading.get_ident() == self._owner:
            self._drain_soon()
        elif self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._drain_soon)
            except RuntimeError:  # the loop is closed
                pass

    def _drain_soon(self) -> None:
        if not self._drain_pending:  # also during start: the network's first events come then
            self._drain_pending = True
            assert self._loop is not None
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_pending = False
        if not self._running:
            return
        self._enter()
        transport = self.core.sync.dl_transport if self.core.sync is not None else None
        try:
            if isinstance(transport, InProcTransport):
                transport.drain()
                if transport.has_input:
                    self._drain_soon()  # more than one drain's worth: the rest after other callbacks
        except BaseException as exc:
            self._die(exc)
            return
        self._tick_soon()

    # -- CoreEvents (the loop's thread) ---------------------------------------------------------
    def role_changed(self, change: RoleChange) -> None:
        for loop, queue in self._listeners:
            if loop is self._loop:
                _offer(queue, change)
            else:
                loop.call_soon_threadsafe(_offer, queue, change)

    # -- the public API (the loop's thread) -----------------------------------------------------
    async def append(self, bodies: Sequence[bytes], timeout_s: float = 3.0) -> list[BodyLocation]:
        """Append ``bodies`` (one request, kept in one entry); resolves when committed and applied."""
        self._check_owner()
        if not bodies:
            raise ValueError("append needs at least one body")
        size = sum(len(b) for b in bodies) + command_codec.batch_overhead(len(bodies))
        if size > self.settings.max_entry_bytes:
            raise EntryTooLargeError(
                f"request of {size} bytes exceeds the entry limit {self.settings.max_entry_bytes}"
            )
        if not self._running:
            raise DLedgerError("the replica is not running")
        if self._transfer_hold is not None:  # bounded by the transfer's own timeout
            await asyncio.shield(self._transfer_hold)
            if not self._running:
                raise DLedgerError("the replica is not running")
        if self.core.role != "LEADER":
            raise NotLeaderError(self.core.leader_id)
        if self.core.disk_full:
            raise DiskFullError(self.core.disk_full_reason())
        if self.core.write_blocked is not None:
            raise DiskFullError(f"the log has no room for writes: {self.core.write_blocked}")
        if self._queued_bytes + size > self.settings.max_pending_bytes:
            raise BusyError("too many bytes waiting to be appended; retry later")
        self._queued_bytes += size
        loop = self._loop
        assert loop is not None
        future: asyncio.Future[list[BodyLocation]] = loop.create_future()

        def done(result: list[BodyLocation] | None, exc: BaseException | None) -> None:
            self._queued_bytes -= size
            if not future.done():
                if exc is not None:
                    future.set_exception(exc)
                else:
                    future.set_result(result)  # type: ignore[arg-type]

        self.core.submit(Request(list(bodies), size, done, self._clock.monotonic(), alive=_not_done(future)))
        self._tick_soon()
        handle = loop.call_later(timeout_s, _time_out, future, timeout_s)
        try:
            return await future
        finally:
            handle.cancel()

    def read(self, index: int) -> CommittedEntry:
        if index > self.commit_index:
            raise NotCommittedError(f"index {index} is not committed (commit index {self.commit_index})")
        self._check_held(index)
        return to_committed(self.store.read(index), self.store)

    def read_range(self, first: int, max_count: int, max_bytes: int = 4 << 20) -> list[CommittedEntry]:
        commit = self.commit_index
        if first > commit:
            return []
        self._check_held(first)
        entries = self.store.read_range(first, min(max_count, commit - first + 1), max_bytes)
        return [to_committed(e, self.store) for e in entries if e.index <= commit]

    def _check_held(self, index: int) -> None:
        if index < self.store.first_index:
            raise EntryRemovedError(
                f"index {index} was removed by retention: this replica holds {self.store.first_index} onwards"
            )

    def chain_crc_at(self, index: int) -> int:
        return int(self.store.chain_crc_at(index))

    def role_changes(self) -> asyncio.Queue[RoleChange]:
        """A queue that receives every role/term/leader change from now on (bounded: 1000)."""
        queue: asyncio.Queue[RoleChange] = asyncio.Queue(maxsize=1000)
        self._listeners.append((asyncio.get_running_loop(), queue))
        return queue

    def stop_listening(self, queue: asyncio.Queue[RoleChange]) -> None:
        self._listeners = [(lp, q) for lp, q in self._listeners if q is not queue]

    async def status(self, timeout_s: float = 2.0) -> dict[str, Any]:
        return dict(await self.run_on_replica_thread(self._status, timeout_s))

    def _status(self) -> dict[str, Any]:
        status = self.core.status()
        status["queued_bytes"] = self._queued_bytes
        status["loop"] = {
            "lag_ms_max": round(self.loop_lag_ms_max, 3),
            "stalls_100ms": self.loop_stalls,
            "flush_jobs": self._flusher.jobs_done if self._flusher is not None else 0,
        }
        return status

    async def transfer_leadership(self, target_id: str | None = None, timeout_s: float = 3.0) -> str:
        """Hand leadership to ``target_id`` (or the most caught-up follower); returns the new leader id.

        New appends wait meanwhile (then get ``NotLeaderError`` naming the new leader, or go on if
        the transfer failed): with the log no longer growing the target catches up, and the request
        refused while it is behind (``TransferNotReadyError``) is asked again every
        ``TRANSFER_RETRY_S`` until ``timeout_s``. The loop's thread only."""
        self._check_owner()
        if self._transfer_hold is not None:
            raise DLedgerError("a leadership transfer is already in progress")
        assert self._loop is not None
        self._transfer_hold = self._loop.create_future()
        deadline = self._clock.monotonic() + timeout_s
        queue = self.role_changes()
        try:
            while True:
                try:
                    started = await self.run_on_replica_thread(lambda: self.core.start_transfer(target_id), timeout_s)
                    break
                except TransferNotReadyError:
                    if self._clock.monotonic() + TRANSFER_RETRY_S >= deadline:
                        raise
                    self._tick_soon()
                    await asyncio.sleep(TRANSFER_RETRY_S)
            self._tick_soon()
            while self._clock.monotonic() < deadline:
                leader = self.leader_id
                if leader is not None and leader != self.settings.self_id and target_id in (None, leader):
                    return leader
                try:
                    await asyncio.wait_for(queue.get(), max(0.01, deadline - self._clock.monotonic()))
                except TimeoutError:
                    break
        finally:
            self.stop_listening(queue)
            hold, self._transfer_hold = self._transfer_hold, None
            hold.set_result(None)
        raise DLedgerError(f"leadership transfer to {started} did not complete within {timeout_s} s")

    async def change_membership(
        self, op: str, peer_id: str, address: str | None = None, timeout_s: float = 5.0, max_lag: int = 1000
    ) -> dict[str, Any]:
        """One membership change through the log (issue 27; the leader only): ``op`` is
        ``add_learner`` (needs ``address``), ``promote`` (a caught-up learner becomes a voter) or
        ``remove``. Resolves once the change committed: the new membership and its index.
        Refusals raise ``MembershipError`` (coded), ``NotLeaderError``; no commit within
        ``timeout_s`` raises ``AppendTimeoutError`` (the change may still commit)."""
        self._check_owner()
        if not self._running:
            raise DLedgerError("the replica is not running")
        loop = self._loop
        assert loop is not None
        future: asyncio.Future[None] = loop.create_future()

        def done(_result: list[BodyLocation] | None, exc: BaseException | None) -> None:
            if not future.done():
                if exc is not None:
                    future.set_exception(exc)
                else:
                    future.set_result(None)

        deadline = self._clock.monotonic() + timeout_s
        while True:
            try:
                index, new = await self.run_on_replica_thread(
                    lambda: self.core.propose_membership(op, peer_id, address, done, max_lag=max_lag), timeout_s
                )
                break
            except MembershipError as exc:
                # A leader elected a moment ago: its term's first entry commits within a round trip.
                if exc.code != "LEADER_NOT_READY" or self._clock.monotonic() + 0.02 >= deadline:
                    raise
                self._tick_soon()
                await asyncio.sleep(0.02)
        self._tick_soon()
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            raise AppendTimeoutError(
                f"the membership change at index {index} did not commit within {timeout_s} s: the outcome is "
                "unknown (see the membership in /v1/status)"
            ) from None
        return {"index": index, **new.view()}

    async def membership(self, timeout_s: float = 2.0) -> dict[str, Any]:
        return dict(await self.run_on_replica_thread(self.core.membership_view, timeout_s))

    async def run_on_replica_thread(self, fn: Callable[[], Any], timeout_s: float = 5.0) -> Any:
        """``fn()`` on the replica's thread (its loop), between two ticks, and its result. On that
        thread it simply runs; from another thread or loop the call is handed to the replica's
        loop and waited for (at most ``timeout_s``)."""
        if threading.get_ident() == self._owner:
            self._enter()
            return fn()
        if self._loop is None:
            raise DLedgerError("the node is not started")

        async def call() -> Any:
            self._enter()
            return fn()

        moved = asyncio.run_coroutine_threadsafe(call(), self._loop)
        return await asyncio.wait_for(asyncio.wrap_future(moved), timeout_s)

    def run_retention_now(self) -> None:
        """The replica's thread only (tests)."""
        self.core.run_retention_now()


class _LoopFlusher:
    """The node's flusher as the core sees it: completions run inside the node (its clock, a
    tick after, fail stop on error), and the node knows when no job is out (``stop`` waits)."""

    def __init__(self, node: DLedgerNode, flusher: ThreadFlusher):
        self._node = node
        self._flusher = flusher

    def submit(self, job: Callable[[], None], done: Done) -> None:
        node = self._node
        assert node._loop is not None
        if node._flush_idle is None or node._flush_idle.done():
            node._flush_idle = node._loop.create_future()
        self._flusher.submit(job, lambda exc: self._done(done, exc))

    def _done(self, done: Done, exc: BaseException | None) -> None:
        node = self._node
        try:
            if node._fatal is None:  # also while stopping: stop waits for the core to see it
                node._enter()
                done(exc)
        except BaseException as e:
            node._die(e)
        finally:
            idle = node._flush_idle
            if idle is not None and not idle.done() and (node._fatal is not None or not node.core.flush_in_flight):
                idle.set_result(None)
        if node.core.role == "LEADER" and node.core.commit_may_advance():
            # It may count itself now (a follower's held answers left already). While no
            # follower has answered for what the flush covered, counting itself moves nothing:
            # the answer that completes the majority ticks instead (one light tick per round).
            node._tick_soon()

    def close(self) -> None:
        self._flusher.close()


def _not_done(future: asyncio.Future[Any]) -> Callable[[], bool]:
    return lambda: not future.done()


def _time_out(future: asyncio.Future[Any], timeout_s: float) -> None:
    if not future.done():  # the core skips requests whose future is done
        future.set_exception(
            AppendTimeoutError(f"no commit within {timeout_s:.3f} s: the outcome is unknown")
        )


def _offer(queue: asyncio.Queue[RoleChange], change: RoleChange) -> None:
    if queue.full():
        queue.get_nowait()  # keep the newest: listeners care about the current role
    queue.put_nowait(change)
