"""Producer auto-batching (issue 13): concurrent single sends to one broker group's queues of a topic
share one request, each caller gets its own result (in its own queue) or its own error; linger 0
turns it off. Unit level (a stand-in for the
broker); the end-to-end runs are in test_remoting_e2e.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker.client import ClientError, MessageQueue
from broker.client.autobatch import AutoBatcher

MQ = MessageQueue("T", "RaftNode00", 0)
MQ2 = MessageQueue("T", "RaftNode00", 1)
OTHER_GROUP = MessageQueue("T", "RaftNode01", 0)


class Broker:
    """Answers a batch like /v1/send: consecutive offsets (per queue), one result per message, which
    names its queue when the messages named theirs."""

    def __init__(self) -> None:
        self.requests: list[tuple[MessageQueue, list[dict[str, Any]]]] = []
        self.offsets: dict[tuple[str, int], int] = {}
        self.fail: ClientError | None = None
        self.gate: asyncio.Event | None = None

    async def __call__(self, mq: MessageQueue, items: list[dict[str, Any]], deadline: float) -> Any:
        self.requests.append((mq, items))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        results = []
        for i, it in enumerate(items):
            qid = it.get("queue_id", mq.queue_id)
            offset = self.offsets.get((mq.broker_name, qid), 100)
            self.offsets[mq.broker_name, qid] = offset + 1
            results.append({"msg_id": f"{mq.broker_name}:{qid:04X}{offset:012X}", "unique_id": it["unique_id"],
                            "queue_offset": offset, "position": 1000 + i})
            if "queue_id" in it:
                results[-1]["queue_id"] = qid
        return {"status": "SEND_OK", "broker_name": mq.broker_name, "queue_id": mq.queue_id, "store_ts": 5,
                "results": results}


def item(i: int, size: int = 10) -> dict[str, Any]:
    return {"body": b"x" * size, "unique_id": f"U{i:031d}", "born_ts": 1, "born_host": "h"}


def deadline(s: float = 5.0) -> float:
    return asyncio.get_running_loop().time() + s


async def test_concurrent_sends_share_one_request_and_get_their_own_results() -> None:
    broker = Broker()
    b = AutoBatcher(broker, max_delay_ms=50)
    results = await asyncio.gather(*(b.send(MQ, item(i), deadline()) for i in range(10)))
    assert len(broker.requests) == 1 and [it["unique_id"] for it in broker.requests[0][1]] == [
        f"U{i:031d}" for i in range(10)]
    for i, r in enumerate(results):
        assert r.unique_id == f"U{i:031d}" and r.queue_offset == 100 + i and r.message_queue == MQ
        assert len(r.items) == 1 and r.items[0].unique_id == r.unique_id
    assert len({r.msg_id for r in results}) == 10


async def test_count_and_bytes_close_a_batch() -> None:
    broker = Broker()
    b = AutoBatcher(broker, max_delay_ms=10_000, max_count=4, max_bytes=100)  # only the limits close batches
    sends = [b.send(MQ, item(i), deadline()) for i in range(8)] + [
        b.send(MQ, item(i, size), deadline()) for i, size in ((8, 60), (9, 60), (10, 40))]
    results = await asyncio.wait_for(asyncio.gather(*sends), 5.0)
    # two full batches of 4; then 60 + 60 bytes would pass 100 (the first goes alone), then 60 + 40
    # reaches 100 (goes at once)
    assert [len(items) for _, items in broker.requests] == [4, 4, 1, 2]
    assert [r.queue_offset for r in results] == list(range(100, 111))


async def test_sends_to_several_queues_of_a_group_share_a_request_and_keep_their_queues() -> None:
    """Measured for issue 13: 32 synchronous senders over 8 queues made batches of ~4 (one batch in
    flight per queue); a batch per group carries each message's queue."""
    broker = Broker()
    b = AutoBatcher(broker, max_delay_ms=50)
    mqs = [MQ, MQ2, MQ, MQ2, MessageQueue("T", "RaftNode00", 5), OTHER_GROUP]
    results = await asyncio.wait_for(asyncio.gather(*(b.send(mq, item(i), deadline()) for i, mq in enumerate(mqs))),
                                     5.0)
    assert sorted((mq.broker_name, len(items)) for mq, items in broker.requests) == [("RaftNode00", 5),
                                                                                        ("RaftNode01", 1)]
    (mixed,) = [items for mq, items in broker.requests if mq.broker_name == "RaftNode00"]
    assert [it["queue_id"] for it in mixed] == [0, 1, 0, 1, 5]  # each message names its queue
    (alone,) = [items for mq, items in broker.requests if mq.broker_name == "RaftNode01"]
    assert "queue_id" not in alone[0]  # one queue: the request's queue_id says it
    assert [r.message_queue for r in results] == mqs
    assert [r.queue_offset for r in results] == [100, 100, 101, 101, 100, 100]
    assert [r.unique_id for r in results] == [f"U{i:031d}" for i in range(6)]


async def test_a_failed_batch_gives_every_caller_its_own_error() -> None:
    broker = Broker()
    broker.fail = ClientError("SEND_TIMEOUT", "no quorum", status=504, addr="a:1")
    b = AutoBatcher(broker, max_delay_ms=20)
    outcomes = await asyncio.gather(*(b.send(MQ, item(i), deadline()) for i in range(3)), return_exceptions=True)
    assert len(broker.requests) == 1
    assert all(isinstance(e, ClientError) and e.code == "SEND_TIMEOUT" and e.outcome_unknown for e in outcomes)
    assert len({id(e) for e in outcomes}) == 3  # copies: the producer marks each one per send


async def test_a_caller_waits_no_longer_than_its_own_deadline() -> None:
    broker = Broker()
    broker.gate = asyncio.Event()
    b = AutoBatcher(broker, max_delay_ms=1)
    short = asyncio.create_task(b.send(MQ, item(1), deadline(0.2)))
    long = asyncio.create_task(b.send(MQ, item(2), deadline(30.0)))
    with pytest.raises(ClientError) as e:
        await short
    assert e.value.code == "TIMEOUT" and e.value.outcome_unknown
    broker.gate.set()
    assert (await long).unique_id == f"U{2:031d}"


async def test_a_lone_sender_does_not_wait_for_the_linger() -> None:
    """Found measuring issue 13: with a fixed 1 ms linger one synchronous sender got 383 msgs/s
    against 665 with batching off. A send to a queue with nothing in flight goes at once."""
    broker = Broker()
    b = AutoBatcher(broker, max_delay_ms=60_000)
    for i in range(3):
        r = await asyncio.wait_for(b.send(MQ, item(i), deadline()), 5.0)
        assert r.queue_offset == 100 + i
    assert [len(items) for _, items in broker.requests] == [1, 1, 1]


async def test_sends_gather_while_a_batch_is_in_flight_and_go_when_it_is_answered() -> None:
    broker = Broker()
    broker.gate = asyncio.Event()
    b = AutoBatcher(broker, max_delay_ms=60_000)
    first = asyncio.create_task(b.send(MQ, item(0), deadline()))
    await asyncio.wait_for(_until(lambda: len(broker.requests) == 1), 5.0)  # went at once
    later = [asyncio.create_task(b.send(MQ if i % 2 else MQ2, item(i), deadline())) for i in range(1, 6)]
    other = asyncio.create_task(b.send(OTHER_GROUP, item(9), deadline()))  # another group is idle: at once
    await asyncio.wait_for(_until(lambda: len(broker.requests) == 2), 5.0)
    for _ in range(20):  # loop turns, no wall time: nothing else may go while the first is in flight
        await asyncio.sleep(0)
    assert [(mq.broker_name, len(items)) for mq, items in broker.requests] == [("RaftNode00", 1), ("RaftNode01", 1)]
    broker.gate.set()
    results = await asyncio.wait_for(asyncio.gather(first, *later, other), 5.0)
    assert [(mq.broker_name, len(items)) for mq, items in broker.requests] == [
        ("RaftNode00", 1), ("RaftNode01", 1), ("RaftNode00", 5)]
    assert [r.unique_id for r in results[1:6]] == [f"U{i:031d}" for i in range(1, 6)]
    assert [r.message_queue.queue_id for r in results[1:6]] == [0, 1, 0, 1, 0]


async def test_gathered_sends_go_after_the_linger_even_if_the_batch_in_flight_hangs() -> None:
    broker = Broker()
    broker.gate = asyncio.Event()
    b = AutoBatcher(broker, max_delay_ms=20)
    first = asyncio.create_task(b.send(MQ, item(0), deadline()))
    await asyncio.sleep(0)
    second = asyncio.create_task(b.send(MQ, item(1), deadline()))
    await asyncio.wait_for(_until(lambda: len(broker.requests) == 2), 5.0)
    broker.gate.set()
    await asyncio.gather(first, second)


async def _until(cond: Any) -> None:
    while not cond():
        await asyncio.sleep(0.005)


async def test_linger_zero_means_no_batcher() -> None:
    from broker.client import Producer

    assert Producer("pg", "127.0.0.1:9876", batch_max_delay_ms=0)._batcher is None
    assert Producer("pg", "127.0.0.1:9876")._batcher is not None


async def test_a_lost_batch_answer_is_retried_per_caller_and_stored_once(make_cluster: Any) -> None:
    """Auto-batched sends whose answer is lost: each caller retries its own message (same unique
    id, same queue); the broker's window stores every message once and answers each caller with
    the offset it got the first time."""
    import random

    from broker.client import Message, Producer
    from tests.acl_fixtures import PRODUCER

    cluster = await make_cluster(n_groups=1, topics={"T": 1})
    g = cluster.groups[0]
    g.replicas[0].tap.lose_answer("/v1/send")
    async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER, rng=random.Random(7),
                        batch_max_delay_ms=50) as p:
        results = await asyncio.gather(*(p.send(Message("T", f"m{i}".encode())) for i in range(8)))
    sends = cluster.all_requests("/v1/send")
    assert len(sends[0].body["messages"]) == 8  # the first attempt carried all eight together
    assert sum(len(s.body["messages"]) for s in sends) == 16  # each message retried once
    assert sorted(r.queue_offset for r in results) == list(range(8))
    stored = await g.messages("T", 0)
    assert len(stored) == 8
    for r in results:
        assert stored[r.queue_offset]["unique_id"] == r.unique_id


class SmallBroker(Broker):
    """A broker whose maxMessageSize (the bodies of one request) is 4096 bytes."""

    async def __call__(self, mq: MessageQueue, items: list[dict[str, Any]], deadline: float) -> Any:
        total = sum(len(it["body"]) for it in items)
        if total > 4096:
            self.requests.append((mq, items))
            raise ClientError("MESSAGE_TOO_LARGE", f"batch bodies of {total} bytes exceed 4096", status=400)
        return await super().__call__(mq, items, deadline)


async def test_a_batch_over_the_brokers_size_limit_is_split_until_each_message_fits() -> None:
    """Found by CI (tests/spark_jobs/test_source_retention.py, brokers at maxMessageSize=4096): 3 KB
    sends that each fit were merged into one 8 KB batch and every caller got MESSAGE_TOO_LARGE. Now
    the batch is split (halves, then single messages) and every caller gets its own result; a
    message too large on its own still gets the broker's refusal, and later batches stay under the
    size the broker refused."""
    broker = SmallBroker()
    b = AutoBatcher(broker, max_delay_ms=50)
    results = await asyncio.gather(*(b.send(MQ, item(i, 3000), deadline()) for i in range(4)))
    assert sorted(r.unique_id for r in results) == [f"U{i:031d}" for i in range(4)]
    assert len({r.queue_offset for r in results}) == 4
    refused = len(broker.requests) - 4
    assert refused >= 1
    with pytest.raises(ClientError) as info:
        await b.send(MQ, item(9, 5000), deadline())
    assert info.value.code == "MESSAGE_TOO_LARGE"
    broker.requests.clear()
    await asyncio.gather(*(b.send(MQ, item(20 + i, 3000), deadline()) for i in range(2)))
    assert all(sum(len(it["body"]) for it in items) <= 4096 for _, items in broker.requests)
