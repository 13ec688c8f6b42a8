"""Defects the audit of issue 12 found in clean runs of the standard mix, shown without a cluster.
Each test FAILS until the defect is fixed (the fix is outside chaos/ and spark_jobs/); its docstring
says what the audit saw, where the defect is, and what a fix must do."""

from __future__ import annotations

from collections import Counter
from typing import Any

from broker.client import ConsumeContext, MessageExt, PushConsumer
from tests.broker.client.fakes import FakeCluster, wait_until


async def test_an_orderly_consumer_never_delivers_an_offset_twice_in_one_session() -> None:
    """FAILS. ``poll_order`` found 9 ``backwards`` polls in a clean 5-minute standard-mix run (and
    chaos.log 9 "offset N is past the leader's max M: moving back" warnings): after a failover, the
    replica the consumer takes for the leader (a new leader still dispatching committed entries, or
    a stale route naming a restarted old leader) has fewer consume-queue units than the consumer
    already read; it answers OFFSET_OVERFLOW, and ``_QueueWorker._apply`` (broker/client/consumer.py)
    moves ``next_offset`` back to that replica's max *inside the same worker*: messages already
    handed to the listener come again, without a rebalance or a reset — a non-monotonic poll. An
    OFFSET_OVERFLOW for an offset the consumer reached is a replica behind, not a reset: wait and
    pull again (or, like RocketMQ's OFFSET_ILLEGAL, drop the process queue and start a new one)."""
    cluster = await FakeCluster.start(n_groups=1, topics={"T": 1})
    group = cluster.groups[0]
    group.put("T", 0, 10)
    seen: list[tuple[int, int]] = []  # (id of the context: the session, offset)
    contexts: list[ConsumeContext] = []

    def listener(msgs: list[MessageExt], ctx: ConsumeContext) -> Any:
        if not any(c is ctx for c in contexts):
            contexts.append(ctx)
        session = next(k for k, c in enumerate(contexts) if c is ctx)
        seen.extend((session, m.queue_offset) for m in msgs)
        return "CONSUME_SUCCESS"

    consumer = PushConsumer("cg", cluster.namesrv_addr, orderly=True, consume_from="FIRST", suspend_ms=200,
                            rebalance_interval_s=60, commit_interval_s=60, heartbeat_interval_s=60)
    consumer.subscribe("T")
    consumer.register_listener(listener)
    try:
        await consumer.start()
        await wait_until(lambda: len(seen) == 10, what="the first ten messages")
        queue = group.queue("T", 0)
        leader = group.replicas[0]
        asked = len(leader.requests)
        behind = queue.pop()  # the leader the consumer asks next holds one unit less (it is behind)

        def pulls_since() -> list[int]:
            return [int(b["offset"]) for path, b in leader.requests[asked:] if path == "/v1/pull"]

        # the consumer either moved back (a pull at 9) or keeps asking at 10 while the leader is behind
        await wait_until(lambda: 9 in pulls_since() or pulls_since().count(10) >= 3, what="pulls past the end")
        queue.append(behind)  # it catches up
        group.put("T", 0, 1)
        await wait_until(lambda: any(off == 10 for _, off in seen), what="the next message")
    finally:
        await consumer.shutdown()
        await cluster.close()
    twice = {k: n for k, n in Counter(seen).items() if n > 1}
    assert not twice, f"offsets delivered twice in one session: {twice}"

