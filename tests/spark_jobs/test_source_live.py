"""The dledger-mq data source against a live local cluster (a NameServer and two 3-replica broker
groups as processes on free ports) in Spark local mode: batch reads equal what was sent, offset
ranges, JSON offsets, timestamps, tag filters, follower reads, a dead follower, streaming with a
restart from the checkpoint, and a batch read on a standalone Spark master with one worker. ACL is
on: reads carry the cluster's admin account (``credentialsFile``), a reader account with SUB only,
or none (a clear NO_CREDENTIALS error)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from broker.client.message import MessageQueue
from broker.protocol.auth import Credentials
from dledger.apps.cluster import is_running
from spark_jobs.source import FORMAT, register
from spark_jobs.source.localcluster import REPO, LocalCluster
from spark_jobs.source.options import parse_options
from spark_jobs.source.plan import ReadRange
from spark_jobs.source.reader import RangeReader
from spark_jobs.source.security import SourceAuthError
from tests.spark_jobs.source_helpers import (
    CREDENTIAL_ENV,
    Key,
    Sent,
    add_account,
    assert_rows_equal,
    call,
    create_topic,
    free_port,
    queue_maxes,
    rows_of,
    send_waves,
    standalone_spark,
    wait_for,
    wait_replicated,
)

pytestmark = pytest.mark.slow

TOPIC = "SrcA"


# -- fixtures ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    seed = random.Random().randrange(1 << 30)
    print(f"local cluster seed {seed}")
    c = LocalCluster(str(tmp_path_factory.mktemp("src-cluster")), groups=2, seed=seed)
    try:
        c.up()
        yield c
    finally:
        c.down()
    assert not c.running()


@pytest.fixture(scope="module")
def sent(cluster: LocalCluster) -> Sent:
    s = Sent()
    asyncio.run(create_topic(cluster, TOPIC, 4))
    seed = random.Random().randrange(1 << 30)
    print(f"message seed {seed}")
    asyncio.run(send_waves(cluster, TOPIC, s, seed, batches=24, per_batch=17))
    assert {b for b, _, _ in s.rows} == {"RaftNode00", "RaftNode01"}, "both groups got messages"
    wait_replicated(cluster, TOPIC, s)
    return s


@pytest.fixture(scope="module")
def ss(spark: Any) -> Any:
    register(spark)
    return spark


def reader(ss: Any, cluster: LocalCluster, **options: str) -> Any:
    """A batch read with the cluster's NameServers and admin account (``credentialsFile``)."""
    r = ss.read.format(FORMAT)
    for k, v in {**cluster.source_options(), **options}.items():
        r = r.option(k, v)
    return r.load()


# -- credentials ---------------------------------------------------------------------------------------


def test_a_read_without_credentials_fails_naming_them(ss: Any, cluster: LocalCluster, sent: Sent) -> None:
    """ACL is on: a batch read and a stream without credentials fail at planning with the
    broker's code and what would give credentials; neither waits for a timeout."""
    assert not [k for k in CREDENTIAL_ENV if os.environ.get(k)], "the test needs an environment without credentials"
    hint = r"the brokers run with ACL and the data source has no credentials: give the options accessKey and " \
           r"secretKey, or credentialsFile"
    with pytest.raises(Exception, match=rf"NO_CREDENTIALS: the status of topic 'SrcA' at RaftNode0[01] was "
                                        rf"refused: this request must be signed .*; {hint}"):
        ss.read.format(FORMAT).option("namesrv", cluster.namesrv_addr).option("topic", TOPIC).load().count()
    stream = ss.readStream.format(FORMAT).option("namesrv", cluster.namesrv_addr).option("topic", TOPIC).load()
    query = stream.writeStream.format("noop").start()
    try:
        with pytest.raises(Exception, match=f"NO_CREDENTIALS: .*{hint}"):
            query.awaitTermination(120)
    finally:
        query.stop()


def test_a_reader_account_needs_only_sub_on_its_topics(ss: Any, cluster: LocalCluster, sent: Sent) -> None:
    """A plain account with SUB on one topic reads it (accessKey/secretKey options); another
    topic is refused naming the permission; a wrong secret is refused naming the key."""
    other = "SrcP"
    asyncio.run(create_topic(cluster, other, 2))
    asyncio.run(send_waves(cluster, other, Sent(), 9, batches=2, per_batch=5))
    creds = Credentials("spark-reader", "reader-secret-0001")
    add_account(cluster, creds, [f"{TOPIC}=SUB"], TOPIC)
    as_reader = {"namesrv": cluster.namesrv_addr, "accessKey": creds.access_key, "secretKey": creds.secret_key}

    def read(topic: str, **extra: str) -> Any:
        return ss.read.format(FORMAT).options(**as_reader).option("topic", topic).options(**extra).load()

    assert_rows_equal(rows_of(read(TOPIC, pullBatchSize="50")), sent.rows, TOPIC)
    assert len(rows_of(read(TOPIC, startingTimestamp="0"))) == len(sent.rows)  # offset searches need SUB
    with pytest.raises(Exception, match=r"NO_PERMISSION: the pull of SrcP@RaftNode0[01]:[01] at 0 was refused: .*"
                                        r"accessKey 'spark-reader' may not read this: the data source needs SUB"):
        read(other).count()
    with pytest.raises(Exception, match=r"SIGNATURE_INVALID: .*the cluster does not know accessKey 'spark-reader', "
                                        r"or its secretKey is wrong"):
        read(TOPIC, secretKey="not-the-secret").count()


# -- batch ---------------------------------------------------------------------------------------------
def test_batch_read_equals_what_was_sent(ss: Any, cluster: LocalCluster, sent: Sent) -> None:
    df = reader(ss, cluster, topic=TOPIC, maxRecordsPerPartition="13", pullBatchSize="5")
    ranges = sum((hi + 12) // 13 for hi in sent.maxes().values())
    assert df.rdd.getNumPartitions() == ranges  # one per (group, queue, offset range)
    assert_rows_equal(rows_of(df), sent.rows, TOPIC)
    assert df.schema.simpleString() == (
        "struct<topic:string,broker:string,queue_id:int,queue_offset:bigint,msg_id:string,unique_id:string,"
        "keys:array<string>,tags:string,properties:map<string,string>,body:binary,born_timestamp:timestamp,"
        "store_timestamp:timestamp>"
    )


def test_per_queue_json_offsets_and_ranges(ss: Any, cluster: LocalCluster, sent: Sent) -> None:
    maxes = sent.maxes()
    rng = random.Random(7)
    start: dict[str, dict[str, dict[str, int]]] = {TOPIC: {}}
    end: dict[str, dict[str, dict[str, int]]] = {TOPIC: {}}
    want: set[Key] = set()
    for (b, q), hi in sorted(maxes.items()):
        lo_off = rng.choice([-2, rng.randrange(0, hi)])
        hi_off = rng.choice([-1, rng.randrange(max(lo_off, 0), hi + 1)])
        start[TOPIC].setdefault(b, {})[str(q)] = lo_off
        end[TOPIC].setdefault(b, {})[str(q)] = hi_off
        want |= {(b, q, o) for o in range(max(lo_off, 0), hi if hi_off == -1 else hi_off)}
    df = reader(ss, cluster, topic=TOPIC, startingOffsets=json.dumps(start), endingOffsets=json.dumps(end))
    got = rows_of(df)
    assert set(got) == want
    assert_rows_equal(got, {k: sent.rows[k] for k in want}, TOPIC)


def test_json_offsets_must_cover_every_queue(ss: Any, cluster: LocalCluster, sent: Sent) -> None:
    partial = json.dumps({TOPIC: {"RaftNode00": {"0": 0}}})
    with pytest.raises(Exception, match="must give every queue") as info:
        reader(ss, cluster, topic=TOPIC, startingOffsets=partial).count()
    assert "SrcA@RaftNode01:0" in str(info.value)
    with pytest.raises(Exception, match="position 4"):
        reader(ss, cluster, topic=TOPIC, filter="sql:a > 'x'").count()
    with pytest.raises(Exception, match="'NoSuchTopic' does not exist"):
        reader(ss, cluster, topic="NoSuchTopic").count()


def test_tag_filter(ss: Any, cluster: LocalCluster, sent: Sent) -> None:
    got = rows_of(reader(ss, cluster, topic=TOPIC, filter="tag:TagA", pullBatchSize="3"))
    want = {k: v for k, v in sent.rows.items() if v["tags"] == "TagA"}
    assert want and len(want) < len(sent.rows)
    assert_rows_equal(got, want, TOPIC)
    by_sql = rows_of(reader(ss, cluster, topic=TOPIC, filter="sql:TAGS = 'TagA'", pullBatchSize="3"))
    assert_rows_equal(by_sql, want, TOPIC)  # the brokers evaluate the SQL92 filter
    both = rows_of(reader(ss, cluster, topic=TOPIC, filter="tag:TagA||TagB"))
    assert set(both) == {k for k, v in sent.rows.items() if v["tags"] in ("TagA", "TagB")}


def test_timestamps_select_by_store_time(ss: Any, cluster: LocalCluster) -> None:
    topic = "SrcT"
    asyncio.run(create_topic(cluster, topic, 2))
    first, second = Sent(), Sent()
    asyncio.run(send_waves(cluster, topic, first, 1, batches=4, per_batch=5))
    boundary = max(r["store_ms"] for r in first.rows.values()) + 1
    wait_for(lambda: time.time_ns() // 1_000_000 > boundary, 5, "the clock to pass the first wave")
    asyncio.run(send_waves(cluster, topic, second, 2, batches=4, per_batch=5))
    both = Sent()
    both.rows = {**first.rows, **second.rows}
    wait_replicated(cluster, topic, both)
    got = rows_of(reader(ss, cluster, topic=topic, startingTimestamp=str(boundary)))
    assert set(got) == set(second.rows)
    got = rows_of(reader(ss, cluster, topic=topic, endingTimestamp=str(boundary)))
    assert set(got) == set(first.rows)
    per_queue = {topic: {b: {str(q): boundary for q in range(2)} for b in ("RaftNode00", "RaftNode01")}}
    got = rows_of(reader(ss, cluster, topic=topic, startingOffsetsByTimestamp=json.dumps(per_queue)))
    assert set(got) == set(second.rows)


def pull_counters(cluster: LocalCluster) -> dict[str, tuple[bool, int]]:
    out = {}
    for p in cluster.brokers():
        st = call(cluster, cluster.addr(p), "GET", "/v1/status")
        out[p.name] = (bool(st["writable"]), int(st["send"].get("pulls", 0)))  # absent before a first pull
    return out


def test_reads_go_to_followers_and_spare_the_leader(ss: Any, cluster: LocalCluster, sent: Sent) -> None:
    zeros = json.dumps({TOPIC: {b: {str(q): 0 for bb, q in sent.maxes() if bb == b} for b, _ in sent.maxes()}})
    before = pull_counters(cluster)
    got = rows_of(reader(ss, cluster, topic=TOPIC, pullBatchSize="4", startingOffsets=zeros))
    assert_rows_equal(got, sent.rows, TOPIC)
    after = pull_counters(cluster)
    leaders = {n for n, (w, _) in after.items() if w}
    assert len(leaders) == 2 and all(before[n][0] for n in leaders), "the leaders did not change"
    delta = {n: after[n][1] - before[n][1] for n in after}
    assert all(delta[n] == 0 for n in leaders), delta
    assert all(delta[n] > 0 for n in after if n not in leaders), delta  # both followers share the work
    before = pull_counters(cluster)
    got = rows_of(reader(ss, cluster, topic=TOPIC, preferFollowers="false", startingOffsets=zeros))
    assert len(got) == len(sent.rows)
    after = pull_counters(cluster)
    assert all(after[n][1] - before[n][1] == 0 for n in after if n not in leaders)
    # "earliest" (the default) asks every replica once per queue where its first readable
    # message is (one small pull each); the data itself still comes from the followers
    before = pull_counters(cluster)
    assert len(rows_of(reader(ss, cluster, topic=TOPIC, pullBatchSize="4"))) == len(sent.rows)
    after = pull_counters(cluster)
    assert all(after[n][1] - before[n][1] == 4 for n in leaders), "one probe per queue (4 per group)"


def test_a_dead_follower_does_not_stop_a_read(ss: Any, cluster: LocalCluster, sent: Sent) -> None:
    follower = next(
        p for p in cluster.brokers("RaftNode00") if not call(cluster, cluster.addr(p), "GET", "/v1/status")["writable"]
    )
    os.kill(follower.pid, signal.SIGKILL)
    wait_for(lambda: not is_running(follower), 10, "the follower to die")
    try:
        assert_rows_equal(rows_of(reader(ss, cluster, topic=TOPIC, pullBatchSize="7")), sent.rows, TOPIC)
    finally:
        again = cluster.start(follower)
        wait_for(lambda: queue_maxes(cluster, cluster.addr(again), TOPIC) == {
            q: hi for (b, q), hi in sent.maxes().items() if b == "RaftNode00"
        }, 60, "the restarted follower to catch up")


def test_range_reader_falls_over_to_live_replicas_and_bounds_its_waits(cluster: LocalCluster, sent: Sent) -> None:
    """The executor's loop alone (no Spark): a dead planned replica, no planned replica at all
    (the route is asked), a range nobody can serve (a bounded wait, then a clear error), a topic
    every replica refuses, and pulls without credentials (refused at once, not retried)."""
    o = parse_options({**cluster.source_options(), "topic": TOPIC, "timeoutMs": "800", "pullBatchSize": "9"},
                      "batch", env={})
    queue = MessageQueue(TOPIC, "RaftNode00", 0)
    hi = sent.maxes()[("RaftNode00", 0)]
    dead = f"127.0.0.1:{free_port(random.Random())}"
    for addrs in ((dead,), ()):
        rows = [r for b in RangeReader(o, ReadRange(queue, 0, hi, addrs)).batches() for r in b.to_pylist()]
        assert [r["queue_offset"] for r in rows] == list(range(hi))
        assert all(r["unique_id"] == sent.rows[("RaftNode00", 0, r["queue_offset"])]["unique_id"] for r in rows)
    with pytest.raises(TimeoutError, match=r"RaftNode00 served SrcA@RaftNode00:0 at offset \d+ within 800 ms"):
        list(RangeReader(o, ReadRange(queue, hi + 5, hi + 10, (dead,))).batches())
    replicas = tuple(cluster.addr(p) for p in cluster.brokers("RaftNode00"))
    gone = MessageQueue("NoSuchTopic", "RaftNode00", 0)
    with pytest.raises(RuntimeError, match=r"every replica refused the pull of NoSuchTopic@RaftNode00:0.*TOPIC_NOT"):
        list(RangeReader(o, ReadRange(gone, 0, 5, replicas)).batches())
    bare = parse_options({"namesrv": cluster.namesrv_addr, "topic": TOPIC, "timeoutMs": "600000"}, "batch", env={})
    assert bare.security.credentials is None
    with pytest.raises(SourceAuthError, match=r"NO_CREDENTIALS: the pull of SrcA@RaftNode00:0 at 0 was refused"
                       r".*give the options accessKey and secretKey, or credentialsFile"):
        list(RangeReader(bare, ReadRange(queue, 0, hi, replicas)).batches())


def test_bench_command_against_the_cluster(cluster: LocalCluster) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "spark_jobs.source.bench", "--namesrv", cluster.namesrv_addr, "--messages", "3000",
         "--queues", "3", "--repeat", "1", "--master", "local[2]", "--json",
         "--credentials", cluster.credentials_file],
        capture_output=True, text=True, timeout=240, cwd=REPO,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout.splitlines()[-1])
    assert summary["held"] == 3000 and summary["runs"][0]["count"] == 3000 and summary["best_msgs_per_s"] > 0


# -- streaming -------------------------------------------------------------------------------------------
def committed_batches(checkpoint: str) -> int:
    commits = os.path.join(checkpoint, "commits")
    return len([n for n in os.listdir(commits) if n.isdigit()]) if os.path.isdir(commits) else 0


def test_stream_restarted_from_its_checkpoint_neither_skips_nor_repeats(
    ss: Any, cluster: LocalCluster, tmp_path: Any
) -> None:
    topic = "SrcS"
    asyncio.run(create_topic(cluster, topic, 2))
    sent = Sent()
    asyncio.run(send_waves(cluster, topic, sent, 3, batches=10, per_batch=30))
    wait_replicated(cluster, topic, sent)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")

    def start(trigger: dict[str, Any]) -> Any:
        stream = (
            ss.readStream.format(FORMAT).options(**cluster.source_options()).option("topic", topic)
            .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", "10").load()
        )  # fmt: skip
        return (
            stream.selectExpr("broker", "queue_id", "queue_offset", "msg_id", "unique_id", "body")
            .writeStream.format("parquet").option("path", out).option("checkpointLocation", ckpt)
            .trigger(**trigger).start()
        )  # fmt: skip

    query = start({"processingTime": "0 seconds"})
    try:
        wait_for(lambda: committed_batches(ckpt) >= 2, 120, "two committed micro-batches")
    finally:
        query.stop()
    first_run = committed_batches(ckpt)
    assert first_run * 10 < len(sent.rows), "the first run stopped mid-way"
    more = Sent()
    asyncio.run(send_waves(cluster, topic, more, 4, batches=5, per_batch=20))
    sent.rows.update(more.rows)
    wait_replicated(cluster, topic, sent)
    query = start({"availableNow": True})
    try:
        assert query.awaitTermination(300), "the availableNow run finished"
        assert query.exception() is None
    finally:
        query.stop()
    got = ss.read.parquet(out).collect()
    keys = [(r["broker"], r["queue_id"], r["queue_offset"]) for r in got]
    assert len(keys) == len(set(keys)), "no offset was written twice"
    assert set(keys) == set(sent.rows), "every sent offset was written"
    for r in got:
        w = sent.rows[(r["broker"], r["queue_id"], r["queue_offset"])]
        assert (r["msg_id"], r["unique_id"], bytes(r["body"])) == (w["msg_id"], w["unique_id"], w["body"])
    # every micro-batch was at most 10 offsets, and the second run started where the first stopped
    offsets_dir = os.path.join(ckpt, "offsets")
    batch_ids = sorted(int(n) for n in os.listdir(offsets_dir) if n.isdigit())
    assert batch_ids == list(range(len(batch_ids))) and len(batch_ids) > first_run


def logged_offsets(checkpoint: str, batch_id: int) -> dict[Key, int]:
    """The source's end offsets Spark logged for a micro-batch (its write-ahead offsets log)."""
    with open(os.path.join(checkpoint, "offsets", str(batch_id))) as f:
        doc = json.loads(f.read().splitlines()[-1])
    return {(b, int(q), 0): n for t in doc.values() for b, qs in t.items() for q, n in qs.items()}


def test_a_failed_micro_batch_is_replayed_with_exactly_its_logged_range(
    ss: Any, cluster: LocalCluster, tmp_path: Any
) -> None:
    topic = "SrcF"
    asyncio.run(create_topic(cluster, topic, 2))
    sent = Sent()
    asyncio.run(send_waves(cluster, topic, sent, 5, batches=6, per_batch=25))
    wait_replicated(cluster, topic, sent)
    out, ckpt, marker = tmp_path / "out", str(tmp_path / "ckpt"), tmp_path / "fail-once"
    marker.write_text("x")

    def write(df: Any, batch_id: int) -> None:
        if batch_id == 2 and marker.exists():
            marker.unlink()
            raise RuntimeError("planted failure in micro-batch 2")
        df.write.mode("overwrite").parquet(str(out / f"batch={batch_id}"))

    def start(trigger: dict[str, Any]) -> Any:
        stream = (
            ss.readStream.format(FORMAT).options(**cluster.source_options()).option("topic", topic)
            .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", "15").load()
        )  # fmt: skip
        return (
            stream.selectExpr("broker", "queue_id", "queue_offset", "unique_id")
            .writeStream.foreachBatch(write).option("checkpointLocation", ckpt).trigger(**trigger).start()
        )  # fmt: skip

    query = start({"processingTime": "0 seconds"})
    try:
        with pytest.raises(Exception, match="planted failure"):
            query.awaitTermination(120)
    finally:
        query.stop()
    assert os.path.exists(os.path.join(ckpt, "offsets", "2"))
    assert not os.path.exists(os.path.join(ckpt, "commits", "2")), "batch 2 was logged, not committed"
    planned = logged_offsets(ckpt, 2)
    query = start({"availableNow": True})
    try:
        assert query.awaitTermination(300)
        assert query.exception() is None
    finally:
        query.stop()
    assert logged_offsets(ckpt, 2) == planned, "the replay kept the logged end offsets"
    batches = sorted(int(p.name.split("=")[1]) for p in out.iterdir())
    assert batches == list(range(len(batches))) and len(batches) > 3
    seen: set[Key] = set()
    for b in batches:
        batch = ss.read.parquet(str(out / f"batch={b}")).collect()
        rows = {(r["broker"], r["queue_id"], r["queue_offset"]) for r in batch}
        assert not rows & seen, f"batch {b} repeats offsets"
        seen |= rows
        if b > 0:
            lo, hi = logged_offsets(ckpt, b - 1), logged_offsets(ckpt, b)
            want = {(br, q, o) for (br, q, _), end in hi.items() for o in range(lo.get((br, q, 0), end), end)}
            assert rows == want, f"batch {b} read exactly its logged range"
    assert seen == set(sent.rows)


# -- a standalone Spark cluster ------------------------------------------------------------------------
DRIVER = """
import json, sys
from spark_jobs.session import get_session
master, namesrv, topic, out = sys.argv[1:5]
spark = get_session(master, app_name="dledger-mq-standalone-test", driver_memory="1g")
import spark_jobs.source  # registers the format with the active session
df = spark.read.format("dledger-mq").option("namesrv", namesrv).option("topic", topic).load()
rows = df.selectExpr("broker", "queue_id", "queue_offset", "unique_id", "sha2(body, 256) AS sha").collect()
with open(out, "w") as f:
    json.dump({"master": spark.sparkContext.master, "partitions": df.rdd.getNumPartitions(),
               "rows": [list(r) for r in rows]}, f)
spark.stop()
"""


def test_batch_read_on_a_standalone_master_and_worker(cluster: LocalCluster, sent: Sent, tmp_path: Any) -> None:
    """The driver gives no credential option: it has DLEDGER_CREDENTIALS_FILE in its environment
    (the SDK's rule), the master and the worker have no credentials at all — the executors use
    what the driver resolved."""
    with standalone_spark(tmp_path) as spark:
        script = tmp_path / "driver.py"
        script.write_text(DRIVER)
        out = tmp_path / "rows.json"
        r = subprocess.run(
            [sys.executable, str(script), spark.url, cluster.namesrv_addr, TOPIC, str(out)],
            env={**spark.env, "PYTHONPATH": REPO, "DLEDGER_CREDENTIALS_FILE": cluster.credentials_file},
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        result = json.loads(out.read_text())
        assert result["master"] == spark.url
        got = {(b, q, o): (u, sha) for b, q, o, u, sha in result["rows"]}
        assert len(got) == len(result["rows"])
        assert got == {
            k: (w["unique_id"], hashlib.sha256(w["body"]).hexdigest()) for k, w in sent.rows.items()
        }
        apps = spark.status()["completedapps"]
        assert any(a["name"] == "dledger-mq-standalone-test" for a in apps), apps
