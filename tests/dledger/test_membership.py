"""Membership changes through the Raft log (issue 27 part 4): the entry codec, the history, and
in-process groups on real sockets (a learner, its promotion, the removal of a dead member, the
refusals, restarts and retention). No sleeps to synchronise: conditions with deadlines."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from typing import Any

import pytest

from dledger import membership as mship
from dledger import peer_codec
from dledger.apps.checkpoint import ApplyCheckpoint
from dledger.meta_store import FileMetaStore, MemoryMetaStore
from dledger.node import AppendTimeoutError, DLedgerNode, NotLeaderError
from tests.dledger.harness import HOST, InProcCluster, free_ports, wait_until

A = {"n0": "127.0.0.1:1000", "n1": "127.0.0.1:1001", "n2": "127.0.0.1:1002"}


# -- the entry codec and the history (pure) ------------------------------------------------------
def test_membership_entry_round_trips_and_is_not_a_batch() -> None:
    m = mship.Membership.of(A, {"n3": "127.0.0.1:1003"})
    body = mship.encode(m)
    assert body[:1] == b"M" and mship.is_membership(body)
    assert mship.decode(body) == m
    from dledger import command_codec

    assert not command_codec.is_batch(body)  # state machines see a no-op
    from dledger import journal

    assert journal._MEMBERSHIP_TYPE == mship.MEMBERSHIP_TYPE  # the journal tells them apart by this byte


@pytest.mark.parametrize(
    "body",
    [
        b"M",
        b"M\x02\x00",  # unknown version
        b"M\x01\x01\x03\x02n0\x0e127.0.0.1:1000",  # unknown role
        b"M\x01\x01\x01\x02n0\x0e127.0.0.1:100",  # truncated address
        b"M\x01\x01\x01\x02n0\x0e127.0.0.1:1000x",  # trailing byte
        b"M\x01\x00",  # no voter
        b"M\x01\x01\x01\x02n0\x04nope",  # not host:port
        b"M\x01\x02\x01\x02n0\x0e127.0.0.1:1000\x01\x02n0\x0e127.0.0.1:1001",  # duplicate id
        b"M\x01\x11" + b"\x01\x02n0\x0e127.0.0.1:1000" * 17,  # too many members
        b"M\x01\x01\x01\x02\xff\xfe\x0e127.0.0.1:1000",  # not UTF-8
    ],
)
def test_malformed_membership_entries_are_refused(body: bytes) -> None:
    with pytest.raises(mship.MembershipCodecError):
        mship.decode(body)


def test_single_server_changes_and_their_refusals() -> None:
    m = mship.Membership.of(A)
    with_learner = m.add_learner("n3", "127.0.0.1:1003")
    assert with_learner.learner_ids == {"n3"} and with_learner.voter_ids == {"n0", "n1", "n2"}
    promoted = with_learner.promote("n3")
    assert promoted.voter_ids == {"n0", "n1", "n2", "n3"} and not promoted.learners
    assert promoted.remove("n2").voter_ids == {"n0", "n1", "n3"}
    cases = [
        (lambda: m.add_learner("n1", "127.0.0.1:1009"), "ALREADY_MEMBER"),
        (lambda: m.add_learner("n9", "127.0.0.1:1001"), "ADDRESS_IN_USE"),
        (lambda: m.add_learner("n9", "no-port"), "BAD_MEMBERSHIP"),
        (lambda: m.promote("n1"), "NOT_A_LEARNER"),
        (lambda: m.remove("n9"), "UNKNOWN_MEMBER"),
        (lambda: mship.Membership.of({"n0": A["n0"]}).remove("n0"), "LAST_VOTER"),
    ]
    for call, code in cases:
        with pytest.raises(mship.MembershipError) as err:
            call()
        assert err.value.code == code


def test_history_truncation_gives_back_the_previous_membership_and_survives_a_record() -> None:
    boot = mship.Membership.of(A)
    h = mship.MembershipHistory(boot)
    m1 = boot.add_learner("n3", "127.0.0.1:1003")
    m2 = m1.promote("n3")
    h.append(mship.Placed(10, 2, m1))
    h.append(mship.Placed(20, 2, m2))
    assert h.current.membership == m2 and h.at(15).membership == m1 and h.at(5).membership == boot
    assert h.truncate_from(20) and h.current.membership == m1
    assert not h.truncate_from(30)
    saved = h.encode()
    again = mship.MembershipHistory(boot, mship.MembershipHistory.decode_placed(saved))
    assert again.current == h.current
    damaged = bytearray(saved)
    damaged[8] ^= 1
    with pytest.raises(mship.MembershipCodecError):
        mship.MembershipHistory.decode_placed(bytes(damaged))
    for _ in range(mship.HISTORY_KEEP + 5):
        h.append(mship.Placed(h.current.index + 1, 3, m2))
    assert len(h.placed) == mship.HISTORY_KEEP


def test_meta_stores_keep_the_membership_durably(tmp_path: Any) -> None:
    record = mship.MembershipHistory(mship.Membership.of(A), [mship.Placed(4, 1, mship.Membership.of(A))]).encode()
    fm = FileMetaStore(str(tmp_path / "meta"))
    assert fm.load_membership() is None
    fm.save_membership(record)
    assert FileMetaStore(str(tmp_path / "meta")).load_membership() == record
    mm = MemoryMetaStore()
    mm.save_membership(record)
    assert mm.crash_image().load_membership() == record


def test_the_install_membership_message_has_a_fixed_schema() -> None:
    body = mship.encode(mship.Membership.of(A))
    msg = {"type": "dl_membership", "term": 3, "index": 7, "entry_term": 2, "config": body}
    assert peer_codec.decode(peer_codec.encode(msg)) == msg
    with pytest.raises(peer_codec.PeerCodecError):
        peer_codec.decode(peer_codec.encode({**msg, "config": b"x" * (peer_codec.MAX_CONFIG_BYTES + 1)}))


def test_a_membership_is_saved_before_its_entry_is_written_and_undone_if_it_is_not() -> None:
    """A crash between the two must leave a saved membership whose entry is missing (a restart drops
    it), never an entry whose membership a restart would not take."""
    from dledger.journal import RaftJournal
    from dledger.log_store import StoreFullError
    from dledger.memory_store import MemoryLogStore

    store = MemoryLogStore()
    journal = RaftJournal(store, MemoryMetaStore())
    seen: list[int] = []
    undone: list[int] = []
    journal.on_membership = lambda index, _term, _body: seen.append(store.last_index)
    journal.on_membership_undone = undone.append
    body = mship.encode(mship.Membership.of(A))
    journal.add(b"\x01", 1, 1)
    journal.add(body, 2, 1)
    assert seen == [1] and store.last_index == 2  # told (and saved) while the log ended at 1

    def full(*_args: Any) -> None:
        raise StoreFullError("no room", needed=100)

    store.append = full  # type: ignore[method-assign]
    with pytest.raises(StoreFullError):
        journal.add(body, 3, 1)
    assert undone == [3]


# -- in-process groups on real sockets -----------------------------------------------------------
class Group:
    """n0..n2 started from dLegerPeers; ``learner(nid)`` starts one more replica that joins as a
    learner (its dLegerPeers: the three, and itself)."""

    def __init__(self, root: str, **overrides: Any):
        self.c = InProcCluster(root, overrides=overrides)
        self.extra_ports: dict[str, int] = {}

    def address(self, nid: str) -> str:
        if nid in self.c.ids:
            return f"{HOST}:{self.c.ports[self.c.ids.index(nid)]}"
        if nid not in self.extra_ports:
            self.extra_ports[nid] = free_ports(1)[0]
        return f"{HOST}:{self.extra_ports[nid]}"

    async def learner(self, nid: str) -> DLedgerNode:
        base = self.c.settings("n0")
        peers = {**base.peers, nid: self.address(nid)}
        s = replace(base, self_id=nid, peers=peers, data_dir=os.path.join(self.c.root, nid), learner=True)
        cp = ApplyCheckpoint(os.path.join(s.data_dir, "meta", "apply_checkpoint"))
        node = DLedgerNode(s, cp, disk_used_ratio=lambda _p: 0.1)
        await node.start()
        self.c.nodes[nid] = node
        self.c.checkpoints[nid] = cp
        return node

    async def caught_up_learner(self, leader: DLedgerNode, nid: str) -> DLedgerNode:
        """A new replica ``nid`` started, added by ``leader`` as a learner, and caught up."""
        node = await self.learner(nid)
        await leader.change_membership("add_learner", nid, self.address(nid))
        await wait_until(lambda: node.commit_index >= leader.commit_index, 15, "the learner to catch up")
        return node


async def _committed_everywhere(nodes: list[DLedgerNode], index: int, what: str) -> None:
    await wait_until(lambda: all(n.commit_index >= index for n in nodes), 15, what)


async def _promote(leader: DLedgerNode, nid: str) -> dict[str, Any]:
    """Promote once the leader has seen the learner's answer for what it caught up to (refused
    with LEARNER_NOT_CAUGHT_UP until then: the refusal counts as "not yet")."""
    result: dict[str, Any] = await wait_until(
        lambda: leader.change_membership("promote", nid), 15, f"the promotion of {nid}"
    )
    return result


async def _status(node: DLedgerNode) -> dict[str, Any]:
    return await node.status()


async def test_replace_a_dead_member_with_a_learner(tmp_path: Any) -> None:
    g = Group(str(tmp_path))
    c = g.c
    await c.start()
    try:
        leader = await c.leader()
        for i in range(20):
            await leader.append([b"before-%d" % i])
        dead = next(n for n in c.followers(leader)).settings.self_id
        await c.stop_node(dead)  # its disk is "dead"
        # Refusals: a change on a follower, removing the leader, a learner that is not there.
        follower = next(n for n in c.nodes.values() if n is not leader)
        with pytest.raises(NotLeaderError):
            await follower.change_membership("remove", dead)
        with pytest.raises(mship.MembershipError) as err:
            await leader.change_membership("remove", leader.settings.self_id)
        assert err.value.code == "REMOVE_LEADER"
        with pytest.raises(mship.MembershipError) as err:
            await leader.change_membership("promote", "n3")
        assert err.value.code == "NOT_A_LEARNER"
        # The new replica joins as a learner.
        n3 = await g.learner("n3")
        added = await leader.change_membership("add_learner", "n3", g.address("n3"))
        assert added["learners"] == {"n3": g.address("n3")}
        # A second change while one is pending is refused (both asked between two ticks).
        first: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        leader.core.propose_membership(
            "add_learner", "n4", g.address("n4"), lambda _r, e: first.done() or first.set_result(e)
        )
        with pytest.raises(mship.MembershipError) as err:
            leader.core.propose_membership("add_learner", "n5", g.address("n5"), lambda _r, _e: None)
        assert err.value.code == "MEMBERSHIP_CHANGE_PENDING"
        assert await asyncio.wait_for(first, 10) is None
        # n4 never started: it cannot be promoted (not caught up), and it can be removed.
        with pytest.raises(mship.MembershipError) as err:
            await leader.change_membership("promote", "n4")
        assert err.value.code == "LEARNER_NOT_CAUGHT_UP"
        await leader.change_membership("remove", "n4")
        await wait_until(lambda: n3.commit_index >= leader.commit_index, 15, "the learner to catch up")
        status = await _status(n3)
        assert status["membership"]["self_role"] == "learner"
        assert (await _status(leader))["peers"]["n3"]["role"] == "learner"
        promoted = await _promote(leader, "n3")
        assert "n3" in promoted["voters"]
        removed = await leader.change_membership("remove", dead)
        assert set(removed["voters"]) == set(c.ids) - {dead} | {"n3"}
        # Now the old leader goes: the two left (one of them the new replica) elect and commit.
        old = leader.settings.self_id
        await c.stop_node(old)
        new_leader = await c.leader(15)
        assert new_leader.settings.self_id != old
        locs = await new_leader.append([b"after-swap"])
        await _committed_everywhere(list(c.nodes.values()), locs[0].index, "the new group commits")
        for n in c.nodes.values():
            assert n.read(locs[0].index).bodies[0][1] == b"after-swap"
            st = await n.status()
            assert set(st["membership"]["voters"]) == set(c.ids) - {dead} | {"n3"} and st["membership"]["committed"]
        assert n3.chain_crc_at(locs[0].index) == new_leader.chain_crc_at(locs[0].index)
    finally:
        await c.stop()


async def test_a_learner_counts_for_nothing(tmp_path: Any) -> None:
    g = Group(str(tmp_path))
    c = g.c
    await c.start()
    try:
        leader = await c.leader()
        n3 = await g.caught_up_learner(leader, "n3")
        for f in c.followers(leader):
            if f is not n3:
                await c.stop_node(f.settings.self_id)
        # The leader and the learner are not a majority of the three voters: nothing commits,
        # and the leader steps down (check-quorum counts voters only).
        with pytest.raises(AppendTimeoutError):
            await leader.append([b"no-majority"], timeout_s=0.8)
        await wait_until(lambda: leader.role != "LEADER", 10, "check-quorum to depose the leader")
        st = await n3.status()
        assert st["role"] == "FOLLOWER" and st["counters"].get("elections_started", 0) == 0
        assert st["counters"].get("prevotes_started", 0) == 0
    finally:
        await c.stop()


async def test_membership_survives_restart_and_retention_and_reaches_an_installed_follower(tmp_path: Any) -> None:
    g = Group(
        str(tmp_path), segment_bytes=64 << 10, retention_hours=0.0, live_follower_s=0.5, retention_check_ms=100
    )
    c = g.c
    await c.start()
    try:
        leader = await c.leader()
        n3 = await g.caught_up_learner(leader, "n3")
        changed = await _promote(leader, "n3")
        lagger = next(n for n in c.followers(leader) if n is not n3).settings.self_id
        await c.stop_node(lagger)
        for _ in range(300):
            await leader.append([os.urandom(1000)])
        # Retention drops the segments that held the membership entries (read back as no-ops).
        await wait_until(lambda: leader.store.anchor[0] > changed["index"], 15, "retention past the change")
        node = await c.start_node(lagger)  # restarted from its old dLegerPeers, behind the anchor
        await wait_until(lambda: node.commit_index >= leader.commit_index, 20, "the lagger to be installed")
        st = await node.status()
        assert st["counters"].get("installs", 0) >= 1
        assert set(st["membership"]["voters"]) == {*c.ids, "n3"}
        # A restart of a replica whose log no longer holds the change keeps it (meta/membership).
        await leader.append([b"tell-the-floor"])
        await wait_until(lambda: n3.store.anchor[0] > changed["index"], 15, "retention past the change on n3")
        nid = n3.settings.self_id
        await c.stop_node(nid)
        cp = ApplyCheckpoint(os.path.join(str(tmp_path), nid, "meta", "apply_checkpoint"))
        s = replace(n3.settings, learner=True)  # its config still says "learner": the log knows better
        again = DLedgerNode(s, cp, disk_used_ratio=lambda _p: 0.1)
        await again.start()
        c.nodes[nid], c.checkpoints[nid] = again, cp
        st = await again.status()
        assert st["membership"]["self_role"] == "voter"
        assert st["membership"]["source"].startswith("meta/membership")
        assert again.store.first_index > changed["index"]
    finally:
        await c.stop()


async def test_a_removed_member_does_not_disrupt_the_group(tmp_path: Any) -> None:
    g = Group(str(tmp_path))
    c = g.c
    await c.start()
    try:
        leader = await c.leader()
        victim = c.followers(leader)[0].settings.self_id
        await c.stop_node(victim)
        await leader.change_membership("remove", victim)
        term = leader.term
        others = list(c.nodes.values())
        back = await c.start_node(victim)  # comes back with its old log and dLegerPeers
        # It holds the password, so the members accept its connections (as a stranger) but count
        # nothing it says: its pre-votes and votes are ignored, it never gets a majority.
        await wait_until(
            lambda: back.core.sync is not None and back.core.sync.dl_counters["prevotes_started"] >= 3,
            20,
            "the removed member to try to campaign",
        )
        ignored = sum(n.core.sync.dl_counters["votes_ignored_not_voter"] for n in others)  # type: ignore[union-attr]
        assert ignored >= 1
        assert back.role != "LEADER"
        locs = await leader.append([b"still-leading"])
        assert leader.role == "LEADER" and leader.term == term
        await _committed_everywhere(others, locs[0].index, "the group to commit without it")
    finally:
        await c.stop()


async def test_a_follower_that_missed_the_change_catches_up_from_a_new_member_that_leads(tmp_path: Any) -> None:
    """Found by the simulator: a replica down while a learner was added and promoted does not know
    the new member; once that member leads, the replica must still take its AppendEntries (it
    proves the password: accepted as a stranger) and so learn the change from the log."""
    g = Group(str(tmp_path))
    c = g.c
    await c.start()
    try:
        leader = await c.leader()
        away = c.followers(leader)[0].settings.self_id
        await c.stop_node(away)
        n3 = await g.caught_up_learner(leader, "n3")
        await _promote(leader, "n3")
        assert await leader.transfer_leadership("n3", timeout_s=10) == "n3"
        locs = await n3.append([b"led-by-the-new-member"])
        back = await c.start_node(away)  # its log and dLegerPeers know nothing of n3
        await wait_until(lambda: back.commit_index >= locs[0].index, 30, "the returning follower to catch up")
        st = await back.status()
        assert st["membership"]["voters"].keys() == {*c.ids, "n3"} and st["leader_id"] == "n3"
        # Restarted again, still from a dLegerPeers without n3: the saved membership names its leader.
        await c.stop_node(away)
        again = await c.start_node(away)
        await wait_until(lambda: again.leader_id == "n3", 15, "the restarted follower to name its leader n3")
    finally:
        await c.stop()
