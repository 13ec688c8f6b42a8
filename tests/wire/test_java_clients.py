"""The official Java remoting client, 4.9.8 and 5.3.1, unmodified, against the target (issue 25's scenarios).

Each test runs one scenario of tests/wire/java (wire.Scenarios) in its own JVM on a fresh topic and group; the
program asserts what it sent against what it received and prints one JSON line, which is checked again here."""

from __future__ import annotations

from typing import Any

import pytest

from tests.wire.harness import Run, Target, create_topic, fresh, require_remoting, run_java

pytestmark = [pytest.mark.slow, pytest.mark.wire]

CLIENTS = ["4.9.8", "5.3.1"]


def run(client: str, scenario: str, target: Target, home: str, **kw: Any) -> Run:
    require_remoting(target)
    topic = fresh(scenario)
    create_topic(target, topic, home)
    r = run_java(client, scenario.removesuffix("-vip"), target, home, topic=topic, group=fresh("g"), **kw)
    print(f"{client} {scenario} [{target.label()}] {r.wall_s:.1f} s: {r.result}")
    assert r.result.get("ok") is True and r.returncode == 0, r.why()
    return r


def sql_matches(n: int) -> tuple[int, int]:
    """What the program's two SQL92 expressions must select among its n messages (recomputed here)."""
    colors = ["red", "blue", "green", "red", "yellow"]
    m1 = m2 = 0
    for i in range(n):
        color, has_a, a = colors[i % 5], i % 7 != 6, i % 10
        m1 += has_a and 3 <= a <= 7 and color == "red"
        m2 += color in ("blue", "green") or not has_a
    return m1, m2


@pytest.mark.parametrize("client", CLIENTS)
def test_send_sync_async_oneway_batch(client: str, target: Target, home: str) -> None:
    res = run(client, "send", target, home, count=40).result
    assert res["acked"] == 3 * 40                          # sync + async + batch members, each SEND_OK
    assert res["read"] >= 4 * 40                           # and the oneway ones, all read back


@pytest.mark.parametrize("client", CLIENTS)
def test_send_over_the_vip_channel(client: str, target: Target, home: str) -> None:
    """sendMessageWithVIPChannel=true: the client talks to each broker on listenPort - 2."""
    res = run(client, "send-vip", target, home, count=20, vip=True).result
    assert res["vip_channel"] is True and res["acked"] == 3 * 20


@pytest.mark.parametrize("client", CLIENTS)
def test_push_consumers_clustering_and_broadcasting_with_tags(client: str, target: Target, home: str) -> None:
    res = run(client, "push-tags", target, home, count=30).result
    q = res["queues"]
    assert res["clustering_received"] == 2 * 30 + q        # every TagA and TagB (+ a TagA fence per queue)
    assert res["broadcasting_received"] == [30 + q, 30 + q]  # each broadcasting member: every TagA


@pytest.mark.parametrize("client", CLIENTS)
def test_lite_pull_subscribe_and_assign(client: str, target: Target, home: str) -> None:
    res = run(client, "lite-pull", target, home, count=40).result
    assert res["subscribed_received"] == 20 and res["assigned_received"] == 40


@pytest.mark.timeout(420)
@pytest.mark.parametrize("client", CLIENTS)
def test_ordered_messages_across_a_leader_kill(client: str, target: Target, home: str) -> None:
    res = run(client, "orderly", target, home, count=400, kill=True, poll_ms=1000, timeout_s=300).result
    assert res["kill_output"].startswith("killed leader") and res["restarted"] is True
    assert res["sent_acked"] == 400 and res["consumed"] >= 400


@pytest.mark.parametrize("client", CLIENTS)
def test_delay_levels_and_timer(client: str, target: Target, home: str) -> None:
    res = run(client, "delay", target, home, count=4).result
    assert res["received"] == res["sent"] == 12


@pytest.mark.parametrize("client", CLIENTS)
def test_failing_listener_goes_through_retry_to_dlq(client: str, target: Target, home: str) -> None:
    res = run(client, "retry-dlq", target, home, count=5).result
    assert res["dlq_received"] == 5
    assert all(d >= res["max_reconsume_times"] + 1 for d in res["deliveries"].values())


@pytest.mark.timeout(360)
@pytest.mark.parametrize("client", CLIENTS)
def test_transactions_commit_rollback_check_back(client: str, target: Target, home: str) -> None:
    res = run(client, "txn", target, home, count=3, timeout_s=240).result
    keys = [f"{k}-{i}" for k in ("commit", "rollback", "check-commit", "check-rollback") for i in range(3)]
    assert sorted(res["local_states"]) == sorted(keys)
    assert sorted(res["check_backs"]) == sorted(k for k in keys if k.startswith("check-"))
    assert res["delivered"] == 6                           # commit-* and check-commit-*, nothing rolled back


@pytest.mark.parametrize("client", CLIENTS)
def test_sql92_selectors(client: str, target: Target, home: str) -> None:
    res = run(client, "sql92", target, home, count=40).result
    assert (res["matched1"], res["matched2"]) == sql_matches(40)


@pytest.mark.parametrize("client", CLIENTS)
def test_query_by_id_key_and_unique_key(client: str, target: Target, home: str) -> None:
    res = run(client, "query", target, home, count=10).result
    assert res["viewed_by_offset_msg_id"] == res["by_key_all"] == res["by_unique_key"] == 10


@pytest.mark.parametrize("client", CLIENTS)
def test_consumer_progress_and_reset_by_time(client: str, target: Target, home: str) -> None:
    res = run(client, "progress", target, home, count=20).result
    assert res["reread"] == 20
    assert sum(res["committed_after_first"].values()) == 20


@pytest.mark.timeout(600)
@pytest.mark.parametrize("client", CLIENTS)
def test_20000_messages_across_a_leader_kill_every_send_ok_consumed(client: str, target: Target, home: str) -> None:
    res = run(client, "bulk", target, home, count=20_000, kill=True, poll_ms=1000, timeout_s=480).result
    assert res["acked"] == 20_000 and res["missing"] == 0 and res["consumed_distinct"] >= 20_000
    assert res["restarted"] is True
