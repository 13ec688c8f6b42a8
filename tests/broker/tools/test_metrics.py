"""``GET /metrics`` on brokers and NameServers, scraped over HTTP from a real in-process cluster (ACL on,
scraped without credentials like a Prometheus server would) and parsed with prometheus_client's
text parser: the series exist with the values the cluster's state implies."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.broker.inproc_cluster import WAIT_S, InProcBrokerCluster
from tests.broker.tools.conftest import ClusterFactory
from tests.dledger.harness import wait_until

Samples = dict[str, list[tuple[dict[str, str], float]]]


async def scrape(addr: str) -> Samples:
    """Anonymous GET; every sample by name (histograms as their _bucket/_sum/_count samples)."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://{addr}/metrics") as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = await resp.text()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    found = [v for lab, v in samples.get(name, []) if all(lab.get(k) == want for k, want in labels.items())]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


async def test_broker_metrics_match_the_cluster(make_cluster: ClusterFactory) -> None:
    cluster: InProcBrokerCluster = await make_cluster(groups=("RaftNode00",))
    g0 = cluster.group("RaftNode00")
    await cluster.create_topic("MT", 2)
    await g0.put("MT", 0, 5)
    await g0.put("MT", 1, 3)
    got = await g0.messages("MT", 0)  # a pull of 5 messages
    assert len(got) == 5
    await g0.commit_offsets("CG1", "MT", {0: 2, 1: 3})
    await g0.wait_replicated()
    leader = g0.leader()
    assert leader is not None
    base = {"cluster": "DefaultCluster", "broker": "RaftNode00"}

    async def committed_seen() -> bool:
        s = await scrape(leader.addr)
        return value(s, "rocketmq_consumer_offset", **base, topic="MT", group="CG1") == 5.0

    await wait_until(committed_seen, WAIT_S, "the leader's metrics to show CG1's committed offsets")
    s = await scrape(leader.addr)
    node = {**base, "node": "n0"}
    # Raft state
    assert value(s, "dledger_role", **node, role="LEADER") == 1.0
    assert value(s, "dledger_role", **node, role="FOLLOWER") == 0.0
    status: dict[str, Any] = await cluster.call(leader.addr, "GET", "/v1/status")
    assert value(s, "dledger_term", **node) == status["term"]
    assert value(s, "dledger_commit_index", **node) >= status["commit_index"] - 10
    assert value(s, "dledger_applied_index", **node) <= value(s, "dledger_commit_index", **node)
    assert value(s, "rocketmq_broker_writable", **node) == 1.0
    for peer in ("n1", "n2"):
        assert value(s, "dledger_follower_match_lag", **node, peer=peer) >= 0
        assert value(s, "dledger_peer_connected", **node, peer=peer) == 1.0
    assert value(s, "dledger_became_leader_total", **node) >= 0
    assert "dledger_elections_total" in s
    assert 0 < value(s, "dledger_disk_used_ratio", **node) <= 1
    assert value(s, "dledger_log_bytes", **node) > 0
    assert value(s, "dledger_append_queue_requests", **node) >= 0
    # event series: 8 messages sent in 2 requests, 5 pulled
    assert value(s, "rocketmq_messages_in_total", **node, topic="MT") == 8.0
    assert value(s, "rocketmq_send_latency_seconds_count", **node, topic="MT") == 2.0
    assert value(s, "rocketmq_send_latency_seconds_bucket", **node, topic="MT", le="+Inf") == 2.0
    assert value(s, "rocketmq_throughput_in_total", **node, topic="MT") > 8 * len("m-0-0")
    assert value(s, "rocketmq_messages_out_total", **node, topic="MT", group="") == 5.0
    assert value(s, "rocketmq_pull_latency_seconds_count", **node, topic="MT") == 1.0
    assert value(s, "rocketmq_producer_tps", **base, topic="MT") > 0
    # every append was fsynced and written as at least one entry
    assert value(s, "dledger_fsync_latency_seconds_count", **node) >= 1
    assert value(s, "dledger_group_commit_batch_size_sum", **node) >= 8
    # offsets and lag (rocketmq-exporter's names), from the ready leader
    assert value(s, "rocketmq_producer_offset", **base, topic="MT") == 8.0
    assert value(s, "rocketmq_group_diff", **base, topic="MT", group="CG1") == 3.0
    assert value(s, "rocketmq_group_queue_diff", **base, topic="MT", group="CG1", queueid="0") == 3.0
    assert value(s, "rocketmq_group_queue_diff", **base, topic="MT", group="CG1", queueid="1") == 0.0

    # a follower reports its role, and no group state (the leader's alone, not counted three times)
    follower = g0.replica("n1")
    fs = await scrape(follower.addr)
    assert value(fs, "dledger_role", **base, node="n1", role="FOLLOWER") == 1.0
    assert value(fs, "rocketmq_broker_writable", **base, node="n1") == 0.0
    assert "rocketmq_group_diff" not in fs

    # every series the Grafana dashboard (docs/) queries is one the servers export (a refused send
    # makes the error counter's first series)
    try:
        bad = {"topic": "MT", "queue_id": 9, "messages": [{"body": b"x"}]}
        await cluster.call(leader.addr, "POST", "/v1/send", bad)
        raise AssertionError("a send to queue 9 of a 2-queue topic was accepted")
    except Exception as exc:
        assert getattr(exc, "code", None) == "INVALID_QUEUE_ID", exc
    s = await scrape(leader.addr)
    exported = set(s) | set(await scrape(cluster.namesrvs[0].addr))
    dashboard = json.loads((Path(__file__).parents[3] / "docs" / "grafana-dledger-mq.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b((?:rocketmq|dledger)_[a-z_]+)", target["expr"])
    }
    assert len(queried) > 15
    assert queried <= exported, sorted(queried - exported)


async def test_send_errors_are_counted_by_code(make_cluster: ClusterFactory) -> None:
    cluster: InProcBrokerCluster = await make_cluster(groups=("RaftNode00",))
    g0 = cluster.group("RaftNode00")
    await cluster.create_topic("RO", 1, perm=4)  # read-only
    leader = g0.leader()
    assert leader is not None
    try:
        await cluster.call(leader.addr, "POST", "/v1/send", {"topic": "RO", "messages": [{"body": b"x"}]})
        raise AssertionError("a send to a read-only topic was accepted")
    except Exception as exc:
        assert getattr(exc, "code", None) == "NO_PERMISSION", exc
    s = await scrape(leader.addr)
    assert value(s, "rocketmq_send_errors_total", cluster="DefaultCluster", node="n0", code="NO_PERMISSION") == 1.0


async def test_namesrv_metrics_count_routes_and_registration_ages(make_cluster: ClusterFactory) -> None:
    cluster: InProcBrokerCluster = await make_cluster(groups=("RaftNode00",))
    await cluster.create_topic("NT", 2)
    s = await scrape(cluster.namesrvs[0].addr)
    assert value(s, "rocketmq_namesrv_brokers") == 3.0  # three replicas registered
    assert value(s, "rocketmq_namesrv_broker_groups") == 1.0
    assert value(s, "rocketmq_namesrv_topics") >= 1.0
    assert value(s, "rocketmq_namesrv_registrations_total") >= 3.0
    leader = cluster.group("RaftNode00").leader()
    assert leader is not None
    age = value(s, "rocketmq_namesrv_registration_age_seconds", broker="RaftNode00", addr=leader.addr)
    assert 0 <= age < value(s, "rocketmq_namesrv_registration_timeout_seconds", broker="RaftNode00", addr=leader.addr)
    assert value(s, "rocketmq_namesrv_broker_term", broker="RaftNode00", broker_id="0") >= 1
