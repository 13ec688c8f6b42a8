"""``mq-bench transaction`` (broker/tools/txn_bench.py): a short run against the in-process cluster, its
accounting checked against what the brokers stored."""

from __future__ import annotations

import asyncio
import json

import pytest

from broker.tools.mqbench import main
from broker.tools.txn_bench import _Listener
from tests.broker.inproc_cluster import InProcBrokerCluster


def test_the_rollback_share_is_exact() -> None:
    listener = _Listener(0.25)
    answers = [listener.execute_local_transaction(None, None) for _ in range(400)]
    assert answers.count("ROLLBACK_MESSAGE") == 100
    assert all(_Listener(0.0).execute_local_transaction(None, None) == "COMMIT_MESSAGE" for _ in range(10))


async def test_transaction_bench_commits_and_rolls_back(
    cluster: InProcBrokerCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    await cluster.create_topic("BenchTxn", 2)
    argv = ["transaction", "-n", cluster.namesrv_addr, "-t", "BenchTxn", "--duration", "1", "--threads", "4",
            "-s", "64", "--rollback-share", "0.5", "--json"]
    capsys.readouterr()
    assert await asyncio.to_thread(main, argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["transactions"] > 0 and summary["failed"] == 0 and summary["end_failed"] == 0, summary
    assert abs(summary["commit"] - summary["rollback"]) <= 1
    stored = [m for g in cluster.groups for q in range(2) for m in await g.messages("BenchTxn", q)]
    assert len(stored) == summary["commit"]  # only committed ones are visible
    assert all(m["properties"]["TRAN_MSG"] == "true" for m in stored)
    assert await asyncio.to_thread(main, ["transaction", "--rollback-share", "2", "-n", cluster.namesrv_addr]) == 2
