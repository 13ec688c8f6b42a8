"""The continuous audit's per-micro-batch checks (``spark_jobs.stream_checks``) and its history tail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spark_jobs.stream_audit import HistoryTail
from spark_jobs.stream_checks import StreamChecker


def row(q: int, off: int, uid: str, key: str | None = None, producer: str | None = "p0", seq: int | None = None,
        broker: str = "G0") -> tuple[Any, ...]:
    return ("T", broker, q, off, uid, key, producer, seq, 1_000)


def send(uid: str, q: int | None, off: int | None, outcome: str = "ok", broker: str = "G0") -> dict[str, Any]:
    return {"type": "send", "producer": "p0", "unique_id": uid, "topic": "T", "outcome": outcome,
            "broker": broker if outcome == "ok" else None, "queue_id": q, "queue_offset": off, "complete_us": 5}


def test_an_acknowledged_send_is_judged_once_the_stream_passed_its_offset() -> None:
    c = StreamChecker()
    r0 = c.batch(0, [row(0, 0, "a"), row(0, 1, "b")], [send("a", 0, 0), send("c", 0, 2)], 2_000_000)
    assert (r0.judged, r0.pending, r0.failed) == (1, 1, False)  # c's offset not read yet
    r1 = c.batch(1, [row(0, 2, "c")], [send("b", 0, 1)], 3_000_000)
    assert (r1.judged, r1.pending, r1.failed) == (2, 0, False)
    assert c.totals["lost"] == 0 and r0.delay_ms == {"p50": 1000.0, "max": 1000.0}


def test_a_lost_and_a_misplaced_acknowledgement_show_up_in_the_batch_that_passes_them() -> None:
    c = StreamChecker()
    c.batch(0, [row(0, 0, "a")], [send("x", 0, 1), send("y", 0, 2)], 1)
    r = c.batch(1, [row(0, 1, "b"), row(0, 2, "c"), row(0, 3, "y")], [], 2)
    assert r.counts["lost"] == 1 and r.counts["ack_offset_mismatch"] == 1 and r.failed
    lost = next(f for f in r.findings if f["check"] == "lost")
    assert (lost["unique_id"], lost["queue_offset"], lost["read_up_to"]) == ("x", 1, 4)
    mis = next(f for f in r.findings if f["check"] == "ack_offset_mismatch")
    assert mis["unique_id"] == "y" and mis["stored_at"] == [[0, 3]]


def test_a_send_acknowledged_by_one_group_and_stored_by_another_is_lost_from_the_first() -> None:
    c = StreamChecker()
    r = c.batch(0, [row(0, 0, "a", broker="G1"), row(0, 0, "z", broker="G0")], [send("a", 0, 0, broker="G0")], 1)
    assert r.counts["ack_offset_mismatch"] + r.counts["lost"] == 1 and r.counts["lost"] == 1


def test_pending_sends_acknowledged_before_the_last_plan_are_lost_at_the_end() -> None:
    c = StreamChecker()
    late = {**send("c", 0, 6), "complete_us": 50}
    c.batch(0, [row(0, 0, "a")], [send("a", 0, 0), send("b", 0, 5), late], 1)
    final = c.finish(2, last_plan_us=10)  # b was acknowledged (5) before the last plan (10), c after
    assert final.counts["lost"] == 1 and final.findings[0]["unique_id"] == "b"
    assert final.pending == 1 and c.judged == 2


def test_sends_of_topics_not_followed_are_left_alone() -> None:
    c = StreamChecker(topics=["T"])
    c.batch(0, [row(0, 0, "a")], [send("a", 0, 0), {**send("o", 0, 9), "topic": "U"}], 1)
    final = c.finish(2, last_plan_us=10)
    assert final.counts["lost"] == 0 and final.pending == 0 and c.sends_ok == 1


def test_duplicates_key_order_gaps_and_stored_failures() -> None:
    c = StreamChecker()
    r = c.batch(0, [row(1, 0, "k1", key="K", seq=1), row(1, 1, "k3", key="K", seq=3),
                    row(1, 2, "k2", key="K", seq=2), row(1, 3, "k1", key="K", seq=1),  # a retried copy: ignored
                    row(2, 5, "m"), row(2, 7, "n")],
                [send("f", None, None, outcome="fail")], 1)
    assert r.counts["key_order"] == 1 and r.counts["duplicates"] == 1 and r.counts["offset_gap"] == 1
    assert r.counts["aborted_read"] == 0
    r2 = c.batch(1, [row(2, 8, "f")], [], 2)
    assert r2.counts["aborted_read"] == 1 and r2.counts["offset_gap"] == 0
    c2 = StreamChecker()
    c2.batch(0, [row(0, 0, "g")], [], 1)
    assert c2.batch(1, [], [send("g", None, None, outcome="fail")], 2).counts["aborted_read"] == 1


def test_history_tail_returns_complete_lines_once(tmp_path: Path) -> None:
    t = HistoryTail(str(tmp_path))
    p = tmp_path / "sends-p0.jsonl"
    p.write_text(json.dumps({"a": 1}) + "\n" + '{"a": 2')
    assert t.read() == [{"a": 1}]
    with p.open("a") as f:
        f.write("}\nnot json\n")
    (tmp_path / "sends-p1.jsonl").write_text('{"b": 1}\n')
    assert t.read() == [{"a": 2}, {"b": 1}] and t.bad_lines == 1
    assert t.read() == []


def test_stream_audit_usage_errors_exit_2(tmp_path: Path, capsys: Any) -> None:
    from spark_jobs import stream_audit

    assert stream_audit.main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert stream_audit.main([str(tmp_path)]) == 2
    assert "no topic: give --topic" in capsys.readouterr().err
    assert stream_audit.main([str(tmp_path), "--topic", "T", "--trigger-s", "0"]) == 2
    assert "--trigger-s must be positive" in capsys.readouterr().err
    assert stream_audit.main([str(tmp_path), "--topic", "T", "--conf", "nokey"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    (tmp_path / "run.json").write_text(json.dumps({"topics": [{"topic": "A", "queues": 8}], "namesrv_addr": "h:1"}))
    args = stream_audit.parse_args([str(tmp_path)])
    assert stream_audit._topics_and_namesrv(args) == (["A"], "h:1")


def test_a_delayed_send_is_not_judged_at_its_schedule_queue_offset() -> None:
    """A delayed send's acknowledged offset is the schedule queue's (issue 14): the stream, reading
    the real topic past that offset, must not call it lost or misplaced."""
    c = StreamChecker()
    r = c.batch(0, [row(0, 0, "a"), row(0, 1, "b"), row(0, 2, "d")], [{**send("d", 0, 0), "due_us": 7}], 1)
    assert r.counts["lost"] == 0 and r.counts["ack_offset_mismatch"] == 0 and not r.failed and c.judged == 0
