"""The pure cores: allocation math, selectors, the latency fault table, unique ids, ProcessQueue
semantics and the wire codecs. No sockets, no event loop."""

from __future__ import annotations

import itertools
import random
import zlib
from collections.abc import Callable

import pytest

from broker.client.allocate import allocate_averagely, allocate_averagely_by_circle
from broker.client.latency import FaultStrategy, LatencyFaultTolerance, not_available_ms
from broker.client.message import (
    Message,
    MessageExt,
    MessageQueue,
    PullStatus,
    UniqueIdGenerator,
    check_batch,
    new_unique_id,
    parse_tags_expression,
    pull_result_from_answer,
    send_request,
    send_result_from_answer,
    tags_expression,
    unique_id_info,
)
from broker.client.process_queue import ProcessQueue, backoff_s
from broker.client.route_cache import publish_queues, read_order, subscribe_queues
from broker.client.selector import HashKeySelector, RoundRobinSelector, select_avoiding
from broker.client.transport import ClientError, TopicRoute
from broker.protocol.routes import BrokerData, QueueData

CIDS3 = ["c0", "c1", "c2"]


# -- allocation (RocketMQ's AllocateMessageQueueAveragely / ...ByCircle) -------------------------------
@pytest.mark.parametrize(
    ("n_mq", "n_cid", "expected"),
    [
        (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
        (5, 3, [[0, 1], [2, 3], [4]]),
        (2, 3, [[0], [1], []]),
        (3, 3, [[0], [1], [2]]),
        (10, 4, [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]),
        (4, 1, [[0, 1, 2, 3]]),
        (16, 5, [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12], [13, 14, 15]]),
    ],
)
def test_allocate_averagely_matches_rocketmq(n_mq: int, n_cid: int, expected: list[list[int]]) -> None:
    cids = [f"c{i}" for i in range(n_cid)]
    assert [allocate_averagely(c, list(range(n_mq)), cids) for c in cids] == expected


@pytest.mark.parametrize(
    ("n_mq", "n_cid", "expected"),
    [
        (8, 3, [[0, 3, 6], [1, 4, 7], [2, 5]]),
        (2, 3, [[0], [1], []]),
        (4, 2, [[0, 2], [1, 3]]),
    ],
)
def test_allocate_by_circle_matches_rocketmq(n_mq: int, n_cid: int, expected: list[list[int]]) -> None:
    cids = [f"c{i}" for i in range(n_cid)]
    assert [allocate_averagely_by_circle(c, list(range(n_mq)), cids) for c in cids] == expected


@pytest.mark.parametrize("strategy", [allocate_averagely, allocate_averagely_by_circle])
def test_allocation_partitions_every_queue(
    strategy: Callable[[str, list[int], list[str]], list[int]],
) -> None:
    for n_mq, n_cid in itertools.product(range(0, 20), range(1, 8)):
        cids = [f"c{i}" for i in range(n_cid)]
        shares = [strategy(c, list(range(n_mq)), cids) for c in cids]
        flat = sorted(q for share in shares for q in share)
        assert flat == list(range(n_mq)), (n_mq, n_cid, shares)
        sizes = [len(s) for s in shares]
        assert max(sizes) - min(sizes) <= 1


def test_allocation_of_an_unknown_consumer_is_empty() -> None:
    assert allocate_averagely("ghost", [1, 2, 3], CIDS3) == []
    assert allocate_averagely_by_circle("ghost", [1, 2, 3], CIDS3) == []
    with pytest.raises(ValueError):
        allocate_averagely("", [1], CIDS3)


# -- selectors -----------------------------------------------------------------------------------------
def mqs_of(*groups: tuple[str, int], topic: str = "T") -> list[MessageQueue]:
    return sorted(MessageQueue(topic, name, i) for name, n in groups for i in range(n))


def test_round_robin_cycles_per_topic() -> None:
    rr = RoundRobinSelector(random.Random(7))
    mqs = mqs_of(("A", 2), ("B", 2))
    picks = [rr(mqs, Message("T", b"x")) for _ in range(8)]
    assert sorted(set(picks)) == mqs
    assert picks[:4] == picks[4:]  # a cycle of the 4 queues
    other = [rr(mqs_of(("A", 2), topic="U"), Message("U", b"x")) for _ in range(2)]
    assert len(set(other)) == 2  # its own counter


def test_select_avoiding_skips_the_failed_group() -> None:
    rr = RoundRobinSelector(random.Random(1))
    mqs = mqs_of(("A", 4), ("B", 4))
    for _ in range(20):
        assert select_avoiding(mqs, lambda: rr.next_index("T"), "A").broker_name == "B"
    only_a = mqs_of(("A", 4))
    assert select_avoiding(only_a, lambda: rr.next_index("T"), "A").broker_name == "A"  # nothing else


def test_hash_key_selector_keeps_a_key_on_one_queue() -> None:
    sel = HashKeySelector()
    mqs = mqs_of(("A", 4), ("B", 4))
    for key in ("order-1", "order-2", "x"):
        picks = {sel(mqs, Message("T", b"x", keys=key)) for _ in range(5)}
        assert len(picks) == 1
        assert picks.pop() == mqs[zlib.crc32(key.encode()) % 8]  # the same in every process
    assert sel(mqs, Message("T", b"x"), "order-1") == sel(mqs, Message("T", b"x", keys=["order-1"]))
    assert len({sel(mqs, Message("T", b"x"), f"k{i}") for i in range(100)}) == 8
    with pytest.raises(ValueError):
        sel(mqs, Message("T", b"x"), None)


# -- latency fault tolerance ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("latency_ms", "avoid_ms"),
    [
        (0, 0),
        (49, 0),
        (50, 0),
        (100, 0),
        (549, 0),
        (550, 2000),
        (1799, 2000),
        (1800, 5000),
        (3000, 6000),
        (4999, 6000),
        (5000, 10000),
        (15000, 30000),
        (30000, 30000),
    ],
)
def test_not_available_table(latency_ms: int, avoid_ms: int) -> None:
    assert not_available_ms(latency_ms) == avoid_ms


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def test_fault_strategy_isolates_a_failed_group_for_30_s() -> None:
    clock = Clock()
    fs = FaultStrategy(True, clock_ms=clock, rng=random.Random(3))
    rr = RoundRobinSelector(random.Random(3))
    mqs = mqs_of(("A", 2), ("B", 2))
    fs.update("A", 10, isolation=True)
    assert {fs.select(mqs, lambda: rr.next_index("T"), None).broker_name for _ in range(20)} == {"B"}
    clock.now_ms += 29_999
    assert not fs.tolerance.is_available("A")
    clock.now_ms += 1
    assert {fs.select(mqs, lambda: rr.next_index("T"), None).broker_name for _ in range(20)} == {"A", "B"}


def test_fault_strategy_slow_group_and_all_unavailable() -> None:
    clock = Clock()
    fs = FaultStrategy(True, clock_ms=clock, rng=random.Random(5))
    rr = RoundRobinSelector(random.Random(5))
    mqs = mqs_of(("A", 2), ("B", 2))
    fs.update("A", 600, isolation=False)  # 2 s off
    fs.update("B", 40, isolation=False)  # fine
    assert {fs.select(mqs, lambda: rr.next_index("T"), None).broker_name for _ in range(10)} == {"B"}
    fs.update("B", 20_000, isolation=False)  # 30 s off: now both are out
    picked = fs.select(mqs, lambda: rr.next_index("T"), None)
    assert picked.broker_name in ("A", "B")  # still sends somewhere: the least bad


def test_fault_strategy_off_by_default_only_avoids_last() -> None:
    fs = FaultStrategy()
    fs.update("A", 99_999, isolation=True)
    assert fs.tolerance.items() == []
    rr = RoundRobinSelector(random.Random(1))
    mqs = mqs_of(("A", 2), ("B", 2))
    assert {fs.select(mqs, lambda: rr.next_index("T"), None).broker_name for _ in range(8)} == {"A", "B"}
    assert {fs.select(mqs, lambda: rr.next_index("T"), "A").broker_name for _ in range(8)} == {"B"}


def test_pick_one_at_least_prefers_the_better_half() -> None:
    clock = Clock()
    lft = LatencyFaultTolerance(clock_ms=clock, rng=random.Random(9))
    lft.update("slow", 9000, 10_000)
    lft.update("slower", 20_000, 30_000)
    lft.update("ok-soon", 100, 5)
    lft.update("worst", 30_000, 60_000)
    assert lft.pick_one_at_least() in ("ok-soon", "slow")
    assert LatencyFaultTolerance().pick_one_at_least() is None


# -- unique ids ----------------------------------------------------------------------------------------
def test_unique_ids_are_rocketmq_shaped_and_unique() -> None:
    now = 1_700_000_000_000  # 2023-11-14T22:13:20Z
    gen = UniqueIdGenerator(ip="10.1.2.3", pid=4242, salt=0xDEADBEEF, clock_ms=lambda: now)
    ids = [gen.next() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    for uid in ids[:3]:
        assert len(uid) == 32 and uid == uid.upper() and int(uid, 16) >= 0
    info = unique_id_info(ids[5])
    assert (info.ip, info.pid, info.salt, info.counter) == ("10.1.2.3", 4242, 0xDEADBEEF, 5)
    month_start = 1_698_796_800_000  # 2023-11-01T00:00:00Z
    assert info.month_offset_ms == now - month_start
    assert ids[0][:20] == "0A0102031092DEADBEEF"
    assert new_unique_id() != new_unique_id()


def test_unique_ids_roll_over_the_month() -> None:
    t = [1_698_796_799_999]  # the last ms of October 2023
    gen = UniqueIdGenerator(ip="127.0.0.1", pid=1, salt=1, clock_ms=lambda: t[0])
    before = unique_id_info(gen.next())
    t[0] += 1
    after = unique_id_info(gen.next())
    assert before.month_offset_ms == 31 * 86_400_000 - 1
    assert after.month_offset_ms == 0


# -- ProcessQueue --------------------------------------------------------------------------------------
def ext(offset: int, qid: int = 0, tags: str = "", body: bytes = b"body") -> MessageExt:
    return MessageExt(
        "T", qid, offset, f"B:{offset:016X}", f"U{offset}", tags, (), {}, body, 0, "", 0, offset, 10, "B"
    )


def test_committable_is_the_lowest_unconsumed_offset() -> None:
    pq = ProcessQueue(MessageQueue("T", "B", 0), 0)
    added = pq.put([ext(i) for i in range(5)], 5)
    assert [m.queue_offset for m in added] == [0, 1, 2, 3, 4]
    assert pq.committable() == 0
    assert pq.remove([2, 3]) == 0  # 0 and 1 still wait: never commit past them
    assert pq.remove([0]) == 1
    assert pq.remove([1]) == 4
    assert pq.remove([4]) == 5  # nothing pending: the high-water mark
    assert pq.count == 0 and pq.pending_bytes == 0 and pq.consumed_count == 5


def test_process_queue_duplicates_filtered_and_skips() -> None:
    pq = ProcessQueue(MessageQueue("T", "B", 0), 10)
    assert pq.committable() == 10
    pq.put([ext(10), ext(12)], 13)  # 11 was filtered out by tag
    assert pq.put([ext(12)], 13) == []  # already pending
    assert pq.remove([10]) == 12
    pq.advance(20)  # NO_MATCHED_MSG up to 20
    assert pq.committable() == 12
    assert pq.remove([12]) == 20
    pq.put([ext(21), ext(20), ext(22)], 23)
    assert [m.queue_offset for m in pq.lowest(2)] == [20, 21]


def test_backoff_schedule_is_capped() -> None:
    sched = (1.0, 5.0, 10.0)
    assert [backoff_s(i, sched) for i in range(5)] == [1.0, 5.0, 10.0, 10.0, 10.0]


# -- routes and codecs ---------------------------------------------------------------------------------
def test_publish_and_subscribe_queues() -> None:
    route = TopicRoute(
        topic="T",
        queue_datas=(QueueData("A", 2, 3, 6), QueueData("B", 4, 4, 4), QueueData("C", 1, 1, 6)),
        broker_datas=(
            BrokerData("c", "A", {0: "a0", 1: "a1"}),
            BrokerData("c", "B", {0: "b0"}),
            BrokerData("c", "C", {2: "c2"}),  # no leader
        ),
    )
    assert publish_queues(route) == [MessageQueue("T", "A", i) for i in range(3)]  # B is read-only
    assert subscribe_queues(route) == [
        *(MessageQueue("T", "A", i) for i in range(2)),
        *(MessageQueue("T", "B", i) for i in range(4)),
        MessageQueue("T", "C", 0),
    ]


def test_message_validation_and_codecs() -> None:
    m = Message("T", b"hello", tags="a", keys="k1 k2", properties={"p": "v"}, flag=3)
    assert m.keys == ("k1", "k2")
    with pytest.raises(ClientError) as e:
        check_batch([Message("T", b"")])
    assert e.value.code == "INVALID_BODY"
    with pytest.raises(ClientError) as e:
        check_batch([Message("T", b"x"), Message("U", b"y")])
    assert e.value.code == "INVALID_BATCH"
    with pytest.raises(ClientError) as e:
        check_batch([Message("bad topic", b"x")])
    assert e.value.code == "INVALID_TOPIC"
    m.unique_id = "U1"
    body = send_request(MessageQueue("T", "A", 2), [m], producer_group="pg", born_ts=5, born_host="h")
    assert body == {
        "topic": "T",
        "queue_id": 2,
        "producer_group": "pg",
        "messages": [
            {
                "body": b"hello",
                "unique_id": "U1",
                "born_ts": 5,
                "born_host": "h",
                "tags": "a",
                "keys": ["k1", "k2"],
                "properties": {"p": "v"},
                "flag": 3,
            }
        ],
    }
    res = send_result_from_answer(
        {
            "status": "SEND_OK",
            "broker_name": "A",
            "queue_id": 2,
            "store_ts": 9,
            "results": [{"msg_id": "A:01", "unique_id": "U1", "queue_offset": 7, "position": 1}],
        },
        MessageQueue("T", "A", 2),
    )
    assert (res.msg_id, res.unique_id, res.queue_offset, res.message_queue.queue_id) == ("A:01", "U1", 7, 2)
    pulled = pull_result_from_answer(
        {
            "status": "FOUND",
            "next_offset": 1,
            "min_offset": 0,
            "max_offset": 1,
            "messages": [
                {
                    "topic": "T",
                    "queue_id": 0,
                    "queue_offset": 0,
                    "msg_id": "A:01",
                    "unique_id": "U1",
                    "tags": "a",
                    "keys": ["k"],
                    "properties": {},
                    "body": b"x",
                    "born_ts": 1,
                    "born_host": "h",
                    "store_ts": 2,
                    "position": 3,
                    "size": 4,
                    "broker_name": "A",
                    "flag": 1,
                }
            ],
        }
    )
    assert pulled.status is PullStatus.FOUND and pulled.messages[0].flag == 1
    assert pulled.messages[0].message_queue == MessageQueue("T", "A", 0)


def test_one_caller_s_result_of_a_batch_answer() -> None:
    """An auto-batch answer: each caller's result is its own message's, in the queue its result
    names (a batch across queues) or the answer's; malformed answers are BAD_ANSWER, never a crash."""
    mq = MessageQueue("T", "A", 2)
    answer = {
        "status": "SEND_OK", "broker_name": "A", "queue_id": 2, "store_ts": 9,
        "results": [{"msg_id": "A:01", "unique_id": "U1", "queue_offset": 7, "position": 1, "queue_id": 2},
                    {"msg_id": "A:02", "unique_id": "U2", "queue_offset": 3, "position": 2, "queue_id": 0},
                    {"msg_id": "A:03", "unique_id": "U3", "queue_offset": 8, "position": 3}],
    }  # fmt: skip
    first = send_result_from_answer(answer, mq, 0)
    assert first.message_queue is mq and (first.unique_id, first.queue_offset, len(first.items)) == ("U1", 7, 1)
    second = send_result_from_answer(answer, MessageQueue("T", "A", 0), 1)
    assert second.message_queue == MessageQueue("T", "A", 0) and second.unique_id == "U2"
    moved = send_result_from_answer(answer, MessageQueue("T", "A", 3), 1)  # the broker says where it went
    assert moved.message_queue == MessageQueue("T", "A", 0)
    assert send_result_from_answer(answer, mq, 2).message_queue is mq  # no queue in the result: the answer's
    assert send_result_from_answer({**answer, "broker_name": "B"}, mq, 2).message_queue == MessageQueue("T", "B", 2)
    whole = send_result_from_answer(answer, mq)
    assert [i.unique_id for i in whole.items] == ["U1", "U2", "U3"] and whole.message_queue is mq
    for bad in ({**answer, "status": "NOPE"}, {**answer, "status": ["x"]}, {**answer, "results": ["x", "y", "z"]},
                {**answer, "results": []}, {**answer, "queue_id": "zz"}, {**answer, "results": None}):
        with pytest.raises(ClientError) as e:
            send_result_from_answer(bad, MessageQueue("T", "A", 1), 2)
        assert e.value.code == "BAD_ANSWER"


def test_tags_expression() -> None:
    assert parse_tags_expression("*") is None and parse_tags_expression("") is None
    assert parse_tags_expression("a || b") == frozenset({"a", "b"})
    assert tags_expression(frozenset({"b", "a"})) == "a||b"
    assert tags_expression(None) == "*"


def test_read_order_leader_first_or_a_spread_follower_first() -> None:
    addrs = ["L", "F1", "F2"]
    assert read_order(addrs, from_followers=False, spread=3) == ["L", "F1", "F2"]
    assert [read_order(addrs, from_followers=True, spread=q) for q in range(3)] == [
        ["F1", "F2", "L"],
        ["F2", "F1", "L"],
        ["F1", "F2", "L"],
    ]
    assert read_order(["L"], from_followers=True, spread=1) == ["L"]  # no follower: the leader
    assert read_order([], from_followers=True, spread=0) == []
