"""The NameServer's route table: which broker groups serve a topic, as RocketMQ's RouteInfoManager
keeps it, with DLedger's role/term rules.

Pure: no I/O, no asyncio, no clock. Every method whose behaviour depends on time takes ``now_ms``
(any monotonic millisecond clock). One owner calls it (the server's table task); it is not thread-safe.

Model::

    groups: broker name -> cluster, {broker_id: address}, leader_term, topics of the last leader
    live:   address     -> that broker's last accepted registration and heartbeat time

Role changes of one address (``k`` is the broker's own follower id, >= 1)::

    (new) --FOLLOWER/CANDIDATE k--> id k --LEADER, term >= leader_term--> id 0
                                     ^                                      |
                                     +-- FOLLOWER k (re-registers) ---------+
                                     +-- another address becomes LEADER ----+  (moved to its last
                                         at a term >= leader_term              known k, else dropped)

Invariants (``check_invariants`` asserts them):
1. an address is placed under exactly one (broker name, broker id) at a time; ``live`` and the
   groups' ``addrs`` describe the same placements;
2. broker id 0 is the group's leader. Only a LEADER registration whose term is >= the group's
   ``leader_term`` takes it, so ``leader_term`` never decreases while the group keeps its leader.
   When the leader leaves (unregisters, expires, is removed) ``leader_term`` falls back to the
   highest term a remaining member reported: a term claim is bounded by what the group's own
   members report, so a claim of term 2^63-1 that then leaves cannot lock the real leader out
   (issue 10, finding 1). Who may speak for a group is the server's business (signed requests);
   the table only keeps the numbers honest;
3. per address and group, accepted (term, data_version) pairs never decrease: a registration below
   the recorded pair is a delayed packet, answered but not applied;
4. queue data of a group comes only from its leader's registrations; a group without a leader keeps
   the queue data of its last leader; a group with no address left is dropped with its queue data;
5. at most ``brokers_max`` live addresses, and at most ``topic_entries_max`` (group, topic) pairs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Final

from broker.protocol.errors import ProtocolError
from broker.protocol.limits import QUEUE_NUMS_MAX
from broker.protocol.names import NAME_RULE, TOPIC_RULE, is_name, is_topic
from broker.protocol.routes import (
    HEARTBEAT_TIMEOUT_MS_MAX,
    INT64_MAX,
    LEADER_ID,
    PERM_WRITE,
    ROLES,
    TOPICS_PER_REGISTRATION_MAX,
    BrokerData,
    BrokerRegistration,
    ClusterInfo,
    QueueData,
    RegisterResult,
    Role,
    TopicConfig,
    TopicRouteData,
    UnregisterRequest,
)
from dledger.config import CLUSTER_ID_RE, is_valid_host

HEARTBEAT_TIMEOUT_MS_DEFAULT: Final = 120_000  # RocketMQ's brokerChannelMaxIdleTime
BROKERS_MAX_DEFAULT: Final = 10_000
TOPIC_ENTRIES_MAX_DEFAULT: Final = 1_000_000

_PORT_RE: Final = re.compile(r"[0-9]{1,5}")

STALE_TERM: Final = "STALE_TERM"
STALE_DATA_VERSION: Final = "STALE_DATA_VERSION"


# -- errors --------------------------------------------------------------------------------------
class NamesrvError(ProtocolError):
    """An expected failure of the NameServer. Subclasses say which HTTP status fits."""


class InvalidRecordError(NamesrvError):
    """A field value breaks RocketMQ's rules (bad name, queue count, perm, role, id ...)."""


class NotFoundError(NamesrvError):
    """The topic (or broker) is not in the table."""


class ConflictError(NamesrvError):
    """The request is well formed but contradicts the table (a broker name in another cluster)."""


class TableFullError(NamesrvError):
    """The table already holds ``brokers_max`` live addresses."""


# -- records -------------------------------------------------------------------------------------
# The route records themselves are the wire contract's (broker/protocol/routes.py).


@dataclass(frozen=True, slots=True)
class LiveBroker:
    """What the table knows of one address. ``follower_id`` is the last id >= 1 it registered with
    in this group (where it goes when another broker takes id 0)."""

    address: str
    cluster: str
    broker_name: str
    broker_id: int
    role: Role
    term: int
    data_version: int
    last_update_ms: int
    heartbeat_timeout_ms: int
    follower_id: int | None
    remoting_address: str | None = None


@dataclass(frozen=True, slots=True)
class ExpiredBroker:
    cluster: str
    broker_name: str
    broker_id: int
    address: str
    idle_ms: int
    heartbeat_timeout_ms: int


# -- validation ----------------------------------------------------------------------------------
def validate_topic(topic: object) -> None:
    if not is_topic(topic):
        raise InvalidRecordError("INVALID_TOPIC", f"topic must match {TOPIC_RULE}, got {topic!r:.160}")


def validate_name(value: object, code: str, what: str) -> None:
    if not is_name(value):
        raise InvalidRecordError(code, f"{what} must match {NAME_RULE}, got {value!r:.160}")


def validate_address(address: object) -> None:
    """``host:port``: an IPv4 literal or RFC 1123 host name, and a port in 1..65535."""
    host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not (host and is_valid_host(host) and _PORT_RE.fullmatch(port) and 1 <= int(port) <= 65535):
        raise InvalidRecordError(
            "INVALID_ADDRESS", f"address must be host:port with port 1..65535, got {address!r:.160}"
        )


def _check_int(value: object, low: int, high: int, code: str, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidRecordError(code, f"{what} must be an integer in {low}..{high}, got {value!r:.60}")


def validate_topic_config(tc: TopicConfig) -> None:
    validate_topic(tc.topic)
    _check_int(tc.read_queue_nums, 1, QUEUE_NUMS_MAX, "INVALID_QUEUE_NUMS", "read_queue_nums")
    _check_int(tc.write_queue_nums, 1, QUEUE_NUMS_MAX, "INVALID_QUEUE_NUMS", "write_queue_nums")
    _check_int(tc.perm, 0, 7, "INVALID_PERM", "perm")
    if not isinstance(tc.order, bool):
        raise InvalidRecordError("INVALID_ORDER", f"order must be a boolean, got {tc.order!r:.60}")


def validate_registration(reg: BrokerRegistration) -> None:
    """Every field against RocketMQ's rules; LEADER <=> broker id 0."""
    validate_name(reg.cluster, "INVALID_CLUSTER_NAME", "cluster")
    validate_name(reg.broker_name, "INVALID_BROKER_NAME", "broker_name")
    _check_int(reg.broker_id, 0, INT64_MAX, "INVALID_BROKER_ID", "broker_id")
    validate_address(reg.address)
    if reg.remoting_address is not None:
        validate_address(reg.remoting_address)
    if reg.cluster_id is not None and not (
        isinstance(reg.cluster_id, str) and CLUSTER_ID_RE.fullmatch(reg.cluster_id)
    ):
        raise InvalidRecordError(
            "INVALID_CLUSTER_ID", f"cluster_id must be 1..64 characters of [A-Za-z0-9_-], got {reg.cluster_id!r:.80}"
        )
    if reg.role not in ROLES:
        raise InvalidRecordError(
            "INVALID_ROLE", f"role must be one of {', '.join(ROLES)}, got {reg.role!r:.60}"
        )
    if (reg.role == "LEADER") != (reg.broker_id == LEADER_ID):
        raise InvalidRecordError(
            "ROLE_ID_MISMATCH",
            f"a LEADER registers as broker id 0 and only a LEADER does (role {reg.role}, id {reg.broker_id})",
        )
    _check_int(reg.term, 0, INT64_MAX, "INVALID_TERM", "term")
    _check_int(reg.data_version, 0, INT64_MAX, "INVALID_DATA_VERSION", "data_version")
    if reg.heartbeat_timeout_ms is not None:
        _check_int(
            reg.heartbeat_timeout_ms,
            1,
            HEARTBEAT_TIMEOUT_MS_MAX,
            "INVALID_HEARTBEAT_TIMEOUT",
            "heartbeat_timeout_ms",
        )
    if not isinstance(reg.topics, tuple):
        raise InvalidRecordError("INVALID_TOPICS", f"topics must be a tuple, got {type(reg.topics).__name__}")
    if len(reg.topics) > TOPICS_PER_REGISTRATION_MAX:
        raise InvalidRecordError(
            "TOO_MANY_TOPICS", f"at most {TOPICS_PER_REGISTRATION_MAX} topics per registration"
        )
    seen: set[str] = set()
    for tc in reg.topics:
        validate_topic_config(tc)
        if tc.topic in seen:
            raise InvalidRecordError("DUPLICATE_TOPIC", f"topic {tc.topic!r} is listed twice")
        seen.add(tc.topic)


def validate_unregister(req: UnregisterRequest) -> None:
    validate_name(req.cluster, "INVALID_CLUSTER_NAME", "cluster")
    validate_name(req.broker_name, "INVALID_BROKER_NAME", "broker_name")
    validate_address(req.address)


# -- the table -----------------------------------------------------------------------------------
@dataclass(slots=True)
class _Group:
    cluster: str
    addrs: dict[int, str] = field(default_factory=dict)
    leader_term: int = -1  # term of the last accepted id-0 registration; -1: never had a leader
    topics: dict[str, TopicConfig] = field(default_factory=dict)  # from the last leader registration

    def broker_data(self, name: str, live: dict[str, LiveBroker]) -> BrokerData:
        remoting = {}
        for bid, addr in self.addrs.items():
            lb = live.get(addr)
            if lb is not None and lb.remoting_address is not None:
                remoting[bid] = lb.remoting_address
        return BrokerData(self.cluster, name, dict(sorted(self.addrs.items())), dict(sorted(remoting.items())))


class RouteTable:
    """In-memory routes of every broker group that registered with this NameServer."""

    def __init__(
        self,
        heartbeat_timeout_ms_default: int = HEARTBEAT_TIMEOUT_MS_DEFAULT,
        brokers_max: int = BROKERS_MAX_DEFAULT,
        topic_entries_max: int = TOPIC_ENTRIES_MAX_DEFAULT,
    ):
        assert heartbeat_timeout_ms_default > 0 and brokers_max > 0 and topic_entries_max > 0
        self.heartbeat_timeout_ms_default = heartbeat_timeout_ms_default
        self.brokers_max = brokers_max
        self.topic_entries_max = topic_entries_max
        self._groups: dict[str, _Group] = {}
        self._live: dict[str, LiveBroker] = {}
        self._topic_groups: dict[str, int] = {}  # topic -> how many groups announce it
        self._topic_entries = 0  # sum of len(group.topics)
        # Broker groups whose write permission was wiped (mqadmin wipeWritePerm): their queues are
        # routed read-only until addWritePerm, whatever their registrations announce.
        self._write_wiped: set[str] = set()
        # Cluster name -> the clusterId of its groups (issue 28): the first id registered under a name
        # holds while a group of that cluster is in the table; a broker of another cluster with the
        # same name is refused (CLUSTER_ID_MISMATCH). Memory only, like the rest of the table.
        self._cluster_ids: dict[str, str] = {}

    # -- writes ------------------------------------------------------------------------------
    def register(self, reg: BrokerRegistration, now_ms: int) -> RegisterResult:
        """Apply a registration (or heartbeat). Raises InvalidRecordError, ConflictError,
        TableFullError; a stale registration is answered with ``accepted=False`` and not applied."""
        validate_registration(reg)
        group = self._groups.get(reg.broker_name)
        if group is not None and group.cluster != reg.cluster:
            raise ConflictError(
                "CLUSTER_MISMATCH",
                f"broker name {reg.broker_name} belongs to cluster {group.cluster}, not {reg.cluster}",
            )
        known_id = self._cluster_ids.get(reg.cluster)
        if known_id is not None and reg.cluster_id is not None and reg.cluster_id != known_id:
            raise ConflictError(
                "CLUSTER_ID_MISMATCH",
                f"cluster {reg.cluster} registered here has clusterId {known_id}; broker {reg.broker_name} at "
                f"{reg.address} has {reg.cluster_id}: another cluster with the same name (refused)",
            )
        stale = self._stale_reason(reg, group)
        if stale is not None:
            assert group is not None
            return RegisterResult(False, False, group.addrs.get(LEADER_ID), group.leader_term, (), stale)
        previous = self._live.get(reg.address)
        if previous is None and len(self._live) >= self.brokers_max:
            raise TableFullError("TABLE_FULL", f"the table already holds {self.brokers_max} brokers")
        if reg.broker_id == LEADER_ID:
            held = len(group.topics) if group is not None else 0
            if self._topic_entries - held + len(reg.topics) > self.topic_entries_max:
                raise TableFullError(
                    "TABLE_FULL", f"the table would hold more than {self.topic_entries_max} (group, topic) routes"
                )
        changes: list[str] = []
        group = self._place(reg, previous, changes)
        if reg.broker_id == LEADER_ID:
            group.leader_term = reg.term
            self._take_leader_topics(reg, group, changes)
        self._live[reg.address] = self._live_record(reg, previous, now_ms)
        if reg.cluster_id is not None and known_id is None:
            self._cluster_ids[reg.cluster] = reg.cluster_id
        return RegisterResult(
            True, bool(changes), group.addrs.get(LEADER_ID), group.leader_term, tuple(changes)
        )

    def unregister(self, cluster: str, broker_name: str, address: str) -> bool:
        """Remove the broker at ``address`` if it is registered under that cluster and name."""
        validate_unregister(UnregisterRequest(cluster, broker_name, address))
        live = self._live.get(address)
        if live is None or live.broker_name != broker_name or live.cluster != cluster:
            return False
        self._remove(address)
        return True

    def scan_expired(self, now_ms: int) -> list[ExpiredBroker]:
        """Remove every broker whose last heartbeat is more than its timeout before ``now_ms``."""
        expired: list[ExpiredBroker] = []
        for address, live in list(self._live.items()):
            idle_ms = now_ms - live.last_update_ms
            if idle_ms > live.heartbeat_timeout_ms:
                self._remove(address)
                expired.append(
                    ExpiredBroker(
                        live.cluster,
                        live.broker_name,
                        live.broker_id,
                        address,
                        idle_ms,
                        live.heartbeat_timeout_ms,
                    )
                )
        return expired

    def delete_topic(self, topic: str, cluster: str | None = None) -> bool:
        """Forget ``topic`` in every group (of ``cluster`` only, when given). Brokers own topic
        configs: the next registration of a leader that still has the topic brings it back (delete
        it on the brokers first)."""
        validate_topic(topic)
        found = False
        for group in self._groups.values():
            if cluster is not None and group.cluster != cluster:
                continue
            if group.topics.pop(topic, None) is not None:
                self._count_topics((), (topic,))
                found = True
        return found

    def set_write_perm(self, broker_name: str, writable: bool) -> int:
        """Wipe (``writable=False``) or give back the write permission of a broker group's routes;
        returns how many of its topics are affected. NotFoundError for a group not in the table."""
        validate_name(broker_name, "INVALID_BROKER_NAME", "broker name")
        group = self._groups.get(broker_name)
        if group is None:
            raise NotFoundError("BROKER_NOT_EXIST", f"no broker group {broker_name} is registered here")
        if writable:
            self._write_wiped.discard(broker_name)
        else:
            self._write_wiped.add(broker_name)
        return len(group.topics)

    def write_wiped(self) -> tuple[str, ...]:
        return tuple(sorted(self._write_wiped))

    # -- reads -------------------------------------------------------------------------------
    def topic_route(self, topic: str) -> TopicRouteData | None:
        validate_topic(topic)
        queue_datas: list[QueueData] = []
        broker_datas: list[BrokerData] = []
        order = False
        for name in sorted(self._groups):
            group = self._groups[name]
            tc = group.topics.get(topic)
            if tc is None:
                continue
            perm = tc.perm & ~PERM_WRITE if name in self._write_wiped else tc.perm
            queue_datas.append(QueueData(name, tc.read_queue_nums, tc.write_queue_nums, perm))
            broker_datas.append(group.broker_data(name, self._live))
            order = order or tc.order
        if not queue_datas:
            return None
        return TopicRouteData(topic, tuple(queue_datas), tuple(broker_datas), order)

    def cluster_info(self) -> ClusterInfo:
        clusters: dict[str, list[str]] = {}
        for name in sorted(self._groups):
            clusters.setdefault(self._groups[name].cluster, []).append(name)
        return ClusterInfo(
            {c: tuple(names) for c, names in sorted(clusters.items())},
            {name: self._groups[name].broker_data(name, self._live) for name in sorted(self._groups)},
        )

    def topic_list(self) -> tuple[str, ...]:
        return tuple(sorted(self._topic_groups))

    def topics_of_cluster(self, cluster: str) -> tuple[str, ...]:
        """The topics some group of ``cluster`` serves (RocketMQ's getTopicsByCluster)."""
        topics: set[str] = set()
        for group in self._groups.values():
            if group.cluster == cluster:
                topics.update(group.topics)
        return tuple(sorted(topics))

    def broker_for(self, broker_name: str) -> BrokerData | None:
        group = self._groups.get(broker_name)
        return None if group is None else group.broker_data(broker_name, self._live)

    def leader_term(self, broker_name: str) -> int | None:
        group = self._groups.get(broker_name)
        return None if group is None else group.leader_term

    def live_brokers(self) -> tuple[LiveBroker, ...]:
        return tuple(self._live[a] for a in sorted(self._live))

    def counts(self) -> dict[str, int]:
        return {
            "clusters": len({g.cluster for g in self._groups.values()}),
            "broker_groups": len(self._groups),
            "brokers": len(self._live),
            "topics": len(self._topic_groups),
            "topic_routes": self._topic_entries,
        }

    def check_invariants(self) -> None:
        """Assert invariants 1, 4 and 5 of the module docstring (O(brokers); for tests)."""
        placed = {addr: (name, bid) for name, g in self._groups.items() for bid, addr in g.addrs.items()}
        assert sum(len(g.addrs) for g in self._groups.values()) == len(placed), "address under two ids"
        assert placed == {a: (b.broker_name, b.broker_id) for a, b in self._live.items()}, "live != placed"
        assert all(g.addrs for g in self._groups.values()), "empty group kept"
        assert all(self._live[a].cluster == self._groups[n].cluster for a, (n, _) in placed.items())
        assert len(self._live) <= self.brokers_max
        counted: dict[str, int] = {}
        for g in self._groups.values():
            for t in g.topics:
                counted[t] = counted.get(t, 0) + 1
        assert counted == self._topic_groups, "topic counts drifted"
        assert self._topic_entries == sum(counted.values()) <= self.topic_entries_max

    # -- internals ---------------------------------------------------------------------------
    def _stale_reason(self, reg: BrokerRegistration, group: _Group | None) -> str | None:
        live = self._live.get(reg.address)
        if live is not None and live.broker_name == reg.broker_name:
            if reg.term < live.term:
                return STALE_TERM
            if reg.term == live.term and reg.data_version < live.data_version:
                return STALE_DATA_VERSION
        if reg.broker_id == LEADER_ID and group is not None and reg.term < group.leader_term:
            return STALE_TERM
        return None

    def _place(self, reg: BrokerRegistration, previous: LiveBroker | None, changes: list[str]) -> _Group:
        """Put ``reg.address`` under ``reg.broker_id`` of its group, vacating its old slot and
        displacing whoever held the new one. Returns the (possibly new) group."""
        where = f"{reg.broker_name}/{reg.broker_id}"
        if previous is not None and (previous.broker_name, previous.broker_id) != (
            reg.broker_name,
            reg.broker_id,
        ):
            self._vacate(reg.address, keep_group=reg.broker_name)
            changes.append(f"{reg.address} moved from {previous.broker_name}/{previous.broker_id} to {where}")
        elif previous is None:
            changes.append(f"{reg.address} registered as {where} ({reg.role}, term {reg.term})")
        group = self._groups.setdefault(reg.broker_name, _Group(reg.cluster))
        holder = group.addrs.get(reg.broker_id)
        if holder is not None and holder != reg.address:
            if reg.broker_id == LEADER_ID:
                self._displace_leader(group, holder, changes)
            else:
                self._vacate(holder, keep_group=reg.broker_name)
                self._live.pop(holder)
                changes.append(f"{holder} removed: {reg.address} now claims {where}")
        if reg.broker_id == LEADER_ID and holder != reg.address:
            changes.append(
                f"leader of {reg.broker_name} is {reg.address} at term {reg.term} (was {holder or 'none'})"
            )
        group.addrs[reg.broker_id] = reg.address
        return group

    def _displace_leader(self, group: _Group, old: str, changes: list[str]) -> None:
        """The old leader goes to its last known follower id if that slot is free, else it leaves
        the route until it re-registers with its new role."""
        live = self._live[old]
        del group.addrs[LEADER_ID]
        fid = live.follower_id
        if fid is not None and fid not in group.addrs:
            group.addrs[fid] = old
            self._live[old] = replace(live, broker_id=fid, role="FOLLOWER")
            changes.append(f"old leader {old} moved to {live.broker_name}/{fid}")
        else:
            del self._live[old]
            changes.append(f"old leader {old} removed until it re-registers")

    def _take_leader_topics(self, reg: BrokerRegistration, group: _Group, changes: list[str]) -> None:
        topics = {tc.topic: tc for tc in reg.topics}
        if topics == group.topics:
            return
        added = sorted(topics.keys() - group.topics.keys())
        removed = sorted(group.topics.keys() - topics.keys())
        altered = sorted(t for t in topics.keys() & group.topics.keys() if topics[t] != group.topics[t])
        group.topics = topics
        self._count_topics(added, removed)
        changes.append(f"topics of {reg.broker_name}: +{_few(added)} -{_few(removed)} ~{_few(altered)}")

    def _count_topics(self, added: list[str] | tuple[str, ...], removed: list[str] | tuple[str, ...]) -> None:
        for t in added:
            self._topic_groups[t] = self._topic_groups.get(t, 0) + 1
        for t in removed:
            left = self._topic_groups[t] - 1
            if left:
                self._topic_groups[t] = left
            else:
                del self._topic_groups[t]
        self._topic_entries += len(added) - len(removed)

    def _live_record(self, reg: BrokerRegistration, previous: LiveBroker | None, now_ms: int) -> LiveBroker:
        follower_id = reg.broker_id if reg.broker_id != LEADER_ID else None
        if follower_id is None and previous is not None and previous.broker_name == reg.broker_name:
            follower_id = previous.follower_id
        return LiveBroker(
            address=reg.address,
            cluster=reg.cluster,
            broker_name=reg.broker_name,
            broker_id=reg.broker_id,
            role=reg.role,
            term=reg.term,
            data_version=reg.data_version,
            last_update_ms=now_ms,
            heartbeat_timeout_ms=(
                self.heartbeat_timeout_ms_default
                if reg.heartbeat_timeout_ms is None
                else reg.heartbeat_timeout_ms
            ),
            follower_id=follower_id,
            remoting_address=reg.remoting_address,
        )

    def _vacate(self, address: str, keep_group: str | None = None) -> None:
        """Take ``address`` out of its group's slots (``live`` is left to the caller); drop the
        group if it is now empty, unless it is ``keep_group``."""
        live = self._live[address]
        group = self._groups[live.broker_name]
        assert group.addrs.get(live.broker_id) == address, "live record and group disagree"
        del group.addrs[live.broker_id]
        if live.broker_id == LEADER_ID:
            # The leader left: the group honours no term above what its remaining members report.
            group.leader_term = max(
                (self._live[a].term for a in group.addrs.values() if a in self._live), default=-1
            )
        if not group.addrs and live.broker_name != keep_group:
            self._count_topics((), tuple(group.topics))
            del self._groups[live.broker_name]
            if not any(g.cluster == group.cluster for g in self._groups.values()):
                self._cluster_ids.pop(group.cluster, None)

    def _remove(self, address: str) -> None:
        self._vacate(address)
        del self._live[address]


def _few(names: list[str], shown_max: int = 5) -> str:
    more = f", ... {len(names) - shown_max} more" if len(names) > shown_max else ""
    return "[" + ", ".join(names[:shown_max]) + more + "]"
