"""``GET /metrics`` on the NameServer: route counts, registration totals and the age of every live
broker's last registration, in Prometheus' text exposition format (docs/OPERATIONS.md).

The figures come from one ``_status`` call on the table task (the table's single owner), so a scrape
sees one consistent table; a per-server ``CollectorRegistry`` renders them. Cost is bounded by the
table's own limits (brokers, topics)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _StatusCollector(Collector):
    def __init__(self) -> None:
        self.status: dict[str, Any] | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        st = self.status
        if st is None:
            return
        counts = st["counts"]
        for key, doc in [
            ("clusters", "Clusters with a live broker"),
            ("broker_groups", "Broker groups (broker names) with a live broker"),
            ("brokers", "Live broker addresses"),
            ("topics", "Topics with a route"),
            ("topic_routes", "(topic, broker group) route entries"),
        ]:
            g = GaugeMetricFamily(f"rocketmq_namesrv_{key}", doc)
            g.add_metric([], float(counts.get(key, 0)))
            yield g
        for key, value in sorted(st["totals"].items()):
            c = CounterMetricFamily(f"rocketmq_namesrv_{key}", f"NameServer {key.replace('_', ' ')} since start")
            c.add_metric([], float(value))
            yield c
        labels = ["cluster", "broker", "broker_id", "addr", "role"]
        age = GaugeMetricFamily(
            "rocketmq_namesrv_registration_age_seconds", "Time since the broker's last registration", labels=labels
        )
        timeout = GaugeMetricFamily(
            "rocketmq_namesrv_registration_timeout_seconds",
            "Idle time after which the broker's routes expire",
            labels=labels,
        )
        term = GaugeMetricFamily("rocketmq_namesrv_broker_term", "Raft term the broker registered with", labels=labels)
        for b in st["brokers"]:
            vals = [b["cluster"], b["broker_name"], str(b["broker_id"]), b["address"], str(b["role"])]
            age.add_metric(vals, b["idle_ms"] / 1000)
            timeout.add_metric(vals, b["heartbeat_timeout_ms"] / 1000)
            term.add_metric(vals, float(b["term"]))
        yield from (age, timeout, term)
        up = GaugeMetricFamily("rocketmq_namesrv_uptime_seconds", "Seconds since this NameServer started")
        up.add_metric([], st["uptime_ms"] / 1000)
        yield up


class NamesrvMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._collector = _StatusCollector()
        self.registry.register(self._collector)

    def render(self, status: dict[str, Any]) -> bytes:
        """Synchronous: the status is used only within this call (no await in between)."""
        self._collector.status = status
        try:
            return generate_latest(self.registry)
        finally:
            self._collector.status = None
