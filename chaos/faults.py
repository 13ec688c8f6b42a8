"""Fault objects: each is applied and healed, and logs both (with timestamps) to faults.jsonl.

Names (``chaos run --faults a,b,...``):

    kill-<sel>        SIGKILL the selected replicas; heal: start them again
    suspend-<sel>     SIGSTOP; heal: SIGCONT (a paused process: peers and clients see silence)
    crash-<sel>       SIGKILL, then lose everything written since each file's last fsync
                      (chaos.unsynced); heal: start them again
    skew-<sel>        restart the replicas on a skewed clock (DLEDGER_CLOCK_SKEW="offset_s,drift_ppm",
                      random signs, magnitudes up to --skew); heal: restart them on the host's clock
    bitflip-<sel>     stop the replicas, flip one bit in the body of one committed message of each
                      one's log, start them: the store must refuse to open it or repair it, never
                      serve the damaged bytes (the message is read back from it: detail.probe);
                      heal: a replica that refused to start gets its data set aside
                      (cluster/damaged/) and starts empty, catching up from the leader
    truncate-<sel>    the same with the newest log segment cut short by up to 2 KiB (a torn write)
    partition-<shape> cut the Raft links between the sides (Toxiproxy: proxies disabled);
                      heal: enable them
    <toxic>[-<scope>] a Toxiproxy toxic on the links in scope; heal: remove it
    consumer-restart  stop one of the workload's consumers; heal: start it again (a new instance)
    consumer-join     start one more consumer; heal: stop it (both rebalance the group)
    poison            the requests that once made a poison entry; checks every replica alive and
                      refusing alike (chaos.poison)
    a+b[+c...]        the faults together, applied in order, healed in reverse order ("partition a
                      follower and kill the leader": partition-follower+kill-leader); a later
                      part's follower/random/minority/majority choice avoids the nodes an earlier
                      part hit ("pause one node while crashing another": suspend-random+crash-random)

    <sel>   leader | follower | random | minority | majority | fixed | all
            (chaos.selection; fixed: --fixed-node)
    <shape> leader | follower | random | minority | bridge
    <toxic> latency | bandwidth | timeout | reset-peer | slicer   (chaos.toxi.TOXIC_DEFAULTS)
    <scope> all (default) | raft | client | leader

Every fault acts on every broker group of the target. A selector with nothing to pick (no leader
during an election that outlasts ``leader_wait_s``) logs the apply with no targets and a
``skipped`` reason, and its heal does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

from chaos.damage import DAMAGE_KINDS, DamageFault
from chaos.history import FaultRecord, JsonlWriter, now_us
from chaos.layout import ProxySpec
from chaos.poison import POISON_FAULT, PoisonFault
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
from chaos.unsynced import synced_at

NODE_ACTIONS = ("kill", "suspend", "crash")
TOXICS = ("latency", "bandwidth", "timeout", "reset-peer", "slicer")
CONSUMER_FAULTS = ("consumer-restart", "consumer-join")
SKEW_DEFAULT = (600.0, 50_000.0)  # offset_s, drift_ppm: the largest magnitudes a skew fault picks
SKEW_ENV = "DLEDGER_CLOCK_SKEW"  # dledger.clock.process_clock() reads it


class ConsumerControl(Protocol):
    """What the consumer faults ask of the workload (``chaos.workload.Workload``)."""

    async def leave(self, rng: random.Random) -> str | None: ...
    async def rejoin(self, name: str) -> None: ...
    async def join(self) -> str: ...
    async def part(self, name: str) -> None: ...


class WorkloadControl(ConsumerControl, Protocol):
    """... and what a gated crash asks: the log position of the newest message the workload has seen
    acknowledged by a broker group (None: nothing acknowledged there yet), and a call at every
    acknowledgement (``on_ack(callback)`` returns the function that ends the calls)."""

    def newest_acked_position(self, group: str) -> int | None: ...
    def on_ack(self, callback: Callable[[], None]) -> Callable[[], None]: ...


CRASH_GATES = ("all", "majority")
# A gated crash looks every GATE_GAP_S (a look freezes the victims for about a millisecond: they run
# most of the time), and at once after an acknowledgement that came meanwhile.
GATE_GAP_S = 0.004


@dataclasses.dataclass
class FaultContext:
    target: Target
    log: JsonlWriter
    rng: random.Random
    fixed_node: str | None = None  # a node id ("n0"): the fixed selector picks it in every group
    leader_wait_s: float = 5.0
    toxic_params: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    workload: WorkloadControl | None = None
    # A crash fault's precondition (``--crash-when``): None fires at the window's start; "all" waits
    # until the newest acknowledged message of every group it hits is not fsynced on any of its
    # victims, "majority" until it is not fsynced on victims that make a majority of the group (who
    # could elect a leader without it). At most ``crash_wait_s``; then it fires anyway (detail.gate).
    # When the gate was met, the heal brings the victims without the message back first.
    crash_gate: str | None = None
    crash_wait_s: float = 0.0
    restart_wait_s: float = 30.0  # after a met gate: how long the first victims back get to elect
    skew: tuple[float, float] = SKEW_DEFAULT
    damaged_dir: str | None = None  # where replicas that refused their damaged data are set aside
    # Within one window: the nodes its faults hit so far (a later part avoids them), and the
    # composite fault's name (recorded with every part's lines).
    taken: set[str] = dataclasses.field(default_factory=set)
    composite: str | None = None

    def record(self, fault: str, action: str, targets: list[str], detail: dict[str, Any], at_us: int) -> None:
        if self.composite is not None:
            detail = {**detail, "composite": self.composite}
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
        self.first_back: list[Member] = []  # a met crash gate: the victims without the ack come back first

    async def apply(self, ctx: FaultContext) -> None:
        self.victims, self.first_back, leaders, skipped = [], [], {}, []
        for group, members in sorted(groups_of(ctx.target.members()).items()):
            leader = await _leader(ctx, members, self.selector == "leader")
            leaders[group] = leader
            fixed = next((m.name for m in members if m.node_id == ctx.fixed_node), ctx.fixed_node)
            try:
                names = choose_nodes(self.selector, [m.name for m in members], leader, ctx.rng, fixed,
                                     frozenset(ctx.taken))
            except NoTarget as exc:
                skipped.append(f"{group}: {exc}")
                continue
            self.victims += [m for m in members if m.name in names]
        ctx.taken.update(m.name for m in self.victims)
        detail: dict[str, Any] = {"leaders": leaders}
        if self.action == "crash" and ctx.crash_gate is not None and self.victims:
            gate = detail["gate"] = await wait_for_unsynced_ack(ctx, self.victims)  # returns with them frozen
            if gate["met"]:
                unsynced = {name for g in gate["groups"].values() for name in g["unsynced_on"]}
                self.first_back = [m for m in self.victims if m.name in unsynced]
        at_us, t0 = now_us(), time.monotonic()
        if self.action == "suspend":
            for m in self.victims:
                await ctx.target.suspend(m)
        else:
            # One instant for every victim (a coordinated power cut): none of them writes or syncs
            # anything after another one died, so each keeps exactly what it had fsynced then.
            await ctx.target.kill_all(self.victims)
            if self.action == "crash":
                detail["lost_unsynced"] = {m.name: (await ctx.target.lose_unsynced(m)).detail()
                                           for m in self.victims}
        if skipped:
            detail["skipped"] = skipped
        detail["took_ms"] = ms_since(t0)
        ctx.record(self.name, "apply", [m.name for m in self.victims], detail, at_us)

    async def heal(self, ctx: FaultContext) -> None:
        at_us, t0 = now_us(), time.monotonic()
        detail: dict[str, Any] = {}
        if self.action == "suspend":
            for m in self.victims:
                await ctx.target.resume(m)
        else:
            first = self.first_back if len(self.first_back) < len(self.victims) else []
            if first:
                # Power comes back in any order; after a met gate, in the order that loses the
                # acknowledged message: the victims without it first, the others once those elected.
                for m in first:
                    await ctx.target.start(m)
                detail["restart_order"] = [[m.name for m in first],
                                           [m.name for m in self.victims if m not in first]]
                detail["first_leaders"] = await _leaders_among(ctx, first)
            for m in self.victims:
                if m not in first:
                    await ctx.target.start(m)
        detail["took_ms"] = ms_since(t0)
        ctx.record(self.name, "heal", [m.name for m in self.victims], detail, at_us)
        self.victims, self.first_back = [], []


async def _leaders_among(ctx: FaultContext, first: list[Member]) -> dict[str, str | None]:
    """Per group of ``first``: the leader it elected from among ``first`` (None after
    ``ctx.restart_wait_s``)."""
    out: dict[str, str | None] = {}
    for group, ms in sorted(groups_of(first).items()):
        names = {m.name for m in ms}

        async def elected(ms: list[Member] = ms, names: set[str] = names) -> str | None:
            leader = await find_leader(ctx.target, ms)
            return leader if leader in names else None

        try:
            out[group] = str(await wait_for(elected, ctx.restart_wait_s, f"a leader among {sorted(names)}", 0.1))
        except TimeoutError:
            out[group] = None
    return out


async def wait_for_unsynced_ack(ctx: FaultContext, victims: list[Member]) -> dict[str, Any]:
    """The gate of a crash (``ctx.crash_gate``): freeze the victims (SIGSTOP, one instant), look
    whether the newest message the workload saw acknowledged by each of their groups is missing
    from the fsynced part of enough victims' logs (their synced-size tables), and return with them
    still frozen when it is — the crash then fires at that instant — or thaw them and look again
    ``GATE_GAP_S`` later (at once after an acknowledgement), for at most ``ctx.crash_wait_s`` (then it
    fires anyway: ``met`` false)."""
    assert ctx.workload is not None
    t0 = time.monotonic()
    checks, last = 0, dict[str, Any]()
    acked = asyncio.Event()
    stop_calls = ctx.workload.on_ack(acked.set)
    try:
        while True:
            await ctx.target.freeze(victims)
            checks += 1
            try:
                met, last = unsynced_ack(ctx, victims)
            except BaseException:
                await ctx.target.thaw(victims)
                raise
            waited = time.monotonic() - t0
            if met or waited >= ctx.crash_wait_s:
                return {"mode": ctx.crash_gate, "met": met, "waited_ms": round(waited * 1000, 1),
                        "checks": checks, "groups": last}
            await ctx.target.thaw(victims)
            acked.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(GATE_GAP_S):
                    await acked.wait()
    finally:
        stop_calls()


def unsynced_ack(ctx: FaultContext, victims: list[Member]) -> tuple[bool, dict[str, Any]]:
    """Whether a crash of the (frozen) ``victims`` now loses an acknowledged message, per the gate's
    mode (``FaultContext.crash_gate``), and what was seen per group."""
    assert ctx.crash_gate in CRASH_GATES and ctx.workload is not None
    sizes = {g: len(ms) for g, ms in groups_of(ctx.target.members()).items()}
    met, seen = True, {}
    for group, ms in sorted(groups_of(victims).items()):
        position = ctx.workload.newest_acked_position(group)
        unsynced = [] if position is None else [
            m.name for m in ms if not synced_at(ctx.target.data_path(m), ctx.target.synced_sizes(m), position)]
        need = len(ms) if ctx.crash_gate == "all" else sizes[group] // 2 + 1
        seen[group] = {"newest_acked_position": position, "unsynced_on": unsynced}
        met = met and position is not None and len(unsynced) >= need
    return met, seen


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
            leader = await _leader(ctx, members, self.shape in ("leader", "follower"))
            try:
                pairs = partition_pairs(self.shape, [m.name for m in members], leader, ctx.rng,
                                        frozenset(ctx.taken))
            except NoTarget as exc:
                skipped.append(f"{group}: {exc}")
                continue
            self.links += links_of_pairs(pairs, net.links(group))
            detail[group] = {"leader": leader, "cut_pairs": [list(p) for p in pairs]}
            if self.shape != "bridge":  # the isolated node: a later fault of the window avoids it
                ctx.taken.update(_isolated(pairs))
        at_us, t0 = now_us(), time.monotonic()
        await net.cut(self.links)
        if skipped:
            detail["skipped"] = skipped
        detail["took_ms"] = ms_since(t0)
        ctx.record(self.name, "apply", [x.link for x in self.links], detail, at_us)

    async def heal(self, ctx: FaultContext) -> None:
        at_us, t0 = now_us(), time.monotonic()
        await ctx.network().restore(self.links)
        ctx.record(self.name, "heal", [x.link for x in self.links], {"took_ms": ms_since(t0)}, at_us)
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
                                  "leaders": leaders, "took_ms": ms_since(t0)}
        if skipped:
            detail["skipped"] = skipped
        ctx.record(self.name, "apply", [x.link for x in self.links], detail, at_us)

    async def heal(self, ctx: FaultContext) -> None:
        at_us, t0 = now_us(), time.monotonic()
        await ctx.network().remove_toxics(self.links)
        ctx.record(self.name, "heal", [x.link for x in self.links], {"toxic": self.toxic, "took_ms": ms_since(t0)},
                   at_us)
        self.links = []


def _isolated(pairs: list[tuple[str, str]]) -> set[str]:
    """The nodes on the small side of a partition: those in every cut pair (one node isolated from
    the rest appears in all of them)."""
    if not pairs:
        return set()
    common = set(pairs[0])
    for p in pairs[1:]:
        common &= set(p)
    return common


class SkewFault:
    """Restart replicas on skewed clocks (``DLEDGER_CLOCK_SKEW``); heal: on the host's clock."""

    def __init__(self, name: str, selector: str):
        assert selector in NODE_SELECTORS
        self.name, self.selector = name, selector
        self.victims: list[Member] = []

    async def apply(self, ctx: FaultContext) -> None:
        self.victims, leaders, skipped = await pick_victims(ctx, self.selector)
        at_us, t0 = now_us(), time.monotonic()
        max_offset, max_drift = ctx.skew
        skews = {}
        for m in self.victims:
            offset = round(ctx.rng.uniform(0.1, 1.0) * max_offset * ctx.rng.choice((-1, 1)), 3)
            drift = round(ctx.rng.uniform(0.1, 1.0) * max_drift * ctx.rng.choice((-1, 1)), 1)
            skews[m.name] = f"{offset},{drift}"
            await ctx.target.kill(m)
            ctx.target.set_env(m, {SKEW_ENV: skews[m.name]})
            await ctx.target.start(m)
        detail: dict[str, Any] = {"leaders": leaders, "skew": skews, "took_ms": ms_since(t0)}
        if skipped:
            detail["skipped"] = skipped
        ctx.record(self.name, "apply", [m.name for m in self.victims], detail, at_us)

    async def heal(self, ctx: FaultContext) -> None:
        at_us, t0 = now_us(), time.monotonic()
        for m in self.victims:
            await ctx.target.kill(m)
            ctx.target.set_env(m, None)
            await ctx.target.start(m)
        ctx.record(self.name, "heal", [m.name for m in self.victims], {"took_ms": ms_since(t0)}, at_us)
        self.victims = []


async def pick_victims(ctx: FaultContext, selector: str) -> tuple[list[Member], dict[str, str | None], list[str]]:
    """The members ``selector`` picks in every group (avoiding ``ctx.taken``), marked taken."""
    victims: list[Member] = []
    leaders: dict[str, str | None] = {}
    skipped: list[str] = []
    for group, members in sorted(groups_of(ctx.target.members()).items()):
        leader = await _leader(ctx, members, selector in ("leader", "follower"))
        leaders[group] = leader
        fixed = next((m.name for m in members if m.node_id == ctx.fixed_node), ctx.fixed_node)
        try:
            names = choose_nodes(selector, [m.name for m in members], leader, ctx.rng, fixed, frozenset(ctx.taken))
        except NoTarget as exc:
            skipped.append(f"{group}: {exc}")
            continue
        victims += [m for m in members if m.name in names]
    ctx.taken.update(m.name for m in victims)
    return victims, leaders, skipped


class ConsumerFault:
    """``consumer-restart``: one consumer leaves and comes back; ``consumer-join``: one more joins
    and parts. Both make the group rebalance (targets: ``consumer:<name>``)."""

    def __init__(self, name: str):
        assert name in CONSUMER_FAULTS
        self.name = name
        self.consumer: str | None = None

    async def apply(self, ctx: FaultContext) -> None:
        at_us, t0 = now_us(), time.monotonic()
        detail: dict[str, Any] = {}
        if ctx.workload is None:
            detail["skipped"] = "no workload to act on"
        elif self.name == "consumer-restart":
            self.consumer = await ctx.workload.leave(ctx.rng)
            if self.consumer is None:
                detail["skipped"] = "fewer than two consumers running"
        else:
            self.consumer = await ctx.workload.join()
        detail["took_ms"] = ms_since(t0)
        ctx.record(self.name, "apply", [f"consumer:{self.consumer}"] if self.consumer else [], detail, at_us)

    async def heal(self, ctx: FaultContext) -> None:
        at_us, t0 = now_us(), time.monotonic()
        targets = [f"consumer:{self.consumer}"] if self.consumer else []
        if self.consumer is not None and ctx.workload is not None:
            if self.name == "consumer-restart":
                await ctx.workload.rejoin(self.consumer)
            else:
                await ctx.workload.part(self.consumer)
        ctx.record(self.name, "heal", targets, {"took_ms": ms_since(t0)}, at_us)
        self.consumer = None


class CompositeFault:
    """Several faults in one window: applied in order, healed in reverse (module doc)."""

    def __init__(self, name: str, parts: list[Fault]):
        self.name, self.parts = name, parts

    async def apply(self, ctx: FaultContext) -> None:
        ctx.composite = self.name
        try:
            for part in self.parts:
                await part.apply(ctx)
        finally:
            ctx.composite = None

    async def heal(self, ctx: FaultContext) -> None:
        ctx.composite = self.name
        try:
            for part in reversed(self.parts):
                await part.heal(ctx)
        finally:
            ctx.composite = None


def ms_since(t0: float) -> float:
    return round((time.monotonic() - t0) * 1000, 1)


# The standard mix (``chaos run --faults standard``): single faults, two faults at once, coordinated
# power loss, consumer churn during faults, clock skew and damaged files. With the default 10 s
# windows, 300 s run every one of them once.
STANDARD_FAULTS = (
    "kill-leader",
    "partition-leader",
    "crash-all",
    "partition-follower+kill-leader",
    "suspend-random+crash-random",
    "skew-random",
    "crash-leader+consumer-restart",
    "bitflip-random",
    "kill-random+consumer-join",
    "truncate-follower",
    "latency",
    "partition-bridge+consumer-restart",
    "suspend-leader",
    "crash-majority",
    "skew-leader+partition-follower",
)


def expand_faults(names: list[str]) -> list[str]:
    """``standard`` stands for STANDARD_FAULTS."""
    out: list[str] = []
    for n in names:
        out += list(STANDARD_FAULTS) if n == "standard" else [n]
    return out


def fault_names() -> list[str]:
    names = [f"{a}-{s}" for a in (*NODE_ACTIONS, "skew", *DAMAGE_KINDS) for s in NODE_SELECTORS]
    names += [f"partition-{s}" for s in PARTITION_SHAPES]
    names += [t for t in TOXICS] + [f"{t}-{s}" for t in TOXICS for s in LINK_SCOPES]
    names += [*CONSUMER_FAULTS, POISON_FAULT]
    return names


def make_fault(name: str) -> Fault:
    """The fault object for a name, ``a+b`` composites included (ValueError with the known names
    otherwise)."""
    if "+" in name:
        parts = name.split("+")
        return CompositeFault(name, [make_fault(p) for p in parts])
    if name in CONSUMER_FAULTS:
        return ConsumerFault(name)
    if name == POISON_FAULT:
        return PoisonFault(name)
    for action in NODE_ACTIONS:
        if name.startswith(action + "-") and name[len(action) + 1 :] in NODE_SELECTORS:
            return NodeFault(name, action, name[len(action) + 1 :])
    if name.startswith("skew-") and name[len("skew-") :] in NODE_SELECTORS:
        return SkewFault(name, name[len("skew-") :])
    for kind in DAMAGE_KINDS:
        if name.startswith(kind + "-") and name[len(kind) + 1 :] in NODE_SELECTORS:
            return DamageFault(name, kind, name[len(kind) + 1 :])
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
