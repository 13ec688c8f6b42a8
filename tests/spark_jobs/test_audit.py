"""The Spark audit on synthetic runs: every planted anomaly found exactly (count and ids), a clean
run with zero findings, exit codes, outputs, and Spark's answers equal to the pure rules'."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from spark_jobs import audit, rules
from spark_jobs._arrow import pq
from spark_jobs.synth import STALL_US
from tests.spark_jobs.conftest import ALL_PLANTS, AuditedRun

FAILING = {"lost", "unexpected", "key_order", "divergence", "cq_mismatch"}


def ids(rows: list[dict[str, Any]], field: str = "unique_id") -> set[str]:
    return {r[field] for r in rows}


# -- planted anomalies ------------------------------------------------------------------------------
def test_planted_run_fails_with_exit_code_1(planted_run: AuditedRun) -> None:
    s = planted_run.summary
    assert planted_run.exit_code == 1
    assert s["verdict"] == "FAIL"
    assert set(s["failed_checks"]) == FAILING
    assert planted_run.replica_files_unchanged  # the audit read every replica file and wrote none


def test_lost_acknowledged_messages(planted_run: AuditedRun) -> None:
    plants = planted_run.plan["plants"]
    rows = planted_run.details("lost")
    assert planted_run.summary["counts"]["lost"] == len(plants["lost"]) + len(plants["unconsumed"])
    by_id = {r["unique_id"]: r for r in rows}
    assert set(by_id) == set(plants["lost"]) | set(plants["unconsumed"])
    for uid in plants["lost"]:
        assert (by_id[uid]["in_log"], by_id[uid]["consumed"]) == (False, False)
    for uid in plants["unconsumed"]:
        assert (by_id[uid]["in_log"], by_id[uid]["consumed"]) == (True, False)
    assert planted_run.summary["counts"]["retained_away"] == 0


def test_duplicates(planted_run: AuditedRun) -> None:
    plants = planted_run.plan["plants"]
    delivered = planted_run.details("duplicate_deliveries")
    assert ids(delivered) == set(plants["dup"]) | set(plants["logdup"]) | set(plants["rewind"])
    assert all(r["deliveries"] == 2 for r in delivered)
    logged = planted_run.details("duplicate_log_entries")
    assert ids(logged) == set(plants["logdup"])
    assert all(r["copies"] == 2 for r in logged)


def test_unexpected_receipts(planted_run: AuditedRun) -> None:
    rows = planted_run.details("unexpected")
    assert ids(rows) == set(planted_run.plan["plants"]["unexpected"])
    assert all(r["sources"] == ["receipt"] for r in rows)


def test_order_violations(planted_run: AuditedRun) -> None:
    plants = planted_run.plan["plants"]
    queue = planted_run.details("queue_order")
    assert ids(queue) == set(plants["qorder"]) and len(queue) == ALL_PLANTS["qorder"]
    assert all(r["prev_max_offset"] == r["queue_offset"] + 1 for r in queue)
    key = planted_run.details("key_order")
    assert ids(key) == set(plants["korder"]) and len(key) == ALL_PLANTS["korder"]
    assert all(r["prev_max_seq"] == r["seq"] + 1 for r in key)


def test_divergence(planted_run: AuditedRun) -> None:
    plants = planted_run.plan["plants"]
    rows = {(r["group"], r["replica"]): r for r in planted_run.details("divergence")}
    want = {
        (p["group"], p["replica"]): (p["first_index"], kind)
        for kind in ("body", "chain")
        for p in plants[f"diverge_{kind}"]
    }
    assert {k: (r["first_index"], r["first_kind"]) for k, r in rows.items()} == want
    commits = {c["group"]: c["group_commit"] for c in planted_run.summary["inputs"]["commits"]}
    for (group, _replica), r in rows.items():
        assert r["indexes"] == commits[group] - r["first_index"] + 1  # the chain differs from there on


def test_consume_queue_mismatch(planted_run: AuditedRun) -> None:
    rows = planted_run.details("cq_mismatch")
    got = {(r["group"], r["replica"], r["topic"], r["queue_id"]): r for r in rows}
    want = {
        (p["group"], p["replica"], p["topic"], p["queue_id"]): p for p in planted_run.plan["plants"]["cq"]
    }
    assert set(got) == set(want)
    for k, r in got.items():
        assert (r["missing"], r["extra"], r["wrong_size"], r["misordered"]) == (1, 0, 0, 0)
        assert r["first_missing_position"] == want[k]["missing_position"]


def test_unavailability_window_and_recovery(planted_run: AuditedRun) -> None:
    (planted,) = planted_run.plan["plants"]["unavail"]
    (window,) = planted_run.details("unavailability")
    assert planted["start_us"] <= window["start_us"] <= planted["start_us"] + 20_000
    assert planted["end_us"] <= window["end_us"] <= planted["end_us"] + 20_000
    (kill,) = [f for f in planted_run.summary["faults"] if f["fault"] == "kill-leader"]
    assert STALL_US / 1000 <= kill["time_to_recover_ms"] <= STALL_US / 1000 + 20
    assert kill["unavailability_ms"] == pytest.approx(window["duration_ms"])


def test_nothing_else_is_reported(planted_run: AuditedRun) -> None:
    counts = planted_run.summary["counts"]
    for check in ("replica_damage", "fail_but_stored", "cq_damaged", "bad_history_lines", "retained_away"):
        assert counts[check] == 0, check
    assert planted_run.summary["warnings"] == []


def test_outputs(planted_run: AuditedRun) -> None:
    out = planted_run.path / "audit"
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2
    assert "FAIL" in page and "kill-leader" in page
    for check in planted_run.summary["counts"]:
        assert (out / "details" / f"{check}.json").is_file()
    lat = planted_run.summary["latency"]
    assert lat["end_to_end_ms"]["count"] > 0 and lat["end_to_end_ms"]["p50"] > 0
    assert lat["store_to_receipt_ms"]["p99"] <= lat["end_to_end_ms"]["max"]


# -- Spark against the pure rules ----------------------------------------------------------------------
def _jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_spark_queue_order_equals_the_rules(planted_run: AuditedRun) -> None:
    receipts = []
    for path in sorted((planted_run.path / "history").glob("receipts-*.jsonl")):
        for line, r in enumerate(_jsonl(path)):
            receipts.append(
                rules.Receipt(
                    r["consumer"],
                    (r["broker"], r["topic"], r["queue_id"]),
                    r["queue_offset"],
                    line,
                    r["unique_id"],
                )
            )
    want = {(r.unique_id, high) for r, high in rules.queue_order_violations(receipts)}
    got = {(r["unique_id"], r["prev_max_offset"]) for r in planted_run.details("queue_order")}
    assert got == want


def test_spark_key_order_and_divergence_equal_the_rules(planted_run: AuditedRun) -> None:
    work = planted_run.path / "audit" / "work"
    records = pq.read_table(work / "records").to_pylist()
    entries = pq.read_table(work / "entries").to_pylist()
    commits = {(c["group"], c["replica"]): c for c in planted_run.summary["inputs"]["commits"]}
    sends = [s for p in sorted((planted_run.path / "history").glob("sends-*.jsonl")) for s in _jsonl(p)]
    ok = {s["unique_id"]: s for s in sends if s["outcome"] == "ok"}
    group_commit = {g: c["group_commit"] for (g, _), c in commits.items()}
    places = {
        (r["group"], r["index"], r["rel"], r["unique_id"])
        for r in records
        if r["index"] <= group_commit[r["group"]] and r["unique_id"] in ok
    }
    log = [
        rules.LogRecord(g, ok[u]["producer"], ok[u]["key"], i * 10**9 + rel, ok[u]["seq"], u)
        for g, i, rel, u in places
        if ok[u]["broker"] == g
    ]
    want = {(r.unique_id, high) for r, high in rules.key_order_violations(log)}
    assert {(r["unique_id"], r["prev_max_seq"]) for r in planted_run.details("key_order")} == want

    values: dict[str, dict[str, dict[int, Any]]] = defaultdict(lambda: defaultdict(dict))
    for e in entries:
        values[e["group"]][e["replica"]][e["index"]] = (e["term"], e["chain_crc"], e["body_hash"])
    want_div = {}
    for group, held in values.items():
        own = {r: commits[(group, r)]["commit"] for r in held}
        for replica, (first, count) in rules.divergence(held, own).items():
            want_div[(group, replica)] = (first, count)
    got_div = {
        (r["group"], r["replica"]): (r["first_index"], r["indexes"])
        for r in planted_run.details("divergence")
    }
    assert got_div == want_div


def test_spark_windows_equal_the_rules(planted_run: AuditedRun) -> None:
    sends = [s for p in sorted((planted_run.path / "history").glob("sends-*.jsonl")) for s in _jsonl(p)]
    attempts = [(s["invoke_us"], s["complete_us"], s["outcome"] == "ok") for s in sends]
    windows = rules.unavailability_windows(attempts, 1_000_000)
    assert [(w["start_us"], w["end_us"]) for w in planted_run.details("unavailability")] == [
        (w.start_us, w.end_us) for w in windows
    ]
    faults = planted_run.summary["faults"]
    firsts = rules.recovery_times([f["apply_us"] for f in faults], attempts)
    for f, (first_ok, recovered) in zip(faults, firsts, strict=True):
        want = rules.fault_recovery(f["apply_us"], f["heal_us"], first_ok, recovered, windows)
        assert {k: f[k] for k in want} == want


# -- clean run -------------------------------------------------------------------------------------------
def test_clean_run_has_zero_findings(clean_run: AuditedRun) -> None:
    s = clean_run.summary
    assert clean_run.exit_code == 0
    assert clean_run.replica_files_unchanged  # the torn tail is still there: the audit cut nothing
    assert s["verdict"] == "PASS" and s["failed_checks"] == []
    assert {k: v for k, v in s["counts"].items() if v} == {}
    torn = [r for r in s["inputs"]["replicas"] if r["torn_tail"]]
    assert len(torn) == 1 and torn[0]["damage"] is None  # a torn tail is what a crash leaves: fine
    assert all(r["damage"] is None for r in s["inputs"]["replicas"])
    assert s["inputs"]["history_rows"]["sends"] == clean_run.plan["sends"]


# -- exit codes and usage ----------------------------------------------------------------------------------
def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert audit.main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert audit.main([str(tmp_path)]) == 2
    assert "no history/sends-" in capsys.readouterr().err
    (tmp_path / "history").mkdir()
    (tmp_path / "history" / "sends-p0.jsonl").write_text("")
    assert audit.main([str(tmp_path)]) == 2
    assert "no replica data" in capsys.readouterr().err
    (tmp_path / "cluster" / "data" / "G" / "dledger-n0").mkdir(parents=True)
    (tmp_path / "run.json").write_text("{not json")
    assert audit.main([str(tmp_path)]) == 2
    assert "run.json is not valid JSON" in capsys.readouterr().err
    (tmp_path / "run.json").write_text("{}")
    assert audit.main([str(tmp_path), "--fail-on", "lost,bogus"]) == 2
    assert "unknown check(s) bogus" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        audit.main([])
    assert exc.value.code == 2


def test_verdict_follows_fail_on() -> None:
    counts = {"lost": 0, "queue_order": 3, "divergence": 0}
    assert audit.verdict(counts, ["lost", "divergence"]) == []
    assert audit.verdict(counts, ["lost", "queue_order"]) == ["queue_order"]


@pytest.mark.slow
def test_cli_in_a_fresh_process(tmp_path: Path) -> None:
    """``python -m spark_jobs.audit`` end to end: its own JVM, --json on stdout, exit code 1."""
    from spark_jobs.synth import SynthConfig, generate

    run = tmp_path / "run"
    generate(str(run), SynthConfig(events=1000, seed=5, plants={"lost": 1}, segment_bytes=64 << 10))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    p = subprocess.run(
        [sys.executable, "-m", "spark_jobs.audit", str(run), "--json", "--master", "local[2]"],
        capture_output=True,
        text=True,
        env=env,
        timeout=280,
        check=False,
    )
    assert p.returncode == 1, p.stderr[-3000:]
    summary = json.loads(p.stdout)
    assert summary["counts"]["lost"] == 1 and summary["failed_checks"] == ["lost"]
    assert (run / "audit" / "report.html").is_file() and not (run / "audit" / "work").exists()
