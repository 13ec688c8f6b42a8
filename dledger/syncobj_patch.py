"""Everything dledger changes inside pysyncobj, pinned to pysyncobj 0.3.17 and kept in one place.

Every change answers a measured defect (../shared/notes/pysyncobj.md) and has a test in
tests/dledger/test_syncobj_patch.py that fails without it.

1. Journal seam: ``pysyncobj.syncobj.createJournal`` returns our ``RaftJournal`` when one is
   passed as ``journalFile`` (stock behaviour otherwise). Log compaction is disabled by config.
2. Follower truncation (defect 1): an AppendEntries whose entries already match the log no
   longer deletes anything. ``align_append_entries`` rewrites the message so that SyncObj
   truncates only at the first *conflicting* entry (Raft §5.3: "If an existing entry conflicts
   with a new one (same index but different terms), delete the existing entry and all that follow
   it"), and caps the commit index at the last entry the message verified (Figure 2:
   "commitIndex = min(leaderCommit, index of last new entry)").
3. Leader nextIndex rewind (defect 1, leader half): a success ack for an older batch no longer
   moves ``nextIndex`` back over batches still in flight.
4. Fair replication (defect 2) and no chunked path (defect 3): ``_SyncObj__sendAppendEntries``
   is replaced. Followers are served in rotating order with a per-call byte budget and a cap on
   bytes queued per connection; every entry, whatever its size, goes in one message (the chunked
   'transmission' path of 0.3.17 marks 'finish' against the wrong length). A follower whose next
   entry was removed by retention is sent ``dl_install`` (the anchor) instead of a snapshot.
5. Check-quorum (defect 4) is pysyncobj's ``leaderFallbackTimeout``, set from
   dLegerLeaderStepDownMs by the node: an isolated leader steps down after ~1.5 s, not 30 s.
6. Authentication (defect 5): ``DLedgerSyncObj`` refuses to start without a password, so every
   peer frame is authenticated before it is unpickled; read-only (unlisted) peers are refused.
   pysyncobj's Fernet encryptor is replaced by ``AeadEncryptor`` (AES-256-GCM, key from the
   password by PBKDF2): same three calls, same replay check on the timestamp, but binary frames.
   Measured: Fernet's base64 took 30 % of the leader's and 67 % of a follower's CPU at 18k msgs/s.
7. Wire encoding: frames are pickled with protocol 5 (bytes travel raw, not as latin-1 text) and
   zlib level 0 (stored blocks: still readable by stock peers). Measured: zlib took 58 % of the
   leader's CPU on incompressible 1 KiB bodies.
8. Durability before acknowledgement: ``DLedgerTransport.send`` calls the node's ``before_ack``
   (fdatasync under the sync flush policy) before any ``next_node_idx`` success leaves a follower.

Thread ownership: all of this runs on the node's tick thread; nothing here is called from the
event loop.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle as std_pickle
import struct
import zlib
from collections.abc import Callable
from typing import Any, Protocol

import pysyncobj.syncobj as _syncobj_mod
import pysyncobj.tcp_connection as _tcp_mod
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport
from pysyncobj.version import VERSION as PYSYNCOBJ_VERSION

from dledger import clock as dl_clock
from dledger.journal import RaftJournal

log = logging.getLogger(__name__)

PINNED_VERSION = "0.3.17"
RAFT_STATE_FOLLOWER, RAFT_STATE_CANDIDATE, RAFT_STATE_LEADER = 0, 1, 2
WIRE_PICKLE_PROTOCOL = 5
WIRE_ZLIB_LEVEL = 0


class PatchError(RuntimeError):
    """pysyncobj is not the version these patches were written and tested against."""


def check_pinned_version() -> None:
    if PYSYNCOBJ_VERSION != PINNED_VERSION:
        raise PatchError(
            f"dledger patches pysyncobj internals and is pinned to {PINNED_VERSION}; "
            f"found {PYSYNCOBJ_VERSION}. Install pysyncobj=={PINNED_VERSION}."
        )


class AeadEncryptor:
    """Authenticated encryption of peer frames: ``v1 | timestamp u64 | nonce(12) | ciphertext+tag``.

    The version byte and timestamp are authenticated (associated data). Nonces are an 8-byte random
    prefix per instance plus a 4-byte counter; the prefix is drawn again before the counter wraps,
    so a (key, nonce) pair is never reused in practice.
    """

    VERSION = b"\x01"
    _HEAD = struct.Struct("<cQ")
    SALT = b"dledger-peer-frames-v1"

    def __init__(self, password: str):
        key = hashlib.pbkdf2_hmac("sha256", password.encode(), self.SALT, 200_000, 32)
        self._aead = AESGCM(key)
        self._prefix = os.urandom(8)
        self._counter = 0

    def _nonce(self) -> bytes:
        self._counter += 1
        if self._counter >= 1 << 32:
            self._prefix, self._counter = os.urandom(8), 1
        return self._prefix + self._counter.to_bytes(4, "little")

    def encrypt_at_time(self, data: bytes, current_time: int) -> bytes:
        head = self._HEAD.pack(self.VERSION, current_time)
        nonce = self._nonce()
        return head + nonce + self._aead.encrypt(nonce, data, head)

    def extract_timestamp(self, token: bytes) -> int:
        if len(token) < self._HEAD.size + 12 + 16 or token[:1] != self.VERSION:
            raise ValueError("not a dledger peer frame")
        return int(self._HEAD.unpack_from(token, 0)[1])

    def decrypt(self, token: bytes) -> bytes:
        head, nonce = token[: self._HEAD.size], token[self._HEAD.size : self._HEAD.size + 12]
        return self._aead.decrypt(nonce, token[self._HEAD.size + 12 :], head)  # raises InvalidTag


def _get_encryptor(password: str) -> AeadEncryptor:
    return AeadEncryptor(password)


_original_create_journal = _syncobj_mod.createJournal
_installed = False


def _create_journal(journal_file: Any) -> Any:
    if isinstance(journal_file, RaftJournal):
        return journal_file
    return _original_create_journal(journal_file)


def _fast_send(self: Any, message: Any) -> None:
    """TcpConnection.send with pickle protocol 5 and zlib level 0 (see module doc, item 7)."""
    if self.sendRandKey:
        message = (self.sendRandKey, message)
    data = zlib.compress(std_pickle.dumps(message, WIRE_PICKLE_PROTOCOL), WIRE_ZLIB_LEVEL)
    if self.encryptor:
        data = self.encryptor.encrypt_at_time(data, int(_tcp_mod.monotonicTime()))
    self._TcpConnection__writeBuffer += struct.pack("i", len(data)) + data
    self._TcpConnection__trySendBuffer()


def install() -> None:
    """Apply the process-wide patches (idempotent)."""
    global _installed
    check_pinned_version()
    if _installed:
        return
    dl_clock.bind_pysyncobj()
    _syncobj_mod.createJournal = _create_journal
    _syncobj_mod.getEncryptor = _get_encryptor
    _tcp_mod.TcpConnection.send = _fast_send
    _installed = True


class NodeHooks(Protocol):
    """What DLedgerSyncObj asks of the node that owns it (all called on the tick thread)."""

    def before_ack(self) -> None: ...

    def on_install_anchor(self, anchor_index: int) -> None: ...

    def retention_floor(self) -> int: ...

    def on_leader_floor(self, floor: int) -> None: ...


class DLedgerTransport(TCPTransport):
    """TCPTransport that makes entries durable before a follower acknowledges them."""

    hooks: NodeHooks | None = None
    # Peers (by Raft address) whose traffic this node drops both ways: an in-process partition
    # for tests; chaos runs cut real links through Toxiproxy instead.
    blocked: frozenset[str] = frozenset()

    def send(self, node: Any, message: Any) -> bool:
        if node.address in self.blocked:
            return False
        hooks = self.hooks
        is_ack = type(message) is dict and message.get("type") == "next_node_idx" and message.get("success")
        if hooks is not None and is_ack:
            hooks.before_ack()
        return bool(super().send(node, message))

    def _onMessageReceived(self, node: Any, message: Any) -> None:
        if node.address in self.blocked:
            return
        super()._onMessageReceived(node, message)

    # Peer address (its identity, as announced) -> where to connect to reach it, when different
    # (a Toxiproxy proxy per link in chaos runs). Only the connecting side uses it.
    connect_via: dict[str, str] = {}

    def _connectIfNecessarySingle(self, node: Any) -> bool:
        via = self.connect_via.get(node.address)
        if via is None:
            return bool(super()._connectIfNecessarySingle(node))
        conn = self._connections.get(node)
        if conn is not None and conn.state != CONNECTION_STATE.DISCONNECTED:
            return True
        if not self._shouldConnect(node):
            return False
        last = self._lastConnectAttempt.get(node)
        if last is not None and dl_clock.current_monotonic() - last < self._syncObj.conf.connectionRetryTime:
            return False
        self._lastConnectAttempt[node] = dl_clock.current_monotonic()
        host, _, port = via.rpartition(":")
        return bool(self._connections[node].connect(host, int(port)))

    def pending_bytes(self, node: Any) -> int:
        conn = self._connections.get(node)
        if conn is None or conn.state != CONNECTION_STATE.CONNECTED:
            return 0
        return int(conn.getSendBufferSize())

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:
        # Unlisted ("readonly") peers would receive the whole log: refuse them.
        if message == "readonly" and (not self._syncObj.encryptor or conn.sendRandKey):
            conn.disconnect()
            self._unknownConnections.discard(conn)
            return
        super()._onIncomingMessageReceived(conn, message)


def align_append_entries(
    message: dict[str, Any], last_index: int, first_index: int, term_at: Callable[[int], int]
) -> tuple[dict[str, Any], bool]:
    """Rewrite an AppendEntries so SyncObj truncates only on a real conflict.

    Returns ``(message, skip_truncate)``. ``term_at(i)`` answers for ``first_index <= i <=
    last_index`` (``first_index`` is the oldest entry SyncObj can see, the anchor included).
    ``skip_truncate`` asks the journal to ignore the one ``deleteEntriesFrom`` SyncObj will call
    for entries after a fully matching message. Pure: no I/O besides ``term_at``.
    """
    prev = message.get("prevLogIdx")
    if prev is None or prev > last_index or prev < first_index:
        return message, False  # SyncObj answers "reset" by itself
    if term_at(prev) != message.get("prevLogTerm"):
        return message, False  # mismatch at prev: SyncObj answers "reset" at prev
    entries = message.get("entries") or []
    matched = 0
    for entry in entries:
        index, term = entry[1], entry[2]
        if index > last_index or term_at(index) != term:
            break
        matched += 1
    if matched == 0 and prev == last_index:
        return message, False  # plain append at the end: stock path is right
    verified = prev + matched
    out = dict(message)
    out["prevLogIdx"] = verified
    out["prevLogTerm"] = entries[matched - 1][2] if matched else message["prevLogTerm"]
    out["entries"] = entries[matched:]
    if matched == len(entries):
        # Every entry matched: nothing to add. SyncObj would still delete (verified, last];
        # those entries are unverified, not conflicting, so they stay (skip) and the commit
        # index may not pass what this message verified.
        out["commit_index"] = min(message["commit_index"], verified)
        return out, verified < last_index
    # A conflict (or the end of our log) at verified+1: SyncObj truncates exactly there.
    return out, False


class DLedgerSyncObj(SyncObj):
    """SyncObj with dledger's corrections; ticked by the node's own thread (autoTick off)."""

    def __init__(
        self,
        self_address: str,
        other_addresses: list[str],
        conf: SyncObjConf,
        journal: RaftJournal,
        hooks: NodeHooks,
        *,
        connect_via: dict[str, str] | None = None,
        per_call_budget_bytes: int = 4 << 20,
        max_queued_bytes: int = 8 << 20,
        batch_bytes: int = 1 << 20,
    ):
        install()
        if not conf.password:
            raise PatchError("a peer password is required: peer frames are pickles and must be authenticated")
        conf.journalFile = journal
        conf.bindAddress = conf.bindAddress or self_address  # never 0.0.0.0
        conf.autoTick = False
        conf.fullDumpFile = None
        conf.logCompactionMinEntries = 2**62
        conf.logCompactionMinTime = 10**12
        conf.dynamicMembershipChange = False
        conf.maxBindRetries = conf.maxBindRetries or 5
        conf.appendEntriesBatchSizeBytes = max(conf.appendEntriesBatchSizeBytes, batch_bytes)
        self.dl_journal = journal
        self.dl_hooks = hooks
        self.dl_per_call_budget_bytes = per_call_budget_bytes
        self.dl_max_queued_bytes = max_queued_bytes
        self.dl_batch_bytes = batch_bytes
        self.dl_rotation = 0
        self.dl_rewinds_prevented = 0
        self.dl_installs_sent = 0
        self.dl_last_install: dict[Any, float] = {}
        self.dl_appends_received = 0
        self.dl_last_append_at: float | None = None
        self.dl_max_append_gap_s = 0.0
        super().__init__(self_address, other_addresses, conf=conf, transportClass=DLedgerTransport)
        self.dl_transport: DLedgerTransport = self._SyncObj__transport
        self.dl_transport.hooks = hooks
        self.dl_transport.connect_via = dict(connect_via or {})

    # -- read-only views of SyncObj state (tick thread only) ---------------------------------
    @property
    def dl_state(self) -> int:
        return int(self._SyncObj__raftState)

    def dl_match_index(self) -> dict[Any, int]:
        return dict(self._SyncObj__raftMatchIndex)

    def dl_next_index(self) -> dict[Any, int]:
        return dict(self._SyncObj__raftNextIndex)

    def dl_last_response(self) -> dict[Any, float]:
        return dict(self._SyncObj__lastResponseTime)

    def dl_skip_replay(self, applied_index: int) -> None:
        """Before the first tick: SyncObj need not re-run entries that are already applied."""
        store = self.dl_journal.store
        floor = max(1, store.anchor[0])
        applied = max(floor, min(applied_index, store.last_index))
        self._SyncObj__raftLastApplied = applied
        self._SyncObj__raftCommitIndex = max(int(self.raftCommitIndex), applied)

    def dl_send_now(self) -> None:
        if self.dl_state == RAFT_STATE_LEADER:
            self._SyncObj__sendAppendEntries()

    # -- item 2, 3 and the install message: incoming messages ----------------------------------
    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        mtype = message.get("type") if type(message) is dict else None
        if mtype == "append_entries":
            self._dl_note_append(message)
            if "transmission" in message:
                log.error("dropping a chunked append_entries from %s: dledger peers never send them", node)
                return
            floor = message.get("dl_floor")
            if floor is not None and message.get("term", -1) >= self._SyncObj__raftCurrentTerm:
                self.dl_hooks.on_leader_floor(int(floor))
            if "prevLogIdx" in message:
                store = self.dl_journal.store
                first = store.anchor[0] if store.anchor[0] > 0 else 1
                message, skip = align_append_entries(message, store.last_index, first, self._dl_term_at)
                self.dl_journal.skip_next_truncate = skip
            try:
                SyncObj._SyncObj__onMessageReceived(self, node, message)
            finally:
                self.dl_journal.skip_next_truncate = False
            return
        if mtype == "dl_install":
            self._dl_on_install(node, message)
            return
        if mtype == "next_node_idx" and self.dl_state == RAFT_STATE_LEADER:
            next_index = self._SyncObj__raftNextIndex
            before = next_index.get(node)
            SyncObj._SyncObj__onMessageReceived(self, node, message)
            after = next_index.get(node)
            if (
                message.get("success")
                and not message.get("reset")
                and before is not None
                and after is not None
                and after < before
            ):
                next_index[node] = before
                self.dl_rewinds_prevented += 1
            return
        SyncObj._SyncObj__onMessageReceived(self, node, message)

    def _dl_note_append(self, message: dict[str, Any]) -> None:
        # Heartbeat spacing as this follower sees it (its own clock): the figure that shows a
        # leader's heartbeats keep their period whatever the clocks of the hosts do.
        if message.get("term", -1) < self._SyncObj__raftCurrentTerm:
            return
        now = dl_clock.current_monotonic()
        last = self.dl_last_append_at
        if last is not None:
            self.dl_max_append_gap_s = max(self.dl_max_append_gap_s, now - last)
        self.dl_last_append_at = now
        self.dl_appends_received += 1

    def _dl_term_at(self, index: int) -> int:
        store = self.dl_journal.store
        if index == store.last_index:
            return int(store.last_term)
        return int(self.dl_journal.entry_at_index(index).term)

    def _dl_on_install(self, node: Any, message: dict[str, Any]) -> None:
        term = message.get("term", -1)
        if term < self._SyncObj__raftCurrentTerm or node != self._SyncObj__raftLeader:
            return  # only the current leader may move our anchor; it retries
        anchor_index, anchor_term, anchor_chain = message["anchor"]
        store = self.dl_journal.store
        has_anchor = (
            store.anchor[0] <= anchor_index <= store.last_index
            and self._dl_term_at(anchor_index) == anchor_term
        )
        if not has_anchor:
            log.warning(
                "leader %s no longer holds our next entry: restarting the log after its anchor %d (term %d)",
                node,
                anchor_index,
                anchor_term,
            )
            store.reset(anchor_index, anchor_term, anchor_chain)
            self._SyncObj__raftLastApplied = anchor_index
            self._SyncObj__raftCommitIndex = max(self._SyncObj__raftCommitIndex, anchor_index)
            self.dl_journal.setRaftCommitIndex(self._SyncObj__raftCommitIndex)
            self.dl_hooks.on_install_anchor(anchor_index)
        self._SyncObj__raftElectionDeadline = dl_clock.current_monotonic() + self._SyncObj__generateRaftTimeout()
        self.dl_transport.send(
            node,
            {"type": "next_node_idx", "next_node_idx": anchor_index + 1, "reset": True, "success": False},
        )

    # -- item 4: replication --------------------------------------------------------------------
    def _SyncObj__sendAppendEntries(self) -> None:
        self._SyncObj__newAppendEntriesTime = dl_clock.current_monotonic() + self._SyncObj__conf.appendEntriesPeriod
        nodes = sorted(self._SyncObj__otherNodes, key=lambda n: n.id)
        if not nodes:
            return
        self.dl_rotation = (self.dl_rotation + 1) % len(nodes)
        connected = self._SyncObj__connectedNodes
        for node in nodes[self.dl_rotation :] + nodes[: self.dl_rotation]:
            if node in connected:
                self._dl_replicate_to(node)

    def _dl_replicate_to(self, node: Any) -> None:
        store = self.dl_journal.store
        transport = self.dl_transport
        if transport.pending_bytes(node) > self.dl_max_queued_bytes:
            return  # the connection is clogged: anything more would only queue in RAM
        next_index = self._SyncObj__raftNextIndex[node]
        anchor_index = store.anchor[0]
        if anchor_index > 0 and next_index <= anchor_index:
            self._dl_send_install(node)
            return
        term = self._SyncObj__raftCurrentTerm
        floor = self.dl_hooks.retention_floor()
        sent_bytes = 0
        first_message = True
        while True:
            prev = next_index - 1
            visible_first = anchor_index if anchor_index > 0 else 1
            prev_term = self._dl_term_at(prev) if prev >= visible_first else None
            entries: list[tuple[bytes, int, int]] = []
            if next_index <= store.last_index:
                batch = store.read_range(next_index, 100_000, self.dl_batch_bytes)
                entries = [(e.body, e.index, e.term) for e in batch]
            if not entries and not first_message:
                return
            message = {
                "type": "append_entries",
                "term": term,
                "commit_index": int(self._SyncObj__raftCommitIndex),
                "entries": entries,
                "prevLogIdx": prev if prev_term is not None else None,
                "prevLogTerm": prev_term,
                "dl_floor": floor,
            }
            if not transport.send(node, message):
                return
            first_message = False
            if not entries:
                return
            next_index = entries[-1][1] + 1
            self._SyncObj__raftNextIndex[node] = next_index
            sent_bytes += sum(len(e[0]) for e in entries)
            if (
                sent_bytes >= self.dl_per_call_budget_bytes
                or transport.pending_bytes(node) > self.dl_max_queued_bytes
            ):
                return

    def _dl_send_install(self, node: Any) -> None:
        now = dl_clock.current_monotonic()
        last = self.dl_last_install.get(node)
        if last is not None and now - last < 1.0:
            return
        self.dl_last_install[node] = now
        self.dl_installs_sent += 1
        anchor = self.dl_journal.store.anchor
        log.info("follower %s needs entries before our anchor %d: sending dl_install", node, anchor[0])
        self.dl_transport.send(
            node, {"type": "dl_install", "term": self._SyncObj__raftCurrentTerm, "anchor": tuple(anchor)}
        )
