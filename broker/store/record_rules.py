"""What a committed record must satisfy to be applied (``broker/store/message_store.py``), decided from the record.

A Raft entry is applied on every replica after it committed: an exception there used to stop every
replica at the same entry, and again after each restart (issue 23: a send-back for a 200-character
group made a ``%DLQ%<group>`` topic no consume queue can be named after). The rule now
(docs/SECURITY.md, "Committed records that cannot be applied"):

1. Everything applying a record needs is validated before it is appended (the service and its
   edges: names, derived names such as ``%RETRY%<group>``, numbers, properties).
2. Applying a record has two phases. *Admission* (this module) decodes it and checks every value
   the effects will use against the domain of the operation that uses it. It is pure: it reads the
   record's bytes and nothing else (no clock, no configuration, no local file), so every replica
   admits or refuses a record alike, whatever its uptime, disk or version of the same release.
   A refused record changes nothing: the store counts it, logs it, lists it
   (``GET /v1/admin/refused``), and the append's caller gets ``RECORD_REFUSED``.
3. The *effects* (consume queues, key index, schedule and transaction indexes, metadata) run on
   admitted values only. An exception there is a bug or a local failure (disk, memory) that a
   replica cannot decide like its peers: the replica stops loudly (``StateMachineError``, exit 70).

Which checks: exactly the values whose bad form made an effect raise (a topic that is no valid
directory name, a negative queue id, a store time the 64-bit consume-queue unit cannot hold, a
reserved property or command position that sqlite cannot bind or that overflows its 64-bit
integer). A stricter rule would refuse, after an upgrade, a record that a replica of the previous
release applied — and replicas replay different stretches of the log after a restart (snapshot
timing is local), so the group would diverge. Policy (the 120-character group limit, the 127-char
topic limit of a ``topic.put``) is enforced before appending (1.), never retroactively here; names
that older releases stored are kept, and an admin removes them (docs/OPERATIONS.md).

The rebuilders (``broker/store/rebuild.py``, the schedule and transaction indexes) skip what admission
refuses, so a queue rebuilt from the log equals the queue built by applying it.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Mapping
from typing import Any, Final

from broker.protocol.names import TOPIC_RULE, is_topic
from broker.protocol.properties import (
    HALF_TOPIC,
    PROP_CHECK_IMMUNITY,
    PROP_DUE_MS,
    PROP_HALF_POS,
    PROP_LEVEL,
    PROP_PGROUP,
    PROP_REAL_TOPIC,
    PROP_SCHED_POS,
    SCHEDULE_TOPIC,
)
from broker.store.message import RecordHeader, decode_command, decode_header_fields
from dledger.records import Refused

RECORD_REFUSED: Final = "RECORD_REFUSED"
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
QUEUE_ID_MAX: Final = 2**31 - 1  # RocketMQ's int queue id; a consume-queue directory name
STORE_TS_MAX: Final = INT64_MAX  # the unit holds 64 bits; the transaction index a signed 64-bit int
REASON_CHARS_MAX: Final = 300
_HEADER_FIELDS: Final = len(RecordHeader._fields)


def refused(reason: str) -> Refused:
    return Refused(RECORD_REFUSED, reason[:REASON_CHARS_MAX])


def _int64_or_unparsed(value: Any) -> bool:
    """A property the effects read with ``int()`` and bind into sqlite: a str or int whose value fits
    64 bits, or a str ``int()`` refuses (the effect then skips the record as it always did). False
    for what made the effect raise: another type, or a number sqlite cannot bind."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return False
    try:
        number = int(value)
    except ValueError:
        return isinstance(value, str)
    return INT64_MIN <= number <= INT64_MAX


@functools.lru_cache(maxsize=4096)
def _topic_ok(topic: str) -> bool:
    """``is_topic`` remembered: every replica checks the topic of every message it applies, and a
    log names few topics (a pure function of the name, so a cached answer is the same answer)."""
    return is_topic(topic)


def _properties_refusal(topic: str, props: Mapping[Any, Any]) -> str | None:
    if not props:  # most messages: none of the checks below can refuse an empty map
        return None
    for name in (PROP_SCHED_POS, PROP_HALF_POS):
        if name in props and not _int64_or_unparsed(props[name]):
            return f"property {name} must be a decimal string within 64 bits, got {str(props[name])[:40]!r}"
    if topic == SCHEDULE_TOPIC:
        for name in (PROP_DUE_MS, PROP_LEVEL):
            if name in props and not _int64_or_unparsed(props[name]):
                return f"schedule record: property {name} must be a decimal string within 64 bits"
    if topic == HALF_TOPIC:
        for name in (PROP_PGROUP, PROP_REAL_TOPIC, PROP_CHECK_IMMUNITY):
            if name in props and not isinstance(props[name], str):
                return f"half message: property {name} must be a string"
    return None


def admit_message(record: bytes) -> tuple[RecordHeader | None, Refused | None]:
    """(header, None) for a message record the store can apply, (None, refusal) otherwise."""
    fields = admitted_fields(record)
    if isinstance(fields, Refused):
        return None, fields
    return RecordHeader._make(fields if len(fields) == _HEADER_FIELDS else fields[:_HEADER_FIELDS]), None


def admitted_fields(record: bytes) -> list[Any] | Refused:
    """``admit_message`` as the store's apply asks it for every message: the header's fields as
    stored (``RecordHeader``'s order, then an optional ``sys_flag``; no ``RecordHeader`` built), or
    the refusal. A message on a topic found valid before, with its queue id and store time in range
    and none of the properties the rules look at, is admitted without ``message_refusal`` (which
    answers None for it; tests/broker/test_apply_fast_paths.py pins the two to the same answers)."""
    try:
        h, _start = decode_header_fields(record)
    except ValueError as exc:
        return refused(f"undecodable message record: {exc}")
    topic, queue_id, store_ts, props = h[0], h[1], h[8], h[5]
    if (
        type(queue_id) is int  # not a bool (the header's check let an int subclass through)
        and 0 <= queue_id <= QUEUE_ID_MAX
        and type(store_ts) is int
        and 0 <= store_ts <= STORE_TS_MAX
        and (not props or (PROP_SCHED_POS not in props and PROP_HALF_POS not in props
                           and topic != SCHEDULE_TOPIC and topic != HALF_TOPIC))
        and _topic_ok(topic)
    ):
        return h
    reason = message_refusal(topic, queue_id, store_ts, props)
    return h if reason is None else refused(reason)


def message_refusal(topic: str, queue_id: int, store_ts: int, props: Mapping[Any, Any]) -> str | None:
    """Why a decoded message cannot be applied (None: it can). Also asked by reads by position (a
    msg id): a refused record is in the log but in no queue, and is never served."""
    if not (isinstance(topic, str) and _topic_ok(topic)):
        return f"topic {topic[:140]!r} is not a valid topic name ({TOPIC_RULE})"
    if isinstance(queue_id, bool) or not 0 <= queue_id <= QUEUE_ID_MAX:
        return f"queue id {queue_id} is outside 0..{QUEUE_ID_MAX}"
    if isinstance(store_ts, bool) or not 0 <= store_ts <= STORE_TS_MAX:
        return f"store time {store_ts} is outside 0..{STORE_TS_MAX}"
    return _properties_refusal(topic, props)


def admitted_header(record: bytes) -> RecordHeader | None:
    """The header of a message record admission accepts, else None: what the rebuilders (queues,
    key index, de-duplication window, schedule and transaction indexes) read, skipping what applying
    refused."""
    return admit_message(record)[0]


def _positions_ok(value: Any) -> bool:
    """A command's ``positions`` as the schedule and transaction indexes iterate it: absent, or an
    iterable whose integers fit 64 bits (they are bound into sqlite)."""
    if not value:
        return True
    if isinstance(value, (bool, int, float)):
        return False  # not iterable: the effect raised on it
    return all(INT64_MIN <= p <= INT64_MAX for p in value if isinstance(p, int) and not isinstance(p, bool))


def admit_command(record: bytes) -> tuple[dict[str, Any] | None, Refused | None]:
    """(command map, None) for a command record the store can apply, (None, refusal) otherwise.
    Metadata commands are checked by ``Metadata.apply`` itself (a malformed one answers
    ``{"error": ...}`` and changes nothing); here only what would make an effect raise."""
    try:
        cmd = decode_command(record)
    except Exception as exc:  # msgpack raises many types for bytes it cannot read; all data errors
        return None, refused(f"undecodable command record: {type(exc).__name__}: {exc}")
    op = cmd.get("op")
    if isinstance(op, str) and (op.startswith("schedule.") or op.startswith("txn.")):
        if not _positions_ok(cmd.get("positions")):
            return None, refused(f"command {op}: positions must be a list of 64-bit integers")
        position = cmd.get("position")
        if isinstance(position, int) and not INT64_MIN <= position <= INT64_MAX:
            return None, refused(f"command {op}: position {position} does not fit 64 bits")
    return cmd, None


REFUSALS_KEPT: Final = 100


class RefusalLog:
    """The records this replica refused: a count and the last ``REFUSALS_KEPT`` (log index, position,
    kind, reason). Written on the apply thread, read by the API (a lock for the copy). Kept in the
    store's snapshot; records applied after it are refused again when they are re-applied, so the
    list is the same as before a restart, and the same on every replica that applied the same log."""

    def __init__(self) -> None:
        self.total = 0
        self._recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=REFUSALS_KEPT)
        self._lock = threading.Lock()

    def add(self, index: int, position: int, kind: str, refusal: Refused) -> None:
        with self._lock:
            self.total += 1
            self._recent.append(
                {"index": index, "position": position, "kind": kind, "code": refusal.code, "reason": refusal.reason}
            )

    def view(self) -> dict[str, Any]:
        with self._lock:
            return {"total": self.total, "recent": list(self._recent)}

    def load(self, snap: Mapping[str, Any] | None) -> None:
        """Take a snapshot's ``view()`` (absent in snapshots of older releases: nothing refused)."""
        with self._lock:
            self._recent.clear()
            self.total = 0
            if not isinstance(snap, Mapping):
                return
            self.total = int(snap.get("total", 0))
            for item in snap.get("recent") or ():
                if isinstance(item, Mapping):
                    self._recent.append(dict(item))
