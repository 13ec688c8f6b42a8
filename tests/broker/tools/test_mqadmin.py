"""``mqadmin``: every command's table and ``--json`` output against the fakes, and the exit codes
(0 ok, 1 the cluster answered an error or is unreachable, 2 bad usage or input)."""

from __future__ import annotations

import datetime
import socket
from collections.abc import Callable
from typing import Any

import pytest

from broker.mqadmin import format_table, main, parse_timestamp, to_jsonable
from tests.broker.tools.conftest import Run
from tests.broker.tools.fakes import FakeCluster

Mqadmin = Callable[..., Run]
CLUSTER = "DefaultCluster"


def seed(cluster: FakeCluster, topic: str = "T1", n: int = 8) -> list[dict[str, Any]]:
    """``n`` messages on RaftNode00 (queue i % 4, key k<i>, tag A/B) and two on RaftNode01."""
    g0, g1 = cluster.group("RaftNode00"), cluster.group("RaftNode01")

    def fill() -> list[dict[str, Any]]:
        msgs = [
            g0.append(
                topic,
                i % 4,
                f"body {i}".encode(),
                tags="AB"[i % 2],
                keys=[f"k{i}", "shared"],
                store_ts=1_700_000_000_000 + i,
            )
            for i in range(n)
        ]
        msgs += [
            g1.append(topic, i, f"other {i}".encode(), keys=["shared"], store_ts=1_700_000_001_000 + i)
            for i in range(2)
        ]
        return msgs

    return cluster.call(fill)


def header(text: str) -> list[str]:
    return text.splitlines()[0].split()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- pure helpers ---------------------------------------------------------------------------------
def test_format_table_aligns_columns_like_rocketmq() -> None:
    text = format_table(["Broker Name", "QID"], [("RaftNode00", 0), ("B", 12), ("C", None), ("D", True)])
    assert text.splitlines() == [
        "#Broker Name  #QID",
        "RaftNode00    0",
        "B             12",
        "C             -",
        "D             true",
    ]


def test_parse_timestamp_forms() -> None:
    assert parse_timestamp("1700000000123") == 1_700_000_000_123
    local = datetime.datetime(2024, 1, 2, 3, 4, 5, 678000).timestamp()
    assert parse_timestamp("2024-01-02#03:04:05:678") == round(local * 1000)
    assert abs(parse_timestamp("now") - datetime.datetime.now().timestamp() * 1000) < 60_000
    with pytest.raises(Exception, match="bad timestamp"):
        parse_timestamp("2024-01-02 03:04:05")


def test_to_jsonable_turns_bodies_into_base64() -> None:
    assert to_jsonable({"body": b"hi", "n": (1, 2)}) == {"body_b64": "aGk=", "n": [1, 2]}


# -- usage ----------------------------------------------------------------------------------------
def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for cmd in (
        "clusterList",
        "topicList",
        "topicRoute",
        "updateTopic",
        "deleteTopic",
        "topicStatus",
        "updateSubGroup",
        "consumerProgress",
        "brokerStatus",
        "queryMsgById",
        "queryMsgByKey",
        "queryMsgByUniqueKey",
        "queryMsgByOffset",
        "sendMessage",
        "consumeMessage",
        "resetOffsetByTime",
        "transferLeader",
    ):
        assert cmd in out
    assert main(["updateTopic", "--help"]) == 0
    assert "--readQueueNums" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["topicRoute"],  # missing -t
        ["updateTopic", "-t", "T"],  # neither -c nor -b
        ["updateTopic", "-t", "T", "-c", "C", "-b", "127.0.0.1:1"],  # both
        ["updateTopic", "-t", "T", "-c", "C", "-r", "x"],
        ["queryMsgByOffset", "-t", "T", "-m", "B", "-q", "-1", "-o", "0"],
        ["resetOffsetByTime", "-g", "G", "-t", "T", "-s", "yesterday"],
        ["resetOffsetByTime", "-g", "G", "-t", "T", "-s", "2024-13-01#00:00:00:000"],
    ],
)
def test_usage_errors_exit_2_without_traceback(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip()


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["topicRoute", "-t", "bad topic!"], "INVALID_TOPIC"),
        (["updateTopic", "-t", "bad topic!", "-c", CLUSTER], "INVALID_TOPIC"),
        (["updateTopic", "-t", "T", "-c", CLUSTER, "-r", "0"], "INVALID_QUEUE_NUMS"),
        (["updateTopic", "-t", "T", "-c", CLUSTER, "-p", "9"], "INVALID_PERM"),
        (["updateTopic", "-t", "T", "-b", "nohost"], "INVALID_ADDRESS"),
        (["updateSubGroup", "-g", "bad group", "-c", CLUSTER], "INVALID_GROUP"),
        (["queryMsgById", "-i", "nonsense"], "INVALID_MSG_ID"),
        (["queryMsgByKey", "-t", "T", "-k", "two words"], "INVALID_KEYS"),
        (["queryMsgByUniqueKey", "-t", "T", "-u", "bad id!"], "INVALID_UNIQUE_ID"),
        (["transferLeader", "-m", "Raft Node"], "INVALID_BROKER_NAME"),
        (["consumeMessage", "-t", "T", "-c", "0"], "BAD_REQUEST"),
    ],
)
def test_invalid_input_exits_2_before_any_request(
    mqadmin: Mqadmin, cluster: FakeCluster, argv: list[str], code: str
) -> None:
    r = mqadmin(*argv)
    assert r.rc == 2, r
    assert code in r.err and "Traceback" not in r.err
    assert all(not g.requests for g in cluster.groups)
    assert all(not ns.requests for ns in cluster.namesrvs)


def test_bad_namesrv_list_exits_2(mqadmin: Mqadmin) -> None:
    r = mqadmin("topicList", "-n", "not-an-address")
    assert r.rc == 2 and "INVALID_ADDRESS" in r.err


def test_unreachable_namesrv_exits_1_naming_the_code(mqadmin: Mqadmin) -> None:
    r = mqadmin("clusterList", "-n", f"127.0.0.1:{closed_port()}")
    assert r.rc == 1 and "CONNECT_FAILED" in r.err and "Traceback" not in r.err
    r = mqadmin("topicList", "--json", "-n", f"127.0.0.1:{closed_port()}")
    assert r.rc == 1 and r.json()["code"] == "CONNECT_FAILED"


def test_namesrv_addr_env_is_the_default(
    cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(cluster)
    monkeypatch.setenv("NAMESRV_ADDR", cluster.namesrv)
    assert main(["topicList"]) == 0
    assert capsys.readouterr().out.split() == ["T1"]


# -- NameServer views -----------------------------------------------------------------------------
def test_cluster_list(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    r = mqadmin("clusterList")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].startswith("#Cluster Name   #Broker Name  #BID  #Addr")
    assert header(r.out)[:9] == [
        "#Cluster",
        "Name",
        "#Broker",
        "Name",
        "#BID",
        "#Addr",
        "#Role",
        "#Term",
        "#Self",
    ]
    assert len(lines) == 7
    leader = cluster.group("RaftNode00").addrs[0]
    row = next(line.split() for line in lines if leader in line)
    assert row[:6] == [CLUSTER, "RaftNode00", "0", leader, "LEADER", "1"]

    data = mqadmin("clusterList", "--json").json()
    assert [(b["broker_name"], b["broker_id"], b["role"]) for b in data["brokers"]] == [
        ("RaftNode00", 0, "LEADER"),
        ("RaftNode00", 2, "FOLLOWER"),
        ("RaftNode00", 3, "FOLLOWER"),
        ("RaftNode01", 0, "LEADER"),
        ("RaftNode01", 2, "FOLLOWER"),
        ("RaftNode01", 3, "FOLLOWER"),
    ]


def test_cluster_list_shows_a_replica_that_fails_its_status(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    cluster.group("RaftNode01").errors["h_status"] = (503, "SHUTTING_DOWN")
    r = mqadmin("clusterList", "--json")
    assert r.rc == 0
    errors = {b["broker_name"]: b["error"] for b in r.json()["brokers"]}
    assert errors == {"RaftNode00": None, "RaftNode01": "SHUTTING_DOWN"}
    assert "SHUTTING_DOWN" in mqadmin("clusterList").out


def test_topic_list_and_route(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    seed(cluster)
    cluster.call(lambda: cluster.group("RaftNode00").create_topic("T0", 8, 8, 4))
    r = mqadmin("topicList")
    assert (r.rc, r.out.split()) == (0, ["T0", "T1"])
    assert mqadmin("topicList", "--json").json() == {"topics": ["T0", "T1"]}
    assert mqadmin("--json", "topicList").json() == {"topics": ["T0", "T1"]}

    r = mqadmin("topicRoute", "-t", "T0")
    assert r.rc == 0
    assert "#Broker Name  #Read Queues  #Write Queues  #Perm" in r.out
    assert "RaftNode00    8             8              R-- (4)" in r.out
    route = mqadmin("topicRoute", "-t", "T1", "--json").json()
    assert [q["broker_name"] for q in route["queue_datas"]] == ["RaftNode00", "RaftNode01"]
    addrs = cluster.group("RaftNode00").addrs
    assert route["broker_datas"][0]["broker_addrs"] == {"0": addrs[0], "2": addrs[1], "3": addrs[2]}


def test_an_answer_of_the_wrong_shape_exits_1_without_traceback(
    mqadmin: Mqadmin, cluster: FakeCluster
) -> None:
    seed(cluster)
    cluster.group("RaftNode01").garbage.update({"h_topic_status", "h_status"})
    r = mqadmin("topicStatus", "-t", "T1")
    assert r.rc == 1 and "BAD_ANSWER" in r.err and "Traceback" not in r.err
    r = mqadmin("clusterList", "--json")
    assert r.rc == 0 and {b["error"] for b in r.json()["brokers"]} == {None, "BAD_ANSWER"}


def test_unknown_topic_exits_1_with_the_code(mqadmin: Mqadmin) -> None:
    r = mqadmin("topicRoute", "-t", "Nope")
    assert r.rc == 1 and "TOPIC_NOT_EXIST" in r.err and "Traceback" not in r.err
    r = mqadmin("topicStatus", "-t", "Nope", "--json")
    assert r.rc == 1 and r.json()["code"] == "TOPIC_NOT_EXIST"


# -- topics ---------------------------------------------------------------------------------------
def test_update_topic_on_every_group_of_a_cluster(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    r = mqadmin("updateTopic", "-t", "Orders", "-c", CLUSTER, "-r", "8", "-w", "6", "-p", "6", "-o", "true")
    assert r.rc == 0, r.err
    assert header(r.out)[:4] == ["#Target", "#Name", "#Addr", "#Result"]
    assert len(r.out.splitlines()) == 3
    for g in cluster.groups:
        assert g.topics["Orders"] == {
            "topic": "Orders",
            "read_queue_nums": 8,
            "write_queue_nums": 6,
            "perm": 6,
            "order": True,
        }
        assert [(i, m) for i, m, p in g.requests if p == "/v1/topics"] == [(0, "POST")]  # the leaders only
    data = mqadmin("updateTopic", "-t", "Orders", "-c", CLUSTER, "--json").json()
    assert [(x["name"], x["ok"], x["answer"]["read_queue_nums"]) for x in data["results"]] == [
        ("RaftNode00", True, 4),
        ("RaftNode01", True, 4),
    ]


def test_update_topic_on_one_broker(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    g1 = cluster.group("RaftNode01")
    r = mqadmin("updateTopic", "-t", "Solo", "-b", g1.addrs[0], "--json")
    assert r.rc == 0
    assert "Solo" in g1.topics and "Solo" not in cluster.group("RaftNode00").topics


def test_update_topic_on_an_unknown_cluster_exits_1(mqadmin: Mqadmin) -> None:
    r = mqadmin("updateTopic", "-t", "T", "-c", "NoSuchCluster")
    assert r.rc == 1 and "CLUSTER_NOT_EXIST" in r.err


def test_not_leader_is_followed_once(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    g0 = cluster.group("RaftNode00")
    g0.advertised_leader = 1  # the NameServer's route is stale: it still names n1
    r = mqadmin("updateTopic", "-t", "Moved", "-c", CLUSTER)
    assert r.rc == 0, r.err
    assert [(i, p) for i, _, p in g0.requests if p == "/v1/topics"] == [(1, "/v1/topics"), (0, "/v1/topics")]
    assert "Moved" in g0.topics
    row = next(line.split() for line in r.out.splitlines() if "RaftNode00" in line)
    assert row[2:4] == [g0.addrs[0], "OK"]  # the row names where it landed


def test_a_dead_leader_in_a_stale_route_is_skipped(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    g0 = cluster.group("RaftNode00")
    g0.addrs[0] = f"127.0.0.1:{closed_port()}"  # n0 died; n1 took over; the route still names n0
    g0.leader, g0.advertised_leader = 1, 0
    r = mqadmin("updateSubGroup", "-g", "G1", "-c", CLUSTER)
    assert r.rc == 0, r.err
    assert "G1" in g0.groups
    assert [i for i, _, p in g0.requests if p == "/v1/groups"] == [1]


def test_not_leader_is_not_followed_twice(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    g0 = cluster.group("RaftNode00")
    g0.advertised_leader = 1
    g0.claims = {1: 2, 2: 1}  # n1 and n2 name each other
    r = mqadmin("updateTopic", "-t", "Lost", "-c", CLUSTER)
    assert r.rc == 1
    assert "NOT_LEADER" in r.err and "1 of 2 targets failed" in r.err
    assert [i for i, _, p in g0.requests if p == "/v1/topics"] == [1, 2]
    assert "NOT_LEADER" in r.out and "RaftNode01" in r.out  # the per-target table shows both outcomes
    assert "Lost" in cluster.group("RaftNode01").topics


def test_no_leader_known_exits_1_with_not_leader(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    g0 = cluster.group("RaftNode00")
    g0.leader = None  # an election is running: nobody is leader, nobody knows one
    r = mqadmin("updateTopic", "-t", "T", "-c", CLUSTER, "--json")
    assert r.rc == 1
    body = r.json()
    assert body["code"] == "NOT_LEADER"
    assert [(x["name"], x["ok"]) for x in body["results"]] == [("RaftNode00", False), ("RaftNode01", True)]


def test_delete_topic_on_brokers_then_every_namesrv(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeCluster(namesrvs=2) as cluster:
        seed(cluster)
        assert main(["deleteTopic", "-t", "T1", "-c", CLUSTER, "-n", cluster.namesrv]) == 0
        out = capsys.readouterr().out
        assert len(out.splitlines()) == 5  # header, 2 brokers, 2 NameServers
        deletes = [who for who, method, _ in cluster.sequence if method == "DELETE"]
        assert sorted(deletes[:2]) == ["RaftNode00", "RaftNode01"]  # the brokers first
        assert sorted(deletes[2:]) == sorted(ns.addr for ns in cluster.namesrvs)
        assert all("T1" not in g.topics for g in cluster.groups)
        assert main(["topicRoute", "-t", "T1", "-n", cluster.namesrv]) == 1
        assert main(["deleteTopic", "-t", "T1", "-c", CLUSTER, "-n", cluster.namesrv]) == 1
        assert "TOPIC_NOT_EXIST" in capsys.readouterr().err


def test_delete_topic_json_and_partial_failure(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    seed(cluster)
    cluster.call(lambda: cluster.group("RaftNode00").create_topic("T2"))
    data = mqadmin("deleteTopic", "-t", "T2", "-c", CLUSTER, "--json").json()
    assert [(x["target"], x["code"]) for x in data["results"]] == [
        ("broker", "OK"),
        ("broker", "NOT_EXIST"),
        ("namesrv", "OK"),
    ]
    cluster.group("RaftNode01").errors["h_topic_delete"] = (503, "NOT_READY")
    r = mqadmin("deleteTopic", "-t", "T1", "-c", CLUSTER)
    assert r.rc == 1 and "NOT_READY" in r.err
    assert "RaftNode00" in r.out and "NOT_READY" in r.out


def test_topic_status(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    seed(cluster)
    r = mqadmin("topicStatus", "-t", "T1")
    assert r.rc == 0
    lines = r.out.splitlines()
    assert lines[0] == "#Broker Name  #QID  #Min Offset  #Max Offset  #Last Updated"
    assert len(lines) == 9
    assert lines[1].split()[:4] == ["RaftNode00", "0", "0", "2"]
    data = mqadmin("topicStatus", "-t", "T1", "--json").json()
    assert [(q["broker_name"], q["queue_id"], q["max_offset"]) for q in data["queues"]][3:6] == [
        ("RaftNode00", 3, 2),
        ("RaftNode01", 0, 1),
        ("RaftNode01", 1, 1),
    ]
    assert data["queues"][0]["last_store_ts"] == 1_700_000_000_004


# -- groups and offsets ---------------------------------------------------------------------------
def test_update_sub_group(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    r = mqadmin("updateSubGroup", "-g", "G1", "-c", CLUSTER, "-d", "false", "-r", "3")
    assert r.rc == 0, r.err
    assert "#Retry Max Times" in r.out
    for g in cluster.groups:
        assert g.groups["G1"] == {
            "group": "G1",
            "consume_enable": True,
            "consume_broadcast_enable": False,
            "retry_max_times": 3,
        }
    data = mqadmin("updateSubGroup", "-g", "G2", "-b", cluster.group("RaftNode00").addrs[0], "--json").json()
    assert data["results"][0]["answer"]["group"] == "G2"


def commit(cluster: FakeCluster, group: str, topic: str, offsets: dict[str, dict[int, int]]) -> None:
    def run() -> None:
        for name, offs in offsets.items():
            cluster.group(name).offsets[(group, topic)] = dict(offs)

    cluster.call(run)


def test_consumer_progress(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    seed(cluster)
    commit(cluster, "G1", "T1", {"RaftNode00": {0: 1, 1: 2}, "RaftNode01": {0: 1}})
    r = mqadmin("consumerProgress", "-g", "G1")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert lines[0] == "#Topic  #Broker Name  #QID  #Broker Offset  #Consumer Offset  #Diff  #LastTime"
    assert lines[1].split()[:6] == ["T1", "RaftNode00", "0", "2", "1", "1"]
    assert lines[3].split()[:6] == ["T1", "RaftNode00", "2", "2", "-", "2"]
    assert lines[-1] == "Diff Total: 6"
    data = mqadmin("consumerProgress", "-g", "G1", "-t", "T1", "--json").json()
    assert data["total_lag"] == 6 and len(data["queues"]) == 8


def test_consumer_progress_of_an_unknown_group_exits_1(mqadmin: Mqadmin) -> None:
    r = mqadmin("consumerProgress", "-g", "Nobody")
    assert r.rc == 1 and "SUBSCRIPTION_GROUP_NOT_EXIST" in r.err


def test_consumer_progress_on_one_group_only(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    seed(cluster)
    commit(cluster, "G1", "T1", {"RaftNode01": {0: 1, 1: 1}})  # RaftNode00 never saw G1: 404 there
    data = mqadmin("consumerProgress", "-g", "G1", "--json").json()
    assert {q["broker_name"] for q in data["queues"]} == {"RaftNode01"} and data["total_lag"] == 0


def test_reset_offset_by_time(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    seed(cluster)
    r = mqadmin("resetOffsetByTime", "-g", "G1", "-t", "T1", "-s", str(1_700_000_000_004))
    assert r.rc == 0, r.err
    assert r.out.splitlines()[0] == "#Broker Name  #QID  #Offset"
    assert cluster.group("RaftNode00").offsets[("G1", "T1")] == {0: 1, 1: 1, 2: 1, 3: 1}
    assert cluster.group("RaftNode01").offsets[("G1", "T1")] == {0: 0, 1: 0, 2: 0, 3: 0}  # all stored later
    stamp = datetime.datetime.fromtimestamp(1_700_000_000).strftime("%Y-%m-%d#%H:%M:%S:000")
    data = mqadmin("resetOffsetByTime", "-g", "G1", "-t", "T1", "-s", stamp, "--json").json()
    assert data["ts"] == 1_700_000_000_000
    assert [o["offset"] for o in data["offsets"]][:4] == [0, 0, 0, 0]
    data = mqadmin("resetOffsetByTime", "-g", "G1", "-t", "T1", "-s", "now", "--json").json()
    assert [o["offset"] for o in data["offsets"]][:4] == [2, 2, 2, 2]


# -- brokers --------------------------------------------------------------------------------------
def test_broker_status(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    addr = cluster.group("RaftNode00").addrs[1]
    r = mqadmin("brokerStatus", "-b", addr)
    assert r.rc == 0
    assert "role:" in r.out and "FOLLOWER" in r.out and "peers.n0.lag:" in r.out
    assert mqadmin("brokerStatus", "-b", addr, "--json").json()["self_id"] == "n1"
    r = mqadmin("brokerStatus", "-b", f"127.0.0.1:{closed_port()}")
    assert r.rc == 1 and "CONNECT_FAILED" in r.err


def test_transfer_leader(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    r = mqadmin("transferLeader", "-m", "RaftNode00", "-i", "n2")
    assert r.rc == 0, r.err
    assert r.out.splitlines() == ["#Broker Name  #New Leader", "RaftNode00    n2"]
    assert cluster.group("RaftNode00").leader == 2
    assert mqadmin("transferLeader", "-m", "RaftNode01", "--json").json()["leader_id"] == "n1"
    r = mqadmin("transferLeader", "-m", "RaftNode09")
    assert r.rc == 1 and "BROKER_NOT_EXIST" in r.err
    r = mqadmin("transferLeader", "-m", "RaftNode00", "-i", "n7")
    assert r.rc == 1 and "INVALID_TARGET" in r.err


# -- messages -------------------------------------------------------------------------------------
def test_query_msg_by_id(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    msgs = seed(cluster)
    m = msgs[9]  # on RaftNode01: the broker name in the id picks the group
    r = mqadmin("queryMsgById", "-i", m["msg_id"])
    assert r.rc == 0, r.err
    assert f"OffsetID:            {m['msg_id']}" in r.out
    assert "Body:                other 1" in r.out and "Keys:                [shared]" in r.out
    data = mqadmin("queryMsgById", "-i", m["msg_id"], "--json").json()
    assert data["body_b64"] == "b3RoZXIgMQ==" and data["broker_name"] == "RaftNode01"
    assert data["unique_id"] == m["unique_id"]
    r = mqadmin("queryMsgById", "-i", "RaftNode07:0000000000000000")
    assert r.rc == 1 and "BROKER_NOT_EXIST" in r.err
    r = mqadmin("queryMsgById", "-i", "RaftNode00:00000000000FFFFF")
    assert r.rc == 1 and "MESSAGE_NOT_FOUND" in r.err


def test_query_msg_by_id_reads_a_follower_when_the_leader_is_down(
    mqadmin: Mqadmin, cluster: FakeCluster
) -> None:
    msgs = seed(cluster)
    g0 = cluster.group("RaftNode00")
    dead = f"127.0.0.1:{closed_port()}"
    g0.addrs[0] = dead  # the leader's address no longer answers
    r = mqadmin("queryMsgById", "-i", msgs[0]["msg_id"], "--json")
    assert r.rc == 0, r.err
    assert r.json()["msg_id"] == msgs[0]["msg_id"]
    assert [i for i, _, p in g0.requests if p.startswith("/v1/msg/id/")] == [1]


def test_query_msg_by_key(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    seed(cluster)
    r = mqadmin("queryMsgByKey", "-t", "T1", "-k", "k3")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert header(r.out)[:5] == ["#Broker", "Name", "#QID", "#Offset", "#Message"]
    assert len(lines) == 2 and "body 3" in lines[1]
    data = mqadmin("queryMsgByKey", "-t", "T1", "-k", "shared", "--json").json()
    assert [m["store_ts"] for m in data["messages"]][:3] == [
        1_700_000_001_001,
        1_700_000_001_000,
        1_700_000_000_007,
    ]
    assert len(data["messages"]) == 10
    data = mqadmin("queryMsgByKey", "-t", "T1", "-k", "shared", "-c", "4", "--json").json()
    assert len(data["messages"]) == 4
    assert mqadmin("queryMsgByKey", "-t", "T1", "-k", "nothing").out.splitlines()[1:] == []


def test_query_msg_by_unique_key(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    msgs = seed(cluster)
    uid = msgs[2]["unique_id"]
    r = mqadmin("queryMsgByUniqueKey", "-t", "T1", "-u", uid)
    assert r.rc == 0 and f"Unique Key:          {uid}" in r.out
    assert (
        mqadmin("queryMsgByUniqueKey", "-t", "T1", "-u", uid, "--json").json()["messages"][0]["queue_id"] == 2
    )
    r = mqadmin("queryMsgByUniqueKey", "-t", "T1", "-u", "0" * 32)
    assert r.rc == 1 and "MESSAGE_NOT_FOUND" in r.err


def test_query_msg_by_offset(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    seed(cluster)
    r = mqadmin("queryMsgByOffset", "-t", "T1", "-m", "RaftNode00", "-q", "1", "-o", "1")
    assert r.rc == 0, r.err
    assert "Queue Offset:        1" in r.out and "Body:                body 5" in r.out
    data = mqadmin("queryMsgByOffset", "-t", "T1", "-m", "RaftNode01", "-q", "0", "-o", "0", "--json").json()
    assert data["body_b64"] == "b3RoZXIgMA=="
    r = mqadmin("queryMsgByOffset", "-t", "T1", "-m", "RaftNode00", "-q", "1", "-o", "99")
    assert r.rc == 1 and "MESSAGE_NOT_FOUND" in r.err
    r = mqadmin("queryMsgByOffset", "-t", "T1", "-m", "RaftNode05", "-q", "1", "-o", "0")
    assert r.rc == 1 and "BROKER_NOT_EXIST" in r.err


def test_consume_message(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    seed(cluster)
    r = mqadmin("consumeMessage", "-t", "T1", "-c", "3")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].startswith("#Broker Name  #QID  #Offset  #Message ID")
    assert [line.split()[:3] for line in lines[1:4]] == [
        ["RaftNode00", "0", "0"],
        ["RaftNode00", "0", "1"],
        ["RaftNode00", "1", "0"],
    ]
    assert lines[-1] == "Consumed: 3"
    data = mqadmin("consumeMessage", "-t", "T1", "--json").json()
    assert len(data["messages"]) == 10
    data = mqadmin("consumeMessage", "-t", "T1", "-m", "RaftNode00", "-q", "2", "-s", "1", "--json").json()
    assert [(m["queue_id"], m["queue_offset"], m["body_b64"]) for m in data["messages"]] == [
        (2, 1, "Ym9keSA2")
    ]
    data = mqadmin("consumeMessage", "-t", "T1", "-m", "RaftNode00", "-q", "0", "-e", "1", "--json").json()
    assert [m["queue_offset"] for m in data["messages"]] == [0]
    # a read: nothing committed for the group
    assert mqadmin("consumeMessage", "-t", "T1", "-g", "G9", "-c", "1").rc == 0
    assert all(("G9", "T1") not in g.offsets for g in cluster.groups)


def _producer_sdk() -> Any:
    import broker.client

    return broker.client


def test_send_message_with_the_real_producer(mqadmin: Mqadmin, cluster: FakeCluster) -> None:
    sdk = _producer_sdk()
    assert sdk.Producer
    seed(cluster)
    r = mqadmin("sendMessage", "-t", "T1", "-p", "hello world", "-k", "a b", "-c", "TagA")
    assert r.rc == 0, r.err
    assert header(r.out)[:6] == ["#Broker", "Name", "#QID", "#Send", "Result", "#MsgId"]
    assert "SEND_OK" in r.out
    stored = [m for g in cluster.groups for q in g.queues.values() for m in q if m["body"] == b"hello world"]
    assert len(stored) == 1
    assert stored[0]["keys"] == ["a", "b"] and stored[0]["tags"] == "TagA"
    data = mqadmin("sendMessage", "-t", "T1", "-p", "to q2", "-m", "RaftNode01", "-q", "2", "--json").json()
    assert (data["status"], data["broker_name"], data["queue_id"]) == ("SEND_OK", "RaftNode01", 2)
    assert cluster.group("RaftNode01").queue("T1", 2)[-1]["body"] == b"to q2"
    r = mqadmin("sendMessage", "-t", "T1", "-p", "x", "-m", "RaftNode01")
    assert r.rc == 2 and "-q" in r.err
