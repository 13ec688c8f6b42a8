"""``mqadmin``: every command's table and ``--json`` output against real broker groups on the
in-process log (``tests/broker/inproc_cluster.py``), and the exit codes (0 ok, 1 the cluster
answered an error or is unreachable, 2 bad usage or input).

Stale routes, dead leaders and leaderless groups are produced for real (registrations refused at the
NameServer, replicas killed, Raft links cut); answers no real broker gives on demand (BUSY, NOT_READY,
a wrong shape, two replicas naming each other) come from the replica's ``Tap``."""

from __future__ import annotations

import asyncio
import base64
import datetime
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from broker.tools.mqadmin import main
from broker.tools.mqadmin_format import format_table, parse_timestamp, to_jsonable
from tests.broker.inproc_cluster import WAIT_S, Group, InProcBrokerCluster
from tests.broker.tools.conftest import ClusterFactory, Mqadmin
from tests.dledger.harness import wait_until

CLUSTER = "DefaultCluster"
BOTH = ["RaftNode00", "RaftNode01"]


async def after_ms(ms: int) -> None:
    """Until the wall clock (which stamps stored messages) has passed ``ms``."""
    await wait_until(lambda: time.time_ns() // 1_000_000 > ms, WAIT_S, f"the wall clock to pass {ms}")


async def seed(cluster: InProcBrokerCluster, topic: str = "T1", n: int = 8) -> list[dict[str, Any]]:
    """``topic`` on both groups; ``n`` messages on RaftNode00 (queue i % 4, key k<i>, tag A/B) and two
    on RaftNode01, each sent at a later millisecond than the one before. Returns the stored
    messages (as a pull answers them) in the order sent."""
    await cluster.create_topic(topic, 4)
    g0, g1 = cluster.group("RaftNode00"), cluster.group("RaftNode01")
    sent: list[tuple[Group, int, int]] = []
    last_ts = 0
    plan = [(g0, i % 4, f"body {i}", "AB"[i % 2], [f"k{i}", "shared"]) for i in range(n)]
    plan += [(g1, i, f"other {i}", "", ["shared"]) for i in range(2)]
    for g, qid, body, tags, keys in plan:
        await after_ms(last_ts)
        (result,) = await g.put(topic, qid, 1, body=body.encode(), tags=tags, keys=keys)
        sent.append((g, qid, result["queue_offset"]))
        last_ts = (await g.messages(topic, qid))[result["queue_offset"]]["store_ts"]
    return [(await g.messages(topic, qid))[offset] for g, qid, offset in sent]


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
        (["consumeMessage", "-t", "T", "--sql", "a > 'x'"], "SUBSCRIPTION_PARSE_FAILED"),
    ],
)
async def test_invalid_input_exits_2_before_any_request(
    mqadmin: Mqadmin, cluster: InProcBrokerCluster, argv: list[str], code: str
) -> None:
    mark = len(cluster.journal)
    r = await mqadmin(*argv)
    assert r.rc == 2, r
    assert code in r.err and "Traceback" not in r.err
    assert cluster.client_requests(mark) == []  # no broker, no NameServer was asked anything


async def test_bad_namesrv_list_exits_2(mqadmin: Mqadmin) -> None:
    r = await mqadmin("topicList", "-n", "not-an-address")
    assert r.rc == 2 and "INVALID_ADDRESS" in r.err


async def test_unreachable_namesrv_exits_1_naming_the_code(mqadmin: Mqadmin) -> None:
    r = await mqadmin("clusterList", "-n", f"127.0.0.1:{closed_port()}")
    assert r.rc == 1 and "CONNECT_FAILED" in r.err and "Traceback" not in r.err
    r = await mqadmin("topicList", "--json", "-n", f"127.0.0.1:{closed_port()}")
    assert r.rc == 1 and r.json()["code"] == "CONNECT_FAILED"


async def test_namesrv_addr_env_is_the_default(
    cluster: InProcBrokerCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    await seed(cluster)
    monkeypatch.setenv("NAMESRV_ADDR", cluster.namesrv_addr)
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["topicList"]) == 0
    assert capsys.readouterr().out.split() == ["T1", "TBW102"]


# -- NameServer views -----------------------------------------------------------------------------
async def test_namesrv_option_before_the_command(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    """Issue 28, papercut 5: ``mqadmin -n ADDR clusterList``, as RocketMQ users type it."""
    before = await mqadmin("-n", cluster.namesrv_addr, "clusterList", "--json")
    assert before.rc == 0, before.err
    after = await mqadmin("clusterList", "--json")
    assert {r["broker_name"] for r in before.json()["brokers"]} == {r["broker_name"] for r in after.json()["brokers"]}
    # after the command it wins (a script that adds -n at the end overrides a shell alias's)
    r = await mqadmin("-n", "127.0.0.1:1", "clusterList", "-n", cluster.namesrv_addr)
    assert r.rc == 0, r.err


def test_a_simple_command_imports_neither_the_whole_sdk_nor_aiohttp() -> None:
    """Issue 28, papercut 6: mqadmin imported aiohttp, the SQL92 compiler and every producer and
    consumer module (~0.75 s of CPU a call). What a command loads is what its run needs."""
    code = (
        "import sys\n"
        "from broker.tools.mqadmin_commands import build_parser, runner\n"
        "args = build_parser().parse_args(['clusterList', '-n', '127.0.0.1:1'])\n"
        "runner(args.runner)\n"
        "import broker.client.admin\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    for heavy in ("aiohttp", "lark", "prometheus_client", "broker.client.producer", "broker.client.push_consumer",
                  "broker.client.pull_consumer", "broker.protocol.sql_filter", "broker.tools.mqadmin_ops"):
        assert heavy not in out, f"{heavy} imported by a simple mqadmin command"
    import broker.client

    for name in broker.client.__all__:  # every name of the SDK still resolves (imported on first use)
        assert getattr(broker.client, name) is not None


async def test_cluster_list(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    r = await mqadmin("clusterList")
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
    n0 = cluster.group("RaftNode00").replicas[0]
    row = next(line.split() for line in lines if n0.addr in line)
    assert row[:7] == [CLUSTER, "RaftNode00", "0", n0.addr, "LEADER", str(n0.broker.node.term), "n0"]

    data = (await mqadmin("clusterList", "--json")).json()
    assert [(b["broker_name"], b["broker_id"], b["role"], b["self_id"]) for b in data["brokers"]] == [
        ("RaftNode00", 0, "LEADER", "n0"),
        ("RaftNode00", 2, "FOLLOWER", "n1"),
        ("RaftNode00", 3, "FOLLOWER", "n2"),
        ("RaftNode01", 0, "LEADER", "n0"),
        ("RaftNode01", 2, "FOLLOWER", "n1"),
        ("RaftNode01", 3, "FOLLOWER", "n2"),
    ]


async def test_cluster_list_shows_a_replica_that_fails_its_status(
    mqadmin: Mqadmin, cluster: InProcBrokerCluster
) -> None:
    for rep in cluster.group("RaftNode01").replicas:
        rep.tap.fail("/v1/status", "SHUTTING_DOWN", 503, times=100)
    r = await mqadmin("clusterList", "--json")
    assert r.rc == 0
    errors = {b["broker_name"]: b["error"] for b in r.json()["brokers"]}
    assert errors == {"RaftNode00": None, "RaftNode01": "SHUTTING_DOWN"}
    assert "SHUTTING_DOWN" in (await mqadmin("clusterList")).out


async def test_topic_list_and_route(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    await seed(cluster)
    await cluster.create_topic("T0", 8, perm=4, groups=["RaftNode00"])
    r = await mqadmin("topicList")
    assert (r.rc, r.out.split()) == (0, ["T0", "T1", "TBW102"])
    assert (await mqadmin("topicList", "--json")).json() == {"topics": ["T0", "T1", "TBW102"]}
    assert (await mqadmin("--json", "topicList")).json() == {"topics": ["T0", "T1", "TBW102"]}

    r = await mqadmin("topicRoute", "-t", "T0")
    assert r.rc == 0
    assert "#Broker Name  #Read Queues  #Write Queues  #Perm" in r.out
    assert "RaftNode00    8             8              R-- (4)" in r.out
    route = (await mqadmin("topicRoute", "-t", "T1", "--json")).json()
    assert [q["broker_name"] for q in route["queue_datas"]] == ["RaftNode00", "RaftNode01"]
    addrs = [r.addr for r in cluster.group("RaftNode00").replicas]
    assert route["broker_datas"][0]["broker_addrs"] == {"0": addrs[0], "2": addrs[1], "3": addrs[2]}


async def test_an_answer_of_the_wrong_shape_exits_1_without_traceback(
    mqadmin: Mqadmin, cluster: InProcBrokerCluster
) -> None:
    await seed(cluster)
    for rep in cluster.group("RaftNode01").replicas:
        rep.tap.garbage("/v1/topics/T1/status")
        rep.tap.garbage("/v1/status")
    r = await mqadmin("topicStatus", "-t", "T1")
    assert r.rc == 1 and "BAD_ANSWER" in r.err and "Traceback" not in r.err
    r = await mqadmin("clusterList", "--json")
    assert r.rc == 0 and {b["error"] for b in r.json()["brokers"]} == {None, "BAD_ANSWER"}


async def test_unknown_topic_exits_1_with_the_code(mqadmin: Mqadmin) -> None:
    r = await mqadmin("topicRoute", "-t", "Nope")
    assert r.rc == 1 and "TOPIC_NOT_EXIST" in r.err and "Traceback" not in r.err
    r = await mqadmin("topicStatus", "-t", "Nope", "--json")
    assert r.rc == 1 and r.json()["code"] == "TOPIC_NOT_EXIST"


# -- topics ---------------------------------------------------------------------------------------
async def test_update_topic_on_every_group_of_a_cluster(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    r = await mqadmin("updateTopic", "-t", "Orders", "-c", CLUSTER, "-r", "8", "-w", "6", "-p", "6", "-o", "true")
    assert r.rc == 0, r.err
    assert header(r.out)[:4] == ["#Target", "#Name", "#Addr", "#Result"]
    assert len(r.out.splitlines()) == 3
    for g in cluster.groups:
        assert g.topic_config("Orders") == {
            "topic": "Orders",
            "read_queue_nums": 8,
            "write_queue_nums": 6,
            "perm": 6,
            "order": True,
        }
        assert [(i, s.method) for i, s in g.requests("/v1/topics")] == [(0, "POST")]  # the leaders only
    data = (await mqadmin("updateTopic", "-t", "Orders", "-c", CLUSTER, "--json")).json()
    assert [(x["name"], x["ok"], x["answer"]["read_queue_nums"]) for x in data["results"]] == [
        ("RaftNode00", True, 4),
        ("RaftNode01", True, 4),
    ]
    await cluster.wait_route("Orders", BOTH, 4)  # every NameServer hears of it from the leaders


async def test_update_topic_on_one_broker(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    g1 = cluster.group("RaftNode01")
    r = await mqadmin("updateTopic", "-t", "Solo", "-b", g1.replicas[0].addr, "--json")
    assert r.rc == 0
    assert "Solo" in g1.topics() and "Solo" not in cluster.group("RaftNode00").topics()


async def test_update_topic_on_an_unknown_cluster_exits_1(mqadmin: Mqadmin) -> None:
    r = await mqadmin("updateTopic", "-t", "T", "-c", "NoSuchCluster")
    assert r.rc == 1 and "CLUSTER_NOT_EXIST" in r.err


async def test_not_leader_is_followed_once(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    g0 = cluster.group("RaftNode00")
    for ns in cluster.namesrvs:
        ns.refuse_registrations("RaftNode00")
    await g0.transfer("n1", registered=False)  # the NameServer's route is stale: it still names n0
    r = await mqadmin("updateTopic", "-t", "Moved", "-c", CLUSTER)
    assert r.rc == 0, r.err
    assert [(i, s.path) for i, s in g0.requests("/v1/topics")] == [(0, "/v1/topics"), (1, "/v1/topics")]
    assert "Moved" in g0.topics()
    row = next(line.split() for line in r.out.splitlines() if "RaftNode00" in line)
    assert row[2:4] == [g0.replicas[1].addr, "OK"]  # the row names where it landed


async def test_a_dead_leader_in_a_stale_route_is_skipped(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    g0 = cluster.group("RaftNode00")
    for ns in cluster.namesrvs:  # n0 dies; n1 takes over; the route still names n0
        ns.refuse_registrations("RaftNode00")
    await g0.kill("n0")
    await g0.transfer("n1", registered=False)
    r = await mqadmin("updateSubGroup", "-g", "G1", "-c", CLUSTER)
    assert r.rc == 0, r.err
    assert "G1" in g0.subscription_groups()
    assert [i for i, _ in g0.requests("/v1/groups")] == [1]


async def test_not_leader_is_not_followed_twice(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    g0 = cluster.group("RaftNode00")
    n0, n1 = g0.replicas[0], g0.replicas[1]
    # n0 and n1 name each other (views no real group holds on demand)
    n0.tap.fail("/v1/topics", "NOT_LEADER", 409, method="POST", leader_addr=n1.addr)
    n1.tap.fail("/v1/topics", "NOT_LEADER", 409, method="POST", leader_addr=n0.addr)
    r = await mqadmin("updateTopic", "-t", "Lost", "-c", CLUSTER)
    assert r.rc == 1
    assert "NOT_LEADER" in r.err and "1 of 2 targets failed" in r.err
    assert [i for i, _ in g0.requests("/v1/topics")] == [0, 1]
    assert "NOT_LEADER" in r.out and "RaftNode01" in r.out  # the per-target table shows both outcomes
    assert "Lost" in cluster.group("RaftNode01").topics() and "Lost" not in g0.topics()


async def test_no_leader_known_exits_1_with_not_leader(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    g0 = cluster.group("RaftNode00")
    # what a replica answers while an election runs: nobody is leader, nobody knows one
    g0.replicas[0].tap.fail("/v1/topics", "NOT_LEADER", 409, method="POST", leader_addr=None)
    r = await mqadmin("updateTopic", "-t", "T", "-c", CLUSTER, "--json")
    assert r.rc == 1
    body = r.json()
    assert body["code"] == "NOT_LEADER"
    assert [(x["name"], x["ok"]) for x in body["results"]] == [("RaftNode00", False), ("RaftNode01", True)]
    assert "T" not in g0.topics()


async def test_delete_topic_on_brokers_then_every_namesrv(
    make_cluster: ClusterFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = await make_cluster(namesrvs=2)
    ns = cluster.namesrv_addr
    await seed(cluster)
    mark = len(cluster.journal)
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["deleteTopic", "-t", "T1", "-c", CLUSTER, "-n", ns]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 5  # header, 2 brokers, 2 NameServers
    deletes = [s.server for s in cluster.client_requests(mark) if s.method == "DELETE"]
    # A leader change on a busy machine (an election timeout is 300 ms) makes the tool follow a
    # NOT_LEADER answer to the new leader: one more broker DELETE, still before the NameServers'.
    brokers = [d for d in deletes if not d.startswith("namesrv")]
    assert deletes[: len(brokers)] == brokers and sorted(deletes[len(brokers) :]) == ["namesrv0", "namesrv1"]
    assert {d.split("/")[0] for d in brokers} == {"RaftNode00", "RaftNode01"}  # the brokers first
    assert all("T1" not in g.topics() for g in cluster.groups)
    assert await asyncio.to_thread(main, ["topicRoute", "-t", "T1", "-n", ns]) == 1
    assert await asyncio.to_thread(main, ["deleteTopic", "-t", "T1", "-c", CLUSTER, "-n", ns]) == 1
    assert "TOPIC_NOT_EXIST" in capsys.readouterr().err


async def test_delete_topic_json_and_partial_failure(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    await seed(cluster)
    await cluster.create_topic("T2", groups=["RaftNode00"])
    r = await mqadmin("deleteTopic", "-t", "T2", "-c", CLUSTER, "--json")
    assert r.rc == 0, r.err
    results = [(x["target"], x["code"], x["ok"]) for x in r.json()["results"]]
    assert results[:2] == [("broker", "OK", True), ("broker", "NOT_EXIST", True)]
    # The leader re-registers at once on the deletion, so the NameServer may have dropped the route
    # before its DELETE arrives: either answer is a success.
    assert results[2] in (("namesrv", "OK", True), ("namesrv", "NOT_EXIST", True))
    assert await cluster.route("T2") is None
    for rep in cluster.group("RaftNode01").replicas:
        rep.tap.fail("/v1/topics/T1", "NOT_READY", 503, method="DELETE", times=100)
    r = await mqadmin("deleteTopic", "-t", "T1", "-c", CLUSTER)
    assert r.rc == 1 and "NOT_READY" in r.err
    assert "RaftNode00" in r.out and "NOT_READY" in r.out
    assert "T1" not in cluster.group("RaftNode00").topics() and "T1" in cluster.group("RaftNode01").topics()


async def test_topic_status(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    msgs = await seed(cluster)
    r = await mqadmin("topicStatus", "-t", "T1")
    assert r.rc == 0
    lines = r.out.splitlines()
    assert lines[0] == "#Broker Name  #QID  #Min Offset  #Max Offset  #Last Updated"
    assert len(lines) == 9
    assert lines[1].split()[:4] == ["RaftNode00", "0", "0", "2"]
    data = (await mqadmin("topicStatus", "-t", "T1", "--json")).json()
    assert [(q["broker_name"], q["queue_id"], q["max_offset"]) for q in data["queues"]][3:6] == [
        ("RaftNode00", 3, 2),
        ("RaftNode01", 0, 1),
        ("RaftNode01", 1, 1),
    ]
    assert data["queues"][0]["last_store_ts"] == msgs[4]["store_ts"]  # queue 0 holds messages 0 and 4


# -- groups and offsets ---------------------------------------------------------------------------
async def test_update_sub_group(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    r = await mqadmin("updateSubGroup", "-g", "G1", "-c", CLUSTER, "-d", "false", "-r", "3")
    assert r.rc == 0, r.err
    assert "#Retry Max Times" in r.out
    for g in cluster.groups:
        assert g.subscription_groups()["G1"] == {
            "group": "G1",
            "consume_enable": True,
            "consume_broadcast_enable": False,
            "retry_max_times": 3,
        }
    addr = cluster.group("RaftNode00").replicas[0].addr
    data = (await mqadmin("updateSubGroup", "-g", "G2", "-b", addr, "--json")).json()
    assert data["results"][0]["answer"]["group"] == "G2"


async def commit(cluster: InProcBrokerCluster, group: str, topic: str, offsets: dict[str, dict[int, int]]) -> None:
    for name, offs in offsets.items():
        await cluster.group(name).commit_offsets(group, topic, offs)


async def test_consumer_progress(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    await seed(cluster)
    await commit(cluster, "G1", "T1", {"RaftNode00": {0: 1, 1: 2}, "RaftNode01": {0: 1}})
    r = await mqadmin("consumerProgress", "-g", "G1")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert lines[0] == "#Topic  #Broker Name  #QID  #Broker Offset  #Consumer Offset  #Diff  #LastTime"
    assert lines[1].split()[:6] == ["T1", "RaftNode00", "0", "2", "1", "1"]
    assert lines[3].split()[:6] == ["T1", "RaftNode00", "2", "2", "-", "2"]
    assert lines[-1] == "Diff Total: 6"
    data = (await mqadmin("consumerProgress", "-g", "G1", "-t", "T1", "--json")).json()
    assert data["total_lag"] == 6 and len(data["queues"]) == 8


async def test_consumer_progress_on_one_group_only(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    await seed(cluster)
    await commit(cluster, "G1", "T1", {"RaftNode01": {0: 1, 1: 1}})  # RaftNode00 never saw G1: 404 there
    data = (await mqadmin("consumerProgress", "-g", "G1", "--json")).json()
    assert {q["broker_name"] for q in data["queues"]} == {"RaftNode01"} and data["total_lag"] == 0


async def test_reset_offset_by_time(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    msgs = await seed(cluster)
    r = await mqadmin("resetOffsetByTime", "-g", "G1", "-t", "T1", "-s", str(msgs[4]["store_ts"]))
    assert r.rc == 0, r.err
    assert r.out.splitlines()[0] == "#Broker Name  #QID  #Offset"
    assert cluster.group("RaftNode00").offsets("G1", "T1") == {0: 1, 1: 1, 2: 1, 3: 1}
    assert cluster.group("RaftNode01").offsets("G1", "T1") == {0: 0, 1: 0, 2: 0, 3: 0}  # all stored later
    first_s = msgs[0]["store_ts"] // 1000  # a whole second no later than every message
    stamp = datetime.datetime.fromtimestamp(first_s).strftime("%Y-%m-%d#%H:%M:%S:000")
    data = (await mqadmin("resetOffsetByTime", "-g", "G1", "-t", "T1", "-s", stamp, "--json")).json()
    assert data["ts"] == first_s * 1000
    assert [o["offset"] for o in data["offsets"]][:4] == [0, 0, 0, 0]
    data = (await mqadmin("resetOffsetByTime", "-g", "G1", "-t", "T1", "-s", "now", "--json")).json()
    assert [o["offset"] for o in data["offsets"]][:4] == [2, 2, 2, 2]
    assert cluster.group("RaftNode00").offsets("G1", "T1") == {0: 2, 1: 2, 2: 2, 3: 2}


# -- brokers --------------------------------------------------------------------------------------
async def test_broker_status(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    addr = cluster.group("RaftNode00").replicas[1].addr
    r = await mqadmin("brokerStatus", "-b", addr)
    assert r.rc == 0
    assert "role:" in r.out and "FOLLOWER" in r.out and "peers.n0.lag:" in r.out
    assert (await mqadmin("brokerStatus", "-b", addr, "--json")).json()["self_id"] == "n1"
    r = await mqadmin("brokerStatus", "-b", f"127.0.0.1:{closed_port()}")
    assert r.rc == 1 and "CONNECT_FAILED" in r.err


async def test_transfer_leader(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    r = await mqadmin("transferLeader", "-m", "RaftNode00", "-i", "n2")
    assert r.rc == 0, r.err
    assert r.out.splitlines() == ["#Broker Name  #New Leader", "RaftNode00    n2"]
    await cluster.group("RaftNode00").wait_leader("n2")
    moved = (await mqadmin("transferLeader", "-m", "RaftNode01", "--json")).json()["leader_id"]
    assert moved in ("n1", "n2")  # the most caught-up follower
    await cluster.group("RaftNode01").wait_leader(moved)
    r = await mqadmin("transferLeader", "-m", "RaftNode09")
    assert r.rc == 1 and "BROKER_NOT_EXIST" in r.err
    r = await mqadmin("transferLeader", "-m", "RaftNode00", "-i", "n7")  # well formed, not a peer
    assert r.rc == 1 and "BAD_REQUEST" in r.err and "['n0', 'n1', 'n2']" in r.err
    r = await mqadmin("transferLeader", "-m", "RaftNode00", "-i", "n 7")  # malformed: refused before asking
    assert r.rc == 2 and "INVALID_TARGET" in r.err
    assert cluster.group("RaftNode00").leader() is cluster.group("RaftNode00").replicas[2]


# -- messages -------------------------------------------------------------------------------------
async def test_query_msg_by_id(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    msgs = await seed(cluster)
    m = msgs[9]  # on RaftNode01: the broker name in the id picks the group
    r = await mqadmin("queryMsgById", "-i", m["msg_id"])
    assert r.rc == 0, r.err
    assert f"OffsetID:            {m['msg_id']}" in r.out
    assert "Body:                other 1" in r.out and "Keys:                [shared]" in r.out
    data = (await mqadmin("queryMsgById", "-i", m["msg_id"], "--json")).json()
    assert data["body_b64"] == "b3RoZXIgMQ==" and data["broker_name"] == "RaftNode01"
    assert data["unique_id"] == m["unique_id"]
    r = await mqadmin("queryMsgById", "-i", "RaftNode07:0000000000000000")
    assert r.rc == 1 and "BROKER_NOT_EXIST" in r.err
    r = await mqadmin("queryMsgById", "-i", "RaftNode00:00000000000FFFFF")
    assert r.rc == 1 and "MESSAGE_NOT_FOUND" in r.err


async def test_query_msg_by_id_reads_a_follower_when_the_leader_is_down(
    mqadmin: Mqadmin, cluster: InProcBrokerCluster
) -> None:
    msgs = await seed(cluster)
    g0 = cluster.group("RaftNode00")
    await g0.wait_replicated()
    for ns in cluster.namesrvs:  # the route keeps naming n0, whose address no longer answers
        ns.refuse_registrations("RaftNode00")
    await g0.kill("n0")
    r = await mqadmin("queryMsgById", "-i", msgs[0]["msg_id"], "--json")
    assert r.rc == 0, r.err
    assert r.json()["msg_id"] == msgs[0]["msg_id"]
    assert [i for i, s in g0.requests("/v1/msg/id/" + msgs[0]["msg_id"])] == [1]


async def test_query_msg_by_key(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    msgs = await seed(cluster)
    r = await mqadmin("queryMsgByKey", "-t", "T1", "-k", "k3")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert header(r.out)[:5] == ["#Broker", "Name", "#QID", "#Offset", "#Message"]
    assert len(lines) == 2 and "body 3" in lines[1]
    data = (await mqadmin("queryMsgByKey", "-t", "T1", "-k", "shared", "--json")).json()
    assert [m["store_ts"] for m in data["messages"]][:3] == [m["store_ts"] for m in msgs[9:6:-1]]  # newest first
    assert len(data["messages"]) == 10
    data = (await mqadmin("queryMsgByKey", "-t", "T1", "-k", "shared", "-c", "4", "--json")).json()
    assert len(data["messages"]) == 4
    assert (await mqadmin("queryMsgByKey", "-t", "T1", "-k", "nothing")).out.splitlines()[1:] == []


async def test_query_msg_by_unique_key(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    msgs = await seed(cluster)
    uid = msgs[2]["unique_id"]
    r = await mqadmin("queryMsgByUniqueKey", "-t", "T1", "-u", uid)
    assert r.rc == 0 and f"Unique Key:          {uid}" in r.out
    data = (await mqadmin("queryMsgByUniqueKey", "-t", "T1", "-u", uid, "--json")).json()
    assert data["messages"][0]["queue_id"] == 2
    r = await mqadmin("queryMsgByUniqueKey", "-t", "T1", "-u", "0" * 32)
    assert r.rc == 1 and "MESSAGE_NOT_FOUND" in r.err


async def test_query_msg_by_offset(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    await seed(cluster)
    r = await mqadmin("queryMsgByOffset", "-t", "T1", "-m", "RaftNode00", "-q", "1", "-o", "1")
    assert r.rc == 0, r.err
    assert "Queue Offset:        1" in r.out and "Body:                body 5" in r.out
    data = (
        await mqadmin("queryMsgByOffset", "-t", "T1", "-m", "RaftNode01", "-q", "0", "-o", "0", "--json")
    ).json()
    assert data["body_b64"] == "b3RoZXIgMA=="
    r = await mqadmin("queryMsgByOffset", "-t", "T1", "-m", "RaftNode00", "-q", "1", "-o", "99")
    assert r.rc == 1 and "MESSAGE_NOT_FOUND" in r.err
    r = await mqadmin("queryMsgByOffset", "-t", "T1", "-m", "RaftNode05", "-q", "1", "-o", "0")
    assert r.rc == 1 and "BROKER_NOT_EXIST" in r.err


async def test_consume_message(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    await seed(cluster)
    r = await mqadmin("consumeMessage", "-t", "T1", "-c", "3")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].startswith("#Broker Name  #QID  #Offset  #Message ID")
    assert [line.split()[:3] for line in lines[1:4]] == [
        ["RaftNode00", "0", "0"],
        ["RaftNode00", "0", "1"],
        ["RaftNode00", "1", "0"],
    ]
    assert lines[-1] == "Consumed: 3"
    data = (await mqadmin("consumeMessage", "-t", "T1", "--json")).json()
    assert len(data["messages"]) == 10
    data = (
        await mqadmin("consumeMessage", "-t", "T1", "-m", "RaftNode00", "-q", "2", "-s", "1", "--json")
    ).json()
    assert [(m["queue_id"], m["queue_offset"], m["body_b64"]) for m in data["messages"]] == [
        (2, 1, "Ym9keSA2")
    ]
    data = (
        await mqadmin("consumeMessage", "-t", "T1", "-m", "RaftNode00", "-q", "0", "-e", "1", "--json")
    ).json()
    assert [m["queue_offset"] for m in data["messages"]] == [0]
    data = (await mqadmin("consumeMessage", "-t", "T1", "--sql", "TAGS = 'B' AND KEYS IS NOT NULL", "--json")).json()
    assert sorted(m["body_b64"] for m in data["messages"]) == sorted(
        base64.b64encode(f"body {i}".encode()).decode() for i in range(1, 8, 2)
    )  # filtered by the broker: the B-tagged half
    # a read: nothing committed for the group
    assert (await mqadmin("consumeMessage", "-t", "T1", "-g", "G9", "-c", "1")).rc == 0
    assert all(g.offsets("G9", "T1") == {} for g in cluster.groups)
    assert cluster.all_requests("/v1/offsets", "POST") == []


async def test_send_message_with_the_real_producer(mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    await seed(cluster)
    r = await mqadmin("sendMessage", "-t", "T1", "-p", "hello world", "-k", "a b", "-c", "TagA")
    assert r.rc == 0, r.err
    assert header(r.out)[:6] == ["#Broker", "Name", "#QID", "#Send", "Result", "#MsgId"]
    assert "SEND_OK" in r.out
    stored = [
        m for g in cluster.groups for q in range(4) for m in await g.messages("T1", q) if m["body"] == b"hello world"
    ]
    assert len(stored) == 1
    assert stored[0]["keys"] == ["a", "b"] and stored[0]["tags"] == "TagA"
    assert stored[0]["msg_id"] in r.out
    data = (await mqadmin("sendMessage", "-t", "T1", "-p", "to q2", "-m", "RaftNode01", "-q", "2", "--json")).json()
    assert (data["status"], data["broker_name"], data["queue_id"]) == ("SEND_OK", "RaftNode01", 2)
    assert (await cluster.group("RaftNode01").messages("T1", 2))[-1]["body"] == b"to q2"
    r = await mqadmin("sendMessage", "-t", "T1", "-p", "x", "-m", "RaftNode01")
    assert r.rc == 2 and "-q" in r.err
