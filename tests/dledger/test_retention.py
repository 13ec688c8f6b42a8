"""The retention policy (dledger/retention.py) as a pure function: expiry by seal time, the disk
ratio override, the floor the group still needs and the open segment that never goes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dledger.log_store import SegmentInfo
from dledger.retention import retention_target

HOUR = 3600.0


def segs(*spans: tuple[int, int, float | None]) -> list[SegmentInfo]:
    return [SegmentInfo(0, first, last, 100, sealed, f"s{first}") for first, last, sealed in spans]


def target(segments: list[SegmentInfo], *, floor: int = 10**9, now: float = 100 * HOUR, used: float = 0.1) -> int:
    return retention_target(
        segments, keep_floor=floor, now_wall_s=now, retention_hours=72, disk_used_ratio=used, disk_max_used_ratio=0.75
    )


def test_expired_sealed_segments_go_up_to_the_first_young_one() -> None:
    log = segs((1, 10, 1 * HOUR), (11, 20, 20 * HOUR), (21, 30, 90 * HOUR), (31, 35, None))
    assert target(log) == 21  # sealed at 1 h and 20 h are older than 72 h at 100 h


def test_nothing_expired_nothing_goes_unless_the_disk_is_full() -> None:
    log = segs((1, 10, 90 * HOUR), (11, 20, 95 * HOUR), (21, 25, None))
    assert target(log) == 0
    assert target(log, used=0.75) == 11  # the oldest segment goes at the ratio


def test_the_floor_bounds_what_goes() -> None:
    log = segs((1, 10, 1 * HOUR), (11, 20, 2 * HOUR), (21, 25, None))
    assert target(log, floor=14) == 15
    assert target(log, floor=0, used=0.9) == 1


def test_the_open_segment_never_goes() -> None:
    assert target(segs((1, 10, None))) == 0
    assert target(segs((1, 10, 1 * HOUR))) == 0  # a single segment is the one being written


@given(
    st.lists(st.tuples(st.integers(1, 50), st.one_of(st.none(), st.floats(0, 200 * HOUR))), min_size=0, max_size=8),
    st.integers(0, 500),
    st.floats(0, 1),
)
def test_never_past_the_floor_or_into_the_open_segment(
    shape: list[tuple[int, float | None]], floor: int, used: float
) -> None:
    spans, first = [], 1
    for n, sealed in shape:
        spans.append((first, first + n - 1, sealed))
        first += n
    log = segs(*spans)
    got = target(log, floor=floor, used=used)
    assert got <= floor + 1
    if log:
        assert got <= log[-1].first_index
