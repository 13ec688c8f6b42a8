"""History records of a chaos run and their JSON-lines files (the format is docs/CHAOS.md's contract).

Each record is a frozen dataclass whose fields are exactly the documented ones, in the documented
order; ``to_dict`` adds the ``type`` tag. Times are integers, microseconds since the Unix epoch
(``*_us``). Writers append one line per record; nothing is rewritten, so a run that dies midway
leaves valid (shorter) files behind.

    RUN_DIR/faults.jsonl                   FaultRecord
    RUN_DIR/history/sends-<producer>.jsonl SendRecord
    RUN_DIR/history/receipts-<consumer>.jsonl ReceiptRecord (type "receipt")
    RUN_DIR/history/drain.jsonl            ReceiptRecord (type "drain", consumer "drain")
    RUN_DIR/history/samples.jsonl          SampleRecord (the sampler: every replica, every few 100 ms)
    RUN_DIR/history/offsets-<client>.jsonl OffsetRecord (offset fetches and commits of a client)
    RUN_DIR/history/retries-<consumer>.jsonl ReceiptRecord (type "receipt") of the retry group's
                                           consumers (``--fail-share``), with ``reconsume_times``,
                                           ``retry`` and ``answer``
    RUN_DIR/history/dlq.jsonl              ReceiptRecord (type "dlq", consumer "dlq"): the final read of
                                           the retry group's ``%DLQ%`` topic

Version 3 added optional fields (absent or null in version 2 lines, which still audit): sends
``delay_level``, ``deliver_ms`` and ``due_us``; receipts ``reconsume_times``, ``retry``, ``answer``.
Version 4 added the send's optional ``txn`` (its transaction plan: ``commit``, ``rollback``,
``check_commit``, ``check_rollback``; absent for a plain send).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import zlib
from collections.abc import Iterator
from typing import Any, Literal

HISTORY_VERSION = 4  # recorded in run.json; bumped with any change to the line formats

Outcome = Literal["ok", "fail", "unknown"]


def now_us() -> int:
    return time.time_ns() // 1000


_SEND_V3 = ("delay_level", "deliver_ms", "due_us", "txn")  # (and version 4's txn)
_RECEIPT_V3 = ("reconsume_times", "retry", "answer")


def _without_unset(d: dict[str, Any], optional: tuple[str, ...]) -> dict[str, Any]:
    """Version 3's optional fields are left out when unset (lines stay as version 2 wrote them)."""
    for k in optional:
        if d.get(k) is None:
            d.pop(k, None)
    return d


@dataclasses.dataclass(frozen=True)
class SendRecord:
    producer: str
    unique_id: str
    key: str | None
    seq: int
    topic: str
    invoke_us: int
    complete_us: int
    outcome: Outcome
    error: str | None = None
    broker: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None
    msg_id: str | None = None
    store_us: int | None = None
    body_crc: int | None = None  # CRC-32 of the body sent
    delay_level: int | None = None  # the send's delay level (None: none)
    deliver_ms: int | None = None  # the send's deliver time, ms since the epoch (None: none)
    # When the producer asked it delivered: store time + the level's delay, or the deliver time (not
    # before the store time); None for an undelayed send or one that was not acknowledged.
    due_us: int | None = None
    txn: str | None = None  # the transaction plan (chaos/workload.py txn_plan); None: a plain send

    def to_dict(self) -> dict[str, Any]:
        assert self.outcome in ("ok", "fail", "unknown"), self.outcome
        assert (self.outcome == "ok") == (self.error is None), "an error code exactly when not ok"
        return _without_unset({"type": "send", **dataclasses.asdict(self)}, _SEND_V3)


@dataclasses.dataclass(frozen=True)
class ReceiptRecord:
    """One message handed to a consumer's listener, or read by the final drain."""

    consumer: str
    time_us: int
    topic: str
    broker: str
    queue_id: int
    queue_offset: int
    msg_id: str
    unique_id: str
    key: str | None
    seq: int | None
    producer: str | None
    born_us: int
    store_us: int
    session: int | None = None  # the consumer's session of this queue (a new one at every (re)assignment)
    body_crc: int | None = None  # CRC-32 of the body received
    kind: Literal["receipt", "drain", "dlq"] = "receipt"
    reconsume_times: int | None = None  # the SDK's count of earlier deliveries to this group (retry group)
    retry: bool | None = None  # came through a retry (or DLQ) topic: carries RETRY_TOPIC
    answer: Literal["success", "later"] | None = None  # what the retry group's listener answered

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return _without_unset({"type": d.pop("kind"), **d}, _RECEIPT_V3)


@dataclasses.dataclass(frozen=True)
class FaultRecord:
    time_us: int
    fault: str
    action: Literal["apply", "heal"]
    targets: tuple[str, ...]
    detail: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_us": self.time_us, "fault": self.fault, "action": self.action,
            "targets": list(self.targets), "detail": self.detail,
        }


@dataclasses.dataclass(frozen=True)
class SampleRecord:
    """One replica's state as the sampler read it (``GET /v1/status``, then ``GET /v1/offsets`` of
    the workload's consumer group): the commit index with the chain CRC at it, and the group's
    stored offsets, read right after the status (so at an applied index >= ``applied_index``)."""

    time_us: int
    replica: str  # process name, "RaftNode00-n1"
    group: str
    node_id: str
    pid: int | None
    role: str | None
    term: int | None
    leader_id: str | None
    commit_index: int | None
    applied_index: int | None
    last_index: int | None
    last_term: int | None
    chain_crc_at_commit: int | None
    entries_truncated: int | None
    offsets: dict[str, int] | None  # queue id -> stored offset of the consumer group (None: not read)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "sample", **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class OffsetRecord:
    """A client's offset fetch (``action`` "fetch": what it read) or commit ("commit": what it
    wrote, and how that went). ``stale`` marks a commit of a value read earlier (a zombie client)."""

    client: str
    action: Literal["fetch", "commit"]
    invoke_us: int
    complete_us: int
    group: str
    topic: str
    broker: str
    offsets: dict[str, int]  # queue id -> offset
    outcome: Outcome
    error: str | None = None
    stale: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"type": "offset", **dataclasses.asdict(self)}


def receipt_from_message(
    m: Any, consumer: str, time_us: int, kind: Literal["receipt", "drain", "dlq"], session: int | None = None,
    *, retry_fields: bool = False, answer: Literal["success", "later"] | None = None,
) -> ReceiptRecord:
    """A ReceiptRecord for a ``MessageExt`` (the SDK's) or an API message dict."""
    def get(name: str) -> Any:
        return m.get(name) if isinstance(m, dict) else getattr(m, name)

    props = get("properties") or {}
    keys = get("keys") or ()
    seq_text = props.get("seq")
    return ReceiptRecord(
        consumer=consumer,
        time_us=time_us,
        topic=get("topic"),
        broker=get("broker_name"),
        queue_id=int(get("queue_id")),
        queue_offset=int(get("queue_offset")),
        msg_id=get("msg_id"),
        unique_id=get("unique_id"),
        key=keys[0] if keys else None,
        seq=int(seq_text) if seq_text is not None and seq_text.lstrip("-").isdigit() else None,
        producer=props.get("producer"),
        born_us=int(get("born_ts")) * 1000,
        store_us=int(get("store_ts")) * 1000,
        session=session,
        body_crc=zlib.crc32(bytes(get("body") or b"")),
        kind=kind,
        reconsume_times=_reconsume_times(m, props) if retry_fields else None,
        retry=("RETRY_TOPIC" in props) if retry_fields else None,
        answer=answer,
    )


def _reconsume_times(m: Any, props: dict[str, str]) -> int:
    """The SDK's ``reconsume_times``, or (an API message dict) the ``RECONSUME_TIME`` property."""
    if not isinstance(m, dict):
        return int(m.reconsume_times)
    text = props.get("RECONSUME_TIME", "0")
    return int(text) if text.isdigit() else 0


class JsonlWriter:
    """Appends records, one JSON object per line. Owned by one thread or event loop."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.path = path
        self.lines = 0
        self._f = open(path, "a", encoding="utf-8", buffering=1 << 16)  # noqa: SIM115 (closed by close())

    def write(self, record: SendRecord | ReceiptRecord | FaultRecord | SampleRecord | OffsetRecord) -> None:
        self._f.write(json.dumps(record.to_dict(), separators=(",", ":"), ensure_ascii=False) + "\n")
        self.lines += 1

    def flush(self) -> None:
        if not self._f.closed:
            self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_jsonl(path: str) -> Iterator[dict[str, Any]]:
    """The records of one history file (a torn last line, from a killed writer, is skipped)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n"):
                yield json.loads(line)
