"""The store's apply path, made cheaper per message, gives what the plain forms gave: each fast path
here is pinned to a reference (the earlier code, kept in the test) on the same inputs."""

from __future__ import annotations

import collections
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store.dedup import DedupWindow, FirstSend, deduplicated_topic
from broker.store.message import MESSAGE_MAGIC, MESSAGE_MAGICS, StoredMessage, _header_fields, encode_message


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
    """``_header_fields`` reads the first byte as an int: bytes and memoryviews decode alike,
    both magics are messages, and every other first byte (a command's among them) is refused as
    the slice comparison refused it."""
    for magic in MESSAGE_MAGICS:
        record = _record(magic)
        want = _header_fields(record)
        assert _header_fields(memoryview(bytearray(record))) == want and _header_fields(memoryview(record)) == want
    for first in range(256):
        record = bytes([first]) + _record(MESSAGE_MAGIC)[1:]
        if bytes([first]) in MESSAGE_MAGICS:
            assert _header_fields(record)[0][0] == "T"
        else:
            with pytest.raises(ValueError, match="not a message record"):
                _header_fields(memoryview(record))
    with pytest.raises(ValueError, match="not a message record"):
        _header_fields(MESSAGE_MAGIC + b"\0\0\0")
