"""``Admin`` as a library against real broker groups on the in-process log: typed results, argument
checks before any request, fan-out outcomes, transport ownership; and the command-line entry points
as processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from broker.client.admin import Admin
from broker.client.admin_checks import parse_msg_id
from broker.client.admin_records import FanOutError, InvalidArgument, QueueStatus
from broker.client.transport import ClientError, Transport
from tests.acl_fixtures import ADMIN
from tests.broker.inproc_cluster import InProcBrokerCluster

GROUPS = ["RaftNode00", "RaftNode01"]


def test_parse_msg_id() -> None:
    assert parse_msg_id("RaftNode00:00000000000A1B2C") == ("RaftNode00", 0xA1B2C)
    for bad in ("RaftNode00", "RaftNode00:123", "Raft Node:00000000000A1B2C", "R:00000000000A1B2G"):
        with pytest.raises(InvalidArgument) as info:
            parse_msg_id(bad)
        assert info.value.code == "INVALID_MSG_ID" and info.value.status == 0


def test_invalid_argument_is_a_client_error() -> None:
    with pytest.raises(ClientError) as info:
        Admin("not an address")
    assert isinstance(info.value, InvalidArgument) and info.value.code == "INVALID_ADDRESS"


async def test_update_topic_and_read_it_back(cluster: InProcBrokerCluster) -> None:
    async with Admin(cluster.namesrv_addr, credentials=ADMIN) as admin:
        outcomes = await admin.update_topic(
            "Orders", cluster="DefaultCluster", read_queue_nums=2, write_queue_nums=2
        )
        assert [(o.name, o.ok, o.code) for o in outcomes] == [
            ("RaftNode00", True, "OK"),
            ("RaftNode01", True, "OK"),
        ]
        await cluster.wait_route("Orders", GROUPS, 2)  # the leaders re-register at once
        assert await admin.topic_list() == ["Orders", "TBW102"]  # TBW102: auto-creation's template
        route = await admin.topic_route("Orders")
        assert [q.read_queue_nums for q in route.queue_datas] == [2, 2]
        status = await admin.topic_status("Orders")
        assert status[0] == QueueStatus("RaftNode00", 0, 0, 0, 0) and len(status) == 4


async def test_target_is_a_cluster_or_a_broker(cluster: InProcBrokerCluster) -> None:
    mark = len(cluster.journal)
    async with Admin(cluster.namesrv_addr, credentials=ADMIN) as admin:
        for kwargs in (
            {},
            {"cluster": "DefaultCluster", "broker_addr": cluster.group("RaftNode00").replicas[0].addr},
        ):
            with pytest.raises(InvalidArgument):
                await admin.update_topic("T", **kwargs)  # type: ignore[arg-type]
    assert cluster.client_requests(mark) == []


async def test_fan_out_error_carries_every_outcome(cluster: InProcBrokerCluster) -> None:
    for r in cluster.group("RaftNode01").replicas:
        r.tap.fail("/v1/groups", "BUSY", 429, method="POST", times=100)
    async with Admin(cluster.namesrv_addr, credentials=ADMIN) as admin:
        with pytest.raises(FanOutError) as info:
            await admin.update_sub_group("G1", cluster="DefaultCluster")
    err = info.value
    assert err.code == "BUSY" and err.status == 429
    assert [(o.name, o.ok, o.code) for o in err.outcomes] == [
        ("RaftNode00", True, "OK"),
        ("RaftNode01", False, "BUSY"),
    ]
    assert "G1" in cluster.group("RaftNode00").subscription_groups()  # the healthy group still got it
    assert "G1" not in cluster.group("RaftNode01").subscription_groups()


async def test_single_broker_write_failure_is_a_fan_out_error_too(cluster: InProcBrokerCluster) -> None:
    g0 = cluster.group("RaftNode00")
    n0, n1 = g0.replica("n0"), g0.replica("n1")
    g0.cut("n1", "n2")  # the survivors cannot elect anyone
    await g0.kill("n0")
    async with Admin(cluster.namesrv_addr, credentials=ADMIN) as admin:
        with pytest.raises(FanOutError) as info:
            await admin.update_topic("T", broker_addr=n1.addr)
    # n1 still names the leader it knew (an isolated follower keeps it): followed once, refused
    assert info.value.code == "CONNECT_FAILED" and len(info.value.outcomes) == 1
    assert info.value.outcomes[0].addr == n0.addr
    assert [i for i, _ in g0.requests("/v1/topics", "POST")] == [1]


async def test_reads_and_queries_return_typed_messages(cluster: InProcBrokerCluster) -> None:
    g0 = cluster.group("RaftNode00")
    await cluster.create_topic("T1", groups=["RaftNode00"])
    stored = [
        (await g0.put("T1", 1, 1, body=b"payload", tags="TagA", keys=["order-1"], properties={"a": "b"}))[0]
        for _ in range(3)
    ]
    async with Admin(cluster.namesrv_addr, credentials=ADMIN) as admin:
        m = await admin.query_msg_by_id(stored[1]["msg_id"])
        assert (m.body, m.tags, m.keys, m.properties, m.queue_offset) == (
            b"payload",
            "TagA",
            ("order-1",),
            {"a": "b"},
            1,
        )
        assert len(await admin.query_msg_by_key("T1", "order-1", max=2)) == 2
        assert (await admin.query_msg_by_unique_key("T1", stored[2]["unique_id"]))[0].position == stored[2][
            "position"
        ]
        pulled = await admin.pull("T1", "RaftNode00", 1, 1, max_count=5)
        assert pulled.status == "FOUND" and [x.queue_offset for x in pulled.messages] == [1, 2]
        assert (await admin.pull("T1", "RaftNode00", 1, 3)).status == "NO_NEW_MSG"


async def test_consumer_progress_typed(cluster: InProcBrokerCluster) -> None:
    g0 = cluster.group("RaftNode00")
    await cluster.create_topic("T1", groups=["RaftNode00"])
    await g0.put("T1", 0, 5)
    await g0.commit_offsets("G1", "T1", {0: 2})
    async with Admin(cluster.namesrv_addr, credentials=ADMIN) as admin:
        progress = await admin.consumer_progress("G1", "T1")
    assert progress.total_lag == 3 + 0 + 0 + 0
    q0 = progress.queues[0]
    assert (q0.broker_offset, q0.consumer_offset, q0.lag) == (5, 2, 3)
    assert progress.queues[1].consumer_offset is None


async def test_a_shared_transport_is_not_closed(cluster: InProcBrokerCluster) -> None:
    transport = Transport(credentials=ADMIN)
    try:
        async with Admin(cluster.namesrv_addr, transport) as admin:
            first = await admin.topic_list()
        async with Admin(cluster.namesrv_addr, transport) as admin:
            assert await admin.topic_list() == first == ["TBW102"]
    finally:
        await transport.close()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=60)


async def test_entry_points_as_processes(cluster: InProcBrokerCluster) -> None:
    """The cluster serves from this test's loop while the processes run (``to_thread``)."""
    r = await asyncio.to_thread(_run, "broker.tools.mqadmin", "--help")
    assert r.returncode == 0 and "clusterList" in r.stdout
    r = await asyncio.to_thread(_run, "broker.tools.mqadmin", "topicRoute", "-n", cluster.namesrv_addr, "-t", "Missing")
    assert r.returncode == 1 and "TOPIC_NOT_EXIST" in r.stderr and "Traceback" not in r.stderr
    r = await asyncio.to_thread(_run, "broker.tools.mqadmin", "topicRoute", "-n", cluster.namesrv_addr)
    assert r.returncode == 2 and "-t" in r.stderr
    r = await asyncio.to_thread(_run, "broker.tools.mqbench", "produce", "--threads", "-3")
    assert r.returncode == 2 and "Traceback" not in r.stderr
