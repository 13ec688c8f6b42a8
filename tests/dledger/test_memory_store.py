"""The memory store's crash model: flushed entries survive, a prefix of the rest may."""

from __future__ import annotations

import random

from dledger.clock import ManualClock
from dledger.memory_store import MemoryLogStore


def b(i: int, size: int = 300) -> bytes:
    return bytes([i % 251]) * size


def test_crash_keeps_what_was_flushed() -> None:
    s = MemoryLogStore(4096, ManualClock())
    s.append_many([(i, 1, b(i)) for i in range(1, 6)])
    s.flush()
    s.append_many([(i, 1, b(i)) for i in range(6, 9)])
    lost = s.crash_image(keep_unsynced=0)
    assert lost.last_index == 5 and not lost.dirty
    some = s.crash_image(keep_unsynced=2)
    assert some.last_index == 7
    assert s.last_index == 8  # the original is untouched


def test_crash_image_continues_where_recovery_left_it() -> None:
    s = MemoryLogStore(4096, ManualClock())
    s.append_many([(i, 1, b(i)) for i in range(1, 40)])  # rolls segments: each roll flushes
    flushed = max(g.last_index for g in s.segments()[:-1])
    img = s.crash_image(keep_unsynced=0)
    assert img.last_index == flushed
    segs = img.segments()
    assert segs[-1].sealed_wall_s is not None or segs[-1].last_index == flushed
    pos = img.append(flushed + 1, 2, b"new")
    assert img.read(flushed + 1).position == pos and img.read(flushed + 1).term == 2


def test_random_crashes_keep_a_prefix_and_a_valid_chain() -> None:
    rng = random.Random(7)
    s = MemoryLogStore(2048, ManualClock())
    index = 0
    for _ in range(200):
        n = rng.randint(1, 5)
        s.append_many([(index + k + 1, 1, b(index + k + 1, rng.randint(1, 400))) for k in range(n)])
        index += n
        if rng.random() < 0.3:
            s.flush()
        if rng.random() < 0.1:
            img = s.crash_image(rng)
            assert img.last_index <= s.last_index
            for i in range(img.first_index, img.last_index + 1):
                assert img.read(i) == s.read(i)
            s = img
            index = s.last_index


def test_truncate_and_retention_are_durable_at_once() -> None:
    s = MemoryLogStore(2048, ManualClock())
    s.append_many([(i, 1, b(i)) for i in range(1, 30)])
    s.truncate_suffix(20)
    assert s.crash_image(keep_unsynced=0).last_index == 19
    s.delete_segments_before(10)
    img = s.crash_image(keep_unsynced=0)
    assert img.anchor == s.anchor and img.first_index == s.first_index
