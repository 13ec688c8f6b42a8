"""DLedgerNode's timer for the full tick: armed for what the core next needs, moved when that goes
away, never later than TICK_MAX_S after the last full tick (the stall guard's premise)."""

from __future__ import annotations

from typing import Any

from dledger.clock import ManualClock
from dledger.inproc import InProcNetwork
from dledger.node import TICK_MAX_S, TIMER_POSTPONE_S, DLedgerNode
from dledger.records import RaftSettings


class _Handle:
    def __init__(self, delay: float):
        self.delay = delay
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Loop:
    """Records call_later; nothing runs."""

    def __init__(self) -> None:
        self.armed: list[_Handle] = []

    def call_later(self, delay: float, _callback: Any) -> _Handle:
        handle = _Handle(delay)
        self.armed.append(handle)
        return handle


def _node(tmp_path: Any) -> tuple[DLedgerNode, ManualClock, _Loop]:
    clock = ManualClock()
    settings = RaftSettings(group="g", self_id="n0", peers={"n0": "127.0.0.1:1"}, data_dir=str(tmp_path), password="")
    node = DLedgerNode(settings, clock=clock, network=InProcNetwork())
    loop = _Loop()
    node._loop = loop  # type: ignore[assignment]
    return node, clock, loop


def test_a_timer_no_longer_needed_is_moved_later_but_not_past_the_full_tick_cap(tmp_path: Any) -> None:
    node, clock, loop = _node(tmp_path)
    node._full_due = clock.monotonic() + TICK_MAX_S  # a full tick just ran
    node._arm_timer(0.002)  # a commit to tell in 2 ms
    assert len(loop.armed) == 1 and abs(loop.armed[0].delay - 0.002) < 1e-9
    clock.advance(0.0005)
    node._arm_timer(0.040)  # the next append told it: the heartbeat is what comes next
    assert loop.armed[0].cancelled and len(loop.armed) == 2
    assert abs(loop.armed[1].delay - 0.040) < 1e-9
    clock.advance(0.001)
    node._arm_timer(1.0)  # nothing due for long: still at most TICK_MAX_S after the last full tick
    assert len(loop.armed) == 3 and loop.armed[1].cancelled
    assert abs(clock.monotonic() + loop.armed[2].delay - node._full_due) < 1e-9


def test_a_timer_that_comes_first_or_nearly_so_stays(tmp_path: Any) -> None:
    node, clock, loop = _node(tmp_path)
    node._full_due = clock.monotonic() + TICK_MAX_S
    node._arm_timer(0.010)
    node._arm_timer(0.020)  # later: the armed one (10 ms) fires first and re-arms after its tick...
    assert len(loop.armed) == 2  # ...unless it is more than TIMER_POSTPONE_S early: moved
    node._arm_timer(0.020 + TIMER_POSTPONE_S / 2)  # as good as the armed one
    node._arm_timer(0.0197)  # a little sooner (under 0.5 ms): close enough
    assert len(loop.armed) == 2 and not loop.armed[1].cancelled
    node._arm_timer(0.005)  # sooner: re-armed
    assert len(loop.armed) == 3 and loop.armed[1].cancelled
