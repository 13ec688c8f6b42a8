"""The continuous audit's checks, as state kept between micro-batches (pure Python, driver side).

``StreamChecker.batch(rows, sends, now_us)`` takes what one micro-batch read from the topics (one
tuple per stored message, in any order) and the send lines written to the history since the last
batch, and returns that batch's ``BatchReport``. Definitions (docs/CHAOS.md, "Continuous audit"):

- ``lost``: an ``ok`` send whose acknowledged queue the stream has read past its acknowledged
  offset, with no record of its unique id in that broker group: lost from the log (or, at the end,
  ``finish``: an ok send acknowledged before the last micro-batch was planned whose queue never
  reached its offset; later ones stay pending, unjudged).
- ``ack_offset_mismatch``: the same, the id stored in the group but not at the acknowledged offset.
- ``aborted_read``: a send the SDK reported as a definite failure (``fail``) whose id is stored.
- ``key_order``: for one (topic, group, producer, sharding key), the first record of each unique id
  in log order (queue offset order: one key, one queue) must carry a ``seq`` above every earlier one.
- ``offset_gap``: within a queue, a row whose offset is not the previous one + 1 (the stream skipped
  or repeated offsets: the reader's own invariant).
- ``duplicates`` (a note, not a failure): a unique id stored at a second place of a group (retried
  sends: at-least-once).

Memory: the unique ids seen per group (about 150 bytes each) and the acknowledged sends not yet
judged; ``keep`` bounds the per-batch finding samples.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["FAILING", "BatchReport", "Row", "StreamChecker"]

FAILING = ("lost", "ack_offset_mismatch", "aborted_read", "key_order", "offset_gap")
NOTES = ("duplicates",)

# topic, broker, queue_id, queue_offset, unique_id, key, producer, seq, store_ms
Row = tuple[str, str, int, int, str, str | None, str | None, int | None, int]
Queue = tuple[str, str, int]


@dataclasses.dataclass
class BatchReport:
    batch_id: int
    time_us: int
    rows: int
    sends_read: int
    judged: int  # ok sends judged in this batch
    pending: int  # ok sends whose offset the stream has not passed yet
    counts: dict[str, int]
    delay_ms: dict[str, float | None]  # now - store time of the rows read: p50, max
    findings: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def failed(self) -> bool:
        return any(self.counts.get(k, 0) for k in FAILING)


class StreamChecker:
    def __init__(self, keep: int = 20, topics: Iterable[str] | None = None):
        self.keep = keep
        self.topics = None if topics is None else frozenset(topics)  # sends of other topics: not ours
        self.position: dict[Queue, int] = {}  # next offset expected per queue (max read + 1)
        self.stored: dict[tuple[str, str], list[tuple[int, int]]] = {}  # (group, uid) -> [(qid, offset)]
        self.failed_ids: set[str] = set()
        self.stored_ids: set[str] = set()
        self.last_seq: dict[tuple[str, str, str, str], int] = {}
        self.pending: dict[Queue, list[tuple[int, str, int]]] = defaultdict(list)  # heap (offset, uid, complete_us)
        self.totals: dict[str, int] = dict.fromkeys((*FAILING, *NOTES), 0)
        self.sends_ok = 0
        self.judged = 0
        self.rows = 0

    # -- input -----------------------------------------------------------------------------------
    def _rows(self, rows: Iterable[Row], out: list[dict[str, Any]]) -> list[int]:
        store_ms: list[int] = []
        by_queue: dict[Queue, list[Row]] = defaultdict(list)
        for r in rows:
            by_queue[(r[0], r[1], r[2])].append(r)
        for q, items in sorted(by_queue.items()):
            items.sort(key=lambda r: r[3])
            for topic, broker, qid, offset, uid, key, producer, seq, sms in items:
                self.rows += 1
                store_ms.append(sms)
                expect = self.position.get(q)
                if expect is not None and offset != expect:
                    out.append({"check": "offset_gap", "topic": topic, "broker": broker, "queue_id": qid,
                                "queue_offset": offset, "expected": expect})  # fmt: skip
                self.position[q] = max(offset + 1, expect or 0)
                places = self.stored.setdefault((broker, uid), [])
                first = not places
                places.append((qid, offset))
                self.stored_ids.add(uid)
                if not first:
                    out.append({"check": "duplicates", "topic": topic, "broker": broker, "unique_id": uid,
                                "places": [list(p) for p in places[:4]]})  # fmt: skip
                if uid in self.failed_ids:
                    out.append({"check": "aborted_read", "topic": topic, "broker": broker, "queue_id": qid,
                                "queue_offset": offset, "unique_id": uid})  # fmt: skip
                if first and key is not None and producer is not None and seq is not None:
                    k = (topic, broker, producer, key)
                    prev = self.last_seq.get(k)
                    if prev is not None and seq <= prev:
                        out.append({"check": "key_order", "topic": topic, "broker": broker, "producer": producer,
                                    "key": key, "seq": seq, "prev_seq": prev, "queue_id": qid,
                                    "queue_offset": offset, "unique_id": uid})  # fmt: skip
                    self.last_seq[k] = seq if prev is None else max(prev, seq)
        return store_ms

    def _sends(self, sends: Iterable[Mapping[str, Any]], out: list[dict[str, Any]]) -> int:
        n = 0
        for s in sends:
            n += 1
            uid = s.get("unique_id")
            if not isinstance(uid, str):
                continue
            outcome = s.get("outcome")
            if outcome == "fail":
                self.failed_ids.add(uid)
                if uid in self.stored_ids:
                    out.append({"check": "aborted_read", "unique_id": uid, "producer": s.get("producer")})
            elif outcome == "ok" and s.get("due_us") is None:  # a delayed send's offset is its schedule queue's
                topic, broker, qid, off = s.get("topic"), s.get("broker"), s.get("queue_id"), s.get("queue_offset")
                if not (isinstance(topic, str) and isinstance(broker, str) and isinstance(qid, int)
                        and isinstance(off, int)):  # fmt: skip
                    continue
                if self.topics is not None and topic not in self.topics:
                    continue
                self.sends_ok += 1
                heapq.heappush(self.pending[(topic, broker, qid)], (off, uid, int(s.get("complete_us") or 0)))
        return n

    def _judge(self, out: list[dict[str, Any]], acked_before_us: int | None = None) -> int:
        """Judge the pending sends whose offset the stream passed; with ``acked_before_us`` (the
        end), also those acknowledged before then: a micro-batch planned after an acknowledgement
        covers the message (it was committed before it was acknowledged)."""
        judged = 0
        for q, heap in self.pending.items():
            pos = self.position.get(q, 0)
            keep: list[tuple[int, str, int]] = []
            while heap and (heap[0][0] < pos or acked_before_us is not None):
                off, uid, complete_us = heapq.heappop(heap)
                if off >= pos and (acked_before_us is None or complete_us >= acked_before_us):
                    keep.append((off, uid, complete_us))  # not judged: acknowledged after the last plan
                    continue
                judged += 1
                places = self.stored.get((q[1], uid))
                if places and (q[2], off) in places:
                    continue
                row = {"topic": q[0], "broker": q[1], "queue_id": q[2], "queue_offset": off, "unique_id": uid,
                       "complete_us": complete_us, "read_up_to": pos}  # fmt: skip
                if places:
                    out.append({"check": "ack_offset_mismatch", **row, "stored_at": [list(p) for p in places[:4]]})
                else:
                    out.append({"check": "lost", **row})
            for k in keep:
                heapq.heappush(heap, k)
        self.judged += judged
        return judged

    # -- a micro-batch ------------------------------------------------------------------------------
    def batch(self, batch_id: int, rows: Iterable[Row], sends: Iterable[Mapping[str, Any]], now_us: int) -> BatchReport:
        found: list[dict[str, Any]] = []
        store_ms = self._rows(rows, found)
        sends_read = self._sends(sends, found)
        judged = self._judge(found)
        return self._report(batch_id, now_us, len(store_ms), sends_read, judged, found, store_ms)

    def finish(self, now_us: int, last_plan_us: int | None) -> BatchReport:
        """After the last micro-batch, planned at ``last_plan_us`` (wall clock): an ok send still
        pending that was acknowledged before then names an offset its queue never reached — lost.
        Those acknowledged later stay ``pending`` (unjudged), reported but no finding."""
        found: list[dict[str, Any]] = []
        judged = self._judge(found, acked_before_us=last_plan_us if last_plan_us is not None else -1)
        return self._report(-1, now_us, 0, 0, judged, found, [])

    def _report(
        self, batch_id: int, now_us: int, rows: int, sends_read: int, judged: int,
        found: list[dict[str, Any]], store_ms: list[int],
    ) -> BatchReport:  # fmt: skip
        counts = dict.fromkeys((*FAILING, *NOTES), 0)
        for f in found:
            counts[f["check"]] += 1
        for k, v in counts.items():
            self.totals[k] += v
        delay: dict[str, float | None] = {"p50": None, "max": None}
        if store_ms:
            ds = sorted(now_us / 1000 - s for s in store_ms)
            delay = {"p50": round(ds[len(ds) // 2], 1), "max": round(ds[-1], 1)}
        failing = [f for f in found if f["check"] in FAILING]
        notes = [f for f in found if f["check"] not in FAILING]
        return BatchReport(
            batch_id, now_us, rows, sends_read, judged, sum(len(h) for h in self.pending.values()),
            counts, delay, (failing + notes)[: self.keep],
        )  # fmt: skip
