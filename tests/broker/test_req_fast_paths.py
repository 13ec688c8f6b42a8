"""The broker's and the client's per-request work made cheaper (issue 26, 32 senders): each fast path
gives exactly what the plain code it replaced gives — the same series, the same bytes, the same
answers."""

from __future__ import annotations

import random
import types

from prometheus_client import generate_latest

from broker.server import metrics as metrics_mod
from broker.server.metrics import OTHER, BrokerMetrics, RateWindow
from dledger.clock import ManualClock


def _metrics(clock: ManualClock, limit: int) -> BrokerMetrics:
    cfg = types.SimpleNamespace(cluster="C", broker_name="B", dledger=types.SimpleNamespace(self_id="n0"))
    m = BrokerMetrics(types.SimpleNamespace(cfg=cfg, clock=clock))
    m._topics = metrics_mod._Bounded(limit)
    m.producer_rate = RateWindow(clock, keys_max=limit)
    return m


def _sent_plain(m: BrokerMetrics, topic: str, count: int, nbytes: int, seconds: float) -> None:
    """``BrokerMetrics.sent`` as it was: every series looked up by its labels on every call."""
    t = m._topics.admit(topic, OTHER)
    m.messages_in.labels(**m.base, topic=t).inc(count)
    m.throughput_in.labels(**m.base, topic=t).inc(nbytes)
    m.send_latency.labels(**m.base, topic=t).observe(seconds)
    m.producer_rate.add(m.producer_rate.key(t, OTHER), count)


def _series(m: BrokerMetrics) -> list[bytes]:
    """The exposition's lines but the ``_created`` ones (the wall time a child was made)."""
    return [line for line in generate_latest(m.registry).splitlines() if b"_created" not in line]


def test_sent_with_cached_children_equals_the_plain_lookups() -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rnd = random.Random(seed)
    clock_a, clock_b = ManualClock(), ManualClock()
    fast, plain = _metrics(clock_a, 4), _metrics(clock_b, 4)
    topics = [f"T{i}" for i in range(9)]  # past the bound: later topics count under OTHER
    for _ in range(600):
        topic = rnd.choice(topics)
        count, nbytes, seconds = rnd.randint(1, 64), rnd.randint(0, 1 << 20), rnd.random() / 50
        fast.sent(topic, count, nbytes, seconds)
        _sent_plain(plain, topic, count, nbytes, seconds)
        step = rnd.random() * 0.7
        clock_a.advance(step)
        clock_b.advance(step)
    assert _series(fast) == _series(plain)
    assert fast.producer_rate.rates() == plain.producer_rate.rates()
    assert OTHER in fast.producer_rate.rates()
    assert len(fast._sent_children) <= 5  # the bound's topics and OTHER
