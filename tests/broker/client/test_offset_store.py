"""One suite for the memory and the local-file offset stores (the remote one runs against the real
brokers in the consumer tests)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.client.message import MessageQueue
from broker.client.offset_store import LocalFileOffsetStore, MemoryOffsetStore, OffsetStore
from broker.client.transport import ClientError

MQ0 = MessageQueue("T", "RaftNode00", 0)
MQ1 = MessageQueue("T", "RaftNode00", 1)


@pytest.fixture(params=["memory", "file"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], OffsetStore]:
    backing: dict[MessageQueue, int] = {}

    def make() -> OffsetStore:
        if request.param == "memory":
            return MemoryOffsetStore(backing)
        return LocalFileOffsetStore(str(tmp_path / "offsets"), "cg|broadcast")

    return make


async def test_update_persist_reload(make_store: Callable[[], OffsetStore]) -> None:
    store = make_store()
    await store.load()
    assert await store.fetch(MQ0) is None
    store.update(MQ0, 5)
    store.update(MQ0, 3)  # the consumption path never moves back
    assert store.read(MQ0) == 5
    store.update(MQ1, 2)
    assert store.dirty() == {MQ0: 5, MQ1: 2}
    assert await store.persist() == 2
    assert store.dirty() == {} and await store.persist() == 0
    store.update(MQ1, 1, increase_only=False)
    assert store.read(MQ1) == 1
    await store.persist([MQ1])

    again = make_store()
    await again.load()
    assert await again.fetch(MQ0) == 5
    assert again.read(MQ0) == 5 and again.persisted(MQ0) == 5
    assert await again.fetch(MessageQueue("T", "RaftNode01", 0)) is None
    again.update(MQ0, 9)  # not persisted yet: reading the store must not undo it
    assert await again.fetch(MQ0) == 5
    assert again.read(MQ0) == 9 and again.dirty() == {MQ0: 9}


async def test_file_is_versioned_json_written_atomically(tmp_path: Path) -> None:
    store = LocalFileOffsetStore(str(tmp_path), "g1")
    store.update(MQ0, 7)
    await store.persist()
    doc = json.loads(Path(store.path).read_text())
    assert doc == {
        "version": 1,
        "group": "g1",
        "offsets": [{"topic": "T", "broker_name": "RaftNode00", "queue_id": 0, "offset": 7}],
    }
    assert [p for p in os.listdir(tmp_path / "g1") if p != "offsets.json"] == []  # no temp file left
    Path(store.path).write_text("{not json")
    with pytest.raises(ClientError) as e:
        await LocalFileOffsetStore(str(tmp_path), "g1").load()
    assert e.value.code == "BAD_OFFSET_FILE"
