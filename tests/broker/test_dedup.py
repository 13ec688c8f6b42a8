"""The de-duplication window (broker/store/dedup.py) as a pure object: bounded by count and by the store
times in the records (no clock), the first copy kept, and a restart's rebuild from the checkpoint
giving the same answers as the window before it."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store.dedup import DedupWindow, SendDeduper


def add(w: DedupWindow, uid: str, ts: int, index: int, topic: str = "T", position: int | None = None) -> None:
    w.add(topic, uid, position=index * 10 if position is None else position, queue_id=0, queue_offset=index,
          store_ts=ts, index=index)


def test_bounded_by_count() -> None:
    w = DedupWindow(max_messages=3, window_ms=10_000)
    for i in range(5):
        add(w, f"u{i}", 1000, i + 1)
    assert [w.lookup("T", f"u{i}") is not None for i in range(5)] == [False, False, True, True, True]
    assert len(w) == 3


def test_bounded_by_store_time_not_by_a_clock() -> None:
    w = DedupWindow(max_messages=100, window_ms=1000)
    add(w, "old", 1000, 1)
    add(w, "mid", 1500, 2)
    assert w.lookup("T", "old") is not None
    add(w, "new", 2001, 3)  # the newest store time moved 1001 ms past "old"
    assert w.lookup("T", "old") is None and w.lookup("T", "mid") is not None
    assert len(w) == 2


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["T", "U", "%RETRY%G", "RMQ_SYS_X"]),
            st.sampled_from(["", "a", "b", "c", "d", "e", "f"]),
            st.integers(0, 3000),
        ),
        max_size=60,
    ),
    st.lists(st.integers(1, 8), min_size=1, max_size=10),
)
def test_adding_a_batch_equals_adding_one_by_one(
    msgs: list[tuple[str, str, int]], cuts: list[int]
) -> None:
    # The store adds a whole apply call's messages at once (add_many): same window, same answers,
    # same checkpoint as one add per message, whatever the batch boundaries.
    one, many = DedupWindow(max_messages=7, window_ms=1000), DedupWindow(max_messages=7, window_ms=1000)
    adds = [(topic, uid, i * 10, 0, i, ts, i + 1) for i, (topic, uid, ts) in enumerate(msgs)]
    for topic, uid, position, qid, offset, ts, index in adds:
        one.add(topic, uid, position=position, queue_id=qid, queue_offset=offset, store_ts=ts, index=index)
    k = 0
    for n in cuts * (len(adds) // sum(cuts) + 1):
        many.add_many(adds[k : k + n])
        k += n
    assert len(one) == len(many) and one.checkpoint() == many.checkpoint()
    for topic in ("T", "U", "%RETRY%G"):
        for uid in "abcdef":
            assert one.lookup(topic, uid) == many.lookup(topic, uid)


def test_latest_copy_answers_and_topics_apart() -> None:
    w = DedupWindow()
    add(w, "u", 1000, 1)
    add(w, "u", 1001, 2)  # a copy that reached the log anyway (a race through a leader change)
    latest = w.lookup("T", "u")
    assert latest is not None and latest.index == 2 and len(w) == 1
    assert w.lookup("U", "u") is None
    add(w, "u", 1000, 3, topic="%RETRY%cg")  # broker flows are not de-duplicated
    assert w.lookup("%RETRY%cg", "u") is None
    assert DedupWindow(max_messages=0).lookup("T", "u") is None


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 120),
    cut=st.integers(0, 120),
    max_messages=st.integers(1, 20),
    window_ms=st.integers(1, 50),
)
def test_restore_from_a_checkpoint_gives_the_same_window(
    seed: int, n: int, cut: int, max_messages: int, window_ms: int
) -> None:
    """Apply a log of messages (several per entry, store times that may step back, repeated ids);
    checkpoint after ``cut`` of them; a fresh window restored from that checkpoint by re-adding the
    log from its index/position, then fed the rest, answers every lookup like the original."""
    rng = random.Random(seed)
    log = []  # (index, position, uid, ts)
    ts, position = 1000, 0
    for i in range(n):
        ts += rng.choice([-3, 0, 1, 2, 5])
        position += 10
        log.append((1 + i // 3, position, f"u{rng.randrange(30)}", ts))
    cut = min(cut, n)
    while 0 < cut < n and log[cut][0] == log[cut - 1][0]:
        cut += 1  # a snapshot happens between entries
    original = DedupWindow(max_messages, window_ms)
    for index, pos, uid, t in log[:cut]:
        add(original, uid, t, index, position=pos)
    checkpoint = original.checkpoint()
    restored = DedupWindow(max_messages, window_ms)
    start = restored.begin_restore(checkpoint)
    if start is not None:
        for index, pos, uid, t in log[:cut]:
            if (index, pos) >= start:
                add(restored, uid, t, index, position=pos)
    assert restored.end_restore()
    for index, pos, uid, t in log[cut:]:
        add(original, uid, t, index, position=pos)
        add(restored, uid, t, index, position=pos)
    for k in range(30):
        assert original.lookup("T", f"u{k}") == restored.lookup("T", f"u{k}")


async def test_a_retry_after_an_unknown_outcome_waits_for_the_log_to_be_applied() -> None:
    """The first attempt's append timed out (its entry may still commit): the retry waits until the
    replica applied everything its log held, then the window answers it — no second append."""
    w = DedupWindow()
    state = {"log_end": 7, "applied": 5, "term": 3}
    d = SendDeduper(w, log_end=lambda: state["log_end"], applied=lambda: state["applied"], term=lambda: state["term"])

    async def timed_out() -> None:
        raise TimeoutError("no commit in time")

    with pytest.raises(TimeoutError):
        await d.appending("T", ["u"], timed_out)
    retry = asyncio.ensure_future(d.wait_in_flight("T", ["u"], timeout_s=30.0))
    await asyncio.sleep(0.05)
    assert not retry.done()  # entries 6..7 are not applied yet
    add(w, "u", 1000, 7)  # the first attempt's entry commits and is applied
    state["applied"] = 7
    await asyncio.wait_for(retry, 5.0)
    assert d.known("T", ["u"])[0] is not None
    # decided: a later retry does not wait again
    await asyncio.wait_for(d.wait_in_flight("T", ["u"], timeout_s=30.0), 1.0)

    with pytest.raises(TimeoutError):
        await d.appending("T", ["v"], timed_out)
    state["log_end"] = 9
    retry = asyncio.ensure_future(d.wait_in_flight("T", ["v"], timeout_s=30.0))
    await asyncio.sleep(0.05)
    assert not retry.done()
    state["term"] = 4  # a new leader term: whatever this leader held is decided
    await asyncio.wait_for(retry, 5.0)
    assert d.known("T", ["v"])[0] is None  # never stored: the retry appends it


async def test_a_retry_waits_for_an_attempt_still_being_appended() -> None:
    w = DedupWindow()
    d = SendDeduper(w)
    release = asyncio.Event()

    async def slow_append() -> str:
        await release.wait()
        add(w, "u", 1000, 1)
        return "stored"

    first = asyncio.ensure_future(d.appending("T", ["u"], slow_append))
    await asyncio.sleep(0)
    retry = asyncio.ensure_future(d.wait_in_flight("T", ["u"], timeout_s=30.0))
    await asyncio.sleep(0.05)
    assert not retry.done()
    release.set()
    assert await first == "stored"
    await asyncio.wait_for(retry, 5.0)
    assert d.known("T", ["u"])[0] is not None
