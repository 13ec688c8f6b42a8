"""Pre-vote with a real network partition: a follower cut off from the leader by Toxiproxy (its
Raft connection to the leader really goes down, its election timer fires again and again while it
still reaches the other follower) rejoins without deposing the leader.

Without pre-vote the isolated follower raised its term on every timeout and, on rejoining, forced
the healthy leader out (the simulator's scenario tests show both sides of this; here it is real
TCP through real proxies between OS processes).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from chaos.layout import Ports
from chaos.local import LocalChaosCluster
from chaos.selection import links_of_pairs
from chaos.target import find_leader, group_statuses, wait_for
from chaos.workload import create_topic

pytestmark = pytest.mark.slow


async def test_an_isolated_follower_rejoins_without_an_election(tmp_path: Any) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    cluster = LocalChaosCluster(str(tmp_path), ports=Ports(rng.randrange(20000, 27000, 100)))
    target = None
    try:
        await asyncio.to_thread(cluster.up)
        target = cluster.target()
        members = target.members()
        await create_topic(target, "PreVote", 2)
        leader = await find_leader(target, members, writable=True)
        assert leader is not None
        before = await group_statuses(target, members)
        term = before[leader]["term"]
        leader_id = before[leader]["self_id"]
        follower = next(m for m in members if m.name != leader)
        group = follower.group
        net = target.network
        assert net is not None
        # Cut it from the leader only: it still reaches the other follower, so its election timer
        # leads to campaigns (a node cut from everyone does not campaign at all), and the other
        # follower, which hears the leader, must refuse them.
        links = links_of_pairs([(follower.name, leader)], net.links(group))
        await net.cut(links)

        async def follower_lost_the_leader() -> bool:
            st = (await group_statuses(target, [follower]))[follower.name] or {}
            raft, was = st.get("raft") or {}, before[follower.name]["raft"]
            campaigns = int(raft.get("prevotes_started", 0)) + int(raft.get("elections", 0))
            return campaigns > int(was["prevotes_started"]) + int(was["elections"])

        await wait_for(follower_lost_the_leader, 15, "the cut-off follower to campaign")
        await asyncio.sleep(3.0)  # pacing: several more election timeouts while cut off
        cut = (await group_statuses(target, [follower]))[follower.name] or {}
        assert cut["term"] == term, "an isolated node raised its term (no pre-vote?)"
        await net.restore(links)

        async def rejoined() -> bool:
            st = (await group_statuses(target, [follower]))[follower.name] or {}
            return st.get("leader_id") == leader_id

        await wait_for(rejoined, 20, "the follower to follow the leader again", 0.1)
        after = await group_statuses(target, members)
        for m in members:
            st = after[m.name] or {}
            assert st.get("term") == term and st.get("leader_id") == leader_id, (m.name, st)
        assert (after[leader] or {})["raft"]["stepdowns"] == before[leader]["raft"]["stepdowns"]
    finally:
        if target is not None:
            await target.close()
        await asyncio.to_thread(cluster.down)
