"""The broker service's transactional messages (broker/store/transactions.py; docs/API.md "Transactional
messages"), transport-independent like the rest of ``BrokerService``:

- ``await send_half(topic, queue_id, messages, *, producer_group, client_addr="") -> SendAnswer``:
  one message stored as a half (invisible until committed); a retried half is stored once.
- ``await end_transaction(producer_group, topic, msg_id, state, *, transaction_id=None,
  from_check=False) -> EndAnswer``: COMMIT_MESSAGE / ROLLBACK_MESSAGE / UNKNOW for a half.
- ``await transaction_checks(producer_group, topics, *, max_count, wait_ms) -> list[dict]``: a
  producer group's long poll for check-backs (message maps of the halves, in their real topic).
- ``pending_halves(*, group, topic, limit) -> dict``: the halves still pending (admin).

Writes and check-backs are the ready leader's; every method validates its own arguments and raises
``ProtocolError`` only. ACL is the transport's (PUB on the topic for all but ``pending_halves``).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from typing import Any

from broker.protocol.errors import ProtocolError
from broker.protocol.properties import PROP_PGROUP, PROP_REAL_TOPIC
from broker.service.base import raise_if_refused, translated, translated_sync
from broker.service.send import MessageIn, SendAnswer, SendOps, SendResult
from broker.store.dedup import half_key
from broker.store.message import (
    build_messages,
    check_group,
    check_int,
    check_topic,
    check_unique_id,
    encode_command,
    encode_message,
    make_msg_id,
)
from broker.store.message_store import MessageNotFound
from broker.store.transactions import COMMIT, ROLLBACK, committed_copy, immunity_ms, to_half

STATES = {"COMMIT_MESSAGE": COMMIT, "ROLLBACK_MESSAGE": ROLLBACK, "UNKNOW": "UNKNOW"}
CHECKS_COUNT_MAX = 256
CHECK_TOPICS_MAX = 64
HALVES_LIMIT_MAX = 1000
_REFUSED = {
    ROLLBACK: ("TRANSACTION_ROLLED_BACK", "was rolled back"),
    "DISCARDED": ("TRANSACTION_DISCARDED", "was discarded after transactionCheckMax check-backs"),
    COMMIT: ("TRANSACTION_COMMITTED", "was committed"),
}


@dataclasses.dataclass(frozen=True, slots=True)
class EndAnswer:
    """What an end-transaction did: ``state`` (COMMIT_MESSAGE, ROLLBACK_MESSAGE, UNKNOW); for a commit
    the committed message; ``duplicate`` when the half was resolved so already; ``pending`` for UNKNOW."""

    state: str
    msg_id: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None
    duplicate: bool = False
    pending: bool | None = None
    resolved: str | None = None  # UNKNOW for a half resolved already: how

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None and v is not False}


class TxnOps(SendOps):
    @translated
    async def send_half(
        self, topic: str, queue_id: int, messages: Sequence[MessageIn], *, producer_group: str, client_addr: str = ""
    ) -> SendAnswer:
        s = self.s
        topic = check_topic(topic)
        group = check_group(producer_group)
        self.require_writable()
        known = s.store.topic(topic)
        queue_nums = known.write_queue_nums if known is not None else s.cfg.default_topic_queue_nums
        qid = check_int(queue_id, "queue_id", 0, queue_nums - 1, "INVALID_QUEUE_ID")
        msgs = build_messages(
            topic, qid, messages, store_ts=s.wall_ms(), max_size=s.cfg.max_message_size,
            new_unique_id=lambda: uuid.uuid4().hex.upper(), default_born_host=client_addr, queue_ids_max=queue_nums,
        )
        if len(msgs) != 1:
            raise ProtocolError("TRANSACTION_BATCH_UNSUPPORTED", "a transaction sends exactly one message", 400)
        m = msgs[0]
        # RocketMQ: transactional messages are neither delayed nor batched (reserved names are refused).
        if s.schedule.policy.due_of(m.properties, m.store_ts, "messages[0]") is not None:
            raise ProtocolError("TRANSACTION_DELAY_UNSUPPORTED", "a transactional message cannot be delayed", 400)
        immunity_ms(m.properties, "messages[0]")
        record = encode_message(to_half(m, group))
        tc = known or await self._topic_for_send(topic)
        if not tc.writable:
            raise ProtocolError("NO_PERMISSION", f"topic {topic!r} is not writable (perm {tc.perm})", 403)
        key = half_key(topic)
        await self.dedup.wait_in_flight(key, [m.unique_id], s.send_timeout_s)
        (first,) = self.dedup.known(key, [m.unique_id])
        name = s.cfg.broker_name
        if first is not None:  # a retried half: answered with the first one, stored once
            result = SendResult(make_msg_id(name, first.position), m.unique_id, first.queue_offset, first.position,
                                duplicate=True)
            store_ts = first.store_ts
        else:
            (loc,) = await self.dedup.appending(
                key, [m.unique_id], lambda: s.node.append([record], timeout_s=s.send_timeout_s)
            )
            raise_if_refused(loc.result, "half message")
            result = SendResult(make_msg_id(name, loc.position), m.unique_id, loc.result, loc.position)
            store_ts = m.store_ts
            s.counters["transaction_halves"] += 1
        s.producers.sent(group, client_addr, topic, s.monotonic_ms())
        return SendAnswer(name, qid, store_ts, (result,))

    @translated
    async def end_transaction(
        self, producer_group: str, topic: str, msg_id: str, state: str, *, transaction_id: str | None = None,
        from_check: bool = False,
    ) -> EndAnswer:
        s = self.s
        topic = check_topic(topic)
        group = check_group(producer_group)
        resolution = STATES.get(state) if isinstance(state, str) else None
        if resolution is None:
            raise ProtocolError("BAD_REQUEST", f"state must be one of {sorted(STATES)}", 400)
        if not isinstance(msg_id, str):
            raise ProtocolError("INVALID_MSG_ID", "msg_id must be a string", 400)
        position = self.position_of(msg_id)
        tid = check_unique_id(transaction_id) if transaction_id is not None else None
        if not isinstance(from_check, bool):
            raise ProtocolError("BAD_REQUEST", "from_check must be a boolean", 400)
        self.require_writable()
        s.transactions.counters["ends"] += 1
        done = self._resolved(position, resolution)
        if done is not None:
            return done
        half = s.store.txn.half(position)
        if half is None:
            raise _not_found(msg_id)
        try:
            m = s.store.read_message(position, half.size)
        except MessageNotFound:
            raise _not_found(msg_id) from None
        if m.properties.get(PROP_REAL_TOPIC) != topic or m.properties.get(PROP_PGROUP) != group:
            raise ProtocolError("TRANSACTION_MISMATCH",
                                f"the half at {msg_id} belongs to topic {half.topic!r}, group {half.group!r}",
                                400)
        if tid is not None and tid != m.unique_id:
            raise ProtocolError("TRANSACTION_MISMATCH", f"transaction_id {tid} is not the half's {m.unique_id}", 400)
        if resolution == "UNKNOW":  # RocketMQ logs it; the half stays pending and is checked back
            return EndAnswer("UNKNOW", pending=True)
        if resolution == ROLLBACK:
            cmd = {"op": "txn.end", "position": position, "state": ROLLBACK, "group": group}
            (loc,) = await s.node.append([encode_command(cmd)], timeout_s=s.send_timeout_s)
            raise_if_refused(loc.result, "rollback")
            if isinstance(loc.result, dict) and loc.result.get("outcome") == ROLLBACK:
                return EndAnswer("ROLLBACK_MESSAGE")
            return self._resolved(position, resolution) or _raise(_not_found(msg_id))
        tc = s.store.topic(topic)
        if tc is None:  # deleted since the half was sent: roll back or let the check-backs end it
            raise ProtocolError("TOPIC_NOT_EXIST", f"topic {topic!r} of the transaction no longer exists", 404)
        copy = committed_copy(m, position, s.wall_ms(), tc.write_queue_nums)
        (loc,) = await s.node.append([encode_message(copy)], timeout_s=s.send_timeout_s)
        raise_if_refused(loc.result, "commit")
        if loc.result is not None:  # the first commit: visible now
            s.counters["messages_sent"] += 1
            return EndAnswer("COMMIT_MESSAGE", make_msg_id(s.cfg.broker_name, loc.position), copy.queue_id,
                             loc.result)
        return self._resolved(position, resolution) or _raise(_not_found(msg_id))  # lost a race to a resolution

    def _resolved(self, position: int, state: str) -> EndAnswer | None:
        """The answer for a half resolved already (idempotent commit / rollback), or None."""
        res = self.s.store.txn.resolution(position)
        if res is None:
            return None
        if res.state == state:
            name = "COMMIT_MESSAGE" if state == COMMIT else "ROLLBACK_MESSAGE"
            if res.copy_position is None:
                return EndAnswer(name, duplicate=True)
            return EndAnswer(name, make_msg_id(self.s.cfg.broker_name, res.copy_position), None, res.queue_offset,
                             duplicate=True)
        if state == "UNKNOW":
            return EndAnswer("UNKNOW", pending=False, resolved=res.state)
        code, what = _REFUSED[res.state]
        verb = "committed" if state == COMMIT else "rolled back"
        raise ProtocolError(code, f"the transaction {what}; it cannot be {verb} now", 409)

    @translated
    async def transaction_checks(
        self, producer_group: str, topics: Sequence[str], *, max_count: int = 32, wait_ms: int = 0
    ) -> list[dict[str, Any]]:
        s = self.s
        group = check_group(producer_group)
        if not isinstance(topics, (list, tuple)) or not 1 <= len(topics) <= CHECK_TOPICS_MAX:
            raise ProtocolError("BAD_REQUEST", f"topics must be a list of 1..{CHECK_TOPICS_MAX} topics", 400)
        wanted = frozenset(check_topic(t) for t in topics)
        max_count = check_int(max_count, "max_count", 1, CHECKS_COUNT_MAX)
        wait_ms = min(check_int(wait_ms, "wait_ms", 0, 3_600_000), s.cfg.long_polling_max_ms)
        self.require_writable()
        got = await s.transactions.queue.take(
            group, wanted, max_count, wait_ms / 1000,
            pending=lambda p: s.store.txn.half(p) is not None,
            monotonic=s.clock.monotonic, stopping=lambda: s.stopping,
        )
        return [r.view for r in got]

    @translated_sync
    def pending_halves(self, *, group: str | None = None, topic: str | None = None, limit: int = 100) -> dict[str, Any]:
        s = self.s
        group = check_group(group) if group is not None else None
        topic = check_topic(topic) if topic is not None else None
        limit = check_int(limit, "limit", 1, HALVES_LIMIT_MAX)
        rows = s.store.txn.pending(group=group, topic=topic, limit=limit)
        now = s.wall_ms()
        name = s.cfg.broker_name
        return {
            "broker_name": name,
            "pending": s.store.txn.pending_count(),
            "halves": [
                {"msg_id": make_msg_id(name, h.position), "position": h.position, "producer_group": h.group,
                 "topic": h.topic, "store_ts": h.store_ms, "age_ms": now - h.store_ms, "check_times": h.checks,
                 "immunity_ms": h.immunity_ms}
                for h in rows
            ],
        }


def _not_found(msg_id: str) -> ProtocolError:
    return ProtocolError("TRANSACTION_NOT_FOUND", f"no half message at {msg_id}", 404)


def _raise(exc: ProtocolError) -> EndAnswer:
    raise exc
