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

FAILING = {
    "lost",
    "unseen",
    "unexpected",
    "key_order",
    "divergence",
    "cq_mismatch",
    "inconsistent_offsets",
    "ack_offset_mismatch",
    "send_order",
    "poll_order",
    "aborted_read",
    "corrupt_read",
    "offset_regression",
    "committed_prefix",
    "commit_crc_mismatch",
    "nonconflicting_truncation",
    "drain_incomplete",
    "duplicate_log_entries",
}


def ids(rows: list[dict[str, Any]], field: str = "unique_id") -> set[str]:
    return {r[field] for r in rows}


# -- planted anomalies ------------------------------------------------------------------------------
def test_planted_run_fails_with_exit_code_1(planted_run: AuditedRun) -> None:
    s = planted_run.summary
    assert planted_run.exit_code == 1
    assert s["verdict"] == "FAIL"
    assert set(s["failed_checks"]) == FAILING
    assert planted_run.replica_files_unchanged  # the audit read every replica file and wrote none


def test_lost_and_unseen(planted_run: AuditedRun) -> None:
    plants = planted_run.plan["plants"]
    by_id = {r["unique_id"]: r for r in planted_run.details("lost")}
    assert set(by_id) == set(plants["lost"]) | set(plants["unconsumed"])
    for uid in plants["lost"]:
        assert (by_id[uid]["in_log"], by_id[uid]["consumed"]) == (False, False)
    for uid in plants["unconsumed"]:  # in the log, read by nobody, reads went past it
        assert (by_id[uid]["in_log"], by_id[uid]["consumed"], by_id[uid]["read_past"]) == (True, False, True)
    unseen = planted_run.details("unseen")
    assert ids(unseen) == set(plants["unseen"])
    assert all(r["in_log"] and not r["consumed"] and not r["read_past"] for r in unseen)
    assert planted_run.summary["counts"]["retained_away"] == 0


def test_duplicates(planted_run: AuditedRun) -> None:
    plants = planted_run.plan["plants"]
    delivered = planted_run.details("duplicate_deliveries")
    assert ids(delivered) == set(plants["dup"]) | set(plants["logdup"]) | set(plants["rewind"])
    assert all(r["deliveries"] == 2 for r in delivered)
    logged = planted_run.details("duplicate_log_entries")
    assert ids(logged) == set(plants["logdup"])
    assert all(r["copies"] == 2 for r in logged)


def test_unexpected_aborted_and_corrupt_reads(planted_run: AuditedRun) -> None:
    plants = planted_run.plan["plants"]
    rows = planted_run.details("unexpected")
    assert ids(rows) == set(plants["unexpected"])
    assert all(r["sources"] == ["receipt"] for r in rows)
    aborted = planted_run.details("aborted_read")
    assert ids(aborted) == set(plants["aborted"]) and all(r["in_log"] and r["read"] for r in aborted)
    assert ids(planted_run.details("corrupt_read")) == set(plants["corrupt"])


def test_poll_order(planted_run: AuditedRun) -> None:
    """qorder: skip, backwards, skip; skip: a skip; a duplicate receipt right after the first is a
    backwards poll, an unconsumed message a skip; a rewind in a new session is none."""
    plants = planted_run.plan["plants"]
    rows = planted_run.details("poll_order")
    got = {(r["unique_id"], r["kind"]) for r in rows}
    want = {(u, "backwards") for q in plants["qorder"] for u in q["backwards"]}
    want |= {(u, "skip") for q in plants["qorder"] for u in q["skip"]}
    want |= {(u, "skip") for u in plants["skip"]} | {(u, "backwards") for u in plants["dup"]}
    unconsumed_skips = {r["unique_id"] for r in rows if r["kind"] == "skip"} - {u for u, _ in want}
    assert {u for u, k in got if (u, k) not in want} == unconsumed_skips
    assert len(unconsumed_skips) == len(plants["unconsumed"])  # the receipt after the unconsumed one
    assert want <= got and not set(plants["rewind"]) & {u for u, _ in got}


def test_key_and_send_order(planted_run: AuditedRun) -> None:
    plants = planted_run.plan["plants"]
    key = planted_run.details("key_order")
    assert ids(key) == set(plants["korder"]) and len(key) == ALL_PLANTS["korder"]
    assert all(r["prev_max_seq"] == r["seq"] + 1 for r in key)
    sends = planted_run.details("send_order")  # the later send of each swapped pair got the lower offset
    assert len(sends) == ALL_PLANTS["korder"] and all(r["queue_offset"] < r["prev_max_offset"] for r in sends)


def test_offsets_acknowledged_and_claimed(planted_run: AuditedRun) -> None:
    plants = planted_run.plan["plants"]
    ack = planted_run.details("ack_offset_mismatch")
    assert (
        ids(ack) == set(plants["ackoff"]) and len(ack) == 3 * ALL_PLANTS["ackoff"]
    )  # every replica disagrees
    assert all(r["acked_offset"] == r["stored"][0]["offset"] + 1_000_000 for r in ack)
    incons = planted_run.details("inconsistent_offsets")
    assert [(r["broker"], r["queue_id"], r["offset"], r["unique_ids"]) for r in incons] == [
        (p["broker"], p["queue_id"], p["offset"], p["unique_ids"]) for p in plants["incons"]
    ]
    assert [r["error"] for r in planted_run.details("drain_incomplete")] == plants["drainerr"]


def test_sampler_findings(planted_run: AuditedRun) -> None:
    plants = planted_run.plan["plants"]
    prefix = {
        (r["replica"], r["kind"], r["later_line"] is None) for r in planted_run.details("committed_prefix")
    }
    assert prefix == {
        (plants["prefix"][0]["replica"], "shrank", False),
        (plants["crc"][0]["replica"], "changed", True),
    }
    crc = planted_run.details("commit_crc_mismatch")
    planted = plants["crc"][0]
    group = planted["replica"].rsplit("-", 1)[0]
    assert any(r["group"] == group and r["commit_index"] == planted["commit_index"] for r in crc)
    diverged = {(p["group"], p["first_index"]) for k in ("diverge_body", "diverge_chain") for p in plants[k]}
    for r in crc:  # the others: replicas planted to diverge report their own chain CRCs
        if (r["group"], r["commit_index"]) != (group, planted["commit_index"]):
            assert any(r["group"] == g and r["commit_index"] >= i for g, i in diverged), r
    (trunc,) = planted_run.details("nonconflicting_truncation")
    assert (trunc["replica"], trunc["truncated"]) == (plants["truncation"][0]["replica"], 3)
    (reg,) = planted_run.details("offset_regression")
    assert (reg["replica"], reg["queue_id"], reg["prev_max_offset"] - reg["offset"]) == (
        plants["offset"][0]["replica"],
        plants["offset"][0]["queue_id"],
        7,
    )
    (election,) = planted_run.details("elections_without_fault")
    assert (election["group"], election["time_us"]) == (
        plants["election"][0]["group"],
        plants["election"][0]["time_us"],
    )


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
    for check in ("replica_damage", "cq_damaged", "bad_history_lines", "retained_away"):
        assert counts[check] == 0, check
    assert planted_run.summary["warnings"] == []


def test_outputs(planted_run: AuditedRun) -> None:
    out = planted_run.path / "audit"
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3  # throughput, latency, commit indexes
    assert "FAIL" in page and "kill-leader" in page
    for check in planted_run.summary["counts"]:
        assert (out / "details" / f"{check}.json").is_file()
    lat = planted_run.summary["latency"]
    assert lat["end_to_end_ms"]["count"] > 0 and lat["end_to_end_ms"]["p50"] > 0
    assert lat["store_to_receipt_ms"]["p99"] <= lat["end_to_end_ms"]["max"]


def test_every_failure_shows_the_history_lines_that_prove_it(planted_run: AuditedRun) -> None:
    proof = planted_run.summary["proof"]
    page = (planted_run.path / "audit" / "report.html").read_text()
    quoted = {
        "lost",
        "unseen",
        "aborted_read",
        "corrupt_read",
        "poll_order",
        "send_order",
        "ack_offset_mismatch",
        "inconsistent_offsets",
        "offset_regression",
        "committed_prefix",
        "commit_crc_mismatch",
        "nonconflicting_truncation",
    }
    for check in quoted:
        assert proof[check], check
        for p in proof[check]:
            lines = [x for x in p["lines"] if x["where"]]
            assert lines and all(x["text"].startswith("{") for x in lines), (check, p)
            for x in lines:  # the quoted line is the one its row points at
                path, _, number = x["where"].rpartition(":")
                with open(planted_run.path / path) as f:
                    assert f.readlines()[int(number) - 1].rstrip("\n") == x["text"]
    (p,) = proof["poll_order"][:1]
    assert json.loads(p["lines"][-1]["text"])["unique_id"] == p["row"]["unique_id"]
    assert "receipt before" in page and "history/samples.jsonl" in page


# -- Spark against the pure rules ----------------------------------------------------------------------
def _jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _sends(run: AuditedRun) -> list[dict[str, Any]]:
    out = []
    for p in sorted((run.path / "history").glob("sends-*.jsonl")):
        for line, r in enumerate(_jsonl(p)):
            out.append({**r, "line": line, "file": p.stem.removeprefix("sends-")})
    return out


def _reads(run: AuditedRun) -> list[rules.Read]:
    out = []
    paths = [*sorted((run.path / "history").glob("receipts-*.jsonl")), run.path / "history" / "drain.jsonl"]
    for p in paths:
        for line, r in enumerate(_jsonl(p)):
            out.append(
                rules.Read(
                    r["consumer"],
                    line,
                    (r["broker"], r["topic"], r["queue_id"]),
                    r["queue_offset"],
                    r["unique_id"],
                    r.get("session"),
                    r.get("body_crc"),
                )
            )
    return out


def _acks(run: AuditedRun) -> list[rules.Ack]:
    return [
        rules.Ack(
            s["producer"],
            s["line"],
            s["unique_id"],
            (s["broker"], s["topic"], s["queue_id"]),
            s["queue_offset"],
            s["invoke_us"],
        )
        for s in _sends(run)
        if s["outcome"] == "ok"
    ]


def _work(run: AuditedRun, table: str) -> list[dict[str, Any]]:
    return list(pq.read_table(run.path / "audit" / "work" / table).to_pylist())


def _committed(run: AuditedRun) -> tuple[list[dict[str, Any]], set[tuple[str, str]]]:
    commits = {c["group"]: c["group_commit"] for c in run.summary["inputs"]["commits"]}
    records = [r for r in _work(run, "records") if r["index"] <= commits[r["group"]]]
    return records, {(r["group"], r["unique_id"]) for r in records}


def test_spark_reads_and_sends_equal_the_rules(planted_run: AuditedRun) -> None:
    reads, acks = _reads(planted_run), _acks(planted_run)
    workload = [r for r in reads if r.queue[1] == "ChaosTopic"]
    polls = rules.poll_order_violations(workload)
    assert {(r.unique_id, prev, kind) for r, prev, kind in polls} == {
        (r["unique_id"], r["prev_offset"], r["kind"]) for r in planted_run.details("poll_order")
    }
    _records, in_log = _committed(planted_run)
    lost, unseen = rules.lost_and_unseen(acks, in_log, workload)
    assert {a.unique_id for a, _, _ in lost} == ids(planted_run.details("lost"))
    assert {a.unique_id for a in unseen} == ids(planted_run.details("unseen"))
    got = {(r["unique_id"], r["prev_max_offset"]) for r in planted_run.details("send_order")}
    assert got == {(a.unique_id, high) for a, high in rules.send_order_violations(acks)}
    sends = _sends(planted_run)
    aborted = rules.aborted_reads(
        [(s["unique_id"], s["outcome"]) for s in sends], {u for _, u in in_log}, {r.unique_id for r in reads}
    )
    assert aborted == {r["unique_id"]: (r["in_log"], r["read"]) for r in planted_run.details("aborted_read")}
    crcs = {s["unique_id"]: s["body_crc"] for s in sends}
    assert {(r.consumer, r.unique_id) for r, _ in rules.corrupt_reads(crcs, workload)} == {
        (r["consumer"], r["unique_id"]) for r in planted_run.details("corrupt_read")
    }


def test_spark_offsets_equal_the_rules(planted_run: AuditedRun) -> None:
    records, _ = _committed(planted_run)
    entries = _work(planted_run, "entries")
    held = {(e["group"], e["replica"], e["index"], e["body_hash"]): e["position"] for e in entries}
    by_position: dict[tuple[str, str, int], str] = {}
    for r in records:
        for (g, replica, index, body_hash), pos in held.items():
            if (g, index, body_hash) == (r["group"], r["index"], r["body_hash"]):
                by_position[(g, replica, pos + r["rel"])] = r["unique_id"]
    units = [
        (
            u["group"],
            u["replica"],
            by_position[(u["group"], u["replica"], u["position"])],
            u["topic"],
            u["queue_id"],
            u["offset"],
        )
        for u in _work(planted_run, "cq_units")
        if u["topic"] == "ChaosTopic" and (u["group"], u["replica"], u["position"]) in by_position
    ]
    acks = _acks(planted_run)
    got = {(r["unique_id"], r["replica"]) for r in planted_run.details("ack_offset_mismatch")}
    assert got == {(a.unique_id, replica) for a, replica, _ in rules.ack_offset_mismatches(acks, units)}
    claims = [(a.queue, a.offset, a.unique_id, "ack") for a in acks if a.offset is not None]
    claims += [
        (r.queue, r.offset, r.unique_id, r.consumer)
        for r in _reads(planted_run)
        if r.queue[1] == "ChaosTopic"
    ]
    claims += [((g, t, q), o, u, f"replica {g}-{rep}") for g, rep, u, t, q, o in units]
    want = rules.inconsistent_offsets(claims)
    got = {
        ((r["broker"], r["topic"], r["queue_id"]), r["offset"]): set(r["unique_ids"])
        for r in planted_run.details("inconsistent_offsets")
    }
    assert got.keys() == want.keys()
    assert all(len(ids) == 2 and ids <= want[k] for k, ids in got.items())  # two of the ids named there


def _samples(run: AuditedRun) -> list[rules.Sample]:
    out = []
    for line, r in enumerate(_jsonl(run.path / "history" / "samples.jsonl")):
        out.append(
            rules.Sample(
                r["group"],
                r["replica"],
                line,
                r["time_us"],
                r["pid"],
                r["term"],
                r["commit_index"],
                r["applied_index"],
                r["last_index"],
                r["last_term"],
                r["chain_crc_at_commit"],
                r["entries_truncated"],
            )
        )
    return out


def test_spark_sampler_checks_equal_the_rules(planted_run: AuditedRun) -> None:
    samples = _samples(planted_run)
    entries = _work(planted_run, "entries")
    final: dict[tuple[str, str], tuple[int, int, dict[int, int]]] = {}
    for rep in planted_run.summary["inputs"]["replicas"]:
        crcs = {
            e["index"]: e["chain_crc"]
            for e in entries
            if (e["group"], e["replica"]) == (rep["group"], rep["replica"])
        }
        final[(rep["group"], f"{rep['group']}-{rep['replica']}")] = (
            rep["first_index"],
            rep["last_index"],
            crcs,
        )
    got = {(r["line"], r["later_line"], r["kind"]) for r in planted_run.details("committed_prefix")}
    want = rules.committed_prefix_violations(rules.damage_epochs(samples, {}), final)
    assert got == {(a.line, b.line if b else None, kind) for a, b, kind in want}
    assert {(r["group"], r["commit_index"]) for r in planted_run.details("commit_crc_mismatch")} == set(
        rules.commit_crc_mismatches(samples)
    )
    assert {(r["prev_line"], r["line"]) for r in planted_run.details("nonconflicting_truncation")} == {
        (a.line, b.line) for a, b in rules.nonconflicting_truncations(samples)
    }
    windows = [(w["apply_us"], w["heal_us"]) for w in planted_run.summary["faults"]]
    assert {
        (r["group"], r["term"], r["time_us"]) for r in planted_run.details("elections_without_fault")
    } == set(rules.elections_without_fault(samples, windows, audit.ELECTION_GRACE_US))
    after: dict[int, int | None] = {}
    by_replica: dict[str, list[rules.Sample]] = defaultdict(list)
    for smp in samples:
        by_replica[smp.replica].append(smp)
    for rows in by_replica.values():
        rows.sort(key=lambda x: (x.time_us, x.line))
        for a, b in zip(rows, [*rows[1:], None], strict=True):
            after[a.line] = b.applied if b is not None and b.pid == a.pid else None
    raw = _jsonl(planted_run.path / "history" / "samples.jsonl")
    fetches = [
        rules.Fetch(
            smp.group,
            smp.replica,
            smp.line,
            (smp.group, "ChaosTopic", int(q)),
            off,
            smp.applied or 0,
            after[smp.line],
        )
        for smp, r in zip(samples, raw, strict=True)
        for q, off in (r["offsets"] or {}).items()
    ]
    want_reg = rules.offset_regressions(fetches, {})
    assert {(r["line"], r["prev_max_offset"]) for r in planted_run.details("offset_regression")} == {
        (f2.line, f1.offset) for f2, f1 in want_reg
    }


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
    counts = {"lost": 0, "duplicate_deliveries": 3, "divergence": 0}
    assert audit.verdict(counts, ["lost", "divergence"]) == []
    assert audit.verdict(counts, ["lost", "duplicate_deliveries"]) == ["duplicate_deliveries"]


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
