"""Pure pieces of the run and the drill: the quick check, drill summaries, the progress line, the
leader rule, message bodies."""

from __future__ import annotations

from chaos.drill import Acks, summarize
from chaos.runner import progress_line
from chaos.schedule import Window
from chaos.target import leader_of
from chaos.workload import body_for, quick_check


def test_quick_check_counts_acknowledged_sends_missing_from_the_drain() -> None:
    sends = [
        {"unique_id": "A", "outcome": "ok"},
        {"unique_id": "B", "outcome": "ok"},
        {"unique_id": "C", "outcome": "unknown"},
        {"unique_id": "D", "outcome": "unknown"},
        {"unique_id": "E", "outcome": "fail"},
    ]
    drained = [{"unique_id": u} for u in ("A", "A", "C", "E")]
    q = quick_check(sends, drained)
    assert q["acknowledged"] == 2 and q["acknowledged_lost"] == 1 and q["lost_sample"] == ["B"]
    assert (q["stored"], q["stored_unique"], q["stored_twice_or_more"]) == (4, 3, 1)
    assert (q["unknown_stored"], q["unknown_not_stored"], q["failed_stored"]) == (1, 1, 1)


def test_drill_summary_median_max_and_targets() -> None:
    rounds = [{"first_ack_ms": a, "route_ms": r, "lost": 0} for a, r in ((900, 800), (1200, 1100), (2900, 2800))]
    s = summarize(rounds)
    assert (s["first_ack_ms_median"], s["first_ack_ms_max"], s["route_ms_median"], s["lost"]) == (1200, 2900, 1100, 0)
    assert s["targets_met"]
    assert not summarize([*rounds, {"first_ack_ms": 3100, "route_ms": 1, "lost": 2}])["targets_met"]


def test_only_acks_stored_after_the_kill_count_as_the_new_leaders() -> None:
    acks = Acks()
    acks.by_uid = {"old": (10.0, 999), "new1": (12.0, 1001), "new2": (11.5, 1000)}
    assert acks.first_after(999.5) == 11.5
    assert acks.first_after(2000) is None


def test_the_leader_is_the_one_at_the_highest_term() -> None:
    assert leader_of({"a": {"role": "LEADER", "term": 3}, "b": {"role": "LEADER", "term": 5},
                      "c": {"role": "FOLLOWER", "term": 5}, "d": None}) == "b"
    assert leader_of({"a": {"role": "CANDIDATE", "term": 3}, "b": None}) is None


def test_progress_line() -> None:
    line = progress_line(42.2, "partition-leader", Window(40, 50, "partition-leader"), 199.5,
                         {"ok": 10, "fail": 1, "unknown": 2, "receipts": 9}, {"RaftNode00": "RaftNode00-n1"})
    assert "partition-leader (8s left)" in line and "sends/s  199.5" in line and "acks 10" in line
    assert "leader RaftNode00=n1" in line
    assert "no fault" in progress_line(1, None, None, 0, {"ok": 0, "fail": 0, "unknown": 0, "receipts": 0},
                                       {"G": None})


def test_bodies_name_their_message_and_have_the_asked_size() -> None:
    b = body_for("p1", "p1-k3", 17, 64)
    assert b.startswith(b"p1|p1-k3|17|") and len(b) == 64
    assert body_for("p0", None, 1, 4) == b"p0|-|1|"  # never cut below its name
