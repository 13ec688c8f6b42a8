"""SQL92 filters end to end on real broker groups (in-process log): the pull and push consumers get
exactly the matching messages (filtered by the broker), an invalid expression is refused at subscribe
time by the SDK and with HTTP 400 + position by the broker, and ``enablePropertyFilter=false``
refuses SQL pulls."""

from __future__ import annotations

import random
from typing import Any

import pytest

from broker.client import (
    ClientError,
    ConsumeContext,
    Message,
    MessageExt,
    MessageQueue,
    MessageSelector,
    Producer,
    PullConsumer,
    PullStatus,
    PushConsumer,
)
from broker.protocol.sql_filter import compile_filter, message_properties
from tests.acl_fixtures import CONSUMER, PRODUCER
from tests.broker.client.conftest import ClusterFactory
from tests.broker.inproc_cluster import WAIT_S
from tests.dledger.harness import wait_until

SEED = 15_092
EXPR = "a > 5 AND region IN ('eu','us')"


def _messages(n: int, rng: random.Random) -> list[Message]:
    out = []
    for i in range(n):
        props: dict[str, str] = {"i": str(i)}
        if rng.random() < 0.8:
            props["a"] = str(rng.randrange(0, 11))
        if rng.random() < 0.8:
            props["region"] = rng.choice(["eu", "us", "cn"])
        out.append(Message("T", f"m{i}".encode(), tags=rng.choice(["TagA", "TagB", ""]), properties=props))
    return out


def _expected(msgs: list[Message], expr: str) -> set[str]:
    flt = compile_filter(expr)
    return {m.properties["i"] for m in msgs if flt.matches(message_properties(m.properties, m.tags, m.keys))}


async def _send_all(cluster: Any, msgs: list[Message]) -> None:
    async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER, rng=random.Random(SEED)) as p:
        for m in msgs:
            await p.send(m)


async def test_pull_consumer_gets_exactly_the_matching_messages(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 2})
    rng = random.Random(SEED)
    msgs = _messages(60, rng)
    await _send_all(cluster, msgs)
    want = _expected(msgs, EXPR)
    assert 0 < len(want) < len(msgs), "the seed gives a filter that keeps some and drops some"
    async with PullConsumer("pc", cluster.namesrv_addr, credentials=CONSUMER) as pc:
        got: list[MessageExt] = []
        for mq in await pc.fetch_message_queues("T"):
            offset = 0
            while True:
                res = await pc.pull(mq, offset, max_count=4, tags=MessageSelector.by_sql(EXPR))
                got.extend(res.messages)
                if res.status not in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG):
                    break
                offset = res.next_offset
        assert sorted(m.properties["i"] for m in got) == sorted(want)
        by_tag = await pc.pull(MessageQueue("T", "RaftNode00", 0), 0, 32, MessageSelector.by_tag("TagA || TagB"))
        assert by_tag.messages and {m.tags for m in by_tag.messages} <= {"TagA", "TagB"}
        tags_sql = await pc.pull(MessageQueue("T", "RaftNode00", 0), 0, 32, MessageSelector.by_sql("TAGS = 'TagA'"))
        assert tags_sql.messages and {m.tags for m in tags_sql.messages} == {"TagA"}


async def test_push_consumer_with_an_sql_selector(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=2, topics={"T": 2})
    rng = random.Random(SEED + 1)
    msgs = _messages(40, rng)
    want = _expected(msgs, EXPR)
    got: list[str] = []

    def listener(batch: list[MessageExt], ctx: ConsumeContext) -> str:
        got.extend(m.properties["i"] for m in batch)
        return "CONSUME_SUCCESS"

    c = PushConsumer(
        "cg", cluster.namesrv_addr, credentials=CONSUMER, consume_from="FIRST", suspend_ms=400,
        rebalance_interval_s=0.5, heartbeat_interval_s=0.1, shutdown_timeout_s=1.0,
    )
    try:
        c.subscribe("T", MessageSelector.by_sql(EXPR))
        c.register_listener(listener)
        await c.start()
        await _send_all(cluster, msgs)
        await wait_until(lambda: len(got) >= len(want), WAIT_S, "the matching messages consumed")
        # every pull the consumer made carried the expression, so the broker filtered
        pulls = [s for _i, s in cluster.groups[0].requests("/v1/pull")]
        assert pulls and all(s.body.get("sql") == EXPR for s in pulls)
    finally:
        await c.shutdown()
    assert sorted(got) == sorted(want)


async def test_invalid_expression_refused_at_subscribe_time_and_by_the_broker(make_cluster: ClusterFactory) -> None:
    with pytest.raises(ClientError) as e:
        MessageSelector.by_sql("a > 5 AN region = 'eu'")
    assert e.value.code == "SUBSCRIPTION_PARSE_FAILED" and "at position 6" in str(e.value)
    c = PushConsumer("cg", "127.0.0.1:1", credentials=CONSUMER)
    with pytest.raises(ClientError):
        c.subscribe("T", MessageSelector.by_sql("a = NULL"))
    c.subscribe("T", "a > 5")  # a plain string stays a tag expression (RocketMQ's subscribe(topic, tags))

    cluster = await make_cluster(n_groups=1, topics={"T": 1})
    leader = cluster.groups[0].replicas[0]
    body = {"topic": "T", "queue_id": 0, "offset": 0, "sql": "a BETWEEN 3 AND 1"}
    with pytest.raises(ClientError) as e:
        await cluster.call(leader.addr, "POST", "/v1/pull", body)
    assert e.value.status == 400 and e.value.code == "SUBSCRIPTION_PARSE_FAILED"
    assert "position 10" in str(e.value)
    with pytest.raises(ClientError) as e:
        await cluster.call(leader.addr, "POST", "/v1/pull", {**body, "sql": "a > 1", "tags": "TagA"})
    assert e.value.status == 400
    with pytest.raises(ClientError) as e:
        await cluster.call(leader.addr, "POST", "/v1/pull", {**body, "sql": 5})
    assert e.value.status == 400 and e.value.code == "SUBSCRIPTION_PARSE_FAILED"


async def test_property_filter_can_be_switched_off(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(n_groups=1, topics={"T": 1}, broker_props={"enablePropertyFilter": "false"})
    leader = cluster.groups[0].replicas[0]
    with pytest.raises(ClientError) as e:
        await cluster.call(leader.addr, "POST", "/v1/pull", {"topic": "T", "queue_id": 0, "offset": 0, "sql": "a > 1"})
    assert e.value.status == 400 and e.value.code == "FILTER_NOT_SUPPORTED"
