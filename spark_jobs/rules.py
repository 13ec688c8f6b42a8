"""The audit's definitions as plain Python over small data: the reference the Spark jobs must match.

``checks`` applies these definitions to whole runs with Spark; tests run both on the same inputs and
demand equal answers. The definitions (docs/CHAOS.md, "Audit", says the same in prose):

Lost and unseen (Jepsen's queue checker): an ok send is *lost* when its group's committed log does
not hold it, or when no read (receipt or drain line) returned it although reads of its queue went
past its acknowledged offset; it is *unseen* when the log holds it, no read returned it, and no read
went past it (the reads stopped before it: it was never delivered after heal and drain).

Inconsistent offsets: one (broker, topic, queue, offset) named with two different unique ids by any
two of: ok acknowledgements, receipts, drain lines, the consume queues of the replicas' committed
logs. Acknowledged offset: an ok send whose acknowledged (queue, offset) is not where a replica's
consume queue holds the message's log position.

Non-monotonic send: one producer's ok sends to one queue, in invocation order: an acknowledged
offset not greater than every earlier one. Poll order (non-monotonic poll, poll skip): within one
consumer's session of one queue (between two (re)assignments), in the consumer's file order, every
receipt's offset must be the previous one + 1 (orderly consumers: one message at a time, in order);
a lower or equal one is ``backwards``, a higher one ``skip``. Receipts without a session are not
judged.

Aborted read: a unique id whose every send line says ``fail`` (definitely not stored) that is in the
committed log or was read. Corrupt read: a read whose body CRC differs from the send's.

Offset regression: the consumer group's stored offsets as the sampler read them, each read at an
applied index in [``applied_before``, ``applied_after``] (the sample's applied index; the same
process's next sample's). Offsets are a function of the applied index, never decreasing: for reads
f1, f2 of any replicas of one group with f2.applied_before >= f1.applied_after, f2's offset of a
queue must be >= f1's, unless an ``offset.reset`` of the group and topic lies in
(f1.applied_before, f2.applied_after].

Committed prefix (per replica, between damage faults: samples inside a ``bitflip``/``truncate``
window of that replica are not judged, and its epochs end at each such window): a sample's
committed index must stay in the replica's log with the same chain CRC — a later sample holding
less (``shrank``), a later sample of the same process with a lower commit index (``commit_back``), a
later sample at the same commit index with another chain CRC, or the replica's final log holding
another chain CRC there (``changed``), or ending before it (``shrank``), is a violation.
Commit CRC mismatch: two replicas reporting one committed index with different chain CRCs.
Non-conflicting truncation: a replica's truncation counter grows between two samples of one
process that show the same term, the first one's log already ending in that term (its log then
matches the leader's: nothing in it can conflict).

Elections without a fault (a note): a term first seen in a group outside every fault window (from
apply to heal plus ``grace_us``).

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

import bisect
import dataclasses
import itertools
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence

__all__ = [
    "Ack",
    "FaultWindow",
    "Fetch",
    "LogRecord",
    "QueueMismatch",
    "Read",
    "Sample",
    "Window",
    "aborted_reads",
    "ack_offset_mismatches",
    "commit_crc_mismatches",
    "committed_prefix_violations",
    "corrupt_reads",
    "cq_mismatch",
    "damage_epochs",
    "divergence",
    "elections_without_fault",
    "fault_recovery",
    "inconsistent_offsets",
    "key_order_violations",
    "lost_and_unseen",
    "nonconflicting_truncations",
    "offset_regressions",
    "pair_faults",
    "poll_order_violations",
    "recovery_times",
    "send_order_violations",
    "unavailability_windows",
]

Queue = tuple[str, str, int]  # (broker, topic, queue_id)


# -- sends and reads -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Ack:
    """An ok send line."""

    producer: str
    line: int
    unique_id: str
    queue: Queue
    offset: int | None
    invoke_us: int
    position: int | None = None  # from the msg id


@dataclasses.dataclass(frozen=True, slots=True)
class Read:
    """A receipt (``consumer`` c0...) or drain line (``consumer`` "drain")."""

    consumer: str
    line: int
    queue: Queue
    offset: int
    unique_id: str
    session: int | None = None
    body_crc: int | None = None


def lost_and_unseen(
    acks: Iterable[Ack], in_log: set[tuple[str, str]], reads: Iterable[Read]
) -> tuple[list[tuple[Ack, bool, bool]], list[Ack]]:
    """(lost: [(ack, in_log, read_past)], unseen: [ack]); ``in_log`` holds (broker, unique id) of
    the committed logs. One row per unique id (its first ok line)."""
    read_ids: set[str] = set()
    highest: dict[Queue, int] = {}
    for r in reads:
        read_ids.add(r.unique_id)
        highest[r.queue] = max(highest.get(r.queue, -1), r.offset)
    lost, unseen, done = [], [], set()
    for a in sorted(acks, key=lambda a: (a.producer, a.line)):
        if a.unique_id in done:
            continue
        done.add(a.unique_id)
        logged = (a.queue[0], a.unique_id) in in_log
        past = a.offset is not None and highest.get(a.queue, -1) > a.offset
        if not logged or (a.unique_id not in read_ids and past):
            lost.append((a, logged, past))
        elif a.unique_id not in read_ids:
            unseen.append(a)
    return lost, unseen


def inconsistent_offsets(claims: Iterable[tuple[Queue, int, str, str]]) -> dict[tuple[Queue, int], set[str]]:
    """``(queue, offset, unique_id, source)`` claims -> the (queue, offset)s named with two or more
    unique ids, and those ids."""
    ids: dict[tuple[Queue, int], set[str]] = defaultdict(set)
    for queue, offset, uid, _source in claims:
        ids[(queue, offset)].add(uid)
    return {k: v for k, v in ids.items() if len(v) > 1}


def ack_offset_mismatches(
    acks: Iterable[Ack], units: Iterable[tuple[str, str, str, str, int, int]]
) -> list[tuple[Ack, str, list[tuple[int, int]]]]:
    """Ok sends whose acknowledged (topic, queue id, offset) is not among the units a replica holds
    for the message; ``units``: (broker, replica, unique_id, topic, queue_id, offset). Rows: (ack,
    replica, the (queue id, offset)s it holds the message at)."""
    held: dict[tuple[str, str], dict[str, set[tuple[str, int, int]]]] = defaultdict(lambda: defaultdict(set))
    for broker, replica, uid, topic, qid, offset in units:
        held[(broker, uid)][replica].add((topic, qid, offset))
    out = []
    for a in acks:
        if a.offset is None:
            continue
        want = (a.queue[1], a.queue[2], a.offset)
        for replica, places in sorted(held.get((a.queue[0], a.unique_id), {}).items()):
            if want not in places:
                out.append((a, replica, sorted((q, o) for _, q, o in places)))
    return out


def send_order_violations(acks: Iterable[Ack]) -> list[tuple[Ack, int]]:
    """``(ack, highest offset acknowledged to the producer in that queue before it)``."""
    streams: dict[tuple[str, Queue], list[Ack]] = defaultdict(list)
    for a in acks:
        if a.offset is not None:
            streams[(a.producer, a.queue)].append(a)
    out = []
    for stream in streams.values():
        stream.sort(key=lambda a: (a.invoke_us, a.line))
        high: int | None = None
        for a in stream:
            assert a.offset is not None
            if high is not None and a.offset <= high:
                out.append((a, high))
            high = a.offset if high is None else max(high, a.offset)
    return out


def poll_order_violations(reads: Iterable[Read]) -> list[tuple[Read, int, str]]:
    """``(receipt, previous offset in its session, "backwards" | "skip")`` (module doc)."""
    streams: dict[tuple[str, int, Queue], list[Read]] = defaultdict(list)
    for r in reads:
        if r.consumer != "drain" and r.session is not None:
            streams[(r.consumer, r.session, r.queue)].append(r)
    out = []
    for stream in streams.values():
        stream.sort(key=lambda r: r.line)
        for prev, r in itertools.pairwise(stream):
            if r.offset != prev.offset + 1:
                out.append((r, prev.offset, "skip" if r.offset > prev.offset else "backwards"))
    return out


def aborted_reads(
    sends: Iterable[tuple[str, str]], in_log: set[str], read: set[str]
) -> dict[str, tuple[bool, bool]]:
    """``sends``: (unique id, outcome). Unique ids whose every line says fail, yet stored or read:
    id -> (in the committed log, read)."""
    outcomes: dict[str, set[str]] = defaultdict(set)
    for uid, outcome in sends:
        outcomes[uid].add(outcome)
    return {
        u: (u in in_log, u in read) for u, o in outcomes.items() if o == {"fail"} and (u in in_log or u in read)
    }


def corrupt_reads(sent_crc: Mapping[str, int], reads: Iterable[Read]) -> list[tuple[Read, int]]:
    """Reads whose body CRC is not the one sent: (read, CRC sent)."""
    out = []
    for r in reads:
        want = sent_crc.get(r.unique_id)
        if want is not None and r.body_crc is not None and r.body_crc != want:
            out.append((r, want))
    return out


# -- samples ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    group: str
    replica: str
    line: int
    time_us: int
    pid: int | None
    term: int | None
    commit: int | None
    applied: int | None
    last: int | None
    last_term: int | None
    crc: int | None
    truncated: int | None


def damage_epochs(
    samples: Iterable[Sample], windows: Mapping[str, Sequence[tuple[int, int]]]
) -> dict[tuple[str, str], list[list[Sample]]]:
    """Per (group, replica): its samples in time order, cut into epochs at each damage window
    ``windows[replica]`` = [(apply_us, heal_us)]; samples inside a window are left out."""
    out: dict[tuple[str, str], list[list[Sample]]] = {}
    by: dict[tuple[str, str], list[Sample]] = defaultdict(list)
    for s in samples:
        by[(s.group, s.replica)].append(s)
    for key, rows in by.items():
        rows.sort(key=lambda s: (s.time_us, s.line))
        cuts = sorted(windows.get(key[1], ()))
        epochs: list[list[Sample]] = [[] for _ in range(len(cuts) + 1)]
        for s in rows:
            k = sum(1 for a, _ in cuts if a <= s.time_us)
            if k and s.time_us <= cuts[k - 1][1]:
                continue  # inside a damage window
            epochs[k].append(s)
        out[key] = epochs
    return out


def committed_prefix_violations(
    epochs: Mapping[tuple[str, str], list[list[Sample]]],
    final: Mapping[tuple[str, str], tuple[int, int, Mapping[int, int]]],
) -> list[tuple[Sample, Sample | None, str]]:
    """(earlier sample, later sample or None for the final log, kind) per violation (module doc).
    ``final[(group, replica)]`` = (first index, last index, {index: chain CRC}) of its final log.
    One row per later sample (against the earlier sample that shows it), one per earlier sample
    that the final log contradicts."""
    out: list[tuple[Sample, Sample | None, str]] = []
    for key, parts in epochs.items():
        for k, rows in enumerate(parts):
            best: Sample | None = None  # highest commit so far
            at: dict[int, Sample] = {}  # commit index -> first sample that reported it
            for s in rows:
                found = False
                if best is not None and best.commit is not None and s.last is not None and s.last < best.commit:
                    out.append((best, s, "shrank"))
                    found = True
                if (not found and best is not None and s.pid == best.pid and s.commit is not None
                        and best.commit is not None and s.commit < best.commit):
                    out.append((best, s, "commit_back"))
                    found = True
                first = at.get(s.commit) if s.commit is not None else None
                if not found and first is not None and None not in (first.crc, s.crc) and first.crc != s.crc:
                    out.append((first, s, "changed"))
                if s.commit is not None and s.commit not in at:
                    at[s.commit] = s
                if s.commit is not None and (best is None or best.commit is None or s.commit > best.commit):
                    best = s
            if k != len(parts) - 1 or key not in final:
                continue
            first_index, last_index, crcs = final[key]
            for c, s in sorted(at.items()):
                if c < first_index or s.crc is None:
                    continue
                if c > last_index:
                    out.append((s, None, "shrank"))
                elif crcs.get(c) is not None and crcs[c] != s.crc:
                    out.append((s, None, "changed"))
    return out


def commit_crc_mismatches(samples: Iterable[Sample]) -> dict[tuple[str, int], set[tuple[str, int]]]:
    """(group, commit index) -> {(replica, chain CRC)} where replicas disagree."""
    by: dict[tuple[str, int], set[tuple[str, int]]] = defaultdict(set)
    for s in samples:
        if s.commit is not None and s.crc is not None:
            by[(s.group, s.commit)].add((s.replica, s.crc))
    return {k: v for k, v in by.items() if len({crc for _, crc in v}) > 1}


def nonconflicting_truncations(samples: Iterable[Sample]) -> list[tuple[Sample, Sample]]:
    """(earlier, later) consecutive samples of one process (module doc)."""
    by: dict[tuple[str, str], list[Sample]] = defaultdict(list)
    for s in samples:
        by[(s.group, s.replica)].append(s)
    out = []
    for rows in by.values():
        rows.sort(key=lambda s: (s.time_us, s.line))
        for a, b in itertools.pairwise(rows):
            if (
                a.pid == b.pid
                and a.term is not None
                and a.term == b.term == a.last_term
                and None not in (a.truncated, b.truncated)
                and b.truncated > a.truncated  # type: ignore[operator]
            ):
                out.append((a, b))
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class Fetch:
    """One queue's stored offset in one sample."""

    group: str
    replica: str
    line: int
    queue: Queue
    offset: int
    applied_before: int
    applied_after: int | None  # None: no later sample of the same process


def offset_regressions(
    fetches: Iterable[Fetch], resets: Mapping[tuple[str, str], Sequence[int]]
) -> list[tuple[Fetch, Fetch]]:
    """(later-applied read with a lower offset, the earlier-applied read with the highest offset it
    must not be below) per violating read; ``resets[(group, topic)]`` = offset.reset indexes."""
    by: dict[Queue, list[Fetch]] = defaultdict(list)
    for f in fetches:
        by[f.queue].append(f)
    out = []
    for queue, rows in by.items():
        cuts = sorted(resets.get((queue[0], queue[1]), ()))
        for f2 in rows:
            worst: Fetch | None = None
            for f1 in rows:
                if f1.applied_after is None or f2.applied_before < f1.applied_after:
                    continue
                upper = f2.applied_after if f2.applied_after is not None else f2.applied_before
                if bisect.bisect_right(cuts, f1.applied_before) != bisect.bisect_right(cuts, upper):
                    continue  # an offset.reset lies between them
                if f1.offset > f2.offset and (worst is None or f1.offset > worst.offset):
                    worst = f1
            if worst is not None:
                out.append((f2, worst))
    return out


def elections_without_fault(
    samples: Iterable[Sample], windows: Sequence[tuple[int, int | None]], grace_us: int
) -> list[tuple[str, int, int]]:
    """(group, term, first seen us) for every term a group shows first outside every fault window
    [apply, heal + grace_us] (an unhealed window lasts to the end). The first term seen is not
    counted: it was elected before the first sample."""
    by: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        if s.term is not None:
            by[s.group].append(s)
    out = []
    for group, rows in by.items():
        rows.sort(key=lambda s: (s.time_us, s.line))
        high = rows[0].term
        for s in rows[1:]:
            assert s.term is not None and high is not None
            if s.term > high:
                high = s.term
                inside = any(a <= s.time_us and (h is None or s.time_us <= h + grace_us) for a, h in windows)
                if not inside:
                    out.append((group, s.term, s.time_us))
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
