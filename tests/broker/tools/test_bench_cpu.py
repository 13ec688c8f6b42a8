"""``mq-bench produce/consume --cpu-pids/--cpu-dir``: CPU seconds of every process of a run — brokers,
NameServers and the client itself (issues 13, 26)."""

from __future__ import annotations

import io
import json
import os
from typing import Any

import pytest

from broker.tools.cpu_usage import CLIENT, CpuSampler, cluster_processes, cpu_seconds, parse_pids
from broker.tools.mqbench import build_parser, main, run_consume, run_produce
from tests.broker.tools.test_mqbench import FakeProducer, FakePushConsumer, fake_sdk


def test_cpu_seconds_of_a_process_and_of_none() -> None:
    spent = cpu_seconds(os.getpid())
    assert spent is not None and spent > 0
    x = 0
    for i in range(300_000):  # burn a little CPU: the reading grows (ticks of 10 ms)
        x += i * i
    after = cpu_seconds(os.getpid())
    assert after is not None and after >= spent
    assert cpu_seconds(2**22 + 12345) is None  # above pid_max's default: no such process


def test_parse_pids_and_cluster_processes(tmp_path: Any) -> None:
    assert parse_pids("n0=12, n1=34") == {"n0": 12, "n1": 34}
    assert parse_pids("56") == {"56": 56}
    for bad in ("", "n0=x", "n0=", ","):
        with pytest.raises(ValueError):
            parse_pids(bad)
    (tmp_path / "cluster.json").write_text(json.dumps({"processes": [
        {"name": "RaftNode00-n0", "pid": 7, "kind": "broker"}, {"name": "namesrv-0", "pid": 8, "kind": "namesrv"}]}))
    assert cluster_processes(str(tmp_path)) == {"RaftNode00-n0": 7}
    assert cluster_processes(str(tmp_path), kinds=("namesrv",)) == {"namesrv-0": 8}
    sampler = CpuSampler({"me": os.getpid(), "gone": 2**22 + 12345})
    sampler.start()
    report = sampler.stop(1000)
    assert report["gone"] == {"pid": 2**22 + 12345, "cpu_s": None, "cpu_us_per_msg": None}
    me = report["me"]
    assert me["cpu_s"] is not None and me["cpu_s"] >= 0 and me["cpu_us_per_msg"] == pytest.approx(
        me["cpu_s"] * 1000, abs=0.1)


async def test_produce_reports_cpu_per_process(monkeypatch: Any) -> None:
    args = build_parser().parse_args(["produce", "-n", "127.0.0.1:1", "--duration", "0.2", "--json",
                                      "--cpu-pids", f"bench={os.getpid()}", "--transport", "binary"])
    out, err = io.StringIO(), io.StringIO()
    from broker.tools import mqbench

    async def no_preflight(*_a: Any) -> None:
        return None

    monkeypatch.setattr(mqbench, "preflight", no_preflight)  # no NameServer here
    assert await run_produce(args, sdk=fake_sdk(FakeProducer()), out=out, err=err) == 0
    summary = json.loads(out.getvalue())
    cpu = summary["broker_cpu"]["bench"]
    assert cpu["pid"] == os.getpid() and cpu["cpu_s"] is not None
    assert summary["transport"] == "binary" and summary["batch_delay_ms"] == 1.0
    # every process of the run: the named ones and the client (this process), always
    assert set(summary["cpu"]) == {"bench", CLIENT}
    assert summary["cpu"][CLIENT]["pid"] == os.getpid()


async def test_produce_and_consume_report_the_clients_cpu_without_asking(monkeypatch: Any) -> None:
    """Issue 26: the client's CPU per message is part of every case (it is one of the processes
    on the same two cores), with or without --cpu-dir."""
    from broker.tools import mqbench

    async def no_preflight(*_a: Any) -> None:
        return None

    monkeypatch.setattr(mqbench, "preflight", no_preflight)
    args = build_parser().parse_args(["produce", "-n", "127.0.0.1:1", "--duration", "0.2", "--json"])
    out = io.StringIO()
    assert await run_produce(args, sdk=fake_sdk(FakeProducer()), out=out, err=io.StringIO()) == 0
    summary = json.loads(out.getvalue())
    assert set(summary["cpu"]) == {CLIENT} and "broker_cpu" not in summary
    client = summary["cpu"][CLIENT]
    assert client["cpu_s"] is not None and summary["messages"] > 0 and client["cpu_us_per_msg"] is not None
    args = build_parser().parse_args(["consume", "-n", "127.0.0.1:1", "--duration", "0.05", "--json"])
    out = io.StringIO()
    assert await run_consume(args, sdk=fake_sdk(consumer=FakePushConsumer([])), out=out, err=io.StringIO()) == 0
    summary = json.loads(out.getvalue())
    assert summary["cpu"][CLIENT]["pid"] == os.getpid()
    assert summary["cpu"][CLIENT]["cpu_us_per_msg"] is None  # no message read: no per-message figure


def test_bad_cpu_arguments_exit_2(capsys: Any, tmp_path: Any) -> None:
    assert main(["produce", "-n", "127.0.0.1:1", "--cpu-pids", "n0=x"]) == 2
    assert main(["produce", "-n", "127.0.0.1:1", "--cpu-dir", str(tmp_path / "nope")]) == 2
    assert main(["consume", "-n", "127.0.0.1:1", "--cpu-dir", str(tmp_path / "nope")]) == 2
    assert "INVALID_CPU_PROCESSES" in capsys.readouterr().err
