"""Producers a broker replica has seen sending, per producer group (``mqadmin producerConnection``).

RocketMQ brokers learn producers from their heartbeats; here a producer's sends name its group
(``producer_group``) and carry its address, so the broker records (group -> client address -> topics,
sends, last send) from acknowledged sends. An entry expires ``expiry_ms`` after its last send. Bounded:
at most ``GROUPS_MAX`` groups and ``CLIENTS_MAX`` addresses per group (later ones are not recorded),
``TOPICS_MAX`` topics per address. Owned by the serving loop (no locking)."""

from __future__ import annotations

import dataclasses
from typing import Any

GROUPS_MAX = 1024
CLIENTS_MAX = 256
TOPICS_MAX = 64


@dataclasses.dataclass
class _Seen:
    topics: set[str]
    sends: int
    last_ms: int


class ProducerTable:
    def __init__(self, expiry_ms: int):
        self.expiry_ms = expiry_ms
        self._groups: dict[str, dict[str, _Seen]] = {}

    def sent(self, group: str, addr: str, topic: str, now_ms: int) -> None:
        clients = self._groups.get(group)
        if clients is None:
            if len(self._groups) >= GROUPS_MAX:
                self.expire(now_ms)
                if len(self._groups) >= GROUPS_MAX:
                    return
            clients = self._groups.setdefault(group, {})
        seen = clients.get(addr)
        if seen is None:
            if len(clients) >= CLIENTS_MAX:
                return
            seen = clients[addr] = _Seen(set(), 0, now_ms)
        if len(seen.topics) < TOPICS_MAX:
            seen.topics.add(topic)
        seen.sends += 1
        seen.last_ms = now_ms

    def expire(self, now_ms: int) -> None:
        for group in list(self._groups):
            clients = self._groups[group]
            for addr in [a for a, s in clients.items() if now_ms - s.last_ms > self.expiry_ms]:
                del clients[addr]
            if not clients:
                del self._groups[group]

    def connections(self, group: str, now_ms: int) -> list[dict[str, Any]]:
        clients = self._groups.get(group, {})
        return [
            {"client_addr": addr, "topics": sorted(s.topics), "sends": s.sends, "idle_ms": now_ms - s.last_ms}
            for addr, s in sorted(clients.items())
            if now_ms - s.last_ms <= self.expiry_ms
        ]
