"""The admin half of the broker service (broker/service/broker_service.py): topics, subscription groups, consumer
offsets (commit, read, reset, progress), client membership (heartbeat, unregister), the replica's
configuration, leadership transfer, consume-queue cleanup. Every change of replicated state is one
admin command appended to the Raft log (broker/store/metadata.py applies it on every replica)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from broker.protocol.errors import ProtocolError
from broker.protocol.limits import OFFSETS_PER_COMMIT_MAX, QUEUE_NUMS_MAX
from broker.protocol.names import is_decimal, is_stored_group, is_stored_topic, is_topic
from broker.service.base import INT64_MAX, ServiceBase, translated, translated_sync
from broker.store.message import check_group, check_int, check_topic
from broker.store.metadata import REFUSED_OFFSET_RESET, REFUSED_TOPIC_RECREATED, GroupConfig, TopicConfig

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


GroupSubscription = tuple[str, str, tuple[str, ...]]  # (group, CLUSTERING | BROADCASTING, topics)


class AdminOps(ServiceBase):
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
        result = await self.command({"op": "offset.reset", "group": group, "topic": topic, "offsets": parsed})
        generation = result.get("reset_generation")
        if generation is None:  # the apply result is gone (not tracked): this reset's, or a later one's
            generation = self.s.store.metadata_view().reset_generation(group, topic)
        return ResetAnswer(parsed, generation)

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
    def heartbeat(self, client_id: str, groups: Sequence[GroupSubscription], principal: str, *, admin: bool) -> None:
        """Record a client's subscriptions (it owns its client id: ``principal``)."""
        if not self.s.consumers.heartbeat(client_id, list(groups), self.s.monotonic_ms(), principal, admin=admin):
            raise ProtocolError("TOO_MANY_CLIENTS", "the broker tracks too many clients", 429)

    @translated_sync
    def unregister(self, client_id: str, principal: str, *, admin: bool) -> int:
        return self.s.consumers.unregister(client_id, principal, admin=admin)

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
        log.warning("config %s set to %s by updateBrokerConfig (until restart)", key, value)
        self.s.registrar.trigger()  # autoCreateTopicEnable changes what the registration announces
        return self.s.config_view().get(key)

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
        if target is not None and (not isinstance(target, str) or target not in node.settings.peers):
            raise ProtocolError("BAD_REQUEST", f"target must be one of {sorted(node.settings.peers)}", 400)
        if target is not None and target == node.leader_id == node.settings.self_id:
            return target  # already there: nothing to do
        leader: str | None = await node.transfer_leadership(target)
        return leader
