"""Transactional messages (RocketMQ's ``TransactionMQProducer``): a half message, the local
transaction, then commit or rollback — and answers to the broker's check-backs.

    producer = TransactionProducer("txn-pg", "127.0.0.1:9876", listener)
    async with producer:
        result = await producer.send_message_in_transaction(Message("T", b"order 42"), arg=order)

``send_message_in_transaction``: (1) sends the message as a half (``/v1/transaction/half``: stored
and replicated, invisible to consumers; retried like any send, stored once), (2) runs
``listener.execute_local_transaction(msg, arg)`` (sync or async; an exception counts as UNKNOW),
(3) sends end-transaction with its state to the leader of the group that stored the half (a
failure there is logged: the broker checks the half back). It returns a ``TransactionSendResult``.

Check-backs: brokers cannot call clients, so a started TransactionProducer keeps one long poll open
to the leader of every broker group that serves a topic it sent to (or named in ``check_topics``)
(``/v1/transaction/checks``, each held ≤ ``check_wait_ms``); every request handed out is answered
by ``listener.check_local_transaction(msg_ext)`` and an end-transaction marked ``from_check``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from broker.client.message import Message, MessageExt, SendResult, message_ext_from_dict
from broker.client.producer import Producer
from broker.client.route_cache import call_leader
from broker.client.transport import ClientError

log = logging.getLogger(__name__)

CHECK_WAIT_MS = 5000
CHECK_BATCH = 32
CHECK_ERROR_PAUSE_S = 1.0
WATCH_PERIOD_S = 1.0
TOPICS_PER_POLL_MAX = 64  # the broker's bound on one poll


class LocalTransactionState(enum.StrEnum):
    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"  # RocketMQ's spelling


class TransactionListener(Protocol):
    """Either method may be a coroutine function."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> Any: ...

    def check_local_transaction(self, msg: MessageExt) -> Any: ...


@dataclasses.dataclass(frozen=True)
class TransactionSendResult:
    """The half's SendResult, the local transaction's state, and what the broker answered the end."""

    send_result: SendResult
    local_transaction_state: LocalTransactionState
    transaction_id: str
    end_answer: dict[str, Any] | None  # None: end-transaction failed (the broker checks back)

    @property
    def msg_id(self) -> str:
        return self.send_result.msg_id


async def _call_listener(fn: Any, *args: Any) -> LocalTransactionState:
    try:
        state = fn(*args)
        if inspect.isawaitable(state):
            state = await state
        return LocalTransactionState(state)
    except Exception as exc:  # RocketMQ: an exception leaves the transaction unknown (checked back)
        log.warning("transaction listener %s raised %r: UNKNOW", getattr(fn, "__name__", fn), exc)
        return LocalTransactionState.UNKNOW


class TransactionProducer(Producer):
    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] | None,
        listener: TransactionListener,
        *,
        check_topics: Sequence[str] = (),
        check_wait_ms: int = CHECK_WAIT_MS,
        **kwargs: Any,
    ):
        super().__init__(group, namesrv, **kwargs)
        self.listener = listener
        self.check_topics = tuple(check_topics)
        self.check_wait_ms = check_wait_ms
        self._pollers: dict[str, asyncio.Task[None]] = {}
        self._watcher: asyncio.Task[None] | None = None
        self.checks_answered = 0

    async def start(self) -> None:
        await super().start()
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch_brokers())

    async def shutdown(self) -> None:
        tasks = [t for t in (self._watcher, *self._pollers.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watcher = None
        self._pollers.clear()
        await super().shutdown()

    async def __aenter__(self) -> TransactionProducer:
        await self.start()
        return self

    # -- sending -------------------------------------------------------------------------------------------
    async def send_message_in_transaction(
        self, msg: Message, arg: Any = None, *, timeout_s: float | None = None
    ) -> TransactionSendResult:
        self._check_running()
        if msg.delay_time_level or msg.deliver_time_ms is not None:
            raise ClientError("TRANSACTION_DELAY_UNSUPPORTED", "a transactional message cannot be delayed")
        topic = self._prepare([msg])
        half = await self._send(
            [msg], topic, None, None, None, timeout_s, self.retry_times, target="/v1/transaction/half"
        )
        state = await _call_listener(self.listener.execute_local_transaction, msg, arg)
        end = await self._end(topic, half.message_queue.broker_name, half.msg_id, half.unique_id, state, False)
        return TransactionSendResult(half, state, half.unique_id, end)

    async def _end(
        self, topic: str, broker_name: str, msg_id: str, transaction_id: str, state: LocalTransactionState,
        from_check: bool,
    ) -> dict[str, Any] | None:
        body = {"producer_group": self.group, "topic": topic, "msg_id": msg_id, "transaction_id": transaction_id,
                "state": str(state), "from_check": from_check}
        try:
            answer = await call_leader(
                self._transport_checked(), self.routes, topic, broker_name, "/v1/transaction/end", body,
                timeout_s=self.send_timeout_s,
            )
        except ClientError as exc:
            log.warning("end-transaction %s of %s (%s) failed: %s; the broker will check it back",
                        state, msg_id, topic, exc)
            return None
        return dict(answer) if isinstance(answer, dict) else {}

    # -- check-backs -----------------------------------------------------------------------------------------
    def _brokers(self) -> dict[str, list[str]]:
        """broker name -> the topics (known routes) it serves: where check-backs may come from."""
        out: dict[str, list[str]] = {}
        for topic in {*self.routes.topics(), *self.check_topics}:
            route = self.routes.cached(topic)
            if route is None:
                continue
            for bd in route.broker_datas:  # every group of the route, writable or not (halves may wait there)
                topics = out.setdefault(bd.broker_name, [])
                if topic not in topics and len(topics) < TOPICS_PER_POLL_MAX:
                    topics.append(topic)
        return out

    async def _watch_brokers(self) -> None:
        for topic in self.check_topics:
            try:
                await self.routes.get(topic, self.send_timeout_s)
            except ClientError as exc:
                log.warning("no route for check topic %s yet: %s", topic, exc)
        loop = asyncio.get_running_loop()
        while True:
            for name in self._brokers():
                task = self._pollers.get(name)
                if task is None or task.done():
                    self._pollers[name] = loop.create_task(self._poll(name), name=f"txn-checks-{name}")
            await asyncio.sleep(WATCH_PERIOD_S)

    async def _poll(self, broker_name: str) -> None:
        while True:
            topics = self._brokers().get(broker_name)
            if not topics:
                return
            body = {"producer_group": self.group, "topics": topics, "max_count": CHECK_BATCH,
                    "wait_ms": self.check_wait_ms}
            try:
                answer = await call_leader(
                    self._transport_checked(), self.routes, topics[0], broker_name, "/v1/transaction/checks", body,
                    timeout_s=self.check_wait_ms / 1000 + self.send_timeout_s,
                )
                checks = list(answer.get("checks") or ()) if isinstance(answer, dict) else []
            except ClientError as exc:
                log.debug("check-back poll of %s failed: %s", broker_name, exc)
                await asyncio.sleep(CHECK_ERROR_PAUSE_S)
                continue
            for view in checks:
                await self._answer_check(view)

    async def _answer_check(self, view: dict[str, Any]) -> None:
        try:
            ext = message_ext_from_dict(view)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("unreadable check-back request skipped: %r", exc)
            return
        state = await _call_listener(self.listener.check_local_transaction, ext)
        await self._end(ext.topic, ext.broker_name, ext.msg_id, ext.unique_id, state, True)
        self.checks_answered += 1
