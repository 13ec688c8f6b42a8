"""What ``Admin`` (``broker/client/admin.py``) answers: its two errors (``InvalidArgument``, refused before
any request; ``FanOutError``, some targets of a multi-target write failed), the frozen records of its
results, and ``message_from_dict``, the parsing of a stored message as the broker answers it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from broker.client.transport import ClientError


class InvalidArgument(ClientError):
    """A bad argument, refused before any request was sent (``status`` 0)."""


class FanOutError(ClientError):
    """Some targets of a multi-target operation failed; ``outcomes`` says what happened on each."""

    def __init__(self, outcomes: Sequence[Outcome]):
        failed = [o for o in outcomes if not o.ok]
        assert failed, "FanOutError without a failed target"
        first = failed[0]
        super().__init__(
            first.code,
            f"{len(failed)} of {len(outcomes)} targets failed; first: {first.name}: {first.message}",
            status=first.status,
            addr=first.addr,
        )
        self.outcomes = tuple(outcomes)


# -- results ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one target of a write answered. ``code`` is ``OK``, ``NOT_EXIST`` (nothing to delete)
    or the error code; ``answer`` is the target's answer when it succeeded."""

    target: str  # "broker" or "namesrv"
    name: str  # broker name, or the address when only an address is known
    addr: str | None
    ok: bool
    code: str
    message: str = ""
    status: int = 0
    answer: Any = None


@dataclasses.dataclass(frozen=True)
class BrokerMember:
    """One replica as the NameServer lists it, with what its own ``/v1/status`` says."""

    cluster: str
    broker_name: str
    broker_id: int  # NameServer id: 0 = leader, else the follower's own id
    addr: str
    role: str | None = None
    term: int | None = None
    self_id: str | None = None
    leader_id: str | None = None
    writable: bool | None = None
    commit_index: int | None = None
    applied_index: int | None = None
    topics: int | None = None
    error: str | None = None  # the code when the status call failed


@dataclasses.dataclass(frozen=True)
class QueueStatus:
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_store_ts: int


@dataclasses.dataclass(frozen=True)
class QueueProgress:
    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int | None  # None: never committed
    lag: int
    last_ts: int | None


@dataclasses.dataclass(frozen=True)
class ConsumerProgress:
    group: str
    queues: tuple[QueueProgress, ...]

    @property
    def total_lag(self) -> int:
        return sum(q.lag for q in self.queues)


@dataclasses.dataclass(frozen=True)
class QueueOffset:
    broker_name: str
    queue_id: int
    offset: int


@dataclasses.dataclass(frozen=True)
class MessageView:
    """A stored message as the broker answers it (the API's Message)."""

    topic: str
    queue_id: int
    queue_offset: int | None
    msg_id: str
    unique_id: str
    tags: str
    keys: tuple[str, ...]
    properties: dict[str, str]
    body: bytes
    born_ts: int
    born_host: str
    store_ts: int
    position: int
    size: int
    broker_name: str


@dataclasses.dataclass(frozen=True)
class PullResult:
    status: str
    next_offset: int
    min_offset: int
    max_offset: int
    messages: tuple[MessageView, ...]


@dataclasses.dataclass(frozen=True)
class TransferResult:
    broker_name: str
    leader_id: str | None
    addr: str


def message_from_dict(m: Mapping[str, Any]) -> MessageView:
    body = m.get("body", b"")
    if isinstance(body, str):  # a JSON answer would carry body_b64; msgpack carries bin
        body = body.encode()
    qoff = m.get("queue_offset")
    return MessageView(
        topic=str(m.get("topic", "")),
        queue_id=int(m.get("queue_id", 0)),
        queue_offset=int(qoff) if qoff is not None else None,
        msg_id=str(m.get("msg_id", "")),
        unique_id=str(m.get("unique_id", "")),
        tags=str(m.get("tags") or ""),
        keys=tuple(str(k) for k in m.get("keys") or ()),
        properties={str(k): str(v) for k, v in dict(m.get("properties") or {}).items()},
        body=bytes(body),
        born_ts=int(m.get("born_ts", 0)),
        born_host=str(m.get("born_host", "")),
        store_ts=int(m.get("store_ts", 0)),
        position=int(m.get("position", 0)),
        size=int(m.get("size", 0)),
        broker_name=str(m.get("broker_name", "")),
    )
