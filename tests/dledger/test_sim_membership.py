"""Membership changes in the simulator (issue 27 part 4): single-server changes under faults hold
every safety property; the plant ``membership-two-at-once`` (3 voters to 5 without waiting) is
caught (tests/dledger/test_sim.py runs every plant, this one with membership changes on)."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from dledger.sim.plants import PLANT_OPTIONS, run_job
from dledger.sim.world import SimOptions

FAST_SEEDS = range(1, 21)


def _run_many(seeds: range, options: SimOptions, planted: str | None = None) -> list:
    jobs = [(s, options, planted) for s in seeds]
    with multiprocessing.get_context("spawn").Pool(os.cpu_count() or 2) as pool:
        return pool.map(run_job, jobs, chunksize=4)


@pytest.mark.parametrize(
    "seeds",
    [
        pytest.param(FAST_SEEDS, id="seeds-1-20"),
        pytest.param(range(1, 201), id="seeds-1-200", marks=pytest.mark.slow),
    ],
)
def test_membership_changes_under_faults_hold_every_safety_property(seeds: range) -> None:
    results = _run_many(seeds, SimOptions(steps=3000, membership=True))
    failed = [r.line() for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    changes = sum(r.member_changes for r in results)
    print(f"membership changes appended: {changes} over {len(results)} seeds")
    assert changes > len(seeds)  # the runs did change membership (more than one change per seed)


def test_the_two_at_once_plant_runs_with_membership_changes_on() -> None:
    assert PLANT_OPTIONS["membership-two-at-once"]["membership"] is True
