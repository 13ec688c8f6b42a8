"""Latency statistics for the benchmarks and tools: one histogram (HdrHistogram), one percentile rule.

``LatencyHistogram`` keeps microseconds in an HdrHistogram with two significant digits (relative
error ≤ 1 %) from 1 µs to 2^40 µs (12.7 days): memory stays constant however many values it
counts, histograms merge (per-interval into total, per-worker into one), and the mean and the
maximum are kept exactly beside it. A value is first counted in a small dict keyed by the value
cut to the histogram's own resolution (its top ``SUB_BUCKET_BITS`` bits: the same HdrHistogram
bucket, so the same percentiles) — a dict increment against HdrHistogram's pure-Python bucket
arithmetic, paid per message by the load generator — and goes into the HdrHistogram when that dict
holds ``PENDING_MAX`` keys or when the histogram is read or merged.
"""

from __future__ import annotations

from hdrh.histogram import HdrHistogram

MAX_US = (1 << 40) - 1
SIGNIFICANT_DIGITS = 2
PENDING_MAX = 4096  # distinct keys counted before they go into the HdrHistogram
# HdrHistogram keeps a value's top bits: 2 significant digits -> 2 * 10**2 = 200 -> 8 bits
SUB_BUCKET_BITS = (2 * 10**SIGNIFICANT_DIGITS - 1).bit_length()
_EXACT_BELOW = 1 << SUB_BUCKET_BITS


class LatencyHistogram:
    def __init__(self) -> None:
        self._h = HdrHistogram(1, MAX_US, SIGNIFICANT_DIGITS)
        self._pending: dict[int, int] = {}  # value cut to _h's resolution -> count, not yet in _h
        self.count = 0
        self.sum_us = 0
        self.max_us = 0

    def record_us(self, us: float) -> None:
        """Count one latency; negative values (a clock stepped back) count as 0, huge ones as MAX_US."""
        v = int(us)
        if v < 0:
            v = 0
        elif v > MAX_US:
            v = MAX_US
        key = v
        if v >= _EXACT_BELOW:  # keep the bits the histogram keeps
            shift = v.bit_length() - SUB_BUCKET_BITS
            key = v >> shift << shift
        pending = self._pending
        pending[key] = pending.get(key, 0) + 1
        if len(pending) >= PENDING_MAX:
            self._drain()
        self.count += 1
        self.sum_us += v
        if v > self.max_us:
            self.max_us = v

    def record_s(self, seconds: float) -> None:
        self.record_us(round(seconds * 1e6))

    def record_ms(self, ms: float) -> None:
        self.record_us(round(ms * 1000))

    def _drain(self) -> None:
        h = self._h
        for v, n in self._pending.items():
            h.record_value(v, n)
        self._pending.clear()

    def merge(self, other: LatencyHistogram) -> None:
        self._drain()
        other._drain()
        self._h.add(other._h)
        self.count += other.count
        self.sum_us += other.sum_us
        self.max_us = max(self.max_us, other.max_us)

    def percentile_ms(self, p: float) -> float:
        """The ``p``-th percentile (0 < p ≤ 100), never above the exact maximum; 0 when empty."""
        if not self.count:
            return 0.0
        self._drain()
        return min(self._h.get_value_at_percentile(p), self.max_us) / 1000

    def mean_ms(self) -> float:
        return self.sum_us / self.count / 1000 if self.count else 0.0

    def max_ms(self) -> float:
        return self.max_us / 1000

    def summary_ms(self) -> dict[str, float]:
        return {
            "avg": round(self.mean_ms(), 3),
            "p50": round(self.percentile_ms(50), 3),
            "p90": round(self.percentile_ms(90), 3),
            "p99": round(self.percentile_ms(99), 3),
            "p999": round(self.percentile_ms(99.9), 3),
            "max": round(self.max_ms(), 3),
        }
