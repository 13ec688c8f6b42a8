"""A leader applies its own entries from the bodies it wrote (no decode of what it just encoded):
the state machine must see exactly what decoding the stored entry gives, on every replica."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import dledger.replica as replica_module
from dledger.node import DLedgerNode
from dledger.records import CommittedEntry, to_committed
from tests.dledger.harness import InProcCluster, wait_until


class Recorder:
    """A state machine that keeps every entry it is given (in memory)."""

    def __init__(self) -> None:
        self.index = 0
        self.entries: list[CommittedEntry] = []

    def applied_index(self) -> int:
        return self.index

    def durable_applied_index(self) -> int:
        return self.index

    def checkpoint(self) -> None:
        pass

    def apply(self, entries: Sequence[CommittedEntry]) -> None:
        for e in entries:
            self.entries.append(e)
            self.index = e.index

    def on_install(self, anchor_index: int) -> None:
        self.index = anchor_index


async def test_applied_entries_are_the_decoded_stored_entries_on_leader_and_followers(
    tmp_path: Any, monkeypatch: Any
) -> None:
    decoded_by: list[Any] = []  # the store of each entry the replica decoded for its apply

    def counting(entry: Any, store: Any) -> CommittedEntry:
        decoded_by.append(store)
        return to_committed(entry, store)

    monkeypatch.setattr(replica_module, "to_committed", counting)
    c = InProcCluster(str(tmp_path))
    recorders: dict[str, Recorder] = {}
    for nid in c.ids:  # the harness's nodes, each with a recording state machine
        recorders[nid] = Recorder()
        node = DLedgerNode(c.settings(nid), recorders[nid], disk_used_ratio=lambda _p: 0.1)
        await node.start()
        c.nodes[nid] = node
    try:
        await wait_until(lambda: any(n.role == "LEADER" for n in c.nodes.values()), 10, "a leader")
        leader_id = next(nid for nid, n in c.nodes.items() if n.role == "LEADER")
        leader = c.nodes[leader_id]
        seed = int.from_bytes(os.urandom(4), "big")
        print("seed", seed)
        import random

        rng = random.Random(seed)
        await leader.append([b"first"])  # the leader's no-op and this one are applied before the count
        decoded_by.clear()
        for k in range(20):
            bodies: list[Any] = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(rng.randrange(1, 40))]
            if k % 5 == 4:
                bodies = [bytearray(b) for b in bodies]  # not bytes: the leader decodes these (slow path)
            locations = await leader.append(bodies)
            assert [loc.size for loc in locations] == [len(b) for b in bodies]
            for loc, body in zip(locations, bodies, strict=True):
                assert leader.store.read_at_position(loc.position, loc.size) == bytes(body)
        last = leader.last_index
        await wait_until(lambda: all(r.index >= last for r in recorders.values()), 10, "all applied")
        for nid, rec in recorders.items():
            got = [e for e in rec.entries if e.index <= last]
            want = [to_committed(c.nodes[nid].store.read(e.index), c.nodes[nid].store) for e in got]
            assert got == want, nid
            assert all(type(b) is bytes for e in got for _, b in e.bodies), nid
        by_leader = sum(1 for st in decoded_by if st is leader.store)
        by_follower = sum(1 for st in decoded_by if st is not leader.store)
        assert by_leader == 4 and by_follower >= 2 * 20  # the leader decoded only the bytearray requests
        assert not leader.core._own_bodies and leader.core._own_bytes == 0  # every own entry applied
    finally:
        for node in c.nodes.values():
            await node.stop()
