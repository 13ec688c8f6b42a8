"""DLedgerNode groups inside this process, on this test's event loop: real sockets, no sleeps to synchronise."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from dledger.node import (
    AppendTimeoutError,
    DiskFullError,
    DLedgerError,
    DLedgerNode,
    EntryRemovedError,
    NotCommittedError,
    NotLeaderError,
)
from tests.dledger.harness import InProcCluster, wait_until


@pytest.fixture
async def cluster(tmp_path: Any) -> Any:
    c = InProcCluster(str(tmp_path))
    await c.start()
    yield c
    await c.stop()


async def all_applied(c: InProcCluster, index: int, timeout_s: float = 10.0) -> None:
    await wait_until(
        lambda: all(n.applied_index >= index for n in c.nodes.values()),
        timeout_s,
        f"every node applied {index}",
    )


async def test_elects_one_leader_and_replicates(cluster: InProcCluster) -> None:
    leader = await cluster.leader()
    locs = await leader.append([b"hello", b"world"])
    assert [loc.slot for loc in locs] == [0, 1]
    assert locs[0].index == locs[1].index  # one request, one entry
    await all_applied(cluster, locs[0].index)
    for node in cluster.nodes.values():
        entry = node.read(locs[0].index)
        assert [b for _, b in entry.bodies] == [b"hello", b"world"]
        # each body is addressable by its own log position
        assert [p for p, _ in entry.bodies] == [loc.position for loc in locs]
        assert node.store.read_at_position(locs[1].position, locs[1].size) == b"world"
    crcs = {n.chain_crc_at(locs[0].index) for n in cluster.nodes.values()}
    assert len(crcs) == 1


async def test_follower_refuses_appends_with_leader_hint(cluster: InProcCluster) -> None:
    leader = await cluster.leader()
    follower = cluster.followers(leader)[0]
    with pytest.raises(NotLeaderError) as err:
        await follower.append([b"x"])
    assert err.value.leader_id == leader.settings.self_id


async def test_reads_only_committed(cluster: InProcCluster) -> None:
    leader = await cluster.leader()
    with pytest.raises(NotCommittedError):
        leader.read(leader.commit_index + 1)


async def test_concurrent_appends_share_entries(cluster: InProcCluster) -> None:
    leader = await cluster.leader()
    results = await asyncio.gather(*(leader.append([f"m{i}".encode()]) for i in range(500)))
    indexes = {r[0].index for r in results}
    assert len(indexes) < 500, "group commit should put several requests in one entry"
    await all_applied(cluster, max(indexes))
    bodies = {
        n.settings.self_id: cluster.checkpoints[n.settings.self_id].bodies for n in cluster.nodes.values()
    }
    digests = {cluster.checkpoints[nid].digest for nid in cluster.nodes}
    assert set(bodies.values()) == {500} and len(digests) == 1


async def test_large_entries_replicate(cluster: InProcCluster) -> None:
    leader = await cluster.leader()
    big = [os.urandom(1 << 20), os.urandom(4 << 20)]
    locs = [await leader.append([b], timeout_s=10) for b in big]
    await all_applied(cluster, locs[-1][0].index, timeout_s=20)
    for node in cluster.nodes.values():
        for body, loc in zip(big, locs, strict=True):
            assert node.store.read_at_position(loc[0].position, loc[0].size) == body


async def test_leader_failover_keeps_acknowledged_entries(cluster: InProcCluster) -> None:
    leader = await cluster.leader()
    acked = [await leader.append([f"before-{i}".encode()]) for i in range(20)]
    old_id = leader.settings.self_id
    await cluster.stop_node(old_id)
    new_leader = await cluster.leader()
    assert new_leader.settings.self_id != old_id
    after = await new_leader.append([b"after"])
    await all_applied(cluster, after[0].index)
    for locs in acked:
        assert new_leader.read(locs[0].index).bodies[0][1] == new_leader.store.read_at_position(
            locs[0].position, locs[0].size
        )
    # the old leader restarts, catches up, and applies nothing twice
    await cluster.start_node(old_id)
    await all_applied(cluster, after[0].index)
    digests = {cp.digest for cp in cluster.checkpoints.values()}
    counts = {cp.bodies for cp in cluster.checkpoints.values()}
    assert len(digests) == 1 and counts == {21}


async def test_isolated_leader_steps_down_and_majority_elects(cluster: InProcCluster) -> None:
    leader = await cluster.leader()
    others = cluster.followers(leader)
    leader_addr = leader.settings.peers[leader.settings.self_id]
    assert leader._sync is not None
    leader._sync.dl_transport.blocked = frozenset(o.settings.peers[o.settings.self_id] for o in others)
    for o in others:
        assert o._sync is not None
        o._sync.dl_transport.blocked = frozenset({leader_addr})
    # the cut-off leader cannot commit...
    with pytest.raises((AppendTimeoutError, NotLeaderError)):
        await leader.append([b"lost?"], timeout_s=0.5)
    # ...steps down within about stepdown_ms (1.2 s here), and the majority elects a new leader.
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await wait_until(lambda: leader.role != "LEADER", 3.0, "the isolated leader to step down")
    assert loop.time() - t0 < 2.0
    new = await wait_until(
        lambda: next((o for o in others if o.role == "LEADER"), None), 5.0, "a new leader in the majority"
    )
    locs = await new.append([b"majority"])
    assert locs[0].term > leader.term or new.term > 0
    with pytest.raises(NotLeaderError):
        await leader.append([b"refused"])
    # heal: the old leader follows, and its uncommitted entry is replaced
    leader._sync.dl_transport.blocked = frozenset()
    for o in others:
        o._sync.dl_transport.blocked = frozenset()  # type: ignore[union-attr]
    await all_applied(cluster, locs[0].index)
    assert {n.chain_crc_at(locs[0].index) for n in cluster.nodes.values()}.__len__() == 1


async def test_transfer_leadership(cluster: InProcCluster) -> None:
    leader = await cluster.leader()
    await leader.append([b"x"])
    target = cluster.followers(leader)[0].settings.self_id
    await wait_until(
        lambda: all(n.commit_index == leader.commit_index for n in cluster.nodes.values()), 5, "sync"
    )
    new_id = await leader.transfer_leadership(target)
    assert new_id == target
    await wait_until(lambda: cluster.nodes[target].role == "LEADER", 5, "the target leads")


async def test_transfer_leadership_under_steady_appends(cluster: InProcCluster) -> None:
    """A transfer under load (a rolling restart's graceful stop, ``mqadmin transferLeader``): the
    log keeps growing, so a follower is rarely fully caught up at the moment of the request. The
    leader holds new appends while it transfers (Raft thesis §3.10) and asks again until the target
    caught up; the held appends then learn the new leader. Before: refused at once ("not caught up"),
    and an append made during the transfer was taken and ended "outcome unknown".

    Which appends are in flight at the step-down depends on timing, so the steady appenders may end
    either way (NOT_LEADER naming the new leader, or outcome unknown); the append made once the
    transfer started is held, whatever the timing, and must learn the new leader."""
    leader = await cluster.leader()
    stop = asyncio.Event()
    ended: list[DLedgerError] = []  # how each appender's last append ended

    async def appender(i: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                await leader.append([f"{i}-{n}".encode()])
            except DLedgerError as exc:  # NOT_LEADER, or an append in flight at the step-down
                ended.append(exc)
                return

    tasks = [asyncio.create_task(appender(i)) for i in range(32)]
    try:
        await wait_until(lambda: leader.commit_index >= 200, 20, "a steady stream of appends")
        transfer = asyncio.create_task(leader.transfer_leadership(None))
        await asyncio.sleep(0)  # the transfer started: it holds new appends from here on
        with pytest.raises(NotLeaderError) as held:
            await leader.append([b"made during the transfer"])
        new_id = await transfer
        assert new_id != leader.settings.self_id and held.value.leader_id == new_id
        await wait_until(lambda: len(ended) == len(tasks), 10, "every appender to see the step-down")
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    for exc in ended:
        assert (isinstance(exc, NotLeaderError) and exc.leader_id == new_id) or isinstance(exc, AppendTimeoutError), (
            repr(exc))
    await wait_until(lambda: cluster.nodes[new_id].role == "LEADER", 5, "the new leader to stay")


async def test_status_snapshot(cluster: InProcCluster) -> None:
    leader = await cluster.leader()
    await leader.append([b"x"])
    st = await leader.status()
    assert st["role"] == "LEADER" and st["self_id"] == leader.settings.self_id
    assert set(st["peers"]) == {n.settings.self_id for n in cluster.followers(leader)}
    assert all(p["connected"] for p in st["peers"].values())


async def test_wiped_follower_catches_up(tmp_path: Any) -> None:
    c = InProcCluster(str(tmp_path), overrides={"segment_bytes": 64 << 10})
    await c.start()
    try:
        leader = await c.leader()
        for _i in range(200):
            await leader.append([os.urandom(1000)])
        victim = c.followers(leader)[0].settings.self_id
        await c.stop_node(victim)
        import shutil

        shutil.rmtree(os.path.join(str(tmp_path), victim))
        node = await c.start_node(victim)
        await wait_until(
            lambda: node.applied_index >= leader.commit_index, 20, "the wiped follower to catch up"
        )
        idx = leader.commit_index
        assert node.chain_crc_at(idx) == leader.chain_crc_at(idx)
        assert c.checkpoints[victim].digest == c.checkpoints[leader.settings.self_id].digest
    finally:
        await c.stop()


async def test_follower_behind_retention_is_installed(tmp_path: Any) -> None:
    c = InProcCluster(
        str(tmp_path),
        overrides={
            "segment_bytes": 64 << 10,
            "retention_hours": 0.0,
            "live_follower_s": 0.5,
            "retention_check_ms": 100,
        },
    )
    await c.start()
    try:
        leader = await c.leader()
        lagger = c.followers(leader)[0].settings.self_id
        await c.stop_node(lagger)
        for _ in range(300):
            await leader.append([os.urandom(1000)])
        # retention (age 0 h) removes every whole segment the live nodes no longer need
        await wait_until(
            lambda: leader.store.anchor[0] > 0, 10, "retention to drop old segments on the leader"
        )
        with pytest.raises(EntryRemovedError):
            leader.read(1)
        with pytest.raises(EntryRemovedError):
            leader.read_range(1, 10)
        node = await c.start_node(lagger)
        await wait_until(
            lambda: node.applied_index >= leader.commit_index, 20, "the lagging follower to catch up"
        )
        assert node.store.anchor[0] > 0
        idx = leader.commit_index
        assert node.chain_crc_at(idx) == leader.chain_crc_at(idx)
        after = await leader.append([b"after-install"])
        await wait_until(lambda: node.commit_index >= after[0].index, 10, "replication after install")
    finally:
        await c.stop()


async def test_live_lagging_follower_holds_retention(tmp_path: Any) -> None:
    c = InProcCluster(
        str(tmp_path),
        overrides={
            "segment_bytes": 64 << 10,
            "retention_hours": 0.0,
            "live_follower_s": 60,
            "retention_check_ms": 50,
        },
    )
    await c.start()
    try:
        leader: DLedgerNode = await c.leader()
        slow, other = c.followers(leader)
        assert slow._sync is not None and leader._sync is not None and other._sync is not None
        addr = {n.settings.self_id: n.settings.peers[n.settings.self_id] for n in c.nodes.values()}
        slow_addr = addr[slow.settings.self_id]
        # cut the slow follower off (both ways): it stays "live" for live_follower_s
        slow._sync.dl_transport.blocked = frozenset(a for a in addr.values() if a != slow_addr)
        leader._sync.dl_transport.blocked = frozenset({slow_addr})
        other._sync.dl_transport.blocked = frozenset({slow_addr})
        match_before = slow.store.last_index
        for _ in range(200):
            await leader.append([os.urandom(1000)])
        checks = leader.core.counters["retention_checks"]
        await wait_until(
            lambda: leader.core.counters["retention_checks"] >= checks + 5, 10, "five retention checks"
        )
        assert len(leader.store.segments()) > 1
        assert leader.store.anchor[0] <= match_before, "retention cut entries a live follower needs"
        for n in c.nodes.values():
            n._sync.dl_transport.blocked = frozenset()  # type: ignore[union-attr]
        await wait_until(
            lambda: slow.applied_index >= max(n.commit_index for n in c.nodes.values()) > match_before,
            20,
            "the lagger to catch up",
        )
        assert slow.store.anchor[0] == 0  # caught up by replication: no install was needed
    finally:
        await c.stop()


async def test_disk_thresholds_remove_old_segments_and_refuse_writes(tmp_path: Any) -> None:
    c = InProcCluster(str(tmp_path), overrides={"segment_bytes": 64 << 10, "retention_check_ms": 50})
    await c.start()
    try:
        leader = await c.leader()
        lid = leader.settings.self_id
        for _ in range(200):
            await leader.append([os.urandom(1000)])
        await all_applied(c, leader.commit_index)
        segments_before = len(leader.store.segments())
        assert segments_before > 2 and leader.store.anchor[0] == 0  # young data: age keeps it all
        # above diskMaxUsedSpaceRatio (75 %): the oldest segments go, one per check, writes go on
        c.disk_used[lid] = 0.80
        await wait_until(lambda: leader.store.anchor[0] > 0, 10, "disk-pressure retention on the leader")
        await leader.append([b"still accepted at 80 %"])
        # above diskSpaceWarningLevelRatio (90 %): writes are refused with a clear error
        c.disk_used[lid] = 0.93
        await wait_until(lambda: leader.disk_full, 10, "the leader to notice the full disk")
        # the refusal says the figures an operator acts on
        refusal = r"is 93\.0 % \(df's Use%\), at or above diskSpaceWarningLevelRatio 90 %"
        with pytest.raises(DiskFullError, match=refusal):
            await leader.append([b"refused"])
        c.disk_used[lid] = 0.50
        await wait_until(lambda: not leader.disk_full, 10, "the leader to notice space again")
        await leader.append([b"accepted again"])
        # followers keep everything a live follower... and the leader never cut past them
        for f in c.followers(leader):
            assert f.applied_index >= leader.store.anchor[0]
    finally:
        await c.stop()


async def test_async_flush_policy_replicates(tmp_path: Any) -> None:
    c = InProcCluster(str(tmp_path), overrides={"flush_policy": "async", "flush_interval_ms": 20})
    await c.start()
    try:
        leader = await c.leader()
        locs = await asyncio.gather(*(leader.append([f"a{i}".encode()]) for i in range(100)))
        await all_applied(c, max(loc[0].index for loc in locs))
        assert len({cp.digest for cp in c.checkpoints.values()}) == 1
        assert not leader.store.dirty or leader.core.counters["fsync"] > 0
    finally:
        await c.stop()


async def test_the_replica_is_owned_by_its_loop_and_refuses_other_threads(cluster: InProcCluster) -> None:
    """Thread ownership is enforced (issues 11, 26): the replica belongs to the event loop that
    started it. Its thread calls the core directly; another thread calling the core or the node
    raises; the same call through ``run_on_replica_thread`` from another thread is handed to the
    loop and answers."""
    node = await cluster.leader()
    assert node.core.status()["role"] == "LEADER"  # the loop's thread owns it: a direct call
    loop = asyncio.get_running_loop()

    def off_thread(call: Any) -> BaseException | None:
        try:
            call()
        except RuntimeError as exc:
            return exc
        return None

    refused = await loop.run_in_executor(None, off_thread, node.core.status)
    assert refused is not None and "not the thread that owns it" in str(refused)
    refused = await loop.run_in_executor(None, off_thread, lambda: asyncio.run(node.append([b"x"])))
    assert refused is not None and "not on its event loop's thread" in str(refused)

    def from_another_thread() -> Any:
        async def ask() -> Any:
            return await node.run_on_replica_thread(node.core.status, 5)

        return asyncio.run(ask())

    st = await loop.run_in_executor(None, from_another_thread)
    assert st["role"] == "LEADER"
