"""Consumer group membership, as each broker replica learns it from heartbeats (not replicated).

Clients heartbeat to every replica of every group they consume from, so a new leader already knows
the members. A client silent for ``expiry_ms`` is dropped (a heartbeat may name a longer time for its
client: RocketMQ's clients heartbeat every 30 s and their broker keeps them 120 s; they also leave
when their connection closes). Pure: time is passed in.

A heartbeat may carry each topic's subscription expression (``Subscription``: a TAG expression or
an SQL92 one; RocketMQ's clients send them, and a push consumer's pulls do not repeat them, so the
broker filters by what the group's heartbeats said). ``heartbeat``, ``unregister`` and
``leave`` answer which groups' member lists changed (RocketMQ notifies those groups' members:
NOTIFY_CONSUMER_IDS_CHANGED).

``QueueLocks`` holds the queue locks of orderly consumers (RocketMQ's ``RebalanceLockManager``):
per replica, a lock expires ``LOCK_EXPIRY_MS`` after its holder last renewed it.

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
from collections.abc import Iterable, Mapping
from typing import Final

from broker.protocol.errors import ProtocolError

MAX_CLIENTS = 10_000
MAX_GROUPS_PER_CLIENT = 64
MAX_TOPICS_PER_CLIENT = 1024
MAX_SUBSCRIPTIONS = 200_000
MAX_CLIENTS_PER_OWNER = 1000
MAX_DEPARTED_GROUPS = 10_000
ANYONE = "*"  # the owner when ACL is off
EXPRESSION_CHARS_MAX: Final = 4096
EXPRESSION_TYPES: Final = ("TAG", "SQL92")


@dataclasses.dataclass(frozen=True, slots=True)
class Subscription:
    """What a member consumes of one topic: ``expression_type`` TAG (``*`` or ``a || b``) or SQL92."""

    expression_type: str
    expression: str


SUB_ALL: Final = Subscription("TAG", "*")


@dataclasses.dataclass
class Member:
    client_id: str
    model: str
    topics: tuple[str, ...]
    last_seen_ms: int
    filters: Mapping[str, Subscription] = dataclasses.field(default_factory=dict)  # topic -> expression
    expiry_ms: int | None = None  # None: the manager's

    def expired(self, now_ms: int, default_ms: int) -> bool:
        return now_ms - self.last_seen_ms > (self.expiry_ms or default_ms)


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
        filters: Mapping[str, Mapping[str, Subscription]] | None = None,
        expiry_ms: int | None = None,
    ) -> set[str] | None:
        """Record a heartbeat: it names the client's whole membership (groups it no longer names
        are left at once); ``filters``: per group, per topic, the subscription expressions (absent:
        every message); ``expiry_ms``: how long this client stays without heartbeats (None: the
        manager's). Returns the groups whose member list changed (joined or left), or None
        when the table is full and the client is new; raises a ``ProtocolError`` for a client id
        of another owner or too many subscriptions."""
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
            return None
        if holder is None and owner != ANYONE and self._owned.get(owner, 0) >= MAX_CLIENTS_PER_OWNER:
            raise ProtocolError("TOO_MANY_CLIENTS", f"{owner!r} already holds {MAX_CLIENTS_PER_OWNER} client ids", 429)
        current = sum(len(self._groups[g][client_id].topics) for g in old or ())
        if self.subscriptions - current + topics_total > MAX_SUBSCRIPTIONS:
            raise ProtocolError("TOO_MANY_SUBSCRIPTIONS", f"the broker tracks {MAX_SUBSCRIPTIONS} subscriptions", 429)
        named = {g for g, _m, _t in groups}
        changed = {group for group in (old or set()) - named if self._leave(group, client_id)}
        for group, model, topics in groups:
            self._departed.pop(group, None)
            members = self._groups.setdefault(group, {})
            previous = members.get(client_id)
            if previous is None:
                changed.add(group)
            self.subscriptions += len(topics) - (len(previous.topics) if previous else 0)
            # Interned: thousands of clients naming the same topics share one string each.
            group_filters = dict((filters or {}).get(group) or {})
            members[client_id] = Member(client_id, model, tuple(sys.intern(t) for t in topics), now_ms,
                                        {t: f for t, f in group_filters.items() if t in topics and f != SUB_ALL},
                                        expiry_ms)
        if named:
            self._client_groups[client_id] = named
            if client_id not in self._owner:
                self._owner[client_id] = owner
                self._owned[owner] = self._owned.get(owner, 0) + 1
        else:
            self._client_groups.pop(client_id, None)
            self._forget_owner(client_id)
        return changed

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
        return len(self.leave(client_id, None, owner, admin=admin))

    def leave(self, client_id: str, group: str | None, owner: str = ANYONE, *, admin: bool = False) -> set[str]:
        """The client leaves ``group`` (None: every group); the groups it left."""
        holder = self._owner.get(client_id)
        if holder is not None and holder != owner and not admin:
            raise ProtocolError("CLIENT_ID_TAKEN", f"client id {client_id!r} belongs to another account", 403)
        groups = list(self._client_groups.get(client_id, ())) if group is None else [group]
        return {g for g in groups if self._leave(g, client_id)}

    def expire(self, now_ms: int) -> int:
        stale = [
            (group, cid)
            for group, members in self._groups.items()
            for cid, m in members.items()
            if m.expired(now_ms, self.expiry_ms)
        ]
        return sum(self._leave(group, cid) for group, cid in stale)

    def members(self, group: str, now_ms: int) -> list[Member]:
        self.expire(now_ms)
        return sorted(self._groups.get(group, {}).values(), key=lambda m: m.client_id)

    def subscription(self, group: str, topic: str, now_ms: int) -> Subscription | None:
        """What ``group`` consumes of ``topic`` by its members' heartbeats (the most recent one's,
        as RocketMQ keeps the latest subscription of a group), None when no member subscribes."""
        found: Member | None = None
        for m in self._groups.get(group, {}).values():  # (no expiry sweep: this is on every pull's path)
            if m.expired(now_ms, self.expiry_ms) or topic not in m.topics:
                continue
            if found is None or m.last_seen_ms > found.last_seen_ms:
                found = m
        if found is None:
            return None
        return found.filters.get(topic, SUB_ALL)

    def groups(self) -> list[str]:
        return sorted(self._groups)

    def departed(self, group: str) -> tuple[str, int] | None:
        """(message model, last_seen_ms) of the group's last member, when it has none left."""
        return self._departed.get(group) if group not in self._groups else None

    def client_count(self) -> int:
        return len(self._client_groups)


# -- orderly consumers' queue locks (RocketMQ's RebalanceLockManager) --------------------------------
LOCK_EXPIRY_MS: Final = 60_000  # RocketMQ's rebalance.lockMaxLiveTime
MAX_LOCKS: Final = 100_000
QueueKey = tuple[str, int]  # (topic, queue id)


class QueueLocks:
    """Which client holds each (group, topic, queue) for orderly consumption, on this replica.

    A client locks a set of queues at once and gets back the ones it holds now: those it held
    already (renewed) and those nobody held or whose lock expired (``expiry_ms`` after its last
    renewal). Unlocking releases only locks the client holds. Not replicated, like RocketMQ's: a new
    leader starts empty and its clients lock again (an orderly consumer renews every 20 s and
    before it pulls a queue it does not hold). Bounded: at most ``MAX_LOCKS`` locks; expired ones
    are dropped first when full, and beyond that a new lock is not granted."""

    def __init__(self, expiry_ms: int = LOCK_EXPIRY_MS):
        self.expiry_ms = expiry_ms
        self._locks: dict[str, dict[QueueKey, tuple[str, int]]] = {}  # group -> queue -> (client, last ms)
        self.count = 0

    def lock(self, group: str, client_id: str, queues: Iterable[QueueKey], now_ms: int) -> list[QueueKey]:
        held = self._locks.setdefault(group, {})
        out: list[QueueKey] = []
        for queue in queues:
            current = held.get(queue)
            if current is not None and current[0] != client_id and now_ms - current[1] <= self.expiry_ms:
                continue  # another live holder
            if current is None:
                if self.count >= MAX_LOCKS:
                    self.expire(now_ms)
                    if self.count >= MAX_LOCKS:
                        continue
                self.count += 1
            held[queue] = (client_id, now_ms)
            out.append(queue)
        if not held:
            del self._locks[group]
        return out

    def unlock(self, group: str, client_id: str, queues: Iterable[QueueKey]) -> int:
        held = self._locks.get(group)
        if held is None:
            return 0
        released = 0
        for queue in queues:
            current = held.get(queue)
            if current is not None and current[0] == client_id:
                del held[queue]
                released += 1
        self.count -= released
        if not held:
            del self._locks[group]
        return released

    def holder(self, group: str, queue: QueueKey, now_ms: int) -> str | None:
        current = self._locks.get(group, {}).get(queue)
        if current is None or now_ms - current[1] > self.expiry_ms:
            return None
        return current[0]

    def expire(self, now_ms: int) -> int:
        dropped = 0
        for group in list(self._locks):
            held = self._locks[group]
            for queue in [q for q, (_c, ms) in held.items() if now_ms - ms > self.expiry_ms]:
                del held[queue]
                dropped += 1
            if not held:
                del self._locks[group]
        self.count -= dropped
        return dropped
