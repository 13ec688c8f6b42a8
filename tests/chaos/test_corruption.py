"""Damaged replica files (what the ``bitflip-*`` and ``truncate-*`` chaos faults do to a stopped
replica): the store must refuse to open them, or repair them, and never serve damaged bytes.

Built on the real writers (EntryStore segments of broker records, a MessageStore applying them),
damaged the way the faults damage them, then reopened the way a restarted broker reopens them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from broker.store.message import StoredMessage, encode_message
from broker.store.message_store import MessageStore
from dledger import command_codec
from dledger.entry_codec import HEADER_SIZE
from dledger.entry_store import CorruptStoreError, EntryStore
from dledger.records import to_committed

SEGMENT_BYTES = 64 << 10
MESSAGES = 600


def body(i: int) -> bytes:
    return (b"body-%06d-" % i) * 20


def record(i: int) -> bytes:
    return encode_message(StoredMessage(topic="T", queue_id=0, flag=0, tags="", keys=(), properties={}, born_ts=1,
                                        born_host="h", store_ts=1, unique_id=f"U{i}", body=body(i)))


class Replica:
    """A replica's log and message store on disk, written and reopened like a broker does."""

    def __init__(self, root: str):
        self.root = root
        self.log: EntryStore | None = None
        self.ms: MessageStore | None = None

    def open(self) -> None:
        self.log = EntryStore(os.path.join(self.root, "store"), segment_bytes=SEGMENT_BYTES)
        self.ms = MessageStore(os.path.join(self.root, "broker"), "G", snapshot_interval_ms=600_000)
        self.ms.open(self.log)

    def write(self) -> None:
        self.open()
        assert self.log is not None and self.ms is not None
        for i in range(1, MESSAGES + 1):
            self.log.append(i, 1, command_codec.encode_batch([record(i)]))
            self.log.flush()
            self.ms.apply([to_committed(self.log.read(i), self.log)])
        assert len(self.log.segments()) >= 3
        self.close()

    def close(self) -> None:
        if self.ms is not None:
            self.ms.close()
            self.ms.cqs.close()
            self.ms.index.close()
        if self.log is not None:
            self.log.close()
        self.ms = self.log = None

    def segment_files(self) -> list[str]:
        d = os.path.join(self.root, "store", "log")
        return [os.path.join(d, n) for n in sorted(os.listdir(d))]

    def entry_offset(self, index: int) -> tuple[str, int]:
        """(segment file, offset of the entry's header in it) of one entry."""
        log = EntryStore(os.path.join(self.root, "store"), segment_bytes=SEGMENT_BYTES)
        try:
            position = log.read(index).position
        finally:
            log.close()
        start = max(int(os.path.basename(p)) for p in self.segment_files() if int(os.path.basename(p)) <= position)
        return os.path.join(self.root, "store", "log", f"{start:020d}"), position - start


@pytest.fixture
def replica(tmp_path: Any) -> Iterator[Replica]:
    r = Replica(str(tmp_path))
    r.write()
    yield r
    r.close()


def flip_bit(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x01]))


def served(r: Replica, queue_offset: int) -> bytes | Exception:
    """What the reopened replica serves for one queue offset: the body, or the error it raises."""
    assert r.ms is not None
    cq = r.ms.cqs.get("T", 0)
    assert cq is not None
    unit = cq.get(queue_offset)
    assert unit is not None
    try:
        return r.ms.read_message(unit.position, unit.size).body
    except Exception as exc:  # a refusal to serve is fine
        return exc


def test_bit_flipped_in_the_newest_segment_is_refused(replica: Replica) -> None:
    path, offset = replica.entry_offset(MESSAGES - 20)  # valid records follow it: not a torn tail
    flip_bit(path, offset + HEADER_SIZE + 100)
    with pytest.raises(CorruptStoreError, match="valid records follow it"):
        replica.open()


def test_truncated_newest_segment_is_repaired(replica: Replica) -> None:
    newest = replica.segment_files()[-1]
    os.truncate(newest, os.path.getsize(newest) - 100)  # a torn last entry
    replica.open()
    assert replica.log is not None and replica.log.last_index == MESSAGES - 1
    assert served(replica, MESSAGES - 2) == body(MESSAGES - 1)


def test_truncated_older_segment_is_refused(replica: Replica) -> None:
    first = replica.segment_files()[0]
    os.truncate(first, os.path.getsize(first) - 100)
    with pytest.raises(CorruptStoreError):
        replica.open()


def test_bit_flipped_in_an_older_segment_is_never_served(replica: Replica) -> None:
    """Failed before the fix (found by the audit of issue 12; fixed by the message record's own CRC).

    A bit flipped in a message body inside a sealed (not the newest) segment is served to readers.
    Recovery checks sealed segments only at their boundaries (``EntryStore._boundaries_agree``), so
    the store opens; ``MessageStore.read_message`` reads the record with
    ``EntryStore.read_at_position``, which returns raw bytes without checking the entry's body CRC
    (``EntryStore.read`` does check it and raises CorruptEntryError). A pull or a query by msg id
    then hands the consumer a body that was never sent. The store must refuse to open the
    replica, repair the entry from a peer, or refuse the read — never serve it.
    """
    path, offset = replica.entry_offset(10)
    assert path == replica.segment_files()[0]
    flip_bit(path, offset + HEADER_SIZE + 200)
    try:
        replica.open()
    except CorruptStoreError:
        return  # refusing to open is one right answer
    got = served(replica, 9)
    assert isinstance(got, Exception) or got == body(10), "the replica served a damaged message body"
