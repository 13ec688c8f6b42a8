"""The workload of a chaos run: producers and consumers driving the cluster through the SDK, every
send and every receipt written to the history; a zombie offset client; then the final drain.

Producers (``p0``, ``p1``, ...) each own a ``Producer`` and send one message at a time (sync
sends, the SDK's retries inside), paced to ``rate`` sends/s. Every message gets its unique id
before the first attempt (so failed sends are in the history too), the properties ``producer`` and
``seq``, and — for the keyed producers (the last ``keyed`` ones) — a sharding key as its first key,
sent with ``HashKeySelector`` (one key, one queue, in order); ``seq`` then counts per key. The
send line carries the CRC-32 of the body, so a receipt of damaged bytes is recognised.

Outcome of a send: ``ok`` (acknowledged), ``unknown`` when the SDK says ``outcome_unknown`` (an
attempt may have stored it), otherwise ``fail`` (the SDK says it cannot be stored).

Consumers (``c0``, ...) are *orderly* push consumers of one clustering group, consuming from the
first offset: each queue's messages reach the listener one at a time, in offset order, for as long
as the queue stays assigned. Each (re)assignment of a queue to a consumer (a rebalance, a restart of
the consumer) starts a new *session* (the SDK hands a new ``ConsumeContext`` object to the
listener); receipts carry their session, so the audit can demand gap-free, increasing offsets
within one session. Consumers can be stopped and started again (``leave``/``rejoin``) and extra
ones can join and part (``join``/``part``): the faults ``consumer-restart`` and ``consumer-join``.

The zombie (``z0``, every ``zombie_interval_s``) reads the group's committed offsets with a
``PullConsumer`` and, once a value it read is ``ZOMBIE_STALE_S`` old and lower than what it reads
now, commits that old value again (a consumer that lost its queues in a rebalance and still
commits). A broker must ignore it: stored offsets only move forward. Its fetches and commits go to
``offsets-z0.jsonl``.

Delays and retries (issue 14, both off by default). With ``delayed_share`` F, a deterministic share F
of the unkeyed producers' sends (by a hash of the unique id: ``delay_choice``) carries delay level 1-3
or a deliver time 1-10 s ahead; the send line records the level or time and, once acknowledged, the
due time (store time + the level's delay, or the deliver time). Keyed sends are never delayed (a delay
would reorder a key). With ``fail_share`` F a second, *concurrent* clustering group (``chaos_retry``,
consumers ``r0``..., ``max_reconsume_times`` 2) consumes the same topic and answers RECONSUME_LATER
for a deterministic share F of the unique ids (``fail_plan``): half of them fail only their first
delivery (consumed from ``%RETRY%chaos_retry``), half fail every delivery (in ``%DLQ%chaos_retry``
after 1 + max_reconsume_times deliveries). Its receipts go to ``retries-<consumer>.jsonl`` with
``reconsume_times``, ``retry`` and ``answer``; ``drain_dlq`` reads the DLQ at the end (by offset: a
DLQ is write only) into ``dlq.jsonl``. (Orderly consumers retry in place, without a retry topic:
that is why the failing group is a separate concurrent one.)

Transactions (issue 15, off by default). With ``txn_share`` F, a deterministic share F of the unkeyed
producers' sends (by a hash of the unique id: ``txn_plan``) goes through ``send_message_in_transaction``
with one of four plans, a quarter each: ``commit`` / ``rollback`` (the local transaction answers at
once), ``check_commit`` / ``check_rollback`` (it answers UNKNOW; the broker's check-back gets the
final answer from ``check_local_transaction``, which reads the plan from the unique id, as any
producer of the group could). The send line records the plan in ``txn``; its outcome is the half's
(``ok``: the half was acknowledged). A committed plan counts as acknowledged (it must be delivered,
after its check-back for ``check_commit``); a rolled-back one must never be delivered. Its
``queue_offset`` is the committed message's when the end-transaction answer named it (``commit``),
else null (the acknowledged offset of a half is the half queue's).

``drain`` reads every queue of every group's leader from its min to its max offset, directly (not
through a proxy).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import os
import random
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Literal
from urllib.parse import quote

from broker.client import (
    CONSUME_SUCCESS,
    RECONSUME_LATER,
    ClientError,
    ConsumeContext,
    HashKeySelector,
    LocalTransactionState,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PullConsumer,
    PushConsumer,
    TransactionProducer,
    UniqueIdGenerator,
)
from broker.client.transport import FROM_ENV, NamesrvClient, Transport
from broker.protocol.frames import Op
from broker.protocol.properties import dlq_topic
from broker.store.schedule import DEFAULT_DELAY_LEVELS, parse_delay_levels
from chaos.history import JsonlWriter, OffsetRecord, Outcome, SendRecord, now_us, receipt_from_message
from chaos.target import Member, Target, find_leader, groups_of, wait_for

log = logging.getLogger(__name__)

CONSUMER_GROUP = "chaos_consumer"
RETRY_GROUP = "chaos_retry"  # the concurrent group that fails a share of deliveries (fail_share)
DELAY_LEVELS_MS = parse_delay_levels(DEFAULT_DELAY_LEVELS)  # the chaos cluster's brokers run the default levels
DELAY_MAX_LEVEL = 3  # levels 1-3: 1 s, 5 s, 10 s
DELIVER_MAX_S = 10  # deliver times 1-10 s ahead
PULL_BATCH = 1024
ZOMBIE_STALE_S = 5.0  # the zombie commits values at least this old
# Consumers commit their offsets every 5 s (RocketMQ's persistConsumerOffsetInterval): a stored offset
# that a broker wrongly let move back stays back until the next commit, long enough for the sampler.
COMMIT_INTERVAL_S = 5.0


@dataclasses.dataclass(frozen=True)
class WorkloadConfig:
    topic: str = "ChaosTopic"
    queues: int = 8
    producers: int = 4
    keyed: int = 2  # how many producers send keyed messages
    keys_per_producer: int = 8
    consumers: int = 2
    rate: float = 50.0  # sends/s per producer (0: as fast as acknowledged)
    body_bytes: int = 128
    send_timeout_s: float = 3.0
    zombie_interval_s: float = 3.0  # 0: no zombie offset client
    delayed_share: float = 0.0  # share of the unkeyed sends that are delayed (delay level or deliver time)
    fail_share: float = 0.0  # share of unique ids the retry group fails (0: no retry group)
    retry_consumers: int = 1
    max_reconsume_times: int = 2  # the retry group's, so a short run reaches the DLQ
    txn_share: float = 0.0  # share of the unkeyed sends sent in transactions (txn_plan)


def _share(uid: str, salt: str) -> float:
    """A deterministic number in [0, 1) for a unique id (CRC-32 of the id and a salt)."""
    return zlib.crc32(f"{uid}|{salt}".encode()) / 2**32


def delay_choice(uid: str, share: float) -> tuple[int, int] | None:
    """(delay level, 0) or (0, deliver seconds ahead) for a delayed send, None for an undelayed one."""
    if share <= 0 or _share(uid, "delay") >= share:
        return None
    k = zlib.crc32(f"{uid}|kind".encode())
    if k % 2 == 0:
        return 1 + (k >> 1) % DELAY_MAX_LEVEL, 0
    return 0, 1 + (k >> 1) % DELIVER_MAX_S


def fail_plan(uid: str, share: float) -> Literal["none", "once", "always"]:
    """How the retry group treats a unique id: consumed at once, failed once then consumed, or failed
    every time (to the DLQ)."""
    h = _share(uid, "fail")
    if h >= share:
        return "none"
    return "always" if h < share / 2 else "once"


TxnPlan = Literal["commit", "rollback", "check_commit", "check_rollback"]
TXN_PLANS: tuple[TxnPlan, ...] = ("commit", "rollback", "check_commit", "check_rollback")
TXN_COMMITTED = ("commit", "check_commit")


def txn_plan(uid: str, share: float) -> TxnPlan | None:
    """The transaction plan of a unique id (None: a plain send), a quarter of each kind."""
    if share <= 0 or _share(uid, "txn") >= share:
        return None
    return TXN_PLANS[zlib.crc32(f"{uid}|txnkind".encode()) % len(TXN_PLANS)]


class TxnListener:
    """The producers' transaction listener: the plan decides, at once or when checked back."""

    def __init__(self, share: float, counters: Counters):
        self.share, self.counters = share, counters

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        if arg == "commit":
            return LocalTransactionState.COMMIT_MESSAGE
        if arg == "rollback":
            return LocalTransactionState.ROLLBACK_MESSAGE
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        plan = txn_plan(msg.unique_id, self.share)
        self.counters.txn_checks += 1
        if plan is None:  # not one of ours: leave it to its producer
            return LocalTransactionState.UNKNOW
        self.counters.txn_checked.add(msg.unique_id)
        return LocalTransactionState.COMMIT_MESSAGE if plan in TXN_COMMITTED else LocalTransactionState.ROLLBACK_MESSAGE


def fails(uid: str, reconsume_times: int, share: float) -> bool:
    plan = fail_plan(uid, share)
    return plan == "always" or (plan == "once" and reconsume_times == 0)


@dataclasses.dataclass
class Counters:
    """Shared by the workload's tasks (one event loop): read by the progress line."""

    sends: int = 0
    ok: int = 0
    fail: int = 0
    unknown: int = 0
    receipts: int = 0
    errors: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    acked: set[str] = dataclasses.field(default_factory=set)
    received: set[str] = dataclasses.field(default_factory=set)
    acked_store_ms: dict[str, int] = dataclasses.field(default_factory=dict)  # unique id -> store time
    acked_at: dict[str, float] = dataclasses.field(default_factory=dict)  # unique id -> monotonic ack time
    delayed: int = 0  # acknowledged delayed sends
    retry_received: set[str] = dataclasses.field(default_factory=set)  # unique ids the retry group saw
    retry_pending: set[str] = dataclasses.field(default_factory=set)  # failed, neither consumed nor DLQ'd yet
    retry_failed: int = 0
    retry_to_dlq: int = 0
    txn_sent: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)  # by plan, ok
    txn_checks: int = 0  # check-backs answered
    txn_checked: set[str] = dataclasses.field(default_factory=set)  # unique ids answered on a check-back
    # broker group -> log position of the newest acknowledged message it stored, and who is told of
    # each acknowledgement (a gated crash: chaos.faults.wait_for_unsynced_ack)
    newest_acked: dict[str, int] = dataclasses.field(default_factory=dict)
    ack_listeners: list[Callable[[], None]] = dataclasses.field(default_factory=list)

    def note_acked_at(self, msg_id: str | None) -> None:
        if not msg_id:
            return
        group, _, hex_position = msg_id.rpartition(":")
        with contextlib.suppress(ValueError):
            position = int(hex_position, 16)
            if position > self.newest_acked.get(group, -1):
                self.newest_acked[group] = position
        for listener in self.ack_listeners:
            listener()

    def retries_settled(self) -> bool:
        """The retry group saw every acknowledged id and every failed one was consumed or sent to the DLQ."""
        return not self.retry_pending and self.acked <= self.retry_received

    def snapshot(self) -> dict[str, Any]:
        return {"sends": self.sends, "ok": self.ok, "fail": self.fail, "unknown": self.unknown,
                "receipts": self.receipts, "errors": dict(self.errors), "delayed_acked": self.delayed,
                "retry_failed": self.retry_failed, "retry_to_dlq": self.retry_to_dlq,
                "txn_acked": dict(self.txn_sent), "txn_checks": self.txn_checks}


def body_for(producer: str, key: str | None, seq: int, size: int) -> bytes:
    head = f"{producer}|{key or '-'}|{seq}|".encode()
    return head + b"x" * max(0, size - len(head))


class ProducerWorker:
    def __init__(self, name: str, namesrv: str, cfg: WorkloadConfig, keyed: bool, out: JsonlWriter,
                 counters: Counters, rng: random.Random):
        self.name, self.cfg, self.keyed, self.out, self.counters, self.rng = name, cfg, keyed, out, counters, rng
        if cfg.txn_share > 0:  # a TransactionProducer sends plain messages too
            self.producer: Producer = TransactionProducer(
                f"chaos_{name}", namesrv, TxnListener(cfg.txn_share, counters), check_topics=[cfg.topic],
                send_timeout_s=cfg.send_timeout_s, check_wait_ms=2000,
            )
        else:
            self.producer = Producer(f"chaos_{name}", namesrv, send_timeout_s=cfg.send_timeout_s)
        self.ids = UniqueIdGenerator()
        self.seq_by_key: dict[str | None, int] = collections.defaultdict(int)
        self.selector = HashKeySelector()

    async def run(self, stop: asyncio.Event) -> None:
        await self.producer.start()
        try:
            next_at = time.monotonic()
            while not stop.is_set():
                await self.send_one()
                if self.cfg.rate > 0:
                    next_at = max(next_at + 1 / self.cfg.rate, time.monotonic() - 1.0)  # no bursts after a stall
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        try:
                            async with asyncio.timeout(delay):  # (not wait_for: see consumer._wait_event)
                                await stop.wait()
                        except TimeoutError:
                            pass
        finally:
            if not isinstance(self.producer, TransactionProducer):
                await self.producer.shutdown()

    async def close(self) -> None:
        """A transactional producer stays up after its last send until the consumers settled: brokers
        check unknown transactions back through its long polls (no producer online, no check-back)."""
        await self.producer.shutdown()

    async def send_one(self) -> None:
        key = f"{self.name}-k{self.rng.randrange(self.cfg.keys_per_producer)}" if self.keyed else None
        seq = self.seq_by_key[key]
        self.seq_by_key[key] = seq + 1
        uid = self.ids.next()
        body = body_for(self.name, key, seq, self.cfg.body_bytes)
        crc = zlib.crc32(body)
        plan = None if key is not None else txn_plan(uid, self.cfg.txn_share)
        delay = None if key is not None or plan is not None else delay_choice(uid, self.cfg.delayed_share)
        level, ahead_s = delay or (0, 0)
        deliver_ms = now_us() // 1000 + ahead_s * 1000 if ahead_s else None
        msg = Message(self.cfg.topic, body, keys=(key,) if key else (),
                      properties={"producer": self.name, "seq": str(seq)}, unique_id=uid,
                      delay_time_level=level, deliver_time_ms=deliver_ms)
        extra: dict[str, Any] = {"delay_level": level or None, "deliver_ms": deliver_ms, "txn": plan}
        c = self.counters
        c.sends += 1
        invoke = now_us()
        committed: dict[str, Any] | None = None
        try:
            if key is not None:
                r = await self.producer.send(msg, selector=self.selector)
            elif plan is not None:
                assert isinstance(self.producer, TransactionProducer)
                t = await self.producer.send_message_in_transaction(msg, plan)
                r, committed = t.send_result, t.end_answer
            else:
                r = await self.producer.send(msg)
        except ClientError as exc:
            log.info("send %s of %s (key %s, seq %d): %s", uid, self.name, key, seq, exc)
            outcome: Outcome = "unknown" if exc.outcome_unknown else "fail"
            rec = SendRecord(self.name, uid, key, seq, self.cfg.topic, invoke, now_us(), outcome, exc.code,
                             body_crc=crc, **extra)
            c.errors[exc.code] += 1
        except Exception as exc:  # anything else: we cannot say whether it was stored
            log.warning("send %s of %s: unexpected %r", uid, self.name, exc)
            rec = SendRecord(self.name, uid, key, seq, self.cfg.topic, invoke, now_us(), "unknown",
                             type(exc).__name__, body_crc=crc, **extra)
            c.errors[type(exc).__name__] += 1
        else:
            where: tuple[int | None, int | None, str | None]
            if plan is None:
                where = (r.message_queue.queue_id, r.queue_offset, r.msg_id)
            elif committed is not None and committed.get("state") == "COMMIT_MESSAGE" and not committed.get(
                    "duplicate"):
                where = (committed.get("queue_id"), committed.get("queue_offset"), committed.get("msg_id"))
            else:  # the half's place is not the message's: the committed copy is found by unique id
                where = (None, None, None)
            rec = SendRecord(self.name, uid, key, seq, self.cfg.topic, invoke, now_us(), "ok", None,
                             r.message_queue.broker_name, *where,
                             r.store_ts * 1000, crc, **extra, due_us=due_us(r.store_ts, level, deliver_ms))
            if delay:
                c.delayed += 1
            if plan is not None:
                c.txn_sent[plan] += 1
            if plan is None or plan in TXN_COMMITTED:  # a rolled-back one must never arrive
                c.note_acked_at(where[2])
                c.acked.add(uid)
                c.acked_store_ms[uid] = r.store_ts
                c.acked_at[uid] = time.monotonic()
        if rec.outcome == "ok":
            c.ok += 1
        elif rec.outcome == "fail":
            c.fail += 1
        else:
            c.unknown += 1
        self.out.write(rec)


def due_us(store_ms: int, level: int, deliver_ms: int | None) -> int | None:
    """When a delayed send stored at ``store_ms`` is due (µs), by the broker's rules (API.md)."""
    if deliver_ms is not None:
        return max(deliver_ms, store_ms) * 1000
    if level > 0:
        return (store_ms + DELAY_LEVELS_MS[min(level, len(DELAY_LEVELS_MS)) - 1]) * 1000
    return None


class RetryConsumerWorker:
    """A concurrent consumer of the retry group: fails the ids ``fail_plan`` picks (RECONSUME_LATER)."""

    def __init__(self, name: str, namesrv: str, cfg: WorkloadConfig, out: JsonlWriter, counters: Counters):
        self.name, self.cfg, self.out, self.counters = name, cfg, out, counters
        self.consumer: PushConsumer | None = PushConsumer(
            RETRY_GROUP, namesrv, consume_from="FIRST", client_id=f"chaos-{name}-{os.getpid()}",
            commit_interval_s=COMMIT_INTERVAL_S, rebalance_interval_s=5.0, heartbeat_interval_s=2.0,
            route_refresh_interval_s=5.0, max_reconsume_times=cfg.max_reconsume_times,
            redeliver_backoff_s=(1.0, 2.0, 5.0),
        )
        self.consumer.subscribe(cfg.topic, "*")
        self.consumer.register_listener(self._on_messages)

    async def start(self) -> None:
        assert self.consumer is not None
        await self.consumer.start()

    async def stop(self, timeout_s: float = 30.0) -> None:
        consumer, self.consumer = self.consumer, None
        if consumer is None:
            return
        try:
            await asyncio.wait_for(consumer.shutdown(), timeout_s)
        except Exception:
            log.warning("retry consumer %s did not shut down cleanly", self.name, exc_info=True)

    async def _on_messages(self, msgs: list[MessageExt], ctx: Any) -> Any:
        t = now_us()
        c = self.counters
        failed = any(fails(m.unique_id, m.reconsume_times, self.cfg.fail_share) for m in msgs)
        for m in msgs:
            self.out.write(receipt_from_message(m, self.name, t, "receipt", retry_fields=True,
                                                answer="later" if failed else "success"))
            c.retry_received.add(m.unique_id)
            if not failed:
                c.retry_pending.discard(m.unique_id)
            elif m.reconsume_times >= self.cfg.max_reconsume_times:
                c.retry_pending.discard(m.unique_id)  # this answer sends it to the DLQ
                c.retry_to_dlq += 1
            else:
                c.retry_pending.add(m.unique_id)
                c.retry_failed += 1
        return RECONSUME_LATER if failed else CONSUME_SUCCESS


class ConsumerWorker:
    """One named consumer (``c0``...): an orderly PushConsumer that can be stopped and started again
    (a new instance, a new client id); its receipts go to one file, with their session."""

    def __init__(self, name: str, namesrv: str, cfg: WorkloadConfig, out: JsonlWriter, counters: Counters):
        self.name, self.namesrv, self.cfg, self.out, self.counters = name, namesrv, cfg, out, counters
        self.consumer: PushConsumer | None = None
        self.incarnation = 0
        self._contexts: dict[MessageQueue, ConsumeContext] = {}
        self._sessions: dict[MessageQueue, int] = {}
        self._next_session = itertools.count(1)

    @property
    def running(self) -> bool:
        return self.consumer is not None

    async def start(self) -> None:
        if self.consumer is not None:
            return
        self.incarnation += 1
        consumer = PushConsumer(
            CONSUMER_GROUP, self.namesrv, consume_from="FIRST", orderly=True,
            client_id=f"chaos-{self.name}-{os.getpid()}-{self.incarnation}",
            commit_interval_s=COMMIT_INTERVAL_S, rebalance_interval_s=5.0, heartbeat_interval_s=2.0, suspend_ms=2000,
            route_refresh_interval_s=5.0,
        )
        consumer.subscribe(self.cfg.topic, "*")
        consumer.register_listener(self._on_messages)
        self.consumer = consumer
        await consumer.start()

    async def stop(self, timeout_s: float = 30.0) -> None:
        consumer, self.consumer = self.consumer, None
        if consumer is None:
            return
        try:
            await asyncio.wait_for(consumer.shutdown(), timeout_s)
        except Exception:  # after faults: never block the run
            log.warning("consumer %s did not shut down cleanly", self.name, exc_info=True)

    def _session(self, ctx: ConsumeContext) -> int:
        """The SDK gives every assignment of a queue its own context object: a new one is a new session."""
        mq = ctx.message_queue
        if self._contexts.get(mq) is not ctx:
            self._contexts[mq] = ctx
            self._sessions[mq] = next(self._next_session)
        return self._sessions[mq]

    async def _on_messages(self, msgs: list[MessageExt], ctx: Any) -> Any:
        t = now_us()
        session = self._session(ctx)
        for m in msgs:
            self.out.write(receipt_from_message(m, self.name, t, "receipt", session))
            self.counters.receipts += 1
            self.counters.received.add(m.unique_id)
        return CONSUME_SUCCESS


class OffsetZombie:
    """Reads the consumer group's committed offsets and commits old values again (module doc)."""

    def __init__(self, name: str, namesrv: str, cfg: WorkloadConfig, out: JsonlWriter, rng: random.Random):
        self.name, self.cfg, self.out, self.rng = name, cfg, out, rng
        self.client = PullConsumer(CONSUMER_GROUP, namesrv, timeout_s=2.0)
        self.seen: collections.deque[tuple[float, MessageQueue, int]] = collections.deque(maxlen=10_000)
        self.latest: dict[MessageQueue, int] = {}

    async def run(self, stop: asyncio.Event) -> None:
        await self.client.start()
        try:
            while not stop.is_set():
                try:
                    await self.round()
                except ClientError as exc:
                    log.info("zombie round: %s", exc)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.cfg.zombie_interval_s):
                        await stop.wait()
        finally:
            with contextlib.suppress(Exception):
                await self.client.shutdown()

    async def round(self) -> None:
        mqs = await self.client.fetch_message_queues(self.cfg.topic)
        by_broker: dict[str, list[MessageQueue]] = collections.defaultdict(list)
        for mq in mqs:
            by_broker[mq.broker_name].append(mq)
        for broker, queues in sorted(by_broker.items()):
            invoke, got, error = now_us(), {}, None
            for mq in queues:
                try:
                    off = await self.client.fetch_consume_offset(mq)
                except ClientError as exc:
                    error = exc.code
                    break
                if off is not None:
                    got[str(mq.queue_id)] = off
                    self.latest[mq] = off
                    self.seen.append((time.monotonic(), mq, off))
            self.out.write(OffsetRecord(self.name, "fetch", invoke, now_us(), CONSUMER_GROUP, self.cfg.topic, broker,
                                        got, "ok" if error is None else "fail", error))
        await self.commit_stale()

    async def commit_stale(self) -> None:
        old = time.monotonic() - ZOMBIE_STALE_S
        candidates = [(mq, off) for t, mq, off in self.seen if t <= old and off < self.latest.get(mq, off)]
        if not candidates:
            return
        mq, off = self.rng.choice(candidates)
        self.client.update_consume_offset(mq, off)
        invoke, error = now_us(), None
        outcome: Outcome = "ok"
        try:
            await self.client.commit()
        except ClientError as exc:
            error, outcome = exc.code, ("unknown" if exc.outcome_unknown else "fail")
        self.out.write(OffsetRecord(self.name, "commit", invoke, now_us(), CONSUMER_GROUP, self.cfg.topic,
                                    mq.broker_name, {str(mq.queue_id): off}, outcome, error, stale=True))


class Workload:
    """Producers, consumers and the zombie of one run, with their history files under ``history_dir``."""

    def __init__(self, history_dir: str, namesrv: str, cfg: WorkloadConfig, rng: random.Random):
        self.cfg = cfg
        self.history_dir = history_dir
        self.namesrv = namesrv
        self.counters = Counters()
        self.writers: list[JsonlWriter] = []
        self.producers = []
        for i in range(cfg.producers):
            name = f"p{i}"
            w = self._writer(f"sends-{name}.jsonl")
            keyed = i >= cfg.producers - cfg.keyed
            self.producers.append(ProducerWorker(name, namesrv, cfg, keyed, w, self.counters,
                                                 random.Random(rng.randrange(1 << 30))))
        self.consumers: dict[str, ConsumerWorker] = {}
        for i in range(cfg.consumers):
            self._consumer(f"c{i}")
        self.extra_consumers: list[str] = []  # joined by a fault, parting at its heal
        self.retry_consumers = [
            RetryConsumerWorker(f"r{i}", namesrv, cfg, self._writer(f"retries-r{i}.jsonl"), self.counters)
            for i in range(cfg.retry_consumers if cfg.fail_share > 0 else 0)
        ]
        self.zombie: OffsetZombie | None = None
        if cfg.zombie_interval_s > 0:
            self.zombie = OffsetZombie("z0", namesrv, cfg, self._writer("offsets-z0.jsonl"),
                                       random.Random(rng.randrange(1 << 30)))
        self._stop_producing = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def _writer(self, name: str) -> JsonlWriter:
        w = JsonlWriter(os.path.join(self.history_dir, name))
        self.writers.append(w)
        return w

    def _consumer(self, name: str) -> ConsumerWorker:
        c = ConsumerWorker(name, self.namesrv, self.cfg, self._writer(f"receipts-{name}.jsonl"), self.counters)
        self.consumers[name] = c
        return c

    async def start(self) -> None:
        for c in self.consumers.values():
            await c.start()
        for r in self.retry_consumers:
            await r.start()
        self._tasks = [asyncio.create_task(p.run(self._stop_producing), name=f"chaos-{p.name}")
                       for p in self.producers]
        if self.zombie is not None:
            self._tasks.append(asyncio.create_task(self.zombie.run(self._stop_producing), name="chaos-z0"))

    # -- consumer churn (the consumer-* faults) ---------------------------------------------------
    async def leave(self, rng: random.Random) -> str | None:
        """Stop one running consumer (its queues move to the others); None when only one runs."""
        running = sorted(n for n, c in self.consumers.items() if c.running)
        if len(running) <= 1:
            return None
        name = rng.choice(running)
        await self.consumers[name].stop()
        return name

    async def rejoin(self, name: str) -> None:
        await self.consumers[name].start()

    async def join(self) -> str:
        """Start one more consumer (a new name): a rebalance takes queues from the others."""
        name = f"c{len(self.consumers)}"
        await self._consumer(name).start()
        self.extra_consumers.append(name)
        return name

    async def part(self, name: str) -> None:
        await self.consumers[name].stop()

    def newest_acked_position(self, group: str) -> int | None:
        return self.counters.newest_acked.get(group)

    def on_ack(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (on this loop, synchronously) at every acknowledgement; returns the
        function that stops it."""
        self.counters.ack_listeners.append(callback)
        return lambda: self.counters.ack_listeners.remove(callback)

    async def stop_producers(self) -> None:
        self._stop_producing.set()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def stop_consumers(self) -> None:
        """After the settle: the consumers, and the transactional producers' check-back polls."""
        for p in self.producers:
            await p.close()
        for c in reversed(list(self.consumers.values())):
            await c.stop()
        for r in self.retry_consumers:
            await r.stop()

    def flush(self) -> None:
        for w in self.writers:
            w.flush()

    async def close(self) -> None:
        await self.stop_producers()
        await self.stop_consumers()
        for w in self.writers:
            w.close()


async def writable_leader(target: Target, members: list[Member], timeout_s: float) -> Member:
    async def leader() -> str | None:
        return await find_leader(target, members, writable=True)

    name = await wait_for(leader, timeout_s, f"a writable leader of {members[0].group}", 0.05)
    return next(m for m in members if m.name == name)


async def create_topic(target: Target, topic: str, queues: int, timeout_s: float = 30.0) -> None:
    """Create the topic on every group's leader (directly), then wait until the NameServer routes it."""
    t = Transport(timeout_s=3.0, credentials=getattr(target, "credentials", FROM_ENV))  # an admin's, if ACL is on
    try:
        for _group, members in sorted(groups_of(target.members()).items()):
            m = await writable_leader(target, members, timeout_s)
            await t.call(m.control_addr, "POST", "/v1/topics",
                         {"topic": topic, "read_queue_nums": queues, "write_queue_nums": queues})
        ns = NamesrvClient(target.namesrv_addr, t)
        groups = set(groups_of(target.members()))

        async def routed() -> bool:
            try:
                route = await ns.route(topic, timeout_s=2.0)
            except ClientError:
                return False
            return {q.broker_name for q in route.queue_datas} >= groups and all(
                b.leader_addr is not None for b in route.broker_datas)

        await wait_for(routed, timeout_s, f"a route of {topic} at the NameServer", 0.1)
    finally:
        await t.close()


@dataclasses.dataclass
class DrainResult:
    messages: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)  # queues that could not be read to the end


async def drain(target: Target, topic: str, queues: int, out: JsonlWriter, timeout_s: float = 60.0) -> DrainResult:
    """Read every queue of every group's leader from min to max offset into ``out``. A queue that
    cannot be read to its end is reported (and read as far as it went), never skipped silently."""
    t = Transport(timeout_s=5.0, credentials=getattr(target, "credentials", FROM_ENV))
    result = DrainResult()
    try:
        for group, members in sorted(groups_of(target.members()).items()):
            try:
                leader = await writable_leader(target, members, timeout_s)
            except TimeoutError as exc:
                result.errors.append(f"{group}: {exc}")
                continue
            for qid in range(queues):
                try:
                    result.messages += await _drain_queue(t, leader.control_addr, topic, qid, out)
                except (ClientError, RuntimeError) as exc:
                    result.errors.append(f"{group} {topic}:{qid}: {exc}")
    finally:
        await t.close()
        out.flush()
    return result


async def _drain_queue(t: Transport, addr: str, topic: str, qid: int, out: JsonlWriter) -> int:
    n = 0
    async for batch in read_queue(t, addr, topic, qid):
        t_us = now_us()
        for m in batch:
            out.write(receipt_from_message(m, "drain", t_us, "drain"))
            n += 1
    return n


async def drain_dlq(target: Target, group: str, out: JsonlWriter, timeout_s: float = 60.0) -> DrainResult:
    """Read ``%DLQ%<group>`` of every broker group's leader, by offset (``GET /v1/msg/offset``: a DLQ is
    write only, pulls are refused), into ``out`` (type "dlq"). A group without the topic has none."""
    topic = dlq_topic(group)
    t = Transport(timeout_s=5.0, credentials=getattr(target, "credentials", FROM_ENV))
    result = DrainResult()
    try:
        for bgroup, members in sorted(groups_of(target.members()).items()):
            try:
                leader = await writable_leader(target, members, timeout_s)
                status = await t.call(leader.control_addr, "GET", f"/v1/topics/{quote(topic, safe='')}/status")
            except ClientError as exc:
                if exc.code != "TOPIC_NOT_EXIST":
                    result.errors.append(f"{bgroup} {topic}: {exc}")
                continue
            except TimeoutError as exc:
                result.errors.append(f"{bgroup}: {exc}")
                continue
            for q in status["queues"]:
                for offset in range(int(q["min_offset"]), int(q["max_offset"])):
                    params = {"topic": topic, "queue_id": q["queue_id"], "offset": offset}
                    try:
                        m = await t.call(leader.control_addr, "GET", "/v1/msg/offset", params=params)
                    except ClientError as exc:
                        result.errors.append(f"{bgroup} {topic}:{q['queue_id']} offset {offset}: {exc}")
                        continue
                    out.write(receipt_from_message(m, "dlq", now_us(), "dlq", retry_fields=True))
                    result.messages += 1
    finally:
        await t.close()
        out.flush()
    return result


async def read_queue(t: Transport, addr: str, topic: str, qid: int) -> AsyncIterator[list[dict[str, Any]]]:
    """The messages of one queue at ``addr``, from its min to its max offset (as of the first call)."""
    first = await t.operation(addr, Op.PULL, {"topic": topic, "queue_id": qid, "offset": 0, "max_count": 1})
    offset, end = int(first["min_offset"]), int(first["max_offset"])
    while offset < end:
        r = await t.operation(addr, Op.PULL,
                              {"topic": topic, "queue_id": qid, "offset": offset, "max_count": PULL_BATCH})
        if int(r["next_offset"]) <= offset:
            raise RuntimeError(f"read of {topic}:{qid} at {addr} stuck at {offset} ({r['status']}) before {end}")
        yield list(r["messages"])
        offset = int(r["next_offset"])


def quick_check(sends: Iterable[dict[str, Any]], drained: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Acknowledged sends missing from the drain (lost), and drain duplicates (pure; the Spark audit
    is the authority, this is the run's own first look)."""
    acked: set[str] = set()
    unknown: set[str] = set()
    failed: set[str] = set()
    for s in sends:
        {"ok": acked, "unknown": unknown, "fail": failed}[s["outcome"]].add(s["unique_id"])
    stored: collections.Counter[str] = collections.Counter(d["unique_id"] for d in drained)
    lost = sorted(acked - set(stored))
    return {
        "acknowledged": len(acked),
        "acknowledged_lost": len(lost),
        "lost_sample": lost[:20],
        "stored": sum(stored.values()),
        "stored_unique": len(stored),
        "stored_twice_or_more": sum(1 for n in stored.values() if n > 1),
        "unknown_stored": len(unknown & set(stored)),
        "unknown_not_stored": len(unknown - set(stored)),
        "failed_stored": len(failed & set(stored)),
    }
