"""The workload of a chaos run: producers and consumers driving the cluster through the SDK, every
send and every receipt written to the history; then the final drain of every queue.

Producers (``p0``, ``p1``, ...) each own a ``Producer`` and send one message at a time (sync
sends, the SDK's retries inside), paced to ``rate`` sends/s. Every message gets its unique id
before the first attempt (so failed sends are in the history too), the properties ``producer`` and
``seq``, and — for the keyed producers (the last ``keyed`` ones) — a sharding key as its first key,
sent with ``HashKeySelector`` (one key, one queue, in order); ``seq`` then counts per key.

Outcome of a send: ``ok`` (acknowledged), ``unknown`` when the SDK says ``outcome_unknown`` (a
timeout or lost connection in this or an earlier attempt), otherwise ``fail``.

Consumers (``c0``, ...) are push consumers of one clustering group, consuming from the first offset;
their listener writes one receipt per message. ``drain`` reads every queue of every group's leader
from its min to its max offset, directly (not through a proxy).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from broker.client import (
    CONSUME_SUCCESS,
    ClientError,
    HashKeySelector,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    UniqueIdGenerator,
)
from broker.client.transport import FROM_ENV, NamesrvClient, Transport
from chaos.history import JsonlWriter, Outcome, SendRecord, now_us, receipt_from_message
from chaos.target import Member, Target, find_leader, groups_of, wait_for

log = logging.getLogger(__name__)

CONSUMER_GROUP = "chaos_consumer"
PULL_BATCH = 1024


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

    def snapshot(self) -> dict[str, Any]:
        return {"sends": self.sends, "ok": self.ok, "fail": self.fail, "unknown": self.unknown,
                "receipts": self.receipts, "errors": dict(self.errors)}


def body_for(producer: str, key: str | None, seq: int, size: int) -> bytes:
    head = f"{producer}|{key or '-'}|{seq}|".encode()
    return head + b"x" * max(0, size - len(head))


class ProducerWorker:
    def __init__(self, name: str, namesrv: str, cfg: WorkloadConfig, keyed: bool, out: JsonlWriter,
                 counters: Counters, rng: random.Random):
        self.name, self.cfg, self.keyed, self.out, self.counters, self.rng = name, cfg, keyed, out, counters, rng
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
            await self.producer.shutdown()

    async def send_one(self) -> None:
        key = f"{self.name}-k{self.rng.randrange(self.cfg.keys_per_producer)}" if self.keyed else None
        seq = self.seq_by_key[key]
        self.seq_by_key[key] = seq + 1
        uid = self.ids.next()
        msg = Message(self.cfg.topic, body_for(self.name, key, seq, self.cfg.body_bytes),
                      keys=(key,) if key else (), properties={"producer": self.name, "seq": str(seq)},
                      unique_id=uid)
        c = self.counters
        c.sends += 1
        invoke = now_us()
        try:
            if key is not None:
                r = await self.producer.send(msg, selector=self.selector)
            else:
                r = await self.producer.send(msg)
        except ClientError as exc:
            log.info("send %s of %s (key %s, seq %d): %s", uid, self.name, key, seq, exc)
            outcome: Outcome = "unknown" if exc.outcome_unknown else "fail"
            rec = SendRecord(self.name, uid, key, seq, self.cfg.topic, invoke, now_us(), outcome, exc.code)
            c.errors[exc.code] += 1
        except Exception as exc:  # anything else: we cannot say whether it was stored
            log.warning("send %s of %s: unexpected %r", uid, self.name, exc)
            rec = SendRecord(self.name, uid, key, seq, self.cfg.topic, invoke, now_us(), "unknown",
                             type(exc).__name__)
            c.errors[type(exc).__name__] += 1
        else:
            rec = SendRecord(self.name, uid, key, seq, self.cfg.topic, invoke, now_us(), "ok", None,
                             r.message_queue.broker_name, r.message_queue.queue_id, r.queue_offset, r.msg_id,
                             r.store_ts * 1000)
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


class ConsumerWorker:
    def __init__(self, name: str, namesrv: str, cfg: WorkloadConfig, out: JsonlWriter, counters: Counters):
        self.name, self.out, self.counters = name, out, counters
        self.consumer = PushConsumer(
            CONSUMER_GROUP, namesrv, consume_from="FIRST", client_id=f"chaos-{name}-{os.getpid()}",
            commit_interval_s=1.0, rebalance_interval_s=5.0, heartbeat_interval_s=2.0, suspend_ms=2000,
            route_refresh_interval_s=5.0,
        )
        self.consumer.subscribe(cfg.topic, "*")
        self.consumer.register_listener(self._on_messages)

    async def _on_messages(self, msgs: list[MessageExt], ctx: Any) -> Any:
        t = now_us()
        for m in msgs:
            self.out.write(receipt_from_message(m, self.name, t, "receipt"))
            self.counters.receipts += 1
            self.counters.received.add(m.unique_id)
        return CONSUME_SUCCESS


class Workload:
    """Producers and consumers of one run, with their history files under ``history_dir``."""

    def __init__(self, history_dir: str, namesrv: str, cfg: WorkloadConfig, rng: random.Random):
        self.cfg = cfg
        self.counters = Counters()
        self.writers: list[JsonlWriter] = []
        self.producers = []
        for i in range(cfg.producers):
            name = f"p{i}"
            w = JsonlWriter(os.path.join(history_dir, f"sends-{name}.jsonl"))
            self.writers.append(w)
            keyed = i >= cfg.producers - cfg.keyed
            self.producers.append(ProducerWorker(name, namesrv, cfg, keyed, w, self.counters,
                                                 random.Random(rng.randrange(1 << 30))))
        self.consumers = []
        for i in range(cfg.consumers):
            name = f"c{i}"
            w = JsonlWriter(os.path.join(history_dir, f"receipts-{name}.jsonl"))
            self.writers.append(w)
            self.consumers.append(ConsumerWorker(name, namesrv, cfg, w, self.counters))
        self._stop_producing = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._consumers_started: list[ConsumerWorker] = []

    async def start(self) -> None:
        for c in self.consumers:
            await c.consumer.start()
            self._consumers_started.append(c)
        self._tasks = [asyncio.create_task(p.run(self._stop_producing), name=f"chaos-{p.name}")
                       for p in self.producers]

    async def stop_producers(self) -> None:
        self._stop_producing.set()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def stop_consumers(self) -> None:
        while self._consumers_started:
            c = self._consumers_started.pop()
            try:
                await asyncio.wait_for(c.consumer.shutdown(), 30)
            except Exception:  # after faults: never block the cleanup
                pass

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


async def read_queue(t: Transport, addr: str, topic: str, qid: int) -> AsyncIterator[list[dict[str, Any]]]:
    """The messages of one queue at ``addr``, from its min to its max offset (as of the first call)."""
    first = await t.call(addr, "POST", "/v1/pull", {"topic": topic, "queue_id": qid, "offset": 0, "max_count": 1})
    offset, end = int(first["min_offset"]), int(first["max_offset"])
    while offset < end:
        r = await t.call(addr, "POST", "/v1/pull",
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
