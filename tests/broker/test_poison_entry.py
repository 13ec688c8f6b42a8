"""Issue 23, findings 1 and 2, on real broker groups in this process (tests/broker/inproc_cluster.py).

1. Poison pill: a send-back for a 121..255-character group made ``%RETRY%``/``%DLQ%`` + group, a name
   no consume queue can have; applying the committed entry raised on every replica. Now the group is
   refused at every edge (at most 120 chars, RocketMQ's limit: the retry topic must fit 127), and a
   record that still slips into the log (a validation gap, an older release) is refused by every
   replica alike — its sender gets ``RECORD_REFUSED``, operators see it — while the group serves on.
2. Cross-topic read: a send-back copied a message of *any* topic into the group's retry topic, which
   the caller may read. Now it must name a message of a topic the caller may read and the group consumes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from broker.client.transport import ClientError, Transport
from broker.edge import http_retry as retry_api
from broker.protocol.auth import Credentials
from broker.service import send as service_send
from broker.service.send import SendOps
from tests.acl_fixtures import ADMIN, CONSUMER, acl_doc, write_acl
from tests.broker.inproc_cluster import WAIT_S, InProcBrokerCluster
from tests.dledger.harness import wait_until

FAST_LEVELS = " ".join(["1s"] * 18)
SNOOP = Credentials("snoop", "snoop-secret-001")  # SUB on every group and topic but one: Secret
SNOOP_ACCOUNT = {"accessKey": SNOOP.access_key, "secretKey": SNOOP.secret_key, "defaultTopicPerm": "SUB",
                 "defaultGroupPerm": "SUB", "topicPerms": ["Secret=DENY"]}


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[InProcBrokerCluster]:
    baseline = InProcBrokerCluster.baseline()
    c = await InProcBrokerCluster.start(str(tmp_path / "cluster"), broker_props={"messageDelayLevel": FAST_LEVELS})
    try:
        await c.create_topic("T", 1)
        yield c
    finally:
        await c.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)


async def call(creds: Credentials, addr: str, method: str, path: str, body: Any = None, **kw: Any) -> Any:
    t = Transport(timeout_s=10.0, credentials=creds)
    try:
        return await t.call(addr, method, path, body, **kw)
    finally:
        await t.close()


async def refused(creds: Credentials, addr: str, path: str, body: dict[str, Any]) -> ClientError:
    with pytest.raises(ClientError) as got:
        await call(creds, addr, "POST", path, body)
    return got.value


def all_alive(cluster: InProcBrokerCluster) -> None:
    for r in cluster.groups[0].replicas:
        assert r.alive and r.broker.node.fatal is None, f"{r} stopped: {r.broker.node.fatal!r}"


def topics_on_every_replica(cluster: InProcBrokerCluster) -> list[set[str]]:
    return [set(r.broker.store.metadata_view().topics) for r in cluster.groups[0].replicas]


async def test_a_group_too_long_for_its_retry_topic_is_refused_at_every_edge(cluster: InProcBrokerCluster) -> None:
    g = cluster.groups[0]
    leader = g.replica("n0")
    (sent,) = await g.put("T", 0, 1, body=b"payload")
    log_end = leader.broker.node.last_index
    for length in (121, 200, 255):
        group = "g" * length
        for dlq in (True, False):
            err = await refused(CONSUMER, leader.addr, "/v1/consumer/sendback",
                                {"group": group, "msg_id": sent["msg_id"], "dlq": dlq})
            assert (err.status, err.code) == (400, "INVALID_GROUP") and "120" in err.message, err
        err = await refused(CONSUMER, leader.addr, "/v1/heartbeat",
                            {"client_id": "c1", "groups": [{"group": group, "topics": ["T"]}]})
        assert err.code == "INVALID_GROUP"
        err = await refused(ADMIN, leader.addr, "/v1/groups", {"group": group})
        assert err.code == "INVALID_GROUP"
    await g.wait_replicated()
    all_alive(cluster)
    assert leader.broker.node.last_index == log_end  # nothing was appended
    assert all(not any(t.startswith(("%RETRY%", "%DLQ%")) for t in ts) for ts in topics_on_every_replica(cluster))
    # the longest group allowed: its retry topic is exactly 127 characters, and works end to end
    group = "g" * 120
    await call(CONSUMER, leader.addr, "POST", "/v1/heartbeat",
               {"client_id": "c1", "groups": [{"group": group, "topics": ["T"]}]})
    back = await call(CONSUMER, leader.addr, "POST", "/v1/consumer/sendback",
                      {"group": group, "msg_id": sent["msg_id"]})
    assert back["topic"] == "%RETRY%" + group and len(back["topic"]) == 127
    await wait_until(lambda: g.max_offset("%RETRY%" + group, 0) == 1, WAIT_S, "the retried copy, delivered")
    dead = await call(CONSUMER, leader.addr, "POST", "/v1/consumer/sendback",
                      {"group": group, "msg_id": sent["msg_id"], "dlq": True})
    assert dead["topic"] == "%DLQ%" + group
    await g.wait_replicated()
    for ts in topics_on_every_replica(cluster):
        assert {"%RETRY%" + group, "%DLQ%" + group} <= ts
    all_alive(cluster)


async def test_a_record_past_a_validation_gap_is_refused_by_every_replica_and_its_sender_gets_a_code(
    cluster: InProcBrokerCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The edge checks of the send-back are taken out (what the broker did before issue 23): the
    record reaches the log. Before the fix every replica's tick thread died applying it; now every
    replica refuses it alike, the sender gets ``RECORD_REFUSED``, the refusal is listed, counted and
    exported, survives a restart, and the group goes on serving."""
    for module in (retry_api, service_send):
        monkeypatch.setattr(module, "check_group", lambda g: g)
    monkeypatch.setattr(service_send, "is_topic", lambda t: True, raising=False)
    monkeypatch.setattr(SendOps, "group_consumes", lambda self, g, t: True, raising=False)
    g = cluster.groups[0]
    leader = g.replica("n0")
    (sent,) = await g.put("T", 0, 1, body=b"payload")
    group = "g" * 200
    err = await refused(CONSUMER, leader.addr, "/v1/consumer/sendback",
                        {"group": group, "msg_id": sent["msg_id"], "dlq": True})
    assert (err.status, err.code) == (422, "RECORD_REFUSED") and "%DLQ%ggg" in err.message, err
    await g.wait_replicated()
    all_alive(cluster)
    views = [await call(ADMIN, r.addr, "GET", "/v1/admin/refused") for r in g.replicas]
    recents = [v["recent"] for v in views]
    assert recents[0] == recents[1] == recents[2] and len(recents[0]) == 1, recents
    assert recents[0][0]["kind"] == "message" and "is not a valid topic name" in recents[0][0]["reason"]
    for r in g.replicas:
        status = await call(ADMIN, r.addr, "GET", "/v1/status")
        assert status["refused_records"] == 1 and status["dispatch"]["refused"] == 1
    # ... a refused copy is not readable by its position either
    position = recents[0][0]["position"]
    err = await refused(ADMIN, leader.addr, "/v1/consumer/sendback", {"group": "g", "position": position})
    assert err.code == "MESSAGE_NOT_FOUND"
    # the group serves on, and a follower restarted re-applies the entry: refused again, same list
    await g.put("T", 0, 2)
    await g.kill("n2")
    await g.start("n2")
    await g.wait_replicated()
    again = await call(ADMIN, g.replica("n2").addr, "GET", "/v1/admin/refused")
    assert again["recent"] == recents[0] and again["total"] == 1
    all_alive(cluster)
    assert [r.broker.store.cqs.get("T", 0).max_offset for r in g.replicas] == [3, 3, 3]  # type: ignore[union-attr]


async def test_the_refused_count_is_exported_to_prometheus(cluster: InProcBrokerCluster) -> None:
    leader = cluster.groups[0].replica("n0")
    before = leader.broker.store.refusals.total
    locs = await leader.broker.node.append([b"?not a record"], timeout_s=10.0)  # junk of an older release
    assert locs[0].result.code == "RECORD_REFUSED"
    async with aiohttp.ClientSession() as s, s.get(f"http://{leader.addr}/metrics") as resp:
        text = await resp.text()
    line = next(x for x in text.splitlines() if x.startswith("dledger_broker_refused_records_total"))
    assert float(line.rsplit(" ", 1)[1]) == before + 1


async def test_a_send_back_must_name_a_message_the_caller_may_read_and_the_group_consumed(
    cluster: InProcBrokerCluster,
) -> None:
    """Finding 2: a user DENY'd on a topic used to get its messages' bodies by sending them back to
    its own group's retry topic and reading that. Now the stored message's topic is checked."""
    g = cluster.groups[0]
    leader = g.replica("n0")
    await cluster.create_topic("Secret", 1)
    write_acl(cluster.acl_file, acl_doc(SNOOP_ACCOUNT))

    async def snoop_known() -> bool:
        try:
            await call(SNOOP, leader.addr, "GET", "/v1/topics")
        except ClientError:
            return False
        return True

    await wait_until(snoop_known, WAIT_S, "the new ACL file to be read")
    (secret,) = await g.put("Secret", 0, 1, body=b"the secret body")
    (plain,) = await g.put("T", 0, 1, body=b"plain")
    err = await refused(SNOOP, leader.addr, "/v1/heartbeat",
                        {"client_id": "snoop-1", "groups": [{"group": "sg", "topics": ["Secret"]}]})
    assert err.code == "NO_PERMISSION"
    await call(SNOOP, leader.addr, "POST", "/v1/heartbeat",
               {"client_id": "snoop-1", "groups": [{"group": "sg", "topics": ["T"]}]})
    for dlq in (False, True):
        err = await refused(SNOOP, leader.addr, "/v1/consumer/sendback",
                            {"group": "sg", "msg_id": secret["msg_id"], "dlq": dlq})
        assert (err.status, err.code) == (403, "NO_PERMISSION") and "Secret" in err.message, err
    # a topic the caller may read, but that the group does not consume: refused too
    err = await refused(CONSUMER, leader.addr, "/v1/consumer/sendback", {"group": "other", "msg_id": plain["msg_id"]})
    assert (err.status, err.code) == (403, "NOT_SUBSCRIBED"), err
    await g.wait_replicated()
    for ts in topics_on_every_replica(cluster):  # nothing was copied anywhere
        assert not {"%RETRY%sg", "%DLQ%sg", "%RETRY%other", "%DLQ%other"} & ts
    assert leader.broker.store.schedule.backlog() == {}
    err = await refused(SNOOP, leader.addr, "/v1/pull", {"topic": "%RETRY%sg", "queue_id": 0, "offset": 0})
    assert err.code == "TOPIC_NOT_EXIST"
    # what the group does consume still goes back: T (heartbeat), and T for "other" once it committed there
    back = await call(SNOOP, leader.addr, "POST", "/v1/consumer/sendback", {"group": "sg", "msg_id": plain["msg_id"]})
    assert back["topic"] == "%RETRY%sg"
    await g.commit_offsets("other", "T", {0: 1})
    back = await call(CONSUMER, leader.addr, "POST", "/v1/consumer/sendback",
                      {"group": "other", "msg_id": plain["msg_id"]})
    assert back["topic"] == "%RETRY%other"
    await wait_until(lambda: g.max_offset("%RETRY%sg", 0) == 1, WAIT_S, "the retried copy in %RETRY%sg")
    pulled = await call(SNOOP, leader.addr, "POST", "/v1/pull", {"topic": "%RETRY%sg", "queue_id": 0, "offset": 0})
    assert [m["body"] for m in pulled["messages"]] == [b"plain"]  # and nothing of Secret
