"""Fault objects against an in-memory target: what each applies, heals and logs."""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from chaos.faults import (
    FaultContext,
    NodeFault,
    PartitionFault,
    ToxicFault,
    fault_names,
    make_fault,
    parse_toxic_params,
)
from chaos.history import JsonlWriter, read_jsonl
from tests.chaos.fakes import FakeTarget

_open: list[JsonlWriter] = []


@pytest.fixture(autouse=True)
def _close_writers() -> Iterator[None]:
    yield
    while _open:
        _open.pop().close()


def context(tmp_path: Any, target: FakeTarget, **kw: Any) -> FaultContext:
    log = JsonlWriter(str(tmp_path / "faults.jsonl"))
    _open.append(log)
    return FaultContext(target, log, random.Random(1), leader_wait_s=0.1, **kw)


def lines(tmp_path: Any) -> list[dict[str, Any]]:
    return list(read_jsonl(str(tmp_path / "faults.jsonl")))


def test_every_listed_name_makes_a_fault_and_others_are_refused() -> None:
    names = fault_names()
    assert {"kill-leader", "suspend-random", "crash-minority", "kill-majority", "kill-fixed", "crash-all",
            "partition-leader", "partition-minority", "partition-bridge", "latency", "bandwidth-raft",
            "timeout-client", "reset-peer-leader", "slicer"} <= set(names)
    for name in names:
        assert make_fault(name).name == name
    assert isinstance(make_fault("reset-peer"), ToxicFault)
    for bad in ("kill", "kill-everyone", "partition", "latency-sometimes", "nap-leader"):
        with pytest.raises(ValueError, match="unknown fault"):
            make_fault(bad)


async def test_kill_leader_kills_the_leader_and_heal_restarts_it(tmp_path: Any) -> None:
    t = FakeTarget(str(tmp_path))
    ctx = context(tmp_path, t)
    f = make_fault("kill-leader")
    await f.apply(ctx)
    assert t.running == {"RaftNode00-n0", "RaftNode00-n2"}
    await f.heal(ctx)
    assert t.calls == [("kill", "RaftNode00-n1"), ("start", "RaftNode00-n1")]
    got = lines(tmp_path)
    assert [(x["fault"], x["action"], x["targets"]) for x in got] == [
        ("kill-leader", "apply", ["RaftNode00-n1"]), ("kill-leader", "heal", ["RaftNode00-n1"])]
    assert got[0]["detail"]["leaders"] == {"RaftNode00": "RaftNode00-n1"}
    assert got[0]["time_us"] <= got[1]["time_us"]


async def test_crash_cuts_files_only_after_the_kill_and_logs_the_loss(tmp_path: Any) -> None:
    t = FakeTarget(str(tmp_path))
    ctx = context(tmp_path, t)
    f = make_fault("crash-majority")
    await f.apply(ctx)
    victims = [name for op, name in t.calls if op == "kill"]
    assert len(victims) == 2
    # one instant: both die (one kill_all) before either one's files are cut
    assert t.kill_batches == [tuple(victims)]
    assert t.calls == [("kill", v) for v in victims] + [("lose_unsynced", v) for v in victims]
    await f.heal(ctx)
    assert t.running == {m.name for m in t.members()}
    detail = lines(tmp_path)[0]["detail"]
    assert set(detail["lost_unsynced"]) == set(victims)
    assert detail["lost_unsynced"][victims[0]]["bytes_lost"] == 42


async def test_suspend_and_fixed_selector(tmp_path: Any) -> None:
    t = FakeTarget(str(tmp_path))
    ctx = context(tmp_path, t, fixed_node="n2")
    f = make_fault("suspend-fixed")
    await f.apply(ctx)
    assert t.suspended == {"RaftNode00-n2"} and t.running == {m.name for m in t.members()}
    await f.heal(ctx)
    assert not t.suspended


async def test_without_a_leader_the_fault_is_logged_as_skipped(tmp_path: Any) -> None:
    t = FakeTarget(str(tmp_path), leader_node=None)
    ctx = context(tmp_path, t)
    f = make_fault("kill-leader")
    await f.apply(ctx)
    await f.heal(ctx)
    assert t.calls == []
    got = lines(tmp_path)
    assert got[0]["targets"] == [] and "no leader" in got[0]["detail"]["skipped"][0]


async def test_partition_leader_cuts_both_directions_of_the_leaders_pairs(tmp_path: Any) -> None:
    t = FakeTarget(str(tmp_path))
    assert t.network is not None
    ctx = context(tmp_path, t)
    f = make_fault("partition-leader")
    assert isinstance(f, PartitionFault)
    await f.apply(ctx)
    assert t.network.cut_links == {"RaftNode00-n1->RaftNode00-n0", "RaftNode00-n0->RaftNode00-n1",
                                   "RaftNode00-n1->RaftNode00-n2", "RaftNode00-n2->RaftNode00-n1"}
    await f.heal(ctx)
    assert t.network.cut_links == set()
    got = lines(tmp_path)
    assert got[0]["detail"]["RaftNode00"]["cut_pairs"] == [["RaftNode00-n0", "RaftNode00-n1"],
                                                           ["RaftNode00-n1", "RaftNode00-n2"]]
    assert sorted(got[0]["targets"]) == sorted(got[1]["targets"])


async def test_faults_act_on_every_group(tmp_path: Any) -> None:
    t = FakeTarget(str(tmp_path), groups=2)
    ctx = context(tmp_path, t)
    f = make_fault("kill-leader")
    await f.apply(ctx)
    assert [name for _op, name in t.calls] == ["RaftNode00-n1", "RaftNode01-n1"]
    assert isinstance(f, NodeFault)
    await f.heal(ctx)


async def test_toxic_on_client_links_with_parameters(tmp_path: Any) -> None:
    t = FakeTarget(str(tmp_path))
    assert t.network is not None
    ctx = context(tmp_path, t, toxic_params=parse_toxic_params(["latency.latency=250", "latency.jitter=10"]))
    f = make_fault("latency-client")
    await f.apply(ctx)
    assert set(t.network.toxics) == {"client->RaftNode00-n0", "client->RaftNode00-n1", "client->RaftNode00-n2"}
    await f.heal(ctx)
    assert t.network.toxics == {}
    detail = lines(tmp_path)[0]["detail"]
    assert detail["toxic"] == "latency" and detail["attributes"] == {"latency": 250, "jitter": 10}


def test_toxic_parameters_are_checked() -> None:
    assert parse_toxic_params(["reset-peer.timeout=100"]) == {"reset_peer": {"timeout": 100}}
    for bad in ("latency=100", "latency.speed=1", "nope.latency=1", "latency.latency=fast"):
        with pytest.raises(ValueError):
            parse_toxic_params([bad])


class FakeWorkload:
    def __init__(self) -> None:
        self.running = {"c0", "c1"}
        self.calls: list[tuple[str, str]] = []

    async def leave(self, rng: random.Random) -> str | None:
        name = sorted(self.running)[0] if len(self.running) > 1 else None
        if name:
            self.running.discard(name)
            self.calls.append(("leave", name))
        return name

    async def rejoin(self, name: str) -> None:
        self.running.add(name)
        self.calls.append(("rejoin", name))

    async def join(self) -> str:
        self.running.add("c2")
        self.calls.append(("join", "c2"))
        return "c2"

    async def part(self, name: str) -> None:
        self.running.discard(name)
        self.calls.append(("part", name))


async def test_composite_faults_pick_other_nodes_and_heal_in_reverse(tmp_path: Any) -> None:
    """"Pause one node while crashing another": the crash never picks the suspended node."""
    for seed in range(20):
        t = FakeTarget(str(tmp_path / str(seed)))
        ctx = FaultContext(t, JsonlWriter(str(tmp_path / f"f{seed}.jsonl")), random.Random(seed), leader_wait_s=0.1)
        _open.append(ctx.log)
        f = make_fault("suspend-random+crash-random")
        await f.apply(ctx)
        (paused,) = t.suspended
        crashed = [name for op, name in t.calls if op == "kill"]
        assert crashed and paused not in crashed
        await f.heal(ctx)
        assert [op for op, _ in t.calls][-2:] == ["start", "resume"]  # reverse order
        got = list(read_jsonl(str(tmp_path / f"f{seed}.jsonl")))
        assert [(x["fault"], x["action"]) for x in got] == [("suspend-random", "apply"), ("crash-random", "apply"),
                                                           ("crash-random", "heal"), ("suspend-random", "heal")]
        assert all(x["detail"]["composite"] == "suspend-random+crash-random" for x in got)


async def test_partition_a_follower_and_kill_the_leader(tmp_path: Any) -> None:
    t = FakeTarget(str(tmp_path))
    assert t.network is not None
    ctx = context(tmp_path, t)
    f = make_fault("partition-follower+kill-leader")
    await f.apply(ctx)
    (isolated,) = set.intersection(*(set(link.split("->")) for link in t.network.cut_links))
    assert isolated != "RaftNode00-n1" and len(t.network.cut_links) == 4  # a follower, cut off both ways
    assert t.calls == [("kill", "RaftNode00-n1")]  # the leader
    await f.heal(ctx)
    assert t.network.cut_links == set() and t.running == {m.name for m in t.members()}


async def test_skew_restarts_on_a_skewed_clock_and_back(tmp_path: Any) -> None:
    t = FakeTarget(str(tmp_path))
    ctx = context(tmp_path, t, skew=(60.0, 1000.0))
    f = make_fault("skew-follower")
    await f.apply(ctx)
    (victim,) = {name for _op, name in t.calls}
    assert victim != "RaftNode00-n1"
    offset, drift = (float(x) for x in t.started_with[victim]["DLEDGER_CLOCK_SKEW"].split(","))
    assert 6 <= abs(offset) <= 60 and 100 <= abs(drift) <= 1000
    await f.heal(ctx)
    assert t.started_with[victim] == {} and t.calls == [("kill", victim), ("start", victim)] * 2
    assert lines(tmp_path)[0]["detail"]["skew"][victim] == f"{offset},{drift}"


async def test_consumer_faults_churn_the_group(tmp_path: Any) -> None:
    t = FakeTarget(str(tmp_path))
    w = FakeWorkload()
    ctx = context(tmp_path, t, workload=w)
    for name in ("consumer-restart", "consumer-join"):
        f = make_fault(name)
        await f.apply(ctx)
        await f.heal(ctx)
    assert w.calls == [("leave", "c0"), ("rejoin", "c0"), ("join", "c2"), ("part", "c2")]
    assert [x["targets"] for x in lines(tmp_path)] == [["consumer:c0"]] * 2 + [["consumer:c2"]] * 2


async def test_a_replica_that_refuses_its_damaged_log_is_set_aside_at_heal(tmp_path: Any) -> None:
    from chaos.faults import DamageFault

    class Refusing(FakeTarget):
        async def start(self, m: Any) -> None:
            await super().start(m)
            if ("set_aside", m.name) not in self.calls:
                self.running.discard(m.name)  # the store refuses to open: the process exits

    t = Refusing(str(tmp_path))
    ctx = context(tmp_path, t, damaged_dir=str(tmp_path / "damaged"))
    f = make_fault("truncate-follower")
    assert isinstance(f, DamageFault)
    (tmp_path / "data").mkdir()
    for m in t.members():
        os.makedirs(f"{t.data_path(m)}/store/log")
        with open(f"{t.data_path(m)}/store/log/{0:020d}", "wb") as out:
            out.write(b"x" * 5000)
    await f.apply(ctx)
    await f.heal(ctx)
    (apply_line, heal_line) = lines(tmp_path)
    (victim,) = apply_line["targets"]
    damage = apply_line["detail"]["damage"][victim]
    assert damage["started"] == "exited" and 1 <= damage["cut_bytes"] <= 2048
    assert os.path.getsize(f"{t.data_path(t.members()[0])}/store/log/{0:020d}") in (5000, 5000 - damage["cut_bytes"])
    assert heal_line["detail"]["replicas"][victim]["set_aside"].startswith(str(tmp_path / "damaged"))
    assert t.calls[-2:] == [("set_aside", victim), ("start", victim)] and victim in t.running


class AckedAt:
    """The workload's side of a gated crash: the newest acknowledged position per broker group."""

    def __init__(self, position: int | None):
        self.position = position
        self.listeners: list[Callable[[], None]] = []

    def newest_acked_position(self, group: str) -> int | None:
        return self.position

    def on_ack(self, callback: Callable[[], None]) -> Callable[[], None]:
        self.listeners.append(callback)
        return lambda: self.listeners.remove(callback)


def segment(t: FakeTarget, name: str, size: int, synced: int) -> None:
    """A replica's one log segment (first position 0) of ``size`` bytes, ``synced`` of them fsynced."""
    log_dir = os.path.join(t.tmp, "data", name, "store", "log")
    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, "0" * 20)
    with open(path, "wb") as f:
        f.write(b"x" * size)
    st = os.stat(path)
    t.synced[name] = {(st.st_dev, st.st_ino): synced}


async def test_a_gated_crash_fires_at_the_first_frozen_instant_an_ack_is_unsynced_everywhere(tmp_path: Any) -> None:
    t = FakeTarget(str(tmp_path))
    for m in t.members():
        segment(t, m.name, 1000, 600)
    acked = AckedAt(None)  # nothing acknowledged yet: never met

    def on_freeze(n: int) -> None:
        # while frozen the state cannot move; between looks it does: an ack the disks already hold,
        # then one past every replica's fsynced end
        acked.position = {1: None, 2: 500, 3: 700}.get(n, 700)
        assert t.suspended == {m.name for m in t.members()}, "looked at only while every victim is frozen"

    t.on_freeze = on_freeze
    ctx = context(tmp_path, t, workload=acked, crash_gate="all", crash_wait_s=30)
    f = make_fault("crash-all")
    await f.apply(ctx)
    assert t.freezes == 3
    assert acked.listeners == [], "the gate stops listening to acknowledgements once it fired"
    assert t.kill_batches == [tuple(m.name for m in t.members())]
    # killed while frozen: nothing ran between the look and the kill
    kill_at = t.calls.index(("kill", "RaftNode00-n0"))
    assert [op for op, _ in t.calls[:kill_at]].count("thaw") == 2 * 3
    assert t.calls[kill_at - 1][0] == "freeze"
    gate = lines(tmp_path)[0]["detail"]["gate"]
    assert gate["met"] and gate["checks"] == 3 and gate["mode"] == "all"
    assert gate["groups"]["RaftNode00"] == {"newest_acked_position": 700,
                                            "unsynced_on": [m.name for m in t.members()]}


async def test_a_majority_gate_needs_a_majority_of_the_group_without_the_ack(tmp_path: Any) -> None:
    t = FakeTarget(str(tmp_path))
    segment(t, "RaftNode00-n0", 1000, 1000)  # the leader synced before it counted itself
    segment(t, "RaftNode00-n1", 1000, 600)  # a follower that answered before its fdatasync
    segment(t, "RaftNode00-n2", 650, 650)  # a follower that has not received it yet
    ctx = context(tmp_path, t, workload=AckedAt(700), crash_gate="majority", crash_wait_s=30)
    await make_fault("crash-all").apply(ctx)
    gate = lines(tmp_path)[0]["detail"]["gate"]
    assert gate["met"] and gate["checks"] == 1
    assert gate["groups"]["RaftNode00"]["unsynced_on"] == ["RaftNode00-n1", "RaftNode00-n2"]


async def test_after_a_met_gate_the_victims_without_the_ack_come_back_first_and_elect(tmp_path: Any) -> None:
    t = FakeTarget(str(tmp_path), leader_node="n2")
    segment(t, "RaftNode00-n0", 1000, 1000)
    segment(t, "RaftNode00-n1", 1000, 600)
    segment(t, "RaftNode00-n2", 650, 650)
    ctx = context(tmp_path, t, workload=AckedAt(700), crash_gate="majority", crash_wait_s=30)
    f = make_fault("crash-all")
    await f.apply(ctx)
    t.calls.clear()
    await f.heal(ctx)
    assert t.calls == [("start", "RaftNode00-n1"), ("start", "RaftNode00-n2"), ("start", "RaftNode00-n0")]
    heal = lines(tmp_path)[1]["detail"]
    assert heal["restart_order"] == [["RaftNode00-n1", "RaftNode00-n2"], ["RaftNode00-n0"]]
    assert heal["first_leaders"] == {"RaftNode00": "RaftNode00-n2"}


async def test_a_gate_never_met_fires_at_its_deadline_and_says_so(tmp_path: Any) -> None:
    t = FakeTarget(str(tmp_path))
    for m in t.members():
        segment(t, m.name, 1000, 1000)
    ctx = context(tmp_path, t, workload=AckedAt(700), crash_gate="all", crash_wait_s=0.1)
    await make_fault("crash-all").apply(ctx)
    gate = lines(tmp_path)[0]["detail"]["gate"]
    assert not gate["met"] and gate["checks"] >= 2 and gate["waited_ms"] >= 100
    assert gate["groups"]["RaftNode00"]["unsynced_on"] == []
    assert len(t.kill_batches) == 1 and not t.suspended
