"""Fault objects: each is applied and healed, and logs both (with timestamps) to faults.jsonl.

Names (``chaos run --faults a,b,...``):

    kill-<sel>        SIGKILL the selected replicas; heal: start them again
    suspend-<sel>     SIGSTOP; heal: SIGCONT (a paused process: peers and clients see silence)
    crash-<sel>       SIGKILL, then lose everything written since each file's last fsync
                      (chaos.unsynced); heal: start them again
    partition-<shape> cut the Raft links between the sides (Toxiproxy: proxies disabled);
                      heal: enable them
    <toxic>[-<scope>] a Toxiproxy toxic on the links in scope; heal: remove it

    <sel>   leader | random | minority | majority | fixed | all   (chaos.selection; fixed: --fixed-node)
    <shape> leader | random | minority | bridge
    <toxic> latency | bandwidth | timeout | reset-peer | slicer   (chaos.toxi.TOXIC_DEFAULTS)
    <scope> all (default) | raft | client | leader

Every fault acts on every broker group of the target. A selector with nothing to pick (no leader
during an election that outlasts ``leader_wait_s``) logs the apply with no targets and a
``skipped`` reason, and its heal does nothing.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any, Protocol

from chaos.history import FaultRecord, JsonlWriter, now_us
from chaos.layout import ProxySpec
from chaos.selection import (
    LINK_SCOPES,
    NODE_SELECTORS,
    PARTITION_SHAPES,
    NoTarget,
    choose_nodes,
    links_in_scope,
    links_of_pairs,
    partition_pairs,
)
from chaos.target import Member, Network, Target, find_leader, groups_of, wait_for
from chaos.toxi import TOXIC_DEFAULTS

NODE_ACTIONS = ("kill", "suspend", "crash")
TOXICS = ("latency", "bandwidth", "timeout", "reset-peer", "slicer")


@dataclasses.dataclass
class FaultContext:
    target: Target
    log: JsonlWriter
    rng: random.Random
    fixed_node: str | None = None  # a node id ("n0"): the fixed selector picks it in every group
    leader_wait_s: float = 5.0
    toxic_params: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)

    def record(self, fault: str, action: str, targets: list[str], detail: dict[str, Any], at_us: int) -> None:
        self.log.write(FaultRecord(at_us, fault, action, tuple(targets), detail))  # type: ignore[arg-type]
        self.log.flush()

    def network(self) -> Network:
        if self.target.network is None:
            raise NoTarget("this target has no proxied network")
        return self.target.network


class Fault(Protocol):
    name: str

    async def apply(self, ctx: FaultContext) -> None: ...
    async def heal(self, ctx: FaultContext) -> None: ...


async def _leader(ctx: FaultContext, members: list[Member], needed: bool) -> str | None:
    if not needed:
        return await find_leader(ctx.target, members)
    try:
        return str(await wait_for(lambda: find_leader(ctx.target, members), ctx.leader_wait_s, "a leader", 0.05))
    except TimeoutError:
        return None


class NodeFault:
    def __init__(self, name: str, action: str, selector: str):
        assert action in NODE_ACTIONS and selector in NODE_SELECTORS
        self.name, self.action, self.selector = name, action, selector
        self.victims: list[Member] = []

    async def apply(self, ctx: FaultContext) -> None:
        self.victims, leaders, skipped = [], {}, []
        for group, members in sorted(groups_of(ctx.target.members()).items()):
            leader = await _leader(ctx, members, self.selector == "leader")
            leaders[group] = leader
            fixed = next((m.name for m in members if m.node_id == ctx.fixed_node), ctx.fixed_node)
            try:
                names = choose_nodes(self.selector, [m.name for m in members], leader, ctx.rng, fixed)
            except NoTarget as exc:
                skipped.append(f"{group}: {exc}")
                continue
            self.victims += [m for m in members if m.name in names]
        at_us, t0 = now_us(), time.monotonic()
        detail: dict[str, Any] = {"leaders": leaders}
        losses = {}
        for m in self.victims:
            if self.action == "suspend":
                await ctx.target.suspend(m)
            else:
                await ctx.target.kill(m)
                if self.action == "crash":
                    losses[m.name] = (await ctx.target.lose_unsynced(m)).detail()
        if losses:
            detail["lost_unsynced"] = losses
        if skipped:
            detail["skipped"] = skipped
        detail["took_ms"] = _ms_since(t0)
        ctx.record(self.name, "apply", [m.name for m in self.victims], detail, at_us)

    async def heal(self, ctx: FaultContext) -> None:
        at_us, t0 = now_us(), time.monotonic()
        for m in self.victims:
            if self.action == "suspend":
                await ctx.target.resume(m)
            else:
                await ctx.target.start(m)
        detail = {"took_ms": _ms_since(t0)}
        ctx.record(self.name, "heal", [m.name for m in self.victims], detail, at_us)
        self.victims = []


class PartitionFault:
    def __init__(self, name: str, shape: str):
        assert shape in PARTITION_SHAPES
        self.name, self.shape = name, shape
        self.links: list[ProxySpec] = []

    async def apply(self, ctx: FaultContext) -> None:
        net = ctx.network()
        detail: dict[str, Any] = {}
        self.links, skipped = [], []
        for group, members in sorted(groups_of(ctx.target.members()).items()):
            leader = await _leader(ctx, members, self.shape == "leader")
            try:
                pairs = partition_pairs(self.shape, [m.name for m in members], leader, ctx.rng)
            except NoTarget as exc:
                skipped.append(f"{group}: {exc}")
                continue
            self.links += links_of_pairs(pairs, net.links(group))
            detail[group] = {"leader": leader, "cut_pairs": [list(p) for p in pairs]}
        at_us, t0 = now_us(), time.monotonic()
        await net.cut(self.links)
        if skipped:
            detail["skipped"] = skipped
        detail["took_ms"] = _ms_since(t0)
        ctx.record(self.name, "apply", [x.link for x in self.links], detail, at_us)

    async def heal(self, ctx: FaultContext) -> None:
        at_us, t0 = now_us(), time.monotonic()
        await ctx.network().restore(self.links)
        ctx.record(self.name, "heal", [x.link for x in self.links], {"took_ms": _ms_since(t0)}, at_us)
        self.links = []


class ToxicFault:
    def __init__(self, name: str, toxic: str, scope: str):
        assert toxic in TOXICS and scope in LINK_SCOPES
        self.name, self.toxic, self.scope = name, toxic.replace("-", "_"), scope
        self.links: list[ProxySpec] = []

    async def apply(self, ctx: FaultContext) -> None:
        net = ctx.network()
        attrs = {**TOXIC_DEFAULTS[self.toxic], **ctx.toxic_params.get(self.toxic, {})}
        self.links, skipped, leaders = [], [], {}
        for group, members in sorted(groups_of(ctx.target.members()).items()):
            leader = await _leader(ctx, members, self.scope == "leader")
            leaders[group] = leader
            try:
                self.links += links_in_scope(self.scope, net.links(group), leader)
            except NoTarget as exc:
                skipped.append(f"{group}: {exc}")
        at_us, t0 = now_us(), time.monotonic()
        await net.add_toxic(self.links, self.toxic, attrs)
        detail: dict[str, Any] = {"toxic": self.toxic, "attributes": attrs, "streams": ["upstream", "downstream"],
                                  "leaders": leaders, "took_ms": _ms_since(t0)}
        if skipped:
            detail["skipped"] = skipped
        ctx.record(self.name, "apply", [x.link for x in self.links], detail, at_us)

    async def heal(self, ctx: FaultContext) -> None:
        at_us, t0 = now_us(), time.monotonic()
        await ctx.network().remove_toxics(self.links)
        ctx.record(self.name, "heal", [x.link for x in self.links], {"toxic": self.toxic, "took_ms": _ms_since(t0)},
                   at_us)
        self.links = []


def _ms_since(t0: float) -> float:
    return round((time.monotonic() - t0) * 1000, 1)


def fault_names() -> list[str]:
    names = [f"{a}-{s}" for a in NODE_ACTIONS for s in NODE_SELECTORS]
    names += [f"partition-{s}" for s in PARTITION_SHAPES]
    names += [t for t in TOXICS] + [f"{t}-{s}" for t in TOXICS for s in LINK_SCOPES]
    return names


def make_fault(name: str) -> Fault:
    """The fault object for a name (ValueError with the known names otherwise)."""
    for action in NODE_ACTIONS:
        if name.startswith(action + "-") and name[len(action) + 1 :] in NODE_SELECTORS:
            return NodeFault(name, action, name[len(action) + 1 :])
    if name.startswith("partition-") and name[len("partition-") :] in PARTITION_SHAPES:
        return PartitionFault(name, name[len("partition-") :])
    for toxic in TOXICS:
        if name == toxic:
            return ToxicFault(name, toxic, "all")
        if name.startswith(toxic + "-") and name[len(toxic) + 1 :] in LINK_SCOPES:
            return ToxicFault(name, toxic, name[len(toxic) + 1 :])
    raise ValueError(f"unknown fault {name!r}; known: {', '.join(fault_names())}")


def parse_toxic_params(items: list[str]) -> dict[str, dict[str, int]]:
    """``["latency.latency=200", "bandwidth.rate=32"]`` -> {"latency": {"latency": 200}, ...}."""
    out: dict[str, dict[str, int]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        toxic, dot, attr = key.partition(".")
        toxic = toxic.replace("-", "_")
        if not sep or not dot or toxic not in TOXIC_DEFAULTS or attr not in TOXIC_DEFAULTS[toxic]:
            known = ", ".join(f"{t}.{a}" for t, attrs in TOXIC_DEFAULTS.items() for a in attrs)
            raise ValueError(f"bad toxic parameter {item!r}: expected TOXIC.ATTR=INT, one of {known}")
        try:
            out.setdefault(toxic, {})[attr] = int(value)
        except ValueError:
            raise ValueError(f"bad toxic parameter {item!r}: {value!r} is not an integer") from None
    return out
