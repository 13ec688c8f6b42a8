"""The producer against real broker groups on the in-process log: queue choice, batches, retries
that avoid the failed group and keep the unique id, NOT_LEADER followed, route refreshes, latency
fault tolerance, selectors, async and one-way sends. Errors no real broker gives on demand
(APPEND_FAILED, a NOT_LEADER naming itself, an answer that never comes) are injected by the
replica's ``Tap``; leadership changes and dead leaders are real."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from broker.client import ClientError, HashKeySelector, Message, MessageQueue, Producer, SendResult
from tests.acl_fixtures import PRODUCER
from tests.broker.client.conftest import ClusterFactory
from tests.broker.inproc_cluster import WAIT_S, InProcBrokerCluster, Replica
from tests.dledger.harness import wait_until

SEED = 20240601
MakeProducer = Callable[..., Producer]


@pytest.fixture
async def producers() -> AsyncIterator[MakeProducer]:
    made: list[Producer] = []

    def make(cluster: InProcBrokerCluster, **kwargs: Any) -> Producer:
        kwargs.setdefault("rng", random.Random(SEED))
        p = Producer("pg", cluster.namesrv_addr, credentials=PRODUCER, **kwargs)
        made.append(p)
        return p

    yield make
    for p in made:
        await p.shutdown()


def sent(r: Replica) -> list[dict[str, Any]]:
    """The bodies of the sends ``r`` received (answered or not)."""
    return [s.body for s in r.tap.seen("/v1/send")]


async def test_send_spreads_round_robin_over_leaders(
    make_cluster: ClusterFactory, producers: MakeProducer
) -> None:
    cluster = await make_cluster(n_groups=2, topics={"T": 4})
    p = producers(cluster)
    await p.start()
    results = [await p.send(Message("T", f"m{i}".encode(), tags="a", keys=["k1"])) for i in range(16)]
    assert Counter(r.message_queue for r in results) == {
        MessageQueue("T", g, q): 2 for g in ("RaftNode00", "RaftNode01") for q in range(4)
    }
    for r in results:
        assert (
            r.status == "SEND_OK"
            and len(r.unique_id) == 32
            and r.msg_id.startswith(r.message_queue.broker_name)
        )
    for g in cluster.groups:
        assert all(not sent(r) for r in g.replicas[1:])  # only leaders (broker_addrs[0]) get sends
    first = results[0]
    stored = await cluster.group(first.message_queue.broker_name).messages("T", first.message_queue.queue_id)
    assert stored[first.queue_offset]["unique_id"] == first.unique_id
    assert stored[first.queue_offset]["keys"] == ["k1"]
    assert stored[first.queue_offset]["msg_id"] == first.msg_id


async def test_round_robin_picks_what_the_fault_strategys_select_picks(
    make_cluster: ClusterFactory, producers: MakeProducer
) -> None:
    """The send path picks a queue itself when no group is to be avoided and the latency fault
    strategy is off (issue 26): the same queues, in the same order, as FaultStrategy.select."""
    import functools

    from broker.client.latency import FaultStrategy
    from broker.client.route_cache import publish_queues
    from broker.client.selector import RoundRobinSelector

    cluster = await make_cluster(n_groups=2, topics={"T": 4})
    p = producers(cluster)
    await p.start()
    got = [(await p.send(Message("T", b"m"))).message_queue for _ in range(12)]
    mqs = publish_queues(await p.routes.get("T"))
    rr = RoundRobinSelector(random.Random(SEED))
    fault = FaultStrategy(False)
    assert got == [fault.select(mqs, functools.partial(rr.next_index, "T"), None) for _ in range(12)]


async def test_send_batch_is_one_request_to_one_queue(
    make_cluster: ClusterFactory, producers: MakeProducer
) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 4})
    p = producers(cluster)
    await p.start()
    msgs = [Message("T", f"b{i}".encode()) for i in range(5)]
    result = await p.send_batch(msgs)
    assert len(cluster.all_requests("/v1/send")) == 1
    assert [it.unique_id for it in result.items] == [m.unique_id for m in msgs]
    assert [it.queue_offset for it in result.items] == list(range(5))
    assert result.unique_id == msgs[0].unique_id
    with pytest.raises(ClientError) as e:
        await p.send_batch([Message("T", b"x"), Message("U", b"y")])
    assert e.value.code == "INVALID_BATCH"


async def test_retries_avoid_the_failed_group_and_keep_the_unique_id(
    make_cluster: ClusterFactory, producers: MakeProducer
) -> None:
    cluster = await make_cluster(n_groups=2, topics={"T": 4})
    bad = cluster.group("RaftNode00").replicas[0]
    bad.tap.fail("/v1/send", "APPEND_FAILED", 409, times=1000)
    p = producers(cluster, enable_idempotence=False)  # RocketMQ's retry elsewhere (no window)
    await p.start()
    results = [await p.send(Message("T", f"m{i}".encode())) for i in range(12)]
    assert {r.message_queue.broker_name for r in results} == {"RaftNode01"}
    failed_ids = [m["unique_id"] for body in sent(bad) for m in body["messages"]]
    assert failed_ids, "round robin picked the failing group at least once"
    assert len(failed_ids) == len(set(failed_ids))  # never twice in a row for one send
    assert set(failed_ids) <= {r.unique_id for r in results}  # the retry carried the same id


async def test_retries_are_bounded_and_alternate(
    make_cluster: ClusterFactory, producers: MakeProducer
) -> None:
    cluster = await make_cluster(n_groups=2, topics={"T": 4})
    for g in cluster.groups:
        g.replicas[0].tap.fail("/v1/send", "APPEND_FAILED", 409, times=1000)
    p = producers(cluster, enable_idempotence=False)  # RocketMQ's retry elsewhere (no window)
    await p.start()
    msg = Message("T", b"doomed")
    with pytest.raises(ClientError) as e:
        await p.send(msg)
    assert e.value.code == "APPEND_FAILED"
    attempts = [
        (g.name, m["unique_id"])
        for g in cluster.groups
        for body in sent(g.replicas[0])
        for m in body["messages"]
    ]
    assert len(attempts) == 3  # 1 + 2 retries
    assert {uid for _, uid in attempts} == {msg.unique_id}
    assert Counter(name for name, _ in attempts) in (
        Counter({"RaftNode00": 2, "RaftNode01": 1}),
        Counter({"RaftNode00": 1, "RaftNode01": 2}),
    )
    with pytest.raises(ClientError) as e:
        await p.send(Message("T", b""))  # bad input: no attempt at all
    assert e.value.code == "INVALID_BODY"
    assert sum(len(sent(g.replicas[0])) for g in cluster.groups) == 3


async def test_not_leader_is_followed_at_once(make_cluster: ClusterFactory, producers: MakeProducer) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 4})
    g = cluster.groups[0]
    n0, n1 = g.replicas[0], g.replicas[1]
    p = producers(cluster, retry_times=0)  # following is not a retry
    await p.start()
    await p.send(Message("T", b"warm"))  # the producer now holds a route naming n0 as the leader
    calls = cluster.route_calls("T")
    await g.transfer("n1")  # a new leader: the producer's cached route is stale
    result = await p.send(Message("T", b"x"))
    assert result.status == "SEND_OK" and result.message_queue.broker_name == g.name
    assert len(sent(n0)) == 2 and len(sent(n1)) == 1  # n0 answered NOT_LEADER naming n1
    await wait_until(lambda: cluster.route_calls("T") > calls, WAIT_S, "a background route refresh")
    await p.send(Message("T", b"y"))  # straight to the new leader now
    assert len(sent(n0)) == 2 and len(sent(n1)) == 2
    stored = [m["body"] for q in range(4) for m in await g.messages("T", q)]
    assert sorted(stored) == [b"warm", b"x", b"y"]


async def test_not_leader_from_an_injected_fault(
    make_cluster: ClusterFactory, producers: MakeProducer
) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 4})
    g = cluster.groups[0]
    n0 = g.replicas[0]
    n0.tap.fail("/v1/send", "NOT_LEADER", 409, leader_addr=n0.addr)  # names itself: no loop
    p = producers(cluster, retry_times=1)
    await p.start()
    assert (await p.send(Message("T", b"x"))).status == "SEND_OK"
    assert len(sent(n0)) == 2  # the NOT_LEADER was a failed attempt, then a retry


async def test_route_is_refreshed_after_a_refused_connection(
    make_cluster: ClusterFactory, producers: MakeProducer
) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 4})
    g = cluster.groups[0]
    p = producers(cluster)
    await p.start()
    await p.send(Message("T", b"before"))
    calls_before = cluster.route_calls("T")
    await g.kill("n0")  # the leader dies; another replica takes over and the NameServer knows
    new_leader = await g.wait_leader()
    result = await p.send(Message("T", b"after"))
    assert result.status == "SEND_OK"
    assert cluster.route_calls("T") > calls_before
    assert len(sent(new_leader)) == 1


async def test_not_ready_and_timeout_refresh_the_route(
    make_cluster: ClusterFactory, producers: MakeProducer
) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 4})
    leader = cluster.groups[0].replicas[0]
    p = producers(cluster)
    await p.start()
    await p.send(Message("T", b"warm"))
    calls = cluster.route_calls("T")
    leader.tap.fail("/v1/send", "NOT_READY", 503)
    assert (await p.send(Message("T", b"x"))).status == "SEND_OK"
    assert cluster.route_calls("T") == calls + 1
    leader.tap.hang("/v1/send")
    with pytest.raises(ClientError) as e:
        await p.send(Message("T", b"slow"), timeout_s=0.3)
    assert e.value.code == "TIMEOUT" and e.value.outcome_unknown
    await wait_until(lambda: cluster.route_calls("T") >= calls + 2, WAIT_S, "a refresh after TIMEOUT")


async def test_latency_fault_tolerance_isolates_a_failed_group(
    make_cluster: ClusterFactory, producers: MakeProducer
) -> None:
    cluster = await make_cluster(n_groups=2, topics={"T": 4})
    bad = cluster.group("RaftNode00").replicas[0]
    bad.tap.fail("/v1/send", "APPEND_FAILED", 409, times=1)
    p = producers(cluster, send_latency_fault_enable=True, enable_idempotence=False)
    await p.start()
    for i in range(8):  # round robin reaches the bad group within one cycle of the 8 queues
        await p.send(Message("T", f"warm{i}".encode()))
        if sent(bad):
            break
    assert len(sent(bad)) == 1
    results = [await p.send(Message("T", f"m{i}".encode())) for i in range(10)]
    assert len(sent(bad)) == 1  # isolated for 30 s after the error: not even tried
    assert {r.message_queue.broker_name for r in results} == {"RaftNode01"}
    p.send_latency_fault_enable = False
    assert not p.send_latency_fault_enable


async def test_selectors_and_explicit_queue(make_cluster: ClusterFactory, producers: MakeProducer) -> None:
    cluster = await make_cluster(n_groups=2, topics={"T": 4})
    p = producers(cluster)
    await p.start()
    by_key = [
        await p.send(Message("T", f"{i}".encode()), selector=HashKeySelector(), arg="order-7")
        for i in range(5)
    ]
    assert len({r.message_queue for r in by_key}) == 1
    assert [r.queue_offset for r in by_key] == list(range(5))  # one queue, in order
    target = MessageQueue("T", "RaftNode01", 3)
    assert (await p.send(Message("T", b"q"), queue=target)).message_queue == target
    last = await p.send(Message("T", b"c"), selector=lambda mqs, msg, arg: mqs[arg], arg=0)
    assert last.message_queue == MessageQueue("T", "RaftNode00", 0)
    assert await p.fetch_publish_queues("T") == sorted(
        MessageQueue("T", g, q) for g in ("RaftNode00", "RaftNode01") for q in range(4)
    )
    # the writable queues are computed once per route and shared: a selector gets its own copy
    def greedy(mqs: list[MessageQueue], _msg: Message, _arg: object) -> MessageQueue:
        first = mqs[0]
        mqs.clear()
        return first

    assert (await p.send(Message("T", b"g"), selector=greedy)).message_queue == MessageQueue("T", "RaftNode00", 0)
    assert len(p._publishable["T"][1]) == 8  # the shared list is intact
    spread = {(await p.send(Message("T", f"s{i}".encode()))).message_queue for i in range(16)}
    assert len(spread) == 8  # round robin over every queue still


async def test_send_async_and_oneway(make_cluster: ClusterFactory, producers: MakeProducer) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 4})
    p = producers(cluster, async_in_flight_max=3, send_timeout_s=0.5)
    await p.start()
    seen: list[tuple[SendResult | None, BaseException | None]] = []
    task = p.send_async(Message("T", b"a"), lambda r, e: seen.append((r, e)))
    result = await task
    assert seen == [(result, None)]

    async def acb(r: SendResult | None, e: BaseException | None) -> None:
        seen.append((r, e))

    with pytest.raises(ClientError):  # bad input fails at once, not in the task
        p.send_async(Message("T", b""), acb)
    p.send_oneway(Message("T", b"fire"))
    g = cluster.groups[0]
    await wait_until(
        lambda: sum(g.max_offset("T", q) for q in range(4)) == 2, WAIT_S, "the one-way message stored"
    )
    # Stored is not finished: the one-way send holds its in-flight slot until its answer is read, and
    # a busy host can read it after the three sends below started (the third then met BUSY).
    await wait_until(lambda: not p._tasks, WAIT_S, "the one-way send finished")

    leader = g.replicas[0]
    leader.tap.hang("/v1/send", times=3)
    tasks = [p.send_async(Message("T", f"h{i}".encode()), acb) for i in range(3)]
    with pytest.raises(ClientError) as e:
        p.send_async(Message("T", b"one too many"))
    assert e.value.code == "BUSY"
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(d, ClientError) and d.code == "TIMEOUT" for d in done)
    assert [type(err) for _, err in seen[1:]] == [ClientError] * 3


async def test_new_topic_goes_where_the_broker_creates_it(
    make_cluster: ClusterFactory, producers: MakeProducer
) -> None:
    cluster = await make_cluster(n_groups=2, topics={"T": 4})
    p = producers(cluster)
    await p.start()
    result = await p.send(Message("Fresh", b"x"))
    assert result.status == "SEND_OK"
    assert "Fresh" in cluster.group(result.message_queue.broker_name).topics()
    with pytest.raises(ClientError) as e:
        await Producer("pg", cluster.namesrv_addr, credentials=PRODUCER).send(Message("T", b"x"))
    assert e.value.code == "NOT_STARTED"


async def test_a_failed_send_says_when_an_earlier_attempt_may_have_stored_it(
    make_cluster: ClusterFactory, producers: MakeProducer
) -> None:
    """The final error of a send is CONNECT/APPEND-style (definite), but an earlier attempt
    answered SEND_TIMEOUT: the messages may be stored, and the error must say so."""
    cluster = await make_cluster(n_groups=2, topics={"T": 4})
    g0, g1 = cluster.groups
    g0.replicas[0].tap.fail("/v1/send", "SEND_TIMEOUT", 504, times=1000)
    g1.replicas[0].tap.fail("/v1/send", "APPEND_FAILED", 409, times=1000)
    p = producers(cluster, retry_times=1)
    await p.start()
    outcomes = []
    for _ in range(4):
        with pytest.raises(ClientError) as e:
            await p.send(Message("T", b"x"))
        outcomes.append((e.value.code, e.value.outcome_unknown))
    # whichever group was tried first, one of the two attempts timed out: unknown outcome
    assert all(unknown for _code, unknown in outcomes), outcomes
    assert {code for code, _ in outcomes} <= {"SEND_TIMEOUT", "APPEND_FAILED"}


async def test_append_failed_and_server_errors_are_not_definite_failures(
    make_cluster: ClusterFactory, producers: MakeProducer
) -> None:
    """APPEND_FAILED says the entry was replaced on the replica that answered; another replica that
    holds it may still be elected and commit it (Raft, Figure 8). A 5xx may come after the append.
    Neither may be reported as "definitely not stored"; refusals before the append (4xx, NOT_READY)
    are."""
    cluster = await make_cluster(n_groups=1, topics={"T": 4})
    leader = cluster.groups[0].replicas[0]
    p = producers(cluster, retry_times=0)
    await p.start()
    for code, status, unknown in (
        ("APPEND_FAILED", 409, True),
        ("INTERNAL", 500, True),
        ("SERVICE_UNAVAILABLE", 503, True),
        ("NOT_READY", 503, False),
        ("NO_PERMISSION", 403, False),
    ):
        leader.tap.fail("/v1/send", code, status)
        with pytest.raises(ClientError) as e:
            await p.send(Message("T", b"x"))
        assert (e.value.code, e.value.outcome_unknown) == (code, unknown)


def test_a_send_is_unknown_once_any_attempt_was() -> None:
    from broker.client.producer import send_outcome_unknown

    timeout, refused = ClientError("SEND_TIMEOUT", "t"), ClientError("NOT_LEADER", "n")
    assert send_outcome_unknown(False, timeout) and send_outcome_unknown(True, refused)
    assert not send_outcome_unknown(False, refused)
