"""The store's apply path, made cheaper per message, gives what the plain forms gave: each fast path
here is pinned to a reference (the earlier code, kept in the test) on the same inputs."""

from __future__ import annotations

import collections
import random
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker.protocol.properties import (
    HALF_TOPIC,
    PROP_CHECK_IMMUNITY,
    PROP_DUE_MS,
    PROP_HALF_POS,
    PROP_LEVEL,
    PROP_PGROUP,
    PROP_REAL_TOPIC,
    PROP_SCHED_POS,
    SCHEDULE_TOPIC,
)
from broker.store.dedup import DedupWindow, FirstSend, deduplicated_topic, sent_topic
from broker.store.message import (
    MESSAGE_MAGIC,
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGICS,
    RecordHeader,
    StoredMessage,
    decode_header,
    decode_header_fields,
    encode_message,
)
from broker.store.record_rules import admit_message, admitted_fields, message_refusal, refused
from broker.store.schedule import ScheduleIndex
from broker.store.transactions import TransactionIndex
from dledger.records import Refused


class ReferenceWindow:
    """The de-duplication window as an ordered dict (the form before the deque of entries): a key
    added again moves to the back, and the front is evicted while it no longer counts."""

    def __init__(self, max_messages: int, window_ms: int) -> None:
        self.max_messages, self.window_ms = max_messages, window_ms
        self.entries: collections.OrderedDict[tuple[str, str], tuple[int, ...]] = collections.OrderedDict()
        self.seq = 0
        self.max_ts = 0

    def counts(self, e: tuple[int, ...]) -> bool:
        return e[5] > self.seq - self.max_messages and e[3] >= self.max_ts - self.window_ms

    def add_many(self, adds: list[tuple[str, str, int, int, int, int, int]]) -> None:
        for topic, uid, position, qid, offset, ts, index in adds:
            if not uid or not deduplicated_topic(topic):
                continue
            self.max_ts = max(self.max_ts, ts)
            self.entries.pop((topic, uid), None)
            self.seq += 1
            self.entries[(topic, uid)] = (position, qid, offset, ts, index, self.seq)
        while self.entries and not self.counts(next(iter(self.entries.values()))):
            self.entries.popitem(last=False)

    def lookup(self, topic: str, uid: str) -> FirstSend | None:
        e = self.entries.get((topic, uid))
        return FirstSend(*e) if e is not None and self.counts(e) else None

    def checkpoint(self) -> dict[str, int]:
        e = next(iter(self.entries.values()), None)
        return {
            "from_index": e[4] if e is not None else 0,
            "from_position": e[0] if e is not None else 0,
            "from_seq": e[5] - 1 if e is not None else self.seq,
            "seq": self.seq,
            "max_ts": self.max_ts,
        }


TOPICS = ["T", "U", "%RETRY%G", "RMQ_SYS_X"]
UIDS = ["", "a", "b", "c", "d", "e", "f", "g", "h"]


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), max_messages=st.integers(1, 12), window_ms=st.integers(1, 40))
def test_window_equals_the_ordered_dict_form(seed: int, max_messages: int, window_ms: int) -> None:
    """Random batches (repeated ids, store times stepping back, topics not de-duplicated, empty ids,
    a topic spelled by equal strings that are not the same object): after every batch the window
    answers every lookup, its length and its checkpoint like the ordered dict, and it holds at most
    ``max_messages`` entries behind its order."""
    rng = random.Random(seed)
    print("seed", seed)
    w, ref = DedupWindow(max_messages, window_ms), ReferenceWindow(max_messages, window_ms)
    ts, position = 1000, 0
    for index in range(1, rng.randrange(2, 41)):
        batch = []
        for _ in range(rng.randrange(0, 9)):
            ts += rng.choice([-7, -1, 0, 0, 1, 2, 9])
            position += 10
            topic = "".join(rng.choice(TOPICS))  # equal, not always the same object
            batch.append((topic, rng.choice(UIDS), position, rng.randrange(4), position // 10, ts, index))
        w.add_many(batch)
        ref.add_many(batch)
        assert len(w) == len(ref.entries)
        assert w.checkpoint() == ref.checkpoint()
        assert len(w._order) <= max_messages
        for topic in TOPICS:
            for uid in UIDS:
                assert w.lookup(topic, uid) == ref.lookup(topic, uid)
            assert w.lookup_many(topic, UIDS) == [ref.lookup(topic, uid) for uid in UIDS]


def test_a_restore_that_falls_short_keeps_the_entries_it_re_added() -> None:
    """``end_restore`` moves the add counter up to the checkpoint's when the log re-added fewer
    messages: the entries re-added stay (aged by that jump), later adds follow, and eviction
    still finds the oldest entry."""
    w = DedupWindow(max_messages=5, window_ms=1000)
    assert w.begin_restore({"from_index": 1, "from_position": 0, "from_seq": 10, "seq": 14, "max_ts": 1000}) == (1, 0)
    w.add("T", "a", position=0, queue_id=0, queue_offset=0, store_ts=1000, index=1)
    assert not w.end_restore()  # one re-added of four
    assert w.lookup("T", "a") is not None and w.checkpoint()["from_seq"] == 10 and w.checkpoint()["seq"] == 14
    for i, uid in enumerate("bcd"):
        w.add("T", uid, position=10 + i, queue_id=0, queue_offset=1 + i, store_ts=1000, index=2)
    assert w.lookup("T", "a") is None  # seq 11 with 17 added: outside the last 5
    assert w.checkpoint()["from_position"] == 10 and len(w) == 3


def _record(magic: bytes) -> bytes:
    m = StoredMessage("T", 1, 0, "tg", ("k",), {"a": "b"}, 5, "h:1", 6, "U" * 32, b"body")
    return magic + encode_message(m)[1:]


def test_header_decode_reads_the_magic_as_a_byte_of_any_buffer() -> None:
    """``decode_header_fields`` reads the first byte as an int: bytes and memoryviews decode alike,
    both magics are messages, and every other first byte (a command's among them) is refused as
    the slice comparison refused it."""
    for magic in MESSAGE_MAGICS:
        record = _record(magic)
        want = decode_header_fields(record)
        end = 5 + struct.unpack_from("<I", record, 1)[0]
        assert want == (msgpack.unpackb(record[5:end], raw=False, use_list=True), end)  # msgpack's defaults
        assert decode_header_fields(memoryview(bytearray(record))) == want
        assert decode_header_fields(memoryview(record)) == want
    for first in range(256):
        record = bytes([first]) + _record(MESSAGE_MAGIC)[1:]
        if bytes([first]) in MESSAGE_MAGICS:
            assert decode_header_fields(record)[0][0] == "T"
        else:
            with pytest.raises(ValueError, match="not a message record"):
                decode_header_fields(memoryview(record))
    with pytest.raises(ValueError, match="not a message record"):
        decode_header_fields(MESSAGE_MAGIC + b"\0\0\0")


def _reference_admission(record: bytes) -> tuple[list[Any] | None, Refused | None]:
    """Admission as it was: the header, then every rule of ``message_refusal``."""
    try:
        h, _ = decode_header(record)
    except ValueError as exc:
        return None, refused(f"undecodable message record: {exc}")
    reason = message_refusal(h.topic, h.queue_id, h.store_ts, h.properties)
    return (None, refused(reason)) if reason is not None else (list(h), None)


PROPERTY_NAMES = [PROP_SCHED_POS, PROP_HALF_POS, PROP_DUE_MS, PROP_LEVEL, PROP_PGROUP, PROP_REAL_TOPIC,
                  PROP_CHECK_IMMUNITY, "bench_ts_ns", "a"]
PROPERTY_VALUES = st.one_of(
    st.sampled_from(["12", "-3", "x", "", str(2**63), str(-(2**63) - 1)]),
    st.integers(-(2**63), 2**64 - 1), st.booleans(), st.none(), st.lists(st.integers(-9, 9), max_size=2),
)
TOPICS_ADMITTED_OR_NOT = ["T", "VersusBench", SCHEDULE_TOPIC, HALF_TOPIC, "%RETRY%g", "bad topic", "", "a/b", "T" * 200]


@settings(max_examples=600, deadline=None)
@example(topic=HALF_TOPIC, queue_id=0, store_ts=0, props={PROP_PGROUP: 5}, sys_flag=None)
@example(topic=SCHEDULE_TOPIC, queue_id=0, store_ts=0, props={PROP_DUE_MS: [1]}, sys_flag=None)
@example(topic="T", queue_id=0, store_ts=0, props={PROP_HALF_POS: True}, sys_flag=None)
@example(topic="T", queue_id=True, store_ts=0, props={}, sys_flag=None)
@example(topic="T", queue_id=0, store_ts=True, props={}, sys_flag=None)
@given(
    topic=st.sampled_from(TOPICS_ADMITTED_OR_NOT),
    queue_id=st.one_of(st.integers(-5, 5), st.sampled_from([2**31 - 1, 2**31, 2**64 - 1]), st.booleans()),
    store_ts=st.one_of(st.integers(-5, 5), st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, -(2**63)]), st.booleans()),
    props=st.dictionaries(st.sampled_from(PROPERTY_NAMES), PROPERTY_VALUES, max_size=4),
    sys_flag=st.sampled_from([None, 0, 1, True]),
)
def test_admission_fast_path_answers_as_every_rule(
    topic: str, queue_id: int, store_ts: int, props: dict[str, Any], sys_flag: int | None
) -> None:
    """``admitted_fields`` (the apply's form, with its fast path) admits and refuses exactly what
    the header and ``message_refusal`` did, with the same reason; ``admit_message`` too."""
    fields: list[Any] = [topic, queue_id, 0, "", [], props, 1, "h:1", store_ts, "U" * 32, 4]
    if sys_flag is not None:
        fields.append(sys_flag)
    header = msgpack.packb(fields, use_bin_type=True)
    record = MESSAGE_MAGIC_V1 + struct.pack("<I", len(header)) + header + b"body"
    want_fields, want_refusal = _reference_admission(record)
    for _ in range(2):  # the topic's validity remembered or not
        got = admitted_fields(record)
        if want_refusal is not None:
            assert got == want_refusal
            assert admit_message(record) == (None, want_refusal)
        else:
            assert isinstance(got, list) and got[:11] == want_fields and got == fields
            assert admit_message(record) == (RecordHeader._make(fields[:11]), None)


@pytest.fixture
def hooks(tmp_path: Path) -> Iterator[tuple[ScheduleIndex, TransactionIndex]]:
    """A schedule index with a pending record at position 100 and a transaction index with a
    pending half at position 200: a hook that took either would show in their dumps."""
    schedule = ScheduleIndex(str(tmp_path / "pending.db"))
    txn = TransactionIndex(str(tmp_path / "txn.db"))
    schedule.add(100, 50, {PROP_DUE_MS: "5000", PROP_LEVEL: "2"})
    txn.on_message(200, 50, HALF_TOPIC, {PROP_PGROUP: "pg", PROP_REAL_TOPIC: "T"}, 1000)
    yield schedule, txn
    schedule.close()
    txn.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    topic=st.sampled_from(["T", "VersusBench", "%RETRY%g", "%DLQ%g", "RMQ_SYS_X"]),
    props=st.dictionaries(
        st.one_of(st.sampled_from([n for n in PROPERTY_NAMES if n not in (PROP_SCHED_POS, PROP_HALF_POS)]),
                  st.text(min_size=1, max_size=12)).filter(lambda n: n not in (PROP_SCHED_POS, PROP_HALF_POS)),
        st.sampled_from(["100", "200", "x", ""]), max_size=4,
    ),
)
def test_a_plain_message_is_none_of_the_hooks_business(
    hooks: tuple[ScheduleIndex, TransactionIndex], topic: str, props: dict[str, str]
) -> None:
    """What lets the apply skip the schedule's and the transactions' hooks for a message that is
    not on their topics and names neither a schedule nor a half position (message_store._dispatch):
    for such a message both hooks answer True and change nothing, and the window keys it by its
    own topic. (Should a hook start reading another property, this fails: widen ``special``.)"""
    schedule, txn = hooks
    before = (list(schedule._db.iterdump()), list(txn._db.iterdump()), dict(txn.counters))
    assert schedule.on_message(300, 10, topic, props) and txn.on_message(300, 10, topic, props, 2000)
    txn.on_dispatched(300, props, 7)
    assert (list(schedule._db.iterdump()), list(txn._db.iterdump()), dict(txn.counters)) == before
    assert sent_topic(topic, props) == topic
