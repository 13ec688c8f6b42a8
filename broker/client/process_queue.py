"""One queue's messages between pull and successful consumption (RocketMQ's ``ProcessQueue``).

Invariant: every offset below ``committable()`` has been consumed successfully, or was filtered
out, or was skipped by the broker (``NO_MATCHED_MSG`` / ``OFFSET_TOO_SMALL``). So committing
``committable()`` never moves past a message that still waits for its listener:

    pulled ──put──▶ pending ──remove (CONSUME_SUCCESS)──▶ gone
                      ▲  │
                      └──┘ RECONSUME_LATER: stays pending (redelivered later), the commit waits

``committable()`` = the lowest pending offset, or — with nothing pending — the high-water mark
(the ``next_offset`` of the latest pull). Pure: no I/O, no asyncio.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from broker.client.message import MessageExt, MessageQueue


class ProcessQueue:
    def __init__(self, mq: MessageQueue, start_offset: int):
        assert start_offset >= 0, f"start offset {start_offset} of {mq} is negative"
        self.mq = mq
        self.high_water = start_offset
        self._pending: dict[int, MessageExt] = {}
        self._heap: list[int] = []  # pending offsets (lazily cleaned)
        self.pending_bytes = 0
        self.consumed_count = 0

    @property
    def count(self) -> int:
        return len(self._pending)

    def put(self, msgs: Sequence[MessageExt], next_offset: int) -> list[MessageExt]:
        """Add pulled messages (duplicates of pending ones are ignored) and move the high-water mark
        to ``next_offset``; returns the messages that are new here, in offset order."""
        added: list[MessageExt] = []
        for m in msgs:
            if m.queue_offset in self._pending:
                continue
            self._pending[m.queue_offset] = m
            heapq.heappush(self._heap, m.queue_offset)
            self.pending_bytes += len(m.body)
            added.append(m)
        self.advance(next_offset)
        return sorted(added, key=lambda m: m.queue_offset)

    def advance(self, next_offset: int) -> None:
        """The broker answered up to ``next_offset``: everything below it is pulled or skipped."""
        self.high_water = max(self.high_water, next_offset)

    def remove(self, offsets: Iterable[int]) -> int:
        """Forget successfully consumed messages; returns the new committable offset."""
        for off in offsets:
            m = self._pending.pop(off, None)
            if m is not None:
                self.pending_bytes -= len(m.body)
                self.consumed_count += 1
        return self.committable()

    def committable(self) -> int:
        while self._heap and self._heap[0] not in self._pending:
            heapq.heappop(self._heap)
        return self._heap[0] if self._heap else self.high_water

    def lowest(self, n: int) -> list[MessageExt]:
        """The ``n`` lowest pending messages in offset order (orderly consumption)."""
        return [self._pending[o] for o in heapq.nsmallest(n, self._pending)]


def backoff_s(attempt: int, schedule_s: Sequence[float]) -> float:
    """The wait before redelivery ``attempt`` (0-based); the schedule's last value caps it."""
    assert schedule_s, "an empty backoff schedule"
    return schedule_s[min(max(attempt, 0), len(schedule_s) - 1)]
