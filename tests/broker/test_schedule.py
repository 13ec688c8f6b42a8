"""Issue 14 item 1: delay levels and timed delivery (broker/store/schedule.py), on real brokers in this
process (tests/broker/inproc_cluster.py) and on the pieces alone."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.client import Message, MessageExt, MessageQueue, Producer, PushConsumer
from broker.client.admin_records import message_from_dict
from broker.client.transport import ClientError
from broker.protocol.errors import ProtocolError
from broker.server.config import load_broker_config
from broker.store.message import StoredMessage, decode_message, encode_message
from broker.store.schedule import (
    PROP_DUE_MS,
    PROP_SCHED_POS,
    SCHEDULE_TOPIC,
    TIMER_QUEUE_ID,
    ScheduleIndex,
    SchedulePolicy,
    delivered_copy,
    parse_delay_levels,
)
from broker.tools.mqadmin_format import message_details
from dledger.config import ConfigError
from tests.acl_fixtures import CONSUMER, PRODUCER
from tests.broker.inproc_cluster import InProcBrokerCluster
from tests.dledger.harness import wait_until

LEVELS = "1s 2s 3s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[InProcBrokerCluster]:
    baseline = InProcBrokerCluster.baseline()
    c = await InProcBrokerCluster.start(str(tmp_path / "cluster"), broker_props={"messageDelayLevel": LEVELS})
    try:
        await c.create_topic("T", 2)
        yield c
    finally:
        await c.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)


# -- the pieces -------------------------------------------------------------------------------------
def _msg(props: dict[str, str], store_ts: int = 1_000_000) -> StoredMessage:
    return StoredMessage("T", 1, 0, "", (), props, store_ts, "h", store_ts, "U" * 32, b"x")


def test_levels_and_deliver_times() -> None:
    p = SchedulePolicy()
    assert len(p.levels_ms) == 18 and p.levels_ms[0] == 1000 and p.levels_ms[-1] == 7_200_000
    assert p.due_of({"DELAY": "3"}, 1000, "m") == (11_000, 3)
    assert p.due_of({"DELAY": "99"}, 1000, "m") == (1000 + 7_200_000, 18)  # clamped like RocketMQ
    assert p.due_of({"DELAY": "0"}, 1000, "m") is None
    assert p.due_of({"TIMER_DELIVER_MS": "5000"}, 1000, "m") == (5000, 0)
    assert p.due_of({"__STARTDELIVERTIME": "5000"}, 1000, "m") == (5000, 0)
    assert p.due_of({"TIMER_DELAY_SEC": "2"}, 1000, "m") == (3000, 0)
    assert p.due_of({"TIMER_DELAY_MS": "20"}, 1000, "m") == (1020, 0)
    assert p.due_of({"TIMER_DELIVER_MS": "500"}, 1000, "m") is None  # in the past: at once
    for bad in ({"DELAY": "x"}, {"TIMER_DELAY_SEC": "1e3"}, {PROP_SCHED_POS: "5"}, {PROP_DUE_MS: "5"}):
        with pytest.raises(ProtocolError):
            p.due_of(bad, 1000, "m")
    with pytest.raises(ProtocolError) as e:
        p.due_of({"TIMER_DELAY_SEC": str(3 * 86400 + 1)}, 1000, "m")
    assert e.value.code == "TIMER_DELAY_TOO_LONG"
    assert parse_delay_levels("1s 1m 2h 1d") == (1000, 60_000, 7_200_000, 86_400_000)
    for bad in ("", "1x", "s", "0s"):
        with pytest.raises(ValueError):
            parse_delay_levels(bad)


def test_config_keys() -> None:
    conf = os.path.join(os.path.dirname(__file__), "..", "..", "conf", "broker-n0.conf")
    cfg = load_broker_config(conf, {"messageDelayLevel": "2s 1h", "timerMaxDelaySec": "60"})
    assert cfg.message_delay_levels_ms == (2000, 3_600_000) and cfg.timer_max_delay_sec == 60
    assert load_broker_config(conf).message_delay_levels_ms == SchedulePolicy().levels_ms
    with pytest.raises(ConfigError, match="messageDelayLevel"):
        load_broker_config(conf, {"messageDelayLevel": "1s 5x"})


def test_prepare_and_the_delivered_copy() -> None:
    p = SchedulePolicy()
    m = _msg({"DELAY": "2", "a": "b"})
    s = p.prepare(m, "m")
    assert (s.topic, s.queue_id) == (SCHEDULE_TOPIC, 1)
    assert s.properties["REAL_TOPIC"] == "T" and s.properties["REAL_QID"] == "1"
    assert int(s.properties[PROP_DUE_MS]) == m.store_ts + 5000
    t = p.prepare(_msg({"TIMER_DELAY_SEC": "60"}), "m")
    assert t.queue_id == TIMER_QUEUE_ID
    c = delivered_copy(s, 4242, 2_000_000, 4)
    assert (c.topic, c.queue_id, c.store_ts, c.unique_id) == ("T", 1, 2_000_000, m.unique_id)
    assert c.properties == {"a": "b", PROP_DUE_MS: s.properties[PROP_DUE_MS], PROP_SCHED_POS: "4242"}
    assert p.prepare(_msg({"a": "b"}), "m").topic == "T"
    with pytest.raises(ProtocolError) as e:  # the schedule topic is the broker's own
        p.prepare(_msg({})._replace(topic=SCHEDULE_TOPIC), "m")
    assert e.value.status == 403


def test_the_index_keeps_100k_pending_on_disk_and_answers_the_earliest(tmp_path: Path) -> None:
    idx = ScheduleIndex(str(tmp_path / "s" / "pending.db"))
    n = 100_000
    for i in range(n):
        idx.add(i * 100, 90, {PROP_DUE_MS: str(10_000_000 - i), "__DELAY_LEVEL": str(i % 3)})
    idx.commit(7)
    assert idx.backlog() == {0: 33_334, 1: 33_333, 2: 33_333}
    assert [p for p, _s, _d in idx.due(10_000_000 - n + 3, 10)] == [(n - 1 - k) * 100 for k in range(3)]
    assert idx.take(0) and not idx.take(0)
    idx.close()
    assert os.path.getsize(tmp_path / "s" / "pending.db") > 1 << 20  # on disk, not in the process
    again = ScheduleIndex(str(tmp_path / "s" / "pending.db"))
    assert again.applied_index() == 7
    assert sum(again.backlog().values()) == n  # the take after the commit was never committed
    again.close()


# -- on real brokers --------------------------------------------------------------------------------
async def _consume(cluster: InProcBrokerCluster, seen: list[MessageExt]) -> PushConsumer:
    consumer = PushConsumer("cg", cluster.namesrv_addr, credentials=CONSUMER, consume_from="FIRST",
                            suspend_ms=300, commit_interval_s=0.3)
    consumer.subscribe("T")
    consumer.register_listener(lambda msgs, _ctx: seen.extend(msgs) or "CONSUME_SUCCESS")
    await consumer.start()
    return consumer


def _real_queue_uids(cluster: InProcBrokerCluster, nid: str) -> Counter[str]:
    """unique id → how many times it is in topic T's consume queues on replica ``nid``."""
    b = cluster.groups[0].replica(nid).broker
    out: Counter[str] = Counter()
    for qid in range(2):
        cq = b.store.cqs.get("T", qid)
        if cq is None:
            continue
        for u in cq.read(cq.min_offset, cq.max_offset - cq.min_offset):
            out[b.store.read_message(u.position, u.size).unique_id] += 1
    return out


async def test_delayed_and_timed_messages_show_up_when_due_and_once(cluster: InProcBrokerCluster) -> None:
    seen: list[MessageExt] = []
    consumer = await _consume(cluster, seen)
    try:
        async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER) as p:
            leader = cluster.groups[0].leader()
            assert leader is not None
            now = leader.broker.wall_ms()
            r1 = await p.send(Message("T", b"level2", delay_time_level=2))
            r2 = await p.send(Message("T", b"timer", deliver_time_ms=now + 1500))
            r3 = await p.send(Message("T", b"plain"))
            pending = await cluster.call(leader.addr, "GET", f"/v1/msg/id/{r1.msg_id}")
            assert pending["topic"] == "SCHEDULE_TOPIC_XXXX" and pending["properties"]["REAL_TOPIC"] == "T"
            assert message_details(message_from_dict(pending)).count("Due Timestamp") == 1  # mqadmin queryMsgById
            status = await cluster.call(leader.addr, "GET", "/v1/status")
            backlog = status["schedule"]["backlog"]
            assert backlog.get("level2") == 1 and backlog.get("timer") == 1, backlog
            with pytest.raises(ClientError) as e:
                await p.send(Message("T", b"x", properties={"DELAY": "soon"}))
            assert e.value.code == "BAD_REQUEST"
            with pytest.raises(ClientError) as e:
                await p.send(Message("T", b"x", properties={"TIMER_DELAY_SEC": str(4 * 86400)}))
            assert e.value.code == "TIMER_DELAY_TOO_LONG"
        await wait_until(lambda: any(m.body == b"plain" for m in seen), 20, "the plain message")
        assert not any(m.body in (b"level2", b"timer") for m in seen), "delayed messages are not there yet"
        await wait_until(lambda: {b"level2", b"timer"} <= {m.body for m in seen}, 20, "the delayed messages")
        by_body = {m.body: m for m in seen}
        for body, sent in ((b"level2", r1), (b"timer", r2)):
            m = by_body[body]
            due = int(m.properties[PROP_DUE_MS])
            assert m.store_ts >= due, f"{body!r} visible before it was due"
            assert m.unique_id == sent.unique_id and m.topic == "T"
            assert "DELAY" not in m.properties and "TIMER_DELIVER_MS" not in m.properties
        assert int(by_body[b"timer"].properties[PROP_DUE_MS]) == now + 1500
        assert r3.unique_id in {m.unique_id for m in seen}
        await cluster.groups[0].wait_replicated()
        for r in cluster.groups[0].replicas:
            uids = _real_queue_uids(cluster, r.nid)
            assert uids[r1.unique_id] == 1 and uids[r2.unique_id] == 1, r.nid
        status = await cluster.call(leader.addr, "GET", "/v1/status")
        assert status["schedule"]["pending"] == 0
    finally:
        await consumer.shutdown()


async def test_a_second_copy_of_a_delivered_message_is_skipped_on_every_replica(
    cluster: InProcBrokerCluster,
) -> None:
    """A leader that retries an append whose outcome it did not know (or a new leader that had not
    applied its predecessor's copy) appends a second copy: applying decides, the same everywhere."""
    g = cluster.groups[0]
    leader = g.leader()
    assert leader is not None
    async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER) as p:
        sent = await p.send(Message("T", b"d", delay_time_level=1), queue=MessageQueue("T", g.name, 0))
    await wait_until(lambda: _real_queue_uids(cluster, "n0")[sent.unique_id] == 1, 20, "delivery")
    b = leader.broker
    cq = b.store.cqs.get(SCHEDULE_TOPIC, 0)
    assert cq is not None
    unit = cq.get(cq.max_offset - 1)
    assert unit is not None
    original = b.store.read_message(unit.position, unit.size)
    copy = delivered_copy(original, unit.position, b.wall_ms(), 2)
    await b.node.append([encode_message(copy), encode_message(copy)], timeout_s=5)
    await g.wait_replicated()
    for r in g.replicas:
        assert _real_queue_uids(cluster, r.nid)[sent.unique_id] == 1, r.nid
        assert r.broker.store.counters["schedule_duplicates"] >= 2
    # a queue rebuilt from the log (damaged, or a follower loading a state entry) keeps the first copy only
    f = g.replica("n2").broker
    want = {("T", q): (f.store.cqs.get("T", q) or cq).max_offset for q in range(2) if f.store.cqs.get("T", q)}
    await f.node.run_on_replica_thread(lambda: f.store._rebuild_queues(want), 5.0)
    assert _real_queue_uids(cluster, "n2")[sent.unique_id] == 1
    assert {k: f.store.cqs.get(*k).max_offset for k in want} == want  # type: ignore[union-attr]


async def test_pending_messages_survive_a_leader_crash_and_are_delivered_once(
    cluster: InProcBrokerCluster,
) -> None:
    g = cluster.groups[0]
    uids = []
    async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER) as p:
        for i in range(20):
            r = await p.send(Message("T", f"d{i}".encode(), delay_time_level=3))  # 3 s
            uids.append(r.unique_id)
    await g.wait_replicated()
    old = g.leader()
    assert old is not None
    await g.kill(old.nid)  # before anything is due
    await g.wait_leader()
    survivors = [r.nid for r in g.replicas if r.alive]
    await wait_until(lambda: all(_real_queue_uids(cluster, n)[u] >= 1 for n in survivors for u in uids), 30,
                     "every delayed message delivered by the new leader")
    await g.start(old.nid)  # the old leader comes back and applies the same log
    await g.wait_replicated()
    for r in g.replicas:
        counts = _real_queue_uids(cluster, r.nid)
        assert all(counts[u] == 1 for u in uids), (r.nid, {u: counts[u] for u in uids if counts[u] != 1})
        assert r.broker.schedule.status()["pending"] == 0


async def test_the_schedule_index_is_rebuilt_when_it_does_not_match(tmp_path: Path) -> None:
    """A replica whose schedule index was lost (or runs ahead of the store snapshot) rebuilds it from
    the log at start: pending messages stay pending, delivered ones stay delivered."""
    baseline = InProcBrokerCluster.baseline()
    c = await InProcBrokerCluster.start(str(tmp_path / "c"), broker_props={"messageDelayLevel": "1s 1h"})
    try:
        await c.create_topic("T", 2)
        g = c.groups[0]
        async with Producer("pg", c.namesrv_addr, credentials=PRODUCER) as p:
            late = await p.send(Message("T", b"late", delay_time_level=2))
            soon = await p.send(Message("T", b"soon", delay_time_level=1))
        await wait_until(lambda: _real_queue_uids(c, "n0")[soon.unique_id] == 1, 20, "the 1 s message")
        await g.wait_replicated()
        r = g.replica("n2")
        path = os.path.join(r.broker.cfg.store_dir, "schedule", "pending.db")
        await g.kill("n2")
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
        await g.start("n2")
        await g.wait_replicated()
        st = g.replica("n2").broker.schedule.status()
        assert st["pending"] == 1 and st["backlog"] == {"level2": 1}
        assert _real_queue_uids(c, "n2")[late.unique_id] == 0
    finally:
        await c.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)


def test_a_copy_decoded_again_is_the_same() -> None:
    s = SchedulePolicy().prepare(_msg({"DELAY": "1"}), "m")
    c = delivered_copy(s, 1, 2, 4)
    assert decode_message(encode_message(c))._asdict() == c._asdict()




def test_a_state_entry_carries_the_pending_set(tmp_path: Path) -> None:
    """A follower that loads a leader's state entry takes the leader's pending set (its own log may
    not reach back to the schedule records), so both skip the same second copies."""
    leader = ScheduleIndex(str(tmp_path / "a" / "pending.db"))
    leader.add(100, 50, {PROP_DUE_MS: "7", "__DELAY_LEVEL": "2"})
    leader.add(300, 60, {PROP_DUE_MS: "9"})
    follower = ScheduleIndex(str(tmp_path / "b" / "pending.db"))
    follower.add(999, 1, {PROP_DUE_MS: "1"})  # what it had: replaced
    follower.load_rows(leader.rows(), 42)
    assert follower.applied_index() == 42 and sorted(follower.rows()) == [[100, 50, 7, 2], [300, 60, 9, 0]]
    assert follower.on_message(500, 10, "T", {PROP_SCHED_POS: "100"})  # the first copy
    assert not follower.on_message(600, 10, "T", {PROP_SCHED_POS: "100"})  # a second one: skipped
    leader.close()
    follower.close()


async def test_delayed_messages_through_repeated_leader_crashes(cluster: InProcBrokerCluster) -> None:
    """Issue 14's targets on the in-process cluster: delayed and timed messages sent while leaders
    crash and come back: every acknowledged one ends in its queue exactly once on every replica, none
    stored there before its due time; lateness (due → stored in the real topic) is printed, not
    asserted (a shared machine)."""
    g = cluster.groups[0]
    acked: dict[str, int] = {}  # unique id -> level (0: a deliver time)
    async with Producer("pg", cluster.namesrv_addr, credentials=PRODUCER, send_timeout_s=10) as p:
        for round_ in range(3):
            for i in range(30):
                level = i % 4
                msg = (Message("T", f"r{round_}m{i}".encode(), deliver_time_ms=int(time.time() * 1000) + 2500)
                       if level == 0 else Message("T", f"r{round_}m{i}".encode(), delay_time_level=level))
                try:
                    r = await p.send(msg)
                except ClientError:
                    continue  # not acknowledged: may or may not be stored
                acked[r.unique_id] = level
            leader = g.leader() or await g.wait_leader(registered=False)
            await g.kill(leader.nid)
            await g.wait_leader(registered=False)
            await g.start(leader.nid)
    assert len(acked) >= 60

    def delivered_everywhere() -> bool:
        return all(all(_real_queue_uids(cluster, r.nid)[u] >= 1 for u in acked) for r in g.replicas)

    await wait_until(delivered_everywhere, 60, "every acknowledged delayed message delivered on every replica")
    await g.wait_replicated()
    lateness = []
    for r in g.replicas:
        counts = _real_queue_uids(cluster, r.nid)
        assert all(counts[u] == 1 for u in acked), (r.nid, {u: counts[u] for u in acked if counts[u] != 1})
        b = r.broker
        for qid in range(2):
            cq = b.store.cqs.get("T", qid)
            assert cq is not None
            for u in cq.read(cq.min_offset, cq.max_offset - cq.min_offset):
                m = b.store.read_message(u.position, u.size)
                if PROP_DUE_MS not in m.properties:  # a deliver time already past when it arrived
                    assert acked.get(m.unique_id, 0) == 0
                    continue
                due = int(m.properties[PROP_DUE_MS])
                assert m.store_ts >= due, f"{m.unique_id} stored at {m.store_ts}, due {due}"
                lateness.append(m.store_ts - due)
    lateness.sort()
    print(f"lateness ms over {len(lateness)} deliveries: p50 {lateness[len(lateness) // 2]}, "
          f"p99 {lateness[int(len(lateness) * 0.99)]}, max {lateness[-1]}")
