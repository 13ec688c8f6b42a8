"""The fault schedule of a run: alternating fault and heal windows (OpenChaos's method), pure.

    0        I        2I       3I       4I    ...   D        D + R
    | fault0 | heal   | fault1 | heal   | ...  | quiet |recovery| -> drain, audit

Each fault window is applied at its start and healed at its end; a heal window is as long as a
fault window. Faults are taken from the list in turn (``cycle``) or drawn with the run's seeded RNG
(``random``). What does not fill a whole fault+heal pair at the end of the duration stays quiet.

What a schedule needs of the workload (``needed_ack_rate``): a fault is judged by the acknowledged
sends around it — the ones it may lose, the attempts it makes wait, the first ones after it — so
every fault window should see ``ACKS_PER_FAULT_WINDOW`` of them at the run's rate, and never fewer
than ``ACK_RATE_FLOOR`` a second: the audit calls a second without an acknowledgement unavailability
(``--unavailable-ms`` 1000), which a slower workload produces with no fault at all.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

ACKS_PER_FAULT_WINDOW = 100
ACK_RATE_FLOOR = 10.0  # acknowledged sends per second


def needed_ack_rate(interval_s: float) -> float:
    """Acknowledged sends per second (all producers) a schedule of ``interval_s`` windows needs."""
    return max(ACK_RATE_FLOOR, ACKS_PER_FAULT_WINDOW / interval_s)


@dataclasses.dataclass(frozen=True)
class Window:
    start_s: float
    end_s: float
    fault: str | None  # None: no fault (heal or quiet)

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s


def build_schedule(
    faults: Sequence[str],
    interval_s: float,
    duration_s: float,
    *,
    order: str = "cycle",
    rng: random.Random | None = None,
) -> list[Window]:
    if not faults:
        raise ValueError("no faults to schedule")
    if interval_s <= 0:
        raise ValueError("interval must be positive")
    if duration_s < 2 * interval_s:
        raise ValueError(f"duration {duration_s} s is shorter than one fault and one heal window ({2 * interval_s} s)")
    if order not in ("cycle", "random"):
        raise ValueError(f"order must be cycle or random, not {order!r}")
    rng = rng or random.Random(0)
    pairs = int(duration_s // (2 * interval_s))
    windows: list[Window] = []
    for k in range(pairs):
        start = 2 * k * interval_s
        name = faults[k % len(faults)] if order == "cycle" else rng.choice(list(faults))
        windows.append(Window(start, start + interval_s, name))
        windows.append(Window(start + interval_s, start + 2 * interval_s, None))
    end = 2 * pairs * interval_s
    if duration_s > end:
        windows.append(Window(end, duration_s, None))
    return windows


def window_at(windows: Sequence[Window], t_s: float) -> Window | None:
    for w in windows:
        if w.start_s <= t_s < w.end_s:
            return w
    return None
