"""``mq-bench versus-nats``: the NATS half runs the scripts it is given and reads their JSON lines;
the ratios are ours / theirs per case; a broken NATS side is an error, not a row of zeros."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from broker.tools import versus_bench

NATS_LINES = [
    {"case": "sync tasks=1", "msgs_per_s": 1000.0, "latency": {"p99_ms": 2.0}},
    {"case": "sync tasks=32", "msgs_per_s": 8000.0, "latency": {"p99_ms": 9.0}},
    {"case": "async window=256", "msgs_per_s": 16000.0, "latency": {"p99_ms": 30.0}},
    {"case": "drain", "msgs_per_s": 12000.0},
]


def fake_nats(tmp_path: Path, lines: list[dict[str, object]], bench_rc: int = 0) -> str:
    """A run.sh with the real one's interface: up, bench (JSON lines), down; it logs its calls."""
    d = tmp_path / "nats"
    d.mkdir()
    log = tmp_path / "calls"
    body = "\n".join(f"echo '{json.dumps(x)}'" for x in lines)
    (d / "run.sh").write_text(
        f'echo "$@" >> {log}\ncase "$1" in\n  up) echo up ;;\n  bench) {body}\n  exit {bench_rc} ;;\n  down) ;;\nesac\n'
    )
    return str(d)


def args(nats_dir: str) -> argparse.Namespace:
    return argparse.Namespace(nats_dir=nats_dir, duration=2.0)


def test_nats_half_reads_the_four_cases_and_always_stops_the_servers(tmp_path: Path) -> None:
    got = versus_bench.run_nats(args(fake_nats(tmp_path, NATS_LINES)))
    assert {c: got[c]["msgs_per_s"] for c in versus_bench.CASES} == {
        "sync 1": 1000.0, "sync 32": 8000.0, "pipelined": 16000.0, "consumer": 12000.0,
    }  # fmt: skip
    assert got["sync 32"]["p99_ms"] == 9.0
    assert (tmp_path / "calls").read_text().split("\n")[:3] == ["up", "bench --duration 2.0", "down"]


@pytest.mark.parametrize(("lines", "rc"), [(NATS_LINES[:3], 0), (NATS_LINES, 1)])
def test_a_broken_nats_run_is_an_error_and_still_stops_the_servers(
    tmp_path: Path, lines: list[dict[str, object]], rc: int
) -> None:
    with pytest.raises(RuntimeError):
        versus_bench.run_nats(args(fake_nats(tmp_path, lines, rc)))
    assert (tmp_path / "calls").read_text().split("\n")[-2] == "down"


def test_no_scripts_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no NATS bench scripts"):
        versus_bench.run_nats(args(str(tmp_path)))


def test_ratios_are_ours_over_theirs() -> None:
    figures = (500.0, 8000.0, 32000.0, 48000.0, 24000.0)
    ours = {c: {"msgs_per_s": v, "p99_ms": 1.0} for c, v in zip(versus_bench.OUR_CASES, figures, strict=True)}
    theirs = {
        c: {"msgs_per_s": x["msgs_per_s"], "p99_ms": None} for c, x in zip(versus_bench.CASES, NATS_LINES, strict=True)
    }
    rows = versus_bench.compare(ours, theirs)
    # "pipelined batches" (16 senders x send_batch of 64) is compared with NATS's pipelined case
    assert [r["case"] for r in rows] == ["sync 1", "sync 32", "pipelined", "pipelined batches", "consumer"]
    assert [r["ratio"] for r in rows] == [0.5, 1.0, 2.0, 3.0, 2.0]
    assert [r["ratio"] for r in versus_bench.compare(ours, None)] == [None] * 5


def test_rss_is_split_into_heap_and_file_backed_pages() -> None:
    import os

    kib = versus_bench._rss_kib(os.getpid())
    assert kib is not None and kib["rss"] > 0 and kib["anon"] > 0
    assert abs(kib["anon"] + kib["file"] - kib["rss"]) <= kib["rss"] // 10  # RssShmem is the rest
    assert versus_bench._rss_kib(2**22 + 12345) is None  # no such process


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_our_cluster_runs_with_the_flush_policy_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flush: str
) -> None:
    """``--flush async`` runs ours as NATS runs by default (acknowledged before fsync)."""
    import subprocess

    calls: list[tuple[str, ...]] = []

    def cluster_command(a: argparse.Namespace, *cmd: str) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(list(cmd), 1, "", "refused by the test")

    monkeypatch.setattr(versus_bench, "cluster_command", cluster_command)
    ns = argparse.Namespace(dir=str(tmp_path), raft_port=1, http_port=2, namesrv_port=3, flush=flush)
    with pytest.raises(RuntimeError, match="did not start"):
        versus_bench.run_ours(ns)
    up = calls[0]
    assert up[0] == "up" and up[up.index("--flush") + 1] == flush
