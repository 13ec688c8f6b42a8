"""DLedgerNode: one replica of a dledger group, driven by its own tick thread, used from asyncio.

Threads and ownership::

    event loop (asyncio)                    tick thread (owns SyncObj, store writes, apply)
    --------------------                    ------------------------------------------------
    append(bodies) --deque + wake pipe-->   drain: group requests into entries, store.append,
                                             fdatasync (sync policy), send AppendEntries now
    future <--call_soon_threadsafe------    commit index passes the entry: check its term ->
                                             result (index, positions) or a definite failure
    role events <--call_soon_threadsafe-    state/leader/term changed since the last tick
    status()/transfer() --control deque-->  run on the tick thread, resolve the future

Every wait is bounded: ``append`` has a deadline (after which the outcome is *unknown*: the entry
may still commit); control requests time out; queued appends are bounded by bytes.

Invariants kept here:
- An append is acknowledged only when the commit index covers its entry *and* the entry at that
  index still carries the term it was written with (so it is the same entry); fsync happened
  before this node counted itself (sync policy) and before any follower acked.
- Entries are applied to the state machine in log order, once: the state machine's durable
  ``applied_index()`` is where applying resumes after a restart.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from pysyncobj import SyncObjConf
from pysyncobj.poller import POLL_EVENT_TYPE

from dledger import clock as dl_clock
from dledger import command_codec
from dledger.clock import Clock
from dledger.entry_store import Entry, EntryStore
from dledger.journal import RaftJournal
from dledger.syncobj_patch import (
    RAFT_STATE_CANDIDATE,
    RAFT_STATE_LEADER,
    DLedgerSyncObj,
)

log = logging.getLogger(__name__)

ROLE_NAMES = {0: "FOLLOWER", 1: "CANDIDATE", 2: "LEADER"}


# -- errors -----------------------------------------------------------------------------------
class DLedgerError(Exception):
    code = "DLEDGER_ERROR"


class NotLeaderError(DLedgerError):
    code = "NOT_LEADER"

    def __init__(self, leader_id: str | None):
        super().__init__(f"this node is not the leader (leader: {leader_id or 'unknown'})")
        self.leader_id = leader_id


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
    stepdown_ms: int = 1500
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
    # How this node reaches each peer's Raft port (defaults to ``peers``; chaos tests route
    # pairs through proxies by giving each node its own view).
    raft_addresses: dict[str, str] | None = None

    def view(self) -> dict[str, str]:
        return dict(self.raft_addresses or self.peers)


@dataclasses.dataclass(frozen=True)
class BodyLocation:
    """Where one appended body lives: its Raft entry, its place in the entry, its log position."""

    index: int
    term: int
    slot: int
    position: int
    size: int


@dataclasses.dataclass(frozen=True)
class CommittedEntry:
    index: int
    term: int
    position: int
    chain_crc: int
    bodies: list[tuple[int, bytes]]  # (log position of the body, body); [] for a no-op


@dataclasses.dataclass(frozen=True)
class RoleChange:
    role: str
    term: int
    leader_id: str | None
    at: float


class StateMachine(Protocol):
    """Applied on the tick thread, in log order; keep it fast. It owns its durability."""

    def applied_index(self) -> int: ...

    def apply(self, entries: Sequence[CommittedEntry]) -> None: ...

    def on_install(self, anchor_index: int) -> None: ...


@dataclasses.dataclass
class _Pending:
    bodies: Sequence[bytes]
    size: int
    future: asyncio.Future[list[BodyLocation]]
    loop: asyncio.AbstractEventLoop
    enqueued: float = 0.0


@dataclasses.dataclass
class _Waiting:
    index: int
    term: int
    requests: list[tuple[_Pending, list[tuple[int, int, int]]]]  # (request, [(slot, offset, size)])


# -- the node -------------------------------------------------------------------------------------
class DLedgerNode:
    def __init__(
        self,
        settings: RaftSettings,
        state_machine: StateMachine | None = None,
        *,
        clock: Clock | None = None,
        disk_used_ratio: Callable[[str], float] | None = None,
    ):
        if settings.self_id not in settings.peers:
            raise ValueError(f"self id {settings.self_id!r} is not among the peers")
        self.settings = settings
        self._clock: Clock = clock if clock is not None else dl_clock.process_clock()
        self._disk_used_ratio = disk_used_ratio or _disk_used_ratio
        self._sm = state_machine
        os.makedirs(settings.data_dir, exist_ok=True)
        self.store = EntryStore(
            os.path.join(settings.data_dir, "store"), segment_bytes=settings.segment_bytes, clock=self._clock
        )
        self.journal = RaftJournal(self.store, os.path.join(settings.data_dir, "meta"))
        # Peers are known by their dLegerPeers address (what each announces); ``view()`` only says
        # where to connect to reach them (a proxy in chaos runs).
        self._addr_to_id = {addr: pid for pid, addr in settings.peers.items()}
        self._self_address = settings.peers[settings.self_id]
        self._sync: DLedgerSyncObj | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: collections.deque[_Pending] = collections.deque()
        self._queued_bytes = 0
        self._control: collections.deque[
            tuple[Callable[[], Any], asyncio.Future[Any], asyncio.AbstractEventLoop]
        ] = collections.deque()
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        self._wake_pending = False
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._listeners: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[RoleChange]]] = []
        self._commit_waiters: list[tuple[int, asyncio.Future[int], asyncio.AbstractEventLoop]] = []
        # Append outcomes gathered during one tick, handed to each loop in one call (one wake-up
        # of the loop per tick instead of one per request).
        self._outbox: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, BaseException | None]]] = {}
        # Published by the tick thread, read anywhere (plain ints: atomic under the GIL).
        self.role = "FOLLOWER"
        self.term = 0
        self.leader_id: str | None = None
        self.commit_index = 0
        self.applied_index = 0
        self.disk_full = False
        self.leader_floor = 0
        self._own_floor = 0
        self._live_followers: int | None = None  # leader only: followers heard from lately
        self._last_flush = self._clock.monotonic()
        self._last_retention = 0.0
        self._counters: collections.Counter[str] = collections.Counter()
        # enqueue -> commit known on the leader, last 20k acknowledged appends (bounded)
        self.commit_latency_ms: collections.deque[float] = collections.deque(maxlen=20_000)
        self._fatal: BaseException | None = None

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self, timeout_s: float = 10.0) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._run, name=f"dledger-tick-{self.settings.self_id}", daemon=True
        )
        self._thread.start()
        ok = await self._loop.run_in_executor(None, self._started.wait, timeout_s)
        if self._fatal is not None:
            raise self._fatal
        if not ok:
            raise DLedgerError("the tick thread did not start in time")

    async def stop(self) -> None:
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            assert self._loop is not None
            await self._loop.run_in_executor(None, self._thread.join, 10.0)

    def _make_syncobj(self) -> DLedgerSyncObj:
        s = self.settings
        conf = SyncObjConf(
            password=s.password,
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
        others = [addr for pid, addr in s.peers.items() if pid != s.self_id]
        view = s.view()
        via = {addr: view[pid] for pid, addr in s.peers.items() if pid != s.self_id and view.get(pid, addr) != addr}
        return DLedgerSyncObj(self._self_address, others, conf, self.journal, self, connect_via=via)

    def _run(self) -> None:
        dl_clock.use(self._clock)  # pysyncobj, on this thread, reads the node's clock
        try:
            self._sync = self._make_syncobj()
            applied = self._sm.applied_index() if self._sm is not None else 0
            self.applied_index = max(applied, self.store.anchor[0])
            self._sync.dl_skip_replay(self.applied_index)
            self._sync._poller.subscribe(self._wake_r, self._on_wake, POLL_EVENT_TYPE.READ)
            self._sync.addOnTickCallback(self._on_tick)
        except BaseException as exc:  # surfaced by start()
            self._fatal = exc
            self._started.set()
            return
        self._started.set()
        sync = self._sync
        try:
            while not self._stopping.is_set():
                sync.doTick(0.05)
        except BaseException as exc:
            log.critical("tick thread died: %s", exc, exc_info=True)
            self._fatal = exc
            raise
        finally:
            self._shutdown_tick_thread()

    def _shutdown_tick_thread(self) -> None:
        err = DLedgerError("node stopped")
        self._fail_queue(err)
        for waiting in self._waiting:
            for req, _ in waiting.requests:
                self._resolve(req, exc=AppendTimeoutError("node stopped before the entry committed"))
        self._waiting.clear()
        self._deliver_outbox()
        try:
            if self.store.dirty:
                self.store.flush()
            if self._sync is not None:
                self._sync._doDestroy()
        finally:
            self.journal.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _wake(self) -> None:
        # One byte in the pipe is enough: _wake_pending is True only while a byte is unread.
        if self._wake_pending:
            return
        self._wake_pending = True
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _on_wake(self, _fd: int, _event: int) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        # Cleared after draining: a wake that raced with the drain leaves a byte (a spurious but
        # harmless wake-up) rather than a lost one.
        self._wake_pending = False

    # -- NodeHooks (tick thread) ------------------------------------------------------------
    def before_ack(self) -> None:
        if self.settings.flush_policy == "sync" and self.journal.flush():
            self._counters["fsync"] += 1

    def on_install_anchor(self, anchor_index: int) -> None:
        self.applied_index = anchor_index
        self.commit_index = max(self.commit_index, anchor_index)
        self._counters["installs"] += 1
        if self._sm is not None:
            self._sm.on_install(anchor_index)

    def installs_sent(self) -> int:
        """How many times this node (as leader) re-anchored a follower behind its retention."""
        sync = self._sync
        return int(sync.dl_installs_sent) if sync is not None else 0

    def retention_floor(self) -> int:
        return self._own_floor

    def on_leader_floor(self, floor: int) -> None:
        self.leader_floor = floor

    # -- the public API (event loop) ----------------------------------------------------------
    async def append(self, bodies: Sequence[bytes], timeout_s: float = 3.0) -> list[BodyLocation]:
        """Append ``bodies`` (one request, kept in one entry); resolves when committed."""
        if not bodies:
            raise ValueError("append needs at least one body")
        size = sum(len(b) for b in bodies) + command_codec.batch_overhead(len(bodies))
        if size > self.settings.max_entry_bytes:
            raise EntryTooLargeError(
                f"request of {size} bytes exceeds the entry limit {self.settings.max_entry_bytes}"
            )
        if self.role != "LEADER":
            raise NotLeaderError(self.leader_id)
        if self.disk_full:
            raise DiskFullError("disk use is above the write limit: appends are refused")
        if self._queued_bytes + size > self.settings.max_pending_bytes:
            raise BusyError("too many bytes waiting to be appended; retry later")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[BodyLocation]] = loop.create_future()
        self._queued_bytes += size
        self._queue.append(_Pending(list(bodies), size, future, loop, self._clock.monotonic()))
        self._wake()
        handle = loop.call_later(timeout_s, _time_out, future, timeout_s)
        try:
            return await future
        finally:
            handle.cancel()

    def read(self, index: int) -> CommittedEntry:
        if index > self.commit_index:
            raise NotCommittedError(f"index {index} is not committed (commit index {self.commit_index})")
        self._check_held(index)
        return _to_committed(self.store.read(index), self.store)

    def read_range(self, first: int, max_count: int, max_bytes: int = 4 << 20) -> list[CommittedEntry]:
        commit = self.commit_index
        if first > commit:
            return []
        self._check_held(first)
        entries = self.store.read_range(first, min(max_count, commit - first + 1), max_bytes)
        return [_to_committed(e, self.store) for e in entries if e.index <= commit]

    def _check_held(self, index: int) -> None:
        if index < self.store.first_index:
            raise EntryRemovedError(
                f"index {index} was removed by retention: this replica holds {self.store.first_index} onwards"
            )

    def chain_crc_at(self, index: int) -> int:
        return int(self.store.chain_crc_at(index))

    async def wait_committed(self, index: int, timeout_s: float) -> int:
        """Wait until the commit index reaches ``index``; returns the commit index."""
        if self.commit_index >= index:
            return self.commit_index
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        if len(self._commit_waiters) > 1000:  # drop the ones whose callers gave up
            self._commit_waiters = [w for w in self._commit_waiters if not w[1].done()]
        self._commit_waiters.append((index, future, loop))
        self._wake()
        return await asyncio.wait_for(future, timeout_s)

    def role_changes(self) -> asyncio.Queue[RoleChange]:
        """A queue that receives every role/term/leader change from now on (bounded: 1000)."""
        queue: asyncio.Queue[RoleChange] = asyncio.Queue(maxsize=1000)
        self._listeners.append((asyncio.get_running_loop(), queue))
        return queue

    async def status(self, timeout_s: float = 2.0) -> dict[str, Any]:
        return dict(await self._on_tick_thread(self._status_now, timeout_s))

    async def transfer_leadership(self, target_id: str | None = None, timeout_s: float = 3.0) -> str:
        """Hand leadership to ``target_id`` (or the most caught-up follower); returns the new leader id."""
        started = await self._on_tick_thread(lambda: self._start_transfer(target_id), timeout_s)
        deadline = self._clock.monotonic() + timeout_s
        queue = self.role_changes()
        try:
            return await self._await_new_leader(queue, target_id, deadline, started, timeout_s)
        finally:
            self._listeners = [(lp, q) for lp, q in self._listeners if q is not queue]

    async def _await_new_leader(
        self,
        queue: asyncio.Queue[RoleChange],
        target_id: str | None,
        deadline: float,
        started: str,
        timeout_s: float,
    ) -> str:
        while self._clock.monotonic() < deadline:
            leader = self.leader_id
            if leader is not None and leader != self.settings.self_id and target_id in (None, leader):
                return leader
            try:
                await asyncio.wait_for(queue.get(), max(0.01, deadline - self._clock.monotonic()))
            except TimeoutError:
                break
        raise DLedgerError(f"leadership transfer to {started} did not complete within {timeout_s} s")

    async def _on_tick_thread(self, fn: Callable[[], Any], timeout_s: float) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._control.append((fn, future, loop))
        self._wake()
        return await asyncio.wait_for(future, timeout_s)

    # -- the tick callback ------------------------------------------------------------------
    def _on_tick(self) -> None:
        sync = self._sync
        assert sync is not None
        appended = False
        if self._queue:
            if sync.dl_state == RAFT_STATE_LEADER:
                appended = self._append_queued(sync)
            else:
                self._fail_queue(NotLeaderError(self.leader_id))
        if appended:
            # Replicate before the local flush so followers write while the leader syncs. Safe: the
            # leader counts itself toward a majority only at the next tick's commit computation,
            # and acks are read in the poll that follows this callback, after the flush returned.
            sync.dl_send_now()
        self._flush_per_policy()
        old_commit = self.commit_index
        self.commit_index = sync.raftCommitIndex
        if self.commit_index > old_commit and not appended and sync.dl_state == RAFT_STATE_LEADER:
            # Tell followers at once (an empty append carries the commit index): they apply, and
            # serve the new entries to readers, one round trip later rather than a heartbeat later.
            sync.dl_send_now()
        if self.applied_index < self.commit_index:
            self._apply_committed()
        if self._waiting:
            self._complete_waiting()
        if self._commit_waiters and self.commit_index > old_commit:
            self._wake_commit_waiters()
        self._publish_role(sync)
        while self._control:
            fn, future, loop = self._control.popleft()
            try:
                result = fn()
            except Exception as exc:  # delivered to the caller
                loop.call_soon_threadsafe(_set_exception, future, exc)
            else:
                loop.call_soon_threadsafe(_set_result, future, result)
        if self._outbox:
            self._deliver_outbox()
        now = self._clock.monotonic()
        if now - self._last_retention >= self.settings.retention_check_ms / 1000:
            self._last_retention = now
            self._retention_tick(sync)

    def _append_queued(self, sync: DLedgerSyncObj) -> bool:
        term = sync.raftCurrentTerm
        target = self.settings.entry_target_bytes
        appended = False
        while self._queue:
            group: list[_Pending] = []
            size = command_codec.PREFIX_BYTES
            while self._queue and (not group or size + self._queue[0].size <= target):
                req = self._queue.popleft()
                self._queued_bytes -= req.size
                if req.future.done():  # timed out or cancelled before it was appended
                    continue
                group.append(req)
                size += req.size - command_codec.PREFIX_BYTES
            if not group:
                continue
            bodies = [b for req in group for b in req.bodies]
            payload = command_codec.encode_batch(bodies)
            index = self.store.last_index + 1
            position = self.store.append(index, term, payload)
            offsets = command_codec.body_offsets(bodies)
            body_base = position + self.store.header_bytes
            waiting = _Waiting(index, term, [])
            k = 0
            for req in group:
                locs = []
                for body in req.bodies:
                    locs.append((k, body_base + offsets[k], len(body)))
                    k += 1
                waiting.requests.append((req, locs))
            self._waiting.append(waiting)
            self._counters["entries_appended"] += 1
            self._counters["bodies_appended"] += len(bodies)
            appended = True
        return appended

    def _flush_per_policy(self) -> None:
        if not self.store.dirty:
            return
        now = self._clock.monotonic()
        if (
            self.settings.flush_policy == "sync"
            or now - self._last_flush >= self.settings.flush_interval_ms / 1000
        ):
            self.store.flush()
            self._last_flush = now
            self._counters["fsync"] += 1

    def _complete_waiting(self) -> None:
        store = self.store
        while self._waiting:
            w = self._waiting[0]
            if w.index > store.last_index or (
                w.index >= store.first_index and store.term_at(w.index) != w.term
            ):
                self._waiting.popleft()
                for req, _ in w.requests:
                    self._resolve(
                        req, exc=AppendFailedError(f"entry {w.index} was replaced by a newer leader's entry")
                    )
                continue
            # With a state machine, an append resolves once it is applied too: the caller
            # (the broker's send path) reads what applying it produced (queue offsets).
            if w.index > self.commit_index or (self._sm is not None and w.index > self.applied_index):
                return
            self._waiting.popleft()
            now = self._clock.monotonic()
            for req, locs in w.requests:
                self.commit_latency_ms.append((now - req.enqueued) * 1000)
                self._resolve(req, result=[BodyLocation(w.index, w.term, s, p, n) for s, p, n in locs])

    def _apply_committed(self) -> None:
        budget_entries = 512
        while self.applied_index < self.commit_index and budget_entries > 0:
            first = self.applied_index + 1
            count = min(budget_entries, self.commit_index - self.applied_index)
            if self._sm is None:
                self.applied_index += count
                return
            raw = self.store.read_range(first, count, 8 << 20)
            if not raw:
                return
            self._sm.apply([_to_committed(e, self.store) for e in raw])
            self.applied_index = raw[-1].index
            budget_entries -= len(raw)

    def _wake_commit_waiters(self) -> None:
        still = []
        for index, future, loop in self._commit_waiters:
            if index <= self.commit_index:
                loop.call_soon_threadsafe(_set_result, future, self.commit_index)
            elif not future.done():
                still.append((index, future, loop))
        self._commit_waiters = still

    def _publish_role(self, sync: DLedgerSyncObj) -> None:
        role = ROLE_NAMES[sync.dl_state]
        leader = sync._getLeader()
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
            self._counters["elections"] += 1
        self.role, self.term, self.leader_id = role, term, leader_id
        log.info("role %s term %d leader %s", role, term, leader_id)
        change = RoleChange(role, term, leader_id, self._clock.wall())
        if role != "LEADER":
            self._fail_queue(NotLeaderError(leader_id))
        for loop, queue in self._listeners:
            loop.call_soon_threadsafe(_offer, queue, change)

    def _fail_queue(self, exc: DLedgerError) -> None:
        while self._queue:
            req = self._queue.popleft()
            self._queued_bytes -= req.size
            self._resolve(req, exc=exc)

    def _resolve(self, req: _Pending, *, result: Any = None, exc: BaseException | None = None) -> None:
        self._outbox.setdefault(req.loop, []).append((req.future, result, exc))

    def _deliver_outbox(self) -> None:
        outbox, self._outbox = self._outbox, {}
        for loop, items in outbox.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the loop is closed: nobody waits for these any more
                pass

    # -- retention --------------------------------------------------------------------------
    def _retention_tick(self, sync: DLedgerSyncObj) -> None:
        s = self.settings
        self._counters["retention_checks"] += 1
        floor = self.applied_index
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
        used = self._disk_used_ratio(self.settings.data_dir)
        self.disk_full = used >= s.disk_warning_ratio
        segments = self.store.segments()
        if len(segments) <= 1:
            return
        cutoff = self._clock.wall() - s.retention_hours * 3600
        expired_floor = 0
        for seg in segments[:-1]:
            if seg.sealed_wall_s is not None and seg.sealed_wall_s < cutoff:
                expired_floor = seg.last_index + 1
        over_disk = used >= s.disk_max_used_ratio
        if over_disk:
            expired_floor = max(expired_floor, segments[0].last_index + 1)
        target = min(expired_floor, floor + 1)
        if target > self.store.first_index:
            removed = self.store.delete_segments_before(target)
            if removed:
                self._counters["segments_removed"] += removed
                log.info(
                    "retention removed %d segment(s); log now starts after index %d (disk %.0f %%)",
                    removed,
                    self.store.anchor[0],
                    used * 100,
                )

    def run_retention_now(self) -> None:
        """Tick-thread only (tests use it through ``_on_tick_thread``)."""
        assert self._sync is not None
        self._retention_tick(self._sync)

    # -- status and transfer (tick thread) ----------------------------------------------------
    def _start_transfer(self, target_id: str | None) -> str:
        sync = self._sync
        assert sync is not None
        if sync.dl_state != RAFT_STATE_LEADER:
            raise NotLeaderError(self.leader_id)
        target = None
        if target_id is not None:
            if target_id == self.settings.self_id:
                raise DLedgerError("this node is already the leader")
            address = self.settings.peers.get(target_id)
            if address is None:
                raise DLedgerError(f"unknown peer id {target_id!r}")
            target = next((n for n in sync.otherNodes if n.address == address), None)
        outcome: list[Any] = []
        sync.transferLeadership(target, callback=lambda res, err: outcome.append(err))
        if outcome and outcome[0] != 0:
            raise DLedgerError(f"transfer refused (target not connected or not caught up): code {outcome[0]}")
        return target_id or "the most caught-up follower"

    def _status_now(self) -> dict[str, Any]:
        sync = self._sync
        assert sync is not None
        store = self.store
        peers: dict[str, Any] = {}
        match = {n.address: v for n, v in sync.dl_match_index().items()}
        nxt = {n.address: v for n, v in sync.dl_next_index().items()}
        view = self.settings.view()
        for pid, addr in self.settings.peers.items():
            if pid == self.settings.self_id:
                continue
            node = next((n for n in sync.otherNodes if n.address == addr), None)
            peers[pid] = {
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
            "disk_full": self.disk_full,
            "retention_floor": self._own_floor,
            "live_followers": self._live_followers,
            "peers": peers,
            "counters": {
                **dict(self._counters),
                "truncations_skipped": self.journal.truncations_skipped,
                "entries_truncated": self.journal.entries_truncated,
                "rewinds_prevented": sync.dl_rewinds_prevented,
                "installs_sent": sync.dl_installs_sent,
                "appends_received": sync.dl_appends_received,
            },
            "max_append_gap_ms": round(sync.dl_max_append_gap_s * 1000, 3),
            "queued_bytes": self._queued_bytes,
            "commit_latency_ms": _latency_summary(list(self.commit_latency_ms)),
        }


def _to_committed(entry: Entry, store: EntryStore) -> CommittedEntry:
    body = entry.body
    if not command_codec.is_batch(body):
        return CommittedEntry(entry.index, entry.term, entry.position, entry.chain_crc, [])
    base = entry.position + store.header_bytes
    return CommittedEntry(
        entry.index,
        entry.term,
        entry.position,
        entry.chain_crc,
        [(base + off, b) for off, b in command_codec.decode_batch(body)],
    )


def _latency_summary(samples: list[float]) -> dict[str, float | int]:
    if not samples:
        return {"count": 0}
    samples.sort()
    at = lambda q: round(samples[min(len(samples) - 1, int(q * len(samples)))], 3)  # noqa: E731
    return {"count": len(samples), "p50": at(0.5), "p99": at(0.99), "max": round(samples[-1], 3)}


def _disk_used_ratio(path: str) -> float:
    usage = shutil.disk_usage(path)
    return (usage.total - usage.free) / usage.total if usage.total else 0.0


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _time_out(future: asyncio.Future[Any], timeout_s: float) -> None:
    if not future.done():  # the tick thread skips requests whose future is done
        future.set_exception(
            AppendTimeoutError(f"no commit within {timeout_s:.3f} s: the outcome is unknown")
        )


def _deliver(items: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, result, exc in items:
        if future.done():
            continue
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _offer(queue: asyncio.Queue[RoleChange], change: RoleChange) -> None:
    if queue.full():
        queue.get_nowait()  # keep the newest: listeners care about the current role
    queue.put_nowait(change)
