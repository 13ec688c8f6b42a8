"""Consumer group membership, as each broker replica learns it from heartbeats (not replicated).

Clients heartbeat to every replica of every group they consume from, so a new leader already knows
the members. A client silent for ``expiry_ms`` is dropped. Pure: time is passed in.

Bounded (issue 10, finding 6): at most ``MAX_CLIENTS`` client ids, ``MAX_GROUPS_PER_CLIENT`` groups
and ``MAX_TOPICS_PER_CLIENT`` topics per client (all groups together), ``MAX_SUBSCRIPTIONS`` (client,
group, topic) entries in all, and, with ACL on, ``MAX_CLIENTS_PER_OWNER`` client ids per access key.
A client id belongs to the access key that first heartbeated it (``owner``): another account can
neither take it over nor unregister it (an admin can).

A group whose last member left (unregistered or expired) is remembered with its message model
(``departed``: at most ``MAX_DEPARTED_GROUPS``, the oldest forgotten first; lost on restart), so that
``mqadmin consumerProgress`` can tell a broadcasting group whose consumers are offline — the brokers
hold no offsets of it — from a group that never existed.
"""

from __future__ import annotations

import collections
import dataclasses
import sys

from broker.protocol.errors import ProtocolError

MAX_CLIENTS = 10_000
MAX_GROUPS_PER_CLIENT = 64
MAX_TOPICS_PER_CLIENT = 1024
MAX_SUBSCRIPTIONS = 200_000
MAX_CLIENTS_PER_OWNER = 1000
MAX_DEPARTED_GROUPS = 10_000
ANYONE = "*"  # the owner when ACL is off


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
        self._owner: dict[str, str] = {}  # client id -> access key that registered it
        self._owned: dict[str, int] = {}  # access key -> client ids it holds
        self.subscriptions = 0  # sum of len(member.topics) over every membership
        # group -> (message model, last_seen_ms) of its last member, once none is left
        self._departed: collections.OrderedDict[str, tuple[str, int]] = collections.OrderedDict()

    def heartbeat(
        self,
        client_id: str,
        groups: list[tuple[str, str, tuple[str, ...]]],
        now_ms: int,
        owner: str = ANYONE,
        *,
        admin: bool = False,
    ) -> bool:
        """Record a heartbeat: it names the client's whole membership (groups it no longer names
        are left at once). Returns False when the table is full and the client is new; raises
        a ``ProtocolError`` for a client id of another owner or too many subscriptions."""
        if len(groups) > MAX_GROUPS_PER_CLIENT:
            raise ValueError(f"a client may be in at most {MAX_GROUPS_PER_CLIENT} groups")
        topics_total = sum(len(t) for _g, _m, t in groups)
        if topics_total > MAX_TOPICS_PER_CLIENT:
            raise ProtocolError(
                "TOO_MANY_SUBSCRIPTIONS", f"a client subscribes to at most {MAX_TOPICS_PER_CLIENT} topics", 400
            )
        holder = self._owner.get(client_id)
        if holder is not None and holder != owner and not admin:
            raise ProtocolError("CLIENT_ID_TAKEN", f"client id {client_id!r} belongs to another account", 403)
        old = self._client_groups.get(client_id)
        if old is None and len(self._client_groups) >= MAX_CLIENTS:
            return False
        if holder is None and owner != ANYONE and self._owned.get(owner, 0) >= MAX_CLIENTS_PER_OWNER:
            raise ProtocolError("TOO_MANY_CLIENTS", f"{owner!r} already holds {MAX_CLIENTS_PER_OWNER} client ids", 429)
        current = sum(len(self._groups[g][client_id].topics) for g in old or ())
        if self.subscriptions - current + topics_total > MAX_SUBSCRIPTIONS:
            raise ProtocolError("TOO_MANY_SUBSCRIPTIONS", f"the broker tracks {MAX_SUBSCRIPTIONS} subscriptions", 429)
        named = {g for g, _m, _t in groups}
        for group in (old or set()) - named:
            self._leave(group, client_id)
        for group, model, topics in groups:
            self._departed.pop(group, None)
            members = self._groups.setdefault(group, {})
            previous = members.get(client_id)
            self.subscriptions += len(topics) - (len(previous.topics) if previous else 0)
            # Interned: thousands of clients naming the same topics share one string each.
            members[client_id] = Member(client_id, model, tuple(sys.intern(t) for t in topics), now_ms)
        if named:
            self._client_groups[client_id] = named
            if client_id not in self._owner:
                self._owner[client_id] = owner
                self._owned[owner] = self._owned.get(owner, 0) + 1
        else:
            self._client_groups.pop(client_id, None)
            self._forget_owner(client_id)
        return True

    def owner_of(self, client_id: str) -> str | None:
        return self._owner.get(client_id)

    def _forget_owner(self, client_id: str) -> None:
        owner = self._owner.pop(client_id, None)
        if owner is not None:
            left = self._owned[owner] - 1
            if left:
                self._owned[owner] = left
            else:
                del self._owned[owner]

    def _leave(self, group: str, client_id: str) -> bool:
        members = self._groups.get(group)
        member = members.pop(client_id, None) if members is not None else None
        if members is None or member is None:
            return False
        self.subscriptions -= len(member.topics)
        if not members:
            del self._groups[group]
            self._departed[group] = (member.model, member.last_seen_ms)
            if len(self._departed) > MAX_DEPARTED_GROUPS:
                self._departed.popitem(last=False)
        groups = self._client_groups.get(client_id)
        if groups is not None:
            groups.discard(group)
            if not groups:
                del self._client_groups[client_id]
                self._forget_owner(client_id)
        return True

    def unregister(self, client_id: str, owner: str = ANYONE, *, admin: bool = False) -> int:
        holder = self._owner.get(client_id)
        if holder is not None and holder != owner and not admin:
            raise ProtocolError("CLIENT_ID_TAKEN", f"client id {client_id!r} belongs to another account", 403)
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

    def departed(self, group: str) -> tuple[str, int] | None:
        """(message model, last_seen_ms) of the group's last member, when it has none left."""
        return self._departed.get(group) if group not in self._groups else None

    def client_count(self) -> int:
        return len(self._client_groups)
