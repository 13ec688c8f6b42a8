"""Defects the audit of issue 12 found in clean runs of the standard mix, shown on real brokers in
this process (tests/broker/inproc_cluster.py). Each test failed until the defect was fixed; its
docstring says what the audit saw, where the defect was, and what the fix does."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.client import (
    ConsumeContext,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
    queue_worker,
)
from broker.client.message import PullResult, PullStatus
from tests.acl_fixtures import CONSUMER, PRODUCER
from tests.broker.inproc_cluster import InProcBrokerCluster
from tests.dledger.harness import wait_until


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[InProcBrokerCluster]:
    baseline = InProcBrokerCluster.baseline()
    c = await InProcBrokerCluster.start(str(tmp_path / "cluster"))
    try:
        await c.create_topic("T", 1)
        yield c
    finally:
        await c.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)


async def test_an_orderly_consumer_never_delivers_an_offset_twice_in_one_session(
    cluster: InProcBrokerCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failed before the fix. ``poll_order`` found 9 ``backwards`` polls in a clean 5-minute standard-mix run (and
    chaos.log 9 "offset N is past the leader's max M: moving back" warnings): after a failover, the
    replica the consumer takes for the leader (a new leader still dispatching committed entries, or
    a stale route naming a restarted old leader) holds fewer consume-queue units than the consumer
    already read; it answers OFFSET_OVERFLOW, and ``QueueWorker._apply`` (broker/client/queue_worker.py)
    moves ``next_offset`` back to that replica's max *inside the same worker*: messages already
    handed to the listener come again, without a rebalance or a reset — a non-monotonic poll. An
    OFFSET_OVERFLOW for an offset the consumer reached is a replica behind, not a reset: the worker
    now waits and pulls again (for as long as the topic epoch is the same; the next test).

    The lagging leader is the one thing played here: the first pull at offset 10 is answered as a
    replica with 9 units would answer it; everything else is the real brokers'."""
    mq = MessageQueue("T", "RaftNode00", 0)
    async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER) as p:
        for i in range(10):
            await p.send(Message("T", f"m{i}".encode()), queue=mq)
    real_pull = queue_worker.pull_from
    lagged: list[int] = []

    async def pull_from(*args: Any, **kwargs: Any) -> PullResult:
        offset = args[3]
        if offset == 10 and not lagged and len(seen) >= 10:  # after the first ten were consumed
            lagged.append(offset)  # a leader behind by one unit: "offset 10 is past my max 9"
            return PullResult(PullStatus.OFFSET_OVERFLOW, 9, 0, 9, [])
        return await real_pull(*args, **kwargs)

    monkeypatch.setattr(queue_worker, "pull_from", pull_from)
    seen: list[tuple[int, int]] = []  # (session: the context's place in ``contexts``, offset)
    contexts: list[ConsumeContext] = []

    def listener(msgs: list[MessageExt], ctx: ConsumeContext) -> Any:
        if not any(c is ctx for c in contexts):
            contexts.append(ctx)
        session = next(k for k, c in enumerate(contexts) if c is ctx)
        seen.extend((session, m.queue_offset) for m in msgs)
        return "CONSUME_SUCCESS"

    consumer = PushConsumer("cg", cluster.namesrv_addr, credentials=CONSUMER, orderly=True, consume_from="FIRST",
                            suspend_ms=200, rebalance_interval_s=60, commit_interval_s=60, heartbeat_interval_s=60)
    consumer.subscribe("T")
    consumer.register_listener(listener)
    try:
        await consumer.start()
        await wait_until(lambda: len(seen) >= 10 and bool(lagged), 20, "ten messages and the lagging answer")
        async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER) as p:
            await p.send(Message("T", b"m10"), queue=mq)
        await wait_until(lambda: any(off == 10 for _, off in seen), 20, "the next message")
    finally:
        await consumer.shutdown()
    twice = {k: n for k, n in Counter(seen).items() if n > 1}
    assert not twice, f"offsets delivered twice in one session: {twice}"


async def test_an_overflow_with_the_same_topic_epoch_is_waited_out_and_never_moves_back(
    cluster: InProcBrokerCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other side of the fix (issue 14 replaced the 30 s give-up): a leader that keeps answering
    OFFSET_OVERFLOW for the *same* topic epoch is a replica behind, however long it takes; moving
    back would redeliver, moving to its max could skip stored messages. The worker waits (with a
    warning every ``OVERFLOW_WARN_EVERY_S``) and reads on from its own offset. A topic deleted and
    created again shows as a newer epoch instead (tests/broker/test_topic_recreate.py)."""
    mq = MessageQueue("T", "RaftNode00", 0)
    async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER) as p:
        for i in range(10):
            await p.send(Message("T", f"m{i}".encode()), queue=mq)
    monkeypatch.setattr(queue_worker, "OVERFLOW_WARN_EVERY_S", 0.2)
    real_pull = queue_worker.pull_from
    overflows: list[int] = []
    epochs: list[int | None] = []

    async def pull_from(*args: Any, **kwargs: Any) -> PullResult:
        if args[3] == 10 and len(seen) >= 10 and len(overflows) < 8:  # the leader keeps saying "my max is 9"
            overflows.append(args[3])
            return PullResult(PullStatus.OFFSET_OVERFLOW, 9, 0, 9, [], topic_epoch=epochs[0])
        result = await real_pull(*args, **kwargs)
        epochs.append(result.topic_epoch)
        return result

    monkeypatch.setattr(queue_worker, "pull_from", pull_from)
    seen: list[int] = []
    consumer = PushConsumer("cg", cluster.namesrv_addr, credentials=CONSUMER, orderly=True, consume_from="FIRST",
                            suspend_ms=200, rebalance_interval_s=60, commit_interval_s=60, heartbeat_interval_s=60)
    consumer.subscribe("T")
    consumer.register_listener(lambda msgs, ctx: seen.extend(m.queue_offset for m in msgs) or "CONSUME_SUCCESS")
    try:
        await consumer.start()
        await wait_until(lambda: len(overflows) >= 8, 20, "eight overflow answers")
        async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER) as p:
            await p.send(Message("T", b"m10"), queue=mq)
        await wait_until(lambda: len(seen) >= 11, 20, "the next message")
    finally:
        await consumer.shutdown()
    assert epochs[0] is not None, "pull answers carry the topic epoch"
    assert seen == list(range(11)), "nothing delivered twice, nothing skipped"
