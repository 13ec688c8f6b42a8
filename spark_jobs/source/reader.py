"""Reading one ``ReadRange`` on an executor: pulls from the group's replicas, rows as Arrow batches.

    range [start, end) ──pull(offset, n)──> replica 1 (a follower that holds the range)
                          serves from ``offset`` ──> step() ──> rows, next offset
                          OFFSET_OVERFLOW / NO_NEW_MSG (lagging), no answer ──> next replica
                          serves only from later (OFFSET_TOO_SMALL, or a head skipped as removed)
                              ──> next replica; from every one that answered ──> the answer that
                                  serves from the lowest offset ──> step() ──> loss before it

``step`` is the pure core: what an answer means for the range. Without a tag filter the broker
answers consecutive offsets, so a hole (offsets skipped inside a FOUND, or a NO_MATCHED_MSG) is
data retention removed between the consume queue's and the log's clean-up (``served_from`` is the
first offset an answer really serves); with a filter, skipped offsets are simply messages that did
not match, and only OFFSET_TOO_SMALL reveals a loss. Retention runs on each replica on its own, so
a replica that lost the head is never believed while another one may still serve it.

A lost range fails the task (``DataLossError``) when ``failOnDataLoss`` is true; otherwise it is
skipped, logged as a warning and, with ``dataLossLog``, appended to that file as one JSON line.
Every wait is bounded: a range whose replicas all stay silent, lagging or unreachable for
``timeoutMs`` fails the task with the last error seen. A refusal (4xx: topic unknown, not
readable, credentials missing or refused) fails it at once when every replica that answered
refused; one lagging follower that does not know a new topic yet is just skipped. The task's
``Transport`` carries the credentials and TLS the driver resolved (``SourceOptions.security``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from broker.client.message import MessageQueue
from broker.client.transport import ClientError, NamesrvClient
from broker.protocol.frames import Op
from spark_jobs.source.options import SourceOptions
from spark_jobs.source.plan import DataLossError, ReadRange
from spark_jobs.source.schema import to_record_batch
from spark_jobs.source.security import is_refusal, refusal

log = logging.getLogger(__name__)

CALL_TIMEOUT_S_MAX = 10.0
PULL_BYTES_MAX = 64 << 20  # the broker's limit of one pull answer's bodies (bounds a task's memory)
BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)
FINAL_STATUSES = (400, 401, 403, 404)  # refusals; final when every replica that answers refuses


@dataclasses.dataclass(frozen=True)
class Step:
    """What one pull answer means for the range being read."""

    keep: int  # the first ``keep`` messages of the answer belong to the range
    lost: tuple[tuple[int, int], ...]  # offset ranges [a, b) that are gone
    next_offset: int


def served_from(offset: int, answer: dict[str, Any], filtered: bool) -> int:
    """The first offset at or after ``offset`` that a FOUND / NO_MATCHED_MSG / OFFSET_TOO_SMALL
    answer really serves (with a filter, a skipped offset is a non-matching message: served)."""
    status = answer["status"]
    if status == "OFFSET_TOO_SMALL":
        return max(offset, int(answer["min_offset"]))
    if filtered:
        return offset
    if status == "FOUND" and answer["messages"]:
        return max(offset, int(answer["messages"][0]["queue_offset"]))
    return max(offset, int(answer["next_offset"]))  # NO_MATCHED_MSG unfiltered: all skipped as removed


def best_of_round(
    offset: int, later: Sequence[dict[str, Any]], served_or_lagging: int, filtered: bool
) -> dict[str, Any] | None:
    """After asking every replica once, none of which served from ``offset``: the answer that
    serves from the lowest offset when every replica that answered could only serve later
    (``later``), else None — a lagging replica (OFFSET_OVERFLOW, NO_NEW_MSG) may still hold the
    offset once it catches up, so the round is tried again."""
    if not later or len(later) != served_or_lagging:
        return None
    return min(later, key=lambda a: served_from(offset, a, filtered))


def step(offset: int, end: int, answer: dict[str, Any], filtered: bool) -> Step:
    """The pure core of a range read (see the module docstring). ``answer`` is a pull answer
    with status FOUND, NO_MATCHED_MSG or OFFSET_TOO_SMALL (the last from every replica asked)."""
    status = answer["status"]
    if status == "OFFSET_TOO_SMALL":
        resume = min(max(int(answer["min_offset"]), offset), end)
        return Step(0, ((offset, resume),) if resume > offset else (), resume)
    next_offset = int(answer["next_offset"])
    if next_offset <= offset:
        raise RuntimeError(f"a pull at offset {offset} answered {status} without progress (next {next_offset})")
    resume = min(next_offset, end)
    if status == "NO_MATCHED_MSG":
        return Step(0, () if filtered else ((offset, resume),), resume)
    if status != "FOUND":
        raise RuntimeError(f"unexpected pull status {status!r}")
    lost: list[tuple[int, int]] = []
    expect = offset
    keep = 0
    for m in answer["messages"]:
        qo = int(m["queue_offset"])
        if qo >= end:
            break
        if qo < expect:
            raise RuntimeError(f"a pull at offset {offset} answered offset {qo} out of order")
        if qo > expect and not filtered:
            lost.append((expect, qo))
        expect = qo + 1
        keep += 1
    if not filtered and expect < resume:
        lost.append((expect, resume))  # the answer's tail was skipped as removed
    return Step(keep, tuple(lost), resume)


def record_skipped(opts: SourceOptions, mq: MessageQueue, ranges: Sequence[tuple[int, int]], reason: str) -> None:
    """Fail (``failOnDataLoss``) or log each skipped range, and append it to ``dataLossLog``."""
    if not ranges:
        return
    where = ", ".join(f"[{a}, {b})" for a, b in ranges)
    if opts.fail_on_data_loss:
        raise DataLossError(
            f"DATA_LOSS: {mq} offsets {where} are gone ({reason}) before they were read; "
            "set failOnDataLoss=false to skip such ranges and report them"
        )
    log.warning("dledger-mq skipped %s offsets %s (%s)", mq, where, reason)
    if opts.data_loss_log:
        lines = "".join(
            json.dumps(
                {
                    "topic": mq.topic,
                    "broker": mq.broker_name,
                    "queue_id": mq.queue_id,
                    "from_offset": a,
                    "to_offset": b,
                    "reason": reason,
                    "reported_ms": int(time.time() * 1000),
                }
            )
            + "\n"
            for a, b in ranges
        )
        # O_APPEND: lines written by concurrent tasks do not interleave (one small write each).
        fd = os.open(opts.data_loss_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)


class RangeReader:
    """Reads one range with its own event loop and transport (one per Spark task)."""

    def __init__(self, opts: SourceOptions, rng: ReadRange):
        self.opts = opts
        self.rng = rng
        self.addrs = list(rng.addrs)
        self.transport = opts.security.transport(CALL_TIMEOUT_S_MAX)  # the driver's credentials and TLS

    def batches(self) -> Iterator[Any]:
        """Arrow record batches of the range, in offset order."""
        loop = asyncio.new_event_loop()
        try:
            offset = self.rng.start
            while offset < self.rng.end:
                answer = loop.run_until_complete(self._pull(offset))
                st = step(offset, self.rng.end, answer, filtered=self.opts.filtered)
                if st.lost:
                    if answer["status"] == "OFFSET_TOO_SMALL":
                        reason = "offset below every replica's min offset"
                    else:
                        reason = "offsets skipped by the broker as removed from the log"
                    record_skipped(self.opts, self.rng.mq, st.lost, reason)
                if st.keep:
                    yield to_record_batch(answer["messages"][: st.keep])
                offset = st.next_offset
        finally:
            loop.run_until_complete(self.transport.close())
            loop.close()

    async def _pull(self, offset: int) -> dict[str, Any]:
        body = {
            "topic": self.rng.mq.topic,
            "queue_id": self.rng.mq.queue_id,
            "offset": offset,
            "max_count": max(1, min(self.opts.pull_batch_size, self.rng.end - offset)),
            "max_bytes": PULL_BYTES_MAX,
            "tags": self.opts.tags_expression,
        }
        if self.opts.sql is not None:
            body["sql"] = self.opts.sql
        filtered = self.opts.filtered
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.opts.timeout_ms / 1000
        last = "no replica address known"
        attempt = 0
        while True:
            if not self.addrs or attempt > 0:
                await self._refresh_addrs()
            later: list[dict[str, Any]] = []  # answers that serve only from a later offset
            refused: list[ClientError] = []
            answered = 0
            for addr in list(self.addrs):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    ans = await self.transport.operation(
                        addr, Op.PULL, body, timeout_s=min(CALL_TIMEOUT_S_MAX, remaining)
                    )
                except ClientError as exc:
                    last = f"{addr}: {exc.code} {exc.message}"[:300]
                    if exc.status in FINAL_STATUSES:  # e.g. a follower not yet aware of a new topic
                        refused.append(exc)
                        answered += 1
                    continue
                answered += 1
                status = ans.get("status")
                if status in ("FOUND", "NO_MATCHED_MSG", "OFFSET_TOO_SMALL"):
                    if served_from(offset, ans, filtered) == offset:
                        return dict(ans)
                    later.append(dict(ans))
                last = f"{addr}: {status} (holds {ans.get('min_offset')}..{ans.get('max_offset')})"
            if refused and len(refused) == answered:
                denied = [e for e in refused if is_refusal(e)]
                if denied:
                    raise refusal(denied[0], self.opts.security, f"the pull of {self.rng.mq} at {offset}")
                raise RuntimeError(f"every replica refused the pull of {self.rng.mq} at {offset}: {refused[0]}")
            best = best_of_round(offset, later, answered - len(refused), filtered)
            if best is not None:
                return best
            if loop.time() >= deadline:
                raise TimeoutError(
                    f"no replica of {self.rng.mq.broker_name} served {self.rng.mq} at offset {offset} "
                    f"within {self.opts.timeout_ms} ms (last: {last})"
                )
            await asyncio.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
            attempt += 1

    async def _refresh_addrs(self) -> None:
        """Add the group's replicas from the NameServers' route (the planned ones may be stale)."""
        try:
            route = await NamesrvClient(list(self.opts.namesrv), self.transport).route(
                self.rng.mq.topic, timeout_s=3.0
            )
        except ClientError as exc:
            log.debug("route refresh for %s failed: %s", self.rng.mq, exc)
            return
        bd = route.broker(self.rng.mq.broker_name)
        if bd is None:
            return
        for _bid, addr in sorted(bd.broker_addrs.items(), key=lambda kv: (kv[0] == 0, kv[0])):
            if addr not in self.addrs:
                self.addrs.append(addr)
