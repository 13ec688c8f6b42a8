"""Blocking wrappers over the asyncio clients, for code without an event loop.

Each wrapper owns a private event loop running in a daemon thread; the async client lives on that
loop and every method hands a coroutine to it (``run_coroutine_threadsafe``) and waits, bounded by
a timeout. That one hand-off is the only bridge between the caller's threads and the loop.
Callbacks (``send_async``) and async listeners run on the loop thread; sync listeners on the
consumer's thread pool. Calling a wrapper from its own loop thread would deadlock and raises.
After ``shutdown()`` the loop thread ends: a wrapper is not restartable.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from broker.client.consumer_common import ConsumerStats, Listener
from broker.client.message import Message, MessageQueue, PullResult, SendResult
from broker.client.message_selector import Selector
from broker.client.producer import Producer, SendCallback
from broker.client.pull_consumer import PullConsumer
from broker.client.push_consumer import PushConsumer
from broker.client.selector import QueueSelector

T = TypeVar("T")

CALL_MARGIN_S = 5.0  # on top of the client's own timeouts: the wrapper never waits forever
LIFECYCLE_TIMEOUT_S = 60.0


class _LoopThread:
    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        self._ready.wait(LIFECYCLE_TIMEOUT_S)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("a sync wrapper was called from its own event loop thread (would deadlock)")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout_s} s") from None

    def call(self, fn: Callable[[], T], timeout_s: float | None = LIFECYCLE_TIMEOUT_S) -> T:
        async def _call() -> T:
            return fn()

        return self.run(_call(), timeout_s)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(LIFECYCLE_TIMEOUT_S)
        if not self.thread.is_alive():
            self.loop.close()


def _new(loop: _LoopThread, factory: Callable[[], T]) -> T:
    # Build the client on its loop, so anything it creates is bound to that loop.
    try:
        return loop.call(factory)
    except BaseException:
        loop.close()
        raise


class SyncProducer:
    def __init__(self, group: str, namesrv: str | Sequence[str] | None = None, **kwargs: Any):
        self._loop = _LoopThread(f"producer-{group}")
        self.producer: Producer = _new(self._loop, lambda: Producer(group, namesrv, **kwargs))

    def _timeout(self, timeout_s: float | None) -> float:
        return (timeout_s or self.producer.send_timeout_s) + CALL_MARGIN_S

    def start(self) -> None:
        self._loop.run(self.producer.start(), LIFECYCLE_TIMEOUT_S)

    def shutdown(self) -> None:
        try:
            self._loop.run(self.producer.shutdown(), LIFECYCLE_TIMEOUT_S)
        finally:
            self._loop.close()

    def __enter__(self) -> SyncProducer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
        timeout_s: float | None = None,
    ) -> SendResult:
        coro = self.producer.send(msg, queue=queue, selector=selector, arg=arg, timeout_s=timeout_s)
        return self._loop.run(coro, self._timeout(timeout_s))

    def send_batch(
        self,
        msgs: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        selector: QueueSelector | None = None,
        arg: Any = None,
        timeout_s: float | None = None,
    ) -> SendResult:
        coro = self.producer.send_batch(msgs, queue=queue, selector=selector, arg=arg, timeout_s=timeout_s)
        return self._loop.run(coro, self._timeout(timeout_s))

    def send_async(
        self, msg: Message, callback: SendCallback | None = None, **kwargs: Any
    ) -> concurrent.futures.Future[SendResult]:
        """Returns at once; the future completes with the SendResult. ``callback`` runs on the loop thread."""

        async def _start() -> asyncio.Task[SendResult]:
            return self.producer.send_async(msg, callback, **kwargs)

        task = self._loop.run(_start(), LIFECYCLE_TIMEOUT_S)
        future: concurrent.futures.Future[SendResult] = concurrent.futures.Future()

        def _copy(t: asyncio.Task[SendResult]) -> None:
            if t.cancelled():
                future.cancel()
            elif (exc := t.exception()) is not None:
                future.set_exception(exc)
            else:
                future.set_result(t.result())

        self._loop.loop.call_soon_threadsafe(task.add_done_callback, _copy)
        return future

    def send_oneway(self, msg: Message, **kwargs: Any) -> None:
        self._loop.call(lambda: self.producer.send_oneway(msg, **kwargs))

    def fetch_publish_queues(self, topic: str) -> list[MessageQueue]:
        return self._loop.run(self.producer.fetch_publish_queues(topic), self._timeout(None))


class SyncPushConsumer:
    def __init__(self, group: str, namesrv: str | Sequence[str] | None = None, **kwargs: Any):
        self._loop = _LoopThread(f"consumer-{group}")
        self.consumer: PushConsumer = _new(self._loop, lambda: PushConsumer(group, namesrv, **kwargs))

    def subscribe(self, topic: str, tags: Selector = "*") -> None:
        self._loop.call(lambda: self.consumer.subscribe(topic, tags))

    def register_listener(self, listener: Listener) -> None:
        self._loop.call(lambda: self.consumer.register_listener(listener))

    def start(self, *, fail_fast: bool = False) -> None:
        self._loop.run(self.consumer.start(fail_fast=fail_fast), LIFECYCLE_TIMEOUT_S)

    def shutdown(self) -> None:
        try:
            self._loop.run(self.consumer.shutdown(), LIFECYCLE_TIMEOUT_S + self.consumer.shutdown_timeout_s)
        finally:
            self._loop.close()

    def __enter__(self) -> SyncPushConsumer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def stats(self) -> ConsumerStats:
        return self._loop.call(self.consumer.stats)

    def assigned_queues(self) -> list[MessageQueue]:
        return self._loop.call(self.consumer.assigned_queues)


class SyncPullConsumer:
    def __init__(self, group: str, namesrv: str | Sequence[str] | None = None, **kwargs: Any):
        self._loop = _LoopThread(f"pull-consumer-{group}")
        self.consumer: PullConsumer = _new(self._loop, lambda: PullConsumer(group, namesrv, **kwargs))
        self._timeout_s = self.consumer.timeout_s + CALL_MARGIN_S

    def start(self) -> None:
        self._loop.run(self.consumer.start(), LIFECYCLE_TIMEOUT_S)

    def shutdown(self) -> None:
        try:
            self._loop.run(self.consumer.shutdown(), LIFECYCLE_TIMEOUT_S)
        finally:
            self._loop.close()

    def __enter__(self) -> SyncPullConsumer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        return self._loop.run(self.consumer.fetch_message_queues(topic), self._timeout_s)

    def pull(
        self, mq: MessageQueue, offset: int, max_count: int = 32, tags: Selector = "*", suspend_ms: int = 0
    ) -> PullResult:
        coro = self.consumer.pull(mq, offset, max_count, tags, suspend_ms)
        return self._loop.run(coro, self._timeout_s * 3 + suspend_ms / 1000)  # up to 3 replicas

    def fetch_consume_offset(self, mq: MessageQueue, *, from_store: bool = True) -> int | None:
        return self._loop.run(self.consumer.fetch_consume_offset(mq, from_store=from_store), self._timeout_s)

    def update_consume_offset(self, mq: MessageQueue, offset: int) -> None:
        self._loop.call(lambda: self.consumer.update_consume_offset(mq, offset))

    def commit(self) -> int:
        return self._loop.run(self.consumer.commit(), LIFECYCLE_TIMEOUT_S)

    def search_offset(self, mq: MessageQueue, ts_ms: int) -> int:
        return self._loop.run(self.consumer.search_offset(mq, ts_ms), self._timeout_s)

    def min_offset(self, mq: MessageQueue) -> int:
        return self._loop.run(self.consumer.min_offset(mq), self._timeout_s)

    def max_offset(self, mq: MessageQueue) -> int:
        return self._loop.run(self.consumer.max_offset(mq), self._timeout_s)
