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
        self._client_groups: dict[str, set[str]] = {}

    def heartbeat(self, client_id: str, groups: list[tuple[str, str, tuple[str, ...]]], now_ms: int) -> bool:
        """Record a heartbeat: it names the client's whole membership (groups it no longer names
        are left at once). Returns False when the table is full and the client is new."""
        if len(groups) > MAX_GROUPS_PER_CLIENT:
            raise ValueError(f"a client may be in at most {MAX_GROUPS_PER_CLIENT} groups")
        old = self._client_groups.get(client_id)
        if old is None and len(self._client_groups) >= MAX_CLIENTS:
            return False
        named = {g for g, _m, _t in groups}
        for group in (old or set()) - named:
            self._leave(group, client_id)
        for group, model, topics in groups:
            self._groups.setdefault(group, {})[client_id] = Member(client_id, model, topics, now_ms)
        if named:
            self._client_groups[client_id] = named
        else:
            self._client_groups.pop(client_id, None)
        return True

    def _leave(self, group: str, client_id: str) -> bool:
        members = self._groups.get(group)
        if members is None or members.pop(client_id, None) is None:
            return False
        if not members:
            del self._groups[group]
        groups = self._client_groups.get(client_id)
        if groups is not None:
            groups.discard(group)
            if not groups:
                del self._client_groups[client_id]
        return True

    def unregister(self, client_id: str) -> int:
        return sum(self._leave(g, client_id) for g in list(self._client_groups.get(client_id, ())))

    def expire(self, now_ms: int) -> int:
        stale = [
            (group, cid)
            for group, members in self._groups.items()
            for cid, m in members.items()
            if now_ms - m.last_seen_ms > self.expiry_ms
        ]
        return sum(self._leave(group, cid) for group, cid in stale)

    def members(self, group: str, now_ms: int) -> list[Member]:
        self.expire(now_ms)
        return sorted(self._groups.get(group, {}).values(), key=lambda m: m.client_id)

    def groups(self) -> list[str]:
        return sorted(self._groups)

    def client_count(self) -> int:
        return len(self._client_groups)
