"""Audits of a live local cluster (one 3-replica group as processes on free ports, ACL on) that ran
the chaos workload (producers, an orderly consumer, the final drain — no faults, no Toxiproxy):

- the continuous audit (``spark_jobs.stream_audit``) follows the topic while the workload runs and
  reports a planted loss (an acknowledgement written into the history for a message the group does
  not hold: what a broker that acknowledged and then lost a message leaves behind) in a micro-batch;
- the audit reading the replicas through the brokers (``--from-cluster``) gives the same verdict
  and counters as the audit of the local data directories;
- the export routes are admin-only and bounded; an audit without credentials says so (exit 2);
- the network audit runs on a standalone Spark master with one worker (``--master spark://``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client.message import UniqueIdGenerator
from broker.protocol.auth import Credentials
from chaos.history import JsonlWriter
from chaos.target import LocalTarget
from chaos.workload import Workload, WorkloadConfig, create_topic, drain
from spark_jobs import audit
from spark_jobs.source.localcluster import REPO, LocalCluster
from spark_jobs.stream_audit import StreamAudit
from tests.spark_jobs.source_helpers import CREDENTIAL_ENV, add_account, call_as, standalone_spark, wait_for

pytestmark = pytest.mark.slow

TOPIC = "ChaosTopic"
QUEUES = 4


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, LocalCluster]]:
    run_dir = tmp_path_factory.mktemp("live-run")
    seed = random.Random().randrange(1 << 30)
    print(f"local cluster seed {seed}")
    c = LocalCluster(str(run_dir / "cluster"), groups=1, seed=seed)
    saved = {k: os.environ.get(k) for k in CREDENTIAL_ENV}
    try:
        c.up()
        for k in CREDENTIAL_ENV:
            os.environ.pop(k, None)
        os.environ["DLEDGER_CREDENTIALS_FILE"] = c.credentials_file  # the workload's SDK clients
        yield run_dir, c
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        c.down()
    assert not c.running()


class Run:
    def __init__(self, run_dir: Path, cluster: LocalCluster, stream: dict[str, Any], planted: dict[str, Any],
                 printed: list[str], acked: int):  # fmt: skip
        self.run_dir, self.cluster, self.stream, self.planted = run_dir, cluster, stream, planted
        self.printed, self.acked = printed, acked


def _plant(history: Path) -> dict[str, Any]:
    """An ok send line for a unique id nobody sent, acknowledged at an offset of queue 0 that holds
    another message (taken from an acknowledged send of the workload)."""
    for path in sorted(history.glob("sends-p*.jsonl")):
        for line in path.read_text().splitlines():
            d = json.loads(line) if line.endswith("}") else {}
            if d.get("outcome") == "ok" and d.get("queue_id") == 0:
                planted = {**d, "producer": "px", "key": None, "seq": 0, "unique_id": UniqueIdGenerator().next(),
                           "body_crc": None}  # fmt: skip
                with open(history / "sends-px.jsonl", "a") as f:
                    f.write(json.dumps(planted) + "\n")
                return planted
    raise AssertionError("no acknowledged send to queue 0 yet")


async def _workload(run_dir: Path, c: LocalCluster, acked_before: int, acked_after: int, plant: Any) -> int:
    target = LocalTarget(c.root)
    history = run_dir / "history"
    cfg = WorkloadConfig(topic=TOPIC, queues=QUEUES, producers=2, keyed=1, keys_per_producer=4, consumers=1,
                         rate=25.0, body_bytes=128, zombie_interval_s=0)  # fmt: skip
    w = Workload(str(history), c.namesrv_addr, cfg, random.Random(7))
    try:
        await w.start()
        goal = acked_before
        for phase in (1, 2):
            deadline = time.monotonic() + 120
            while w.counters.ok < goal:
                assert time.monotonic() < deadline, f"only {w.counters.ok} sends acknowledged"
                await asyncio.sleep(0.1)
            w.flush()
            if phase == 1:
                await asyncio.to_thread(plant)
                goal = max(acked_after, w.counters.ok + 60)  # some after the first micro-batch
        await w.stop_producers()
        w.flush()
        deadline = time.monotonic() + 120
        while not w.counters.acked <= w.counters.received:
            assert time.monotonic() < deadline, "the consumer did not receive every acknowledged message"
            await asyncio.sleep(0.1)
        await w.stop_consumers()
    finally:
        await w.close()
    with JsonlWriter(str(history / "drain.jsonl")) as out:
        result = await drain(target, TOPIC, QUEUES, out)
    assert not result.errors, result.errors
    replicas = []
    for m in target.members():
        st = await target.status(m)
        assert st is not None, m.name
        replicas.append({"name": m.name, "group": m.group, "node_id": m.node_id, **{
            k: st.get(k) for k in ("role", "term", "leader_id", "commit_index", "applied_index", "last_index")}})
    await target.transport.close()
    run = {"version": 1, "history_version": 2, "tool": "test_audit_live",
           "topics": [{"topic": TOPIC, "queues": QUEUES}], "namesrv_addr": c.namesrv_addr, "cluster_dir": "cluster",
           "replicas": replicas, "drain_errors": [],
           "counts": {"ok": w.counters.ok, "drained": result.messages}}  # fmt: skip
    (run_dir / "run.json").write_text(json.dumps(run, indent=1))
    return w.counters.ok


@pytest.fixture(scope="module")
def run(spark: Any, live: tuple[Path, LocalCluster]) -> Run:
    run_dir, c = live
    async def topic() -> None:
        target = LocalTarget(c.root)
        await create_topic(target, TOPIC, QUEUES)
        await target.transport.close()

    asyncio.run(topic())
    (run_dir / "history").mkdir(exist_ok=True)
    printed: list[str] = []
    sa = StreamAudit(spark, str(run_dir), str(run_dir / "stream-audit"),
                     {"topic": TOPIC, "namesrv": c.namesrv_addr, "credentialsFile": c.credentials_file},
                     trigger_s=1.0, printer=printed.append)  # fmt: skip
    sa.start()
    planted: dict[str, Any] = {}
    acked: list[int] = []
    failure: list[BaseException] = []

    def go() -> None:
        try:
            def plant() -> None:  # then more messages after a micro-batch ran: the stream follows the run
                planted.update(_plant(run_dir / "history"))
                wait_for(lambda: sa.reports, 180, "the stream audit's first micro-batch", step_s=0.2)

            acked.append(asyncio.run(_workload(run_dir, c, 120, 300, plant)))
        except BaseException as exc:
            failure.append(exc)

    t = threading.Thread(target=go, name="workload")
    try:
        t.start()
        while t.is_alive():
            assert sa.query.exception() is None, sa.query.exception()
            t.join(0.5)
        assert not failure, failure
        sa.wait(duration_s=180, idle_s=5)  # the stream catches up with the drained topic, then idles
    finally:
        t.join(300)
        summary = sa.stop()
    print("\n".join(printed))
    return Run(run_dir, c, summary, planted, printed, acked[0])


def test_the_stream_audit_reports_the_planted_loss_in_a_micro_batch(run: Run) -> None:
    s = run.stream
    assert s["verdict"] == "FAIL"
    assert s["counts"]["lost"] == 1, s
    assert all(s["counts"][k] == 0 for k in ("ack_offset_mismatch", "aborted_read", "key_order", "offset_gap")), s
    assert s["sends_ok"] == run.acked + 1 and s["judged"] == s["sends_ok"], s  # every acknowledgement judged
    drained = len((run.run_dir / "history" / "drain.jsonl").read_text().splitlines())
    assert s["rows"] == drained  # the stream read every stored message once
    batches = [json.loads(line) for line in (run.run_dir / "stream-audit" / "batches.jsonl").read_text().splitlines()]
    hit = [b for b in batches if b["counts"]["lost"]]
    assert len(hit) == 1 and hit[0]["batch_id"] >= 0, "found by a micro-batch, not only at the end"
    assert s["first_anomaly_batch"] == hit[0]["batch_id"]
    finding = next(f for f in hit[0]["findings"] if f["check"] == "lost")
    assert finding["unique_id"] == run.planted["unique_id"]
    assert finding["queue_offset"] == run.planted["queue_offset"] and finding["broker"] == run.planted["broker"]
    assert any("ANOMALIES lost=1" in p and p.startswith("batch ") for p in run.printed)
    assert sum(b["rows"] for b in batches if b["batch_id"] >= 0) == drained
    assert len([b for b in batches if b["batch_id"] >= 0]) >= 2, "the stream followed the run in several batches"


def _audit(run: Run, out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    code = audit.main([str(run.run_dir), "--out", str(out), "--no-plots", *extra])
    return code, json.loads((out / "summary.json").read_text())


def test_the_network_audit_equals_the_local_audit(run: Run, tmp_path: Path) -> None:
    local_code, local = _audit(run, tmp_path / "local")
    net_code, net = _audit(run, tmp_path / "net", "--from-cluster", run.cluster.namesrv_addr,
                           "--credentials", run.cluster.credentials_file)  # fmt: skip
    assert (local_code, local["verdict"]) == (net_code, net["verdict"]) == (1, "FAIL")
    assert local["counts"] == net["counts"]
    # the planted acknowledgement: lost, and its offset names two ids (ack vs log), as in the stream
    assert local["counts"]["lost"] == 1
    assert local["findings"]["lost"]["sample"][0]["unique_id"] == run.planted["unique_id"]
    print("failed checks:", local["failed_checks"])
    assert "lost" in local["failed_checks"] and local["failed_checks"] == net["failed_checks"]
    assert [(r["group"], r["replica"]) for r in local["inputs"]["commits"]] == [
        (r["group"], r["replica"]) for r in net["inputs"]["commits"]] == [("RaftNode00", f"n{i}") for i in range(3)]
    assert local["inputs"]["history_rows"] == net["inputs"]["history_rows"]
    assert not (tmp_path / "net" / "replicas").exists(), "the copies are removed after the audit"
    assert not any("--from-cluster" in w for w in net["warnings"]), net["warnings"]


def test_the_export_is_admin_only_and_bounded(run: Run, tmp_path: Path) -> None:
    c = run.cluster
    addr = c.addr(c.brokers()[0])
    admin = c.credentials
    files = call_as(admin, addr, "GET", "/v1/replica/files", params={"limit": 2})
    assert len(files["files"]) == 2 and files["more"] and files["group"] == "RaftNode00"
    refused = (({"path": "conf/broker.conf"}, "BAD_PATH"), ({"path": "../admin-credentials.yml"}, "BAD_PATH"),
               ({"path": "store/anchor", "max_bytes": str(8 << 20)}, "BAD_PARAMETER"))
    for params, code in refused:
        with pytest.raises(Exception) as e:
            call_as(admin, addr, "GET", "/v1/replica/file", params=params)
        assert getattr(e.value, "code", None) == code, e.value
    with pytest.raises(Exception) as e:
        call_as(None, addr, "GET", "/v1/replica/files")
    assert getattr(e.value, "code", None) == "NO_CREDENTIALS"
    reader = Credentials("export-reader", "reader-secret-0002")
    add_account(c, reader, [f"{TOPIC}=SUB"], TOPIC)
    with pytest.raises(Exception) as e:
        call_as(reader, addr, "GET", "/v1/replica/file", params={"path": "store/anchor"})
    assert getattr(e.value, "code", None) == "NO_PERMISSION"
    # the audit without credentials: a usage error naming the refusal
    env = {k: v for k, v in os.environ.items() if k not in CREDENTIAL_ENV}
    r = subprocess.run([sys.executable, "-m", "spark_jobs.audit", str(run.run_dir), "--out", str(tmp_path / "x"),
                        "--from-cluster", c.namesrv_addr], env=env, cwd=REPO, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    assert "no replica could be copied" in r.stderr and "NO_CREDENTIALS" in r.stderr, r.stderr[-2000:]


def test_the_network_audit_on_a_standalone_master_and_worker(run: Run, tmp_path: Path) -> None:
    """A master and one worker on 127.0.0.1 (Spark's own classes; the pip package has no sbin/);
    the audit copies the replicas through the brokers and runs its checks with ``--master spark://``."""
    _, local = _audit(run, tmp_path / "local")
    with standalone_spark(tmp_path) as spark:
        out = tmp_path / "net"
        r = subprocess.run(
            [sys.executable, "-m", "spark_jobs.audit", str(run.run_dir), "--master", spark.url, "--out", str(out),
             "--no-plots", "--from-cluster", run.cluster.namesrv_addr, "--credentials", run.cluster.credentials_file,
             "--driver-memory", "1g", "--conf", "spark.executor.memory=768m"],
            env={**spark.env, "PYTHONPATH": REPO}, cwd=REPO, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-3000:])  # the planted loss
        net = json.loads((out / "summary.json").read_text())
        assert net["counts"] == local["counts"] and net["verdict"] == local["verdict"] == "FAIL"
        apps = spark.status()["completedapps"]
        assert any(a["name"] == "dledger-audit" for a in apps), apps
