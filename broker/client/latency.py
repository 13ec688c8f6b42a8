"""Latency fault tolerance (RocketMQ's ``MQFaultStrategy`` + ``LatencyFaultToleranceImpl``).

After each send the producer reports the group's latency; a slow group is avoided for a while:

    latency ≥     50    100    550   1800   3000   5000  15000  ms
    avoid for      0      0   2000   5000   6000  10000  30000  ms

An error counts as a latency of 30 000 ms: the group is isolated for 30 s. Off by default, like
RocketMQ (``send_latency_fault_enable``); when off, a retry only avoids the group that just failed.
Time (``clock_ms``) and the shuffle (``rng``) are injected.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Sequence

from broker.client.message import MessageQueue
from broker.client.selector import select_avoiding

LATENCY_MAX_MS = (50, 100, 550, 1800, 3000, 5000, 15000)
NOT_AVAILABLE_MS = (0, 0, 2000, 5000, 6000, 10000, 30000)
ISOLATION_LATENCY_MS = 30_000


def not_available_ms(latency_ms: float) -> int:
    for i in range(len(LATENCY_MAX_MS) - 1, -1, -1):
        if latency_ms >= LATENCY_MAX_MS[i]:
            return NOT_AVAILABLE_MS[i]
    return 0


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclasses.dataclass
class FaultItem:
    name: str
    latency_ms: float
    available_from_ms: int


class LatencyFaultTolerance:
    def __init__(self, *, clock_ms: Callable[[], int] = _monotonic_ms, rng: random.Random | None = None):
        self._clock_ms = clock_ms
        self._rng = rng or random.Random()
        self._items: dict[str, FaultItem] = {}
        self._which_worst = 0

    def update(self, name: str, latency_ms: float, not_available_ms: int) -> None:
        self._items[name] = FaultItem(name, latency_ms, self._clock_ms() + not_available_ms)

    def is_available(self, name: str) -> bool:
        item = self._items.get(name)
        return item is None or self._clock_ms() >= item.available_from_ms

    def remove(self, name: str) -> None:
        self._items.pop(name, None)

    def items(self) -> list[FaultItem]:
        return list(self._items.values())

    def pick_one_at_least(self) -> str | None:
        """Of the known groups, one of the better half (available first, then lower latency, then
        sooner available), rotating among them."""
        items = list(self._items.values())
        if not items:
            return None
        now = self._clock_ms()
        self._rng.shuffle(items)
        items.sort(key=lambda it: (now < it.available_from_ms, it.latency_ms, it.available_from_ms))
        half = len(items) // 2
        if half <= 0:
            return items[0].name
        self._which_worst += 1
        return items[self._which_worst % half].name


class FaultStrategy:
    def __init__(
        self,
        enabled: bool = False,
        *,
        clock_ms: Callable[[], int] = _monotonic_ms,
        rng: random.Random | None = None,
    ):
        self.enabled = enabled
        self.tolerance = LatencyFaultTolerance(clock_ms=clock_ms, rng=rng)

    def update(self, broker_name: str, latency_ms: float, *, isolation: bool) -> None:
        if self.enabled:
            duration = not_available_ms(ISOLATION_LATENCY_MS if isolation else latency_ms)
            self.tolerance.update(broker_name, latency_ms, duration)

    def select(
        self, mqs: Sequence[MessageQueue], next_index: Callable[[], int], last_broker_name: str | None
    ) -> MessageQueue:
        if not mqs:
            raise ValueError("no queue to select from")
        if not self.enabled:
            return select_avoiding(mqs, next_index, last_broker_name)
        start = next_index()
        for i in range(len(mqs)):
            mq = mqs[(start + i) % len(mqs)]
            if self.tolerance.is_available(mq.broker_name):
                return mq
        not_best = self.tolerance.pick_one_at_least()
        of_broker = [mq for mq in mqs if mq.broker_name == not_best]
        if of_broker:
            return of_broker[next_index() % len(of_broker)]
        if not_best is not None:
            self.tolerance.remove(not_best)
        return mqs[next_index() % len(mqs)]
