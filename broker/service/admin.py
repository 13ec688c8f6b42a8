"""The admin half of the broker service (broker/service/broker_service.py): topics, subscription groups, consumer
offsets (commit, read, reset, progress), client membership (heartbeat, unregister, subscriptions,
orderly consumers' queue locks), the replica's configuration, leadership transfer, consume-queue
cleanup. Every change of replicated state is one admin command appended to the Raft log
(broker/store/metadata.py applies it on every replica).

Offsets a pull reports as consumed (RocketMQ's commit-offset flag on PULL_MESSAGE) are committed
*behind* the pull (``commit_offset_behind``): the pull never waits for them; the offsets noted
meanwhile are merged per (group, topic) — the highest per queue — and appended as one command each
by one flush at a time, so a stream of pulls makes a few commands, not one per pull. A flush that
fails is dropped (logged): consumers also commit their offsets themselves every few seconds."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from broker.protocol.errors import ProtocolError
from broker.protocol.limits import OFFSETS_PER_COMMIT_MAX, QUEUE_NUMS_MAX
from broker.protocol.names import is_client_id, is_decimal, is_stored_group, is_stored_topic, is_topic
from broker.protocol.sql_filter import SqlFilterError, compile_filter
from broker.service.base import INT64_MAX, ServiceBase, translated, translated_sync
from broker.service.consumers import (
    EXPRESSION_CHARS_MAX,
    EXPRESSION_TYPES,
    MAX_GROUPS_PER_CLIENT,
    QueueKey,
    Subscription,
)
from broker.store.message import check_group, check_int, check_topic, encodable, encode_command
from broker.store.metadata import REFUSED_OFFSET_RESET, REFUSED_TOPIC_RECREATED, GroupConfig, TopicConfig
from dledger.membership import MembershipError, check_membership_request

log = logging.getLogger("broker.service")


def offsets_answer(offsets: Mapping[int, int]) -> dict[str, int]:
    """Offsets as they travel: queue id (decimal string) -> offset, by queue id."""
    return {str(q): o for q, o in sorted(offsets.items())}


@dataclasses.dataclass(frozen=True, slots=True)
class CommitAnswer:
    updated: int
    reset_generation: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class GroupOffsets:
    offsets: dict[int, int]
    reset_generation: int
    topic_epoch: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class ResetAnswer:
    offsets: dict[int, int]
    reset_generation: int | None


RESETS_PENDING_MAX = 4096  # queues with a reset RocketMQ's clients have not pulled yet (per replica)
RESET_PENDING_MS = 600_000  # how long such a reset waits for its first pull


GroupSubscription = tuple[str, str, tuple[str, ...]]  # (group, CLUSTERING | BROADCASTING, topics)
GroupFilters = Mapping[str, Mapping[str, Subscription]]  # group -> topic -> expression
LOCK_QUEUES_MAX = 4096  # queues one lock request may name
COMMITS_PENDING_MAX = 100_000  # (group, topic, queue) offsets waiting for a behind-commit


def check_client_id(client_id: Any) -> str:
    if not is_client_id(client_id):
        raise ProtocolError("INVALID_CLIENT_ID", "client id must be 1..255 printable ASCII chars without spaces", 400)
    return str(client_id)


# A refused membership change (dledger.membership.MembershipError's codes): its answer (docs/API.md)
_MEMBERSHIP_REFUSALS: dict[str, tuple[int, str]] = {
    "BAD_REQUEST": (400, "BAD_REQUEST"),
    "LEADER_NOT_READY": (409, "LEADER_NOT_READY"),
    "MEMBERSHIP_CHANGE_PENDING": (409, "MEMBERSHIP_CHANGE_PENDING"),
    "REMOVE_LEADER": (409, "REMOVE_LEADER"),
    "LEARNER_NOT_CAUGHT_UP": (409, "LEARNER_NOT_CAUGHT_UP"),
    "NOT_A_LEARNER": (409, "NOT_A_LEARNER"),
    "ALREADY_MEMBER": (409, "ALREADY_MEMBER"),
    "ADDRESS_IN_USE": (409, "ADDRESS_IN_USE"),
    "UNKNOWN_MEMBER": (409, "UNKNOWN_MEMBER"),
    "LAST_VOTER": (409, "LAST_VOTER"),
    "BAD_MEMBERSHIP": (409, "BAD_MEMBERSHIP"),
}


class AdminOps(ServiceBase):
    _pending_commits: dict[tuple[str, str], dict[int, int]]
    _commits_noted: int
    _commit_flush: asyncio.Task[None] | None

    def _init_offsets(self) -> None:
        self._pending_commits = {}
        self._commits_noted = 0
        self._commit_flush = None
        self._resets_pending: dict[tuple[str, str, int], tuple[int, int]] = {}  # -> (offset, expiry ms)

    # -- topics ----------------------------------------------------------------------------------------
    @translated
    async def put_topic(
        self, topic: str, *, read_queue_nums: int = 4, write_queue_nums: int = 4, perm: int = 6, order: bool = False
    ) -> dict[str, Any]:
        """Create or update a topic (RocketMQ ``updateTopic``); the topic map as applied."""
        cmd = {
            "op": "topic.put",
            "topic": check_topic(topic),
            "read_queue_nums": check_int(read_queue_nums, "read_queue_nums", 1, QUEUE_NUMS_MAX, "INVALID_QUEUE_NUMS"),
            "write_queue_nums": check_int(write_queue_nums, "write_queue_nums", 1, QUEUE_NUMS_MAX,
                                          "INVALID_QUEUE_NUMS"),
            "perm": check_int(perm, "perm", 0, 7, "INVALID_PERM"),
            "order": order,
        }
        if not isinstance(order, bool):
            raise ProtocolError("BAD_REQUEST", "order must be a boolean", 400)
        result = await self.command(cmd)
        return dict(result.get("topic", {}))

    @translated_sync
    def topics(self) -> list[TopicConfig]:
        self.require_state()
        md = self.s.store.metadata_view()
        return [tc for _, tc in sorted(md.topics.items())]

    @translated_sync
    def get_topic(self, topic: str) -> TopicConfig:
        self.require_state()
        return self.topic(check_topic(topic))

    @translated
    async def delete_topic(self, topic: str) -> None:
        """Delete a topic (admin). Also takes a longer name an older release stored (``%RETRY%`` or
        ``%DLQ%`` of a group of up to 255 chars, issue 23): it exists only to be removed."""
        if not is_topic(topic) and not is_stored_topic(topic):
            check_topic(topic)  # raises INVALID_TOPIC
        self.topic(topic)
        await self.command({"op": "topic.delete", "topic": topic})

    @translated_sync
    def topic_status(self, topic: str) -> dict[str, Any]:
        """Per queue: min and max offset, store time of the last message; and the topic's epoch."""
        self.require_state()
        tc = self.topic(check_topic(topic))
        queues = []
        for qid in range(max(tc.read_queue_nums, tc.write_queue_nums)):
            cq = self.s.store.queue(topic, qid)
            last = cq.last_unit() if cq is not None else None
            queues.append(
                {
                    "queue_id": qid,
                    "min_offset": cq.min_offset if cq else 0,
                    "max_offset": cq.max_offset if cq else 0,
                    "last_store_ts": last.store_ts if last else 0,
                }
            )
        return {"topic": topic, "broker_name": self.s.cfg.broker_name, "queues": queues,
                "topic_epoch": self.s.store.topic_epoch(topic)}

    # -- groups ----------------------------------------------------------------------------------------
    @translated
    async def put_group(
        self, group: str, *, consume_enable: bool = True, consume_broadcast_enable: bool = True,
        retry_max_times: int = 16,
    ) -> dict[str, Any]:
        """Create or update a subscription group (RocketMQ ``updateSubGroup``)."""
        cmd: dict[str, Any] = {"op": "group.put", "group": check_group(group)}
        for flag, value in (("consume_enable", consume_enable), ("consume_broadcast_enable", consume_broadcast_enable)):
            if not isinstance(value, bool):
                raise ProtocolError("BAD_REQUEST", f"{flag} must be a boolean", 400)
            cmd[flag] = value
        cmd["retry_max_times"] = check_int(retry_max_times, "retry_max_times", 0, 1000)
        result = await self.command(cmd)
        return dict(result.get("group", {}))

    @translated_sync
    def groups(self) -> list[GroupConfig]:
        self.require_state()
        md = self.s.store.metadata_view()
        return [g for _, g in sorted(md.groups.items())]

    @translated
    async def delete_group(self, group: str) -> bool:
        """Delete a subscription group and its offsets (admin); also a 121..255-char group an older
        release stored (issue 23)."""
        if not is_stored_group(group):
            check_group(group)  # raises INVALID_GROUP
        result = await self.command({"op": "group.delete", "group": group})
        return bool(result.get("deleted"))

    # -- offsets ---------------------------------------------------------------------------------------
    def offsets_map(self, raw: Any, tc: TopicConfig) -> dict[int, int]:
        """Validate a map of queue id (int or decimal string) -> offset against the topic's queues."""
        if not isinstance(raw, dict) or len(raw) > OFFSETS_PER_COMMIT_MAX:
            raise ProtocolError(
                "BAD_REQUEST", f"offsets must be a map of queue id -> offset (≤ {OFFSETS_PER_COMMIT_MAX} entries)", 400
            )
        out = {}
        for k, v in raw.items():
            if isinstance(k, bool) or not (isinstance(k, int) or (is_decimal(k) and len(k) < 8)):
                raise ProtocolError("INVALID_QUEUE_ID", f"queue id {str(k)[:20]!r} is not an integer", 400)
            qid = int(k)
            check_int(qid, "queue id", 0, max(tc.read_queue_nums, tc.write_queue_nums) - 1, "INVALID_QUEUE_ID")
            out[qid] = check_int(v, f"offsets[{qid}]", 0, INT64_MAX, "INVALID_OFFSET")
        return out

    @translated
    async def commit_offsets(
        self, group: str, topic: str, offsets: Mapping[Any, Any], *, reset_generation: int | None = None,
        topic_epoch: int | None = None,
    ) -> CommitAnswer:
        """Commit a group's consume offsets; refused with ``OFFSET_RESET`` if the offsets were reset
        after the client read them (``reset_generation``), ``TOPIC_RECREATED`` if the topic is a new
        incarnation (``topic_epoch``)."""
        group, topic = check_group(group), check_topic(topic)
        parsed = self.offsets_map(offsets, self.topic(topic))
        cmd: dict[str, Any] = {"op": "offset.commit", "group": group, "topic": topic, "offsets": parsed}
        fence: int | None = None
        if reset_generation is not None:
            fence = cmd["reset_generation"] = check_int(reset_generation, "reset_generation", 0, INT64_MAX)
        if topic_epoch is not None:
            cmd["topic_epoch"] = check_int(topic_epoch, "topic_epoch", 0, INT64_MAX)
        result = await self.command(cmd)
        if not result:  # the apply result is gone (not tracked): decide from what was applied since
            result = self._commit_outcome(group, topic, cmd, fence)
        if result.get("refused") == REFUSED_TOPIC_RECREATED:
            raise ProtocolError(
                "TOPIC_RECREATED",
                f"topic {topic!r} was deleted and created again (epoch {result.get('topic_epoch')}) after "
                f"this client read its offsets (epoch {cmd['topic_epoch']}): they belong to the old topic",
                409,
                topic_epoch=result.get("topic_epoch"),
            )
        if result.get("refused") == REFUSED_OFFSET_RESET:
            generation = int(result["reset_generation"])
            raise ProtocolError(
                "OFFSET_RESET",
                f"the offsets of {group!r} on {topic!r} were reset (generation {generation}) after this "
                f"client read them (generation {fence}): read them again",
                409,
                reset_generation=generation,
                offsets=offsets_answer(result["offsets"]),
            )
        return CommitAnswer(int(result.get("updated", 0)), result.get("reset_generation"))

    def _commit_outcome(self, group: str, topic: str, cmd: dict[str, Any], fence: int | None) -> dict[str, Any]:
        md = self.s.store.metadata_view()
        current = md.reset_generation(group, topic)
        if "topic_epoch" in cmd and cmd["topic_epoch"] != md.topic_epoch(topic):
            return {"refused": REFUSED_TOPIC_RECREATED, "topic_epoch": md.topic_epoch(topic)}
        if fence is not None and fence < current:
            return {"refused": REFUSED_OFFSET_RESET, "reset_generation": current,
                    "offsets": md.group_offsets(group, topic)}
        return {"reset_generation": current}

    def commit_offset_behind(self, group: str, topic: str, queue_id: int, offset: int) -> bool:
        """Note that ``group`` consumed ``topic``/``queue_id`` up to ``offset`` (RocketMQ's commit
        flag on a pull): committed through the log behind the caller, merged with other such notes
        (see the module doc). Only the ready leader commits; elsewhere, an offset already committed,
        or an argument out of range: nothing (False). Never raises, never waits."""
        s = self.s
        if not s.ready or offset < 0 or offset > INT64_MAX or queue_id < 0:
            return False
        tc = s.store.topic(topic)
        if tc is None or queue_id >= max(tc.read_queue_nums, tc.write_queue_nums):
            return False
        if s.store.committed_offset(group, topic, queue_id) == offset:
            return False
        pending = self._pending_commits.setdefault((group, topic), {})
        if queue_id not in pending:
            if self._commits_noted >= COMMITS_PENDING_MAX:
                return False
            self._commits_noted += 1
        pending[queue_id] = max(offset, pending.get(queue_id, offset))
        if self._commit_flush is None or self._commit_flush.done():
            self._commit_flush = s.loop.create_task(self._flush_commits(), name="offset-commits")
        return True

    async def _flush_commits(self) -> None:
        s = self.s
        while self._pending_commits:
            batch, self._pending_commits, self._commits_noted = self._pending_commits, {}, 0
            records = [encode_command({"op": "offset.commit", "group": g, "topic": t, "offsets": offsets})
                       for (g, t), offsets in batch.items()]
            try:
                self.require_writable()
                await s.node.append(records, timeout_s=s.send_timeout_s)
                s.counters["offsets_committed_behind"] += len(records)
            except Exception as exc:  # the consumers commit again themselves (every few seconds)
                log.info("%d offset commits behind pulls dropped: %s", len(records), exc)

    @translated_sync
    def committed_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """The offset ``group`` committed on one queue (None: never), as this replica applied it."""
        self.require_state()
        return self.s.store.committed_offset(group, topic, queue_id)

    @translated_sync
    def group_offsets(self, group: str, topic: str) -> GroupOffsets:
        self.require_state()
        md = self.s.store.metadata_view()
        return GroupOffsets(md.group_offsets(group, topic), md.reset_generation(group, topic), md.topic_epoch(topic))

    @translated
    async def reset_offsets(
        self, group: str, topic: str, *, ts: int | None = None, offsets: Mapping[Any, Any] | None = None
    ) -> ResetAnswer:
        """Reset a group's offsets on a topic to the first message stored at or after ``ts``, or to
        ``offsets`` (exactly one of them); bumps the reset generation that fences older commits."""
        group, topic = check_group(group), check_topic(topic)
        tc = self.topic(topic)
        if (ts is None) == (offsets is None):
            raise ProtocolError("BAD_REQUEST", "give exactly one of ts or offsets", 400)
        if ts is not None:
            ts = check_int(ts, "ts", 0, INT64_MAX)
            parsed = {}
            for qid in range(tc.read_queue_nums):
                cq = self.s.store.queue(topic, qid)
                parsed[qid] = cq.search_by_time(ts) if cq is not None else 0
        else:
            parsed = self.offsets_map(offsets, tc)
        self.require_writable()
        noted = self._note_resets(group, topic, parsed)  # before the append: no stale commit slips in
        try:
            result = await self.command({"op": "offset.reset", "group": group, "topic": topic, "offsets": parsed})
        except BaseException:
            for key in noted:
                self._resets_pending.pop(key, None)
            raise
        generation = result.get("reset_generation")
        if generation is None:  # the apply result is gone (not tracked): this reset's, or a later one's
            generation = self.s.store.metadata_view().reset_generation(group, topic)
        return ResetAnswer(parsed, generation)

    # -- resets RocketMQ's clients have not seen yet (RocketMQ 5's server-side reset) --------------------
    def _note_resets(self, group: str, topic: str, offsets: Mapping[int, int]) -> list[tuple[str, str, int]]:
        """Remember, on this replica, the queues of a reset until a RocketMQ client pulls them
        (``take_offset_reset``): meanwhile its offset commits for them are stale (made before it knew)
        and are ignored (``offset_reset_pending``). Our SDK's commits are fenced by reset generations
        instead. Bounded: at most ``RESETS_PENDING_MAX`` queues, each for ``RESET_PENDING_MS``."""
        now = self.s.monotonic_ms()
        pending = self._resets_pending
        for key in [k for k, (_o, expiry) in pending.items() if expiry <= now]:
            del pending[key]
        noted = []
        for qid, offset in offsets.items():
            key = (group, topic, qid)
            if key not in pending and len(pending) >= RESETS_PENDING_MAX:
                log.warning("more than %d queues wait for a reset to reach their clients: %s/%s/%d not tracked",
                            RESETS_PENDING_MAX, group, topic, qid)
                continue
            pending[key] = (offset, now + RESET_PENDING_MS)
            noted.append(key)
        return noted

    def offset_reset_pending(self, group: str, topic: str, queue_id: int) -> bool:
        """Whether a reset of this queue waits for the group's next pull of it (a RocketMQ client's
        offset commit for it is then stale: ignored)."""
        got = self._resets_pending.get((group, topic, queue_id))
        return got is not None and got[1] > self.s.monotonic_ms()

    def take_offset_reset(self, group: str, topic: str, queue_id: int) -> int | None:
        """The offset a pending reset moved this queue to, forgotten now (the pull that asks is
        answered "offset moved" to it); None: no reset pending."""
        got = self._resets_pending.pop((group, topic, queue_id), None)
        if got is None or got[1] <= self.s.monotonic_ms():
            return None
        return got[0]

    @translated_sync
    def group_progress(self, group: str, topic: str | None = None) -> dict[str, Any]:
        """A group's consume progress per queue and its total lag (``mqadmin consumerProgress``)."""
        s = self.s
        group = check_group(group)
        self.require_state()
        md = s.store.metadata_view()
        topics = set(md.group_topics(group))
        for m in s.consumers.members(group, s.monotonic_ms()):
            topics.update(m.topics)
        if topic is not None:
            topics = {check_topic(topic)}
        out, total = [], 0
        for name in sorted(topics):
            tc = md.topics.get(name)
            if tc is None:
                continue
            offsets = md.group_offsets(group, name)
            queues = []
            for qid in range(tc.read_queue_nums):
                cq = s.store.queue(name, qid)
                broker_offset = cq.max_offset if cq is not None else 0
                committed = offsets.get(qid)  # None: the group never committed this queue
                consumer_offset = committed if committed is not None else (cq.min_offset if cq is not None else 0)
                lag = max(0, broker_offset - consumer_offset)
                total += lag
                last = cq.get(consumer_offset - 1) if cq is not None and consumer_offset > 0 else None
                queues.append(
                    {
                        "queue_id": qid,
                        "broker_offset": broker_offset,
                        "consumer_offset": committed,
                        "lag": lag,
                        "last_ts": last.store_ts if last else 0,
                    }
                )
            out.append({"topic": name, "queues": queues})
        return {"group": group, "broker_name": s.cfg.broker_name, "topics": out, "total_lag": total}

    # -- membership ------------------------------------------------------------------------------------
    @translated_sync
    def heartbeat(
        self, client_id: str, groups: Sequence[GroupSubscription], principal: str, *, admin: bool,
        filters: GroupFilters | None = None, expiry_ms: int | None = None,
    ) -> set[str]:
        """Record a client's subscriptions (it owns its client id: ``principal``); ``filters``: the
        expression of each (group, topic), checked here (``check_subscription``); ``expiry_ms``: how
        long the client stays a member without heartbeats (None: ``clientExpiryMs``). The groups
        whose member list changed (their members rebalance: RocketMQ notifies them)."""
        check_client_id(client_id)
        if len(groups) > MAX_GROUPS_PER_CLIENT:
            raise ProtocolError("BAD_REQUEST", f"a client is in at most {MAX_GROUPS_PER_CLIENT} groups", 400)
        for group, model, topics in groups:
            check_group(group)
            if model not in ("CLUSTERING", "BROADCASTING"):
                raise ProtocolError("BAD_REQUEST", f"group {group!r}: model must be CLUSTERING or BROADCASTING", 400)
            for topic in topics:
                check_topic(topic)
        for subs in (filters or {}).values():
            for sub in subs.values():
                self.check_subscription(sub.expression_type, sub.expression)
        changed = self.s.consumers.heartbeat(client_id, list(groups), self.s.monotonic_ms(), principal, admin=admin,
                                             filters=filters, expiry_ms=expiry_ms)
        if changed is None:
            raise ProtocolError("TOO_MANY_CLIENTS", "the broker tracks too many clients", 429)
        return changed

    @translated_sync
    def unregister(self, client_id: str, principal: str, *, admin: bool) -> int:
        return self.s.consumers.unregister(client_id, principal, admin=admin)

    @translated_sync
    def leave(self, client_id: str, group: str | None, principal: str, *, admin: bool) -> set[str]:
        """The client leaves ``group`` (None: all its groups); the groups whose member list changed."""
        check_client_id(client_id)
        if group is not None:
            check_group(group)
        return self.s.consumers.leave(client_id, group, principal, admin=admin)

    def check_subscription(self, expression_type: str, expression: str) -> None:
        """A subscription expression a heartbeat or a pull may use: TAG (any text) or SQL92 (compiled;
        ``FILTER_NOT_SUPPORTED`` when ``enablePropertyFilter`` is off, ``SUBSCRIPTION_PARSE_FAILED``)."""
        if expression_type not in EXPRESSION_TYPES:
            raise ProtocolError("FILTER_NOT_SUPPORTED", f"expression type {expression_type[:20]!r} is not one of "
                                f"{', '.join(EXPRESSION_TYPES)}", 400)
        if len(expression) > EXPRESSION_CHARS_MAX or not encodable(expression):
            raise ProtocolError("SUBSCRIPTION_PARSE_FAILED",
                                f"a subscription expression is at most {EXPRESSION_CHARS_MAX} UTF-8 characters", 400)
        if expression_type == "SQL92":
            if not self.s.cfg.enable_property_filter:
                raise ProtocolError("FILTER_NOT_SUPPORTED",
                                    "this broker does not filter by SQL92 (enablePropertyFilter=false)", 400)
            try:
                compile_filter(expression)
            except SqlFilterError as exc:
                raise ProtocolError("SUBSCRIPTION_PARSE_FAILED", str(exc), 400, position=exc.position) from None

    def subscription_of(self, group: str, topic: str) -> Subscription | None:
        """What ``group`` consumes of ``topic`` by its members' heartbeats here (None: nobody)."""
        return self.s.consumers.subscription(group, topic, self.s.monotonic_ms())

    @translated_sync
    def lock_queues(self, group: str, client_id: str, queues: Iterable[QueueKey]) -> list[QueueKey]:
        """An orderly consumer locks queues of ``group`` (RocketMQ's LOCK_BATCH_MQ): the ones it
        holds now. Per replica (not replicated), each lock expiring 60 s after its last renewal."""
        group, wanted = check_group(group), self._lock_queues_arg(client_id, queues)
        return self.s.locks.lock(group, client_id, wanted, self.s.monotonic_ms())

    @translated_sync
    def unlock_queues(self, group: str, client_id: str, queues: Iterable[QueueKey]) -> int:
        group, wanted = check_group(group), self._lock_queues_arg(client_id, queues)
        return self.s.locks.unlock(group, client_id, wanted)

    def _lock_queues_arg(self, client_id: str, queues: Iterable[QueueKey]) -> list[QueueKey]:
        check_client_id(client_id)
        out: list[QueueKey] = []
        for topic, qid in queues:
            if len(out) >= LOCK_QUEUES_MAX:
                raise ProtocolError("BAD_REQUEST", f"at most {LOCK_QUEUES_MAX} queues per lock request", 400)
            out.append((check_topic(topic), check_int(qid, "queue id", 0, QUEUE_NUMS_MAX - 1, "INVALID_QUEUE_ID")))
        return out

    @translated_sync
    def group_members(self, group: str) -> dict[str, Any]:
        now_ms = self.s.monotonic_ms()
        members = self.s.consumers.members(check_group(group), now_ms)
        out: dict[str, Any] = {
            "group": group,
            "client_ids": [m.client_id for m in members],
            "members": [{"client_id": m.client_id, "model": m.model, "topics": list(m.topics)} for m in members],
        }
        departed = self.s.consumers.departed(group)
        if departed is not None:  # no member now: how the last one consumed, and how long ago it was seen
            out["departed"] = {"model": departed[0], "last_seen_ms_ago": max(0, now_ms - departed[1])}
        return out

    @translated_sync
    def producer_connections(self, group: str) -> list[Any]:
        """Producers of a group seen sending here lately (``mqadmin producerConnection``)."""
        return list(self.s.producers.connections(check_group(group), self.s.monotonic_ms()))

    # -- the replica -----------------------------------------------------------------------------------
    @translated
    async def status(self) -> dict[str, Any]:
        return await self.s.status()

    def config(self) -> dict[str, Any]:
        """The replica's configuration, secrets left out."""
        return dict(self.s.config_view())

    @translated_sync
    def update_config(self, key: str, value: str) -> Any:
        """Change one hot key on this replica until it restarts; the value now in effect."""
        self.s.update_config(key, value)
        self.s.counters["config_updates"] += 1
        log.warning("config %s set to %s by updateBrokerConfig (until restart)", key, value)
        self.s.registrar.trigger()  # autoCreateTopicEnable changes what the registration announces
        return self.s.config_view().get(key)

    @translated_sync
    def check_config_update(self, updates: Mapping[str, str]) -> None:
        """Whether every one of ``updates`` would apply (hot keys, valid values): a caller that
        changes several keys checks them all first, so that all change or none."""
        self.s.check_config(updates)

    def refused_records(self) -> dict[str, Any]:
        """The records this replica's apply refused (broker/store/record_rules.py): how many, and the last
        ones with their log index, position, kind and reason — the same on every replica that
        applied the same log."""
        s = self.s
        return {
            "broker_name": s.cfg.broker_name,
            "self_id": s.cfg.dledger.self_id,
            "applied_index": s.store.applied_index(),
            **s.store.refusals.view(),
        }

    @translated
    async def clean_expired_queues(self) -> list[tuple[str, int]]:
        """Remove the consume queues of topics that no longer exist; runs between two ticks."""
        removed = await self.s.node.run_on_replica_thread(self.s.store.clean_expired_queues, 10.0)
        return list(removed)

    @translated
    async def transfer_leadership(self, target: str | None) -> str | None:
        """Hand leadership to ``target`` (a peer id) or to the best follower (None); the new leader."""
        node = self.s.node
        voters = node.core.membership.current.membership.voter_ids  # issue 27: the membership in force
        if target is not None and (not isinstance(target, str) or target not in voters):
            raise ProtocolError("BAD_REQUEST", f"target must be one of {sorted(voters)}", 400)
        if target is not None and target == node.leader_id == node.settings.self_id:
            return target  # already there: nothing to do
        leader: str | None = await node.transfer_leadership(target)
        return leader

    @translated
    async def membership(self) -> dict[str, Any]:
        """The group's membership as this replica holds it (issue 27): voters, learners, the log
        entry that set it, where it came from."""
        return dict(await self.s.node.membership())

    @translated
    async def change_membership(self, payload: Any) -> dict[str, Any]:
        """One membership change through the log (the leader only): ``{op, id, address?}``."""
        try:
            op, peer_id, address = check_membership_request(payload)
            return dict(await self.s.node.change_membership(op, peer_id, address))
        except MembershipError as exc:
            status, code = _MEMBERSHIP_REFUSALS.get(exc.code, (409, "BAD_MEMBERSHIP"))
            raise ProtocolError(code, str(exc), status) from None
