"""The audit's inputs without Spark: run directory validation, run.json statuses, faults, history
ingestion (including lines a crash tore), and synthetic runs the reader can read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_jobs._arrow import pq
from spark_jobs.history import ingest_history
from spark_jobs.replica_tables import scan_replicas
from spark_jobs.run_dir import RunDir, UsageError
from spark_jobs.synth import SynthConfig, generate, parse_plants

SEND = {
    "type": "send",
    "producer": "p0",
    "unique_id": "U1",
    "key": "k",
    "seq": 0,
    "topic": "T",
    "invoke_us": 1,
    "complete_us": 2,
    "outcome": "ok",
    "error": None,
    "broker": "G",
    "queue_id": 0,
    "queue_offset": 0,
    "msg_id": "G:0000000000000010",
    "store_us": 1,
}


def skeleton(root: Path) -> Path:
    (root / "history").mkdir(parents=True)
    (root / "cluster" / "data" / "RaftNode00" / "dledger-n0").mkdir(parents=True)
    (root / "history" / "sends-p0.jsonl").write_text(json.dumps(SEND) + "\n")
    return root


def test_run_dir_layout_and_statuses(tmp_path: Path) -> None:
    root = skeleton(tmp_path)
    run_json = {
        "topics": [{"topic": "ChaosTopic", "queues": 8}, "Other"],
        "replicas": [
            {
                "name": "RaftNode00-n0",
                "group": "RaftNode00",
                "node_id": "n0",
                "commit_index": 7,
                "role": "LEADER",
            },
            {"name": "RaftNode00-n1", "status": {"commit_index": 5, "term": 3}},
        ],
    }
    (root / "run.json").write_text(json.dumps(run_json))
    (root / "faults.jsonl").write_text(
        '{"time_us": 5, "fault": "kill", "action": "apply", "targets": ["a"], "detail": {}}\nnot json\n'
    )
    run = RunDir.open(str(root))
    assert run.replicas == [
        ("RaftNode00", "n0", str(root / "cluster" / "data" / "RaftNode00" / "dledger-n0"))
    ]
    assert run.topics == ["ChaosTopic", "Other"]
    assert run.statuses[("RaftNode00", "n0")].commit_index == 7
    assert run.statuses[("RaftNode00", "n1")].commit_index == 5
    assert run.statuses[("RaftNode00", "n1")].term == 3
    assert [f.fault for f in run.faults] == ["kill"]
    assert any("faults.jsonl: 1 unreadable" in w for w in run.warnings)
    assert any("drain.jsonl" in w for w in run.warnings)


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("nothing", "does not exist"),
        ("no-sends", "no history/sends-"),
        ("no-data", "no replica data"),
        ("bad-run-json", "not valid JSON"),
    ],
)
def test_run_dir_usage_errors(tmp_path: Path, breakage: str, message: str) -> None:
    root = tmp_path / "run"
    if breakage != "nothing":
        skeleton(root)
    if breakage == "no-sends":
        (root / "history" / "sends-p0.jsonl").unlink()
    if breakage == "no-data":
        (root / "cluster" / "data" / "RaftNode00" / "dledger-n0").rmdir()
    if breakage == "bad-run-json":
        (root / "run.json").write_text("[1, 2")
    with pytest.raises(UsageError, match=message):
        RunDir.open(str(root))


def test_history_ingestion_keeps_order_and_survives_torn_lines(tmp_path: Path) -> None:
    hist = tmp_path / "history"
    hist.mkdir()
    lines = [dict(SEND, unique_id=f"U{k}", seq=k) for k in range(5)]
    good = "".join(json.dumps(x) + "\n" for x in lines)
    (hist / "sends-p0.jsonl").write_text(good)
    receipt = {"type": "receipt", "consumer": "c0", "time_us": 9, "unique_id": "U1", "queue_offset": 3}
    torn = json.dumps(receipt) + "\n" + json.dumps(dict(receipt, queue_offset="x")) + "\n" + '{"type": "rec'
    (hist / "receipts-c0.jsonl").write_text(torn)
    stats = ingest_history(
        [str(hist / "sends-p0.jsonl")], [str(hist / "receipts-c0.jsonl")], None, str(tmp_path / "w")
    )
    sends = pq.read_table(tmp_path / "w" / "sends").to_pylist()
    assert [(s["unique_id"], s["file"], s["line"]) for s in sends] == [(f"U{k}", "p0", k) for k in range(5)]
    assert sends[0]["msg_id"] == SEND["msg_id"] and sends[0]["error"] is None
    receipts = pq.read_table(tmp_path / "w" / "receipts").to_pylist()
    assert [(r["unique_id"], r["queue_offset"], r["line"]) for r in receipts] == [("U1", 3, 0)]
    assert stats.rows == {"sends": 5, "receipts": 1, "drain": 0, "retries": 0, "dlq": 0}
    assert stats.bad_line_count == 2
    assert pq.read_table(tmp_path / "w" / "drain").num_rows == 0
    assert sends[0]["due_us"] is None  # a version 2 line: no delay fields, read as null


def test_retry_group_lines_and_the_dlq_are_ingested_with_their_flags(tmp_path: Path) -> None:
    hist = tmp_path / "history"
    hist.mkdir()
    (hist / "sends-p0.jsonl").write_text(json.dumps(dict(SEND, delay_level=2, due_us=77)) + "\n")
    base = {"type": "receipt", "consumer": "r0", "time_us": 9, "unique_id": "U1", "queue_offset": 3}
    (hist / "retries-r0.jsonl").write_text(
        json.dumps(dict(base, reconsume_times=0, retry=False, answer="later")) + "\n"
        + json.dumps(dict(base, reconsume_times=1, retry=True, answer="success")) + "\n"
        + json.dumps(dict(base, reconsume_times=1, retry=1, answer="success")) + "\n"  # wrong type: a bad line
    )
    (hist / "dlq.jsonl").write_text(json.dumps(dict(base, type="dlq", consumer="dlq", reconsume_times=2,
                                                     retry=True)) + "\n")
    stats = ingest_history([str(hist / "sends-p0.jsonl")], [], None, str(tmp_path / "w"),
                           [str(hist / "retries-r0.jsonl")], str(hist / "dlq.jsonl"))
    assert pq.read_table(tmp_path / "w" / "sends").to_pylist()[0]["due_us"] == 77
    retries = pq.read_table(tmp_path / "w" / "retries").to_pylist()
    assert [(r["file"], r["reconsume_times"], r["retry"], r["answer"]) for r in retries] == [
        ("r0", 0, False, "later"), ("r0", 1, True, "success")]
    dlq = pq.read_table(tmp_path / "w" / "dlq").to_pylist()
    assert [(r["reconsume_times"], r["retry"], r["answer"]) for r in dlq] == [(2, True, None)]
    assert stats.rows["retries"] == 2 and stats.bad_line_count == 1


def test_parse_plants() -> None:
    assert parse_plants("lost=3, dup=2,cq") == {"lost": 3, "dup": 2, "cq": 1}
    with pytest.raises(ValueError, match="unknown plant"):
        parse_plants("lots=1")


def test_synthetic_run_is_read_cleanly(tmp_path: Path) -> None:
    run = tmp_path / "run"
    plan = generate(str(run), SynthConfig(events=2000, seed=3, segment_bytes=32 << 10, units_per_file=100))
    rd = RunDir.open(str(run))
    assert len(rd.replicas) == 6 and len(rd.send_files) == 4 and rd.drain_file
    summaries = scan_replicas(rd.replicas, str(tmp_path / "work"), workers=1)
    assert all(s.damage is None and s.torn_tail is None and not s.cq_damaged for s in summaries)
    for group in ("RaftNode00", "RaftNode01"):
        reps = [s for s in summaries if s.group == group]
        assert len({(s.last_index, s.messages, s.end_position, s.cq_units) for s in reps}) == 1
        assert all(s.commit_hint == s.last_index for s in reps)
    messages = sum(s.messages for s in summaries if s.replica == "n0")
    stored = [json.loads(x) for x in (run / "history" / "drain.jsonl").read_text().splitlines()]
    assert messages == len(stored) + 8  # + the scratch topic's messages (deleted and re-created)
    assert plan["sends"] == 1000
    with pytest.raises(FileExistsError):
        generate(str(run), SynthConfig(events=100))
