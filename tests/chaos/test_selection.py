"""Fault target selection and partition shapes (pure)."""

from __future__ import annotations

import random

import pytest

from chaos.layout import Ports, plan_chaos_cluster
from chaos.selection import (
    NoTarget,
    choose_nodes,
    links_in_scope,
    links_of_pairs,
    majority_size,
    minority_size,
    partition_pairs,
)

THREE = ["G-n0", "G-n1", "G-n2"]
FIVE = [f"G-n{i}" for i in range(5)]


def test_sizes_follow_quorum_arithmetic() -> None:
    assert [minority_size(n) for n in (1, 2, 3, 4, 5)] == [1, 1, 1, 1, 2]
    assert [majority_size(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]


@pytest.mark.parametrize("seed", range(20))
def test_choose_nodes_picks_the_right_count_in_member_order(seed: int) -> None:
    rng = random.Random(seed)
    assert choose_nodes("leader", THREE, "G-n1", rng) == ["G-n1"]
    assert len(choose_nodes("random", THREE, None, rng)) == 1
    assert len(choose_nodes("minority", FIVE, None, rng)) == 2
    majority = choose_nodes("majority", THREE, None, rng)
    assert len(majority) == 2 and majority == sorted(majority)
    assert choose_nodes("fixed", THREE, None, rng, fixed="G-n2") == ["G-n2"]
    assert choose_nodes("all", THREE, None, rng) == THREE


def test_choose_nodes_is_deterministic_for_a_seed() -> None:
    picks = [choose_nodes("random", FIVE, None, random.Random(7)) for _ in range(3)]
    assert picks[0] == picks[1] == picks[2]
    assert {tuple(choose_nodes("random", FIVE, None, random.Random(s))) for s in range(50)} == {(m,) for m in FIVE}


def test_choose_nodes_without_a_target() -> None:
    with pytest.raises(NoTarget):
        choose_nodes("leader", THREE, None, random.Random(0))
    with pytest.raises(NoTarget):
        choose_nodes("leader", THREE, "elsewhere", random.Random(0))
    with pytest.raises(NoTarget):
        choose_nodes("fixed", THREE, None, random.Random(0), fixed="G-n9")
    with pytest.raises(ValueError, match="unknown node selector"):
        choose_nodes("everyone", THREE, None, random.Random(0))


def test_partition_leader_cuts_every_pair_of_the_leader() -> None:
    assert partition_pairs("leader", THREE, "G-n1", random.Random(0)) == [("G-n0", "G-n1"), ("G-n1", "G-n2")]
    with pytest.raises(NoTarget):
        partition_pairs("leader", THREE, None, random.Random(0))


@pytest.mark.parametrize("seed", range(20))
def test_minority_split_separates_a_minority_from_the_rest(seed: int) -> None:
    pairs = partition_pairs("minority", FIVE, None, random.Random(seed))
    cut = {frozenset(p) for p in pairs}
    # the cut graph is complete bipartite between a side of 2 and a side of 3
    degree = {m: sum(m in p for p in cut) for m in FIVE}
    assert sorted(degree.values()) == [2, 2, 2, 3, 3]
    assert len(cut) == 6


@pytest.mark.parametrize("seed", range(20))
def test_bridge_leaves_one_node_talking_to_both_sides(seed: int) -> None:
    pairs = partition_pairs("bridge", THREE, None, random.Random(seed))
    assert len(pairs) == 1  # a - b - c: only a<->c is cut
    bridge = next(m for m in THREE if m not in pairs[0])
    assert bridge in THREE
    pairs5 = {frozenset(p) for p in partition_pairs("bridge", FIVE, None, random.Random(seed))}
    assert len(pairs5) == 4  # {a,b} x {d,e}
    uncut = [m for m in FIVE if not any(m in p for p in pairs5)]
    assert len(uncut) == 1  # the bridge


def test_links_of_pairs_and_scopes_on_a_planned_cluster(tmp_path: object) -> None:
    layout = plan_chaos_cluster(str(tmp_path), ports=Ports(20000))
    proxies = layout.proxies
    links = links_of_pairs([("RaftNode00-n0", "RaftNode00-n1")], proxies)
    assert sorted(x.link for x in links) == ["RaftNode00-n0->RaftNode00-n1", "RaftNode00-n1->RaftNode00-n0"]
    assert len(links_in_scope("all", proxies, None)) == 9
    assert len(links_in_scope("raft", proxies, None)) == 6
    assert {x.link for x in links_in_scope("client", proxies, None)} == {
        f"client->RaftNode00-n{i}" for i in range(3)}
    leader_links = {x.link for x in links_in_scope("leader", proxies, "RaftNode00-n2")}
    assert leader_links == {"client->RaftNode00-n2", "RaftNode00-n2->RaftNode00-n0", "RaftNode00-n0->RaftNode00-n2",
                            "RaftNode00-n2->RaftNode00-n1", "RaftNode00-n1->RaftNode00-n2"}
    with pytest.raises(NoTarget):
        links_in_scope("leader", proxies, None)
