"""Planted bugs: each switch puts one known Raft mistake into the code the simulator runs.

They exist to show the simulator has teeth (tests/dledger/test_sim.py runs each against the CI
seeds and requires a Violation). Each is a context manager that patches the defect in and takes it
out again; the simulator runs in one thread, so the patch affects only the run inside it.

- ``truncate-non-conflicting``: the follower deletes every entry after ``prevLogIdx`` when an
  AppendEntries arrives (stock pysyncobj), instead of only at the first conflict.
- ``ack-before-fsync``: the leader counts its own entries toward a majority before they are
  durable, and does not fsync them itself.
- ``follower-ack-before-fsync``: a follower answers success for entries it has not made durable
  (and does not fsync them itself).
- ``commit-old-term``: the leader advances the commit index on an entry of an older term by
  counting replicas (Raft §5.4.2 forbids it; Figure 8 shows the loss).
- ``vote-not-durable``: a vote reaches memory only; a crash forgets it (and the term).
- ``apply-raises``: the state machine raises on a poison body instead of refusing it (the broker
  before issue 23: every replica stopped at the same committed entry).
- ``ignore-fsync-error``: a flush that failed (EIO) counts as done: the leader counts the entries
  it covered, a follower acknowledges them (issue 27: fsyncgate). Turns the fsync-error fault on
  (``world.FSYNC_ERROR_EVERY_S``), which loses the pages the failed fsync did not write.
- ``refuse-on-local-state``: the refusal of a poison body depends on the replica's own history
  (every other poison body it judged), not on the body alone: replicas reach different outcomes.
- ``membership-two-at-once`` (issue 27): the leader adds a new member straight as a voter and
  does not wait for the previous change to commit (nor for its own term's first entry), so two
  changes in a row jump 3 voters to 5, or 5 to 3 (majorities of the old and new memberships need
  not overlap). Runs with the simulator's
  membership changes on (``SimOptions(membership=True)``: ``--membership``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from dledger import membership as mship
from dledger import syncobj_patch
from dledger.meta_store import MemoryMetaStore
from dledger.records import Refused
from dledger.replica import ReplicaCore
from dledger.sim import replica as sim_replica
from dledger.sim import world as sim_world
from dledger.sim.world import SimOptions, SimResult, run_seed


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _stock_align(message: dict[str, Any], *_args: Any) -> tuple[dict[str, Any], bool]:
    return message, False  # pysyncobj then deletes everything after prevLogIdx


def _commit_any_term(
    commit_index: int,
    self_match: int,
    peer_match: Sequence[int],
    current_term: int,
    term_at: Callable[[int], int],
    count_self: bool = True,
) -> int:
    ranked = sorted([self_match, *peer_match] if count_self else list(peer_match), reverse=True)
    return max(commit_index, ranked[len(ranked) // 2])


@contextlib.contextmanager
def _ack_before_fsync() -> Iterator[None]:
    def self_match_index(core: ReplicaCore) -> int:
        return int(core.store.last_index)

    original_flush = ReplicaCore._maybe_flush

    def maybe_flush(core: ReplicaCore) -> None:
        if core.role != "LEADER":
            original_flush(core)

    with (
        _patched(ReplicaCore, "self_match_index", self_match_index),
        _patched(ReplicaCore, "_maybe_flush", maybe_flush),
    ):
        yield


@contextlib.contextmanager
def _follower_ack_before_fsync() -> Iterator[None]:
    def ack_ready(core: ReplicaCore, node: Any, next_index: int) -> bool:
        return True

    original_flush = ReplicaCore._maybe_flush

    def maybe_flush(core: ReplicaCore) -> None:
        if core.role == "LEADER":
            original_flush(core)

    with (
        _patched(ReplicaCore, "ack_ready", ack_ready),
        _patched(ReplicaCore, "_maybe_flush", maybe_flush),
    ):
        yield


@contextlib.contextmanager
def _vote_not_durable() -> Iterator[None]:
    def save_term_vote(meta: MemoryMetaStore, term: int, voted_for: str | None) -> None:
        meta.term, meta.voted_for = term, voted_for  # never reaches the durable copy

    with _patched(MemoryMetaStore, "save_term_vote", save_term_vote):
        yield


@contextlib.contextmanager
def _ignore_fsync_error() -> Iterator[None]:
    original = ReplicaCore._flush_done

    def flush_done(core: ReplicaCore, target: int, epoch: int, took: list[float], exc: BaseException | None) -> None:
        original(core, target, epoch, took, None)

    with _patched(ReplicaCore, "_flush_done", flush_done), _patched(sim_world, "FSYNC_ERROR_EVERY_S", 0.5):
        yield


def _apply_raises(body: bytes) -> Refused | None:
    if body.startswith(sim_replica.POISON):
        raise ValueError("poison body: no queue can hold it")  # what an unchecked effect does
    return None


@contextlib.contextmanager
def _refuse_on_local_state() -> Iterator[None]:
    judged = [0]  # state of this process, not of the log: differs between replicas

    def refusal_of(body: bytes) -> Refused | None:
        if not body.startswith(sim_replica.POISON):
            return None
        judged[0] += 1
        return Refused("POISON", "poison") if judged[0] % 2 else None

    with _patched(sim_replica, "refusal_of", refusal_of):
        yield


@contextlib.contextmanager
def _membership_two_at_once() -> Iterator[None]:
    original = ReplicaCore._membership_change

    def change(core: ReplicaCore, op: str, peer_id: str, address: str | None, max_lag: int) -> mship.Membership:
        m = core.membership.current.membership  # no pending check, no readiness, no catch-up
        if op == "add_learner" and address is not None:  # ... and no learner stage: a voter at once
            return mship.Membership(tuple(sorted((*m.voters, (peer_id, address)))), m.learners)
        if op == "promote":
            return m.promote(peer_id)
        if op == "remove" and peer_id != core.settings.self_id:
            return m.remove(peer_id)
        return original(core, op, peer_id, address, max_lag)

    with _patched(ReplicaCore, "_membership_change", change):
        yield


PLANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "truncate-non-conflicting": lambda: _patched(syncobj_patch, "align_append_entries", _stock_align),
    "ack-before-fsync": _ack_before_fsync,
    "follower-ack-before-fsync": _follower_ack_before_fsync,
    "commit-old-term": lambda: _patched(syncobj_patch, "quorum_commit_index", _commit_any_term),
    "vote-not-durable": _vote_not_durable,
    "apply-raises": lambda: _patched(sim_replica, "refusal_of", _apply_raises),
    "refuse-on-local-state": _refuse_on_local_state,
    "ignore-fsync-error": _ignore_fsync_error,
    "membership-two-at-once": _membership_two_at_once,
}
# Plants that need an option of the simulated world on to be exercised at all.
PLANT_OPTIONS: dict[str, dict[str, Any]] = {"membership-two-at-once": {"membership": True, "steps": 9000}}


def plant(name: str | None) -> contextlib.AbstractContextManager[None]:
    if name is None:
        return contextlib.nullcontext()
    try:
        return PLANTS[name]()
    except KeyError:
        raise ValueError(f"unknown plant {name!r}; known: {', '.join(sorted(PLANTS))}") from None


def run_job(job: tuple[int, SimOptions, str | None]) -> SimResult:
    """One seed, with a plant or without (a module-level function: worker processes import it)."""
    seed, options, planted = job
    if planted in PLANT_OPTIONS:
        options = dataclasses.replace(options, **PLANT_OPTIONS[planted])
    if not logging.getLogger().handlers:  # a worker process: the replicas' logs are noise here
        logging.getLogger("dledger").setLevel(logging.CRITICAL)
    with plant(planted):
        return run_seed(seed, options)
