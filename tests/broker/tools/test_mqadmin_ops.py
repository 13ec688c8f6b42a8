"""``mqadmin``: what a new user saw go wrong (issue 16) and the commands added for RocketMQ parity,
each against real broker groups on the in-process log (``tests/broker/inproc_cluster.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from typing import Any

from tests.broker.inproc_cluster import InProcBrokerCluster
from tests.broker.tools.conftest import Mqadmin
from tests.broker.tools.test_mqadmin import seed


async def heartbeat(cluster: InProcBrokerCluster, group: str, topic: str, model: str, client: str = "c1") -> None:
    for g in cluster.groups:
        leader = g.leader() or await g.wait_leader()
        body = {"client_id": client, "groups": [{"group": group, "topics": [topic], "model": model}]}
        await cluster.call(leader.addr, "POST", "/v1/heartbeat", body)


async def run_with_closed_stdout(*argv: str) -> tuple[int, str]:
    """``mqadmin argv`` in a child process whose stdout is a pipe nobody reads any more (the reader
    of ``mqadmin ... | head -1`` has gone): exit code and stderr."""
    r, w = os.pipe()
    os.close(r)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "broker.tools.mqadmin", *argv, stdout=w, stderr=asyncio.subprocess.PIPE
        )
    finally:
        os.close(w)
    _out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


# -- what a user saw ------------------------------------------------------------------------------
async def test_closed_pipe_ends_quietly(cluster: InProcBrokerCluster) -> None:
    await seed(cluster)
    for argv in (["--json", "clusterList"], ["consumeMessage", "-t", "T1", "-c", "1500"]):
        rc, err = await run_with_closed_stdout(*argv, "-n", cluster.namesrv_addr)
        assert "Traceback" not in err and "BrokenPipeError" not in err, err
        assert rc == 141, (argv, rc, err)


async def test_send_to_a_read_only_topic_names_the_permission(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    await cluster.create_topic("PT", 2, perm=4)
    r = await mqadmin("sendMessage", "-t", "PT", "-p", "hello")
    assert r.rc == 1
    assert "NO_PERMISSION" in r.err and "not writable" in r.err and "-p 6" in r.err, r.err
    assert "NO_ROUTE" not in r.err
    assert cluster.group("RaftNode00").max_offset("PT", 0) == 0


async def test_consumer_progress_of_an_unknown_group_fails(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    await seed(cluster)
    r = await mqadmin("consumerProgress", "-g", "Nobody")
    assert r.rc == 1, r.out
    assert "SUBSCRIPTION_GROUP_NOT_EXIST" in r.err and "Nobody" in r.err, r.err
    r = await mqadmin("consumerProgress", "-g", "Nobody", "--json")
    assert r.rc == 1 and r.json()["code"] == "SUBSCRIPTION_GROUP_NOT_EXIST"


async def test_consumer_progress_of_a_broadcasting_group_fails(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    await seed(cluster)
    await heartbeat(cluster, "BG", "T1", "BROADCASTING")
    r = await mqadmin("consumerProgress", "-g", "BG")
    assert r.rc == 1, r.out
    assert "BROADCASTING_GROUP" in r.err and "BROADCASTING mode" in r.err, r.err


async def test_consumer_progress_of_a_broadcasting_group_whose_consumers_left_fails_naming_it(
    mqadmin: Mqadmin, cluster: InProcBrokerCluster
) -> None:
    """Issue 28, papercut 3: with its consumers offline the group was reported as never created."""
    await seed(cluster)
    await heartbeat(cluster, "BG", "T1", "BROADCASTING")
    for g in cluster.groups:
        leader = g.leader() or await g.wait_leader()
        await cluster.call(leader.addr, "POST", "/v1/unregister", {"client_id": "c1"})
    r = await mqadmin("consumerProgress", "-g", "BG", "--json")
    assert r.rc == 1, r.out
    assert r.json()["code"] == "BROADCASTING_GROUP", r.out
    assert "no consumer online" in r.err and "keeps its own offsets" in r.err, r.err
    # a clustering group that left is still reported by what the brokers hold
    await heartbeat(cluster, "CG2", "T1", "CLUSTERING", client="c2")
    for g in cluster.groups:
        leader = g.leader() or await g.wait_leader()
        await cluster.call(leader.addr, "POST", "/v1/unregister", {"client_id": "c2"})
    assert (await mqadmin("consumerProgress", "-g", "CG2", "--json")).json()["code"] == "SUBSCRIPTION_GROUP_NOT_EXIST"


async def test_consumer_progress_of_a_subscribed_group_without_commits_shows_its_queues(
    mqadmin: Mqadmin, cluster: InProcBrokerCluster
) -> None:
    await seed(cluster)
    await heartbeat(cluster, "CG", "T1", "CLUSTERING")
    r = await mqadmin("consumerProgress", "-g", "CG", "--json")
    assert r.rc == 0, r.err
    assert len(r.json()["queues"]) == 8 and r.json()["total_lag"] == 10


async def test_namesrv_option_pointed_at_a_broker(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    broker = cluster.group("RaftNode00").replica("n1").addr
    r = await mqadmin("clusterList", "-n", broker)
    assert r.rc == 1
    assert "NOT_A_NAMESRV" in r.err and "not a NameServer" in r.err and "RaftNode00" in r.err, r.err
    assert "404" not in r.err.replace(broker, "<broker>")  # no raw status (the random port may hold "404")


def _rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()[1:] if line.strip()]


def _data(r: Any) -> Any:
    assert r.rc == 0, r.err
    return json.loads(r.out)


# -- the commands added for parity ----------------------------------------------------------------
async def test_delete_sub_group(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    assert (await mqadmin("updateSubGroup", "-g", "DG", "-c", "DefaultCluster")).rc == 0
    g0, g1 = cluster.group("RaftNode00"), cluster.group("RaftNode01")
    assert "DG" in g0.subscription_groups() and "DG" in g1.subscription_groups()
    r = await mqadmin("deleteSubGroup", "-g", "DG", "-c", "DefaultCluster")
    assert r.rc == 0, r.err
    assert r.out.splitlines()[0].split() == ["#Target", "#Name", "#Addr", "#Result", "#Deleted"]
    assert "DG" not in g0.subscription_groups() and "DG" not in g1.subscription_groups()
    # one broker by address; usage and cluster errors
    assert (await mqadmin("updateSubGroup", "-g", "DG", "-c", "DefaultCluster")).rc == 0
    leader = g1.leader()
    assert leader is not None
    data = _data(await mqadmin("deleteSubGroup", "-g", "DG", "-b", leader.addr, "--json"))
    assert data["results"][0]["answer"]["deleted"] is True
    assert "DG" not in g1.subscription_groups() and "DG" in g0.subscription_groups()
    assert (await mqadmin("deleteSubGroup", "-g", "DG")).rc == 2
    assert (await mqadmin("deleteSubGroup", "-g", "bad group", "-c", "DefaultCluster")).rc == 2
    r = await mqadmin("deleteSubGroup", "-g", "DG", "-c", "NoSuchCluster")
    assert r.rc == 1 and "CLUSTER_NOT_EXIST" in r.err


async def test_consumer_connection(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    await seed(cluster)
    await heartbeat(cluster, "CG", "T1", "CLUSTERING", client="10.0.0.1@111")
    await heartbeat(cluster, "CG", "T1", "CLUSTERING", client="10.0.0.2@222")
    r = await mqadmin("consumerConnection", "-g", "CG")
    assert r.rc == 0, r.err
    rows = _rows(r.out.split("\n\n")[0])
    assert [row[1] for row in rows] == ["10.0.0.1@111", "10.0.0.2@222"]
    assert rows[0][2:] == ["CLUSTERING", "T1", "RaftNode00,RaftNode01"]
    assert "MessageModel: CLUSTERING" in r.out
    data = _data(await mqadmin("consumerConnection", "-g", "CG", "--json"))
    assert [c["client_id"] for c in data["connections"]] == ["10.0.0.1@111", "10.0.0.2@222"]
    r = await mqadmin("consumerConnection", "-g", "Nobody")
    assert r.rc == 1 and "CONSUMER_NOT_ONLINE" in r.err


async def test_topic_cluster_list(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    await cluster.create_topic("TC", 2, groups=["RaftNode01"])
    r = await mqadmin("topicClusterList", "-t", "TC")
    assert r.rc == 0, r.err
    assert r.out.split() == ["DefaultCluster"]
    assert _data(await mqadmin("topicClusterList", "-t", "TC", "--json"))["clusters"] == ["DefaultCluster"]
    r = await mqadmin("topicClusterList", "-t", "Missing")
    assert r.rc == 1 and "TOPIC_NOT_EXIST" in r.err


async def test_allocate_mq(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    await cluster.create_topic("AT", 4)  # 8 queues over two groups
    data = _data(await mqadmin("allocateMQ", "-t", "AT", "-i", "c2,c1,c3", "--json"))
    got = {cid: [(q["broker_name"], q["queue_id"]) for q in qs] for cid, qs in data["result"].items()}
    every = sorted(q for qs in got.values() for q in qs)
    assert every == sorted((b, q) for b in ("RaftNode00", "RaftNode01") for q in range(4))  # each queue once
    assert sorted(len(qs) for qs in got.values()) == [2, 3, 3]
    assert got["c1"] == [("RaftNode00", 0), ("RaftNode00", 1), ("RaftNode00", 2)]  # averagely: sorted ids
    r = await mqadmin("allocateMQ", "-t", "AT", "-i", "c1")
    assert r.rc == 0 and len(_rows(r.out)) == 8
    assert (await mqadmin("allocateMQ", "-t", "AT", "-i", ",")).rc == 2
    assert (await mqadmin("allocateMQ", "-t", "AT", "-i", "a,a")).rc == 2


async def test_get_namesrv_config(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    r = await mqadmin("getNamesrvConfig")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert lines[0] == f"============{cluster.namesrv_addr}============"
    assert any(line.startswith("brokerChannelMaxIdleTime") for line in lines), lines
    data = _data(await mqadmin("getNamesrvConfig", "--json"))
    assert "scanNotActiveBrokerInterval" in data[cluster.namesrv_addr]


async def test_get_broker_config(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    leader = cluster.group("RaftNode00").leader()
    assert leader is not None
    data = _data(await mqadmin("getBrokerConfig", "-b", leader.addr, "--json"))
    cfg = data[leader.addr]
    assert cfg["brokerName"] == "RaftNode00" and cfg["dledger.self_id"] == "n0"
    assert cfg["autoCreateTopicEnable"] == "true" and cfg["longPollingMaxMs"].isdigit()
    assert not any("password" in k or "credential" in k or "secret" in k for k in cfg), sorted(cfg)
    text = (await mqadmin("getBrokerConfig", "-c", "DefaultCluster")).out
    assert text.count("============") == 2 * 6  # six replicas
    assert not any(s in text for s in ("password", "secret"))
    assert (await mqadmin("getBrokerConfig")).rc == 2


async def test_stats_all(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    await seed(cluster)  # T1: 8 messages on RaftNode00, 2 on RaftNode01
    await cluster.group("RaftNode00").commit_offsets("SG", "T1", {0: 1})
    r = await mqadmin("statsAll", "-t", "T1")
    assert r.rc == 0, r.err
    assert r.out.splitlines()[0].split() == ["#Topic", "#Consumer", "Group", "#Accumulation", "#InTPS", "#OutTPS"]
    data = _data(await mqadmin("statsAll", "-t", "T1", "--json"))
    (row,) = data["stats"]
    assert row["topic"] == "T1" and row["group"] == "SG"
    assert row["accumulation"] == 7  # RaftNode00: 8 - 1 committed (RaftNode01: SG has no offsets there)
    assert row["in_tps"] > 0


async def test_stats_all_shows_an_unknown_lag_as_a_dash_and_refuses_an_unknown_topic(
    mqadmin: Mqadmin, cluster: InProcBrokerCluster
) -> None:
    """Issue 28, papercut 2: a broadcasting group (no offsets at the brokers) showed lag 0; a topic
    that does not exist gave an empty table and exit 0."""
    await seed(cluster)
    leader = cluster.group("RaftNode00").leader()
    assert leader is not None
    pulled = await cluster.call(leader.addr, "POST", "/v1/pull",
                                {"topic": "T1", "queue_id": 0, "offset": 0, "consumer_group": "BG"})
    assert pulled["messages"]
    data = _data(await mqadmin("statsAll", "-t", "T1", "--json"))
    (row,) = [x for x in data["stats"] if x["group"] == "BG"]
    assert row["accumulation"] is None and row["out_tps"] > 0
    r = await mqadmin("statsAll", "-t", "T1")
    (line,) = [x for x in _rows(r.out) if x[1] == "BG"]
    assert line[2] == "-", r.out
    r = await mqadmin("statsAll", "-t", "NoSuchTopic")
    assert r.rc == 2 and r.out == "", (r.rc, r.out)
    assert "TOPIC_NOT_EXIST" in r.err and "NoSuchTopic" in r.err, r.err


async def test_cluster_rt(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    r = await mqadmin("clusterRT", "-c", "DefaultCluster", "-a", "3", "-t", "RT_TOPIC")
    assert r.rc == 0, r.err
    rows = _rows(r.out)
    assert [row[:2] for row in rows] == [["DefaultCluster", "RaftNode00"], ["DefaultCluster", "RaftNode01"]]
    assert all(row[-2:] == ["3", "0"] for row in rows), rows
    assert cluster.group("RaftNode00").max_offset("RT_TOPIC", 0) == 3
    assert (await mqadmin("clusterRT", "-a", "0")).rc == 2
    await cluster.create_topic("RO_RT", 1, perm=4)
    r = await mqadmin("clusterRT", "-a", "1", "-t", "RO_RT", "--json")
    assert r.rc == 1 and "NO_PERMISSION" in r.out


async def test_print_msg(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    msgs = await seed(cluster)
    data = _data(await mqadmin("printMsg", "-t", "T1", "--json"))
    assert len(data["messages"]) == 10
    data = _data(await mqadmin("printMsg", "-t", "T1", "-s", "A", "--json"))
    assert sorted(m["queue_offset"] for m in data["messages"] if m["broker_name"] == "RaftNode00") == [0, 0, 1, 1]
    assert {m["tags"] for m in data["messages"]} == {"A"}
    # [begin, end): messages 2..5 of RaftNode00 by store time
    begin, end = msgs[2]["store_ts"], msgs[6]["store_ts"]
    data = _data(await mqadmin("printMsg", "-t", "T1", "-b", str(begin), "-e", str(end), "--json"))
    bodies = sorted(base64_body(m) for m in data["messages"])
    assert bodies == [f"body {i}" for i in range(2, 6)]
    r = await mqadmin("printMsg", "-t", "T1", "-d", "-c", "3")
    assert r.rc == 0 and r.out.count("MSGID: ") == 3 and r.out.rstrip().endswith("Printed: 3")
    assert (await mqadmin("printMsg", "-t", "T1", "-b", "yesterday")).rc == 2


def base64_body(m: dict[str, Any]) -> str:
    import base64

    return base64.b64decode(m["body_b64"]).decode()


def test_help_lists_the_added_commands(capsys: Any) -> None:
    from broker.tools.mqadmin import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for cmd in ("deleteSubGroup", "consumerConnection", "topicClusterList", "allocateMQ", "getNamesrvConfig",
                "getBrokerConfig", "statsAll", "clusterRT", "printMsg"):
        assert cmd in out


async def test_wipe_and_add_write_perm(mqadmin: Mqadmin, make_cluster: Any) -> None:
    cluster: InProcBrokerCluster = await make_cluster(namesrvs=2)
    await cluster.create_topic("WT", 2)
    r = await mqadmin("wipeWritePerm", "-b", "RaftNode00", "-n", cluster.namesrv_addr)
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert len(lines) == 2
    for ns, line in zip(cluster.namesrvs, lines, strict=True):
        assert re.fullmatch(rf"wipe write perm of broker\[RaftNode00\] in namesrv\[{ns.addr}\] OK, [1-9]\d*", line)
    for i in range(2):
        route = await cluster.route("WT", namesrv=i)
        assert route is not None
        perms = {q["broker_name"]: q["perm"] for q in route["queue_datas"]}
        assert perms == {"RaftNode00": 4, "RaftNode01": 6}, perms
    # a send through the SDK now avoids RaftNode00 (its queues are read-only in the routes)
    for _ in range(4):
        data = _data(await mqadmin("--json", "sendMessage", "-t", "WT", "-p", "x", "-n", cluster.namesrv_addr))
        assert data["broker_name"] == "RaftNode01"
    # the broker's own re-registration does not undo it; addWritePerm does
    await cluster.group("RaftNode00").transfer("n1")
    route = await cluster.route("WT")
    assert route is not None and {q["broker_name"]: q["perm"] for q in route["queue_datas"]}["RaftNode00"] == 4
    r = await mqadmin("addWritePerm", "-b", "RaftNode00", "-n", cluster.namesrv_addr)
    assert r.rc == 0 and r.out.startswith("add write perm of broker[RaftNode00]"), r.err
    route = await cluster.route("WT")
    assert route is not None and {q["broker_name"]: q["perm"] for q in route["queue_datas"]}["RaftNode00"] == 6
    r = await mqadmin("wipeWritePerm", "-b", "NoSuchGroup", "-n", cluster.namesrv_addr)
    assert r.rc == 1 and "BROKER_NOT_EXIST" in r.err
    assert (await mqadmin("wipeWritePerm", "-b", "bad name", "-n", cluster.namesrv_addr)).rc == 2


async def test_update_broker_config(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    r = await mqadmin("updateBrokerConfig", "-c", "DefaultCluster", "-k", "autoCreateTopicEnable", "-v", "false")
    assert r.rc == 0, r.err
    assert len(_rows(r.out)) == 6  # every replica (a follower may lead next)
    for g in cluster.groups:
        assert all(rep.broker.cfg.auto_create_topic is False for rep in g.replicas)
    r = await mqadmin("sendMessage", "-t", "NeverCreated", "-p", "x")
    assert r.rc == 1 and "NeverCreated" in r.err, r.err
    leader = cluster.group("RaftNode00").leader()
    assert leader is not None
    r = await mqadmin("updateBrokerConfig", "-b", leader.addr, "-k", "defaultTopicQueueNums", "-v", "8", "--json")
    assert r.rc == 0 and r.json()["results"][0]["answer"] == {"key": "defaultTopicQueueNums", "value": "8"}
    assert leader.broker.cfg.default_topic_queue_nums == 8
    cfg = _data(await mqadmin("getBrokerConfig", "-b", leader.addr, "--json"))[leader.addr]
    assert cfg["defaultTopicQueueNums"] == "8" and cfg["autoCreateTopicEnable"] == "false"
    # bad values and keys that cannot change at run time: usage errors naming why, nothing changed
    r = await mqadmin("updateBrokerConfig", "-b", leader.addr, "-k", "defaultTopicQueueNums", "-v", "0")
    assert r.rc == 2 and "BAD_PARAMETER" in r.err and "1..1024" in r.err, r.err
    r = await mqadmin("updateBrokerConfig", "-b", leader.addr, "-k", "brokerName", "-v", "X")
    assert r.rc == 2 and "NOT_UPDATABLE" in r.err and "restart" in r.err, r.err
    assert leader.broker.cfg.default_topic_queue_nums == 8 and leader.broker.cfg.broker_name == "RaftNode00"


async def test_broker_config_endpoints_need_an_admin(cluster: InProcBrokerCluster) -> None:
    from broker.client.transport import ClientError, Transport
    from tests.acl_fixtures import CONSUMER

    leader = cluster.group("RaftNode00").leader()
    assert leader is not None
    t = Transport(3.0, credentials=CONSUMER, tls=False)
    try:
        for method, body in (("GET", None), ("POST", {"key": "longPollingMaxMs", "value": "1"})):
            try:
                await t.call(leader.addr, method, "/v1/admin/config", body)
                raise AssertionError(f"{method} /v1/admin/config allowed for a non-admin account")
            except ClientError as exc:
                assert exc.status == 403, exc
        for path, body in (("/v1/config", {"v": 1, "key": "brokerChannelMaxIdleTime", "value": "5000"}),
                           ("/v1/brokers/perm", {"v": 1, "broker_name": "RaftNode00", "write": False})):
            try:
                await t.call(cluster.namesrv_addr, "POST", path, body)
                raise AssertionError(f"POST {path} allowed at the NameServer for a non-admin account")
            except ClientError as exc:
                assert exc.status == 403, exc
    finally:
        await t.close()
    assert leader.broker.cfg.long_polling_max_ms != 1
    assert cluster.namesrvs[0].service.cfg.broker_channel_max_idle_time_ms != 5000


async def test_update_namesrv_config(mqadmin: Mqadmin, make_cluster: Any) -> None:
    cluster: InProcBrokerCluster = await make_cluster(namesrvs=2, groups=("RaftNode00",))
    n = ["-n", cluster.namesrv_addr]
    r = await mqadmin("updateNamesrvConfig", "-k", "brokerChannelMaxIdleTime", "-v", "90000", *n)
    assert r.rc == 0, r.err
    assert r.out.count("update name server config success!") == 2 and "brokerChannelMaxIdleTime : 90000" in r.out
    cfgs = _data(await mqadmin("getNamesrvConfig", "--json", *n))
    assert [c["brokerChannelMaxIdleTime"] for c in cfgs.values()] == [90000, 90000]
    r = await mqadmin("updateNamesrvConfig", "-k", "scanNotActiveBrokerInterval", "-v", "5000", *n)
    assert r.rc == 0, r.err
    # the config file's bounds and invariant hold; other keys cannot change at run time
    r = await mqadmin("updateNamesrvConfig", "-k", "scanNotActiveBrokerInterval", "-v", "100000", *n)
    assert r.rc == 2 and "BAD_PARAMETER" in r.err and "must not exceed" in r.err, r.err
    r = await mqadmin("updateNamesrvConfig", "-k", "brokerChannelMaxIdleTime", "-v", "abc", *n)
    assert r.rc == 2 and "BAD_PARAMETER" in r.err, r.err
    r = await mqadmin("updateNamesrvConfig", "-k", "listenPort", "-v", "1", *n)
    assert r.rc == 2 and "NOT_UPDATABLE" in r.err, r.err
    cfgs = _data(await mqadmin("getNamesrvConfig", "--json", *n))
    assert [(c["scanNotActiveBrokerInterval"], c["brokerChannelMaxIdleTime"]) for c in cfgs.values()] == [
        (5000, 90000), (5000, 90000)
    ]


async def test_producer_connection(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    await cluster.create_topic("PC", 2)
    for _ in range(3):
        assert (await mqadmin("sendMessage", "-t", "PC", "-p", "x")).rc == 0  # group mqadmin_producer
    data = _data(await mqadmin("producerConnection", "-g", "mqadmin_producer", "--json"))
    rows = data["connections"]
    assert rows and {r["client_addr"] for r in rows} == {"127.0.0.1"}
    assert sum(r["sends"] for r in rows) == 3 and all(r["topics"] == ["PC"] for r in rows)
    assert {r["broker_name"] for r in rows} <= {"RaftNode00", "RaftNode01"}
    r = await mqadmin("producerConnection", "-g", "mqadmin_producer", "-t", "PC")
    assert r.rc == 0 and r.out.splitlines()[0].split()[:3] == ["##", "#ClientAddr", "#Broker"]
    r = await mqadmin("producerConnection", "-g", "mqadmin_producer", "-t", "Other")
    assert r.rc == 1 and "PRODUCER_NOT_ONLINE" in r.err
    r = await mqadmin("producerConnection", "-g", "NoProducers")
    assert r.rc == 1 and "PRODUCER_NOT_ONLINE" in r.err


def test_producer_table_is_bounded_and_expires() -> None:
    from broker.service import producers
    from broker.service.producers import ProducerTable

    t = ProducerTable(expiry_ms=1000)
    t.sent("G", "10.0.0.1", "T", 0)
    t.sent("G", "10.0.0.1", "U", 500)
    assert t.connections("G", 600) == [{"client_addr": "10.0.0.1", "topics": ["T", "U"], "sends": 2, "idle_ms": 100}]
    assert t.connections("G", 1600) == []  # idle past expiry: not shown, then dropped
    t.expire(1600)
    assert t._groups == {}
    for i in range(producers.CLIENTS_MAX + 5):
        t.sent("G", f"10.0.{i // 256}.{i % 256}", "T", 2000)
    assert len(t.connections("G", 2000)) == producers.CLIENTS_MAX
    for i in range(producers.GROUPS_MAX + 5):
        t.sent(f"G{i}", "10.0.0.1", "T", 2000)
    assert len(t._groups) == producers.GROUPS_MAX


async def test_clean_expired_cq(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    """Queues of a topic the metadata no longer holds (a crash between a topic's deletion and the
    removal of its files leaves them) are removed on every replica; live topics keep theirs."""
    await seed(cluster)  # T1 on both groups
    g0 = cluster.group("RaftNode00")
    for rep in g0.replicas:  # an orphan queue, as a crash would leave it: files, no topic
        store = rep.broker.store

        def orphan(store: Any = store) -> None:
            store.cqs.get_or_create("Ghost", 0).append(0, 10, 0, 0)

        await rep.broker.node.run_on_replica_thread(orphan, 5)
    assert all(rep.broker.store.cqs.get("Ghost", 0) is not None for rep in g0.replicas)
    r = await mqadmin("cleanExpiredCQ", "-c", "DefaultCluster")
    assert r.rc == 0, r.err
    rows = _rows(r.out)
    assert len(rows) == 6  # every replica of both groups
    by_addr = {row[2]: row for row in rows}
    for rep in g0.replicas:
        assert by_addr[rep.addr][4:] == ["1", "Ghost/0"], r.out
        assert rep.broker.store.cqs.get("Ghost", 0) is None
        assert not os.path.exists(os.path.join(rep.broker.store.cqs._root, "Ghost"))
        assert rep.broker.store.cqs.get("T1", 0) is not None  # a live topic keeps its queues
    data = _data(await mqadmin("cleanExpiredCQ", "-b", g0.replicas[0].addr, "--json"))
    assert data["results"][0]["answer"]["removed"] == []  # nothing left to clean
    leader = g0.leader()
    assert leader is not None
    pulled = await cluster.call(leader.addr, "POST", "/v1/pull", {"topic": "T1", "queue_id": 0, "offset": 0})
    assert pulled["messages"]  # the live topic still serves its messages
    assert (await mqadmin("cleanExpiredCQ")).rc == 2  # neither -c nor -b


async def test_refused_records_lists_what_every_replica_refused(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    """Issue 23: a committed record no replica can apply is refused alike by all; the operator lists it."""
    g0 = cluster.group("RaftNode00")
    leader = g0.leader()
    assert leader is not None
    (loc,) = await leader.broker.node.append([b"?junk an older release left"], timeout_s=10.0)
    await g0.wait_replicated()
    data = _data(await mqadmin("refusedRecords", "-c", "DefaultCluster", "--json"))
    answers = {x["addr"]: x["answer"] for x in data["results"]}
    assert len(answers) == 6
    for rep in g0.replicas:
        (listed,) = answers[rep.addr]["recent"]
        assert (listed["index"], listed["position"], listed["code"]) == (loc.index, loc.position, "RECORD_REFUSED")
    for rep in cluster.group("RaftNode01").replicas:
        assert answers[rep.addr]["total"] == 0
    r = await mqadmin("refusedRecords", "-b", g0.replicas[1].addr)
    assert r.rc == 0 and "unknown record kind" in r.out and str(loc.index) in r.out, r.out
