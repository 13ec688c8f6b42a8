"""Issue 23, finding 1 (b): a committed record that cannot be applied is refused — by every replica
alike, recorded and listed — instead of stopping the replica; a bug in the effects still stops it.

Built on the real writers: broker records in a real ``EntryStore``, applied by real ``MessageStore``s
the way a replica's tick thread applies them (broker/store/record_rules.py holds the rules).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from broker.protocol.properties import (
    HALF_TOPIC,
    PROP_DUE_MS,
    PROP_HALF_POS,
    PROP_PGROUP,
    PROP_REAL_TOPIC,
    PROP_SCHED_POS,
    SCHEDULE_TOPIC,
)
from broker.store.consume_queue import ConsumeQueue
from broker.store.message import StoredMessage, encode_command, encode_message
from broker.store.message_store import MessageNotFound, MessageStore
from broker.store.record_rules import RECORD_REFUSED, admit_command, admit_message
from dledger import command_codec
from dledger.entry_store import EntryStore
from dledger.node import CommittedEntry
from dledger.records import Refused, to_committed

LONG_DLQ = "%DLQ%" + "g" * 200  # what a send-back for a 200-character group made (the finding)


def message(topic: str = "T", body: bytes = b"m", uid: str = "U", *, queue_id: int = 0, store_ts: int = 1,
            properties: dict[str, Any] | None = None, keys: tuple[str, ...] = ("k",)) -> bytes:
    return encode_message(StoredMessage(topic=topic, queue_id=queue_id, flag=0, tags="t", keys=keys,
                                        properties=properties or {}, born_ts=1, born_host="h", store_ts=store_ts,
                                        unique_id=uid, body=body))


TOPIC_PUT = encode_command({"op": "topic.put", "topic": "T", "read_queue_nums": 1, "write_queue_nums": 1, "perm": 6})
# Each: a record whose effect raised before issue 23 (every replica stopped at it), and why.
POISON = {
    "topic too long for a queue directory": message(LONG_DLQ),
    "topic with a path separator": message("a/b"),
    "negative queue id": message(queue_id=-1),
    "store time below the unit's range": message(store_ts=-1),
    "schedule position beyond 64 bits": message(properties={PROP_SCHED_POS: "9" * 30}),
    "half position of the wrong type": message(properties={PROP_HALF_POS: ["1"]}),
    "schedule record with a list due time": message(SCHEDULE_TOPIC, properties={PROP_DUE_MS: [1]}),
    "half with a non-string group": message(HALF_TOPIC, properties={PROP_PGROUP: {"g": 1}, PROP_REAL_TOPIC: "T"}),
    "command positions beyond 64 bits": encode_command({"op": "schedule.drop", "positions": [2**63]}),
    "command positions not a list": encode_command({"op": "txn.discard", "positions": 5}),
    "transaction end position beyond 64 bits": encode_command({"op": "txn.end", "position": 2**64 - 1,
                                                               "state": "ROLLBACK"}),
    "command map with an unhashable key": b"C" + msgpack.packb({(1, 2): 1, "op": "topic.put"}),
    "undecodable command": b"C\xc1\xc1",
    "undecodable message": b"N\x05\x00\x00\x00\xc1",
    "unknown record kind": b"?junk",
}


class Replica:
    """One replica's log and store on disk (the real writers), applied by hand."""

    def __init__(self, root: str):
        self.root = root
        self.log = EntryStore(os.path.join(root, "log"), segment_bytes=1 << 20)
        self.ms = self._open()

    def _open(self) -> MessageStore:
        ms = MessageStore(os.path.join(self.root, "broker"), "G", snapshot_interval_ms=600_000)
        ms.open(self.log)
        return ms

    def append(self, records: list[bytes]) -> CommittedEntry:
        index = self.log.last_index + 1
        self.log.append(index, 1, command_codec.encode_batch(records))
        self.log.flush()
        return to_committed(self.log.read(index), self.log)

    def apply(self, records: list[bytes]) -> list[Any]:
        out = self.ms.apply([self.append(records)])
        return list(out[0] or [])

    def reopen(self, *, lose_queues: bool = False) -> None:
        self.ms.close()
        if lose_queues:  # a crash that took the consume queues, the key index and the snapshot
            shutil.rmtree(os.path.join(self.root, "broker"))
        self.ms = self._open()
        for index in range(self.ms.applied_index() + 1, self.log.last_index + 1):  # what the node re-applies
            self.ms.apply([to_committed(self.log.read(index), self.log)])

    def state(self) -> dict[str, Any]:
        ms = self.ms
        return {
            "queues": [(t, q, cq.min_offset, cq.max_offset) for t, q, cq in ms.cqs.queues()],
            "metadata": ms.metadata_view().to_snapshot(),
            "pending_schedule": ms.schedule.rows(),
            "refusals": ms.refusals.view(),
            "applied": ms.applied_index(),
        }

    def close(self) -> None:
        self.ms.close()
        self.log.close()


@pytest.fixture
def replicas(tmp_path: Any) -> Iterator[list[Replica]]:
    rs = [Replica(str(tmp_path / f"n{i}")) for i in range(3)]
    try:
        yield rs
    finally:
        for r in rs:
            r.close()


@pytest.mark.parametrize("what", sorted(POISON))
def test_admission_refuses_what_no_effect_could_apply(what: str) -> None:
    record = POISON[what]
    admitted, refusal = (admit_command if record[:1] == b"C" else admit_message)(record)
    assert admitted is None and refusal is not None and refusal.code == RECORD_REFUSED and refusal.reason


def test_admission_takes_what_the_service_writes() -> None:
    for record in (message(), message("%RETRY%" + "g" * 120), message(queue_id=1023, store_ts=2**62),
                   message(properties={PROP_SCHED_POS: "12", "user": "v"}),
                   message(properties={PROP_HALF_POS: "not a number"})):  # an effect skips this one, as before
        h, refusal = admit_message(record)
        assert h is not None and refusal is None
    for cmd in ({"op": "schedule.drop", "positions": [1, 2]}, {"op": "txn.end", "position": 5, "state": "ROLLBACK"},
                {"op": "no.such.op"}, {"op": "topic.put", "topic": LONG_DLQ}):  # metadata answers those itself
        got, refusal = admit_command(encode_command(cmd))
        assert got == cmd and refusal is None


@pytest.mark.parametrize("what", sorted(POISON))
def test_a_poison_record_is_refused_alike_by_every_replica_which_keep_applying(
    replicas: list[Replica], what: str
) -> None:
    """Before the fix the first poison record raised out of ``apply`` (the tick thread, then the
    process, died on every replica). Now: grouped with good records into one entry, it is refused on
    every replica, the good ones are applied, and the state and the refusal list are the same."""
    outs = []
    for r in replicas:
        r.apply([TOPIC_PUT])
        outs.append(r.apply([message(uid="A"), POISON[what], message(uid="B")]))
        r.apply([message(uid="C")])
    assert outs[0] == outs[1] == outs[2]
    first, refusal, second = outs[0]
    assert (first, second) == (0, 1) and isinstance(refusal, Refused) and refusal.code == RECORD_REFUSED
    states = [r.state() for r in replicas]
    assert states[0] == states[1] == states[2]
    assert states[0]["refusals"]["total"] == 1
    (listed,) = states[0]["refusals"]["recent"]
    assert listed["index"] == 2 and listed["reason"] == refusal.reason and listed["kind"] in ("message", "command",
                                                                                              "record")
    assert ("T", 0, 0, 3) in states[0]["queues"] and replicas[0].ms.counters["refused"] == 1


def test_the_refusal_list_and_the_queues_survive_a_restart_and_a_rebuild(replicas: list[Replica]) -> None:
    """The list is in the snapshot; queues, key index and de-duplication window rebuilt from the log
    skip refused records exactly as applying did (a rebuild that counted one would shift offsets)."""
    a, b, _c = replicas
    refused_in_t = message(uid="X", keys=("k1",), properties={PROP_SCHED_POS: "9" * 30})  # a valid topic
    for r in (a, b):
        r.apply([TOPIC_PUT])
        r.apply([message(uid="A", keys=("k1",)), refused_in_t, message(uid="B")])
        r.apply([message(LONG_DLQ, uid="Y"), message(store_ts=-5, uid="Z")])
        r.apply([message(uid="C", keys=("k1",))])
    before = a.state()
    assert before["refusals"]["total"] == 3 and ("T", 0, 0, 3) in before["queues"]
    a.reopen()  # from its snapshot
    assert a.state() == before
    b.ms.snapshot(wait=True)
    b.reopen(lose_queues=True)  # no snapshot, no queues, no index: all re-derived by applying the log again
    assert b.state()["queues"] == before["queues"] and b.state()["refusals"] == before["refusals"]
    for r in (a, b):
        assert len(r.ms.index.query("T", "k1", 10)) == 2  # A and C, not X
        assert r.ms.dedup.lookup("T", "X") is None and r.ms.dedup.lookup("T", "C") is not None


def test_a_lost_consume_queue_is_rebuilt_without_the_refused_records(replicas: list[Replica]) -> None:
    """``_queue_members`` (the rebuild of a damaged queue from the log, counted back from the
    snapshot's max offset) skips refused records as applying did."""
    r = replicas[0]
    r.apply([TOPIC_PUT])
    r.apply([message(uid="A"), message(uid="X", properties={PROP_HALF_POS: ["1"]}), message(uid="B")])
    r.ms.snapshot(wait=True)
    before = r.state()
    r.ms.close()
    shutil.rmtree(os.path.join(r.root, "broker", "consumequeue", "T"))
    r.ms = r._open()
    assert r.state()["queues"] == before["queues"] == [("T", 0, 0, 2)]
    assert r.ms.counters["rebuilt_queues"] == 1
    cq = r.ms.cqs.get("T", 0)
    assert cq is not None
    units = [cq.get(o) for o in range(2)]
    assert [r.ms.read_message(u.position).unique_id for u in units if u is not None] == ["A", "B"]


def test_a_refused_record_is_never_served_by_its_position(replicas: list[Replica]) -> None:
    r = replicas[0]
    r.apply([TOPIC_PUT])
    entry = r.append([message(LONG_DLQ, body=b"secret")])
    r.ms.apply([entry])
    position = entry.bodies[0][0]
    with pytest.raises(MessageNotFound, match="refused"):
        r.ms.read_message(position)


def test_an_exception_in_an_effect_still_stops_applying(replicas: list[Replica], monkeypatch: Any) -> None:
    """A failure admission cannot decide from the record (here: the disk under a consume queue) is
    not refused: it leaves ``apply`` (and the node stops the replica, loudly: StateMachineError)."""
    r = replicas[0]
    r.apply([TOPIC_PUT])

    def broken_disk(*_args: Any) -> int:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(ConsumeQueue, "append", broken_disk)
    with pytest.raises(OSError, match="Input/output"):
        r.apply([message()])
    assert r.ms.refusals.total == 0
