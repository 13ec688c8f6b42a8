"""DLedgerNode: one replica of a dledger group, driven by its own tick thread, used from asyncio.

The replica's logic is ``ReplicaCore`` (single-threaded, shared with the simulator); this module is
the bridge between it and the event loop. Threads and ownership::

    event loop (asyncio)                    tick thread (owns the ReplicaCore: SyncObj, store
    --------------------                    writes, apply; reads the node's injected clock)
    append(bodies) --core.submit + wake-->  group requests into entries, store.append, fsync
                                             (sync policy), replicate at once
    future <--outbox, one call per tick--   commit index passes the entry (and it is applied):
                                             result (index, positions, apply results), or a
                                             definite failure, or "outcome unknown"
    role events <--call_soon_threadsafe-    role/leader/term changed since the last tick
    run_on_tick_thread(fn) --control------> fn() on the tick thread (status, transfer, ...)

Every wait is bounded: ``append`` has a deadline (after which the outcome is *unknown*: the entry
may still commit); control requests time out; queued appends are bounded by bytes.

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

from pysyncobj.poller import POLL_EVENT_TYPE

from dledger import clock as dl_clock
from dledger import command_codec
from dledger.clock import Clock
from dledger.entry_store import EntryStore
from dledger.inproc import InProcNetwork, InProcTransport
from dledger.log_store import LogReader, LogStore
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
]

_Outcome = tuple[asyncio.Future[Any], Any, BaseException | None]


class DLedgerNode:
    def __init__(
        self,
        settings: RaftSettings,
        state_machine: StateMachine | None = None,
        *,
        clock: Clock | None = None,
        disk_used_ratio: Callable[[str], float] | None = None,
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
        )
        self.journal = self.core.journal
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queued_lock = threading.Lock()
        self._queued_bytes = 0  # guarded by _queued_lock: the loop adds, the tick thread subtracts
        self._control: collections.deque[
            tuple[Callable[[], Any], asyncio.Future[Any], asyncio.AbstractEventLoop]
        ] = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        self._wake_pending = False
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._listeners: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[RoleChange]]] = []
        # Outcomes gathered during one tick, handed to each loop in one call (tick thread only).
        self._outbox: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
        self._fatal: BaseException | None = None
        self._before_log_close: Callable[[], None] | None = None
        self._closed_by_tick_thread = False

    # -- published state (written by the tick thread; plain values) --------------------------
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
        return self.core.disk_full

    @property
    def leader_floor(self) -> int:
        return self.core.leader_floor

    @property
    def commit_latency_ms(self) -> collections.deque[float]:
        return self.core.commit_latency_ms

    def set_observer(self, observe: Callable[[str, float], None]) -> None:
        """Where the replica reports its measurements (``observe(name, value)``: ``batch_bodies``,
        ``fsync_seconds``), called on the tick thread; set it before ``start``. The broker's
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
            return InProcTransport(self._network, sync_obj, self_node, other_nodes, wake=self._wake)
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
        )

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

    @property
    def fatal(self) -> BaseException | None:
        """Why the tick thread died (None while it runs): the replica can no longer take part in
        the group, and its process should exit so that a supervisor restarts it."""
        return self._fatal

    async def stop(self, before_log_close: Callable[[], None] | None = None) -> None:
        """Stop the tick thread; ``before_log_close`` runs on it after the last tick, while the log
        is still open (a state machine's final snapshot)."""
        self._before_log_close = before_log_close
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            assert self._loop is not None
            await self._loop.run_in_executor(None, self._thread.join, 10.0)
        if before_log_close is not None and not self._closed_by_tick_thread:
            # The tick thread never ran its loop (start failed), or it died before this stop: no
            # one else will run it (the log is closed by now; the hook must cope).
            try:
                before_log_close()
            except Exception:
                if self._fatal is None:
                    raise
                log.exception("closing the state machine of a replica whose tick thread died")

    def _run(self) -> None:
        dl_clock.use(self._clock)  # pysyncobj, on this thread, reads the node's clock
        try:
            sync = self.core.open()
            sync._poller.subscribe(self._wake_r, self._on_wake, POLL_EVENT_TYPE.READ)
        except BaseException as exc:  # surfaced by start()
            self._fatal = exc
            self._started.set()
            return
        self._started.set()
        try:
            while not self._stopping.is_set():
                self.core.tick(self.core.wait_s(0.05))
        except BaseException as exc:
            log.critical("tick thread died: %s", exc, exc_info=True)
            self._fatal = exc
            raise
        finally:
            try:
                self._closed_by_tick_thread = self._before_log_close is not None or self._fatal is None
                self.core.close(self._before_log_close)
                self._deliver_outbox()
            finally:
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
        transport = self.core.sync.dl_transport if self.core.sync is not None else None
        if isinstance(transport, InProcTransport):
            transport.drain()

    # -- CoreEvents (tick thread) -------------------------------------------------------------
    def role_changed(self, change: RoleChange) -> None:
        for loop, queue in self._listeners:
            loop.call_soon_threadsafe(_offer, queue, change)

    def tick_done(self) -> None:
        while self._control:
            fn, future, loop = self._control.popleft()
            try:
                result = fn()
            except Exception as exc:  # delivered to the caller
                self._outbox.setdefault(loop, []).append((future, None, exc))
            else:
                self._outbox.setdefault(loop, []).append((future, result, None))
        if self._outbox:
            self._deliver_outbox()

    def _deliver_outbox(self) -> None:
        outbox, self._outbox = self._outbox, {}
        for loop, items in outbox.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the loop is closed: nobody waits for these any more
                pass

    # -- the public API (event loop) ----------------------------------------------------------
    async def append(self, bodies: Sequence[bytes], timeout_s: float = 3.0) -> list[BodyLocation]:
        """Append ``bodies`` (one request, kept in one entry); resolves when committed and applied."""
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
        with self._queued_lock:
            if self._queued_bytes + size > self.settings.max_pending_bytes:
                raise BusyError("too many bytes waiting to be appended; retry later")
            self._queued_bytes += size
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[BodyLocation]] = loop.create_future()

        def done(result: list[BodyLocation] | None, exc: BaseException | None) -> None:  # tick thread
            with self._queued_lock:
                self._queued_bytes -= size
            self._outbox.setdefault(loop, []).append((future, result, exc))

        self.core.submit(
            Request(list(bodies), size, done, self._clock.monotonic(), alive=lambda: not future.done())
        )
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
        status = await self.run_on_tick_thread(self.core.status, timeout_s)
        status["queued_bytes"] = self._queued_bytes
        return dict(status)

    async def transfer_leadership(self, target_id: str | None = None, timeout_s: float = 3.0) -> str:
        """Hand leadership to ``target_id`` (or the most caught-up follower); returns the new leader id."""
        started = await self.run_on_tick_thread(lambda: self.core.start_transfer(target_id), timeout_s)
        deadline = self._clock.monotonic() + timeout_s
        queue = self.role_changes()
        try:
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
        raise DLedgerError(f"leadership transfer to {started} did not complete within {timeout_s} s")

    async def run_on_tick_thread(self, fn: Callable[[], Any], timeout_s: float) -> Any:
        """Run ``fn`` on the tick thread (between two ticks) and return its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._control.append((fn, future, loop))
        self._wake()
        return await asyncio.wait_for(future, timeout_s)


    def run_retention_now(self) -> None:
        """Tick-thread only (tests use it through ``run_on_tick_thread``)."""
        self.core.run_retention_now()


def _time_out(future: asyncio.Future[Any], timeout_s: float) -> None:
    if not future.done():  # the tick thread skips requests whose future is done
        future.set_exception(
            AppendTimeoutError(f"no commit within {timeout_s:.3f} s: the outcome is unknown")
        )


def _deliver(items: list[_Outcome]) -> None:
    for future, result, exc in items:
        if future.done():
            continue
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)


def _offer(queue: asyncio.Queue[RoleChange], change: RoleChange) -> None:
    if queue.full():
        queue.get_nowait()  # keep the newest: listeners care about the current role
    queue.put_nowait(change)
