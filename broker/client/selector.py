"""Queue selectors: which of a topic's writable queues a message goes to.

A selector is any callable ``(mqs, msg, arg) -> mq`` (RocketMQ's ``MessageQueueSelector``); ``mqs``
are the publish candidates sorted by (broker_name, queue_id). The producer's default is round robin
with one counter per topic (RocketMQ's ``sendWhichQueue``), starting at a random index so that many
producers do not all begin on queue 0. ``HashKeySelector`` keeps one key on one queue (per-key
order) with a hash that is the same in every process (``zlib.crc32``, not Python's salted ``hash``).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from broker.client.message import Message, MessageQueue

QueueSelector = Callable[[Sequence[MessageQueue], Message, Any], MessageQueue]
_INDEX_MASK = 0x7FFFFFFF  # like Java's int counter, but never negative


class RoundRobinSelector:
    def __init__(self, rng: random.Random | None = None):
        self._rng = rng or random.Random()
        self._counters: dict[str, int] = {}

    def next_index(self, topic: str) -> int:
        value = self._counters.get(topic)
        if value is None:
            value = self._rng.randrange(1 << 16)
        value = (value + 1) & _INDEX_MASK
        self._counters[topic] = value
        return value

    def __call__(self, mqs: Sequence[MessageQueue], msg: Message, arg: Any = None) -> MessageQueue:
        if not mqs:
            raise ValueError("no queue to select from")
        return mqs[self.next_index(msg.topic) % len(mqs)]


class HashKeySelector:
    """``arg`` when given, else the message's first key; the same key always picks the same queue
    (as long as the queue count does not change)."""

    def __call__(self, mqs: Sequence[MessageQueue], msg: Message, arg: Any = None) -> MessageQueue:
        if not mqs:
            raise ValueError("no queue to select from")
        key = arg if arg is not None else (msg.keys[0] if msg.keys else None)
        if key is None:
            raise ValueError("HashKeySelector needs an arg or a message key")
        return mqs[zlib.crc32(str(key).encode("utf-8")) % len(mqs)]


class RandomSelector:
    def __init__(self, rng: random.Random | None = None):
        self._rng = rng or random.Random()

    def __call__(self, mqs: Sequence[MessageQueue], msg: Message, arg: Any = None) -> MessageQueue:
        if not mqs:
            raise ValueError("no queue to select from")
        return mqs[self._rng.randrange(len(mqs))]


def select_avoiding(
    mqs: Sequence[MessageQueue], next_index: Callable[[], int], last_broker_name: str | None
) -> MessageQueue:
    """RocketMQ's ``TopicPublishInfo.selectOneMessageQueue(lastBrokerName)``: round robin, skipping
    the group that just failed when another group has a queue; else plain round robin."""
    if not mqs:
        raise ValueError("no queue to select from")
    if last_broker_name is not None:
        for _ in range(len(mqs)):
            mq = mqs[next_index() % len(mqs)]
            if mq.broker_name != last_broker_name:
                return mq
    return mqs[next_index() % len(mqs)]
