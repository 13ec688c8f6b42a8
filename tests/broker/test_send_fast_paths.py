"""The leader's send path made cheaper per message (issue 26): each fast path gives exactly what the
plain code it replaced gives — the same record bytes, the same messages, the same answers and errors."""

from __future__ import annotations

import random
import struct
import threading
import types
import zlib
from typing import Any

import msgpack
import pytest

from broker.protocol.errors import ProtocolError
from broker.protocol.frames import pack_body
from broker.protocol.properties import (
    BROKER_TOPICS,
    PROP_DELAY,
    PROP_TIMER_DELAY_SEC,
    RESERVED_PROPS,
    SCHEDULE_PROPS,
)
from broker.service.send import SendOps, SendResult
from broker.store import message, schedule
from broker.store.dedup import FirstSend
from broker.store.message import (
    MESSAGE_MAGIC,
    StoredMessage,
    build_messages,
    check_body,
    check_int,
    check_keys,
    check_properties,
    check_sys_flag,
    check_tags,
    check_unique_id,
    decode_message,
    encode_message,
    encode_messages,
    make_msg_id,
    parse_msg_id,
)
from broker.store.schedule import SchedulePolicy
from dledger.records import BodyLocation, Refused


def reference_record(m: StoredMessage) -> bytes:
    """The record as encode_message wrote it before (a new list and ``msgpack.packb`` per message)."""
    fields: list[Any] = [m.topic, m.queue_id, m.flag, m.tags, list(m.keys), m.properties, m.born_ts, m.born_host,
                         m.store_ts, m.unique_id, len(m.body)]
    if m.sys_flag:
        fields.append(m.sys_flag)
    header = msgpack.packb(fields, use_bin_type=True)
    record = b"".join((MESSAGE_MAGIC, struct.pack("<I", len(header)), header, m.body))
    return record + struct.pack("<I", zlib.crc32(record))


def random_message(rnd: random.Random) -> StoredMessage:
    def text(n: int) -> str:
        return "".join(rnd.choice("abcXYZ019_-.é漢") for _ in range(rnd.randint(0, n)))

    return StoredMessage(
        topic=text(40) or "T",
        queue_id=rnd.choice([0, 7, 127, 128, 65535, 65536]),
        flag=rnd.choice([0, 1, 2**31 - 1]),
        tags=text(30),
        keys=tuple(text(20) or "k" for _ in range(rnd.randint(0, 4))),
        properties={text(10) or "p": text(300) for _ in range(rnd.randint(0, 4))},
        born_ts=rnd.choice([0, 1764311111111, 2**63 - 1]),
        born_host=text(20),
        store_ts=rnd.choice([0, 1764311111112, 2**32, 2**63 - 1]),
        unique_id=text(64) or "u",
        body=rnd.randbytes(rnd.choice([1, 31, 32, 255, 256, 1024, 65536, 70000])),
        sys_flag=rnd.choice([0, 0, 1, 0x1 | 0x40, 2**31 - 1]),
    )


def test_encode_message_writes_the_bytes_the_plain_encoder_wrote() -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rnd = random.Random(seed)
    for _ in range(500):
        m = random_message(rnd)
        record = encode_message(m)
        assert record == reference_record(m)
        assert decode_message(record) == m


def test_encode_messages_writes_what_encode_message_writes() -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rnd = random.Random(seed)
    for _ in range(50):
        msgs = [random_message(rnd) for _ in range(rnd.randint(0, 40))]
        assert encode_messages(msgs) == [reference_record(m) for m in msgs] == [encode_message(m) for m in msgs]


def test_encode_message_keys_as_a_list_give_the_same_record() -> None:
    m = random_message(random.Random(7))._replace(keys=("a", "b"))
    assert encode_message(m._replace(keys=["a", "b"])) == encode_message(m) == reference_record(m)  # type: ignore[arg-type]


def test_encode_message_after_a_refused_value_still_encodes_right() -> None:
    """A value msgpack cannot pack leaves this thread's Packer clean for the next message."""
    m = random_message(random.Random(8))
    with pytest.raises(TypeError):
        encode_message(m._replace(properties={"p": object()}))  # type: ignore[dict-item]
    assert encode_message(m) == reference_record(m)


def test_encode_message_from_many_threads_at_once() -> None:
    rnd = random.Random(9)
    msgs = [random_message(rnd) for _ in range(200)]
    expected = [reference_record(m) for m in msgs]
    bad: list[int] = []

    def run() -> None:
        for _ in range(5):
            bad.extend(i for i, m in enumerate(msgs) if encode_message(m) != expected[i])

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


# -- build_messages: the checks' fast paths ---------------------------------------------------------
class _Str(str):
    pass


@pytest.mark.parametrize("props", [
    {"bench_ts_ns": "1764311111111111111"},
    {"a.b-c_9": "v", "KEYS": "k1 k2", "é": "x"},
    {"bad name": "v"},
    {"n" * 65: "v"},
    {5: "v"},
    {_Str("ok"): "v"},
    {_Str("bad name"): "v"},
    {"ok": 5},
    {"ok": "\ud800"},
    {"ok": "é" * 20000},
    {f"p{i}": "v" for i in range(200)},
])
def test_check_properties_answers_alike_for_names_seen_before_and_not(props: dict[Any, Any]) -> None:
    """The first check of a name runs the rule and remembers a valid one; a later check of the same
    map (names known now) gives the same map or the same error."""
    first, second = outcome(check_properties, props), outcome(check_properties, props)
    assert first == second
    message._PROPERTY_NAMES_OK.clear()
    assert outcome(check_properties, props) == first


def test_check_properties_remembers_a_bounded_number_of_names() -> None:
    message._PROPERTY_NAMES_OK.clear()
    for i in range(message._PROPERTY_NAMES_REMEMBERED + 50):
        check_properties({f"name{i}": "v"})
    assert len(message._PROPERTY_NAMES_OK) == message._PROPERTY_NAMES_REMEMBERED
    check_properties({"name-last": "v"})  # valid, checked, not remembered
    assert "name-last" not in message._PROPERTY_NAMES_OK


def outcome(check: Any, value: Any) -> Any:
    try:
        return ("ok", check(value))
    except ProtocolError as exc:
        return ("refused", exc.code, exc.message, exc.status)


def build(items: Any, **kw: Any) -> Any:
    ids = iter(range(10**6))
    args: dict[str, Any] = dict(store_ts=1764311111200, max_size=4096, default_born_host="10.0.0.9",
                                queue_ids_max=8, new_unique_id=lambda: f"GEN{next(ids)}")
    args.update(kw)
    return outcome(lambda it: build_messages("TopicA", 2, it, **args), items)


def reference_build(items: Any, **kw: Any) -> Any:
    """build_messages through the checks one field at a time, as before the fast paths."""
    args: dict[str, Any] = dict(store_ts=1764311111200, max_size=4096, default_born_host="10.0.0.9", queue_ids_max=8)
    args.update(kw)
    ids = iter(range(10**6))

    def run(items: Any) -> list[StoredMessage]:
        out = []
        total = 0
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise ProtocolError("INVALID_BATCH", f"messages[{i}] must be a map", 400)
            body = check_body(item.get("body"), args["max_size"])
            total += len(body)
            born_host = item.get("born_host", args["default_born_host"])
            if not isinstance(born_host, str) or len(born_host) > 255:
                raise ProtocolError("BAD_REQUEST", f"messages[{i}].born_host must be a string ≤ 255", 400)
            uid = item.get("unique_id")
            qid = item.get("queue_id")
            qid = 2 if qid is None else check_int(qid, f"messages[{i}].queue_id", 0, 7, "INVALID_QUEUE_ID")
            flag = check_int(item.get("flag", 0), f"messages[{i}].flag", 0, 2**31 - 1)
            born_ts = check_int(item.get("born_ts", args["store_ts"]), f"messages[{i}].born_ts", 0, 2**63 - 1)
            out.append(StoredMessage(
                topic="TopicA", queue_id=qid, flag=flag, tags=check_tags(item.get("tags")),
                keys=check_keys(item.get("keys")), properties=check_properties(item.get("properties")),
                born_ts=born_ts, born_host=born_host, store_ts=args["store_ts"],
                unique_id=check_unique_id(uid) if uid is not None else f"GEN{next(ids)}", body=body,
                sys_flag=check_sys_flag(item["sys_flag"], f"messages[{i}].sys_flag") if "sys_flag" in item else 0,
            ))
        if total > args["max_size"]:
            raise ProtocolError("MESSAGE_TOO_LARGE", f"batch bodies of {total} bytes exceed {args['max_size']}", 413)
        return out

    return outcome(run, items)


def test_build_messages_gives_the_messages_and_refusals_of_the_field_by_field_checks() -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rnd = random.Random(seed)
    good: dict[str, Any] = {"body": b"b" * 100, "unique_id": "0123456789ABCDEF0123456789ABCDEF", "born_ts": 5,
                            "born_host": "127.0.0.1", "properties": {"bench_ts_ns": "17"}, "queue_id": 3}
    variants: dict[str, list[Any]] = {
        "body": [b"x", b"", bytearray(b"ba"), "str", None, b"y" * 4096, b"y" * 4097, memoryview(b"mv")],
        "unique_id": ["a_b-c", "bad id", "", 7, "é", "x" * 65],
        "born_ts": [0, -1, True, 2**63, 1.5],
        "born_host": ["", 5, "h" * 300],
        "properties": [{}, {"bad name": "v"}, {"ok": 1}, [("a", "b")]],
        "queue_id": [0, 7, 8, -1, True, "1"],
        "tags": ["t", "a||b", "", 5, "\x01"],
        "keys": ["k1 k2", ["k"], [""], ("a", "b"), 5, []],
        "flag": [0, 1, -1, 2**31, False],
        "sys_flag": [0, 1, 0x40, 0x4, -1, "1"],
    }
    for _ in range(1500):
        items = []
        for _ in range(rnd.randint(1, 4)):
            item = dict(good)
            for field in rnd.sample(sorted(variants), rnd.randint(0, 3)):
                value = rnd.choice(variants[field] + [None])
                if value is None and field in item:
                    del item[field]
                elif value is not None:
                    item[field] = value
            items.append(item)
        got = build(items)
        assert got == reference_build(items), items
        if got[0] == "ok":  # made without StoredMessage's __new__: the class and every field in place
            for m, item in zip(got[1], items, strict=True):
                assert type(m) is StoredMessage and len(m) == len(StoredMessage._fields)
                assert m._asdict()["body"] == item["body"] and m.sys_flag == item.get("sys_flag", 0)


# -- the send's answer ------------------------------------------------------------------------------
def reference_answer_dict(name: str, msgs: list[StoredMessage], firsts: list[Any], fresh: list[int],
                          locs: list[Any], qid: int, store_ts: int, qids: list[int]) -> dict[str, Any]:
    """The answer map as SendOps._send_answer and SendAnswer.to_dict made it before (one
    SendResult.to_dict per message)."""
    results: list[Any] = [
        None if k is None else SendResult(make_msg_id(name, k.position), m.unique_id, k.queue_offset, k.position,
                                          duplicate=True, queue_id=k.queue_id if qids else -1)
        for m, k in zip(msgs, firsts, strict=True)
    ]
    if not fresh:
        qid, store_ts = firsts[0].queue_id, firsts[0].store_ts
    for i, loc in zip(fresh, locs, strict=True):
        results[i] = SendResult(make_msg_id(name, loc.position), msgs[i].unique_id, loc.result, loc.position,
                                queue_id=qids[i] if qids else -1)
    return {"status": "SEND_OK", "broker_name": name, "queue_id": qid, "store_ts": store_ts,
            "results": [r.to_dict() for r in results]}


def send_ops(name: str) -> SendOps:
    ops = SendOps.__new__(SendOps)
    ops.s = types.SimpleNamespace(cfg=types.SimpleNamespace(broker_name=name))
    return ops


@pytest.mark.parametrize("known", ["none", "some", "all"])
@pytest.mark.parametrize("own_queues", [False, True])
def test_send_answer_maps_are_what_they_were(known: str, own_queues: bool) -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rnd = random.Random(seed)
    name = "broker-a"
    n = 32
    msgs = [random_message(rnd)._replace(queue_id=i % 4) for i in range(n)]
    firsts: list[Any] = [None] * n
    if known != "none":
        for i in range(n) if known == "all" else rnd.sample(range(n), 5):
            firsts[i] = FirstSend(rnd.choice([0, 1, 2**40, 2**63 - 1]), rnd.randrange(8), rnd.randrange(10**6),
                                  1764311111000 + i, 90 + i, i)
    fresh = [i for i, k in enumerate(firsts) if k is None]
    position = rnd.choice([0, 2**32 - 5, 2**62])
    locs = []
    for i in fresh:
        locs.append(BodyLocation(100, 3, i, position, 1100, rnd.randrange(10**6)))
        position += rnd.randrange(1, 2**20)
    qids = [m.queue_id for m in msgs] if own_queues else []
    answer = send_ops(name)._send_answer(msgs, firsts, fresh, locs, 2, 1764311111200, qids)
    expected = reference_answer_dict(name, msgs, firsts, fresh, locs, 2, 1764311111200, qids)
    got = answer.to_dict()
    assert got == expected
    assert pack_body(got) == pack_body(expected)  # the same keys in the same order: the same bytes
    assert [r.to_dict() for r in answer.results] == expected["results"]
    for r in answer.results:
        assert type(r) is SendResult and len(r) == len(SendResult._fields)
        assert parse_msg_id(r.msg_id) == (name, r.position)


def test_send_answer_refuses_a_batch_an_apply_refused() -> None:
    msgs = [random_message(random.Random(3)) for _ in range(3)]
    locs = [BodyLocation(1, 1, i, 100 * i, 50, Refused("RECORD_REFUSED", "no") if i == 1 else 7) for i in range(3)]
    with pytest.raises(ProtocolError) as refused:
        send_ops("b")._send_answer(msgs, [None] * 3, [0, 1, 2], locs, 0, 1, [])
    assert (refused.value.code, refused.value.status, refused.value.extra) == ("RECORD_REFUSED", 422, {"refused": [1]})


# -- the schedule's prepare of a send's messages ----------------------------------------------------
class _Watched(dict[str, str]):
    """A property map that records every name looked up in it."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.asked: set[str] = set()

    def __contains__(self, key: object) -> bool:
        self.asked.add(str(key))
        return super().__contains__(key)

    def __getitem__(self, key: str) -> str:
        self.asked.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.add(key)
        return super().get(key, default)


def test_every_property_due_of_reads_is_one_prepare_batch_looks_for() -> None:
    """prepare_batch passes a message by when its properties miss every name of _DUE_PROPS: due_of
    must read no other name (a new one added to due_of alone would be skipped)."""
    policy = SchedulePolicy()
    for props in ({}, {"x": "1"}, {PROP_DELAY: "0"}, {PROP_TIMER_DELAY_SEC: "-5"}):
        watched = _Watched(props)
        try:
            policy.due_of(watched, 1764311111200, "messages[0]")
        except ProtocolError:
            pass
        assert watched.asked <= schedule._DUE_PROPS, watched.asked - schedule._DUE_PROPS
    assert set(RESERVED_PROPS) | set(SCHEDULE_PROPS) <= schedule._DUE_PROPS


def test_prepare_batch_gives_what_prepare_gives_for_each_message() -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rnd = random.Random(seed)
    policy = SchedulePolicy()
    names = [*RESERVED_PROPS, *SCHEDULE_PROPS, "bench_ts_ns", "KEYS", "UNIQ_KEY", "a.b"]
    values = ["0", "1", "3", "18", "99", "-1", "x", "", " 7 ", "1764311111300", "99999999999999", "²"]
    topics = ["TopicA", *BROKER_TOPICS]
    for _ in range(3000):
        msgs = []
        for _ in range(rnd.randint(1, 4)):
            props = {rnd.choice(names): rnd.choice(values) for _ in range(rnd.choice([0, 0, 1, 1, 2, 3]))}
            msgs.append(StoredMessage(rnd.choice(topics) if rnd.random() < 0.1 else "TopicA", 1, 0, "", (), props,
                                      1, "h", 1764311111200, "U1", b"b"))

        def reference(msgs: list[StoredMessage]) -> list[StoredMessage]:
            return [policy.prepare(m, f"messages[{i}]") for i, m in enumerate(msgs)]

        assert outcome(policy.prepare_batch, msgs) == outcome(reference, msgs), msgs
