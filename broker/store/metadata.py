"""Replicated broker metadata: topic configs, subscription groups, consumer offsets.

Pure state changed only by commands applied from the Raft log (``apply``), in log order, on every
replica — so every replica holds the same metadata, and a new leader never rewinds a consumer.
Commands are plain maps (``broker.store.message.encode_command``); a malformed or unknown command is
*skipped* (answering ``{"error": ...}``) rather than raised, because the log is already committed
and every replica must skip it the same way.

Consumer offsets only move forward, except through ``offset.reset`` (RocketMQ's resetOffsetByTime).

Reset generations fence running consumers off a reset: every applied ``offset.reset`` bumps the
(group, topic) generation (0 = never reset). An ``offset.commit`` that carries a
``reset_generation`` below the current one was computed from offsets read before the reset, so it
is refused as a whole (``{"refused": "OFFSET_RESET", ...}``) instead of undoing the reset; a commit
without one is applied as before. Deciding this here, at apply time, makes every replica decide the
same way. Generations only grow: deleting a topic or a group keeps them, so a consumer that read an
older generation can never slip a stale commit past a later reset.

Topic epochs tell the incarnations of a topic apart: the Raft log position of the ``topic.put`` that
created it (an update keeps it; a delete drops it, so creating it again gives a new, larger one; 0 for
topics of snapshots older than epochs). Queue offsets restart at 0 in a new incarnation, so an
offset read from an older one means nothing there: an ``offset.commit`` that carries a
``topic_epoch`` other than the topic's current one is refused as a whole
(``{"refused": "TOPIC_RECREATED", ...}``), and consumers restart from the new queues' minimum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from broker.protocol.routes import PERM_READ, PERM_WRITE, TopicConfig

DEFAULT_PERM = PERM_READ | PERM_WRITE


@dataclasses.dataclass(frozen=True, slots=True)
class GroupConfig:
    group: str
    consume_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_max_times: int = 16

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


OffsetKey = tuple[str, str, int]  # (group, topic, queue_id)
ResetKey = tuple[str, str]  # (group, topic)
REFUSED_OFFSET_RESET = "OFFSET_RESET"
REFUSED_TOPIC_RECREATED = "TOPIC_RECREATED"


class Metadata:
    def __init__(self) -> None:
        self.topics: dict[str, TopicConfig] = {}
        self.groups: dict[str, GroupConfig] = {}
        self.offsets: dict[OffsetKey, int] = {}
        self.reset_generations: dict[ResetKey, int] = {}  # absent: 0 (never reset)
        self.topic_epochs: dict[str, int] = {}  # absent for an existing topic: 0 (created before epochs)
        self.version = 0  # bumped by every applied change (registration data_version source)

    # -- commands -----------------------------------------------------------------------------
    def apply(self, cmd: Mapping[str, Any], position: int = 0) -> dict[str, Any]:
        """Apply one command; ``position`` is its Raft log position (the epoch of a topic it creates)."""
        try:
            op = cmd["op"]
            handler = _HANDLERS.get(op)
            if handler is None:
                return {"error": f"unknown op {str(op)[:40]!r}"}
            created = op == "topic.put" and str(cmd["topic"]) not in self.topics
            result = handler(self, cmd)
            if created:
                self.topic_epochs[str(cmd["topic"])] = int(position)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # decided by the command alone
            return {"error": f"malformed command: {exc!r}"[:200]}
        if "refused" not in result:  # a refused commit changes nothing
            self.version += 1
        return result

    def _topic_put(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        tc = TopicConfig(
            str(cmd["topic"]),
            int(cmd["read_queue_nums"]),
            int(cmd["write_queue_nums"]),
            int(cmd["perm"]),
            bool(cmd.get("order", False)),
        )
        self.topics[tc.topic] = tc
        return {"topic": tc.to_dict()}

    def _topic_delete(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        topic = str(cmd["topic"])
        existed = self.topics.pop(topic, None) is not None
        self.topic_epochs.pop(topic, None)
        for key in [k for k in self.offsets if k[1] == topic]:
            del self.offsets[key]
        return {"deleted": existed}

    def _group_put(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        gc = GroupConfig(
            str(cmd["group"]),
            bool(cmd.get("consume_enable", True)),
            bool(cmd.get("consume_broadcast_enable", True)),
            int(cmd.get("retry_max_times", 16)),
        )
        self.groups[gc.group] = gc
        return {"group": gc.to_dict()}

    def _group_delete(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        group = str(cmd["group"])
        existed = self.groups.pop(group, None) is not None
        for key in [k for k in self.offsets if k[0] == group]:
            del self.offsets[key]
        return {"deleted": existed}

    def _offsets(self, cmd: Mapping[str, Any], *, reset: bool) -> dict[str, Any]:
        group, topic = str(cmd["group"]), str(cmd["topic"])
        updated = 0
        for qid, offset in dict(cmd["offsets"]).items():
            key = (group, topic, int(qid))
            offset = int(offset)
            if offset < 0:
                continue
            if reset or offset > self.offsets.get(key, -1):
                self.offsets[key] = offset
                updated += 1
        return {"updated": updated}

    def _offset_commit(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        group, topic = str(cmd["group"]), str(cmd["topic"])
        current = self.reset_generation(group, topic)
        epoch = cmd.get("topic_epoch")
        if epoch is not None and int(epoch) != self.topic_epoch(topic):
            return {"refused": REFUSED_TOPIC_RECREATED, "topic_epoch": self.topic_epoch(topic)}
        fence = cmd.get("reset_generation")
        if fence is not None and int(fence) < current:
            return {
                "refused": REFUSED_OFFSET_RESET,
                "reset_generation": current,
                "offsets": self.group_offsets(group, topic),
            }
        return {**self._offsets(cmd, reset=False), "reset_generation": current}

    def _offset_reset(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        result = self._offsets(cmd, reset=True)
        key = (str(cmd["group"]), str(cmd["topic"]))
        generation = self.reset_generations.get(key, 0) + 1
        self.reset_generations[key] = generation
        return {**result, "reset_generation": generation}

    # -- queries ------------------------------------------------------------------------------
    def group_offsets(self, group: str, topic: str) -> dict[int, int]:
        return {q: off for (g, t, q), off in self.offsets.items() if g == group and t == topic}

    def reset_generation(self, group: str, topic: str) -> int:
        return self.reset_generations.get((group, topic), 0)

    def topic_epoch(self, topic: str) -> int | None:
        """The epoch of the topic's current incarnation (None: no such topic)."""
        if topic not in self.topics:
            return None
        return self.topic_epochs.get(topic, 0)

    def group_topics(self, group: str) -> list[str]:
        return sorted({t for (g, t, _q) in self.offsets if g == group})

    # -- snapshots ----------------------------------------------------------------------------
    def to_snapshot(self) -> dict[str, Any]:
        return {
            "topics": [tc.to_dict() for tc in self.topics.values()],
            "groups": [gc.to_dict() for gc in self.groups.values()],
            "offsets": [[g, t, q, off] for (g, t, q), off in self.offsets.items()],
            "reset_generations": [[g, t, gen] for (g, t), gen in self.reset_generations.items()],
            "topic_epochs": [[t, e] for t, e in self.topic_epochs.items()],
            "version": self.version,
        }

    @classmethod
    def from_snapshot(cls, snap: Mapping[str, Any]) -> Metadata:
        md = cls()
        for t in snap.get("topics", []):
            md.topics[t["topic"]] = TopicConfig(**t)
        for g in snap.get("groups", []):
            md.groups[g["group"]] = GroupConfig(**g)
        for g, t, q, off in snap.get("offsets", []):
            md.offsets[(g, t, int(q))] = int(off)
        for g, t, gen in snap.get("reset_generations", []):  # absent in snapshots of older brokers
            md.reset_generations[(g, t)] = int(gen)
        for t, e in snap.get("topic_epochs", []):  # absent in snapshots of older brokers
            md.topic_epochs[t] = int(e)
        md.version = int(snap.get("version", 0))
        return md


_HANDLERS = {
    "topic.put": Metadata._topic_put,
    "topic.delete": Metadata._topic_delete,
    "group.put": Metadata._group_put,
    "group.delete": Metadata._group_delete,
    "offset.commit": Metadata._offset_commit,
    "offset.reset": Metadata._offset_reset,
}
