"""Rebalance allocation strategies (RocketMQ's ``AllocateMessageQueueStrategy``), pure functions.

Every consumer of a group computes its own share from the same inputs: all message queues of the
topic sorted by (broker_name, queue_id) and all consumer ids sorted. Because the inputs agree,
the shares are disjoint and cover every queue, with no coordination. A consumer missing from
``cid_all`` (its heartbeat has not arrived yet) gets nothing. Generic over the queue type so the
math is testable with plain ints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

AllocateStrategy = Callable[[str, Sequence[T], Sequence[str]], list[T]]


def _check(current_cid: str, cid_all: Sequence[str]) -> int | None:
    if not current_cid:
        raise ValueError("current_cid is empty")
    try:
        return list(cid_all).index(current_cid)
    except ValueError:
        return None


def allocate_averagely(current_cid: str, mq_all: Sequence[T], cid_all: Sequence[str]) -> list[T]:
    """Contiguous blocks; the first ``len(mq_all) % len(cid_all)`` consumers get one more.
    8 queues, 3 consumers → [0,1,2] [3,4,5] [6,7]."""
    index = _check(current_cid, cid_all)
    if index is None or not mq_all:
        return []
    n_mq, n_cid = len(mq_all), len(cid_all)
    mod = n_mq % n_cid
    if n_mq <= n_cid:
        average = 1
    elif mod > 0 and index < mod:
        average = n_mq // n_cid + 1
    else:
        average = n_mq // n_cid
    start = index * average if mod > 0 and index < mod else index * average + mod
    count = min(average, n_mq - start)
    return [mq_all[(start + i) % n_mq] for i in range(max(count, 0))]


def allocate_averagely_by_circle(current_cid: str, mq_all: Sequence[T], cid_all: Sequence[str]) -> list[T]:
    """Dealt like cards: consumer i gets queues i, i+n, i+2n... 8 queues, 3 consumers →
    [0,3,6] [1,4,7] [2,5]."""
    index = _check(current_cid, cid_all)
    if index is None:
        return []
    return [mq_all[i] for i in range(index, len(mq_all), len(cid_all))]
