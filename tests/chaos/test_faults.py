"""Fault objects against an in-memory target: what each applies, heals and logs."""

from __future__ import annotations

import random
from collections.abc import Iterator
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
    assert t.calls == [c for v in victims for c in (("kill", v), ("lose_unsynced", v))]
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
