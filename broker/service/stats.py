"""What the broker service tells operators about the replica and its consumers, beyond the admin
half (broker/service/admin.py): the figures RocketMQ's ``mqadmin`` reads over the remoting protocol
(brokerStatus, clusterList, consumerProgress, queryMsgById's consumer track, resetOffsetByTime,
cloneGroupOffset), computed from the replica's own counters and replicated state:

- ``runtime_info() -> RuntimeInfo``: messages stored by sends and served by pulls since this
  replica started, their rates over the last ``RATE_WINDOW_S`` seconds, the log's first and end
  positions, the store's disk use, the start time; ``broker_config()``, ``config_updates()``,
  ``metadata_version()``.
- ``consume_stats(group, topic=None) -> ConsumeStats``: per queue of every topic the group consumes
  here, the queue's max offset, the group's committed offset (0 when never committed, as RocketMQ
  answers) and the store time of the last consumed message; the group's pull rate.
- ``topic_consumer_groups(topic)``: the groups that consume a topic (members heartbeating here, or
  offsets committed on it).
- ``consume_time_span(group, topic)``: per queue, the store times of the first and last message
  and of the last consumed one, and how long the next one has waited.
- ``await reset_offsets_by_time(group, topic, ts, *, force)``: RocketMQ's reset by time (``ts`` -1:
  the queues' ends; ``force`` False: a queue never moves forward), through the Raft log.
- ``await clone_group_offsets(src_group, dest_group, topic)``: the destination takes the source's
  committed offsets, through the Raft log (as an explicit reset).

Reads run on any replica with the replicated state; the two writes need the ready leader.
"""

from __future__ import annotations

import dataclasses

from broker.protocol.errors import ProtocolError
from broker.protocol.properties import retry_topic
from broker.service.admin import AdminOps, ResetAnswer
from broker.service.base import INT64_MAX, ServiceConfig, translated, translated_sync
from broker.store.message import check_group, check_int, check_topic
from dledger.durable import disk_used_ratio

CLONE_TOPICS_MAX = 1024  # topics one clone copies (a group consumes a few)


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeInfo:
    """This replica's figures (``runtime_info``); every one is a counter or a reading, none estimated."""

    broker_name: str
    leads: bool  # the group's ready leader (RocketMQ's master, brokerId 0)
    boot_ms: int  # wall time the service started
    messages_put: int  # messages stored by sends answered here, since start
    messages_got: int  # messages served by pulls here, since start
    put_tps: float  # over the last RATE_WINDOW_S seconds (broker/server/metrics.py)
    get_tps: float
    log_first_position: int
    log_end_position: int  # end of the last applied record
    disk_used_ratio: float | None  # the store directory's file system; None if unreadable
    halves_pending: int  # transactional half messages not yet committed or rolled back


@dataclasses.dataclass(frozen=True, slots=True)
class QueueStats:
    topic: str
    queue_id: int
    broker_offset: int  # the queue's max offset (next to be written)
    consumer_offset: int  # committed, 0 if never
    last_ts: int  # store time of the message before consumer_offset, 0 if none


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumeStats:
    queues: tuple[QueueStats, ...]
    consume_tps: float


@dataclasses.dataclass(frozen=True, slots=True)
class QueueSpan:
    queue_id: int
    min_ts: int  # store time of the first message still in the queue (-1: empty)
    max_ts: int  # store time of the last one (0: empty)
    consume_ts: int  # store time of the last consumed one (min_ts when none)
    delay_ms: int  # how long the first unconsumed one has waited (0: none waiting)


class StatsOps(AdminOps):
    _boot_ms: int

    def _init_stats(self) -> None:
        self._boot_ms = self.s.wall_ms()

    # -- the replica ---------------------------------------------------------------------------------
    def runtime_info(self) -> RuntimeInfo:
        s = self.s
        try:
            disk: float | None = disk_used_ratio(s.cfg.store_dir)
        except OSError:
            disk = None
        return RuntimeInfo(
            broker_name=s.cfg.broker_name,
            leads=self.leads(),
            boot_ms=self._boot_ms,
            messages_put=int(s.counters["messages_sent"]),
            messages_got=int(s.counters["messages_pulled"]),
            put_tps=sum(s.metrics.producer_rate.rates().values()),
            get_tps=sum(s.metrics.consumer_rate.rates().values()),
            log_first_position=s.first_log_position(),
            log_end_position=s.store.applied_end_position,
            disk_used_ratio=disk,
            halves_pending=s.store.txn.pending_count(),
        )

    def broker_config(self) -> ServiceConfig:
        """The replica's configuration in effect (``update_config`` replaces it)."""
        return self.s.cfg

    def config_updates(self) -> int:
        """Keys changed by ``update_config`` since start."""
        return int(self.s.counters["config_updates"])

    def metadata_version(self) -> int:
        """Bumped by every applied change of topics, groups or offsets (the registration's source)."""
        return self.s.store.metadata_view().version

    # -- consumers -----------------------------------------------------------------------------------
    @translated_sync
    def consume_stats(self, group: str, topic: str | None = None) -> ConsumeStats:
        """RocketMQ's ConsumeStats of ``group`` here (see the module doc); ``topic``: that one only."""
        s = self.s
        progress = self.group_progress(group, topic)
        rows = []
        for t in progress["topics"]:
            name = t["topic"]
            for q in t["queues"]:
                committed = q["consumer_offset"]
                rows.append(QueueStats(name, q["queue_id"], q["broker_offset"],
                                       committed if committed is not None else 0, q["last_ts"]))
        rates = s.metrics.consumer_rate.rates()
        tps = sum(rate for key, rate in rates.items()
                  if isinstance(key, tuple) and key[1] == group and (topic is None or key[0] == topic))
        return ConsumeStats(tuple(rows), tps)

    @translated_sync
    def topic_consumer_groups(self, topic: str) -> list[str]:
        """Groups consuming ``topic``: members heartbeating here that subscribe to it, and groups
        with offsets committed on it (RocketMQ's queryTopicConsumeByWho)."""
        s = self.s
        topic = check_topic(topic)
        self.require_state()
        groups = {g for (g, t, _q) in s.store.metadata_view().offsets if t == topic}
        now = s.monotonic_ms()
        for group in s.consumers.groups():
            if any(topic in m.topics for m in s.consumers.members(group, now)):
                groups.add(group)
        return sorted(groups)

    @translated_sync
    def consume_time_span(self, group: str, topic: str) -> list[QueueSpan]:
        s = self.s
        group = check_group(group)
        tc = self.get_topic(topic)
        offsets = s.store.metadata_view().group_offsets(group, topic)
        now = s.wall_ms()
        out = []
        for qid in range(tc.write_queue_nums):
            cq = s.store.queue(topic, qid)
            first = cq.get(cq.min_offset) if cq is not None else None
            last = cq.last_unit() if cq is not None else None
            min_ts = first.store_ts if first is not None else -1
            committed = offsets.get(qid, 0)
            consumed = cq.get(committed - 1) if cq is not None and committed > 0 else None
            consume_ts = consumed.store_ts if consumed is not None else min_ts
            waiting = cq.get(committed) if cq is not None and committed < cq.max_offset else None
            delay = max(0, now - waiting.store_ts) if waiting is not None else 0
            out.append(QueueSpan(qid, min_ts, last.store_ts if last is not None else 0, consume_ts, delay))
        return out

    # -- offsets ---------------------------------------------------------------------------------------
    @translated
    async def reset_offsets_by_time(self, group: str, topic: str, ts: int, *, force: bool = True) -> ResetAnswer:
        """Reset ``group`` on ``topic`` to the first message stored at or after ``ts`` per queue (-1:
        to the queues' ends); ``force`` False keeps a queue whose committed offset is already lower.
        Through the Raft log (``reset_offsets``: the reset generation fences older commits)."""
        s = self.s
        group, topic = check_group(group), check_topic(topic)
        ts = check_int(ts, "timestamp", -1, INT64_MAX)
        if not isinstance(force, bool):
            raise ProtocolError("BAD_REQUEST", "force must be a boolean", 400)
        self.require_writable()  # a follower's queues may lag: only the ready leader plans a reset
        tc = self.topic(topic)
        committed = s.store.metadata_view().group_offsets(group, topic)
        offsets = {}
        for qid in range(tc.read_queue_nums):
            cq = s.store.queue(topic, qid)
            if cq is None:
                target = 0
            else:
                target = cq.max_offset if ts == -1 else cq.search_by_time(ts)
            current = committed.get(qid)
            offsets[qid] = target if force or current is None or target < current else current
        return await self.reset_offsets(group, topic, offsets=offsets)

    @translated
    async def clone_group_offsets(self, src_group: str, dest_group: str, topic: str | None = None
                                  ) -> dict[str, ResetAnswer]:
        """``dest_group`` takes ``src_group``'s committed offsets on ``topic`` (None: every topic the
        source committed on, its retry topic left out); one reset per topic, through the Raft log."""
        s = self.s
        src, dest = check_group(src_group), check_group(dest_group)
        md = s.store.metadata_view()
        topics = [check_topic(topic)] if topic is not None else [
            t for t in md.group_topics(src) if t != retry_topic(src)]
        if len(topics) > CLONE_TOPICS_MAX:
            raise ProtocolError("BAD_REQUEST", f"{src!r} committed on more than {CLONE_TOPICS_MAX} topics", 400)
        out: dict[str, ResetAnswer] = {}
        for t in topics:
            offsets = md.group_offsets(src, t)
            if offsets and t in md.topics:
                out[t] = await self.reset_offsets(dest, t, offsets=offsets)
        return out
