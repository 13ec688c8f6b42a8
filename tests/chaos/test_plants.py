"""Each plant of chaos/plants.py puts its defect in, shown on the smallest piece it patches, and
``unplant_all`` takes it out again (the sensitivity tier, tests/chaos/test_sensitivity.py, shows the
audit catching each one in a real run)."""

from __future__ import annotations

import collections
import os
import types
from collections.abc import Iterator
from typing import Any

import pytest
from pysyncobj import SyncObjConf

from broker.client import ClientError, Message, Producer
from broker.serving.process_main import PLANT_ENV
from broker.store.message import StoredMessage, encode_message
from broker.store.message_store import MessageStore
from broker.store.metadata import Metadata
from chaos import plants
from dledger import clock as dl_clock
from dledger import command_codec
from dledger.entry_store import EntryStore
from dledger.flusher import SyncFlusher
from dledger.journal import RaftJournal
from dledger.peer_tcp import TcpPeerTransport
from dledger.records import to_committed
from dledger.replica import ReplicaCore
from dledger.syncobj_patch import RAFT_STATE_LEADER, DLedgerSyncObj
from tests.acl_fixtures import PRODUCER
from tests.broker.inproc_cluster import InProcBrokerCluster
from tests.dledger.harness import PASSWORD, StubHooks, free_ports


@pytest.fixture(autouse=True)
def _unplant() -> Iterator[None]:
    yield
    plants.unplant_all()


@pytest.fixture
def make_syncobj(tmp_path: Any) -> Iterator[Any]:
    made: list[DLedgerSyncObj] = []

    def make() -> DLedgerSyncObj:
        ports = free_ports(2)
        store = EntryStore(str(tmp_path / f"store{len(made)}"), segment_bytes=1 << 24)
        journal = RaftJournal(store, str(tmp_path / f"meta{len(made)}"))
        conf = SyncObjConf(appendEntriesPeriod=0.05)
        sync = DLedgerSyncObj(
            f"127.0.0.1:{ports[0]}", [f"127.0.0.1:{ports[1]}"], conf, journal, StubHooks(),
            transport_factory=lambda so, sn, on: TcpPeerTransport(so, sn, on, password=PASSWORD, group="G"),
        )
        made.append(sync)
        return sync

    yield make
    for sync in made:
        sync._doDestroy()


def fill(sync: DLedgerSyncObj, count: int, term: int = 1) -> None:
    store = sync.dl_journal.store
    for _ in range(count):
        store.append(store.last_index + 1, term, command_codec.encode_batch([os.urandom(64)]))


def append_message(sync: DLedgerSyncObj, prev: int, upto: int, commit: int) -> dict[str, Any]:
    store = sync.dl_journal.store
    return {
        "type": "append_entries", "term": 1, "commit_index": commit, "prevLogIdx": prev,
        "prevLogTerm": store.term_at(prev),
        "entries": [(store.read(i).body, i, store.read(i).term) for i in range(prev + 1, upto + 1)],
    }


def test_registry_names_every_plant_and_builds_the_broker_environment() -> None:
    assert set(plants.PLANTS) == {
        "ack-before-majority", "fdatasync-noop", "follower-ack-before-fsync", "cq-drops-last-unit",
        "stock-truncation", "offset-regress", "sendback-unchecked", "apply-raises", "sdk-definite-on-lost-connection",
    }
    chosen = plants.lookup(["stock-truncation", "sdk-definite-on-lost-connection"])
    assert plants.broker_env(chosen) == {PLANT_ENV: "chaos.plants:stock_truncation"}
    assert plants.broker_env(plants.lookup(["sdk-definite-on-lost-connection"])) == {}
    with pytest.raises(ValueError, match="unknown plant 'nope'"):
        plants.lookup(["nope"])


def test_stock_truncation_deletes_entries_that_do_not_conflict_and_rewinds(make_syncobj: Any) -> None:
    leader_log = make_syncobj()
    fill(leader_log, 30)
    follower = make_syncobj()
    node = next(iter(follower.otherNodes))
    plants.stock_truncation()
    follower._SyncObj__onMessageReceived(node, append_message(leader_log, 1, 31, commit=10))
    follower._SyncObj__onMessageReceived(node, append_message(leader_log, 1, 11, commit=10))  # an older batch
    # everything after prevLogIdx went (30 entries; 10 of them came straight back): 20 are missing
    assert follower.dl_journal.store.last_index == 11 and follower.dl_journal.entries_truncated == 30
    # leader half: an ack of an older batch moves nextIndex back over batches in flight
    leader_log._SyncObj__raftState = RAFT_STATE_LEADER
    peer = next(iter(leader_log.otherNodes))
    leader_log._SyncObj__raftNextIndex[peer], leader_log._SyncObj__raftMatchIndex[peer] = 31, 0
    ack = {"type": "next_node_idx", "next_node_idx": 11, "reset": False, "success": True}
    leader_log._SyncObj__onMessageReceived(peer, ack)
    assert leader_log._SyncObj__raftNextIndex[peer] == 11
    plants.unplant_all()
    follower._SyncObj__onMessageReceived(node, append_message(leader_log, 11, 31, commit=10))
    follower._SyncObj__onMessageReceived(node, append_message(leader_log, 1, 11, commit=10))
    assert follower.dl_journal.store.last_index == 31 and follower.dl_journal.entries_truncated == 30


def test_ack_before_majority_commits_the_leaders_log_end(make_syncobj: Any) -> None:
    sync = make_syncobj()
    fill(sync, 5)  # 2..6 (1 is SyncObj's no-op)
    sync._SyncObj__raftState = RAFT_STATE_LEADER
    for node in sync.otherNodes:
        sync._SyncObj__raftMatchIndex[node] = 0
        sync._SyncObj__raftNextIndex[node] = 1
        sync._SyncObj__lastResponseTime[node] = dl_clock.current_monotonic()
    sync._onTick(0)
    assert sync.raftCommitIndex <= 1  # the one follower has nothing: nothing new may commit
    plants.ack_before_majority()
    sync._onTick(0)
    assert sync.raftCommitIndex == sync.dl_journal.store.last_index == 6


def test_fdatasync_noop_never_syncs_the_log(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: synced.append(fd) or real(fd))
    store = EntryStore(str(tmp_path / "s"), segment_bytes=1 << 20)
    try:
        store.append(1, 1, b"a")
        store.flush()
        assert synced
        synced.clear()
        plants.fdatasync_noop()
        store.append(2, 1, b"b")
        store.flush()
        assert not synced and not store.dirty
    finally:
        store.close()


class SyncingHooks(ReplicaCore):
    """The replica's own ``ack_ready`` (a success answer waits until what it covers is durable,
    under the sync policy) and its flush (``tick``: the end of the replica's tick, with the flush
    run at once), and nothing else of it."""

    def __init__(self, store: EntryStore):  # deliberately not ReplicaCore.__init__: hooks only
        self.settings = types.SimpleNamespace(flush_policy="sync", flush_interval_ms=500)  # type: ignore[assignment]
        self.store = store
        self._clock = dl_clock.ManualClock()
        self.counters = collections.Counter()
        self.observe = lambda _name, _value: None
        self._durable_index = store.last_index
        self._own_floor = 0
        self._held_acks = {}
        self._log_epoch = 0
        self._flusher = SyncFlusher()
        self._flush_in_flight = False
        self._last_flush = 0.0
        self.sync = None

    def tick(self, wait_s: float = 0.0) -> None:
        self._maybe_flush()

    def on_install_anchor(self, anchor_index: int) -> None: ...


def test_follower_ack_before_fsync_answers_a_multi_entry_append_from_the_page_cache(
    tmp_path: Any, make_syncobj: Any
) -> None:
    leader_log = make_syncobj()
    fill(leader_log, 8)  # 2..9 (1 is SyncObj's no-op)
    store = EntryStore(str(tmp_path / "follower"), segment_bytes=1 << 24)
    hooks = SyncingHooks(store)
    ports = free_ports(2)
    follower = DLedgerSyncObj(
        f"127.0.0.1:{ports[0]}", [f"127.0.0.1:{ports[1]}"], SyncObjConf(appendEntriesPeriod=0.05),
        RaftJournal(store, str(tmp_path / "meta")), hooks,
        transport_factory=lambda so, sn, on: TcpPeerTransport(so, sn, on, password=PASSWORD, group="G"),
    )
    hooks.sync = follower  # type: ignore[assignment]
    acks: list[tuple[int, bool]] = []  # (acknowledged index, the log still dirty when the answer left)

    def send(node: Any, message: dict[str, Any]) -> bool:
        if message.get("type") == "next_node_idx" and message.get("success"):
            acks.append((message["next_node_idx"] - 1, store.dirty))
        return True

    follower.dl_transport.send = send
    node = next(iter(follower.otherNodes))
    try:
        for first, end in ((1, 4), (4, 5), (5, 8)):  # sound, then planted: one entry, three entries
            if first == 4:
                plants.follower_ack_before_fsync()
            follower._SyncObj__onMessageReceived(node, append_message(leader_log, first, end, commit=0))
            hooks.tick()
        # fdatasync before the answer, except for the planted multi-entry case: from the page cache
        assert acks == [(4, False), (5, False), (8, True)]
        # and its fdatasync waits for the flush interval, as under the asynchronous policy
        assert store.dirty
        hooks._clock.advance(0.5)
        hooks.tick()
        assert not store.dirty
    finally:
        follower._doDestroy()


def _message(uid: str) -> bytes:
    return encode_message(StoredMessage(topic="T", queue_id=0, flag=0, tags="", keys=(), properties={}, born_ts=1,
                                        born_host="h", store_ts=1, unique_id=uid, body=b"x"))


def test_cq_drops_last_unit_on_recovery(tmp_path: Any) -> None:
    log = EntryStore(str(tmp_path / "log"), segment_bytes=1 << 20)

    def reopen() -> MessageStore:
        ms = MessageStore(str(tmp_path / "broker"), "G", snapshot_interval_ms=600_000)
        ms.open(log)
        return ms

    ms = reopen()
    for i in range(1, 4):
        log.append(i, 1, command_codec.encode_batch([_message(f"U{i}")]))
        ms.apply([to_committed(log.read(i), log)])
    ms.close()
    ms.cqs.close()
    ms.index.close()
    plants.cq_drops_last_unit()
    ms = reopen()
    try:
        cq = ms.cqs.get("T", 0)
        assert cq is not None and cq.max_offset == 2  # three messages, two units
    finally:
        ms.cqs.close()
        ms.index.close()
        log.close()


def test_offset_regress_applies_a_lower_commit() -> None:
    md = Metadata()
    commit = {"op": "offset.commit", "group": "g", "topic": "T"}
    md.apply({**commit, "offsets": {"0": 5}})
    md.apply({**commit, "offsets": {"0": 3}})
    assert md.group_offsets("g", "T") == {0: 5}
    plants.offset_regress()
    md.apply({**commit, "offsets": {"0": 2}})
    assert md.group_offsets("g", "T") == {0: 2}


def test_apply_raises_stops_applying_at_a_record_the_store_refuses(tmp_path: Any) -> None:
    log = EntryStore(str(tmp_path / "log"), segment_bytes=1 << 20)
    ms = MessageStore(str(tmp_path / "broker"), "G", snapshot_interval_ms=600_000)
    ms.open(log)
    try:
        poison = encode_message(StoredMessage(topic="%DLQ%" + "g" * 200, queue_id=0, flag=0, tags="", keys=(),
                                              properties={}, born_ts=1, born_host="h", store_ts=1, unique_id="U",
                                              body=b"x"))
        log.append(1, 1, command_codec.encode_batch([poison]))
        (refused,) = ms.apply([to_committed(log.read(1), log)])
        assert refused is not None and refused[0].code == "RECORD_REFUSED"
        plants.apply_raises()
        log.append(2, 1, command_codec.encode_batch([poison]))
        with pytest.raises(ValueError, match="cannot apply the message record"):
            ms.apply([to_committed(log.read(2), log)])
    finally:
        ms.close()
        log.close()


def test_sendback_unchecked_lets_any_group_through() -> None:
    from broker.edge import http_retry as retry_api
    from broker.service import send as service_send

    long_group = "g" * 200
    with pytest.raises(Exception, match="at most 120 characters"):
        service_send.check_group(long_group)
    plants.sendback_unchecked()
    assert service_send.check_group(long_group) == retry_api.check_group(long_group) == long_group
    assert service_send.is_topic("%DLQ%" + long_group) and service_send.SendOps.group_consumes(None, "g", "T")


async def test_sdk_plant_calls_a_maybe_stored_send_failed(tmp_path: Any) -> None:
    from broker.client import producer

    lost = ClientError("CONNECTION_LOST", "the server closed the connection")
    assert producer.send_outcome_unknown(False, lost)
    baseline = InProcBrokerCluster.baseline()
    cluster = await InProcBrokerCluster.start(str(tmp_path / "cluster"))
    outcomes = []
    try:
        await cluster.create_topic("T", 4)
        leader = cluster.groups[0].replicas[0]
        async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER, retry_times=1) as p:
            for plant in (False, True):
                if plant:
                    plants.sdk_lost_connection_is_failure()
                leader.tap.fail("/v1/send", "SEND_TIMEOUT", 504)  # the first attempt may have stored it
                leader.tap.fail("/v1/send", "NO_PERMISSION", 403)  # the retry is refused
                with pytest.raises(ClientError) as e:
                    await p.send(Message("T", b"x"))
                outcomes.append((e.value.code, e.value.outcome_unknown))
    finally:
        await cluster.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)
    assert outcomes == [("NO_PERMISSION", True), ("NO_PERMISSION", False)]
    assert not producer.send_outcome_unknown(False, lost)  # planted: the request went out, yet "failed"
