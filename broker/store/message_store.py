"""The broker's message store: the dledger state machine that turns committed log records into
consume queues, a key index and replicated metadata.

Threads
- ``apply`` runs on the replica's thread (the broker's event loop, which owns the dledger
  replica), in log order, committed entries only (invariant 4: consume queues hold exactly the
  committed messages of their queue, in log order).
- Readers (the handlers on the same loop; tools on other threads) use ``read_message``, the
  consume queues and ``metadata_view``; metadata is guarded by ``_md_lock``, consume queues guard
  themselves.
- ``listener.on_applied(touched_queues, metadata_changed)`` is called after every apply batch, on
  the same thread: the server wakes its long polls directly.
- The store-sync thread fsyncs what a snapshot covers (queues, index, the log itself) and writes
  the snapshot record: the replica's thread never waits for a disk here.

Durability (the store owns it; dledger only asks ``applied_index()`` at start)
Every ``snapshot_interval_ms`` apply writes out and fsyncs the consume queues and the key index,
then atomically replaces ``snapshot`` with {applied index, end position, metadata, per-queue max
offsets}. After a crash the queues may run ahead of the snapshot (never behind: they are fsynced
first), so recovery truncates every queue back to the snapshot's end position and applying resumes
at the snapshot's index + 1 — no entry is applied twice, none skipped (invariant 3). A queue that is
missing or damaged is rebuilt from the log: the snapshot knows its max offset at the snapshot
index, so counting its messages in the retained log gives its first offset even after retention.

Delayed messages (broker/store/schedule.py): a delivered copy of a schedule record is dispatched only
while that record is pending in ``schedule`` (the on-disk pending set, derived from the log and
committed with every snapshot): a second copy is a committed record that no queue holds, skipped on
every replica alike (and by ``_queue_members`` when a queue is rebuilt: the first copy wins).

A follower re-anchored past entries it never applied (it was behind the leader's retention, so
dledger installed it at an anchor) cannot derive metadata or queue offsets from its log. It enters
*needs-state* mode (persisted): it applies nothing until a ``state`` command arrives — the leader
appends one every ``stateEntryIntervalMs`` and right after installing a follower — carrying the
leader's metadata and per-queue max offsets as of an index A ≥ the anchor. The follower then takes
that state, rebuilds its queues for the retained entries up to A (counting backwards from the max
offsets) and re-applies A+1 .. the state entry from its own log, exactly as the leader did.

Modules: this one applies and reads; ``broker/store/state_entries.py`` holds the state entries,
``broker/store/rebuild.py`` the rebuilding from the log, ``broker/store/snapshot.py`` the snapshot file.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from broker.protocol.properties import HALF_TOPIC, PROP_HALF_POS, PROP_SCHED_POS, SCHEDULE_TOPIC
from broker.store.consume_queue import ConsumeQueue, ConsumeQueueStore, PendingSync, QueueReader, finish_flush
from broker.store.dedup import DEFAULT_MAX_MESSAGES, DEFAULT_WINDOW_MS, DedupWindow, sent_topic
from broker.store.key_index import KeyIndex
from broker.store.message import (
    COMMAND_MAGIC,
    MESSAGE_MAGICS,
    CorruptRecordError,
    StoredMessage,
    decode_header,
    decode_message,
    record_size,
    tag_hash,
)
from broker.store.metadata import GroupConfig, Metadata, TopicConfig
from broker.store.record_rules import RefusalLog, admit_command, admitted_fields, message_refusal, refused
from broker.store.replay import NONCE_OP, NonceLog
from broker.store.schedule import ScheduleIndex
from broker.store.snapshot import SNAPSHOT_VERSION, read_snapshot, write_snapshot
from broker.store.state_entries import StoreStateEntries
from broker.store.transactions import TransactionIndex
from dledger.clock import SYSTEM, Clock
from dledger.records import Refused

if TYPE_CHECKING:
    from dledger.log_store import LogReader
    from dledger.node import CommittedEntry

log = logging.getLogger("broker.store")

WRITE_OUT_EVERY_UNITS = 8192
_HOOKED_TOPICS = (SCHEDULE_TOPIC, HALF_TOPIC)  # every message of these concerns the schedule or transactions


class ApplyListener(Protocol):
    def on_applied(self, touched: set[tuple[str, int]], metadata_changed: bool) -> None: ...


class MessageNotFound(Exception):
    pass


class CorruptMessage(Exception):
    """The record's bytes do not match its CRC on this replica (damaged storage)."""


class MessageStore(StoreStateEntries):
    def __init__(
        self,
        root: str,
        broker_name: str,
        *,
        snapshot_interval_ms: int = 1000,
        units_per_file: int = 300_000,
        clock: Clock = SYSTEM,
        dedup_max_messages: int = DEFAULT_MAX_MESSAGES,
        dedup_window_ms: int = DEFAULT_WINDOW_MS,
    ):
        self.root = root
        self.broker_name = broker_name
        os.makedirs(root, exist_ok=True)
        self.cqs = ConsumeQueueStore(os.path.join(root, "consumequeue"), units_per_file=units_per_file)
        self.index = KeyIndex(os.path.join(root, "index"))
        self.schedule = ScheduleIndex(os.path.join(root, "schedule", "pending.db"))  # broker/store/schedule.py
        self.txn = TransactionIndex(os.path.join(root, "transactions", "index.db"))  # broker/store/transactions.py
        self.metadata = Metadata()
        self._md_lock = threading.Lock()
        self._clock = clock
        self._snapshot_interval_s = snapshot_interval_ms / 1000
        self._last_snapshot = clock.monotonic()
        self._applied = 0
        self._durable_applied = 0  # applied_index of the last snapshot on disk (set by the sync thread)
        self.applied_end_position = 0  # end of the last applied record: readers stay below it
        self._queue_cache: dict[tuple[str, int], ConsumeQueue] = {}
        self._syncer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="store-sync")
        self._sync_job: concurrent.futures.Future[None] | None = None
        self._units_since_write_out = 0
        self._log: LogReader | None = None
        self._owner: int | None = None  # the thread that applies (see _owned)
        self._log_first_index = 0
        self.listener: ApplyListener | None = None
        self.counters = {
            "messages": 0, "commands": 0, "snapshots": 0, "rebuilt_queues": 0, "state_loads": 0,
            "schedule_duplicates": 0, "expired_queues_removed": 0, "transaction_second_copies": 0, "refused": 0,
            "replay_skipped": 0,
        }
        # Records refused at apply (broker/store/record_rules.py): the same on every replica, listed for operators.
        self.refusals = RefusalLog()
        # Set after an install past ``_applied``: the anchor; cleared by the first usable state entry.
        self.needs_state_after: int | None = None
        # The idempotent-send window (broker/store/dedup.py): every applied message, by unique id.
        self.dedup = DedupWindow(dedup_max_messages, dedup_window_ms)
        self._entry_index = 0  # the log index of the entry being applied
        self._dedup_adds: list[tuple[str, str, int, int, int, int, int]] = []  # this apply call's (apply())
        self._index_puts: list[tuple[str, str, int, int]] = []  # this apply call's key index puts (apply())
        self._dispatched = 0  # messages this apply call dispatched (counted at its end)
        # The nonces of state-changing requests (broker/store/replay.py): a replay is refused at apply.
        self.nonces = NonceLog()

    # -- lifecycle ------------------------------------------------------------------------------
    def open(self, log_store: LogReader) -> None:
        """Recover against the node's log (before the node starts applying)."""
        self._log = log_store
        self._log_first_index = log_store.first_index
        snap = read_snapshot(self._snapshot_path())
        expected: dict[tuple[str, int], int] = {}
        if snap is not None:
            self._applied = int(snap["applied_index"])
            self._durable_applied = self._applied
            self.applied_end_position = int(snap["end_position"])
            self.metadata = Metadata.from_snapshot(snap["metadata"])
            expected = {(t, int(q)): int(m) for t, q, m in snap["queues"]}
            self.needs_state_after = snap.get("needs_state_after")
            self.refusals.load(snap.get("refusals"))
        elif log_store.first_index > 1:
            log.warning(
                "no store snapshot and the log starts at index %d: queue offsets restart at 0",
                log_store.first_index,
            )
        # first: rebuilding queues from the log skips what a refused replay skipped (broker/store/replay.py)
        self._restore_nonces(snap.get("nonces") if snap is not None else None)
        for topic, qid, reason in list(self.cqs.damaged):
            log.warning("consume queue %s/%d is damaged (%s): rebuilding it from the log", topic, qid, reason)
        damaged = {(t, q) for t, q, _ in self.cqs.damaged}
        for topic, qid, cq in self.cqs.queues():
            cq.truncate_after_position(self.applied_end_position - 1)
            want = expected.get((topic, qid), 0)
            if cq.max_offset != want:
                log.warning(
                    "consume queue %s/%d holds %d units, the snapshot says %d: rebuilding it",
                    topic, qid, cq.max_offset, want,
                )
                damaged.add((topic, qid))
        for key in expected:
            if self.cqs.get(*key) is None:
                damaged.add(key)
        if damaged:
            self._rebuild_queues({k: expected.get(k, 0) for k in damaged})
        if self.schedule.applied_index() != self._applied:
            if self.schedule.applied_index() is not None or self._applied:
                log.warning("schedule index does not match applied index %d: rebuilding it from the log",
                            self._applied)
            self.schedule.rebuild(self._scan_records(self._applied), self._applied)
        if self.txn.applied_index() != self._applied:
            if self.txn.applied_index() is not None or self._applied:
                log.warning("transaction index does not match applied index %d: rebuilding it from the log",
                            self._applied)
            self.txn.rebuild(self._scan_records(self._applied), self._applied)
        rebuild_from = self.index.needs_rebuild_from()
        if rebuild_from is not None and rebuild_from < self.applied_end_position:
            self._reindex_keys(rebuild_from)
        self._restore_dedup(snap.get("dedup") if snap is not None else None)
        log.info(
            "store open: applied index %d, %d queues, %d topics",
            self._applied, len(self.cqs.queues()), len(self.metadata.topics),
        )

    def close(self) -> None:
        try:
            self.snapshot(wait=True)
        finally:  # even without a last snapshot (recovery re-applies from the previous one)
            self._syncer.shutdown(wait=True)
            self.cqs.close()
            self.index.close()
            self.schedule.close()
            self.txn.close()

    # -- the dledger StateMachine ------------------------------------------------------------------
    def applied_index(self) -> int:
        return self._applied

    def durable_applied_index(self) -> int:
        """The last snapshot on disk: recovery re-applies the log from there."""
        return self._durable_applied

    def _owned(self) -> None:
        """Applying and capturing state run on one thread (the replica's: the broker's loop): the
        first one to apply owns the store; any other raises instead of racing it."""
        me = threading.get_ident()
        if self._owner is None:
            self._owner = me
        elif me != self._owner:
            raise RuntimeError(f"MessageStore applied on thread {threading.current_thread().name!r}, not its owner's")

    def checkpoint(self) -> None:
        """Snapshot an idle store whose last applies are not on disk yet (the replica's thread)."""
        self._owned()
        if self._applied > self._durable_applied and (
            self._clock.monotonic() - self._last_snapshot >= self._snapshot_interval_s
        ):
            self.snapshot()

    def apply(self, entries: Sequence[CommittedEntry]) -> list[list[Any] | None]:
        """Apply committed entries; returns, per entry, what each of its bodies produced (a
        message's queue offset, a command's result): the append's caller reads it from
        ``BodyLocation.result`` (the results travel with the call)."""
        self._owned()
        touched: set[tuple[str, int]] = set()
        md_changed = False
        out: list[list[Any] | None] = []
        try:
            for e in entries:
                bodies = e.bodies
                self._entry_index = e.index
                aligned = True
                if self.needs_state_after is not None:
                    bodies = self._await_state(e, touched)
                    md_changed |= self.needs_state_after is None
                    aligned = False  # some bodies were skipped: no per-body results (nobody waits here)
                produced: list[Any] = []
                for position, body in bodies:
                    # Readers must be able to read a record as soon as its queue unit is visible.
                    end = position + len(body)
                    if end > self.applied_end_position:
                        self.applied_end_position = end
                    kind = body[:1]
                    result: Any = None
                    if kind in MESSAGE_MAGICS:
                        result = self._dispatch(position, body, touched)
                    elif kind == COMMAND_MAGIC:
                        changed, result = self._command(position, body)
                        md_changed |= changed
                    else:
                        result = self._refuse(position, "record", refused(f"unknown record kind {kind!r}"))
                    produced.append(result)
                out.append(produced if aligned else None)
                self._applied = e.index
        finally:  # what was dispatched is in the window and the key index, as if added one by one
            self._flush_dedup_adds()
            self._flush_index_puts()
            dispatched, self._dispatched = self._dispatched, 0
            self.counters["messages"] += dispatched
            self._units_since_write_out += dispatched
        if self._units_since_write_out >= WRITE_OUT_EVERY_UNITS:
            self.cqs.write_out_all()
            self._units_since_write_out = 0
        if self._clock.monotonic() - self._last_snapshot >= self._snapshot_interval_s:
            self.snapshot()
        if self.listener is not None and (touched or md_changed):
            self.listener.on_applied(touched, md_changed)
        return out

    def on_install(self, anchor_index: int) -> None:
        self._owned()
        if anchor_index <= self._applied:
            return
        log.warning(
            "log installed at anchor %d past applied index %d: waiting for a state entry from the leader",
            anchor_index, self._applied,
        )
        self.needs_state_after = anchor_index
        self._applied = anchor_index
        self.snapshot(wait=True)

    # -- applying ---------------------------------------------------------------------------------
    def _flush_index_puts(self) -> None:
        if self._index_puts:
            try:
                self.index.put_many(self._index_puts)
            finally:
                self._index_puts.clear()

    def _flush_dedup_adds(self) -> None:
        if self._dedup_adds:
            self.dedup.add_many(self._dedup_adds)
            self._dedup_adds.clear()

    def _refuse(self, position: int, kind: str, refusal: Refused) -> Refused:
        """A record admission refused (broker/store/record_rules.py): nothing of it is applied, on any
        replica; counted, logged, listed, and answered to the append's caller."""
        self.counters["refused"] += 1
        self.refusals.add(self._entry_index, position, kind, refusal)
        log.error("refused the %s record at log position %d (entry %d), on every replica alike: %s",
                  kind, position, self._entry_index, refusal.reason)
        return refusal

    def _dispatch(self, position: int, body: bytes, touched: set[tuple[str, int]]) -> int | Refused | None:
        """Index one message record; its queue offset (None: a second copy, skipped; ``Refused``:
        a record admission refused)."""
        nonces = self.nonces
        if nonces.skip_left and nonces.take_skip(self._entry_index, position):  # a refused replay's (replay.py)
            self.counters["replay_skipped"] += 1
            return None
        h = admitted_fields(body)
        if isinstance(h, Refused):
            return self._refuse(position, "message", h)
        # RecordHeader's fields, by position (no RecordHeader built per message)
        topic, qid, tags, keys, props, store_ts, uid = h[0], h[1], h[3], h[4], h[5], h[8], h[9]
        # A plain message (not on the schedule's or the half messages' topic, no schedule or half
        # position among its properties) is none of the schedule's or the transactions' business:
        # both hooks would answer True and change nothing, on_dispatched would not look, and
        # sent_topic would answer the topic itself (tests/broker/test_apply_fast_paths.py).
        special = topic in _HOOKED_TOPICS or (props and (PROP_SCHED_POS in props or PROP_HALF_POS in props))
        if special:
            if not self.schedule.on_message(position, len(body), topic, props):
                self.counters["schedule_duplicates"] += 1  # a delayed message delivered already
                return None
            if not self.txn.on_message(position, len(body), topic, props, store_ts):
                self.counters["transaction_second_copies"] += 1  # a commit of a resolved half
                return None
        key = (topic, qid)
        cq = self._queue_cache.get(key)
        if cq is None:
            cq = self.cqs.get_or_create(topic, qid)
            self._queue_cache[key] = cq
        offset = cq.append(position, len(body), tag_hash(tags) if tags else 0, store_ts)
        if special and PROP_HALF_POS in props:
            self.txn.on_dispatched(position, props, offset)
        # Added to the window once the whole apply call is done (one lock for all; apply()).
        self._dedup_adds.append(
            (sent_topic(topic, props) if special else topic, uid, position, qid, offset, store_ts, self._entry_index)
        )
        # Put in the key index once the whole apply call is done (one lock for all; apply()).
        for k in keys:
            self._index_puts.append((topic, k, position, store_ts))
        if uid:
            self._index_puts.append((topic, uid, position, store_ts))
        touched.add(key)
        self._dispatched += 1  # counted into "messages" and the units to write out by apply()
        return offset

    def _command(self, position: int, body: bytes) -> tuple[bool, dict[str, Any] | Refused | None]:
        """Apply one command: (whether the NameServers must hear of it, its result)."""
        if self.nonces.take_skip(self._entry_index, position):  # a refused replay's (broker/store/replay.py)
            self.counters["replay_skipped"] += 1
            return False, None
        cmd, refusal = admit_command(body)
        if cmd is None:
            assert refusal is not None
            return False, self._refuse(position, "command", refusal)
        if cmd.get("op") == "state":  # only a replica in needs-state mode uses it
            return False, None
        if cmd.get("op") == NONCE_OP:
            return False, self.nonces.apply(cmd, self._entry_index, position)
        if str(cmd.get("op", "")).startswith("schedule."):
            self.schedule.on_command(cmd)
            return False, {}
        if str(cmd.get("op", "")).startswith("txn."):
            return False, self.txn.on_command(cmd)
        with self._md_lock:
            result = self.metadata.apply(cmd, position)
        if "error" in result:  # changed nothing, on every replica: answered BAD_COMMAND, listed here too
            self._refuse(position, "command", Refused("BAD_COMMAND", str(result["error"])))
            return False, result
        if cmd.get("op") == "topic.delete":
            topic = str(cmd["topic"])
            for key in [k for k in self._queue_cache if k[0] == topic]:
                del self._queue_cache[key]
            self.cqs.delete_topic(topic)
        self.counters["commands"] += 1
        # Only topic changes concern the NameServers (offset commits are frequent and local).
        return "error" not in result and str(cmd.get("op", "")).startswith("topic."), result

    # -- snapshots -----------------------------------------------------------------------------
    def _snapshot_path(self) -> str:
        return os.path.join(self.root, "snapshot")

    def snapshot(self, *, wait: bool = False) -> None:
        """Make everything applied so far durable: the log, queues and index first, then the record.

        The apply thread only writes out buffers and captures the record; the fsyncs run on the
        store's sync thread (they took 5-10 ms per second on the apply thread, straight into the
        commit latency of whatever was in flight), the log's included (a flush on another thread
        covers what was written before it). A round still syncing makes this one wait for the
        next interval, unless ``wait`` (close, install) forces a synchronous round."""
        if self._sync_job is not None and not self._sync_job.done():
            if not wait:
                return
            self._sync_job.result()
        self._last_snapshot = self._clock.monotonic()
        self._apply_retention()
        pending = self.cqs.begin_flush_all()
        self.schedule.commit(self._applied)
        self.txn.commit(self._applied)
        self._units_since_write_out = 0
        with self._md_lock:
            md = self.metadata.to_snapshot()
        snap = {
            "version": SNAPSHOT_VERSION,
            "applied_index": self._applied,
            "end_position": self.applied_end_position,
            "metadata": md,
            "queues": [[t, q, cq.max_offset] for t, q, cq in self.cqs.queues()],
            "needs_state_after": self.needs_state_after,
            "dedup": self.dedup.checkpoint(),
            "refusals": self.refusals.view(),
            "nonces": self.nonces.checkpoint(),
        }
        self._sync_job = self._syncer.submit(self._sync_and_record, pending, snap)
        if wait:
            self._sync_job.result()

    def _sync_and_record(self, pending: list[PendingSync], snap: dict[str, Any]) -> None:
        started = self._clock.monotonic()
        try:
            # Never let the snapshot say more is applied than the log has on disk: with ASYNC_FLUSH
            # a crash that loses unflushed log writes would otherwise leave queues pointing at
            # nothing. Everything applied was written before this job was submitted.
            if self._log is not None:
                self._log.flush()
            for p in pending:
                finish_flush(p)
            self.index.flush()
            write_snapshot(self._snapshot_path(), snap)
            self._durable_applied = int(snap["applied_index"])  # one int store: read by the replica
        except Exception:
            log.exception("store snapshot failed (recovery replays from the previous one)")
            raise
        self.counters["snapshots"] += 1
        took_us = int((self._clock.monotonic() - started) * 1e6)
        self.counters["snapshot_us_last"] = took_us
        self.counters["snapshot_us_max"] = max(self.counters.get("snapshot_us_max", 0), took_us)

    def clean_expired_queues(self) -> list[tuple[str, int]]:
        """RocketMQ's cleanExpiredCQ for this replica (its thread): remove the consume queues of
        topics its replicated metadata no longer holds (left behind by a crash between a topic's
        deletion and the removal of its files), then snapshot so that recovery agrees. Queues of
        live topics and of the schedule topic are never touched; units below the log's retention
        are trimmed at every snapshot already. Returns the (topic, queue) pairs removed."""
        self._owned()
        with self._md_lock:
            live = set(self.metadata.topics)
        gone = sorted({t for t, _q, _cq in self.cqs.queues()} - live - {SCHEDULE_TOPIC, HALF_TOPIC})
        removed = [(t, q) for t, q, _cq in self.cqs.queues() if t in gone]
        for topic in gone:
            for key in [k for k in self._queue_cache if k[0] == topic]:
                del self._queue_cache[key]
            self.cqs.delete_topic(topic)
        if removed:
            log.warning("cleanExpiredCQ removed %d queue(s) of topics that no longer exist: %s", len(removed), gone)
            self.counters["expired_queues_removed"] += len(removed)
            self.snapshot(wait=True)
        return removed

    def _apply_retention(self) -> None:
        """Drop queue units and index files that point below the log's first retained entry."""
        log_store = self._log
        if log_store is None or log_store.first_index == self._log_first_index:
            return
        self._log_first_index = log_store.first_index
        if log_store.first_index > log_store.last_index:
            return
        first_position = log_store.position_at(log_store.first_index)
        self.nonces.forget_skipped_before(first_position)
        self.cqs.delete_before_position(first_position)
        self.index.delete_before_position(first_position)
        for h in self.txn.forget_before(first_position):  # the check service discards them
            log.error("transaction half at position %d (group %s) was removed by log retention while pending",
                      h.position, h.group)

    # -- reads (any thread) -------------------------------------------------------------------------
    def queue(self, topic: str, queue_id: int) -> QueueReader | None:
        """The read side of a consume queue (None: nothing was ever applied to it here)."""
        return self.cqs.get(topic, queue_id)

    def queue_count(self) -> int:
        return len(self.cqs.queues())

    def key_index_last_update(self) -> tuple[int, int]:
        """(store ts, log position) of the newest record the key index holds ((0, 0): none)."""
        return self.index.last_update()

    def positions_by_key(self, topic: str, key: str, max_count: int, begin_ts: int, end_ts: int) -> list[int]:
        """Log positions of records of ``topic`` the key index holds under ``key`` (a key or a unique
        id; a hash collision may add others) stored in [begin_ts, end_ts], newest first, at most
        ``max_count``."""
        return self.index.query(topic, key, max_count, begin_ts, end_ts)

    def metadata_view(self) -> Metadata:
        """A consistent copy (cheap: metadata is small)."""
        with self._md_lock:
            return Metadata.from_snapshot(self.metadata.to_snapshot())

    def topic(self, name: str) -> TopicConfig | None:
        with self._md_lock:
            return self.metadata.topics.get(name)

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """One committed consumer offset (None: never committed), without copying the metadata."""
        with self._md_lock:
            return self.metadata.offsets.get((group, topic, queue_id))

    def topic_epoch(self, name: str) -> int | None:
        with self._md_lock:
            return self.metadata.topic_epoch(name)

    def group(self, name: str) -> GroupConfig | None:
        with self._md_lock:
            return self.metadata.groups.get(name)

    def group_has_offsets(self, group: str, topic: str) -> bool:
        """Whether ``group`` committed offsets on ``topic`` (a send-back's "the group consumed it")."""
        with self._md_lock:
            return any(g == group and t == topic for g, t, _q in self.metadata.offsets)

    def read_message(self, position: int, size: int | None = None) -> StoredMessage:
        """The message record at ``position`` (committed and applied only)."""
        assert self._log is not None
        if position < 0 or position >= self.applied_end_position:
            raise MessageNotFound(f"no applied message at position {position}")
        try:
            if size is None:
                head = self._log.read_at_position(position, 5)
                if head[:1] not in MESSAGE_MAGICS:
                    raise MessageNotFound(f"no message record at position {position}")
                hlen = int.from_bytes(head[1:5], "little")
                if hlen > 1 << 20 or position + 5 + hlen > self.applied_end_position:
                    raise MessageNotFound(f"no message record at position {position}")
                header, _ = decode_header(head + self._log.read_at_position(position + 5, hlen))
                size = record_size(head[:1], hlen, int(header.body_len))
                # Read by position alone (a msg id): it may be a record applying refused, which no
                # queue holds and nobody may read (queues and indexes point at admitted ones only).
                refusal = message_refusal(header.topic, header.queue_id, header.store_ts, header.properties)
                if refusal is not None:
                    raise MessageNotFound(f"the record at position {position} was refused when applied: {refusal}")
            if position + size > self.applied_end_position:
                raise MessageNotFound(f"no applied message at position {position}")
            return decode_message(self._log.read_at_position(position, size))
        except CorruptRecordError as exc:
            log.error("message record at position %d is damaged (%s): refusing to serve it", position, exc)
            self.counters["corrupt_records"] += 1
            raise CorruptMessage(f"the message at position {position} is damaged on this replica") from None
        except MessageNotFound:
            raise
        except Exception as exc:  # out of range, removed by retention, not a record
            raise MessageNotFound(f"no message at position {position}: {exc}") from None
