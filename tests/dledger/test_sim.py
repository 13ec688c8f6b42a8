"""The deterministic simulator: safety over many seeds, planted bugs caught, replay bit for bit,
and pre-vote scenarios (a rejoining or resumed node does not depose a healthy leader)."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from typing import Any

import pytest

from dledger.records import Refused
from dledger.replica import Request
from dledger.sim.plants import PLANTS, plant, run_job
from dledger.sim.replica import POISON
from dledger.sim.world import SimOptions, World, run_seed

CI_SEEDS = range(1, 201)  # the slow tier's seeds
FAST_SEEDS = range(1, 21)  # the fast tier's: every planted bug is caught within them too
CI_STEPS = 3000
# the fast tier runs the first 20 seeds, the slow tier all 200 (nothing is left out of the slow tier)
SEED_SETS = [
    pytest.param(FAST_SEEDS, id="seeds-1-20"),
    pytest.param(CI_SEEDS, id="seeds-1-200", marks=pytest.mark.slow),
]


def _run_many(seeds: range, options: SimOptions, planted: str | None = None) -> list:
    jobs = [(s, options, planted) for s in seeds]
    with multiprocessing.get_context("spawn").Pool(os.cpu_count() or 2) as pool:
        return pool.map(run_job, jobs, chunksize=4)


@pytest.mark.parametrize("seeds", SEED_SETS)
def test_ci_seeds_hold_every_safety_property(seeds: range) -> None:
    results = _run_many(seeds, SimOptions(steps=CI_STEPS))
    failed = [r.line() for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    # per seed on average: > 50 acknowledged sends, > 1 crash, > 0.5 poison bodies committed and
    # refused alike by every replica (seeds 1-20: 2316, 56 and 65)
    assert sum(r.acked for r in results) > 50 * len(seeds) and sum(r.crashes for r in results) > len(seeds)
    assert sum(r.refused for r in results) > len(seeds) // 2


@pytest.mark.parametrize("seeds", SEED_SETS)
@pytest.mark.parametrize("planted", sorted(PLANTS))
def test_each_planted_bug_is_caught_within_the_ci_seeds(planted: str, seeds: range) -> None:
    results = _run_many(seeds, SimOptions(steps=CI_STEPS), planted)
    caught = [r for r in results if not r.ok]
    assert caught, f"the simulator did not catch {planted} in seeds {seeds.start}..{seeds.stop - 1}"
    print(f"{planted}: caught by {len(caught)} of {len(results)} seeds; first: {caught[0].line()}")


def test_failed_fsyncs_stop_the_replica_and_lose_nothing_acknowledged() -> None:
    """Issue 27 (fsyncgate): with flushes failing with EIO now and then (the pages they did not
    write are lost, whatever later flushes report), the replica fails stop and is restarted; every
    safety property holds. The plant ``ignore-fsync-error`` (the same fault, the error ignored) is
    caught by ``test_each_planted_bug_is_caught_within_the_ci_seeds``."""
    results = _run_many(CI_SEEDS, SimOptions(steps=CI_STEPS, fsync_error_every_s=0.5))
    failed = [r.line() for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    assert sum(r.fail_stops for r in results) > 0  # the fault fired and stopped replicas


# A run per PYTHONHASHSEED (in a subprocess: the hash seed is fixed when the interpreter starts) of
# every seed given, plain and with membership changes; prints [[seed, trace_crc, steps, acked], ...]
# per mode. Found on main 42cb26c: seeds 3, 7 and 37 at 3000 steps gave other trace CRCs under
# other hash seeds (SimNetwork.heal_all iterated a set of frozensets of addresses: the links came
# back up, and the replicas' light ticks ran, in an order that followed the hash seed).
_REPLAY_CODE = """
import json, logging, sys
from dledger.sim.world import SimOptions, run_seed
logging.getLogger("dledger").setLevel(logging.CRITICAL)
steps, seeds = int(sys.argv[1]), [int(s) for s in sys.argv[2:]]
out = {}
for mode, membership in (("plain", False), ("membership", True)):
    rs = [run_seed(s, SimOptions(steps=steps, membership=membership)) for s in seeds]
    out[mode] = [[r.seed, r.trace_crc, r.steps, r.acked] for r in rs]
print(json.dumps(out))
"""


def _replays_under(hash_seeds: list[str], seeds: list[int], steps: int) -> dict[str, Any]:
    procs = {
        h: subprocess.Popen(
            [sys.executable, "-c", _REPLAY_CODE, str(steps), *map(str, seeds)],
            env={**os.environ, "PYTHONHASHSEED": h},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for h in hash_seeds
    }
    outs = {}
    try:
        for h, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=600)
            assert proc.returncode == 0, f"PYTHONHASHSEED={h}: exit {proc.returncode}\n{stderr[-2000:]}"
            outs[h] = json.loads(stdout.strip().splitlines()[-1])
    finally:
        for proc in procs.values():  # none left running if one failed or timed out
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outs


def _assert_same_runs(outs: dict[str, Any]) -> None:
    first, *others = outs
    print(f"replayed under PYTHONHASHSEED {list(outs)}: {outs[first]}")
    for h in others:
        for mode, runs in outs[first].items():
            differ = [(a[0], a[1], b[1]) for a, b in zip(runs, outs[h][mode], strict=True) if a != b]
            assert not differ, f"{mode}: (seed, trace CRC under PYTHONHASHSEED={first}, under {h}): {differ}"


# Fast: seeds 1..20 at 3000 steps under four hash seeds (5 s here). Before the fix plain seeds 2, 7,
# 13 and 15 already differed between hash seeds 0 and 1; the slow set (seeds 1..50 at 9000 steps,
# six hash seeds, 52 s here) had 33 of 50 differ between those two.
REPLAY_SETS = [
    pytest.param([str(h) for h in (0, 1, 3, 987654)], list(range(1, 21)), 3000, id="seeds-1-20"),
    pytest.param(
        [str(h) for h in (0, 1, 2, 3, 4, 5)],
        list(range(1, 51)),
        9000,
        id="seeds-1-50",
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.parametrize(("hash_seeds", "seeds", "steps"), REPLAY_SETS)
def test_a_seed_replays_bit_for_bit_whatever_the_hash_seed(
    hash_seeds: list[str], seeds: list[int], steps: int
) -> None:
    outs = _replays_under(hash_seeds, seeds, steps)
    _assert_same_runs(outs)
    # and in this process (whatever its hash seed) as in theirs
    assert [run_seed(s, SimOptions(steps=steps)).trace_crc for s in seeds[:3]] == [
        r[1] for r in outs[hash_seeds[0]]["plain"][:3]
    ]


def _settled_world(seed: int) -> World:
    world = World(seed, SimOptions(faults=False))
    world.start()
    world.run_for(3.0)
    assert world.leader() is not None
    return world


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_poison_body_is_refused_by_every_replica_and_the_group_keeps_serving(seed: int) -> None:
    """Issue 23: a committed body whose apply fails must not stop any replica. Grouped with a good
    body into one entry, then a follower restarts (it re-applies from its checkpoint): every replica
    refuses the poison body, applies the good one, and the group commits afterwards."""
    world = _settled_world(seed)
    leader = world.leader()
    assert leader is not None and leader.core is not None
    got: list[Any] = []
    leader.core.submit(Request([POISON + b"name too long", b"good body"], 64,
                               lambda locs, exc: got.append(locs if exc is None else exc), leader.clock.monotonic()))
    world.poke(leader.id)
    world.run_for(1.0)
    assert got and isinstance(got[0], list), got
    poison, good = got[0]
    assert poison.index == good.index  # one entry
    assert isinstance(poison.result, Refused) and poison.result.code == "POISON" and isinstance(good.result, int)
    follower = next(r for r in world.replicas.values() if r is not leader)
    world._crash(follower.id, 0.1)  # restarts from its durable checkpoint: applies the entry again
    world.run_for(3.0)
    assert world.checker.outcomes[poison.index] == (poison.result, good.result)
    for r in world.replicas.values():
        assert r.core is not None and r.core.applied_index >= poison.index, r.id
    before = leader.core.commit_index
    world.run_for(2.0)  # the client keeps sending: the group still commits
    assert leader.core.commit_index > before


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_node_rejoining_after_a_partition_does_not_depose_the_leader(seed: int) -> None:
    world = _settled_world(seed)
    leader = world.leader()
    assert leader is not None and leader.core is not None
    term = leader.core.term
    follower = next(n for n in world.replicas if n != leader.id)
    world.isolate(follower)
    world.run_for(10.0)  # many election timeouts: it pre-votes, never raises its term
    isolated = world.replicas[follower].core
    assert isolated is not None and isolated.term == term
    world.heal()
    committed_at_heal = leader.core.commit_index
    world.run_for(5.0)
    assert world.leader() is leader and leader.core.term == term
    assert isolated.commit_index >= committed_at_heal  # caught up by replication


def _cut_from_the_leader(world: World, follower: str) -> None:
    """The follower loses its link to the leader only: it still reaches the other follower, so
    its elections (or pre-votes) go somewhere."""
    leader = world.leader()
    assert leader is not None
    world.network.cut(world.replicas[follower].address, leader.address)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_follower_cut_from_the_leader_only_does_not_depose_it(seed: int) -> None:
    world = _settled_world(seed)
    leader = world.leader()
    assert leader is not None and leader.core is not None
    term = leader.core.term
    follower = next(n for n in world.replicas if n != leader.id)
    _cut_from_the_leader(world, follower)
    world.run_for(10.0)  # its pre-votes are refused by the other follower, which hears the leader
    world.heal()
    world.run_for(5.0)
    assert world.leader() is leader and leader.core.term == term


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_paused_follower_does_not_depose_the_leader(seed: int) -> None:
    world = _settled_world(seed)
    leader = world.leader()
    assert leader is not None and leader.core is not None
    term = leader.core.term
    follower = next(n for n in world.replicas if n != leader.id)
    world.pause(follower, 5.0)  # SIGSTOP: its timers fire the moment it runs again
    world.run_for(8.0)
    assert world.leader() is leader and leader.core.term == term


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_stall_of_every_replica_at_once_elects_nobody(seed: int) -> None:
    """Found in CI: replicas sharing one process (the in-process test groups) all stalled for longer
    than an election timeout (a busy 2-core host, a full garbage collection) and, on resuming, a
    follower found its timer expired and deposed the leader ("stepping down as leader: stale term"),
    though nobody had failed. A tick thread that finds it did not run for half an election timeout
    restarts its election timer (and a leader its quorum check) instead of blaming its peers."""
    world = _settled_world(seed)
    leader = world.leader()
    assert leader is not None and leader.core is not None
    term = leader.core.term
    for node in world.replicas:
        world.pause(node, 1.5)  # SIGSTOP of the whole process: every timer fires on resuming
    world.run_for(5.0)
    assert world.leader() is leader and leader.core.term == term


def test_without_prevote_a_rejoining_node_would_depose_the_leader(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenario above has teeth: with pre-vote off, the rejoining node forces an election."""
    from dledger import replica

    original = replica.ReplicaCore.__init__

    def no_prevote(self: replica.ReplicaCore, *args: object, **kwargs: object) -> None:
        kwargs["prevote"] = False
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(replica.ReplicaCore, "__init__", no_prevote)
    world = _settled_world(1)
    leader = world.leader()
    assert leader is not None and leader.core is not None
    term = leader.core.term
    follower = next(n for n in world.replicas if n != leader.id)
    # Cut from the leader only (a fully isolated node does not campaign: it reaches nobody; its
    # race with the leader's first heartbeat at the heal is a matter of timing, issue 26): without
    # pre-vote it runs elections against the other follower and its term climbs.
    _cut_from_the_leader(world, follower)
    world.run_for(10.0)
    rejoining = world.replicas[follower].core
    assert rejoining is not None and rejoining.term > term
    world.heal()
    world.run_for(5.0)
    new = world.leader()
    assert new is not None and new.core is not None and new.core.term > term


@pytest.mark.slow
def test_more_seeds_longer_runs_and_five_replicas() -> None:
    results = _run_many(range(1000, 1300), SimOptions(steps=10_000))
    results += _run_many(range(5000, 5100), SimOptions(steps=8_000, nodes=5))
    failed = [r.line() for r in results if not r.ok]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize(
    ("planted", "says"), [("apply-raises", "applying raised"), ("refuse-on-local-state", "another replica")]
)
def test_an_apply_failing_in_a_light_tick_is_a_violation_not_an_error_out_of_the_run(planted: str, says: str) -> None:
    """Seed 1 first applies a poison body in a light tick (``ReplicaCore.after_input``, the tick
    after input): the run ends with a Violation, as from a full tick, instead of raising the
    replica's StateMachineError out of ``run_seed`` (which a worker pool then had to pickle)."""
    with plant(planted):
        result = run_seed(1, SimOptions(steps=CI_STEPS))
    assert not result.ok and result.error is not None and says in result.error, result.line()
