"""The official Go client (github.com/apache/rocketmq-client-go/v2 v2.1.2), unmodified, against the target.

Each test runs one scenario of tests/wire/go (built to tests/wire/.build/wirego by .ci/setup.sh) on a fresh
topic and group; the program asserts what it sent against what it received and prints one JSON line."""

from __future__ import annotations

from typing import Any

import pytest

from tests.wire.harness import Run, Target, create_topic, fresh, require_remoting, run_go

pytestmark = [pytest.mark.slow, pytest.mark.wire]


def run(scenario: str, target: Target, home: str, **kw: Any) -> Run:
    require_remoting(target)
    topic = fresh("go_" + scenario)
    create_topic(target, topic, home)
    r = run_go(scenario, target, home, topic=topic, group=fresh("g"), **kw)
    print(f"go {scenario} [{target.label()}] {r.wall_s:.1f} s: {r.result}")
    assert r.result.get("ok") is True and r.returncode == 0, r.why()
    return r


def test_go_sync_async_oneway_batch(target: Target, home: str) -> None:
    res = run("send", target, home, count=40).result
    assert res["acked"] == 2 * 40 and res["read"] >= 4 * 40   # sync + async by id; batch and oneway by body


def test_go_push_consumer_with_tags(target: Target, home: str) -> None:
    res = run("push-tags", target, home, count=30).result
    assert res["clustering_received"] == 2 * 30 + res["queues"]


def test_go_pull_consumer(target: Target, home: str) -> None:
    res = run("pull", target, home, count=40).result
    assert res["received"] == 40


@pytest.mark.timeout(420)
def test_go_ordered_messages_across_a_leader_kill(target: Target, home: str) -> None:
    res = run("orderly", target, home, count=200, kill=True, timeout_s=300).result
    assert res["sent_acked"] == 200 and res["consumed"] >= 200


def test_go_delay_levels(target: Target, home: str) -> None:
    res = run("delay", target, home, count=3).result
    assert res["sent"] == 6


@pytest.mark.timeout(360)
def test_go_transactions_commit_rollback_check_back(target: Target, home: str) -> None:
    res = run("txn", target, home, count=2, timeout_s=240).result
    assert sorted(res["check_backs"]) == ["check-commit-0", "check-commit-1", "check-rollback-0", "check-rollback-1"]


def test_go_sql92_selector(target: Target, home: str) -> None:
    res = run("sql92", target, home, count=30).result
    colors = ["red", "blue", "green", "red", "yellow"]
    assert res["matched"] == sum(1 for i in range(30) if colors[i % 5] == "red" and 3 <= i % 10 <= 7)
