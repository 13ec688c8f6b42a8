"""The write half of the broker service (broker/service/broker_service.py): send a batch, create a topic on first
send, send a message back for retry or to the DLQ, resend a DLQ message.

A send (RocketMQ ``putMessage``), in order — every refusal comes before anything is appended, and an
unknown topic is auto-created only after the whole request was checked:

    producer group -> ready leader -> queue id -> messages (build_messages) -> schedule (delay level)
      -> topic (auto-create) -> writable, queue id < write queues
      -> dedup: wait for in-flight attempts, answer known unique ids from the window
      -> append the fresh records (one Raft entry) -> results: msg id, queue offset (from the apply)
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from broker.protocol.errors import ProtocolError
from broker.protocol.names import is_topic
from broker.protocol.properties import DLQ_PREFIX, RETRY_PREFIX, dlq_topic, retry_topic
from broker.service.base import (
    DLEDGER_ERRORS,
    ServiceBase,
    raise_if_refused,
    refusal_error,
    translated,
)
from broker.store.dedup import FirstSend, SendDeduper
from broker.store.message import (
    StoredMessage,
    build_messages,
    check_group,
    check_int,
    check_topic,
    encode_message,
    encode_messages,
    make_msg_id,
    parse_msg_id,
)
from broker.store.message_store import MessageNotFound
from broker.store.metadata import TopicConfig
from broker.store.retry import (
    DEFAULT_MAX_RECONSUME_TIMES,
    DLQ_PERM,
    RETRY_PERM,
    RETRY_QUEUE_NUMS,
    resend_from_dlq,
    send_back,
)
from dledger.node import DLedgerError, NotLeaderError, Refused

MessageIn = Mapping[str, Any]
"""One message of a send as it travels (docs/API.md ``POST /v1/send``): ``body`` (bytes, required),
``tags``, ``keys``, ``properties``, ``unique_id``, ``born_ts``, ``born_host``, ``flag``; validated by
``build_messages`` (a bad one refuses the whole batch)."""


# A named tuple made from its fields' tuple without its generated ``__new__`` (a Python function of
# every field): for the results the leader makes per message sent, in the order of SendResult's fields.
_new_tuple = tuple.__new__


class SendResult(NamedTuple):
    """Where one message of a send was stored (a duplicate: where its first copy was). A named
    tuple: the leader makes one per message sent."""

    msg_id: str
    unique_id: str
    queue_offset: int | None
    position: int
    duplicate: bool = False
    queue_id: int = -1  # set when a request's messages named their own queues

    def to_dict(self) -> dict[str, Any]:
        return _result_maps((self,))[0]


@dataclasses.dataclass(frozen=True, slots=True)
class SendAnswer:
    """A stored batch: one ``SendResult`` per message, in the order sent."""

    broker_name: str
    queue_id: int
    store_ts: int
    results: tuple[SendResult, ...]
    status: str = "SEND_OK"

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "broker_name": self.broker_name,
            "queue_id": self.queue_id,
            "store_ts": self.store_ts,
            "results": _result_maps(self.results),
        }


def _result_maps(results: Sequence[SendResult]) -> list[dict[str, Any]]:
    """Each result's answer map (``duplicate`` only when true, ``queue_id`` only when named): one
    loop for a send's results, no call per message (the leader answers every message sent)."""
    out = []
    for msg_id, unique_id, queue_offset, position, duplicate, queue_id in results:
        r: dict[str, Any] = {"msg_id": msg_id, "unique_id": unique_id, "queue_offset": queue_offset,
                             "position": position}
        if duplicate:
            r["duplicate"] = True
        if queue_id >= 0:
            r["queue_id"] = queue_id
        out.append(r)
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class SendBackAnswer:
    """A message sent back: the topic it went to (``%RETRY%group`` or ``%DLQ%group``), its new id."""

    topic: str
    msg_id: str
    dlq: bool = False
    reconsume_times: int | None = None


class SendOps(ServiceBase):
    dedup: SendDeduper

    def _init_send(self) -> None:
        s = self.s
        self.dedup = SendDeduper(  # idempotent sends (broker/store/dedup.py)
            s.store.dedup,
            log_end=lambda: s.node.last_index,
            applied=s.store.applied_index,
            term=lambda: s.node.term,
            monotonic=s.clock.monotonic,
        )

    @translated
    async def send(
        self,
        topic: str,
        queue_id: int,
        messages: Sequence[MessageIn],
        *,
        producer_group: str | None = None,
        client_addr: str = "",
    ) -> SendAnswer:
        """Store a batch of 1..1024 messages in one queue of ``topic`` (created on first send if
        ``autoCreateTopicEnable``); ``client_addr`` is the default ``born_host`` and what
        ``producerConnection`` lists. A retried send is answered with its first results."""
        try:
            return await self._send(topic, queue_id, messages, producer_group, client_addr)
        except NotLeaderError:
            self.s.metrics.send_failed("NOT_LEADER")
            raise
        except ProtocolError as exc:  # every coded refusal
            self.s.metrics.send_failed(exc.code)
            raise
        except DLedgerError as exc:
            self.s.metrics.send_failed(DLEDGER_ERRORS.get(type(exc), (503, "SERVICE_UNAVAILABLE"))[1])
            raise

    async def _send(
        self, topic: str, queue_id: int, messages: Sequence[MessageIn], producer_group: str | None, client_addr: str
    ) -> SendAnswer:
        s = self.s
        started = s.clock.monotonic()
        topic = check_topic(topic)
        if producer_group is not None:
            check_group(producer_group)
        self.require_writable()
        # Everything about the request is checked before an unknown topic gets auto-created.
        known = s.store.topic(topic)
        queue_nums = known.write_queue_nums if known is not None else s.cfg.default_topic_queue_nums
        qid = check_int(queue_id, "queue_id", 0, queue_nums - 1, "INVALID_QUEUE_ID")
        store_ts = s.wall_ms()
        msgs = build_messages(
            topic,
            qid,
            messages,
            store_ts=store_ts,
            max_size=s.cfg.max_message_size,
            new_unique_id=lambda: uuid.uuid4().hex.upper(),
            default_born_host=client_addr,
            queue_ids_max=queue_nums,
        )
        # Messages naming their own queues (an auto-batch across queues): each result says where.
        qids = [m.queue_id for m in msgs]
        if qids.count(qid) == len(qids):  # every message in the request's queue
            qids = []
        highest_qid = max(qids, default=qid)
        # Delayed and timed messages go to the schedule topic until due (broker/store/schedule.py).
        msgs = s.schedule.policy.prepare_batch(msgs)
        records = encode_messages(msgs)
        tc = known or await self._topic_for_send(topic)
        if not tc.writable:
            raise ProtocolError("NO_PERMISSION", f"topic {topic!r} is not writable (perm {tc.perm})", 403)
        if max(qid, highest_qid) >= tc.write_queue_nums:
            raise ProtocolError("INVALID_QUEUE_ID",
                                f"queue_id {max(qid, highest_qid)} >= write_queue_nums {tc.write_queue_nums}",
                                400)
        s.counters["send_requests"] += 1
        uids = [m.unique_id for m in msgs]
        waited_from = s.clock.monotonic()
        await self.dedup.wait_in_flight(topic, uids, s.send_timeout_s)
        append_timeout_s = max(0.05, s.send_timeout_s - (s.clock.monotonic() - waited_from))
        firsts = self.dedup.known(topic, uids)
        if firsts.count(None) == len(firsts):  # nothing sent before (the usual send): every message is fresh
            fresh = list(range(len(msgs)))
            fresh_uids, fresh_records = uids, records
        else:
            fresh = [i for i, k in enumerate(firsts) if k is None]
            fresh_uids, fresh_records = [uids[i] for i in fresh], [records[i] for i in fresh]
        locs: list[Any] = []
        if fresh:
            locs = await self.dedup.appending(
                topic, fresh_uids, lambda: s.node.append(fresh_records, timeout_s=append_timeout_s)
            )
        s.counters["messages_sent"] += len(fresh)
        s.counters["duplicate_messages"] += len(msgs) - len(fresh)
        s.metrics.sent(topic, len(fresh), sum(map(len, fresh_records)), s.clock.monotonic() - started)
        if producer_group is not None:
            s.producers.sent(producer_group, client_addr, topic, s.monotonic_ms())
        return self._send_answer(msgs, firsts, fresh, locs, qid, store_ts, qids)

    def _send_answer(
        self,
        msgs: list[StoredMessage],
        firsts: list[FirstSend | None],
        fresh: list[int],
        locs: list[Any],
        qid: int,
        store_ts: int,
        qids: list[int],
    ) -> SendAnswer:
        """``qids``: each message's queue when they named their own (else empty): then every result
        carries its queue id."""
        name = self.s.cfg.broker_name
        refused = [i for i, loc in zip(fresh, locs, strict=True) if isinstance(loc.result, Refused)]
        if refused:  # committed, refused by every replica's apply: stored nowhere a consumer reads
            first = locs[fresh.index(refused[0])].result
            raise refusal_error(first, "message" if len(msgs) == 1 else "batch", refused=refused)
        prefix = name + ":"  # make_msg_id's format, per message without a call (a test pins the two)
        if len(fresh) == len(msgs):  # nothing sent before (the usual send): fresh is every index, in order
            # loc.result: the queue offset its apply assigned (results travel with the call)
            return SendAnswer(name, qid, store_ts, tuple([
                _new_tuple(SendResult,
                           (f"{prefix}{loc.position:016X}", m.unique_id, loc.result, loc.position, False, q))
                for m, loc, q in zip(msgs, locs, qids or [-1] * len(msgs), strict=True)
            ]))
        # A retried send is answered with its first result (stored once); fresh messages as usual.
        results: list[SendResult | None] = [
            None if k is None else SendResult(make_msg_id(name, k.position), m.unique_id, k.queue_offset, k.position,
                                              duplicate=True, queue_id=k.queue_id if qids else -1)
            for m, k in zip(msgs, firsts, strict=True)
        ]
        if not fresh:
            first = firsts[0]
            assert first is not None
            qid, store_ts = first.queue_id, first.store_ts
        for i, loc in zip(fresh, locs, strict=True):
            results[i] = SendResult(make_msg_id(name, loc.position), msgs[i].unique_id, loc.result, loc.position,
                                    queue_id=qids[i] if qids else -1)
        assert all(r is not None for r in results)
        return SendAnswer(name, qid, store_ts, tuple(r for r in results if r is not None))

    async def _topic_for_send(self, topic: str) -> TopicConfig:
        s = self.s
        tc = s.store.topic(topic)
        if tc is not None:
            return tc
        retry = topic.startswith(RETRY_PREFIX)
        if not s.cfg.auto_create_topic and not retry:
            raise ProtocolError("TOPIC_NOT_EXIST", f"topic {topic!r} does not exist (autoCreateTopicEnable=false)", 404)
        pending = s.creating.get(topic)
        if pending is None:
            # A group's retry topic (a consumer resending a message it could not send back) is
            # created as a send-back creates it, whatever autoCreateTopicEnable says (RocketMQ's).
            n = RETRY_QUEUE_NUMS if retry else s.cfg.default_topic_queue_nums
            cmd = {"op": "topic.put", "topic": topic, "read_queue_nums": n, "write_queue_nums": n,
                   "perm": RETRY_PERM if retry else 6}
            pending = s.loop.create_task(self.command(cmd))
            s.creating[topic] = pending
            pending.add_done_callback(lambda _t: s.creating.pop(topic, None))
        await pending
        tc = s.store.topic(topic)
        if tc is None:
            raise ProtocolError("SERVICE_UNAVAILABLE", f"topic {topic!r} could not be created", 503)
        return tc

    def retry_topic_missing(self, group: str) -> bool:
        """Whether ``group``'s retry topic is missing on this ready leader (``ensure_retry_topic``
        would create it); False elsewhere and for a group whose retry topic is no valid topic name."""
        topic = retry_topic(group)
        return self.leads() and is_topic(topic) and self.s.store.topic(topic) is None

    @translated
    async def ensure_retry_topic(self, group: str) -> None:
        """Create ``group``'s retry topic as a send-back does, if it is missing (RocketMQ's broker
        creates it at a consumer's heartbeat: tools find a group's brokers by that topic's route)."""
        topic = retry_topic(check_group(group))
        if not is_topic(topic):
            raise ProtocolError("INVALID_GROUP", f"the group's retry topic {topic[:140]!r} is no valid topic", 400)
        self.require_writable()
        await self._topic_for_send(topic)

    # -- retries and DLQs (broker/store/retry.py) -----------------------------------------------------------
    async def _ensure_topic(self, topic: str, perm: int) -> TopicConfig:
        if not is_topic(topic):  # a derived name is validated like any other before it is appended
            raise ProtocolError("INVALID_GROUP", f"the group's retry/DLQ topic {topic[:140]!r} is no valid topic", 400)
        tc = self.s.store.topic(topic)
        if tc is None:
            await self.command(
                {"op": "topic.put", "topic": topic, "read_queue_nums": RETRY_QUEUE_NUMS,
                 "write_queue_nums": RETRY_QUEUE_NUMS, "perm": perm}
            )
            tc = self.s.store.topic(topic)
        if tc is None:
            raise ProtocolError("SERVICE_UNAVAILABLE", f"topic {topic!r} could not be created", 503)
        if not tc.writable:
            raise ProtocolError("NO_PERMISSION", f"topic {topic!r} is not writable (perm {tc.perm})", 403)
        return tc

    def _read_for_retry(self, position: int) -> StoredMessage:
        try:
            return self.s.store.read_message(position)
        except MessageNotFound:
            raise ProtocolError("MESSAGE_NOT_FOUND", f"no message at position {position}", 404) from None

    async def _append_one(self, m: StoredMessage) -> int:
        locs = await self.s.node.append([encode_message(m)], timeout_s=self.s.send_timeout_s)
        raise_if_refused(locs[0].result, "message")
        self.s.counters["messages_sent"] += 1
        return locs[0].position

    def position_of(self, msg_id: str) -> int:
        """The log position of a message id of this broker group (``INVALID_MSG_ID`` otherwise)."""
        name, position = parse_msg_id(msg_id)
        if name != self.s.cfg.broker_name:
            raise ProtocolError("INVALID_MSG_ID", f"msg id of {name!r}, this is {self.s.cfg.broker_name!r}", 400)
        return position

    def group_consumes(self, group: str, topic: str) -> bool:
        """Whether ``group`` consumes ``topic`` as far as this replica knows: it is the group's own
        retry topic, the group committed offsets on it (replicated), or a member of the group
        heartbeating here subscribes to it."""
        s = self.s
        if topic == retry_topic(group) or s.store.group_has_offsets(group, topic):
            return True
        return any(topic in m.topics for m in s.consumers.members(group, s.monotonic_ms()))

    @translated
    async def send_back(
        self, group: str, position: int, *, max_reconsume_times: int | None = None, to_dlq: bool = False,
        may_read: Callable[[str], None] | None = None, delay_level: int | None = None,
    ) -> SendBackAnswer:
        """RocketMQ ``consumerSendMsgBack``: the message at ``position`` goes to ``%RETRY%group``
        (delayed by ``delay_level``, else by its reconsume level) or, past ``max_reconsume_times``
        or with ``to_dlq``, to ``%DLQ%group``. ``max_reconsume_times`` None: the group's
        ``retry_max_times``.

        A send-back copies a message into a topic the group's consumers read, so it must name a
        message they could read anyway (issue 23, finding 2), checked on the stored message before
        anything is appended: ``may_read(topic)`` (the transport's ACL check of SUB on its topic)
        must pass, and the group must consume that topic (``group_consumes``; ``NOT_SUBSCRIBED``
        otherwise)."""
        s = self.s
        group = check_group(group)
        self.require_writable()
        if max_reconsume_times is None:
            gc = s.store.group(group)
            max_reconsume_times = gc.retry_max_times if gc is not None else DEFAULT_MAX_RECONSUME_TIMES
        max_reconsume_times = check_int(max_reconsume_times, "max_reconsume_times", 0, 2**31 - 1)
        if delay_level is not None:
            delay_level = check_int(delay_level, "delay_level", 0, 2**31 - 1)
        m = self._read_for_retry(position)
        if may_read is not None:
            may_read(m.topic)
        if not self.group_consumes(group, m.topic):
            raise ProtocolError(
                "NOT_SUBSCRIBED",
                f"group {group!r} does not consume topic {m.topic!r} (no member subscribes to it here, no offsets "
                "committed on it): only a message the group consumed can be sent back",
                403,
            )
        sb = send_back(
            m, make_msg_id(s.cfg.broker_name, position), group=group, max_reconsume_times=max_reconsume_times,
            to_dlq=to_dlq, store_ts=s.wall_ms(), levels=len(s.schedule.policy.levels_ms), delay_level=delay_level,
        )
        await self._ensure_topic(sb.topic, DLQ_PERM if sb.dlq else RETRY_PERM)
        record = s.schedule.policy.prepare(sb.message, "sendback")
        new_position = await self._append_one(record)
        s.counters["sendback_dlq" if sb.dlq else "sendback_retry"] += 1
        return SendBackAnswer(sb.topic, make_msg_id(s.cfg.broker_name, new_position), sb.dlq, sb.reconsume_times)

    @translated
    async def resend_dlq(self, group: str, position: int) -> SendBackAnswer:
        """Resend the DLQ message at ``position`` to ``%RETRY%group`` (``NOT_IN_DLQ`` otherwise)."""
        s = self.s
        group = check_group(group)
        self.require_writable()
        m = self._read_for_retry(position)
        if m.topic != dlq_topic(group):
            raise ProtocolError(
                "NOT_IN_DLQ", f"the message at {position} is in {m.topic!r}, not {DLQ_PREFIX}{group}", 400
            )
        await self._ensure_topic(retry_topic(group), RETRY_PERM)
        new_position = await self._append_one(resend_from_dlq(m, group, s.wall_ms()))
        return SendBackAnswer(retry_topic(group), make_msg_id(s.cfg.broker_name, new_position))
