"""Helpers of the dledger-mq data source's live tests: a cluster's answers, sending and recording
what was sent, reading rows back and comparing them, accounts in the cluster's ACL. Waits poll
conditions against deadlines. The clusters run with ACL: every call here is signed with the
cluster's admin account (``LocalCluster.credentials``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from broker.client import Message, Producer
from broker.client.admin import Admin
from broker.client.transport import ClientError, Transport
from broker.protocol.auth import Credentials
from dledger.apps.cluster import ACL_FILE, write_private
from dledger.waiting import wait_until_sync
from spark_jobs.source.localcluster import LocalCluster, port_free

Key = tuple[str, int, int]  # (broker, queue id, queue offset)


def wait_for(cond: Any, timeout_s: float, what: str, step_s: float = 0.05) -> Any:
    """``dledger.waiting.wait_until_sync`` failing the test at the deadline (errors of ``cond``
    count as "not yet": conditions race with the cluster settling)."""
    return wait_until_sync(cond, timeout_s, what, step_s, error=AssertionError)


async def _call(
    creds: Credentials | None, addr: str, method: str, path: str, body: Any = None, params: Any = None
) -> Any:
    t = Transport(5.0, credentials=creds, tls=None)
    try:
        return await t.call(addr, method, path, body, params=params)
    finally:
        await t.close()


def call(c: LocalCluster, addr: str, method: str, path: str, body: Any = None, params: Any = None) -> Any:
    """One request to ``addr``, signed with the cluster's admin account."""
    return asyncio.run(_call(c.credentials, addr, method, path, body, params))


def call_as(creds: Credentials | None, addr: str, method: str, path: str, params: Any = None) -> Any:
    return asyncio.run(_call(creds, addr, method, path, None, params))


def queue_ranges(c: LocalCluster, addr: str, topic: str) -> dict[int, tuple[int, int]]:
    """What one replica holds of each queue: [min offset, max offset)."""
    st = call(c, addr, "GET", f"/v1/topics/{quote(topic, safe='')}/status")
    return {int(q["queue_id"]): (int(q["min_offset"]), int(q["max_offset"])) for q in st["queues"]}


def queue_maxes(c: LocalCluster, addr: str, topic: str) -> dict[int, int]:
    return {q: hi for q, (_, hi) in queue_ranges(c, addr, topic).items()}


def add_account(c: LocalCluster, creds: Credentials, topic_perms: list[str], wait_topic: str) -> None:
    """Add a plain (non-admin) account to the cluster's ACL file; returns once every broker and
    every NameServer accepts it (they reload the file within a second): it may read
    ``wait_topic``'s status and route. (Waiting for the brokers only failed in CI: a NameServer
    that had not reloaded yet refused the reader's signed route request.)"""
    path = os.path.join(c.root, ACL_FILE)
    with open(path) as f:
        doc = yaml.safe_load(f)
    doc["accounts"].append({
        "accessKey": creds.access_key, "secretKey": creds.secret_key, "admin": False,
        "defaultTopicPerm": "DENY", "defaultGroupPerm": "DENY", "topicPerms": topic_perms,
    })  # fmt: skip
    write_private(path, yaml.safe_dump(doc, sort_keys=False))
    status = f"/v1/topics/{quote(wait_topic, safe='')}/status"

    def accepted() -> bool:
        for p in c.brokers():
            call_as(creds, c.addr(p), "GET", status)  # SIGNATURE_INVALID until reloaded
        for ns in c.namesrv_addr.split(";"):
            call_as(creds, ns, "GET", f"/v1/routes/{quote(wait_topic, safe='')}")
        return True

    wait_for(accepted, 30, f"every broker to accept accessKey {creds.access_key}", step_s=0.2)


class Sent:
    """What the producer was told: one record per stored message, keyed by where it landed."""

    def __init__(self) -> None:
        self.rows: dict[Key, dict[str, Any]] = {}

    def add(self, result: Any, msgs: list[Message], born_lo: int, born_hi: int) -> None:
        for item, m in zip(result.items, msgs, strict=True):
            key = (result.message_queue.broker_name, result.message_queue.queue_id, item.queue_offset)
            assert key not in self.rows, key
            self.rows[key] = {
                "msg_id": item.msg_id,
                "unique_id": item.unique_id,
                "body": m.body,
                "keys": list(m.keys),
                "tags": m.tags,
                "properties": dict(m.properties),
                "store_ms": result.store_ts,
                "born": (born_lo, born_hi),
            }

    def maxes(self) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        for b, q, o in self.rows:
            out[(b, q)] = max(out.get((b, q), 0), o + 1)
        return out


def make_messages(topic: str, rng: random.Random, n: int, tag_choices: tuple[str, ...]) -> list[Message]:
    out = []
    for _ in range(n):
        props = {f"p{k}": f"v{rng.randrange(100)}" for k in range(rng.randrange(0, 3))}
        keys = [f"key-{rng.randrange(10**6)}" for _ in range(rng.randrange(0, 3))]
        out.append(Message(topic, rng.randbytes(rng.randrange(1, 600)), tags=rng.choice(tag_choices), keys=keys,
                           properties=props))
    return out


async def send_waves(c: LocalCluster, topic: str, sent: Sent, seed: int, batches: int, per_batch: int) -> None:
    rng = random.Random(seed)
    async with Producer("src_test_pg", c.namesrv_addr, credentials=c.credentials, tls=None) as producer:
        for _ in range(batches):
            msgs = make_messages(topic, rng, per_batch, ("TagA", "TagB", ""))
            lo = time.time_ns() // 1_000_000
            result = await producer.send_batch(msgs)
            sent.add(result, msgs, lo, time.time_ns() // 1_000_000)


async def create_topic(c: LocalCluster, topic: str, queues: int, groups: int = 2) -> None:
    """Create ``topic`` on every group of the cluster and wait until its route lists them all."""
    async with Admin(c.namesrv_addr, credentials=c.credentials, tls=None) as admin:
        await admin.update_topic(topic, cluster="DefaultCluster", read_queue_nums=queues, write_queue_nums=queues)
        deadline = time.monotonic() + 30
        while True:
            try:
                route = await admin.topic_route(topic)
                if len(route.queue_datas) == groups and all(len(b.broker_addrs) == 3 for b in route.broker_datas):
                    return
            except ClientError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the route of {topic} did not list {groups} group(s) with 3 replicas")
            await asyncio.sleep(0.1)


def wait_replicated(c: LocalCluster, topic: str, sent: Sent) -> None:
    want = sent.maxes()

    def caught_up() -> bool:
        for p in c.brokers():
            maxes = queue_maxes(c, c.addr(p), topic)
            for (b, q), hi in want.items():
                if b == p.group and maxes.get(q, 0) != hi:
                    return False
        return True

    wait_for(caught_up, 60, f"every replica to hold all of {topic}")


ROW_SQL = [
    "broker", "queue_id", "queue_offset", "topic", "msg_id", "unique_id", "keys", "tags", "properties", "body",
    "unix_millis(born_timestamp) AS born_ms", "unix_millis(store_timestamp) AS store_ms",
]  # fmt: skip


def rows_of(df: Any) -> dict[Key, dict[str, Any]]:
    out: dict[Key, dict[str, Any]] = {}
    for r in df.selectExpr(*ROW_SQL).collect():
        key = (r["broker"], r["queue_id"], r["queue_offset"])
        assert key not in out, f"{key} read twice"
        out[key] = r.asDict()
    return out


def assert_rows_equal(got: dict[Key, dict[str, Any]], want: dict[Key, dict[str, Any]], topic: str) -> None:
    assert sorted(got) == sorted(want)
    for key, w in want.items():
        g = got[key]
        assert g["topic"] == topic
        assert (g["msg_id"], g["unique_id"], bytes(g["body"])) == (w["msg_id"], w["unique_id"], w["body"]), key
        assert (list(g["keys"]), g["tags"], dict(g["properties"])) == (w["keys"], w["tags"], w["properties"]), key
        assert g["store_ms"] == w["store_ms"], key
        assert w["born"][0] <= g["born_ms"] <= w["born"][1], key


# -- a standalone Spark master and worker on 127.0.0.1 -------------------------------------------
CREDENTIAL_ENV = ("DLEDGER_ACCESS_KEY", "DLEDGER_SECRET_KEY", "DLEDGER_CREDENTIALS_FILE")


@dataclasses.dataclass(frozen=True)
class Standalone:
    url: str  # spark://127.0.0.1:PORT
    ui_port: int
    env: dict[str, str]  # what the master and worker run with: no credentials of the cluster

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
            return dict(json.load(r))


def free_port(rng: random.Random) -> int:
    for _ in range(200):
        p = rng.randrange(29100, 32000)
        if port_free(p):
            return p
    raise AssertionError("no free port")


@contextlib.contextmanager
def standalone_spark(tmp_path: Path) -> Iterator[Standalone]:
    """A master and one worker (Spark's own classes: the pip package has no sbin/) on free ports,
    ended by PID afterwards."""
    import pyspark

    spark_home = os.path.dirname(pyspark.__file__)
    master_port, master_ui, worker_port, worker_ui = (free_port(random.Random()) for _ in range(4))
    env = {
        **{k: v for k, v in os.environ.items() if k not in CREDENTIAL_ENV},
        "SPARK_HOME": spark_home,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
        "PYSPARK_PYTHON": sys.executable,
    }
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    spark = Standalone(f"spark://127.0.0.1:{master_port}", master_ui, env)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        props = tmp_path / "master.properties"
        props.write_text("spark.master.rest.enabled=false\n")  # else it takes the fixed port 6066
        with open(tmp_path / "master.log", "wb") as mlog:
            procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(master_port), "--webui-port", str(master_ui), "--properties-file", str(props)],
                env=env, stdout=mlog, stderr=subprocess.STDOUT,
            ))  # fmt: skip
        wait_for(lambda: spark.status()["status"] == "ALIVE", 90, "the Spark master")
        with open(tmp_path / "worker.log", "wb") as wlog:
            procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                 "--port", str(worker_port), "--webui-port", str(worker_ui), "--cores", "2", "--memory", "1g",
                 spark.url],
                env=env, stdout=wlog, stderr=subprocess.STDOUT,
            ))  # fmt: skip
        wait_for(lambda: spark.status()["aliveworkers"] == 1, 90, "the worker to register")
        yield spark
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
