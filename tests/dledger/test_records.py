"""The errors of dledger/records.py survive pickling and copying (a simulator worker process hands
its failure to the parent pickled: tests/dledger/test_sim.py, ``python -m dledger.sim``)."""

from __future__ import annotations

import copy
import pickle

import pytest

from dledger.records import NotLeaderError, StateMachineError


def test_a_state_machine_error_round_trips_with_its_entries_and_cause() -> None:
    exc = StateMachineError(18, 20, ValueError("poison body"))
    for back in (pickle.loads(pickle.dumps(exc)), copy.copy(exc), copy.deepcopy(exc)):
        assert type(back) is StateMachineError and str(back) == str(exc)
        assert (back.first_index, back.last_index) == (18, 20) and repr(back.cause) == repr(exc.cause)


@pytest.mark.parametrize("leader", ["n1", None])
def test_a_not_leader_error_round_trips_with_its_leader(leader: str | None) -> None:
    exc = NotLeaderError(leader)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is NotLeaderError and back.leader_id == leader and str(back) == str(exc)
