"""Rebuilding the message store's derived state from the retained log (``broker/store/message_store.py``): damaged or
missing consume queues (counted back from the snapshot's max offsets), the key index, the
de-duplication window, and the scans of the log's message and command records they share.

``StoreRebuild`` is a base of ``MessageStore``: it runs while the store opens (before the node
applies) or on the replica's thread when a state entry is loaded (``broker/store/state_entries.py``)."""


from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from broker.protocol.properties import PROP_HALF_POS, PROP_SCHED_POS
from broker.store.consume_queue import ConsumeQueue, ConsumeQueueStore
from broker.store.dedup import DedupWindow, sent_topic
from broker.store.key_index import KeyIndex
from broker.store.message import COMMAND_MAGIC, MESSAGE_MAGICS, decode_header, tag_hash
from broker.store.record_rules import admit_command, admitted_header
from broker.store.replay import NONCE_OP, NonceLog
from dledger.log_store import StoreError
from dledger.records import to_committed

if TYPE_CHECKING:
    from dledger.log_store import LogReader

log = logging.getLogger("broker.store")


class StoreRebuild:
    # The store's tables (defined by MessageStore.__init__).
    cqs: ConsumeQueueStore
    index: KeyIndex
    dedup: DedupWindow
    nonces: NonceLog
    counters: dict[str, int]
    _log: LogReader | None
    _applied: int

    def _restore_dedup(self, checkpoint: dict[str, Any] | None) -> None:
        """Re-add the messages of the snapshot's de-duplication window (from its oldest entry's log
        index up to the snapshot's applied index): the window is what it was before the restart."""
        start = self.dedup.begin_restore(checkpoint)
        if start is None or self._log is None:
            return
        start_index, start_position = start
        index = max(start_index, self._log.first_index)
        last = min(self._applied, self._log.last_index)
        batch = 512
        while index <= last:
            try:
                raw = self._log.read_range(index, min(batch, last - index + 1), 8 << 20)
            except StoreError as exc:  # a damaged entry: reads refuse it anyway; find it, skip it
                if batch > 1:
                    batch = 1
                    continue
                log.error("de-duplication window: log entry %d is unreadable (%s): skipped", index, exc)
                index += 1
                continue
            batch = 512
            if not raw:
                break
            for entry in raw:
                for position, body in to_committed(entry, self._log).bodies:
                    if body[:1] not in MESSAGE_MAGICS or position < start_position:
                        continue
                    h = admitted_header(body)
                    if h is None:  # refused when applied: never in the window
                        continue
                    cq = self.cqs.get(h.topic, int(h.queue_id))
                    offset = cq.search_by_position(position) if cq is not None else None
                    self.dedup.add(
                        sent_topic(h.topic, h.properties), h.unique_id, position=position, queue_id=int(h.queue_id),
                        queue_offset=-1 if offset is None else offset, store_ts=int(h.store_ts), index=entry.index,
                    )
            index = raw[-1].index + 1
        if not self.dedup.end_restore():
            log.warning("the de-duplication window could not be rebuilt exactly (log retention passed it)")
        log.info("de-duplication window restored: %d messages from log index %d", len(self.dedup), start_index)

    def _restore_nonces(self, checkpoint: dict[str, Any] | None, until_index: int | None = None) -> None:
        """Re-add the nonce records of the checkpoint's window (broker/store/replay.py) from its oldest
        entry's log index up to ``until_index`` (the applied index): the replicated nonce set is what
        it was when the checkpoint was taken."""
        start = self.nonces.begin_restore(checkpoint)
        if start is None or self._log is None:
            return
        start_index, start_position = start
        if start_index < self._log.first_index:
            log.warning("the replicated nonce window starts at log index %d, below the retained log (%d)",
                        start_index, self._log.first_index)
        index = max(start_index, self._log.first_index)
        last = min(self._applied if until_index is None else until_index, self._log.last_index)
        while index <= last:
            raw = self._log.read_range(index, min(512, last - index + 1), 8 << 20)
            if not raw:
                break
            for entry in raw:
                for position, body in to_committed(entry, self._log).bodies:
                    if body[:1] != COMMAND_MAGIC or position < start_position:
                        continue
                    cmd, _refusal = admit_command(body)
                    if cmd is not None and cmd.get("op") == NONCE_OP:
                        self.nonces.restore_add(cmd, entry.index, position)
            index = raw[-1].index + 1
        log.info("replicated nonce window restored: %d nonces from log index %d", len(self.nonces), start_index)

    def _scan_records(self, until_index: int) -> Iterable[tuple[int, bytes]]:
        """Every (position, record) of messages and commands in the retained log up to ``until_index``
        (bodies of a request refused as a replay at apply excluded, as apply skipped them)."""
        assert self._log is not None
        index = self._log.first_index
        last = min(until_index, self._log.last_index)
        while index <= last:
            raw = self._log.read_range(index, min(512, last - index + 1), 8 << 20)
            if not raw:
                break
            for entry in raw:
                for position, body in to_committed(entry, self._log).bodies:
                    if (body[:1] in MESSAGE_MAGICS or body[:1] == COMMAND_MAGIC) and not self.nonces.is_skipped(
                        position
                    ):
                        yield position, body
            index = raw[-1].index + 1

    def _scan_messages(self, until_index: int) -> Iterable[tuple[int, bytes]]:
        for position, body in self._scan_records(until_index):
            if body[:1] in MESSAGE_MAGICS:
                yield position, body

    def _queue_members(self, wanted: set[tuple[str, int]]) -> Iterable[tuple[tuple[str, int], int, bytes]]:
        """(queue, position, record) of the messages that belong to ``wanted`` queues now: a
        ``topic.delete`` in the log drops the topic's earlier messages, as applying did."""
        deleted_at: dict[str, int] = {}
        txn_ended_at: dict[str, int] = {}  # half position -> where a rollback or discard resolved it
        for position, body in self._scan_records(self._applied):
            if body[:1] == COMMAND_MAGIC:
                cmd, _refused = admit_command(body)
                if cmd is None:  # refused when applied: it changed nothing
                    continue
                if cmd.get("op") == "topic.delete":
                    deleted_at[str(cmd.get("topic"))] = position
                ended = [cmd.get("position")] if cmd.get("op") == "txn.end" else []
                ended += cmd.get("positions") or [] if cmd.get("op") == "txn.discard" else []
                for p in ended:
                    txn_ended_at.setdefault(str(p), position)
        copies: set[str] = set()  # delayed messages delivered: only the first copy was dispatched
        for position, body in self._scan_messages(self._applied):
            h = admitted_header(body)
            if h is None:  # refused when applied (broker/store/record_rules.py): in no queue
                continue
            sched_pos = h.properties.get(PROP_SCHED_POS) if isinstance(h.properties, dict) else None
            if sched_pos is not None:
                if sched_pos in copies:
                    continue
                copies.add(sched_pos)
            half_pos = h.properties.get(PROP_HALF_POS) if isinstance(h.properties, dict) else None
            if half_pos is not None:  # a commit: only the first, and none after a rollback
                if "T" + half_pos in copies or txn_ended_at.get(half_pos, position + 1) < position:
                    continue
                copies.add("T" + half_pos)
            key = (h.topic, int(h.queue_id))
            if key in wanted and position > deleted_at.get(key[0], -1):
                yield key, position, body

    def _rebuild_queues(self, want_max: dict[tuple[str, int], int]) -> None:
        """Rebuild these queues from the log up to the snapshot; ``want_max`` = max offset there."""
        counts: dict[tuple[str, int], int] = dict.fromkeys(want_max, 0)
        for key, _position, _body in self._queue_members(set(want_max)):
            counts[key] += 1
        queues: dict[tuple[str, int], ConsumeQueue] = {}
        for key, n in counts.items():
            if n > want_max[key]:
                log.error(
                    "rebuilding %s/%d: the log holds %d messages but the snapshot says %d: using the log",
                    key[0], key[1], n, want_max[key],
                )
            cq = self.cqs.reset_queue(*key)
            base = max(0, want_max[key] - n)
            if base:
                cq.set_base(base)
            queues[key] = cq
        for key, position, body in self._queue_members(set(want_max)):
            h, _ = decode_header(body)  # admitted by _queue_members
            queues[key].append(position, len(body), tag_hash(h.tags), int(h.store_ts))
        for cq in queues.values():
            cq.flush()
        self.counters["rebuilt_queues"] += len(queues)

    def _reindex_keys(self, from_position: int) -> None:
        log.warning("key index damaged or unclean: re-indexing keys from log position %d", from_position)
        for position, body in self._scan_messages(self._applied):
            if position < from_position:
                continue
            h = admitted_header(body)
            if h is None:  # refused when applied: not indexed
                continue
            for k in h.keys:
                self.index.put(h.topic, k, position, int(h.store_ts))
            if h.unique_id:
                self.index.put(h.topic, h.unique_id, position, int(h.store_ts))
        self.index.flush()
