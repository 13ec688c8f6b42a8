"""``GET /metrics`` on every broker replica: Prometheus' text exposition format (docs/OPERATIONS.md).

Two kinds of series live in one ``CollectorRegistry`` per server (many servers share a test process,
so nothing goes to prometheus_client's global registry):

- Event series, updated where the event happens: send/pull message and byte counters and latency
  histograms per topic (``rocketmq_messages_in_total``, ``rocketmq_send_latency_seconds``...), the
  replica's fsync latency and group-commit batch sizes (``dledger_fsync_latency_seconds``,
  ``dledger_group_commit_batch_size``, observed on the replica's thread (the loop): prometheus_client's metrics are
  thread-safe).
- State series, read once per scrape (``Snapshot``, built by ``scrape()`` on the serving loop and
  handed to the collector): Raft term, role, commit/applied index, follower match lag, elections,
  append queue depth, log and disk use, and — from the group's ready leader only, so that a sum over
  the group's three replicas does not count three times — topic offsets, consumer offsets and lag per
  group and queue. Names follow rocketmq-exporter where it has one (``rocketmq_producer_tps``,
  ``rocketmq_consumer_tps``, ``rocketmq_producer_offset``, ``rocketmq_consumer_offset``,
  ``rocketmq_group_diff``); TPS is the rate over the last ``RATE_WINDOW_S`` seconds.

Bounded cost: label sets per metric are capped (``SERIES_MAX``; past it the topic/group label reads
``_other``), per-queue lag series are capped at ``QUEUE_SERIES_MAX`` per scrape, and scrapes run one at
a time.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dledger.clock import Clock
from dledger.durable import disk_used_ratio

if TYPE_CHECKING:
    from broker.server.config import BrokerConfig
    from broker.store.message_store import MessageStore
    from dledger.node import DLedgerNode

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
RATE_WINDOW_S = 10
SERIES_MAX = 2_000  # distinct topic (or topic+group) label sets per event metric
QUEUE_SERIES_MAX = 5_000  # per-queue lag series per scrape
OTHER = "_other"
ROLES = ("LEADER", "CANDIDATE", "FOLLOWER")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
FSYNC_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class RateWindow:
    """Events per second over the last ``window_s`` whole seconds of the injected monotonic clock,
    per key (at most ``keys_max`` keys; later keys count under ``other``)."""

    def __init__(self, clock: Clock, window_s: int = RATE_WINDOW_S, keys_max: int = SERIES_MAX):
        self._clock = clock
        self._window = window_s
        self._keys_max = keys_max
        self._buckets: dict[Any, collections.deque[list[int]]] = {}

    def key(self, key: Any, other: Any) -> Any:
        return key if key in self._buckets or len(self._buckets) < self._keys_max else other

    def add(self, key: Any, n: int) -> None:
        sec = int(self._clock.monotonic())
        dq = self._buckets.setdefault(key, collections.deque())
        if dq and dq[-1][0] == sec:
            dq[-1][1] += n
        else:
            dq.append([sec, n])
        while dq and dq[0][0] <= sec - self._window:
            dq.popleft()

    def rates(self) -> dict[Any, float]:
        now = int(self._clock.monotonic())
        out = {}
        for key, dq in self._buckets.items():
            total = sum(n for sec, n in dq if sec > now - self._window)
            out[key] = total / self._window
        return out


class _Bounded:
    """Label values admitted to an event metric: the first ``SERIES_MAX`` distinct ones, then OTHER."""

    def __init__(self, limit: int = SERIES_MAX):
        self._seen: set[Any] = set()
        self._limit = limit

    def admit(self, key: Any, other: Any) -> Any:
        if key in self._seen:
            return key
        if len(self._seen) >= self._limit:
            return other
        self._seen.add(key)
        return key


@dataclasses.dataclass
class Snapshot:
    node: dict[str, Any]
    ready: bool
    disk_used_ratio: float | None
    producer_offsets: dict[str, int]  # topic -> sum of the queues' max offsets (leader only)
    # (group, topic) -> [(queue_id, broker_offset, consumer_offset or None, lag)] (leader only)
    progress: dict[tuple[str, str], list[tuple[int, int, int | None, int]]]
    producer_tps: dict[str, float]
    consumer_tps: dict[tuple[str, str], float]
    refused_records: int = 0  # records this replica's apply refused (broker/store/record_rules.py)


class MeteredReplica(Protocol):
    """What the metrics read of the replica they describe (``BrokerServer`` is one)."""

    cfg: BrokerConfig
    clock: Clock
    store: MessageStore

    @property
    def node(self) -> DLedgerNode: ...
    @property
    def ready(self) -> bool: ...


class BrokerMetrics:
    content_type = CONTENT_TYPE  # of what ``scrape`` returns

    def __init__(self, server: MeteredReplica):
        self.s = server
        cfg = server.cfg
        self.base = {"cluster": cfg.cluster, "broker": cfg.broker_name, "node": cfg.dledger.self_id}
        self.registry = CollectorRegistry(auto_describe=True)
        names = ["cluster", "broker", "node", "topic"]
        reg = self.registry
        self.messages_in = Counter(
            "rocketmq_messages_in", "Messages stored by sends to this replica", names, registry=reg
        )
        self.throughput_in = Counter(
            "rocketmq_throughput_in", "Message bytes stored by sends to this replica", names, registry=reg
        )
        self.messages_out = Counter(
            "rocketmq_messages_out", "Messages served by pulls", [*names, "group"], registry=reg
        )
        self.throughput_out = Counter(
            "rocketmq_throughput_out", "Message bytes served by pulls", [*names, "group"], registry=reg
        )
        self.send_latency = Histogram(
            "rocketmq_send_latency_seconds", "Send request: received to committed and answered",
            names, buckets=LATENCY_BUCKETS, registry=reg,
        )
        self.pull_latency = Histogram(
            "rocketmq_pull_latency_seconds", "Pull request that returned messages: received to answered",
            names, buckets=LATENCY_BUCKETS, registry=reg,
        )
        self.send_errors = Counter(
            "rocketmq_send_errors", "Send requests answered with an error, by code",
            ["cluster", "broker", "node", "code"], registry=reg,
        )
        node_labels = ["cluster", "broker", "node"]
        self.fsync = Histogram(
            "dledger_fsync_latency_seconds", "Raft log flush (fdatasync) duration",
            node_labels, buckets=FSYNC_BUCKETS, registry=reg,
        ).labels(**self.base)
        self.batch = Histogram(
            "dledger_group_commit_batch_size", "Message bodies per Raft entry written (group commit)",
            node_labels, buckets=BATCH_BUCKETS, registry=reg,
        ).labels(**self.base)
        self._topics = _Bounded()
        # admitted topic -> its labelled children of the send series and its rate key (``sent``
        # runs once per send request: three ``labels()`` lookups cost more than the updates). At
        # most SERIES_MAX + 1 keys, like the series themselves.
        self._sent_children: dict[str, tuple[Any, Any, Any, Any]] = {}
        self._topic_groups = _Bounded()
        self._codes = _Bounded(64)
        self.producer_rate = RateWindow(server.clock)
        self.consumer_rate = RateWindow(server.clock)
        self._snapshot: Snapshot | None = None
        self._lock = asyncio.Lock()
        reg.register(_StateCollector(self))

    # -- events (serving loop; observe too) ------------------------------------------------------
    def observe(self, name: str, value: float) -> None:
        """The replica's hook (``ReplicaCore.observe``), called on the replica's thread (the loop)."""
        if name == "fsync_seconds":
            self.fsync.observe(value)
        elif name == "batch_bodies":
            self.batch.observe(value)

    def sent(self, topic: str, count: int, nbytes: int, seconds: float) -> None:
        t = self._topics.admit(topic, OTHER)
        children = self._sent_children.get(t)
        if children is None:
            # The rate key too: a key the window admitted stays admitted (it never forgets a key),
            # one it refused stays refused.
            children = self._sent_children[t] = (
                self.messages_in.labels(**self.base, topic=t),
                self.throughput_in.labels(**self.base, topic=t),
                self.send_latency.labels(**self.base, topic=t),
                self.producer_rate.key(t, OTHER),
            )
        messages, throughput, latency, rate_key = children
        messages.inc(count)
        throughput.inc(nbytes)
        latency.observe(seconds)
        self.producer_rate.add(rate_key, count)

    def send_failed(self, code: str) -> None:
        self.send_errors.labels(**self.base, code=self._codes.admit(code, OTHER)).inc()

    def pulled(self, topic: str, group: str | None, count: int, nbytes: int, seconds: float) -> None:
        key = self._topic_groups.admit((topic, group or ""), (OTHER, OTHER))
        self.messages_out.labels(**self.base, topic=key[0], group=key[1]).inc(count)
        self.throughput_out.labels(**self.base, topic=key[0], group=key[1]).inc(nbytes)
        self.pull_latency.labels(**self.base, topic=key[0]).observe(seconds)
        self.consumer_rate.add(self.consumer_rate.key(key, (OTHER, OTHER)), count)

    # -- scrape (serving loop) -------------------------------------------------------------------
    async def scrape(self) -> bytes:
        async with self._lock:
            self._snapshot = await self._take_snapshot()
            try:
                return generate_latest(self.registry)
            finally:
                self._snapshot = None

    async def _take_snapshot(self) -> Snapshot:
        s = self.s
        node = await s.node.status()
        try:
            disk: float | None = disk_used_ratio(s.cfg.store_dir)
        except OSError:
            disk = None
        ready = bool(s.ready)
        producer: dict[str, int] = {}
        progress: dict[tuple[str, str], list[tuple[int, int, int | None, int]]] = {}
        if ready:
            md = s.store.metadata_view()
            committed: dict[tuple[str, str], dict[int, int]] = collections.defaultdict(dict)
            for (g, t, q), off in md.offsets.items():
                committed[(g, t)][q] = off
            for topic, tc in md.topics.items():
                total = 0
                for qid in range(tc.read_queue_nums):
                    cq = s.store.queue(topic, qid)
                    total += cq.max_offset if cq is not None else 0
                producer[topic] = total
            for (g, t), offsets in sorted(committed.items()):
                gtc = md.topics.get(t)
                if gtc is None:
                    continue
                rows = []
                for qid in range(gtc.read_queue_nums):
                    cq = s.store.queue(t, qid)
                    hi = cq.max_offset if cq is not None else 0
                    c = offsets.get(qid)
                    base = c if c is not None else (cq.min_offset if cq is not None else 0)
                    rows.append((qid, hi, c, max(0, hi - base)))
                progress[(g, t)] = rows
        return Snapshot(
            node=node,
            ready=ready,
            disk_used_ratio=disk,
            producer_offsets=producer,
            progress=progress,
            producer_tps=self.producer_rate.rates(),
            consumer_tps=self.consumer_rate.rates(),
            refused_records=s.store.refusals.total,
        )


def _gauge(name: str, doc: str, labels: Iterable[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


class _StateCollector(Collector):
    """Reads the ``Snapshot`` the running scrape took (nothing outside a scrape)."""

    def __init__(self, metrics: BrokerMetrics):
        self.m = metrics

    def describe(self) -> list[Metric]:
        return []  # unchecked: the state series change with every scrape

    def collect(self) -> Iterator[Metric]:
        snap = self.m._snapshot
        if snap is None:
            return
        base = self.m.base
        keys = list(base)
        vals = [base[k] for k in keys]
        node = snap.node
        role = _gauge("dledger_role", "1 for this replica's Raft role", [*keys, "role"])
        for r in ROLES:
            role.add_metric([*vals, r], 1.0 if node["role"] == r else 0.0)
        yield role
        simple = [
            ("dledger_term", "Raft term", node["term"]),
            ("dledger_commit_index", "Raft commit index", node["commit_index"]),
            ("dledger_applied_index", "Raft applied index", node["applied_index"]),
            ("dledger_first_index", "First index in the Raft log", node["first_index"]),
            ("dledger_last_index", "Last index in the Raft log", node["last_index"]),
            ("dledger_append_queue_requests", "Append requests queued for the next tick",
             node.get("queued_requests", 0)),
            ("dledger_append_queued_bytes", "Bytes of appends queued (bounded by maxPendingBytes)",
             node.get("queued_bytes", 0)),
            ("dledger_append_waiting_entries", "Entries written, waiting for their commit",
             node.get("waiting_entries", 0)),
            ("dledger_log_bytes", "Bytes held by the Raft log", node.get("bytes_stored", 0)),
            ("dledger_disk_full", "1 when disk use passed diskWarningRatio", 1.0 if node.get("disk_full") else 0.0),
            ("rocketmq_broker_writable", "1 when this replica is the group's ready leader (brokerId 0)",
             1.0 if snap.ready else 0.0),
        ]
        for name, doc, value in simple:
            g = _gauge(name, doc, keys)
            g.add_metric(vals, float(value))
            yield g
        if snap.disk_used_ratio is not None:
            g = _gauge("dledger_disk_used_ratio", "Used fraction of the store directory's file system", keys)
            g.add_metric(vals, snap.disk_used_ratio)
            yield g
        counters = node.get("counters", {})
        for name, doc, key in [
            ("dledger_elections", "Elections this replica started", "elections_started"),
            ("dledger_became_leader", "Times this replica became leader", "became_leader"),
        ]:
            c = CounterMetricFamily(name, doc, labels=keys)
            c.add_metric(vals, float(counters.get(key, 0)))
            yield c
        refused = CounterMetricFamily(
            "dledger_broker_refused_records", "Committed records this replica refused to apply (every replica alike)",
            labels=keys,
        )
        refused.add_metric(vals, float(snap.refused_records))
        yield refused
        stepdowns = CounterMetricFamily("dledger_stepdowns", "Leader step-downs (lost quorum, stale term)", labels=keys)
        stepdowns.add_metric(
            vals, float(counters.get("stepdowns_check_quorum", 0) + counters.get("stepdowns_stale_term", 0))
        )
        yield stepdowns
        peer = [*keys, "peer"]
        lag = _gauge("dledger_follower_match_lag", "Leader's last index minus a follower's match index", peer)
        match = _gauge("dledger_follower_match_index", "A follower's match index as the leader sees it", peer)
        connected = _gauge("dledger_peer_connected", "1 when the Raft link to the peer is up", [*keys, "peer"])
        for pid, p in sorted(node.get("peers", {}).items()):
            connected.add_metric([*vals, pid], 1.0 if p.get("connected") else 0.0)
            if p.get("lag") is not None:
                lag.add_metric([*vals, pid], float(p["lag"]))
            if p.get("match_index") is not None and node["role"] == "LEADER":
                match.add_metric([*vals, pid], float(p["match_index"]))
        yield from (lag, match, connected)
        # rocketmq-exporter's names; labels cluster, broker, topic (+ group, queueid)
        tl = ["cluster", "broker", "topic"]
        tvals = [base["cluster"], base["broker"]]
        tps = _gauge("rocketmq_producer_tps", f"Messages stored per second over the last {RATE_WINDOW_S} s", tl)
        for topic, rate in sorted(snap.producer_tps.items()):
            tps.add_metric([*tvals, topic], rate)
        yield tps
        ctps = _gauge(
            "rocketmq_consumer_tps", f"Messages pulled per second over the last {RATE_WINDOW_S} s", [*tl, "group"]
        )
        for (topic, group), rate in sorted(snap.consumer_tps.items()):
            ctps.add_metric([*tvals, topic, group], rate)
        yield ctps
        if not snap.ready:
            return
        poff = _gauge("rocketmq_producer_offset", "Sum of the topic's queue max offsets (group leader)", tl)
        for topic, total in sorted(snap.producer_offsets.items()):
            poff.add_metric([*tvals, topic], float(total))
        yield poff
        coff = _gauge("rocketmq_consumer_offset", "Sum of the group's committed offsets on the topic", [*tl, "group"])
        diff = _gauge("rocketmq_group_diff", "Messages the group has not consumed on the topic (lag)", [*tl, "group"])
        qdiff = _gauge(
            "rocketmq_group_queue_diff", "Lag of the group on one queue", [*tl, "group", "queueid"]
        )
        qseries = 0
        for (group, topic), rows in sorted(snap.progress.items()):
            coff.add_metric([*tvals, topic, group], float(sum(c or 0 for _q, _h, c, _l in rows)))
            diff.add_metric([*tvals, topic, group], float(sum(lag for *_x, lag in rows)))
            for qid, _hi, _c, qlag in rows:
                if qseries < QUEUE_SERIES_MAX:
                    qdiff.add_metric([*tvals, topic, group, str(qid)], float(qlag))
                    qseries += 1
        yield from (coff, diff, qdiff)
