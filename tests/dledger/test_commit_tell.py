"""How followers learn the commit index (issue 13, the single-send path): from the next append when
one follows within COMMIT_TELL_DELAY_S, or from an empty append sent after that delay, never a
heartbeat later. Deterministic: the simulator's world, client off, appends submitted by hand."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dledger import clock as dl_clock
from dledger.replica import COMMIT_TELL_DELAY_S, Request
from dledger.sim.replica import SimReplica
from dledger.sim.world import SimOptions, World


def _quiet_world(seed: int) -> tuple[World, SimReplica, list[str]]:
    world = World(seed, SimOptions(faults=False))
    world.start()
    world.run_for(3.0)
    world._client_on = False  # the test submits its own appends
    world.run_for(0.5)
    leader = world.leader()
    assert leader is not None and leader.core is not None
    return world, leader, [n for n in world.replicas if n != leader.id]


def _submit(world: World, leader: SimReplica, outcomes: list[Any]) -> None:
    assert leader.core is not None
    done = lambda res, exc: outcomes.append(res or exc)  # noqa: E731
    leader.core.submit(Request([b"x" * 100], 116, done, leader.clock.monotonic()))
    world.poke(leader.id)


def _step_until(world: World, cond: Callable[[], bool], limit_s: float) -> None:
    end = world.now + limit_s
    with dl_clock.restored():
        while not cond():
            assert world._queue and world._queue[0][0] <= end, "the condition never held"
            world._run_one()


def _count_sends(leader: SimReplica) -> list[int]:
    sync = leader.core.sync if leader.core is not None else None
    assert sync is not None
    calls: list[int] = []
    original = sync.dl_send_now

    def counted() -> None:
        calls.append(int(sync.raftCommitIndex))
        original()

    sync.dl_send_now = counted  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_commit_no_append_follows_reaches_the_followers_before_any_heartbeat(seed: int) -> None:
    world, leader, followers = _quiet_world(seed)
    assert leader.core is not None and leader.core.sync is not None
    sync = leader.core.sync
    # Submit right after a heartbeat went out, so the next one is a full period (50 ms) away.
    _step_until(world, lambda: sync._SyncObj__newAppendEntriesTime - leader.clock.monotonic() > 0.045, 1.0)
    outcomes: list[Any] = []
    _submit(world, leader, outcomes)
    _step_until(world, lambda: bool(outcomes), 0.03)
    index = outcomes[0][0].index
    _step_until(world, lambda: all(world.replicas[f].core.commit_index >= index for f in followers), 0.03)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_commit_rides_on_the_next_append_without_a_message_of_its_own(seed: int) -> None:
    world, leader, followers = _quiet_world(seed)
    assert leader.core is not None
    sends = _count_sends(leader)
    first: list[Any] = []
    _submit(world, leader, first)
    _step_until(world, lambda: bool(first), 0.05)
    second: list[Any] = []
    _submit(world, leader, second)  # within the delay: its append carries the first commit
    _step_until(world, lambda: bool(second), 0.05)
    index = second[0][0].index
    _step_until(world, lambda: all(world.replicas[f].core.commit_index >= index for f in followers), 0.05)
    # one send per append, one telling the second commit; none only for the first commit
    assert len(sends) == 3, sends
    assert COMMIT_TELL_DELAY_S < 0.05  # well under a heartbeat period
