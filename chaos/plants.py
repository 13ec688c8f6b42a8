"""Deliberate defects ("plants") for the audit's sensitivity tests: each function patches one known
bug into the process that calls it. Test-only: nothing here runs unless a test or ``chaos run
--plant NAME`` asks for it.

Broker plants run inside broker processes, applied at start-up by ``broker.serving.process_main``'s
``DLEDGER_TEST_PLANT=chaos.plants:<function>`` hook (a chaos run passes that variable to every
broker it starts or restarts). Client plants run inside the ``chaos run`` process, before its
workload starts. A planted process says so in its log (``TEST PLANT ACTIVE``).

    name                      side    defect (issue 12's table)
    ack-before-majority       broker  the leader counts its own log end as committed
    fdatasync-noop            broker  fdatasync is a no-op under SYNC_FLUSH (the log never syncs)
    follower-ack-before-fsync broker  a follower answers an AppendEntries of several entries before
                                      it fdatasyncs them, and syncs every flushIntervalCommitLog
    cq-drops-last-unit        broker  recovery drops each consume queue's last unit
    stock-truncation          broker  followers truncate entries that do not conflict (stock
                                      pysyncobj), with the stock leader nextIndex rewind
    offset-regress            broker  a consumer offset lower than the stored one is accepted
    sendback-unchecked        broker  a send-back's group and the stored message are not checked
                                      (a validation gap: over-long retry/DLQ topics reach the log)
    apply-raises              broker  a record the apply refuses raises instead (the apply before
                                      issue 23: every replica stops at the same committed entry)
    sdk-definite-on-lost-connection
                              client  the SDK answers "definitely failed" for sends that may be
                                      stored: a connection lost after the request went out is a
                                      failure, and only the last attempt counts

Each plant patches names through ``_patch``, which remembers the original: ``unplant_all()``
restores every one (tests that plant inside their own process use it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from broker.serving.process_main import PLANT_ENV

_UNDO: list[tuple[Any, str, Any]] = []


def _patch(owner: Any, name: str, new: Any) -> Any:
    """Replace ``owner.name`` with ``new``; returns the original (restored by ``unplant_all``)."""
    original = getattr(owner, name)
    _UNDO.append((owner, name, original))
    setattr(owner, name, new)
    return original


def unplant_all() -> None:
    while _UNDO:
        owner, name, original = _UNDO.pop()
        setattr(owner, name, original)


# -- broker plants ---------------------------------------------------------------------------------
def ack_before_majority() -> None:
    """The leader takes its own log end as the commit index at every tick: appends are
    acknowledged (and applied) before any follower has them. Patches ``DLedgerSyncObj._onTick``
    (pysyncobj's ``SyncObj._onTick``, inherited)."""
    from dledger.syncobj_patch import RAFT_STATE_LEADER, DLedgerSyncObj

    original = DLedgerSyncObj._onTick

    def _onTick(self: Any, timeToWait: float = 0.0) -> None:  # pysyncobj's names
        if self.dl_state == RAFT_STATE_LEADER:
            last = int(self.dl_journal.store.last_index)
            if last > self._SyncObj__raftCommitIndex:
                self._SyncObj__raftCommitIndex = last
                self.dl_journal.setRaftCommitIndex(last)
        original(self, timeToWait)

    _patch(DLedgerSyncObj, "_onTick", _onTick)


def fdatasync_noop() -> None:
    """``EntryStore.flush`` forgets what is dirty without calling fdatasync: under SYNC_FLUSH the
    Raft log is acknowledged from the page cache. (Truncation, reset and segment sealing still
    sync: only the path before every acknowledgement is broken.)"""
    from dledger.entry_store import EntryStore

    def flush(self: Any) -> None:
        self._dirty_files.clear()
        self._dirty_dirs.clear()

    _patch(EntryStore, "flush", flush)


def follower_ack_before_fsync() -> None:
    """A follower acknowledges an AppendEntries that carried more than one entry before it
    fdatasyncs them, and syncs them on the asynchronous policy's schedule: ``ReplicaCore.ack_ready``
    (may a success answer leave, i.e. is what it covers durable?) says yes while such a message is
    being handled, so the answer leaves from the page cache instead of being held until the flush
    that covers it returns; the follower's next flush then waits until ``flushIntervalCommitLog``
    after its last one, as under ``ASYNC_FLUSH``. Single-entry appends stay correct. The leader
    may count the answer toward a majority, commit and acknowledge, while the follower's copy is not
    on its disk yet.

    Why the lazy flush too: since issue 26 the flush starts at the end of the very tick that sent
    the answer, on the flusher thread, and a leader that counts itself only once its own fdatasync
    returned rarely commits before both followers' fdatasyncs (started as it started its own) are
    back: a gated crash saw no majority without the newest acknowledged message in 774 frozen
    checks (seed 648627619). Patches ``DLedgerSyncObj._dl_on_append_entries`` (to note the
    message's entry count), ``ReplicaCore.ack_ready`` and ``ReplicaCore._maybe_flush``; logs how
    many answers went out early."""
    from dledger.replica import ReplicaCore
    from dledger.syncobj_patch import DLedgerSyncObj

    early = [0]
    on_append = DLedgerSyncObj._dl_on_append_entries

    def _dl_on_append_entries(self: Any, node: Any, message: dict[str, Any]) -> None:
        self.dl_plant_entries = len(message.get("entries") or ())
        try:
            on_append(self, node, message)
        finally:
            self.dl_plant_entries = 0

    ack_ready = ReplicaCore.ack_ready

    def ack_ready_(self: Any, node: Any, next_index: int) -> bool:
        if ack_ready(self, node, next_index):
            return True
        held = self._held_acks.get(node)
        if getattr(self.sync, "dl_plant_entries", 0) > 1 and held is not None and held[0] == next_index:
            # ack_ready held it: send it now instead, and forget it (the flush would send it again)
            del self._held_acks[node]
            self.dl_plant_lazy = True
            early[0] += 1
            if early[0] in (1, 10, 100) or early[0] % 1000 == 0:
                logging.getLogger("dledger.plant").warning(
                    "follower-ack-before-fsync: %d answers to multi-entry appends sent before fdatasync", early[0])
            return True
        return False

    maybe_flush = ReplicaCore._maybe_flush

    def _maybe_flush(self: Any) -> None:
        if getattr(self, "dl_plant_lazy", False):
            if self._clock.monotonic() - self._last_flush < self.settings.flush_interval_ms / 1000:
                return  # the answer left already: sync later, as the asynchronous policy would
            self.dl_plant_lazy = False
        maybe_flush(self)

    _patch(DLedgerSyncObj, "_dl_on_append_entries", _dl_on_append_entries)
    _patch(ReplicaCore, "ack_ready", ack_ready_)
    _patch(ReplicaCore, "_maybe_flush", _maybe_flush)


def cq_drops_last_unit() -> None:
    """After ``MessageStore.open`` (recovery) every non-empty consume queue loses its last unit:
    the next message of that queue takes the dropped one's offset on this replica only."""
    from broker.store.message_store import MessageStore

    original = MessageStore.open

    def open_(self: Any, log_store: Any) -> None:
        original(self, log_store)
        for _topic, _qid, cq in self.cqs.queues():
            if cq.max_offset > cq.min_offset:
                cq.truncate(cq.max_offset - 1)

    _patch(MessageStore, "open", open_)


def stock_truncation() -> None:
    """pysyncobj 0.3.17's own AppendEntries handling instead of dledger's fixes (syncobj_patch,
    "follower truncation" and "leader nextIndex rewind"): a follower deletes everything after
    ``prevLogIdx`` whenever it holds more, conflicting or not, and re-appends; a leader takes every
    success ack's ``next_node_idx`` as the follower's nextIndex even when newer batches are in flight.

    Patches ``dledger.syncobj_patch.align_append_entries`` (which ``_dl_on_append_entries`` calls)
    to leave every message as it came, with no truncation skipped — SyncObj then truncates as
    stock — and wraps ``DLedgerSyncObj._dl_on_next_node_idx`` to set nextIndex back to the ack's
    ``next_node_idx`` after every success ack that raised matchIndex (what SyncObj does, and what
    dledger undoes when that moves nextIndex back)."""
    from dledger import syncobj_patch
    from dledger.syncobj_patch import RAFT_STATE_LEADER, DLedgerSyncObj

    def align_append_entries(message: Any, *_args: Any) -> tuple[Any, bool]:
        return message, False

    _patch(syncobj_patch, "align_append_entries", align_append_entries)
    original = DLedgerSyncObj._dl_on_next_node_idx

    def on_next_node_idx(self: Any, node: Any, message: Any) -> None:
        match = self._SyncObj__raftMatchIndex.get(node)
        original(self, node, message)
        acked = int(message.get("next_node_idx", 0)) - 1
        if (
            self.dl_state == RAFT_STATE_LEADER
            and message.get("success")
            and not message.get("reset")
            and match is not None
            and acked > match
        ):
            self._SyncObj__raftNextIndex[node] = acked + 1  # stock: nextIndex follows the ack, even back

    _patch(DLedgerSyncObj, "_dl_on_next_node_idx", on_next_node_idx)


def offset_regress() -> None:
    """An ``offset.commit`` is applied like a reset: a value lower than the stored one replaces it
    (the replicated metadata's ``Metadata._offsets`` ignores its ``reset`` argument)."""
    from broker.store.metadata import Metadata

    original = Metadata._offsets

    def _offsets(self: Any, cmd: Any, *, reset: bool) -> dict[str, Any]:
        return dict(original(self, cmd, reset=True))

    _patch(Metadata, "_offsets", _offsets)


def sendback_unchecked() -> None:
    """The send-back's edge checks taken out (issue 23): any group length, the derived topic, the
    group consuming the message's topic. Patches ``broker.edge.http_retry.check_group``,
    ``broker.service.send.check_group`` / ``is_topic`` and ``SendOps.group_consumes``."""
    from broker.edge import http_retry as retry_api
    from broker.service import send as service_send

    _patch(retry_api, "check_group", lambda group: group)
    _patch(service_send, "check_group", lambda group: group)
    _patch(service_send, "is_topic", lambda topic: True)
    _patch(service_send.SendOps, "group_consumes", lambda self, group, topic: True)


def apply_raises() -> None:
    """A record the apply refuses raises out of ``apply`` instead (the store before issue 23): every
    replica fails stop at the same committed entry, and again after each restart.
    Patches ``MessageStore._refuse``."""
    from broker.store.message_store import MessageStore
    from broker.store.record_rules import RECORD_REFUSED

    original = MessageStore._refuse

    def _refuse(self: Any, position: int, kind: str, refusal: Any) -> Any:
        if refusal.code != RECORD_REFUSED:  # a metadata command's own refusal: never raised, then or now
            return original(self, position, kind, refusal)
        raise ValueError(f"cannot apply the {kind} record at position {position}: {refusal.reason}")

    _patch(MessageStore, "_refuse", _refuse)


# -- client plants ---------------------------------------------------------------------------------
OLD_UNKNOWN_CODES = frozenset({"TIMEOUT", "SEND_TIMEOUT"})


def sdk_lost_connection_is_failure() -> None:
    """The SDK before it kept ``outcome_unknown`` across retries (commit c58266e), and calling a
    connection lost after the request went out (``CONNECTION_LOST``) a definite failure: a send is
    "definitely failed" unless its *last* attempt timed out. A send whose request reached a leader
    that died before answering is reported as not stored, although the entry may be on the
    followers, which commit it. (The exact old code set — CONNECTION_LOST unknown too — yields no
    definite failure at all behind Toxiproxy's client proxies: a dead broker behind a proxy is a
    lost connection, never a refused one.) Patches ``broker.client.producer.send_outcome_unknown``."""
    from broker.client import producer

    def send_outcome_unknown(earlier_unknown: bool, exc: Any) -> bool:
        return exc.code in OLD_UNKNOWN_CODES

    _patch(producer, "send_outcome_unknown", send_outcome_unknown)


@dataclasses.dataclass(frozen=True)
class Plant:
    name: str
    side: str  # "broker" (through DLEDGER_TEST_PLANT) | "client" (the chaos run process)
    function: Callable[[], None]
    defect: str

    @property
    def spec(self) -> str:
        return f"{__name__}:{self.function.__name__}"


PLANTS: dict[str, Plant] = {
    p.name: p
    for p in (
        Plant("ack-before-majority", "broker", ack_before_majority,
              "the leader counts its own log end as committed (ack before majority)"),
        Plant("fdatasync-noop", "broker", fdatasync_noop, "fdatasync is a no-op under SYNC_FLUSH"),
        Plant("follower-ack-before-fsync", "broker", follower_ack_before_fsync,
              "a follower acknowledges a multi-entry append before its fdatasync"),
        Plant("cq-drops-last-unit", "broker", cq_drops_last_unit,
              "recovery drops each consume queue's last unit"),
        Plant("stock-truncation", "broker", stock_truncation,
              "followers truncate entries that do not conflict (stock pysyncobj), with the stock leader rewind"),
        Plant("offset-regress", "broker", offset_regress,
              "the broker accepts a consumer offset lower than the stored one"),
        Plant("sendback-unchecked", "broker", sendback_unchecked,
              "a send-back's group and stored message are not checked (over-long retry/DLQ topics reach the log)"),
        Plant("apply-raises", "broker", apply_raises,
              "a record the apply refuses raises instead: every replica stops at the same committed entry"),
        Plant("sdk-definite-on-lost-connection", "client", sdk_lost_connection_is_failure,
              "the SDK answers 'definitely failed' for sends that were stored (a lost connection is called a "
              "failure; only the last attempt counts)"),
    )
}


def lookup(names: list[str]) -> list[Plant]:
    """The plants named (ValueError naming the known ones otherwise)."""
    out = []
    for n in names:
        if n not in PLANTS:
            raise ValueError(f"unknown plant {n!r}; known: {', '.join(PLANTS)}")
        out.append(PLANTS[n])
    return out


def broker_env(plants: list[Plant]) -> dict[str, str]:
    """The environment that plants the broker-side ones in every broker process."""
    specs = [p.spec for p in plants if p.side == "broker"]
    return {PLANT_ENV: ",".join(specs)} if specs else {}


def apply_client(plants: list[Plant]) -> None:
    """Plant the client-side ones in this process."""
    for p in plants:
        if p.side == "client":
            p.function()
