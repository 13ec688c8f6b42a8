"""Issue 14 item 2: RECONSUME_LATER sends a message back to ``%RETRY%<group>`` (delay level
3 + reconsumeTimes), after ``maxReconsumeTimes`` to ``%DLQ%<group>`` (write only); orderly consumers
retry in place, then DLQ; an operator resends a DLQ message. On real brokers in this process."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.client import Message, MessageExt, MessageQueue, Producer, PushConsumer
from broker.store.message import StoredMessage
from broker.store.retry import send_back
from broker.tools.mqadmin import main as mqadmin_main
from tests.acl_fixtures import ADMIN, CONSUMER, PRODUCER
from tests.broker.inproc_cluster import InProcBrokerCluster
from tests.dledger.harness import wait_until

FAST_LEVELS = " ".join(["1s"] * 18)  # every retry level 1 s


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[InProcBrokerCluster]:
    baseline = InProcBrokerCluster.baseline()
    c = await InProcBrokerCluster.start(str(tmp_path / "cluster"), broker_props={"messageDelayLevel": FAST_LEVELS})
    try:
        await c.create_topic("T", 2)
        yield c
    finally:
        await c.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)


def test_send_back_copies() -> None:
    m = StoredMessage("T", 1, 0, "tg", ("k",), {"a": "b", "__DUE_MS": "5"}, 1, "h", 2, "U" * 32, b"x")
    first = send_back(m, "B:01", group="g", max_reconsume_times=2, to_dlq=False, store_ts=9, levels=18)
    assert (first.topic, first.dlq, first.reconsume_times) == ("%RETRY%g", False, 1)
    p = first.message.properties
    assert p["DELAY"] == "3" and p["RETRY_TOPIC"] == "T" and p["ORIGIN_MESSAGE_ID"] == "B:01" and "__DUE_MS" not in p
    second = send_back(first.message, "B:02", group="g", max_reconsume_times=2, to_dlq=False, store_ts=9, levels=18)
    assert second.message.properties["DELAY"] == "4" and second.message.properties["ORIGIN_MESSAGE_ID"] == "B:01"
    third = send_back(second.message, "B:03", group="g", max_reconsume_times=2, to_dlq=False, store_ts=9, levels=18)
    assert (third.topic, third.dlq, third.reconsume_times) == ("%DLQ%g", True, 2)
    assert "DELAY" not in third.message.properties and third.message.properties["RETRY_TOPIC"] == "T"
    assert send_back(m, "B:01", group="g", max_reconsume_times=5, to_dlq=True, store_ts=9, levels=18).dlq
    assert send_back(second.message, "x", group="g", max_reconsume_times=99, to_dlq=False, store_ts=9,
                     levels=3).message.properties["DELAY"] == "3"  # clamped to the last level


async def test_failed_messages_are_retried_through_the_broker_then_dead_lettered(
    cluster: InProcBrokerCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    attempts: dict[str, list[tuple[str, int]]] = defaultdict(list)  # body -> (topic, reconsume_times)
    done: set[str] = set()

    def listener(msgs: list[MessageExt], _ctx: Any) -> str:
        for m in msgs:
            body = m.body.decode()
            attempts[body].append((m.topic, m.reconsume_times))
            if body == "bad" or (body == "flaky" and m.reconsume_times == 0):
                return "RECONSUME_LATER"
            if body == "boom" and m.reconsume_times == 0:
                raise RuntimeError("listener bug")
            done.add(body)
        return "CONSUME_SUCCESS"

    consumer = PushConsumer("cg", cluster.namesrv_addr, credentials=CONSUMER, consume_from="LAST",
                            suspend_ms=300, commit_interval_s=0.2, rebalance_interval_s=1,
                            heartbeat_interval_s=0.5, max_reconsume_times=2)
    consumer.subscribe("T")
    consumer.register_listener(listener)
    g = cluster.groups[0]
    try:
        await consumer.start()
        async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER) as p:
            sent = {}
            for body in ("ok", "flaky", "boom", "bad"):
                sent[body] = await p.send(Message("T", body.encode()), queue=MessageQueue("T", g.name, 0))
        await wait_until(lambda: {"ok", "flaky", "boom"} <= done, 30, "the good and the flaky messages")
        await wait_until(lambda: len(attempts["bad"]) == 3, 30, "three attempts of the bad one")
        # the original queue's offset moved past everything, the failures included
        await wait_until(lambda: g.offsets("cg", "T").get(0) == 4, 20, "T's offset past every message")
        assert attempts["flaky"] == [("T", 0), ("T", 1)] and attempts["boom"] == [("T", 0), ("T", 1)]
        assert attempts["bad"] == [("T", 0), ("T", 1), ("T", 2)]
        await wait_until(lambda: g.max_offset("%DLQ%cg", 0) == 1, 20, "the bad message in the DLQ")
        assert cluster.groups[0].topic_config("%RETRY%cg") is not None
        dlq = g.topic_config("%DLQ%cg")
        assert dlq is not None and dlq["perm"] == 2, dlq  # write only
        leader = g.leader()
        assert leader is not None
        with pytest.raises(Exception, match="NO_PERMISSION"):  # nobody consumes it by default
            await g.messages("%DLQ%cg", 0)
        dead = await cluster.call(leader.addr, "GET", "/v1/msg/offset",
                                  params={"topic": "%DLQ%cg", "queue_id": 0, "offset": 0})
        props = dead["properties"]
        assert dead["body"] == b"bad" and dead["unique_id"] == sent["bad"].unique_id
        assert props["RETRY_TOPIC"] == "T" and props["RECONSUME_TIME"] == "2"
        assert props["ORIGIN_MESSAGE_ID"] == sent["bad"].msg_id and props["DLQ_ORIGIN_GROUP"] == "cg"
        # the operator lists the DLQ and resends the message: it comes again with a fresh count
        monkeypatch.setenv("DLEDGER_ACCESS_KEY", ADMIN.access_key)
        monkeypatch.setenv("DLEDGER_SECRET_KEY", ADMIN.secret_key)
        n = ["-n", cluster.namesrv_addr]
        capsys.readouterr()
        assert await asyncio.to_thread(mqadmin_main, ["queryDlqMessageByConsumerGroup", "-g", "cg", "--json", *n]) == 0
        listed = json.loads(capsys.readouterr().out)["messages"]
        assert [m["msg_id"] for m in listed] == [dead["msg_id"]]
        assert await asyncio.to_thread(mqadmin_main, ["queryMsgById", "-i", dead["msg_id"], *n]) == 0
        assert "Reconsume Times" in capsys.readouterr().out
        assert await asyncio.to_thread(mqadmin_main, ["resendDlqMessage", "-g", "cg", "-i", dead["msg_id"], *n]) == 0
        assert "%RETRY%cg" in capsys.readouterr().out
        await wait_until(lambda: len(attempts["bad"]) == 4, 30, "the resent message")
        assert attempts["bad"][3] == ("T", 0)
    finally:
        await consumer.shutdown()


async def test_orderly_consumers_retry_in_place_then_dead_letter(cluster: InProcBrokerCluster) -> None:
    seen: list[tuple[str, int]] = []

    def listener(msgs: list[MessageExt], _ctx: Any) -> str:
        seen.extend((m.body.decode(), m.reconsume_times) for m in msgs)
        return "RECONSUME_LATER" if msgs[0].body == b"bad" else "CONSUME_SUCCESS"

    consumer = PushConsumer("og", cluster.namesrv_addr, credentials=CONSUMER, consume_from="FIRST", orderly=True,
                            orderly_retry_s=0.05, suspend_ms=300, commit_interval_s=0.2, max_reconsume_times=3,
                            consume_batch_max=1)
    consumer.subscribe("T")
    consumer.register_listener(listener)
    g = cluster.groups[0]
    try:
        async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER) as p:
            for body in ("a", "bad", "b"):
                await p.send(Message("T", body.encode()), queue=MessageQueue("T", g.name, 1))
        await consumer.start()
        await wait_until(lambda: ("b", 0) in seen, 30, "the message after the bad one")
        assert seen == [("a", 0), ("bad", 0), ("bad", 1), ("bad", 2), ("bad", 3), ("b", 0)]
        await wait_until(lambda: g.max_offset("%DLQ%og", 0) == 1, 20, "the bad message in the DLQ")
    finally:
        await consumer.shutdown()
