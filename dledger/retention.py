"""The retention policy as a pure function: which log prefix may go (RocketMQ's fileReservedTime and
diskMaxUsedSpaceRatio, bounded by what the group still needs).

No I/O, no clock: the replica passes the current wall time (compared only with segment seal times,
which were stamped by the same injected clock) and the disk's used ratio.
"""

from __future__ import annotations

from collections.abc import Sequence

from dledger.log_store import SegmentInfo


def retention_target(
    segments: Sequence[SegmentInfo],
    *,
    keep_floor: int,
    now_wall_s: float,
    retention_hours: float,
    disk_used_ratio: float,
    disk_max_used_ratio: float,
) -> int:
    """The first index the log should keep: segments wholly below it may be deleted.

    A sealed segment expires when it was sealed more than ``retention_hours`` ago; when the disk is
    fuller than ``disk_max_used_ratio`` the oldest segment goes even if it has not expired. Never
    past ``keep_floor + 1``: entries after ``keep_floor`` are still needed (not yet durable in the
    state machine, or not yet matched by a live follower). The open (last) segment never goes.
    Returns 0 when nothing may go.
    """
    if len(segments) <= 1:
        return 0
    cutoff = now_wall_s - retention_hours * 3600
    expired_floor = 0
    for seg in segments[:-1]:
        if seg.sealed_wall_s is not None and seg.sealed_wall_s < cutoff:
            expired_floor = seg.last_index + 1
    if disk_used_ratio >= disk_max_used_ratio:
        expired_floor = max(expired_floor, segments[0].last_index + 1)
    return min(expired_floor, keep_floor + 1)
