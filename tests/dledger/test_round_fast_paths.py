"""The per-round fast paths of one synchronous append (issue 26), pinned to the slow paths.

A leader's round at one append in flight was three light ticks: after the append, after its own
flush and after each follower's answer. Two are skipped now, when they would move nothing:
- after the leader's own flush, unless the commit index may advance (``dl_commit_may_advance``):
  while no follower has answered, counting itself moves nothing;
- after a read that handed over only *quiet* messages (``dl_quiet_messages``: a success answer
  that lets no commit advance and ends no probe), e.g. the second follower's answer.

These tests run the simulator's seeds (random faults, crashes, elections) with the light tick
checked against them: ``dl_commit_may_advance`` must say exactly whether the light tick moves the
commit index, and a light tick after only quiet messages must change nothing a tick could change.
The skips themselves are counted on a real TCP group below.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
from typing import Any

import msgpack
import pytest

from dledger import peer_codec
from dledger.node import DLedgerNode, RaftSettings
from dledger.replica import ReplicaCore
from dledger.sim.world import SimOptions, World
from dledger.syncobj_patch import DLedgerSyncObj
from tests.dledger.harness import PASSWORD, free_ports, wait_until

SEEDS = range(1, 9)


def _snapshot(core: ReplicaCore) -> tuple[Any, ...]:
    sync = core.sync
    assert sync is not None
    return (
        core.commit_index,
        core.applied_index,
        core.role,
        core.term,
        core.leader_id,
        core.store.last_index,
        len(core._waiting),
        len(core._queue),
        core.flush_in_flight,
        core._commit_tell_at,
        dict(core._held_acks),
        sync.dl_commit_sent,
        sync.raftCommitIndex,
        sync.dl_state,
        sync.dl_next_deadline(),
        core.next_tick_s(1.0),
        dict(core.counters),
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_the_skipped_light_ticks_would_have_moved_nothing(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    print(f"seed {seed}")
    checked = {"may_advance": 0, "quiet_ticks": 0, "advanced": 0, "due": 0}
    loud: dict[int, bool] = {}  # id(core) -> something other than quiet messages since its last light tick
    quiet_seen: dict[int, int] = {}

    original_on_message = DLedgerSyncObj._SyncObj__onMessageReceived

    def on_message(self: DLedgerSyncObj, node: Any, message: Any) -> None:
        before = self.dl_quiet_messages
        original_on_message(self, node, message)
        core = self.dl_hooks
        if self.dl_quiet_messages == before:
            loud[id(core)] = True
        else:
            quiet_seen[id(core)] = quiet_seen.get(id(core), 0) + 1

    original_after_input = DLedgerSyncObj.dl_after_input

    def dl_after_input(self: DLedgerSyncObj) -> None:
        may = self.dl_commit_may_advance()
        commit = self.raftCommitIndex
        original_after_input(self)
        moved = self.raftCommitIndex != commit
        assert may == moved, f"dl_commit_may_advance said {may}, the light tick moved the commit: {moved}"
        checked["may_advance"] += 1
        checked["advanced"] += moved

    original_core_after_input = ReplicaCore.after_input

    def core_after_input(self: ReplicaCore) -> None:
        key = id(self)
        quiet_only = not loud.pop(key, False) and quiet_seen.pop(key, 0) > 0
        if not quiet_only:
            original_core_after_input(self)
            return
        if self.next_tick_s(1.0) == 0.0:
            # A timer is due (a commit to tell, a heartbeat): this light tick happens to do the
            # full tick's work, which the node's armed timer does when the light tick is skipped.
            original_core_after_input(self)
            checked["due"] += 1
            return
        before = _snapshot(self)
        original_core_after_input(self)
        after = _snapshot(self)
        assert after == before, (
            f"a light tick after quiet messages only changed the replica: {before} {after}"
        )
        checked["quiet_ticks"] += 1

    def loud_too(name: str) -> None:
        original = getattr(ReplicaCore, name)

        def wrapped(self: ReplicaCore, *args: Any, **kwargs: Any) -> Any:
            loud[id(self)] = True
            return original(self, *args, **kwargs)

        monkeypatch.setattr(ReplicaCore, name, wrapped)

    for name in ("submit", "_flush_done", "tick", "open"):
        loud_too(name)  # other input since the last light tick: not a quiet-only tick
    monkeypatch.setattr(DLedgerSyncObj, "_SyncObj__onMessageReceived", on_message)
    monkeypatch.setattr(DLedgerSyncObj, "dl_after_input", dl_after_input)
    monkeypatch.setattr(ReplicaCore, "after_input", core_after_input)

    result = World(seed, SimOptions(steps=3000)).run()
    assert result.ok, result.line()
    print(checked)
    assert checked["quiet_ticks"] > 0 and checked["advanced"] > 0  # both paths were exercised


async def _group(root: str) -> list[DLedgerNode]:
    ports = free_ports(3)
    peers = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    nodes = [
        DLedgerNode(
            RaftSettings(
                group="g", self_id=pid, peers=peers, data_dir=os.path.join(root, pid), password=PASSWORD
            )
        )
        for pid in peers
    ]
    for n in nodes:
        await n.start()
    return nodes


def test_one_append_in_flight_costs_the_leader_one_light_tick_per_round_and_answers_alike() -> None:
    """Three replicas on real sockets on one loop; sequential appends: each is answered with
    its index (the same answers as before the skips), and the leader's light ticks per round fall
    from three (measured 592 for 200 rounds before the skips: the append's, its own flush's, one
    per answer) to two (400: the append's and the answer that completes the majority). A bound,
    not an equality: the order in which flush and answers come back is the machine's."""

    async def main() -> None:
        with tempfile.TemporaryDirectory() as root:
            nodes = await _group(root)
            try:
                await wait_until(lambda: any(n.role == "LEADER" for n in nodes), 20, "a leader")
                leader = next(n for n in nodes if n.role == "LEADER")
                for _ in range(20):
                    await leader.append([b"warm"])
                ticks = 0
                original = leader.core.after_input

                def counted() -> None:
                    nonlocal ticks
                    ticks += 1
                    original()

                leader.core.after_input = counted  # type: ignore[method-assign]
                first = leader.last_index + 1
                rounds = 200
                for i in range(rounds):
                    locs = await leader.append([b"m%d" % i])
                    assert locs[0].index == first + i
                print(f"{ticks} light ticks on the leader for {rounds} rounds")
                assert ticks <= 2.5 * rounds, f"{ticks} light ticks for {rounds} rounds"
                last = leader.last_index
                for n in nodes:
                    await wait_until(lambda n=n: n.applied_index >= last, 10, f"{n.settings.self_id} applied")
                    assert n.chain_crc_at(leader.last_index) == leader.chain_crc_at(leader.last_index)
            finally:
                for n in nodes:
                    await n.stop()

    asyncio.run(main())


def _random_value(rng: random.Random) -> Any:
    return rng.choice(
        [
            0,
            1,
            rng.randrange(1 << 40),
            peer_codec.U63,
            peer_codec.U63 + 1,
            -1,
            None,
            True,
            False,
            b"",
            b"body",
            "text",
            1.5,
            [],
            [[b"b", 1, 2]],
            [[b"b", 1, 2], [b"c", 2, 2]],
            [[b"b", -1, 2]],
            [[b"b", 1]],
            [["s", 1, 2]],
            [[b"b", 1, True]],
            [(b"b", 1, 2)],
        ]
    )


@pytest.mark.parametrize("seed", range(1, 4))
def test_the_inline_decoders_answer_as_the_schema_does(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``peer_codec``'s inline decoders of the two messages of every round (append_entries,
    next_node_idx) give the same dict, or the same error, as the schema's field checkers."""
    rng = random.Random(seed)
    print(f"seed {seed}")
    frames = []
    good = {
        1: lambda: [1, 1, 5, 3, [[b"x" * 10, 4, 5]], 3, 5, 0],
        2: lambda: [1, 2, 7, False, True, False],
    }
    for _ in range(3000):
        code = rng.choice([1, 2])
        raw = good[code]()
        for _ in range(rng.choice([0, 0, 1, 2])):
            raw[rng.randrange(2, len(raw))] = _random_value(rng)
        if rng.random() < 0.05:
            raw.append(0)  # a field too many
        frames.append(msgpack.packb(raw, use_bin_type=True))
    frames.append(peer_codec.encode({"type": "append_entries", "term": 1, "commit_index": 0, "entries": []}))

    def outcome(frame: bytes) -> Any:
        try:
            return ("ok", peer_codec.decode(frame))
        except peer_codec.PeerCodecError as exc:
            return ("error", str(exc))

    fast = [outcome(f) for f in frames]
    assert peer_codec._fast_next_node_idx(good[2]()) is not None  # the inline path is the one taken
    assert peer_codec._fast_append_entries(good[1]()) is not None
    monkeypatch.setattr(peer_codec, "_FAST", {})
    slow = [outcome(f) for f in frames]
    assert fast == slow
    assert [list(o[1]) for o in fast if o[0] == "ok"] == [list(o[1]) for o in slow if o[0] == "ok"]  # key order
    oks = sum(1 for o in fast if o[0] == "ok")
    assert 300 < oks < len(frames) - 300  # both paths exercised


@pytest.mark.parametrize("seed", range(1, 5))
def test_followers_at_one_index_get_the_bytes_each_would_get_alone(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replication round reads, builds and encodes the first append_entries of each next index
    once (``dl_round_messages``, ``peer_codec.SharedMessage``): every follower's first frame of
    every round of the simulator's seeds is checked against the frame built for it alone (the
    round run first without the memo, its state restored)."""
    print(f"seed {seed}")
    original = DLedgerSyncObj._SyncObj__sendAppendEntries
    checked = {"rounds": 0, "shared": 0}

    def first_frames(self: DLedgerSyncObj, shared: bool) -> dict[str, bytes]:
        transport = self.dl_transport
        frames: dict[str, bytes] = {}
        real_send = transport.send

        def send(node: Any, message: dict[str, Any]) -> bool:
            wire = peer_codec.encode(message)
            if shared:
                assert wire == peer_codec._encode(dict(message))  # the cached bytes are the message's
            frames.setdefault(node.address, wire)
            return bool(real_send(node, message)) if shared else node.address in transport._up

        transport.send = send
        if not shared:
            real_replicate = self._dl_replicate_to

            def alone(node: Any) -> None:
                self.dl_round_messages = None  # no memo: each follower's messages built for it alone
                real_replicate(node)

            self._dl_replicate_to = alone  # type: ignore[method-assign]
        try:
            original(self)
        finally:
            del transport.send
            if not shared:
                del self._dl_replicate_to
        return frames

    def checked_round(self: DLedgerSyncObj) -> None:
        saved = (
            dict(self._SyncObj__raftNextIndex),
            self.dl_rotation,
            self._SyncObj__newAppendEntriesTime,
            self.dl_commit_sent,
            dict(self.dl_last_install),
            self.dl_installs_sent,
        )
        alone = first_frames(self, shared=False)
        self._SyncObj__raftNextIndex.clear()
        self._SyncObj__raftNextIndex.update(saved[0])
        self.dl_rotation, self._SyncObj__newAppendEntriesTime, self.dl_commit_sent = saved[1:4]
        self.dl_last_install.clear()
        self.dl_last_install.update(saved[4])
        self.dl_installs_sent = saved[5]
        together = first_frames(self, shared=True)
        assert together == alone
        checked["rounds"] += 1
        checked["shared"] += len(together) - len(set(together.values()))

    monkeypatch.setattr(DLedgerSyncObj, "_SyncObj__sendAppendEntries", checked_round)
    result = World(seed, SimOptions(steps=3000)).run()
    assert result.ok, result.line()
    print(checked)
    assert checked["shared"] > 0  # followers did share a frame
