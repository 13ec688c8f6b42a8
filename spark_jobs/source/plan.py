"""Offset planning for the ``dledger-mq`` data source: pure functions over what the cluster said.

The driver asks every replica of every group for each queue's ``[min_offset, max_offset)``
(``ClusterView``); everything here turns that, and the options, into offsets and ranges:

- ``resolve``: an ``OffsetSpec`` (earliest, latest, JSON offsets, timestamps) → one offset per queue.
- ``plan_ranges``: start/end offsets → ``ReadRange``s, one per (group, queue, offset range) of at
  most ``max_records_per_partition`` offsets, each with the replicas to ask in order: those that
  hold the whole range first (followers before the leader unless told otherwise, rotated so the
  followers share the work), then the others (a lagging follower may catch up while we read).
- ``rate_limit`` / ``next_end``: a micro-batch's end offsets under ``maxRecordsPerTrigger``.

Invariants a streaming query relies on:
- ``plan_ranges(start, end)`` depends on ``start`` and ``end`` only for *which offsets* it covers
  (replica order may change between calls; the data read does not). A micro-batch replayed after
  a restart therefore reads exactly the range it was planned with: nothing skipped, nothing twice.
- ``next_end`` never moves a queue backwards except when the queue itself went backwards (reset,
  reported); a queue missing from the view (its group unreachable) keeps its offset; a queue seen
  for the first time enters at its first retained offset and is read from the next batch on.

Max offsets are the highest any replica reports: replicas dispatch only committed entries, so
every replica's view is committed data, and the leader's is the newest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from broker.client.message import MessageQueue
from spark_jobs.source.options import EARLIEST, LATEST, OffsetSpec, SourceOptionError


class DataLossError(RuntimeError):
    """Offsets asked for are gone (retention removed them, or the queue went backwards) and
    ``failOnDataLoss`` is true."""


@dataclasses.dataclass(frozen=True)
class ReplicaRange:
    addr: str
    leader: bool
    min_offset: int
    max_offset: int


@dataclasses.dataclass(frozen=True)
class QueueView:
    mq: MessageQueue
    replicas: tuple[ReplicaRange, ...]  # empty: no replica of the group answered

    @property
    def available(self) -> bool:
        return bool(self.replicas)

    @property
    def min_offset(self) -> int:
        """The oldest offset some replica still holds."""
        return min(r.min_offset for r in self.replicas)

    @property
    def max_offset(self) -> int:
        """The next offset to be written: the highest any replica reports."""
        return max(r.max_offset for r in self.replicas)


@dataclasses.dataclass(frozen=True)
class ClusterView:
    queues: tuple[QueueView, ...]  # every readable queue of the topics read, sorted
    unreachable: tuple[tuple[str, str], ...] = ()  # (broker group, why) with no replica answering

    def by_queue(self) -> dict[MessageQueue, QueueView]:
        return {q.mq: q for q in self.queues}

    def available(self) -> dict[MessageQueue, QueueView]:
        return {q.mq: q for q in self.queues if q.available}


@dataclasses.dataclass(frozen=True)
class ReadRange:
    """Offsets ``[start, end)`` of one queue, and the replicas to ask, in order."""

    mq: MessageQueue
    start: int
    end: int
    addrs: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class OffsetEvent:
    """Something the planner noticed that a user must hear about (a reset queue)."""

    mq: MessageQueue
    kind: str  # "reset": the queue's max offset is below the offset we had reached
    from_offset: int
    to_offset: int

    def describe(self) -> str:
        return (
            f"{self.mq}: the queue's max offset fell below {self.from_offset} (topic deleted and "
            f"re-created, or replicas wiped); reading goes on from {self.to_offset}"
        )


# -- resolving options into offsets ----------------------------------------------------------------
def require_available(view: ClusterView) -> dict[MessageQueue, QueueView]:
    if view.unreachable:
        why = "; ".join(f"{name}: {reason}" for name, reason in view.unreachable)
        raise RuntimeError(f"no replica of broker group(s) answered, cannot plan offsets ({why})")
    if not view.queues:
        raise RuntimeError("the topics read have no readable queue")
    return view.available()


def timestamp_queries(spec: OffsetSpec, queues: Iterable[MessageQueue]) -> dict[MessageQueue, int]:
    """The (queue → time in ms) look-ups a timestamp spec needs (the shell asks the brokers)."""
    if spec.kind == "timestamp":
        assert spec.ts_ms is not None
        return {mq: spec.ts_ms for mq in queues}
    if spec.kind == "timestamps":
        return {mq: ts for mq, ts in spec.queue_map().items() if ts >= 0}
    return {}


def resolve(
    spec: OffsetSpec,
    queues: Mapping[MessageQueue, QueueView],
    name: str,
    by_time: Mapping[MessageQueue, int] | None = None,
) -> dict[MessageQueue, int]:
    """One offset per queue of ``queues``. ``by_time`` holds the brokers' answers to
    ``timestamp_queries`` (the first offset stored at or after the time)."""
    if spec.kind == "earliest":
        return {mq: q.min_offset for mq, q in queues.items()}
    if spec.kind == "latest":
        return {mq: q.max_offset for mq, q in queues.items()}
    if spec.kind == "timestamp":
        assert by_time is not None
        return {mq: by_time[mq] for mq in queues}
    given = spec.queue_map()
    unknown = sorted(set(given) - set(queues))
    if unknown:
        raise SourceOptionError(
            f"{name} names queue(s) the topics do not have (or cannot be read): {_listing(unknown)}"
        )
    missing = sorted(set(queues) - set(given))
    if missing:
        raise SourceOptionError(f"{name} must give every queue of the topics read; missing: {_listing(missing)}")
    out: dict[MessageQueue, int] = {}
    for mq, q in queues.items():
        value = given[mq]
        if value == EARLIEST:
            out[mq] = q.min_offset
        elif value == LATEST:
            out[mq] = q.max_offset
        elif spec.kind == "timestamps":
            assert by_time is not None
            out[mq] = by_time[mq]
        else:
            out[mq] = value
    return out


def probe_targets(spec: OffsetSpec, start: Mapping[MessageQueue, int]) -> dict[MessageQueue, int]:
    """Resolved start offsets that mean "the oldest data there is" (``earliest``, ``-2``, a time):
    the shell checks where the first *readable* message at or after each one is (see
    ``cluster.first_readable``), since a queue's advertised min offset can trail the log's
    retention. Explicit offsets are taken as asked: a removed one is a loss."""
    if spec.kind in ("earliest", "timestamp"):
        return dict(start)
    if spec.kind == "offsets":
        return {mq: start[mq] for mq, v in spec.per_queue if v == EARLIEST and mq in start}
    if spec.kind == "timestamps":
        return {mq: start[mq] for mq, v in spec.per_queue if v != LATEST and mq in start}
    return {}


def check_batch_bounds(start: Mapping[MessageQueue, int], end: Mapping[MessageQueue, int]) -> None:
    wrong = [mq for mq in sorted(start) if start[mq] > end[mq]]
    if wrong:
        detail = ", ".join(f"{mq} start {start[mq]} > end {end[mq]}" for mq in wrong[:10])
        raise SourceOptionError(f"starting offsets lie after ending offsets: {detail}")


def _listing(mqs: list[MessageQueue], limit: int = 10) -> str:
    shown = ", ".join(str(mq) for mq in mqs[:limit])
    return shown + (f" and {len(mqs) - limit} more" if len(mqs) > limit else "")


# -- ranges ------------------------------------------------------------------------------------------
def replica_order(q: QueueView | None, start: int, end: int, prefer_followers: bool, rotate: int) -> tuple[str, ...]:
    """Replicas that hold all of ``[start, end)`` first, followers before the leader (or the
    leader first), followers rotated by ``rotate``; then the others in the same order."""
    if q is None:
        return ()

    def ordered(rs: list[ReplicaRange]) -> list[str]:
        followers = sorted(r.addr for r in rs if not r.leader)
        if followers:
            k = rotate % len(followers)
            followers = followers[k:] + followers[:k]
        leaders = [r.addr for r in rs if r.leader]
        return followers + leaders if prefer_followers else leaders + followers

    holders = [r for r in q.replicas if r.min_offset <= start and r.max_offset >= end]
    others = [r for r in q.replicas if r not in holders]
    return tuple(ordered(holders) + ordered(others))


def plan_ranges(
    start: Mapping[MessageQueue, int],
    end: Mapping[MessageQueue, int],
    queues: Mapping[MessageQueue, QueueView],
    *,
    max_records_per_partition: int,
    prefer_followers: bool = True,
) -> list[ReadRange]:
    """``[start, end)`` of every queue in ``end``, split into ranges of at most
    ``max_records_per_partition`` offsets. A queue absent from ``start`` starts at its end
    (nothing to read); one whose end lies before its start was reset (nothing to read)."""
    assert max_records_per_partition > 0
    out: list[ReadRange] = []
    for mq in sorted(end):
        lo, hi = start.get(mq, end[mq]), end[mq]
        while lo < hi:
            step_end = min(hi, lo + max_records_per_partition)
            order = replica_order(queues.get(mq), lo, step_end, prefer_followers, rotate=len(out))
            out.append(ReadRange(mq, lo, step_end, order))
            lo = step_end
    return out


# -- micro-batches -----------------------------------------------------------------------------------
def rate_limit(
    start: Mapping[MessageQueue, int], latest: Mapping[MessageQueue, int], max_records: int
) -> dict[MessageQueue, int]:
    """End offsets that cover exactly ``min(max_records, backlog)`` offsets in all. Every queue
    with a backlog gets one offset first (when the limit allows; else the largest backlogs do),
    the rest is shared in proportion to what each queue has left (floors, then one more each to
    the largest remainders). Queues absent from ``start`` keep their ``latest`` value."""
    assert max_records > 0
    lag = {mq: max(0, latest[mq] - start[mq]) for mq in latest if mq in start}
    total = sum(lag.values())
    if total <= max_records:
        return dict(latest)
    waiting = sorted((mq for mq, n in lag.items() if n > 0), key=lambda mq: (-lag[mq], mq))
    share = dict.fromkeys(lag, 0)
    for mq in waiting[:max_records]:
        share[mq] = 1
    budget = max_records - sum(share.values())
    rest = {mq: lag[mq] - share[mq] for mq in lag}
    rest_total = sum(rest.values())
    if budget > 0 and rest_total > 0:
        for mq, n in rest.items():
            share[mq] += budget * n // rest_total
        remainder = max_records - sum(share.values())
        by_fraction = sorted(rest, key=lambda mq: (-(budget * rest[mq] % rest_total), -rest[mq], mq))
        for mq in by_fraction:
            if remainder == 0:
                break
            if share[mq] < lag[mq]:
                share[mq] += 1
                remainder -= 1
    out = dict(latest)
    for mq, n in share.items():
        out[mq] = start[mq] + n
    return out


def next_end(
    start: Mapping[MessageQueue, int],
    view: ClusterView,
    *,
    max_records: int | None,
    cap: Mapping[MessageQueue, int] | None = None,
) -> tuple[dict[MessageQueue, int], list[OffsetEvent]]:
    """A micro-batch's end offsets from its start and the cluster's state (see module invariants).
    ``cap`` (Trigger.AvailableNow) bounds every queue it names."""
    available = view.available()
    latest: dict[MessageQueue, int] = {}
    events: list[OffsetEvent] = []
    for mq, q in available.items():
        if mq not in start:
            latest[mq] = q.min_offset  # a new queue: enters here, read from the next batch on
        elif q.max_offset < start[mq]:
            events.append(OffsetEvent(mq, "reset", start[mq], q.min_offset))
        else:
            latest[mq] = q.max_offset
    if cap is not None:
        for mq, limit in cap.items():
            if mq in latest and mq in start:
                latest[mq] = max(start[mq], min(latest[mq], limit))
    end = rate_limit(start, latest, max_records) if max_records is not None else dict(latest)
    for e in events:
        end[e.mq] = e.to_offset
    for mq, offset in start.items():
        end.setdefault(mq, offset)  # unreachable group: stays where it was
    return end, events
