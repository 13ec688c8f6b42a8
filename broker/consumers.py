"""Consumer group membership, as each broker replica learns it from heartbeats (not replicated).

Clients heartbeat to every replica of every group they consume from, so a new leader already knows
the members. A client silent for ``expiry_ms`` is dropped. Pure: time is passed in.
"""

from __future__ import annotations

import dataclasses

MAX_CLIENTS = 10_000
MAX_GROUPS_PER_CLIENT = 64


@dataclasses.dataclass
class Member:
    client_id: str
    model: str
    topics: tuple[str, ...]
    last_seen_ms: int


class ConsumerManager:
    def __init__(self, expiry_ms: int = 40_000):
        self.expiry_ms = expiry_ms
        self._groups: dict[str, dict[str, Member]] = {}

    def heartbeat(self, client_id: str, groups: list[tuple[str, str, tuple[str, ...]]], now_ms: int) -> bool:
        """Record a heartbeat; returns False when the table is full and the client is new."""
        known = any(client_id in members for members in self._groups.values())
        if not known and self.client_count() >= MAX_CLIENTS:
            return False
        for group, model, topics in groups:
            self._groups.setdefault(group, {})[client_id] = Member(client_id, model, topics, now_ms)
        return True

    def unregister(self, client_id: str) -> int:
        removed = 0
        for group in list(self._groups):
            if self._groups[group].pop(client_id, None) is not None:
                removed += 1
            if not self._groups[group]:
                del self._groups[group]
        return removed

    def expire(self, now_ms: int) -> int:
        removed = 0
        for group in list(self._groups):
            members = self._groups[group]
            for cid in [c for c, m in members.items() if now_ms - m.last_seen_ms > self.expiry_ms]:
                del members[cid]
                removed += 1
            if not members:
                del self._groups[group]
        return removed

    def members(self, group: str, now_ms: int) -> list[Member]:
        self.expire(now_ms)
        return sorted(self._groups.get(group, {}).values(), key=lambda m: m.client_id)

    def groups(self) -> list[str]:
        return sorted(self._groups)

    def client_count(self) -> int:
        return len({cid for members in self._groups.values() for cid in members})
