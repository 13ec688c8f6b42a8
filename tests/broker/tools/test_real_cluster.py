"""``mqadmin`` and ``mq-bench`` against a real NameServer and a real 3-replica broker group
(``tests.broker.harness``), served from an event loop on its own thread so that the tools' ``main``
(which runs ``asyncio.run``) can be called as a user would."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from broker.tools.mqadmin import main as mqadmin
from broker.tools.mqbench import main as mqbench
from dledger.waiting import wait_until_sync

T = TypeVar("T")


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="real-cluster", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def real_cluster(tmp_path: Any) -> Iterator[Any]:
    from tests.broker import harness
    lt = LoopThread()
    cluster = harness.BrokerCluster(str(tmp_path))
    try:
        lt.run(cluster.start())
        yield cluster
    finally:
        lt.run(cluster.stop())
        lt.close()


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str) -> Any:
    return wait_until_sync(cond, timeout_s, what, 0.1, tolerate_errors=False, error=AssertionError)


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    capsys.readouterr()
    rc = mqadmin([*argv, "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out) if out.strip() else None


def test_admin_commands_on_a_real_group(real_cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ns = real_cluster.namesrv_addr

    def leader_listed() -> Any:
        rc, data = run_json(capsys, "clusterList", "-n", ns)
        roles = [b["role"] for b in data["brokers"]] if rc == 0 else []
        return (
            data
            if sorted(roles) == ["FOLLOWER", "FOLLOWER", "LEADER"] and data["brokers"][0]["broker_id"] == 0
            else None
        )

    first = wait_for(leader_listed, 20, "clusterList to show one leader and two followers")
    old_leader = first["brokers"][0]["self_id"]

    assert (
        run_json(capsys, "updateTopic", "-n", ns, "-t", "T1", "-c", "TestCluster", "-r", "2", "-w", "2")[0]
        == 0
    )
    wait_for(lambda: run_json(capsys, "topicRoute", "-n", ns, "-t", "T1")[0] == 0, 10, "the route of T1")
    rc, sent = run_json(
        capsys, "sendMessage", "-n", ns, "-t", "T1", "-p", "hello", "-k", "k1 k2", "-c", "TagA"
    )
    assert rc == 0 and sent["status"] == "SEND_OK"

    rc, msg = run_json(capsys, "queryMsgById", "-n", ns, "-i", sent["msg_id"])
    assert rc == 0 and (msg["body_b64"], msg["tags"], msg["keys"]) == ("aGVsbG8=", "TagA", ["k1", "k2"])
    rc, found = run_json(capsys, "queryMsgByUniqueKey", "-n", ns, "-t", "T1", "-u", sent["unique_id"])
    assert rc == 0 and found["messages"][0]["msg_id"] == sent["msg_id"]
    rc, consumed = run_json(capsys, "consumeMessage", "-n", ns, "-t", "T1")
    assert rc == 0 and [m["msg_id"] for m in consumed["messages"]] == [sent["msg_id"]]

    assert run_json(capsys, "updateSubGroup", "-n", ns, "-g", "G1", "-c", "TestCluster")[0] == 0
    rc, reset = run_json(capsys, "resetOffsetByTime", "-n", ns, "-g", "G1", "-t", "T1", "-s", "0")
    assert rc == 0 and [o["offset"] for o in reset["offsets"]] == [0, 0]
    rc, progress = run_json(capsys, "consumerProgress", "-n", ns, "-g", "G1", "-t", "T1")
    assert rc == 0 and progress["total_lag"] == 1

    rc, moved = run_json(capsys, "transferLeader", "-n", ns, "-m", "RaftNode00")
    assert rc == 0 and moved["leader_id"] != old_leader

    def new_leader_listed() -> Any:
        data = leader_listed()
        return data and data["brokers"][0]["self_id"] == moved["leader_id"]

    wait_for(new_leader_listed, 20, "clusterList to show the new leader")
    capsys.readouterr()
    assert mqbench(["produce", "-n", ns, "-t", "BenchT", "--duration", "1", "--rate", "100", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["messages"] == 100 and summary["errors"] == {}
    assert run_json(capsys, "deleteTopic", "-n", ns, "-t", "T1", "-c", "TestCluster")[0] == 0
    rc, err = run_json(capsys, "topicStatus", "-n", ns, "-t", "T1")
    assert rc == 1 and err["code"] == "TOPIC_NOT_EXIST"
