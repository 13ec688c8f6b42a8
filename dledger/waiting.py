"""Polling a condition with a deadline: the one implementation the tools (chaos drills) and the
tests use, in an async and a blocking flavour.

A condition may be sync or async and may raise while the system settles (a replica restarting,
a failover): with ``tolerate_errors`` such errors count as "not yet" and the last one is named
when the deadline passes. ``AssertionError`` always propagates (a test's own check failed).
The deadline is measured on ``clock`` (the process's ``SYSTEM`` clock unless given): it bounds how
long a tool or a test waits, never a decision inside a replica.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from dledger.clock import SYSTEM, Clock


class WaitTimeout(TimeoutError):
    pass


def _not_yet(exc: Exception, tolerate_errors: bool) -> Exception:
    """An error of the condition: "not yet" when tolerated; a failed assertion always propagates."""
    if isinstance(exc, AssertionError) or not tolerate_errors:
        raise exc
    return exc


def _check_deadline(
    clock: Clock, deadline: float, error: type[BaseException], timeout_s: float, what: str, last: BaseException | None
) -> None:
    if clock.monotonic() > deadline:
        suffix = f" (last error: {last!r})" if last is not None else ""
        raise error(f"timed out after {timeout_s} s waiting for {what}{suffix}")


async def wait_until(
    cond: Callable[[], Any] | Callable[[], Awaitable[Any]],
    timeout_s: float,
    what: str,
    step_s: float = 0.02,
    *,
    tolerate_errors: bool = True,
    error: type[BaseException] = WaitTimeout,
    clock: Clock = SYSTEM,
) -> Any:
    """Poll ``cond`` until it returns something truthy and return that; ``error`` after ``timeout_s``."""
    deadline = clock.monotonic() + timeout_s
    last: BaseException | None = None
    while True:
        try:
            value = cond()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
        except Exception as exc:
            last = _not_yet(exc, tolerate_errors)
        _check_deadline(clock, deadline, error, timeout_s, what, last)
        await asyncio.sleep(step_s)


def wait_until_sync(
    cond: Callable[[], Any],
    timeout_s: float,
    what: str,
    step_s: float = 0.05,
    *,
    tolerate_errors: bool = True,
    error: type[BaseException] = WaitTimeout,
    clock: Clock = SYSTEM,
) -> Any:
    """The blocking flavour of ``wait_until`` (for code without an event loop)."""
    deadline = clock.monotonic() + timeout_s
    last: BaseException | None = None
    while True:
        try:
            value = cond()
            if value:
                return value
        except Exception as exc:
            last = _not_yet(exc, tolerate_errors)
        _check_deadline(clock, deadline, error, timeout_s, what, last)
        time.sleep(step_s)
