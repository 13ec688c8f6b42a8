"""Latency statistics for the benchmarks and tools: one histogram (HdrHistogram), one percentile rule.

``LatencyHistogram`` keeps microseconds in an HdrHistogram with two significant digits (relative
error ≤ 1 %) from 1 µs to 2^40 µs (12.7 days): memory stays constant however many values it
counts, histograms merge (per-interval into total, per-worker into one), and the mean and the
maximum are kept exactly beside it.
"""

from __future__ import annotations

from hdrh.histogram import HdrHistogram

MAX_US = (1 << 40) - 1
SIGNIFICANT_DIGITS = 2


class LatencyHistogram:
    def __init__(self) -> None:
        self._h = HdrHistogram(1, MAX_US, SIGNIFICANT_DIGITS)
        self.count = 0
        self.sum_us = 0
        self.max_us = 0

    def record_us(self, us: float) -> None:
        """Count one latency; negative values (a clock stepped back) count as 0, huge ones as MAX_US."""
        v = min(max(int(us), 0), MAX_US)
        self._h.record_value(v)
        self.count += 1
        self.sum_us += v
        if v > self.max_us:
            self.max_us = v

    def record_s(self, seconds: float) -> None:
        self.record_us(round(seconds * 1e6))

    def record_ms(self, ms: float) -> None:
        self.record_us(round(ms * 1000))

    def merge(self, other: LatencyHistogram) -> None:
        self._h.add(other._h)
        self.count += other.count
        self.sum_us += other.sum_us
        self.max_us = max(self.max_us, other.max_us)

    def percentile_ms(self, p: float) -> float:
        """The ``p``-th percentile (0 < p ≤ 100), never above the exact maximum; 0 when empty."""
        if not self.count:
            return 0.0
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
