"""History records against the contract in docs/CHAOS.md, and the JSON-lines writer."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest

from broker.client import MessageExt
from chaos.history import (
    FaultRecord,
    JsonlWriter,
    ReceiptRecord,
    SendRecord,
    read_jsonl,
    receipt_from_message,
)

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "CHAOS.md")


def documented_fields(table_heading: str) -> list[str]:
    """The field names of the table that follows ``table_heading`` in docs/CHAOS.md, in order."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    start = text.index(table_heading)
    rows = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    names = []
    for row in rows[2:]:  # header and separator
        first_cell = row.split("|")[1]
        names += re.findall(r"`([a-z_]+)`", first_cell)
    return names


def send(**kw: Any) -> SendRecord:
    base: dict[str, Any] = dict(producer="p0", unique_id="U1", key=None, seq=3, topic="T", invoke_us=10,
                                complete_us=20, outcome="ok", error=None, broker="RaftNode00", queue_id=1,
                                queue_offset=7, msg_id="RaftNode00:00000000000000FF", store_us=15_000)
    base.update(kw)
    return SendRecord(**base)


def test_send_lines_have_exactly_the_documented_fields_in_order() -> None:
    documented = documented_fields("`sends-*.jsonl`")
    # version 3's and 4's optional fields, all set (a delayed send is never transactional: only the format)
    full = send(delay_level=2, deliver_ms=16, due_us=20_000, txn="commit").to_dict()
    assert list(full) == documented
    optional = ("delay_level", "deliver_ms", "due_us", "txn")
    assert list(send().to_dict()) == [f for f in documented if f not in optional]


def test_receipt_and_drain_lines_have_exactly_the_documented_fields() -> None:
    rec = ReceiptRecord("c0", 1, "T", "B", 0, 0, "B:00", "U", None, None, None, 1, 2)
    assert list(rec.to_dict()) == documented_fields("`receipts-*.jsonl` and `drain.jsonl`")
    assert rec.to_dict()["type"] == "receipt"
    drain = ReceiptRecord("drain", 1, "T", "B", 0, 0, "B:00", "U", None, None, None, 1, 2, kind="drain")
    assert drain.to_dict()["type"] == "drain"
    retry = ReceiptRecord("r0", 1, "T", "B", 0, 0, "B:00", "U", None, None, None, 1, 2, reconsume_times=1,
                          retry=True, answer="later")
    extra = documented_fields("`retries-*.jsonl` (type `receipt`")
    assert list(retry.to_dict()) == documented_fields("`receipts-*.jsonl` and `drain.jsonl`") + extra


def test_fault_lines_have_exactly_the_documented_fields() -> None:
    rec = FaultRecord(5, "kill-leader", "apply", ("RaftNode00-n1",), {"leaders": {}})
    assert list(rec.to_dict()) == documented_fields("`faults.jsonl`")
    assert rec.to_dict()["targets"] == ["RaftNode00-n1"]


def test_a_send_has_an_error_code_exactly_when_it_was_not_acknowledged() -> None:
    send(outcome="fail", error="NO_ROUTE", broker=None).to_dict()
    send(outcome="unknown", error="TIMEOUT").to_dict()
    with pytest.raises(AssertionError):
        send(outcome="ok", error="TIMEOUT").to_dict()
    with pytest.raises(AssertionError):
        send(outcome="fail", error=None).to_dict()
    with pytest.raises(AssertionError):
        send(outcome="maybe", error="X").to_dict()  # type: ignore[arg-type]


def test_receipt_from_an_sdk_message_and_from_an_api_dict() -> None:
    m = MessageExt(topic="T", queue_id=2, queue_offset=9, msg_id="B:0A", unique_id="U9", tags="",
                   keys=("p1-k3", "other"), properties={"producer": "p1", "seq": "41"}, body=b"x",
                   born_ts=1000, born_host="127.0.0.1", store_ts=1002, position=10, size=100, broker_name="B")
    r = receipt_from_message(m, "c1", 77, "receipt")
    assert (r.key, r.seq, r.producer, r.born_us, r.store_us, r.queue_offset) == ("p1-k3", 41, "p1", 1_000_000,
                                                                                  1_002_000, 9)
    d = {"topic": "T", "queue_id": 0, "queue_offset": 1, "msg_id": "B:0B", "unique_id": "U", "keys": [],
         "properties": {}, "born_ts": 5, "store_ts": 6, "broker_name": "B"}
    r2 = receipt_from_message(d, "drain", 8, "drain")
    assert (r2.key, r2.seq, r2.producer, r2.to_dict()["type"]) == (None, None, None, "drain")


def test_writer_appends_lines_and_a_torn_last_line_is_skipped(tmp_path: Any) -> None:
    path = str(tmp_path / "h" / "sends-p0.jsonl")
    with JsonlWriter(path) as w:
        w.write(send(seq=1))
        w.write(send(seq=2, key="p0-k1"))
        assert w.lines == 2
    with JsonlWriter(path) as w:  # a second writer appends
        w.write(send(seq=3))
    with open(path, "a") as f:
        f.write('{"type":"send","produ')  # a writer killed mid-line
    rows = list(read_jsonl(path))
    assert [r["seq"] for r in rows] == [1, 2, 3]
    assert rows[1]["key"] == "p0-k1"
    with open(path) as f:
        first = f.readline()
    assert json.loads(first)["store_us"] == 15_000 and " " not in first  # compact, one object per line
