"""The blocking wrappers: each runs its client on a private loop thread. The in-process cluster runs
on the test's loop, so blocking calls are made from worker threads (``asyncio.to_thread``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from broker.client import (
    ConsumeContext,
    Message,
    MessageExt,
    MessageQueue,
    PullStatus,
    SendResult,
    SyncProducer,
    SyncPullConsumer,
    SyncPushConsumer,
)
from tests.acl_fixtures import CONSUMER, PRODUCER
from tests.broker.client.conftest import ClusterFactory
from tests.broker.inproc_cluster import WAIT_S
from tests.dledger.harness import wait_until


async def test_sync_producer_and_push_consumer(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 2})
    addr = cluster.namesrv_addr
    got: list[bytes] = []
    threads: set[str] = set()

    def listener(msgs: list[MessageExt], ctx: ConsumeContext) -> str:
        threads.add(threading.current_thread().name)
        got.extend(m.body for m in msgs)
        return "CONSUME_SUCCESS"

    def run_producer() -> tuple[SendResult, SendResult, SendResult]:
        with SyncProducer("spg", addr, credentials=PRODUCER) as p:
            one = p.send(Message("T", b"sync-1"))
            batch = p.send_batch([Message("T", b"sync-2"), Message("T", b"sync-3")])
            future = p.send_async(Message("T", b"sync-4"))
            assert isinstance(future, concurrent.futures.Future)
            p.send_oneway(Message("T", b"sync-5"))
            assert p.fetch_publish_queues("T") == [MessageQueue("T", "RaftNode00", q) for q in range(2)]
            return one, batch, future.result(10)

    def start_consumer() -> SyncPushConsumer:
        c = SyncPushConsumer(
            "scg", addr, consume_from="FIRST", suspend_ms=300, commit_interval_s=0.1, credentials=CONSUMER
        )
        c.subscribe("T")
        c.register_listener(listener)
        c.start()
        return c

    consumer = await asyncio.to_thread(start_consumer)
    try:
        one, batch, later = await asyncio.to_thread(run_producer)
        assert one.status == "SEND_OK" and len(batch.items) == 2 and later.status == "SEND_OK"
        await wait_until(lambda: len(got) == 5, WAIT_S, "five consumed")
        assert sorted(got) == [f"sync-{i}".encode() for i in range(1, 6)]
        assert all(t.startswith("consume-scg") for t in threads)  # sync listeners run on the pool
        assert len(await asyncio.to_thread(consumer.assigned_queues)) == 2
        stats = await asyncio.to_thread(consumer.stats)
        assert stats.consumed == 5
    finally:
        await asyncio.to_thread(consumer.shutdown)
    assert sum(cluster.groups[0].offsets("scg", "T").values()) == 5


async def test_sync_pull_consumer(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 1})
    await cluster.groups[0].put("T", 0, 2)

    def run() -> None:
        with SyncPullConsumer("spc", cluster.namesrv_addr, credentials=CONSUMER) as pc:
            (mq,) = pc.fetch_message_queues("T")
            res = pc.pull(mq, 0)
            assert res.status is PullStatus.FOUND and len(res.messages) == 2
            pc.update_consume_offset(mq, res.next_offset)
            assert pc.commit() == 1
            assert pc.fetch_consume_offset(mq) == 2
            assert pc.max_offset(mq) == 2 and pc.min_offset(mq) == 0
            assert pc.search_offset(mq, 0) == 0

    await asyncio.to_thread(run)


def test_sync_wrapper_rejects_bad_config_without_leaking_a_thread() -> None:
    before = threading.active_count()
    with pytest.raises(Exception) as e:
        SyncProducer("bad group!")
    assert getattr(e.value, "code", None) == "INVALID_GROUP"
    assert threading.active_count() == before
