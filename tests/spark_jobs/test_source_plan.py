"""The dledger-mq data source's pure parts: options, JSON offsets, resolving, range planning,
micro-batch limits, the range reader's step function, the Arrow codec. No sockets, no Spark."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from broker.client.message import MessageQueue
from spark_jobs.source.options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    SourceOptionError,
    offsets_from_json,
    offsets_to_json,
    parse_filter,
    parse_options,
)
from spark_jobs.source.plan import (
    ClusterView,
    DataLossError,
    QueueView,
    ReadRange,
    ReplicaRange,
    check_batch_bounds,
    next_end,
    plan_ranges,
    probe_targets,
    rate_limit,
    replica_order,
    require_available,
    resolve,
    timestamp_queries,
)
from spark_jobs.source.reader import best_of_round, record_skipped, served_from, step

T = "TopicA"
G0, G1 = "RaftNode00", "RaftNode01"


def mq(q: int, broker: str = G0, topic: str = T) -> MessageQueue:
    return MessageQueue(topic, broker, q)


def opts(mode: str = "batch", **kv: str) -> Any:
    raw = {"namesrv": "127.0.0.1:19876", "topic": T, **kv}
    return parse_options(raw, mode, env={})  # type: ignore[arg-type]


def view_of(ranges: dict[MessageQueue, tuple[int, int]]) -> dict[MessageQueue, QueueView]:
    """Three replicas per queue holding the same [min, max): leader L, followers F1, F2."""
    out = {}
    for m, (lo, hi) in ranges.items():
        reps = tuple(
            ReplicaRange(f"{m.broker_name}-{name}", name == "L", lo, hi) for name in ("L", "F1", "F2")
        )
        out[m] = QueueView(m, reps)
    return out


# -- options ---------------------------------------------------------------------------------------
def test_defaults_depend_on_the_mode() -> None:
    b = opts("batch")
    assert b.topics == (T,) and b.namesrv == ("127.0.0.1:19876",)
    assert b.starting == OffsetSpec("earliest") and b.ending == OffsetSpec("latest")
    assert b.tags is None and b.tags_expression == "*"
    assert b.fail_on_data_loss and b.prefer_followers and b.pull_batch_size == 1024
    assert b.max_records_per_trigger is None and b.security.credentials is None and not b.security.tls
    s = opts("stream")
    assert s.starting == OffsetSpec("latest")


def test_option_names_are_case_insensitive_and_typos_are_refused() -> None:
    o = parse_options({"NAMESRV": "a:1;b:2", "Topics": "A, B", "FAILONDATALOSS": "false"}, "batch")
    assert o.namesrv == ("a:1", "b:2") and o.topics == ("A", "B") and not o.fail_on_data_loss
    with pytest.raises(SourceOptionError, match="startingoffset"):
        opts(startingOffset="earliest")
    with pytest.raises(SourceOptionError, match=r"unknown option.*path"):
        opts(path="/x")


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"namesrv": "a:1"}, "topic .*required"),
        ({"topic": "A", "topics": "B"}, "not both"),
        ({"topic": "bad topic"}, "must match"),
        ({"topic": "A,A"}, "twice"),
        ({"topic": " , "}, "names no topic"),
        ({"topic": "A", "namesrv": "nohostport"}, "namesrv"),
        ({"topic": "A", "failOnDataLoss": "yes"}, "true or false"),
        ({"topic": "A", "pullBatchSize": "2000"}, r"pullBatchSize.*\[1, 1024\]"),
        ({"topic": "A", "maxRecordsPerPartition": "0"}, "maxRecordsPerPartition"),
        ({"topic": "A", "timeoutMs": "abc"}, "timeoutMs"),
        ({"topic": "A", "startingOffsets": "earliest", "startingTimestamp": "5"}, "at most one"),
        ({"topic": "A", "startingTimestamp": "-5"}, "milliseconds"),
        ({"topic": "A", "endingOffsets": "earliest"}, "reads nothing"),
        ({"topic": "A", "endingOffsets": '{"A": {"G": {"0": -2}}}'}, "not an ending offset"),
        ({"topic": "A", "maxRecordsPerTrigger": "10"}, "streaming reads only"),
        ({"topic": "A", "startingOffsets": "{not json"}, "JSON like"),
        ({"topic": "A", "startingOffsets": "[1]"}, "keyed by topic"),
        ({"topic": "A", "startingOffsets": '{"B": {"G": {"0": 1}}}'}, "'B' is not one of the topics"),
        ({"topic": "A", "startingOffsets": '{"A": {"G": {"x": 1}}}'}, "queue id 'x'"),
        ({"topic": "A", "startingOffsets": '{"A": {"G": {"0": -3}}}'}, "-2 \\(earliest\\) or -1"),
        ({"topic": "A", "startingOffsets": '{"A": {"G": {"0": "5"}}}'}, "must be an integer"),
        ({"topic": "A", "startingOffsets": '{"A": {"G": {"0": true}}}'}, "must be an integer"),
        ({"topic": "A", "startingOffsets": '{"A": {"G": {}}}'}, "map queue ids"),
        ({"topic": "A", "filter": "sql:a > 1 AN b = 2"}, "unexpected 'AN' at position 6"),
        ({"topic": "A", "filter": "a > 1"}, "expected 'tag:"),
        ({"topic": "A", "filter": "tag:||"}, "names no tag"),
        ({"topic": "A", "accessKey": "ak"}, "go together"),
    ],
)
def test_bad_options_get_clear_errors(raw: dict[str, str], message: str) -> None:
    with pytest.raises(SourceOptionError, match=message):
        parse_options(raw, "batch", env={})


def test_stream_refuses_ending_offsets() -> None:
    with pytest.raises(SourceOptionError, match="batch reads only"):
        opts("stream", endingOffsets='{"TopicA": {"G": {"0": 5}}}')
    assert opts("stream", maxRecordsPerTrigger="7").max_records_per_trigger == 7


def test_filters() -> None:
    assert parse_filter(None) is None and parse_filter("tag:*") is None and parse_filter(" ") is None
    assert parse_filter("tag:A || B") == frozenset({"A", "B"})
    assert parse_filter("TAG:A") == frozenset({"A"})
    assert opts(filter="tag:B||A").tags_expression == "A||B"
    o = opts(filter="sql: a > 5 AND region IN ('eu')")
    assert (o.sql, o.tags, o.tags_expression, o.filtered) == (" a > 5 AND region IN ('eu')", None, "*", True)
    assert opts(filter="tag:A").sql is None and not opts().filtered


def test_offset_specs_and_json_offsets() -> None:
    o = opts(startingOffsets='{"TopicA": {"RaftNode00": {"1": 5, "0": -2}, "RaftNode01": {"0": -1}}}')
    assert o.starting.kind == "offsets"
    assert o.starting.queue_map() == {mq(0): EARLIEST, mq(1): 5, mq(0, G1): LATEST}
    assert opts(startingTimestamp="1700000000000").starting == OffsetSpec("timestamp", ts_ms=1700000000000)
    t = opts(endingOffsetsByTimestamp='{"TopicA": {"RaftNode00": {"0": 1700000000000}}}')
    assert t.ending.kind == "timestamps" and t.ending.queue_map() == {mq(0): 1700000000000}
    assert opts(startingOffsets="LATEST").starting == OffsetSpec("latest")


def test_offsets_json_round_trip_is_sorted_and_stable() -> None:
    offsets = {mq(3, G1): 9, mq(0): 4, mq(1, topic="B"): 2, mq(10): 1, mq(2): 0}
    doc = offsets_to_json(offsets)
    assert list(doc) == ["B", T] and list(doc[T]) == [G0, G1] and list(doc[T][G0]) == ["0", "2", "10"]
    assert offsets_from_json(json.loads(json.dumps(doc))) == offsets
    shuffled = dict(random.Random(1).sample(sorted(offsets.items()), len(offsets)))
    assert json.dumps(offsets_to_json(shuffled)) == json.dumps(doc)
    with pytest.raises(SourceOptionError):
        offsets_from_json({T: {G0: {"0": -1}}})


# -- resolving -------------------------------------------------------------------------------------
def test_resolve_each_kind() -> None:
    queues = view_of({mq(0): (3, 10), mq(1): (0, 4)})
    assert resolve(OffsetSpec("earliest"), queues, "s") == {mq(0): 3, mq(1): 0}
    assert resolve(OffsetSpec("latest"), queues, "s") == {mq(0): 10, mq(1): 4}
    spec = OffsetSpec("offsets", per_queue=((mq(0), EARLIEST), (mq(1), 2)))
    assert resolve(spec, queues, "s") == {mq(0): 3, mq(1): 2}
    ts = OffsetSpec("timestamp", ts_ms=77)
    assert timestamp_queries(ts, queues) == {mq(0): 77, mq(1): 77}
    assert resolve(ts, queues, "s", {mq(0): 5, mq(1): 4}) == {mq(0): 5, mq(1): 4}
    per = OffsetSpec("timestamps", per_queue=((mq(0), 50), (mq(1), LATEST)))
    assert timestamp_queries(per, queues) == {mq(0): 50}
    assert resolve(per, queues, "s", {mq(0): 6}) == {mq(0): 6, mq(1): 4}


def test_only_starts_meaning_the_oldest_data_are_probed_for_removed_messages() -> None:
    start = {mq(0): 5, mq(1): 9}
    assert probe_targets(OffsetSpec("earliest"), start) == start
    assert probe_targets(OffsetSpec("timestamp", ts_ms=1), start) == start
    assert probe_targets(OffsetSpec("latest"), start) == {}
    spec = OffsetSpec("offsets", per_queue=((mq(0), EARLIEST), (mq(1), 9)))
    assert probe_targets(spec, start) == {mq(0): 5}  # an explicit offset is taken as asked
    spec = OffsetSpec("timestamps", per_queue=((mq(0), 123), (mq(1), LATEST)))
    assert probe_targets(spec, start) == {mq(0): 5}


def test_json_offsets_must_name_every_queue_and_only_known_ones() -> None:
    queues = view_of({mq(q): (0, 5) for q in range(3)})
    with pytest.raises(SourceOptionError, match=r"missing: TopicA@RaftNode00:1, TopicA@RaftNode00:2"):
        resolve(OffsetSpec("offsets", per_queue=((mq(0), 1),)), queues, "startingOffsets")
    spec = OffsetSpec("offsets", per_queue=tuple((mq(q), 0) for q in range(4)))
    with pytest.raises(SourceOptionError, match=r"do not have.*TopicA@RaftNode00:3"):
        resolve(spec, queues, "startingOffsets")


def test_batch_bounds_and_unreachable_groups() -> None:
    check_batch_bounds({mq(0): 3}, {mq(0): 3})
    with pytest.raises(SourceOptionError, match="start 4 > end 3"):
        check_batch_bounds({mq(0): 4}, {mq(0): 3})
    view = ClusterView((QueueView(mq(0), ()),), (("RaftNode00", "127.0.0.1:1 CONNECT_FAILED"),))
    with pytest.raises(RuntimeError, match=r"RaftNode00: 127\.0\.0\.1:1 CONNECT_FAILED"):
        require_available(view)


# -- ranges ----------------------------------------------------------------------------------------
def test_ranges_split_per_queue_and_cover_exactly_start_to_end() -> None:
    queues = view_of({mq(0): (0, 25), mq(1): (0, 10), mq(0, G1): (0, 3)})
    ranges = plan_ranges(
        {mq(0): 0, mq(1): 10, mq(0, G1): 1}, {mq(0): 25, mq(1): 10, mq(0, G1): 3}, queues,
        max_records_per_partition=10,
    )  # fmt: skip
    assert [(r.mq, r.start, r.end) for r in ranges] == [
        (mq(0), 0, 10), (mq(0), 10, 20), (mq(0), 20, 25), (mq(0, G1), 1, 3),
    ]  # fmt: skip
    # a queue absent from start enters at its end; one whose end is below its start was reset
    assert plan_ranges({}, {mq(0): 7}, queues, max_records_per_partition=5) == []
    assert plan_ranges({mq(0): 9}, {mq(0): 2}, queues, max_records_per_partition=5) == []


def test_replica_order_followers_first_rotated_then_laggards() -> None:
    q = QueueView(
        mq(0),
        (
            ReplicaRange("L", True, 0, 100),
            ReplicaRange("F1", False, 0, 100),
            ReplicaRange("F2", False, 0, 60),  # lagging
        ),
    )
    assert replica_order(q, 10, 50, True, 0) == ("F1", "F2", "L")
    assert replica_order(q, 10, 90, True, 0) == ("F1", "L", "F2")
    assert replica_order(q, 10, 90, False, 0) == ("L", "F1", "F2")
    both = QueueView(
        mq(0), (ReplicaRange("L", True, 0, 9), ReplicaRange("F1", False, 0, 9), ReplicaRange("F2", False, 0, 9))
    )
    assert replica_order(both, 0, 9, True, 0) == ("F1", "F2", "L")
    assert replica_order(both, 0, 9, True, 1) == ("F2", "F1", "L")
    retained = QueueView(mq(0), (ReplicaRange("L", True, 50, 100), ReplicaRange("F1", False, 0, 100)))
    assert replica_order(retained, 10, 20, True, 0) == ("F1", "L")
    assert replica_order(None, 0, 1, True, 0) == ()
    ranges = plan_ranges({mq(0): 0}, {mq(0): 9}, {mq(0): both}, max_records_per_partition=3)
    assert [r.addrs[0] for r in ranges] == ["F1", "F2", "F1"]  # followers share the work


# -- micro-batches ---------------------------------------------------------------------------------
def test_rate_limit_shares_in_proportion_and_never_exceeds() -> None:
    start = {mq(0): 0, mq(1): 100, mq(2): 5}
    latest = {mq(0): 90, mq(1): 110, mq(2): 5}
    assert rate_limit(start, latest, 1000) == latest
    end = rate_limit(start, latest, 10)
    assert end == {mq(0): 8, mq(1): 102, mq(2): 5}  # one each first, then 7 + 1 of the 8 left
    seed = random.Random().randrange(1 << 30)
    print(f"rate_limit property seed {seed}")
    rng = random.Random(seed)
    for _ in range(300):
        n = rng.randrange(1, 8)
        start = {mq(q): rng.randrange(0, 50) for q in range(n)}
        latest = {m: s + rng.choice([0, 0, 1, rng.randrange(0, 500)]) for m, s in start.items()}
        limit = rng.randrange(1, 400)
        end = rate_limit(start, latest, limit)
        took = {m: end[m] - start[m] for m in start}
        backlog = sum(latest[m] - start[m] for m in start)
        assert all(0 <= took[m] <= latest[m] - start[m] for m in start)
        assert sum(took.values()) == min(limit, backlog)
        if limit >= n:  # every queue with a backlog moves
            assert all(took[m] > 0 for m in start if latest[m] > start[m])


def test_next_end_new_queues_resets_unreachable_groups_and_caps() -> None:
    queues = view_of({mq(0): (0, 50), mq(1): (20, 30), mq(2): (0, 4)})
    unreachable = QueueView(mq(0, G1), ())
    view = ClusterView((*queues.values(), unreachable), (("RaftNode01", "down"),))
    start = {mq(0): 10, mq(2): 9, mq(0, G1): 6}
    end, events = next_end(start, view, max_records=None)
    assert end == {mq(0): 50, mq(1): 20, mq(2): 0, mq(0, G1): 6}
    assert [(e.mq, e.kind, e.from_offset, e.to_offset) for e in events] == [(mq(2), "reset", 9, 0)]
    assert "re-created" in events[0].describe()
    capped, _ = next_end({mq(0): 10, mq(1): 20}, view, max_records=None, cap={mq(0): 15})
    assert capped[mq(0)] == 15 and capped[mq(1)] == 30
    limited, _ = next_end({mq(0): 10, mq(1): 20}, view, max_records=10)
    assert limited[mq(0)] - 10 + limited[mq(1)] - 20 == 10


def test_micro_batches_cover_every_offset_once_and_replay_identically() -> None:
    """A growing queue set read in limited micro-batches: the union of the planned ranges is
    exactly [first, last) per queue, and re-planning any batch from its (start, end) — what a
    restart from the checkpoint does — gives the same offsets."""
    seed = random.Random().randrange(1 << 30)
    print(f"micro-batch seed {seed}")
    rng = random.Random(seed)
    maxes = {mq(0): 0, mq(1): 0}
    start = {m: 0 for m in maxes}
    log: list[tuple[dict[MessageQueue, int], dict[MessageQueue, int]]] = []
    for round_no in range(60):
        for m in maxes:
            maxes[m] += rng.randrange(0, 40)
        if round_no == 20:
            maxes[mq(0, G1)] = 7  # a new group appears with data
        view = ClusterView(tuple(view_of({m: (0, hi) for m, hi in maxes.items()}).values()))
        end, events = next_end(start, view, max_records=25)
        assert not events
        log.append((dict(start), end))
        start = end
    covered: dict[MessageQueue, list[int]] = {}
    queues = view_of({m: (0, hi) for m, hi in maxes.items()})
    for s, e in log:
        ranges = plan_ranges(s, e, queues, max_records_per_partition=9)
        again = plan_ranges(json_round(s), json_round(e), {}, max_records_per_partition=9)
        assert [(r.mq, r.start, r.end) for r in ranges] == [(r.mq, r.start, r.end) for r in again]
        for r in ranges:
            covered.setdefault(r.mq, []).extend(range(r.start, r.end))
    for m, offsets in covered.items():
        assert offsets == list(range(0, start[m])), m


def json_round(offsets: dict[MessageQueue, int]) -> dict[MessageQueue, int]:
    return offsets_from_json(json.loads(json.dumps(offsets_to_json(offsets))))


# -- the range reader's step -----------------------------------------------------------------------
def found(offsets: list[int], next_offset: int) -> dict[str, Any]:
    return {
        "status": "FOUND",
        "next_offset": next_offset,
        "min_offset": 0,
        "max_offset": 999,
        "messages": [{"queue_offset": o} for o in offsets],
    }


def test_step_found_contiguous_and_trimmed_at_the_end() -> None:
    assert step(10, 100, found([10, 11, 12], 13), filtered=False).__dict__ == {
        "keep": 3, "lost": (), "next_offset": 13,
    }  # fmt: skip
    s = step(10, 12, found([10, 11, 12, 13], 14), filtered=False)
    assert (s.keep, s.lost, s.next_offset) == (2, (), 12)


def test_step_holes_are_losses_only_without_a_filter() -> None:
    s = step(10, 100, found([12, 13, 16], 20), filtered=False)
    assert (s.keep, s.lost, s.next_offset) == (3, ((10, 12), (14, 16), (17, 20)), 20)
    s = step(10, 100, found([12, 13, 16], 20), filtered=True)
    assert (s.keep, s.lost, s.next_offset) == (3, (), 20)
    nm = {"status": "NO_MATCHED_MSG", "next_offset": 30, "min_offset": 0, "max_offset": 99, "messages": []}
    assert step(10, 25, nm, filtered=True).lost == () and step(10, 25, nm, filtered=True).next_offset == 25
    assert step(10, 25, nm, filtered=False).lost == ((10, 25),)


def test_step_offset_too_small_skips_to_the_min_offset() -> None:
    small = {"status": "OFFSET_TOO_SMALL", "next_offset": 40, "min_offset": 40, "max_offset": 99, "messages": []}
    s = step(10, 100, small, filtered=True)
    assert (s.keep, s.lost, s.next_offset) == (0, ((10, 40),), 40)
    s = step(10, 30, small, filtered=False)
    assert (s.lost, s.next_offset) == (((10, 30),), 30)


def test_step_refuses_answers_that_make_no_progress_or_go_backwards() -> None:
    with pytest.raises(RuntimeError, match="without progress"):
        step(10, 100, found([], 10), filtered=False)
    with pytest.raises(RuntimeError, match="out of order"):
        step(10, 100, found([11, 10], 12), filtered=False)


def test_served_from_tells_a_replica_that_lost_the_head_from_one_that_serves_it() -> None:
    small = {"status": "OFFSET_TOO_SMALL", "next_offset": 40, "min_offset": 40, "max_offset": 99, "messages": []}
    nm = {"status": "NO_MATCHED_MSG", "next_offset": 30, "min_offset": 0, "max_offset": 99, "messages": []}
    assert served_from(10, found([10, 11], 12), filtered=False) == 10
    assert served_from(10, found([14, 15], 16), filtered=False) == 14  # head skipped as removed
    assert served_from(10, found([14, 15], 16), filtered=True) == 10  # non-matching messages
    assert served_from(10, nm, filtered=False) == 30 and served_from(10, nm, filtered=True) == 10
    assert served_from(10, small, filtered=True) == 40 and served_from(50, small, filtered=False) == 50


def test_a_loss_is_believed_only_when_no_replica_serves_the_offset() -> None:
    a = found([14, 15], 16)  # lost the head up to 14
    b = found([12, 13], 14)  # lost less
    small = {"status": "OFFSET_TOO_SMALL", "next_offset": 20, "min_offset": 20, "max_offset": 99, "messages": []}
    assert best_of_round(10, [a, b, small], 3, filtered=False) is b
    assert best_of_round(10, [a, small], 3, filtered=False) is None  # the third replica lags: retry
    assert best_of_round(10, [], 2, filtered=False) is None
    assert step(10, 100, b, filtered=False).lost == ((10, 12),)


def test_record_skipped_fails_or_reports(tmp_path: Any) -> None:
    rng = ReadRange(mq(2), 0, 50, ("a",))
    with pytest.raises(DataLossError, match=r"DATA_LOSS: TopicA@RaftNode00:2 offsets \[0, 7\)"):
        record_skipped(opts(), rng.mq, [(0, 7)], "retention")
    path = tmp_path / "loss.jsonl"
    o = opts(failOnDataLoss="false", dataLossLog=str(path))
    record_skipped(o, rng.mq, [(0, 7), (9, 10)], "retention")
    record_skipped(o, rng.mq, [], "nothing")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["topic"], r["broker"], r["queue_id"], r["from_offset"], r["to_offset"]) for r in rows] == [
        (T, G0, 2, 0, 7), (T, G0, 2, 9, 10),
    ]  # fmt: skip


# -- the Arrow codec -------------------------------------------------------------------------------
def test_record_batch_matches_the_schema_spark_checks() -> None:
    from spark_jobs.source.schema import ARROW_SCHEMA, SCHEMA, to_record_batch

    msgs = [
        {
            "topic": T, "broker_name": G0, "queue_id": 3, "queue_offset": 7, "msg_id": "RaftNode00:00000000000000A0",
            "unique_id": "U1", "keys": ["k1", "k2"], "tags": "TagA", "properties": {"a": "b"},
            "body": b"\x00\xff", "born_ts": 1_700_000_000_123, "store_ts": 1_700_000_000_456,
        },
        {
            "topic": T, "broker_name": G0, "queue_id": 3, "queue_offset": 8, "msg_id": "RaftNode00:00000000000000F0",
            "unique_id": "U2", "keys": [], "tags": "", "properties": {}, "body": b"x",
            "born_ts": 0, "store_ts": 1,
        },
    ]  # fmt: skip
    batch = to_record_batch(msgs)
    assert batch.schema.equals(ARROW_SCHEMA) and batch.schema.names == SCHEMA.fieldNames()
    rows = batch.to_pylist()
    assert rows[0]["keys"] == ["k1", "k2"] and rows[0]["properties"] == [("a", "b")]
    assert rows[0]["body"] == b"\x00\xff" and rows[1]["tags"] == "" and rows[1]["keys"] == []
    assert rows[0]["store_timestamp"].timestamp() == 1_700_000_000.456
    assert [r["queue_offset"] for r in rows] == [7, 8]


def test_bench_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from spark_jobs.source import bench

    for argv in (["--messages", "0"], ["--queues", "2000"], ["--option", "noequals"]):
        with pytest.raises(SystemExit) as info:
            bench.main(argv)
        assert info.value.code == 2, argv
    assert "--option takes KEY=VALUE" in capsys.readouterr().err
