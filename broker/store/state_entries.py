"""State entries (``broker/store/message_store.py``: followers behind retention): the ``state`` command a leader
captures, and, on a follower in needs-state mode, waiting for a usable one, loading it and re-applying
the entries after its ``as_of`` from the follower's own log. Runs on the replica's thread (the broker's loop).

``StoreStateEntries`` is a base of ``MessageStore`` (over ``StoreRebuild``, whose queue rebuild it uses)."""


from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from broker.store.consume_queue import ConsumeQueue
from broker.store.message import COMMAND_MAGIC, MESSAGE_MAGICS
from broker.store.metadata import Metadata
from broker.store.rebuild import StoreRebuild
from broker.store.record_rules import admit_command
from broker.store.schedule import ScheduleIndex
from broker.store.transactions import TransactionIndex
from dledger.records import to_committed

if TYPE_CHECKING:
    from dledger.node import CommittedEntry

log = logging.getLogger("broker.store")


class StoreStateEntries(StoreRebuild):
    # The store's state (defined by MessageStore.__init__).
    metadata: Metadata
    _md_lock: threading.Lock
    _queue_cache: dict[tuple[str, int], ConsumeQueue]
    schedule: ScheduleIndex
    txn: TransactionIndex
    needs_state_after: int | None
    applied_end_position: int
    _entry_index: int

    if TYPE_CHECKING:

        def _owned(self) -> None: ...

        def _dispatch(self, position: int, body: bytes, touched: set[tuple[str, int]]) -> Any: ...

        def _command(self, position: int, body: bytes) -> tuple[bool, Any]: ...

        def _flush_dedup_adds(self) -> None: ...

    def capture_state(self) -> dict[str, Any]:
        """The ``state`` command for this replica's state now (call on the replica's thread)."""
        self._owned()
        with self._md_lock:
            md = self.metadata.to_snapshot()
        return {
            "op": "state",
            "as_of": self._applied,
            "metadata": md,
            "queues": [[t, q, cq.max_offset] for t, q, cq in self.cqs.queues()],
            # the pending delayed messages, so the follower skips the same second copies
            "schedule": self.schedule.rows(),
            "transactions": self.txn.rows(),  # pending halves and resolutions (broker/store/transactions.py)
            "nonces": self.nonces.checkpoint(),  # the replicated nonce window (broker/store/replay.py)
        }

    def _await_state(self, e: CommittedEntry, touched: set[tuple[str, int]]) -> list[tuple[int, bytes]]:
        """In needs-state mode: the bodies of ``e`` still to apply ([] until a usable state)."""
        anchor = self.needs_state_after
        assert anchor is not None
        for position, body in e.bodies:
            end = position + len(body)
            if end > self.applied_end_position:
                self.applied_end_position = end
        for k, (_position, body) in enumerate(e.bodies):
            if body[:1] != COMMAND_MAGIC:
                continue
            cmd, _refused = admit_command(body)
            if cmd is None or cmd.get("op") != "state":
                continue
            as_of = cmd.get("as_of", -1)
            if isinstance(as_of, bool) or not isinstance(as_of, int) or not anchor <= as_of < e.index:
                continue
            self._load_state(cmd, e.index, touched)
            # The rest of this entry (sends grouped with the state) comes after the state's as_of.
            return [b for i, b in enumerate(e.bodies) if i != k]
        return []

    def _load_state(self, cmd: dict[str, Any], state_index: int, touched: set[tuple[str, int]]) -> None:
        as_of = int(cmd["as_of"])
        with self._md_lock:
            self.metadata = Metadata.from_snapshot(cmd["metadata"])
        for topic in self.cqs.topics():
            self.cqs.delete_topic(topic)
        self._queue_cache.clear()
        self._flush_dedup_adds()  # nothing dispatched before the state may land after it
        self.dedup.begin_restore(None)  # starts again from the entries re-applied below
        self._applied = as_of
        self._restore_nonces(cmd.get("nonces"), as_of)  # before the queues: skipped bodies stay skipped
        self._rebuild_queues({(str(t), int(q)): int(m) for t, q, m in cmd["queues"]})
        self.schedule.load_rows(cmd.get("schedule") or [], as_of)
        self.txn.load_rows(cmd.get("transactions") or {}, as_of)
        self.needs_state_after = None
        assert self._log is not None
        index = as_of + 1
        while index < state_index:
            raw = self._log.read_range(index, min(512, state_index - index), 8 << 20)
            if not raw:
                break
            for entry in raw:
                if entry.index >= state_index:
                    break
                committed = to_committed(entry, self._log)
                self._entry_index = entry.index
                for position, body in committed.bodies:
                    if body[:1] in MESSAGE_MAGICS:
                        self._dispatch(position, body, touched)
                    elif body[:1] == COMMAND_MAGIC:
                        self._command(position, body)
            index = raw[-1].index + 1
        self._entry_index = state_index
        self.counters["state_loads"] += 1
        log.warning("state as of index %d loaded (entry %d): this replica serves again", as_of, state_index)
