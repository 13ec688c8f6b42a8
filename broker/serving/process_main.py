"""Shared start-up of this project's server processes: logging, and running until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def set_gc_young_threshold(threshold: int) -> None:
    """Collect the young generation every ``threshold`` net container allocations (Python: 700).

    A server under load allocates tens of thousands of short-lived containers per second (decoded
    requests, records, answers); with 700 a leader collected about 200 times a second, and what
    was in flight at each collection (a pipelined client keeps ~1,000 messages in flight) was
    promoted until a full collection walked the whole heap — 17 of them in 10 s, 40-50 ms each.
    The older generations' thresholds stay Python's."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(threshold, older, oldest)


PLANT_ENV = "DLEDGER_TEST_PLANT"


def apply_test_plants() -> list[str]:
    """Plant the defects named in ``DLEDGER_TEST_PLANT`` (``module:function[,module:function]``).

    Test-only: the audit's sensitivity tests start a cluster whose processes carry one known bug
    and check that the audit catches it. Each named function patches the defect in when called.
    Never set in production; a process with a plant says so loudly in its log.
    """
    raw = os.environ.get(PLANT_ENV, "").strip()
    planted = []
    for spec in filter(None, (part.strip() for part in raw.split(","))):
        module_name, _, func_name = spec.partition(":")
        if not module_name or not func_name:
            raise SystemExit(f"{PLANT_ENV}: expected module:function, got {spec!r}")
        getattr(importlib.import_module(module_name), func_name)()
        logging.getLogger("dledger.plant").warning("TEST PLANT ACTIVE: %s (a deliberate defect)", spec)
        planted.append(spec)
    return planted


def run_until_signalled(serve: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``serve(stop)`` on a new event loop; SIGTERM and SIGINT set ``stop``."""
    apply_test_plants()

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(stop)

    if os.environ.get("DLEDGER_EVENT_LOOP", "uvloop") == "uvloop":
        try:
            import uvloop
        except ImportError:  # an optional speed-up: the standard loop works the same
            pass
        else:
            uvloop.run(run())
            return
    asyncio.run(run())
