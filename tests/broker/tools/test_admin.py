"""``Admin`` as a library: typed results, argument checks before any request, fan-out outcomes,
transport ownership; and the command-line entry points as processes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from broker.client.admin import (
    Admin,
    FanOutError,
    InvalidArgument,
    QueueStatus,
    parse_msg_id,
)
from broker.client.transport import ClientError, Transport
from tests.broker.tools.fakes import FakeCluster


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


async def test_update_topic_and_read_it_back(cluster: FakeCluster) -> None:
    async with Admin(cluster.namesrv) as admin:
        outcomes = await admin.update_topic(
            "Orders", cluster="DefaultCluster", read_queue_nums=2, write_queue_nums=2
        )
        assert [(o.name, o.ok, o.code) for o in outcomes] == [
            ("RaftNode00", True, "OK"),
            ("RaftNode01", True, "OK"),
        ]
        assert await admin.topic_list() == ["Orders"]
        route = await admin.topic_route("Orders")
        assert [q.read_queue_nums for q in route.queue_datas] == [2, 2]
        status = await admin.topic_status("Orders")
        assert status[0] == QueueStatus("RaftNode00", 0, 0, 0, 0) and len(status) == 4


async def test_target_is_a_cluster_or_a_broker(cluster: FakeCluster) -> None:
    async with Admin(cluster.namesrv) as admin:
        for kwargs in (
            {},
            {"cluster": "DefaultCluster", "broker_addr": cluster.group("RaftNode00").addrs[0]},
        ):
            with pytest.raises(InvalidArgument):
                await admin.update_topic("T", **kwargs)  # type: ignore[arg-type]
    assert not cluster.namesrvs[0].requests


async def test_fan_out_error_carries_every_outcome(cluster: FakeCluster) -> None:
    cluster.group("RaftNode01").errors["h_group_update"] = (429, "BUSY")
    async with Admin(cluster.namesrv) as admin:
        with pytest.raises(FanOutError) as info:
            await admin.update_sub_group("G1", cluster="DefaultCluster")
    err = info.value
    assert err.code == "BUSY" and err.status == 429
    assert [(o.name, o.ok, o.code) for o in err.outcomes] == [
        ("RaftNode00", True, "OK"),
        ("RaftNode01", False, "BUSY"),
    ]
    assert "G1" in cluster.group("RaftNode00").groups  # the healthy group still got it


async def test_single_broker_write_failure_is_a_fan_out_error_too(cluster: FakeCluster) -> None:
    g0 = cluster.group("RaftNode00")
    g0.leader = None
    async with Admin(cluster.namesrv) as admin:
        with pytest.raises(FanOutError) as info:
            await admin.update_topic("T", broker_addr=g0.addrs[1])
    assert info.value.code == "NOT_LEADER" and len(info.value.outcomes) == 1


async def test_reads_and_queries_return_typed_messages(cluster: FakeCluster) -> None:
    g0 = cluster.group("RaftNode00")
    stored = cluster.call(
        lambda: [
            g0.append("T1", 1, b"payload", tags="TagA", keys=["order-1"], properties={"a": "b"})
            for _ in range(3)
        ]
    )
    async with Admin(cluster.namesrv) as admin:
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


async def test_consumer_progress_typed(cluster: FakeCluster) -> None:
    g0 = cluster.group("RaftNode00")
    cluster.call(lambda: [g0.append("T1", 0, b"x") for _ in range(5)])
    g0.offsets[("G1", "T1")] = {0: 2}
    async with Admin(cluster.namesrv) as admin:
        progress = await admin.consumer_progress("G1", "T1")
    assert progress.total_lag == 3 + 0 + 0 + 0
    q0 = progress.queues[0]
    assert (q0.broker_offset, q0.consumer_offset, q0.lag) == (5, 2, 3)
    assert progress.queues[1].consumer_offset is None


async def test_a_shared_transport_is_not_closed(cluster: FakeCluster) -> None:
    transport = Transport()
    try:
        async with Admin(cluster.namesrv, transport) as admin:
            await admin.topic_list()
        async with Admin(cluster.namesrv, transport) as admin:
            assert await admin.topic_list() == []
    finally:
        await transport.close()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=60)


def test_entry_points_as_processes(cluster: FakeCluster) -> None:
    r = _run("broker.mqadmin", "--help")
    assert r.returncode == 0 and "clusterList" in r.stdout
    r = _run("broker.mqadmin", "topicRoute", "-n", cluster.namesrv, "-t", "Missing")
    assert r.returncode == 1 and "TOPIC_NOT_EXIST" in r.stderr and "Traceback" not in r.stderr
    r = _run("broker.mqadmin", "topicRoute", "-n", cluster.namesrv)
    assert r.returncode == 2 and "-t" in r.stderr
    r = _run("broker.mqbench", "produce", "--threads", "-3")
    assert r.returncode == 2 and "Traceback" not in r.stderr
