"""failOnDataLoss against a live group whose retention really removed what a read asks for.

The group keeps nothing it does not need (``fileReservedTime=0``) in small segments checked every
100 ms, so a few hundred KiB of messages push the head of the log, and then of the consume queue,
past offset 0 on every replica. A read from offset 0 must then fail (the default) or skip exactly
the removed offsets, report them, and return everything after them."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from broker.client import Message, Producer
from spark_jobs.source import FORMAT, register
from spark_jobs.source.localcluster import LocalCluster
from tests.spark_jobs.source_helpers import call, create_topic, queue_ranges, wait_for

pytestmark = pytest.mark.slow

TOPIC = "SrcR"
RETENTION_PROPS = {
    "fileReservedTime": "0",
    "retentionCheckIntervalMs": "100",
    "maxMessageSize": "4096",
    "maxEntryBodyBytes": str((64 << 10) + 4096),
    "mappedFileSizeCommitLog": str(128 << 10),
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(str(tmp_path_factory.mktemp("src-retention")), props=RETENTION_PROPS)
    try:
        c.up()
        yield c
    finally:
        c.down()
    assert not c.running()


async def send_many(namesrv: str, sent: dict[int, bytes], count: int, seed: int) -> None:
    rng = random.Random(seed)
    async with Producer("src_retention_pg", namesrv) as producer:
        sem = asyncio.Semaphore(8)

        async def one() -> None:
            body = rng.randbytes(1024)
            async with sem:
                result = await producer.send(Message(TOPIC, body))
            sent[result.queue_offset] = body

        await asyncio.gather(*(one() for _ in range(count)))


@pytest.fixture(scope="module")
def removed(cluster: LocalCluster) -> tuple[dict[int, bytes], int, int]:
    """Sends until every replica's queue starts after offset 0; returns (sent bodies by offset,
    the lowest min offset of any replica, the max offset)."""
    asyncio.run(create_topic(cluster.namesrv_addr, TOPIC, 1, groups=1))
    sent: dict[int, bytes] = {}
    seed = random.Random().randrange(1 << 30)
    print(f"retention seed {seed}")
    asyncio.run(send_many(cluster.namesrv_addr, sent, 600, seed))
    addrs = [cluster.addr(p) for p in cluster.brokers()]

    def all_trimmed() -> bool:
        # consume queues drop their removed head at the next store snapshot, which an apply
        # triggers: keep a trickle of messages going while waiting
        asyncio.run(send_many(cluster.namesrv_addr, sent, 1, len(sent)))
        ranges = [queue_ranges(a, TOPIC)[0] for a in addrs]
        return all(lo > 0 and hi == len(sent) for lo, hi in ranges)

    wait_for(all_trimmed, 60, "retention to remove the head of the queue on every replica", step_s=0.3)
    ranges = [queue_ranges(a, TOPIC)[0] for a in addrs]
    assert sorted(sent) == list(range(len(sent)))
    return sent, min(lo for lo, _ in ranges), len(sent)


def read(spark: Any, cluster: LocalCluster, **options: str) -> list[Any]:
    register(spark)
    r = spark.read.format(FORMAT).option("namesrv", cluster.namesrv_addr).option("topic", TOPIC)
    for k, v in options.items():
        r = r.option(k, v)
    return list(r.load().select("queue_offset", "body").collect())


FROM_ZERO = json.dumps({TOPIC: {"RaftNode00": {"0": 0}}})


def test_fail_on_data_loss_fails_the_read(spark: Any, cluster: LocalCluster, removed: Any) -> None:
    _, lowest, _ = removed
    with pytest.raises(Exception, match=r"DATA_LOSS: SrcR@RaftNode00:0 offsets \[0, \d+\) are gone"):
        read(spark, cluster, startingOffsets=FROM_ZERO)
    assert lowest > 0


def test_skip_reports_exactly_the_removed_offsets(
    spark: Any, cluster: LocalCluster, removed: Any, tmp_path: Any
) -> None:
    sent, lowest, end = removed
    log_path = str(tmp_path / "loss.jsonl")
    rows = read(
        spark, cluster, startingOffsets=FROM_ZERO, endingOffsets=json.dumps({TOPIC: {"RaftNode00": {"0": end}}}),
        failOnDataLoss="false", dataLossLog=log_path, pullBatchSize="50",
    )  # fmt: skip
    with open(log_path) as f:
        skipped = [json.loads(line) for line in f]
    assert skipped and all((s["topic"], s["broker"], s["queue_id"]) == (TOPIC, "RaftNode00", 0) for s in skipped)
    lost = sorted(o for s in skipped for o in range(s["from_offset"], s["to_offset"]))
    got = sorted(r["queue_offset"] for r in rows)
    assert lost and lost == list(range(0, lost[-1] + 1)), "one removed head, reported from offset 0"
    assert lost[-1] + 1 >= lowest, "the skip ends where the replica holding the most starts (or later)"
    assert sorted(lost + got) == list(range(end)), "every offset was read or reported, none both"
    assert all(bytes(r["body"]) == sent[r["queue_offset"]] for r in rows)


def test_earliest_starts_at_the_oldest_retained_offset(spark: Any, cluster: LocalCluster, removed: Any) -> None:
    sent, lowest, end = removed
    rows = read(spark, cluster, endingOffsets=json.dumps({TOPIC: {"RaftNode00": {"0": end}}}))
    got = sorted(r["queue_offset"] for r in rows)
    assert got == list(range(lowest, end))
    assert all(bytes(r["body"]) == sent[r["queue_offset"]] for r in rows)
    status = [call(cluster.addr(p), "GET", "/v1/status") for p in cluster.brokers()]
    assert all(int(s["first_index"]) > 1 for s in status), "every replica's log itself was trimmed"
