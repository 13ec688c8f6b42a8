"""The workload's deterministic choices of delayed sends and failed deliveries, and the history
lines that carry them (version 3, backwards compatible)."""

from __future__ import annotations

from collections import Counter

from chaos.history import ReceiptRecord, SendRecord, receipt_from_message
from chaos.workload import DELIVER_MAX_S, delay_choice, due_us, fail_plan, fails


def test_delay_choice_is_deterministic_short_and_near_its_share() -> None:
    ids = [f"id-{i}" for i in range(20_000)]
    picks = [delay_choice(u, 0.2) for u in ids]
    assert picks == [delay_choice(u, 0.2) for u in ids]
    chosen = [p for p in picks if p is not None]
    assert 0.18 < len(chosen) / len(ids) < 0.22
    levels = Counter(p[0] for p in chosen if p[0])
    ahead = Counter(p[1] for p in chosen if p[1])
    assert set(levels) == {1, 2, 3} and set(ahead) == set(range(1, DELIVER_MAX_S + 1))
    assert all((p[0] == 0) != (p[1] == 0) for p in chosen)  # a level or a deliver time, never both
    assert all(delay_choice(u, 0.0) is None for u in ids[:100])


def test_fail_plan_splits_its_share_between_once_and_always() -> None:
    ids = [f"id-{i}" for i in range(20_000)]
    plans = Counter(fail_plan(u, 0.1) for u in ids)
    assert 0.04 < plans["once"] / len(ids) < 0.06 and 0.04 < plans["always"] / len(ids) < 0.06
    once = next(u for u in ids if fail_plan(u, 0.1) == "once")
    always = next(u for u in ids if fail_plan(u, 0.1) == "always")
    assert [fails(once, n, 0.1) for n in range(3)] == [True, False, False]
    assert [fails(always, n, 0.1) for n in range(3)] == [True, True, True]
    assert not any(fails(u, 0, 0.0) for u in ids[:100])


def test_due_time_follows_the_broker_rules() -> None:
    assert due_us(1_000, 1, None) == 2_000_000  # level 1: 1 s after the store time
    assert due_us(1_000, 3, None) == 11_000_000  # level 3: 10 s
    assert due_us(1_000, 0, 5_000) == 5_000_000  # deliver time
    assert due_us(9_000, 0, 5_000) == 9_000_000  # a deliver time in the past: at the store time
    assert due_us(1_000, 0, None) is None


def test_version_3_fields_are_left_out_when_unset() -> None:
    plain = SendRecord("p0", "u", None, 0, "T", 1, 2, "ok", None, "G", 0, 0, "G:0", 1_000, 7).to_dict()
    assert not {"delay_level", "deliver_ms", "due_us"} & set(plain)
    delayed = SendRecord("p0", "u", None, 0, "T", 1, 2, "ok", None, "G", 0, 0, "G:0", 1_000, 7, delay_level=2,
                         due_us=6_000).to_dict()
    assert (delayed["delay_level"], delayed["due_us"]) == (2, 6_000) and "deliver_ms" not in delayed
    r = ReceiptRecord("c0", 1, "T", "G", 0, 0, "G:0", "u", None, 0, "p0", 1, 1).to_dict()
    assert not {"reconsume_times", "retry", "answer"} & set(r)


def test_a_dlq_message_read_through_the_api_records_its_reconsume_count() -> None:
    m = {"topic": "%DLQ%g", "broker_name": "G", "queue_id": 0, "queue_offset": 3, "msg_id": "G:1", "unique_id": "u",
         "properties": {"RECONSUME_TIME": "2", "RETRY_TOPIC": "T"}, "born_ts": 1, "store_ts": 2, "body": b"x"}
    d = receipt_from_message(m, "dlq", 5, "dlq", retry_fields=True).to_dict()
    assert (d["type"], d["reconsume_times"], d["retry"]) == ("dlq", 2, True) and "answer" not in d
