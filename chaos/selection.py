"""Which replicas and which links a fault hits: pure functions over names, a leader and a seeded RNG.

Node selectors (OpenChaos's names): ``leader``; ``follower`` (one node that does not lead);
``random`` (one node); ``minority`` ((n-1)//2 nodes, at least one); ``majority`` (n//2 + 1 nodes:
the group loses its quorum); ``fixed`` (one named node); ``all`` (the whole group: with ``crash``,
Jepsen's coordinated power loss). ``exclude`` (the nodes another fault of the same window already
hit) is never picked by ``follower``, ``random``, ``minority`` or ``majority``: "pause one node
while crashing *another*".

Partition shapes cut the pairs of a group (both directed links of a pair):

    leader     the leader alone | the rest               n0* | n1 n2
    follower   one follower alone | the rest             n2  | n0* n1
    random     one random node  | the rest               n1  | n0 n2
    minority   a random minority | the majority          (= random for 3 nodes)
    bridge     two halves that share one bridge node     n0 - n1 - n2: n0 and n2 cannot talk,
               (Jepsen's bridge): the middle one of a      n1 talks to both
               shuffled order talks to both sides

Link scopes of network faults: ``all`` links of the group, ``raft`` (broker<->broker), ``client``
(client->broker), ``leader`` (every link that touches the leader).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

from chaos.layout import ProxySpec

NodeSelector = Literal["leader", "follower", "random", "minority", "majority", "fixed", "all"]
PartitionShape = Literal["leader", "follower", "random", "minority", "bridge"]
LinkScope = Literal["all", "raft", "client", "leader"]
NODE_SELECTORS: tuple[str, ...] = ("leader", "follower", "random", "minority", "majority", "fixed", "all")
PARTITION_SHAPES: tuple[str, ...] = ("leader", "follower", "random", "minority", "bridge")
LINK_SCOPES: tuple[str, ...] = ("all", "raft", "client", "leader")


class NoTarget(Exception):
    """The selector has nothing to pick (no leader right now, an unknown fixed node)."""


def minority_size(n: int) -> int:
    return max(1, (n - 1) // 2)


def majority_size(n: int) -> int:
    return n // 2 + 1


def _free(members: Sequence[str], exclude: frozenset[str], n: int) -> list[str]:
    free = [m for m in members if m not in exclude]
    if len(free) < n:
        raise NoTarget(f"{n} node(s) wanted, {len(free)} not already hit by this window's faults")
    return free


def choose_nodes(
    selector: str,
    members: Sequence[str],
    leader: str | None,
    rng: random.Random,
    fixed: str | None = None,
    exclude: frozenset[str] = frozenset(),
) -> list[str]:
    """The members a node fault acts on, in ``members`` order."""
    if not members:
        raise NoTarget("no members")
    if selector == "leader":
        if leader is None or leader not in members:
            raise NoTarget("no leader")
        chosen = {leader}
    elif selector == "follower":
        if leader is None or leader not in members:
            raise NoTarget("no leader: nobody is a follower")
        chosen = {rng.choice(_free([m for m in members if m != leader], exclude, 1))}
    elif selector == "random":
        chosen = {rng.choice(_free(members, exclude, 1))}
    elif selector == "minority":
        n = minority_size(len(members))
        chosen = set(rng.sample(_free(members, exclude, n), n))
    elif selector == "majority":
        n = majority_size(len(members))
        chosen = set(rng.sample(_free(members, exclude, n), n))
    elif selector == "fixed":
        if fixed is None or fixed not in members:
            raise NoTarget(f"fixed node {fixed!r} is not one of {list(members)}")
        chosen = {fixed}
    elif selector == "all":
        chosen = set(members)
    else:
        raise ValueError(f"unknown node selector {selector!r}; known: {', '.join(NODE_SELECTORS)}")
    return [m for m in members if m in chosen]


def partition_pairs(
    shape: str,
    members: Sequence[str],
    leader: str | None,
    rng: random.Random,
    exclude: frozenset[str] = frozenset(),
) -> list[tuple[str, str]]:
    """The unordered pairs (in ``members`` order) whose traffic a partition cuts. The isolated side
    of ``follower``, ``random`` and ``minority`` avoids ``exclude``."""
    order = list(members)
    if shape in ("leader", "follower", "random", "minority"):
        if shape == "leader":
            if leader is None or leader not in members:
                raise NoTarget("no leader")
            side = {leader}
        elif shape == "follower":
            if leader is None or leader not in members:
                raise NoTarget("no leader: nobody is a follower")
            side = {rng.choice(_free([m for m in order if m != leader], exclude, 1))}
        elif shape == "random":
            side = {rng.choice(_free(order, exclude, 1))}
        else:
            n = minority_size(len(order))
            side = set(rng.sample(_free(order, exclude, n), n))
        left, right = side, {m for m in order if m not in side}
    elif shape == "bridge":
        if len(order) < 3:
            raise NoTarget("a bridge needs at least 3 nodes")
        rng.shuffle(order)
        mid = len(order) // 2
        left, right = set(order[:mid]), set(order[mid + 1 :])
    else:
        raise ValueError(f"unknown partition shape {shape!r}; known: {', '.join(PARTITION_SHAPES)}")
    pos = {m: k for k, m in enumerate(members)}
    pairs = {tuple(sorted((a, b), key=pos.__getitem__)) for a in left for b in right}
    return sorted(pairs, key=lambda p: (pos[p[0]], pos[p[1]]))  # type: ignore[arg-type]


def links_of_pairs(pairs: Sequence[tuple[str, str]], proxies: Sequence[ProxySpec]) -> list[ProxySpec]:
    """Both directed Raft links of every pair."""
    wanted = {frozenset(p) for p in pairs}
    return [x for x in proxies if x.kind == "raft" and frozenset((x.src, x.dst)) in wanted]


def links_in_scope(scope: str, proxies: Sequence[ProxySpec], leader: str | None) -> list[ProxySpec]:
    """The links of one group (``proxies``) that a network fault of ``scope`` hits."""
    if scope == "all":
        return list(proxies)
    if scope == "raft":
        return [x for x in proxies if x.kind == "raft"]
    if scope == "client":
        return [x for x in proxies if x.kind == "client"]
    if scope == "leader":
        if leader is None:
            raise NoTarget("no leader")
        return [x for x in proxies if leader in (x.src, x.dst)]
    raise ValueError(f"unknown link scope {scope!r}; known: {', '.join(LINK_SCOPES)}")
