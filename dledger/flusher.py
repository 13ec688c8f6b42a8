"""Blocking storage work off the replica's thread: one flusher thread per replica.

The replica's thread (the event loop that serves clients) never waits for a disk: it hands a job
(``fdatasync`` of the log segments written since the last flush, and whatever else blocks) to the
flusher and goes on serving. When the job is done the flusher calls ``done(exc)`` back on the
replica's thread, through one ``loop.call_soon_threadsafe`` per job, never per message: a job
covers every entry written before it was submitted, and the core submits the next one only after
the previous one returned (group commit: what was written meanwhile goes in the next job).

    replica thread (loop)                              flusher thread (dledger-flush-<id>)
    ---------------------                              ------------------------------------
    submit(job, done) --SimpleQueue.put---------->     job()           (fdatasync: seconds, if the
                                                                        disk is slow; the loop serves)
    done(None | exc) <--call_soon_threadsafe (1)--     (one wake-up per job)

``UringFlusher`` needs no thread of ours: the replica's thread hands the kernel the file
descriptors to sync (io_uring ``IORING_OP_FSYNC`` with ``IORING_FSYNC_DATASYNC``, one submission
syscall, nothing waits) and the kernel's completion wakes the loop through an eventfd it watches:
no Python thread, so no GIL hand-over per job (measured: ~20 % less CPU per synchronous message
than the thread, and 1-2 context switches fewer). It is opt-in (``dLegerFlusher=io_uring``, or
``auto``: io_uring where the kernel allows it, else the thread; containers' seccomp profiles often
refuse it): the chaos crash fault models a lost page cache from the ``os.fsync``/``os.fdatasync``
calls it sees (chaos/unsynced.py) and does not see the kernel's io_uring syncs, so a chaos run on
io_uring reports acknowledged messages lost that were on disk. The default is the thread until that
model learns io_uring. Jobs that are Python callables (stores without descriptors: the memory
store) always go to a thread.

``SyncFlusher`` runs the job at once on the caller's thread (tests and tools that drive a core by
hand); the simulator has its own (``dledger.sim``), which completes jobs after a simulated delay.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

log = logging.getLogger(__name__)

Done = Callable[[BaseException | None], None]


class Flusher(Protocol):
    def submit(self, job: Callable[[], None], done: Done) -> None:
        """Run ``job`` off the replica's thread, then ``done`` on it (exactly once)."""

    def close(self) -> None: ...


class SyncFlusher:
    """Runs each job at once, on the caller's thread (no thread; tests and tools)."""

    def submit(self, job: Callable[[], None], done: Done) -> None:
        try:
            job()
        except Exception as exc:
            done(exc)
        else:
            done(None)

    def close(self) -> None:
        pass


class ThreadFlusher:
    """One daemon thread; jobs run in submission order; completions go back to ``loop``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str):
        self._loop = loop
        self._jobs: queue.SimpleQueue[tuple[Callable[[], None], Done] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self.jobs_done = 0  # written by the flusher thread (a counter for status)

    def submit(self, job: Callable[[], None], done: Done) -> None:
        self._jobs.put((job, done))

    def close(self) -> None:
        """Stop after the jobs already submitted (their ``done`` may not run: the loop may be
        closing); waits for the thread."""
        self._jobs.put(None)
        self._thread.join(10.0)

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:  # close()
                return
            job, done = item
            exc: BaseException | None = None
            try:
                job()
            except Exception as e:  # handed to the replica, which fails stop
                exc = e
            self.jobs_done += 1
            try:
                self._loop.call_soon_threadsafe(done, exc)
            except RuntimeError:  # the loop is closed: nobody waits any more
                log.debug("flush completed after the replica's loop closed")


class UringFlusher:
    """fdatasync through io_uring on the replica's loop: ``submit_fds`` queues one fsync per
    descriptor and returns; the completions (in any order) arrive on an eventfd the loop reads,
    and ``done`` runs once every descriptor of the job was synced (or with the first error).
    ``submit`` (a Python job, for stores without descriptors) goes to a ThreadFlusher made on
    first use. Loop thread only."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str, entries: int = 64):
        import liburing  # type: ignore[import-untyped]  # optional: make_flusher falls back without it

        self._L: Any = liburing
        self._loop = loop
        self._name = name
        self._ring = liburing.Ring()
        liburing.io_uring_queue_init(entries, self._ring)
        self._efd = -1
        try:
            self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            liburing.io_uring_register_eventfd(self._ring, self._efd)
        except BaseException:
            if self._efd >= 0:
                os.close(self._efd)
            liburing.io_uring_queue_exit(self._ring)
            raise
        self._cqe = liburing.Cqe()
        self._ids = itertools.count(1)
        self._jobs: dict[int, list[Any]] = {}  # job id -> [fsyncs outstanding, done, first error]
        self._thread: ThreadFlusher | None = None
        self._closed = False
        loop.add_reader(self._efd, self._on_completions)
        self.jobs_done = 0

    def submit_fds(self, fds: Sequence[int], done: Done) -> None:
        L = self._L
        job = next(self._ids)
        if not fds:
            self._loop.call_soon(done, None)
            return
        self._jobs[job] = [len(fds), done, None]
        for fd in fds:
            sqe = L.io_uring_get_sqe(self._ring)
            if sqe is None:  # the submission queue is full: hand what is queued to the kernel
                L.io_uring_submit(self._ring)
                sqe = L.io_uring_get_sqe(self._ring)
            L.io_uring_prep_fsync(sqe, fd, L.IORING_FSYNC_DATASYNC)
            sqe.flags = L.IOSQE_ASYNC  # an fsync always blocks: straight to the kernel's worker
            L.io_uring_sqe_set_data64(sqe, job)
        L.io_uring_submit(self._ring)

    def _on_completions(self) -> None:
        try:
            self._reap()
        except Exception as exc:  # the ring itself failed: every job out fails (the replica stops)
            jobs, self._jobs = self._jobs, {}
            for state in jobs.values():
                state[1](exc)

    def _reap(self) -> None:
        L = self._L
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass
        cqe = self._cqe
        while True:
            try:
                L.io_uring_peek_cqe(self._ring, cqe)
            except BlockingIOError:
                return
            c = cqe[0]
            job = int(c.user_data)
            error: BaseException | None = None
            try:
                _res = c.res  # raises the fsync's error (OSError) for a negative result
            except OSError as exc:
                error = exc
            L.io_uring_cqe_seen(self._ring, c)
            state = self._jobs.get(job)
            if state is None:
                continue
            state[0] -= 1
            if error is not None and state[2] is None:
                state[2] = error
            if state[0] == 0:
                del self._jobs[job]
                self.jobs_done += 1
                state[1](state[2])

    def submit(self, job: Callable[[], None], done: Done) -> None:
        if self._thread is None:
            self._thread = ThreadFlusher(self._loop, self._name)
        self._thread.submit(job, done)

    @property
    def in_flight(self) -> int:
        return len(self._jobs)

    def close(self) -> None:
        """The caller waited for the jobs it submitted; the ring and the eventfd go."""
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._efd)
        self._L.io_uring_queue_exit(self._ring)
        os.close(self._efd)
        if self._thread is not None:
            self._thread.close()


FLUSHER_KINDS = ("auto", "thread", "io_uring")


def make_flusher(loop: asyncio.AbstractEventLoop, name: str, kind: str = "thread") -> ThreadFlusher | UringFlusher:
    """``io_uring`` (the kernel syncs; no thread of ours), ``thread``, or ``auto``: io_uring where
    it works (the module imports and the kernel lets this process set up a ring), else the thread."""
    if kind not in FLUSHER_KINDS:
        raise ValueError(f"flusher {kind!r} is not one of {', '.join(FLUSHER_KINDS)}")
    if kind != "thread":
        try:
            return UringFlusher(loop, name)
        except (ImportError, OSError) as exc:
            if kind == "io_uring":
                raise
            log.info("io_uring is not available here (%s): fdatasync runs on a flusher thread", exc)
    return ThreadFlusher(loop, name)
