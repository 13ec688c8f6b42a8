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

The thread is a node's only flusher. An io_uring flusher (the kernel synced, its completion woke the
loop through an eventfd: no thread, ~20 % less CPU per synchronous message) was removed: it was
opt-in only, the chaos crash fault's fsync model (chaos/unsynced.py) did not see its syncs, and
it rested on a young dependency (docs/PERFORMANCE.md, issue 26).

``SyncFlusher`` runs the job at once on the caller's thread (tests and tools that drive a core by
hand); the simulator has its own (``dledger.sim``), which completes jobs after a simulated delay.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Protocol

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
