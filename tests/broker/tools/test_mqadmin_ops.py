"""``mqadmin``: what a new user saw go wrong (issue 16) and the commands added for RocketMQ parity,
each against real broker groups on the in-process log (``tests/broker/inproc_cluster.py``)."""

from __future__ import annotations

import asyncio
import json
import os
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
            sys.executable, "-m", "broker.mqadmin", *argv, stdout=w, stderr=asyncio.subprocess.PIPE
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
    assert "404" not in r.err


def _rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()[1:] if line.strip()]


def _data(r: Any) -> Any:
    assert r.rc == 0, r.err
    return json.loads(r.out)
