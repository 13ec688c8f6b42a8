"""Shared start-up of this project's server processes: logging, and running until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def run_until_signalled(serve: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``serve(stop)`` on a new event loop; SIGTERM and SIGINT set ``stop``."""

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
