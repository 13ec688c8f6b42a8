"""``LatencyHistogram`` (dledger/apps/stats.py): values counted in its dict of exact values first
give the same percentiles, mean and maximum as values recorded into HdrHistogram one by one,
across drains (more distinct values than ``PENDING_MAX``) and merges."""

from __future__ import annotations

from hdrh.histogram import HdrHistogram
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.apps import stats
from dledger.apps.stats import MAX_US, SIGNIFICANT_DIGITS, LatencyHistogram

PERCENTILES = (1, 50, 90, 99, 99.9, 100)


def reference(values: list[int]) -> HdrHistogram:
    h = HdrHistogram(1, MAX_US, SIGNIFICANT_DIGITS)
    for v in values:
        h.record_value(min(max(v, 0), MAX_US))
    return h


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-5, 10**7), max_size=400),
    st.lists(st.integers(0, 2**41), max_size=50),
    st.integers(2, 40),
)
def test_buffered_counts_match_hdrhistogram(values: list[int], more: list[int], pending_max: int) -> None:
    old = stats.PENDING_MAX
    stats.PENDING_MAX = pending_max  # small: many drains within one example
    try:
        a, b = LatencyHistogram(), LatencyHistogram()
        for v in values:
            a.record_us(v)
        for v in more:
            b.record_us(v)
        a.merge(b)
        everything = values + more
        ref = reference(everything)
        assert a.count == len(everything)
        clipped = [min(max(v, 0), MAX_US) for v in everything]
        assert a.sum_us == sum(clipped) and a.max_us == max(clipped, default=0)
        for p in PERCENTILES:
            want = min(ref.get_value_at_percentile(p), max(clipped, default=0)) / 1000 if everything else 0.0
            assert a.percentile_ms(p) == want, p
    finally:
        stats.PENDING_MAX = old


def test_memory_stays_bounded_however_many_distinct_values() -> None:
    h = LatencyHistogram()
    for v in range(3 * stats.PENDING_MAX + 7):
        h.record_us(v)
    assert len(h._pending) < stats.PENDING_MAX
    assert h.percentile_ms(100) == (3 * stats.PENDING_MAX + 6) / 1000
