"""One clock per process: every deadline, timeout and liveness decision in dledger reads it.

Two readings of different clocks are never compared. A ``Clock`` has two faces:

- ``monotonic()``: seconds, never goes back, positive. Deadlines, durations, timeouts, liveness.
- ``wall()``: seconds since the epoch. Timestamps that are stored in records or shown to people,
  and ages of things that were stamped with ``wall()`` earlier. Never compared with ``monotonic()``.

pysyncobj reads a clock of its own (``CLOCK_MONOTONIC_RAW``, through the name ``monotonicTime``
imported into four of its modules) and compares the deadlines it keeps against it, while Python,
asyncio and our own code read ``CLOCK_MONOTONIC``. NTP slews the second and not the first, so on a
running host they drift apart (0.25-0.3 s within hours, seconds after days), and a deadline written
from one and read against the other fires early or late by the drift: a leader's heartbeat went
out every ~360 ms instead of 50 ms and the group re-elected every 0.8 s. ``bind_pysyncobj()``
rebinds those four names to ``current_monotonic``, which reads the clock the calling thread uses
(set with ``use()`` by a node before it runs its replica, or by the simulator before it steps one), so pysyncobj and
dledger read one clock.

``process_clock()`` is the clock of a server process: the system clock, or, for tests that skew the
clocks of a group's processes against each other and against the system, a ``SkewedClock`` built from
``DLEDGER_CLOCK_SKEW="offset_s[,drift_ppm]"``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> float: ...


class SystemClock:
    """``CLOCK_MONOTONIC`` (what asyncio and ``time.monotonic`` read) and the wall clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM = SystemClock()


class SkewedClock:
    """``base`` shifted by ``offset_s`` and running ``drift_ppm`` parts per million fast (or slow).

    Both faces move together: a node on a skewed clock is a node whose host's clocks are skewed.
    Readings stay positive (like ``CLOCK_MONOTONIC``); an offset that would make them negative is
    refused.
    """

    def __init__(self, offset_s: float, drift_ppm: float = 0.0, base: Clock = SYSTEM):
        self.offset_s = float(offset_s)
        self.drift_ppm = float(drift_ppm)
        self._base = base
        self._rate = 1.0 + self.drift_ppm / 1e6
        self._m0 = base.monotonic()
        if self.monotonic() <= 0:
            raise ValueError(f"clock offset {offset_s} s would make monotonic readings negative")

    def monotonic(self) -> float:
        return self._m0 + self.offset_s + (self._base.monotonic() - self._m0) * self._rate

    def wall(self) -> float:
        elapsed = self._base.monotonic() - self._m0
        return self._base.wall() + self.offset_s + elapsed * (self._rate - 1.0)

    def __repr__(self) -> str:
        return f"SkewedClock(offset_s={self.offset_s}, drift_ppm={self.drift_ppm})"


class ManualClock:
    """A clock that moves only when told to (tests and the simulator)."""

    def __init__(self, monotonic_s: float = 1000.0, wall_s: float = 1_800_000_000.0):
        self._monotonic = float(monotonic_s)
        self._wall_offset = float(wall_s) - self._monotonic

    def monotonic(self) -> float:
        return self._monotonic

    def wall(self) -> float:
        return self._monotonic + self._wall_offset

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock does not go back")
        self._monotonic += seconds

    def set(self, monotonic_s: float) -> None:
        if monotonic_s < self._monotonic:
            raise ValueError("a monotonic clock does not go back")
        self._monotonic = float(monotonic_s)

    def __repr__(self) -> str:
        return f"ManualClock(monotonic={self._monotonic})"


SKEW_ENV = "DLEDGER_CLOCK_SKEW"


def parse_skew(text: str) -> SkewedClock:
    """``"offset_s[,drift_ppm]"`` -> SkewedClock over the system clock (ValueError when malformed)."""
    parts = [p.strip() for p in text.split(",")]
    if not 1 <= len(parts) <= 2 or not parts[0]:
        raise ValueError(f"{SKEW_ENV} must be 'offset_s[,drift_ppm]', got {text!r}")
    offset = float(parts[0])
    drift = float(parts[1]) if len(parts) == 2 and parts[1] else 0.0
    if abs(drift) > 100_000:
        raise ValueError(f"{SKEW_ENV}: drift {drift} ppm is beyond 10 %")
    return SkewedClock(offset, drift)


_process_clock: Clock | None = None


def process_clock() -> Clock:
    """The clock of this process (the system clock unless ``DLEDGER_CLOCK_SKEW`` is set)."""
    global _process_clock
    if _process_clock is None:
        raw = os.environ.get(SKEW_ENV, "").strip()
        _process_clock = parse_skew(raw) if raw else SYSTEM
    return _process_clock


# -- the clock pysyncobj reads -----------------------------------------------------------------
_thread = threading.local()


def use(clock: Clock) -> None:
    """Make ``clock`` the one pysyncobj reads on the calling thread (a node entering its replica, the simulator)."""
    _thread.clock = clock


@contextlib.contextmanager
def restored() -> Iterator[None]:
    """Put back the calling thread's clock when the block ends (the simulator switches it)."""
    saved: Clock | None = getattr(_thread, "clock", None)
    try:
        yield
    finally:
        _thread.clock = saved


def current() -> Clock:
    clock: Clock | None = getattr(_thread, "clock", None)
    return clock if clock is not None else process_clock()


def current_monotonic() -> float:
    clock: Clock | None = getattr(_thread, "clock", None)
    return (clock if clock is not None else process_clock()).monotonic()


_PYSYNCOBJ_MODULES = (
    "pysyncobj.syncobj",
    "pysyncobj.tcp_connection",
    "pysyncobj.transport",
    "pysyncobj.dns_resolver",
)


def bind_pysyncobj() -> None:
    """Point pysyncobj's ``monotonicTime`` (in each module that imported it) at ``current_monotonic``."""
    import importlib

    for name in _PYSYNCOBJ_MODULES:
        module = importlib.import_module(name)
        if not hasattr(module, "monotonicTime"):
            raise RuntimeError(f"{name} has no monotonicTime: pysyncobj changed, re-check dledger.clock")
        module.monotonicTime = current_monotonic  # type: ignore[attr-defined]
