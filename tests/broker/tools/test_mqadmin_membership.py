"""``mqadmin``'s membership commands (issue 27 part 4): bad input exits 2 before any request, the
rows of ``getReplicas`` from a leader's status (the commands against real groups: the slow
tests/broker/test_replace_replica.py)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.tools.mqadmin import main
from broker.tools.mqadmin_membership import replicas_rows


@pytest.mark.parametrize(
    "argv",
    [
        ["addLearner", "-m", "RaftNode00", "-i", "bad-id", "-a", "127.0.0.1:1"],
        ["addLearner", "-m", "RaftNode00", "-i", "n3", "-a", "no-port"],
        ["addLearner", "-m", "RaftNode00", "-i", "n3", "-a", "127.0.0.1:70000"],
        ["promoteLearner", "-m", "RaftNode00", "-i", ""],
        ["removeReplica", "-m", "RaftNode00", "-i", "n 1"],
        ["replaceReplica", "-m", "RaftNode00", "--old", "n2", "--new", "n2"],
        ["replaceReplica", "-m", "RaftNode00", "--old", "n2"],
    ],
)
def test_bad_input_exits_2_before_any_request(argv: list[str], capsys: Any) -> None:
    assert main([*argv, "-n", "127.0.0.1:1"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_replica_rows_from_a_leaders_status() -> None:
    status = {
        "self_id": "n0",
        "last_index": 120,
        "membership": {"voters": {"n0": "h:1", "n1": "h:2"}, "learners": {"n3": "h:4"}, "index": 7},
        "peers": {
            "n1": {"role": "voter", "address": "h:2", "match_index": 120, "lag": 0, "connected": True},
            "n3": {"role": "learner", "address": "h:4", "match_index": 20, "lag": 100, "connected": True},
        },
    }
    rows = replicas_rows(status)
    assert [(r["id"], r["role"], r["lag"]) for r in rows] == [
        ("n0", "voter (leader)", 0), ("n1", "voter", 0), ("n3", "learner", 100)
    ]
