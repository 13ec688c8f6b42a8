"""The audit's definitions as plain Python over small data: the reference the Spark jobs must match.

``checks`` applies these definitions to whole runs with Spark; tests run both on the same inputs and
demand equal answers. The definitions (docs/CHAOS.md, "Audit", says the same in prose):

Queue order (per consumer, per queue): walk one consumer's receipts of one (broker, topic, queue)
in the consumer's file order. A receipt of offset ``o`` is an *order violation* when the consumer
already received a higher offset of that queue and never received ``o`` before. A re-delivery
(an offset it received before: a rebalance, a reset, a RECONSUME_LATER) never is one; neither is
a skip forward.

Key order (per group's committed log): for one producer's ok sends with one sharding key, take the
first log record of each unique id in log order (duplicate copies of a retried send are ignored);
a record whose ``seq`` is not greater than every ``seq`` before it is a violation.

Divergence: at every index ``i``, the replicas that hold ``i`` and whose commit index is ≥ ``i``
must hold the same (term, chain CRC, body). When they do not, the value a strict majority of them
holds is right and the others diverge at ``i``; without a strict majority, all of them do.

Consume queue vs log (per replica, per queue): within ``[lo, hi]`` (positions), the units' positions
in offset order must equal the positions of the queue's committed message records in log order,
with equal sizes. Counted among units and records inside the range: *missing* (a record with no
unit), *extra* (a unit on no record of the queue), *wrong_size*, *misordered* (a unit whose position
is not greater than that of the unit at the offset before it).

Unavailability: between consecutive ok completions (and from the first invocation to the first
ok completion, and after the last ok completion while attempts still complete), a gap is a window
when attempts overlapped it: the window runs from the earliest invocation of an attempt that
overlaps the gap (not before the gap's start) to the next ok completion; it counts when it lasts
at least the threshold.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence

__all__ = [
    "FaultWindow",
    "LogRecord",
    "QueueMismatch",
    "Receipt",
    "Window",
    "cq_mismatch",
    "divergence",
    "fault_recovery",
    "key_order_violations",
    "pair_faults",
    "percentile",
    "queue_order_violations",
    "recovery_times",
    "unavailability_windows",
]


# -- ordering --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Receipt:
    consumer: str
    queue: Hashable  # (broker, topic, queue_id)
    offset: int
    line: int
    unique_id: str


def queue_order_violations(receipts: Iterable[Receipt]) -> list[tuple[Receipt, int]]:
    """``(receipt, highest offset received before it)`` for every violation (see module doc)."""
    streams: dict[tuple[str, Hashable], list[Receipt]] = defaultdict(list)
    for r in receipts:
        streams[(r.consumer, r.queue)].append(r)
    out = []
    for stream in streams.values():
        stream.sort(key=lambda r: r.line)
        seen: set[int] = set()
        high = -1
        for r in stream:
            if r.offset < high and r.offset not in seen:
                out.append((r, high))
            seen.add(r.offset)
            high = max(high, r.offset)
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class LogRecord:
    group: str
    producer: str
    key: str
    position: int
    seq: int
    unique_id: str


def key_order_violations(records: Iterable[LogRecord]) -> list[tuple[LogRecord, int]]:
    """``(record, highest seq before it)`` for every violation (see module doc)."""
    streams: dict[tuple[str, str, str], list[LogRecord]] = defaultdict(list)
    for r in records:
        streams[(r.group, r.producer, r.key)].append(r)
    out = []
    for stream in streams.values():
        stream.sort(key=lambda r: r.position)
        seen: set[str] = set()
        high: int | None = None
        for r in stream:
            if r.unique_id in seen:
                continue
            seen.add(r.unique_id)
            if high is not None and r.seq <= high:
                out.append((r, high))
            high = r.seq if high is None else max(high, r.seq)
    return out


# -- replicas ----------------------------------------------------------------------------------------
def divergence(
    values: Mapping[str, Mapping[int, Hashable]], commits: Mapping[str, int]
) -> dict[str, tuple[int, int]]:
    """Replica -> (first divergent index, number of divergent indexes) for diverging replicas.
    ``values[replica][index]`` is what the replica holds (term, chain CRC, body hash)."""
    indexes = sorted({i for held in values.values() for i in held})
    found: dict[str, list[int]] = defaultdict(list)
    for i in indexes:
        comparing = {r: held[i] for r, held in values.items() if i in held and i <= commits.get(r, 0)}
        if len(comparing) < 2 or len(set(comparing.values())) == 1:
            continue
        counts: dict[Hashable, int] = defaultdict(int)
        for v in comparing.values():
            counts[v] += 1
        majority = [v for v, c in counts.items() if 2 * c > len(comparing)]
        for r, v in comparing.items():
            if not majority or v != majority[0]:
                found[r].append(i)
    return {r: (ix[0], len(ix)) for r, ix in found.items()}


@dataclasses.dataclass(frozen=True, slots=True)
class QueueMismatch:
    missing: int
    extra: int
    wrong_size: int
    misordered: int

    @property
    def total(self) -> int:
        return self.missing + self.extra + self.wrong_size + self.misordered


def cq_mismatch(
    records: Sequence[tuple[int, int]], units: Sequence[tuple[int, int, int]], lo: int, hi: int
) -> QueueMismatch:
    """``records``: (position, size) of the queue's committed messages; ``units``: (offset, position,
    size); both are compared within positions [lo, hi] (see module doc)."""
    sizes = {p: s for p, s in records if lo <= p <= hi}
    ordered = sorted(units)
    prev = {o: ordered[k - 1][1] if k else -1 for k, (o, _, _) in enumerate(ordered)}
    inside = [u for u in ordered if lo <= u[1] <= hi]
    covered = {p for _, p, _ in inside}
    missing = sum(1 for p in sizes if p not in covered)
    extra = sum(1 for _, p, _ in inside if p not in sizes)
    wrong = sum(1 for _, p, s in inside if p in sizes and sizes[p] != s)
    misordered = sum(1 for o, p, _ in inside if prev[o] >= p)
    return QueueMismatch(missing, extra, wrong, misordered)


# -- availability ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Window:
    start_us: int
    end_us: int
    open: bool = False  # the run ended inside it

    @property
    def duration_ms(self) -> float:
        return (self.end_us - self.start_us) / 1000


def unavailability_windows(attempts: Sequence[tuple[int, int, bool]], threshold_us: int) -> list[Window]:
    """Windows from ``(invoke_us, complete_us, ok)`` attempts (see module doc)."""
    if not attempts:
        return []
    oks = sorted(c for _, c, ok in attempts if ok)
    gaps: list[tuple[int, int, bool]] = []
    prev = min(i for i, _, _ in attempts)
    for c in oks:
        gaps.append((prev, c, False))
        prev = c
    last = max(c for _, c, _ in attempts)
    if last > prev:
        gaps.append((prev, last, True))
    out = []
    for lo, hi, is_open in gaps:
        if hi - lo < threshold_us:
            continue
        overlapping = [i for i, c, _ in attempts if i < hi and c > lo]
        start = max(lo, min(overlapping)) if overlapping else hi
        if hi - start >= threshold_us:
            out.append(Window(start, hi, is_open))
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class FaultWindow:
    fault: str
    targets: tuple[str, ...]
    apply_us: int
    heal_us: int | None


def pair_faults(lines: Iterable[tuple[int, str, str, tuple[str, ...]]]) -> list[FaultWindow]:
    """``(time_us, fault, action, targets)`` lines -> windows: a heal closes the earliest open apply
    of the same fault with the same targets, else the earliest open apply of the same fault."""
    open_: list[tuple[int, str, tuple[str, ...]]] = []
    out: list[FaultWindow] = []
    for t, fault, action, targets in sorted(lines, key=lambda x: x[0]):
        if action == "apply":
            open_.append((t, fault, targets))
            continue
        same = [o for o in open_ if o[1] == fault and o[2] == targets] or [o for o in open_ if o[1] == fault]
        if same:
            open_.remove(same[0])
            out.append(FaultWindow(fault, same[0][2], same[0][0], t))
    out += [FaultWindow(f, tg, t, None) for t, f, tg in open_]
    return sorted(out, key=lambda w: w.apply_us)


def recovery_times(
    applies_us: Sequence[int], attempts: Sequence[tuple[int, int, bool]]
) -> list[tuple[int | None, int | None]]:
    """Per fault apply time: (first ok completion at or after it, first ok completion of an attempt
    invoked at or after it) — the latter is the time to recover."""
    out = []
    for a in applies_us:
        first = min((c for _, c, ok in attempts if ok and c >= a), default=None)
        recovered = min((c for i, c, ok in attempts if ok and i >= a), default=None)
        out.append((first, recovered))
    return out


def fault_recovery(
    apply_us: int,
    heal_us: int | None,
    first_ok_us: int | None,
    recovered_us: int | None,
    windows: Sequence[Window],
) -> dict[str, float | None]:
    """One fault window's recovery figures (ms after the apply):

    - ``first_ok_after_ms``: the first ok send completing at or after the apply;
    - ``time_to_recover_ms``: the end of the first unavailability window overlapping the fault
      window [apply, heal] (``heal`` = apply for a fault never healed); without one, the first ok
      completion of a send invoked at or after the apply (the system kept serving);
    - ``unavailability_ms``: the summed length of the unavailability windows overlapping it.
    """
    end = apply_us if heal_us is None else heal_us
    overlapping = sorted(
        (w for w in windows if w.end_us >= apply_us and w.start_us <= end), key=lambda w: w.start_us
    )
    ms = lambda t: None if t is None else (t - apply_us) / 1000  # noqa: E731
    return {
        "first_ok_after_ms": ms(first_ok_us),
        "time_to_recover_ms": ms(overlapping[0].end_us) if overlapping else ms(recovered_us),
        "unavailability_ms": sum(w.duration_ms for w in overlapping),
    }


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in [0, 1]) of an ascending sequence."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]
