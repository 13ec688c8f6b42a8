"""Producer auto-batching (RocketMQ 5's ``autoBatch``, Kafka's ``linger.ms``): single-message sends
to one broker group's queues of a topic that arrive within ``batch_max_delay_ms`` of each other go
to the broker as one batch request (one append, one Raft entry), and every caller still gets its
own ``SendResult`` (its own queue, queue offset and message id) or its own error. Each message keeps
the queue its caller chose: a batch across queues names each message's queue (``queue_id`` in the
message map), so round-robin, selectors and ordered sends are unchanged.

    send(m1) ─┐                        ┌─▶ SendResult(m1, offset n)
    send(m2) ─┼─ linger ≤ 1 ms ─▶ POST /v1/send [m1, m2, m3] ─▶ SendResult(m2, offset n+1)
    send(m3) ─┘  (or count/bytes full)  └─▶ SendResult(m3, offset n+2)

- A send to a group with no batch request of the topic in flight goes at once (with whatever other
  sends reached it in the same event-loop turn): a lone synchronous sender never waits for the
  linger. When no other send joined it, its caller's own task sends it (no batch task, and one
  wake-up fewer); the caller's deadline bounds it as the batch's would (``send_items`` ends by
  the deadline it is given), and it gets the same result or error. While a batch is in flight,
  new sends gather and go when it is answered, when the first of them has waited
  ``batch_max_delay_ms``, or when they reach
  ``batch_max_count`` messages or ``batch_max_bytes`` of bodies, whichever comes first (Nagle's
  rule with a bounded linger: the batch grows with the round trip, up to the limits).
- Each message keeps its own ``unique_id`` and ``born_ts``, so an idempotent retry of one caller's
  message (broker/store/dedup.py) is recognised whatever batch it travelled in before.
- The batch request is bounded by the latest caller deadline; each caller waits at most until its
  own deadline (then ``TIMEOUT``, outcome unknown, like any send that got no answer).
- A failed batch gives every caller its own copy of the error: callers then retry one by one (their
  retries may be batched again). A batch the broker refuses as MESSAGE_TOO_LARGE (its
  ``maxMessageSize`` bounds one request's bodies) is split in halves down to single messages, and
  later batches stay under half the refused size.

Messages that are never batched: delayed or timed ones (the broker moves them to the schedule topic
one by one), and calls that are already batches (``send_batch``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import types
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Final

from broker.client.message import Message, MessageQueue, SendResult, send_result_from_answer
from broker.client.transport import ClientError
from broker.protocol.limits import BATCH_MESSAGES_MAX

BATCH_MAX_DELAY_MS_DEFAULT: Final = 1.0
BATCH_MAX_COUNT_DEFAULT: Final = 128
BATCH_MAX_BYTES_DEFAULT: Final = 1 << 20

# (queue, request items, deadline as loop time) -> the broker's send answer
SendItems = Callable[[MessageQueue, list[dict[str, Any]], float], Awaitable[Any]]


@dataclasses.dataclass(slots=True)
class _Waiting:
    mq: MessageQueue
    item: dict[str, Any]
    deadline: float
    future: asyncio.Future[Any]


class _Batch:
    __slots__ = ("bytes", "expiry", "expiry_at", "timer", "waiting")

    def __init__(self) -> None:
        self.waiting: list[_Waiting] = []
        self.bytes = 0
        self.timer: asyncio.Handle | None = None  # the linger (a batch gathered while one is in flight)
        # The callers' own deadlines, one timer per batch (a timer per caller cost more than the
        # rest of its send): armed at the earliest deadline of a caller not answered yet; when it
        # fires, the callers whose deadline that is get TIMEOUT and it moves to the next one. So
        # each caller still times out at the timer of its own deadline. Cancelled once the batch
        # is answered.
        self.expiry: asyncio.TimerHandle | None = None
        self.expiry_at = 0.0

    def arm(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        if self.expiry is not None:
            if deadline >= self.expiry_at:
                return
            self.expiry.cancel()
        self.expiry_at = deadline
        self.expiry = loop.call_at(deadline, self._expired, loop, deadline)

    def _expired(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        self.expiry = None
        after: float | None = None
        for w in self.waiting:
            if w.future.done():
                continue
            if w.deadline <= at:
                _expire(w.future)
            elif after is None or w.deadline < after:
                after = w.deadline
        if after is not None:
            self.arm(loop, after)

    def disarm(self) -> None:
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None


@types.coroutine
def _end_of_turn() -> Generator[None, None, None]:
    """``asyncio.sleep(0)`` without its wrapper: the task steps again in the next loop turn."""
    yield


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(ClientError("TIMEOUT", "no answer before the send's deadline (auto-batched)"))


def batchable(msg: Message) -> bool:
    return not msg.delay_time_level and msg.deliver_time_ms is None


def copy_error(exc: ClientError) -> ClientError:
    """A caller's own copy (the producer marks ``outcome_unknown`` on it per send)."""
    out = ClientError(exc.code, exc.message, status=exc.status, addr=exc.addr, leader_addr=exc.leader_addr)
    out.outcome_unknown = exc.outcome_unknown
    return out


# batches are gathered per (topic, broker group): one request reaches one group's leader
_Key = tuple[str, str]


def _key(mq: MessageQueue) -> _Key:
    return mq.topic, mq.broker_name


class AutoBatcher:
    """One per producer; one open batch per topic and broker group. Owned by the producer's event loop."""

    def __init__(
        self,
        send_items: SendItems,
        *,
        max_delay_ms: float = BATCH_MAX_DELAY_MS_DEFAULT,
        max_count: int = BATCH_MAX_COUNT_DEFAULT,
        max_bytes: int = BATCH_MAX_BYTES_DEFAULT,
    ):
        assert max_delay_ms > 0 and 1 <= max_count <= BATCH_MESSAGES_MAX and max_bytes > 0
        self._send_items = send_items
        self.max_delay_s = max_delay_ms / 1000
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._open: dict[_Key, _Batch] = {}
        self._in_flight: dict[_Key, int] = {}  # batch requests sent and not yet answered
        self._tasks: set[asyncio.Task[None]] = set()
        self._alone: set[asyncio.Future[Any]] = set()  # lone sends their callers make (``send``)
        self.batches = 0  # requests sent (for tests and stats)
        self.messages = 0

    async def send(self, mq: MessageQueue, item: dict[str, Any], deadline: float) -> SendResult:
        """Send one message's request item (``send_request``'s ``messages[0]``) in a batch to ``mq``."""
        loop = asyncio.get_running_loop()
        size = len(item.get("body", b""))
        key = _key(mq)
        batch = self._open.get(key)
        if batch is not None and batch.bytes + size > self.max_bytes:
            self._flush(key)  # this one would overflow it: send what is there, start a new one
            batch = None
        opened = False
        if batch is None:
            batch = self._open[key] = _Batch()
            if self._in_flight.get(key, 0):
                batch.timer = loop.call_later(self.max_delay_s, self._flush, key)
            else:  # nothing in flight to this group: go at the end of this loop turn (below)
                opened = True
        waiting = _Waiting(mq, item, deadline, loop.create_future())
        waiting.future.add_done_callback(_retrieve)  # a caller that timed out leaves its error unread
        batch.waiting.append(waiting)
        batch.bytes += size
        # The caller's own deadline: the batch's timer fails its future then (cheaper per send than
        # an asyncio.timeout scope and a shield; the batch sets results only on futures not yet done).
        batch.arm(loop, deadline)
        if len(batch.waiting) >= self.max_count or batch.bytes >= self.max_bytes:
            self._flush(key)
        if opened:
            # The end of this loop turn, where the batch goes with the sends that joined it. Sent
            # by its own task when others joined; alone, by this caller itself (no task, and no
            # wake-up of this caller by the batch's: one loop turn fewer per synchronous send).
            # The caller's deadline bounds that send too (the producer's send_items ends by the
            # deadline it is given); its result or error is still the one its future holds.
            try:
                await _end_of_turn()
            except BaseException:  # cancelled meanwhile: the batch goes all the same
                if self._open.get(key) is batch:
                    self._flush(key)
                raise
            if self._open.get(key) is batch:
                if len(batch.waiting) > 1:
                    self._flush(key)
                else:
                    del self._open[key]
                    self._in_flight[key] = self._in_flight.get(key, 0) + 1
                    self._alone.add(waiting.future)
                    try:
                        await self._send_one(key, batch)
                    finally:
                        self._alone.discard(waiting.future)
                    answer, index = waiting.future.result()
                    return send_result_from_answer(answer, mq, index)
        answer, index = await waiting.future
        return send_result_from_answer(answer, mq, index)  # a batch across queues: its result names its queue

    def _flush(self, key: _Key) -> None:
        batch = self._open.pop(key, None)
        if batch is None:
            return
        if batch.timer is not None:
            batch.timer.cancel()
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        task = asyncio.get_running_loop().create_task(self._send_one(key, batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_one(self, key: _Key, batch: _Batch) -> None:
        try:
            await self._send(key, batch.waiting)
        finally:
            batch.disarm()  # every caller has its answer or error now
            left = self._in_flight[key] - 1
            if left:
                self._in_flight[key] = left
            else:
                del self._in_flight[key]
            if key in self._open:  # sends gathered while this one was in flight: they go now
                self._flush(key)

    async def _send(self, key: _Key, waiting: list[_Waiting]) -> None:
        self.batches += 1
        self.messages += len(waiting)
        first = waiting[0].mq
        if len(waiting) == 1:  # a lone send (one synchronous sender): its own deadline and queue
            deadline = waiting[0].deadline
            items = [waiting[0].item]
        elif all(w.mq.queue_id == first.queue_id for w in waiting):
            deadline = max(w.deadline for w in waiting)
            items = [w.item for w in waiting]
        else:  # each message names its own queue
            deadline = max(w.deadline for w in waiting)
            items = [{**w.item, "queue_id": w.mq.queue_id} for w in waiting]
        try:
            answer = await self._send_items(first, items, deadline)
            results = answer["results"]
            if not isinstance(results, list) or len(results) != len(waiting):
                raise ClientError("BAD_ANSWER", f"a batch of {len(waiting)} was answered with "
                                  f"{len(results) if isinstance(results, list) else '?'} results")
        except ClientError as exc:
            if exc.code == "MESSAGE_TOO_LARGE" and len(waiting) > 1:
                # The broker's maxMessageSize bounds a request's bodies and may be below max_bytes:
                # each message fitted on its own, so send the halves (down to single messages) and
                # keep later batches under what was refused.
                refused = sum(len(w.item.get("body", b"")) for w in waiting)
                self.max_bytes = max(1, min(self.max_bytes, refused // 2))
                half = len(waiting) // 2
                await asyncio.gather(self._send(key, waiting[:half]), self._send(key, waiting[half:]))
                return
            for w in waiting:
                if not w.future.done():
                    w.future.set_exception(copy_error(exc))
            return
        except (KeyError, TypeError) as exc:
            bad = ClientError("BAD_ANSWER", f"unexpected send answer: {exc!r}")
            for w in waiting:
                if not w.future.done():
                    w.future.set_exception(copy_error(bad))
            return
        except BaseException as exc:  # cancelled (shutdown) or a bug: nobody is left hanging
            for w in waiting:
                if not w.future.done():
                    w.future.set_exception(ClientError("SHUTTING_DOWN", f"the batch was abandoned: {exc!r}"[:200]))
            raise
        for i, w in enumerate(waiting):
            if not w.future.done():
                w.future.set_result((answer, i))

    async def close(self) -> None:
        for key in list(self._open):
            self._flush(key)
        if self._tasks or self._alone:
            await asyncio.gather(*list(self._tasks), *list(self._alone), return_exceptions=True)
