"""failOnDataLoss against a live group whose retention really removed what a read asks for.

The group keeps nothing it does not need (``fileReservedTime=0``) in small segments checked every
100 ms, so a few hundred KiB of messages push the head of the log past offset 0 on every replica.
Two ways a reader meets that, one cluster each:

- ``queue-trimmed``: the consume queue dropped its head too (at the broker's next store snapshot):
  pulls below its min offset answer OFFSET_TOO_SMALL;
- ``queue-stale``: store snapshots are rare (``storeSnapshotIntervalMs=600000``), so the queue still
  lists the removed messages and the broker skips them inside its answers: holes in the offsets.
  The log keeps what the store has not made durable (retention's floor is the applied index of
  its last snapshot), so here a graceful restart of each replica takes that snapshot: then the log
  loses its head while the consume queue, trimmed only at the next snapshot, keeps listing it.

Either way a read from offset 0 must fail (the default) or skip exactly the removed offsets,
report them, and return everything after them."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from broker.client import Message, Producer
from broker.client.transport import ClientError
from dledger.apps.cluster import stop_process
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


MODES = {
    "queue-trimmed": RETENTION_PROPS,
    "queue-stale": {**RETENTION_PROPS, "storeSnapshotIntervalMs": "600000"},
}


@pytest.fixture(scope="module", params=sorted(MODES))
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(str(tmp_path_factory.mktemp(f"src-{request.param}")), props=MODES[request.param])
    c.mode = request.param  # type: ignore[attr-defined]
    try:
        c.up()
        yield c
    finally:
        c.down()
    assert not c.running()


async def send_many(c: LocalCluster, sent: dict[int, bytes], count: int, seed: int) -> None:
    rng = random.Random(seed)
    async with Producer("src_retention_pg", c.namesrv_addr, credentials=c.credentials, tls=None) as producer:
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
    asyncio.run(create_topic(cluster, TOPIC, 1, groups=1))
    sent: dict[int, bytes] = {}
    seed = random.Random().randrange(1 << 30)
    print(f"retention seed {seed}")
    asyncio.run(send_many(cluster, sent, 600, seed))
    addrs = [cluster.addr(p) for p in cluster.brokers()]

    def all_trimmed() -> bool:
        # consume queues drop their removed head at the next store snapshot, which an apply
        # triggers: keep a trickle of messages going while waiting
        asyncio.run(send_many(cluster, sent, 1, len(sent)))
        ranges = [queue_ranges(cluster, a, TOPIC)[0] for a in addrs]
        return all(lo > 0 and hi == len(sent) for lo, hi in ranges)

    def all_removed_behind_a_stale_queue() -> bool:
        ranges = [queue_ranges(cluster, a, TOPIC)[0] for a in addrs]
        return all(lo == 0 and hi == len(sent) for lo, hi in ranges) and all(gone_at_zero(cluster, a) for a in addrs)

    if cluster.mode == "queue-trimmed":  # type: ignore[attr-defined]
        wait_for(all_trimmed, 60, "retention to remove the head of the queue on every replica", step_s=0.3)
    else:
        for p in cluster.brokers():  # one at a time: the group keeps a majority
            stop_process(p, timeout_s=30)
            addr = cluster.addr(cluster.start(p))
            wait_for(lambda a=addr: queue_ranges(cluster, a, TOPIC)[0][1] == len(sent), 60,
                     f"{p.name} to serve the topic again")  # fmt: skip
        wait_for(all_removed_behind_a_stale_queue, 60, "retention to remove offset 0 from every log", step_s=0.3)
    ranges = [queue_ranges(cluster, a, TOPIC)[0] for a in addrs]
    assert sorted(sent) == list(range(len(sent)))
    return sent, min(lo for lo, _ in ranges), len(sent)


def gone_at_zero(cluster: LocalCluster, addr: str) -> bool:
    try:
        call(cluster, addr, "GET", "/v1/msg/offset", params={"topic": TOPIC, "queue_id": 0, "offset": 0})
    except ClientError as exc:
        return exc.code == "MESSAGE_REMOVED"
    return False


def read(spark: Any, cluster: LocalCluster, **options: str) -> list[Any]:
    register(spark)
    r = spark.read.format(FORMAT).options(**cluster.source_options()).option("topic", TOPIC)
    for k, v in options.items():
        r = r.option(k, v)
    return list(r.load().select("queue_offset", "body").collect())


FROM_ZERO = json.dumps({TOPIC: {"RaftNode00": {"0": 0}}})


def test_fail_on_data_loss_fails_the_read(spark: Any, cluster: LocalCluster, removed: Any) -> None:
    _, lowest, _ = removed
    how = {
        "queue-trimmed": "offset below every replica's min offset",
        "queue-stale": "offsets skipped by the broker as removed from the log",
    }[cluster.mode]  # type: ignore[attr-defined]
    with pytest.raises(Exception, match=r"DATA_LOSS: SrcR@RaftNode00:0 offsets \[0, \d+\) are gone") as info:
        read(spark, cluster, startingOffsets=FROM_ZERO)
    assert f"({how})" in str(info.value)
    assert (lowest > 0) == (cluster.mode == "queue-trimmed")  # type: ignore[attr-defined]


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


def lowest_min(cluster: LocalCluster) -> int:
    return min(queue_ranges(cluster, cluster.addr(p), TOPIC)[0][0] for p in cluster.brokers())


def gone(cluster: LocalCluster, addr: str, offset: int) -> bool:
    try:
        call(cluster, addr, "GET", "/v1/msg/offset", params={"topic": TOPIC, "queue_id": 0, "offset": offset})
    except ClientError as exc:
        return exc.code in ("MESSAGE_REMOVED", "MESSAGE_NOT_FOUND")
    return False


@pytest.mark.parametrize(
    "start",
    [{}, {"startingOffsets": json.dumps({TOPIC: {"RaftNode00": {"0": -2}}})}, {"startingTimestamp": "0"}],
    ids=["earliest", "json-earliest", "timestamp-0"],
)
def test_the_oldest_data_starts_at_the_first_readable_message(
    spark: Any, cluster: LocalCluster, removed: Any, start: dict[str, str]
) -> None:
    """"The oldest data there is" (earliest, -2, an old timestamp) means the first message a
    replica can still serve, not a min offset a consume queue still advertises for messages
    retention already removed (queue-stale): no DATA_LOSS, with failOnDataLoss left true."""
    sent, _, end = removed
    before = lowest_min(cluster)
    rows = read(spark, cluster, endingOffsets=json.dumps({TOPIC: {"RaftNode00": {"0": end}}}), **start)
    got = sorted(r["queue_offset"] for r in rows)
    assert got and got == list(range(got[0], end))
    assert got[0] >= before
    if got[0] > before:
        assert all(gone(cluster, cluster.addr(p), got[0] - 1) for p in cluster.brokers()), "skipped only what is gone"
    assert all(bytes(r["body"]) == sent[r["queue_offset"]] for r in rows)
    status = [call(cluster, cluster.addr(p), "GET", "/v1/status") for p in cluster.brokers()]
    assert all(int(s["first_index"]) > 1 for s in status), "every replica's log itself was trimmed"
