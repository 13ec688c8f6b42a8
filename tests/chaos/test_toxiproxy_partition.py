"""Raft traffic really crosses the Toxiproxy proxies of a chaos cluster: cutting the leader's links
(the partition-leader fault) makes it step down while the majority elects a new leader; healing
brings it back as a follower that catches up. OS processes and a real Toxiproxy server."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from chaos.faults import FaultContext, make_fault
from chaos.history import JsonlWriter, read_jsonl
from chaos.layout import Ports
from chaos.local import LocalChaosCluster
from chaos.target import find_leader, group_statuses, wait_for
from chaos.workload import create_topic

pytestmark = pytest.mark.slow


async def test_partition_leader_isolates_it_and_the_majority_elects(tmp_path: Any) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    cluster = LocalChaosCluster(str(tmp_path), ports=Ports(rng.randrange(20000, 27000, 100)))
    target = None
    try:
        await asyncio.to_thread(cluster.up)
        target = cluster.target()
        members = target.members()
        await create_topic(target, "IsoTopic", 2)  # some Raft traffic, and leaders that accept writes
        assert cluster.proxies is not None
        # pysyncobj keeps one connection per pair: it must run through a proxy, not around it
        before = cluster.proxies.bytes_by_link()
        old = await find_leader(target, members)
        assert old is not None
        log = JsonlWriter(str(tmp_path / "faults.jsonl"))
        ctx = FaultContext(target, log, rng)
        fault = make_fault("partition-leader")
        await fault.apply(ctx)

        async def stepped_down_and_new_leader() -> str | None:
            statuses = await group_statuses(target, members)
            if (statuses[old] or {}).get("role") == "LEADER":
                return None
            new = await find_leader(target, [m for m in members if m.name != old], writable=True)
            return new

        new = await wait_for(stepped_down_and_new_leader, 15, "the isolated leader to step down and a new one")
        assert new != old
        # Toxiproxy counts a connection's bytes when it closes: cutting closed every Raft connection
        # of the old leader, so each of its pairs shows traffic on exactly one of its two proxies.
        after = cluster.proxies.bytes_by_link()
        for other in (m.name for m in members if m.name != old):
            a, b = f"{old}->{other}", f"{other}->{old}"
            moved = [link for link in (a, b) if after[link] > before[link]]
            assert len(moved) == 1, (a, b, before, after)
        await fault.heal(ctx)

        async def healed() -> bool:
            statuses = await group_statuses(target, members)
            lead = statuses[new] or {}
            return lead.get("role") == "LEADER" and all(
                st is not None and st.get("leader_id") == lead.get("self_id")
                and int(st.get("applied_index") or 0) >= int(lead.get("commit_index") or 0) - 1
                for st in statuses.values()
            )

        await wait_for(healed, 20, "the old leader to follow the new one and catch up", 0.1)
        log.close()
        lines = list(read_jsonl(str(tmp_path / "faults.jsonl")))
        assert [(x["fault"], x["action"]) for x in lines] == [("partition-leader", "apply"),
                                                               ("partition-leader", "heal")]
        assert sorted(lines[0]["targets"]) == sorted(
            f"{a}->{b}" for a in [m.name for m in members] for b in [m.name for m in members]
            if a != b and old in (a, b))
    finally:
        if target is not None:
            await target.close()
        await asyncio.to_thread(cluster.down)
