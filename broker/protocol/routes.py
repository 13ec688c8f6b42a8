"""Route records (schema v1): what a broker registers with the NameServers and what clients read back.

One definition for the NameServer (which keeps and serves them), the broker (which registers), the
SDK and the tools (which read routes) and the test doubles. Frozen records; their wire form is in
``broker.protocol.route_wire``. RocketMQ's names: ``TopicRouteData`` with ``QueueData`` per broker
group and ``BrokerData`` (broker id -> address; id 0 is the group's leader).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

WIRE_VERSION: Final = 1
PERM_READ: Final = 4
PERM_WRITE: Final = 2
PERM_INHERIT: Final = 1
LEADER_ID: Final = 0
ROLES: Final = ("LEADER", "FOLLOWER", "CANDIDATE")
Role = Literal["LEADER", "FOLLOWER", "CANDIDATE"]

HEARTBEAT_TIMEOUT_MS_MAX: Final = 86_400_000
TOPICS_PER_REGISTRATION_MAX: Final = 100_000
INT64_MAX: Final = 2**63 - 1


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic as its broker group's leader configures it (RocketMQ defaults: 4/4 queues, RW)."""

    topic: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_READ | PERM_WRITE
    order: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """One broker's registration/heartbeat. ``data_version`` is monotonic per broker process
    (start time ms * 1000 + counter); ``heartbeat_timeout_ms`` None means the NameServer default."""

    cluster: str
    broker_name: str
    broker_id: int
    address: str
    role: Role
    term: int
    topics: tuple[TopicConfig, ...] = ()
    data_version: int = 0
    heartbeat_timeout_ms: int | None = None
    version: int = WIRE_VERSION
    remoting_address: str | None = None  # the broker's binary-protocol address (broker/edge/binary.py)
    cluster_id: str | None = None  # the broker's clusterId (issue 28); None: a legacy broker without one


@dataclass(frozen=True, slots=True)
class UnregisterRequest:
    cluster: str
    broker_name: str
    address: str
    version: int = WIRE_VERSION


@dataclass(frozen=True, slots=True)
class RegisterResult:
    """``changed``: the routes clients see changed. ``ignored_reason`` is set (and nothing was
    applied) for a stale registration. ``changes`` are one human-readable line per change."""

    accepted: bool
    changed: bool
    leader_address: str | None
    leader_term: int
    changes: tuple[str, ...] = ()
    ignored_reason: str | None = None
    version: int = WIRE_VERSION


@dataclass(frozen=True, slots=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int


@dataclass(frozen=True, slots=True)
class BrokerData:
    """``broker_addrs`` maps broker id -> address; id 0 is the leader when there is one. Read-only."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(hash=False)
    # broker id -> binary-protocol address, for the brokers that registered one (broker/edge/binary.py)
    remoting_addrs: dict[int, str] = field(default_factory=dict, hash=False)

    @property
    def leader_addr(self) -> str | None:
        return self.broker_addrs.get(LEADER_ID)

    def any_addr(self) -> str | None:
        """The leader's address, else the lowest broker id's, else None."""
        if LEADER_ID in self.broker_addrs:
            return self.broker_addrs[LEADER_ID]
        return self.broker_addrs[min(self.broker_addrs)] if self.broker_addrs else None

    def addrs_leader_first(self) -> list[str]:
        """Every replica's address by broker id: the leader (id 0) first when there is one."""
        return [self.broker_addrs[i] for i in sorted(self.broker_addrs)]


@dataclass(frozen=True, slots=True)
class TopicRouteData:
    topic: str
    queue_datas: tuple[QueueData, ...]  # sorted by broker_name
    broker_datas: tuple[BrokerData, ...]  # sorted by broker_name
    order: bool = False  # any group's leader configures the topic as ordered
    version: int = WIRE_VERSION

    def broker(self, broker_name: str) -> BrokerData | None:
        return next((b for b in self.broker_datas if b.broker_name == broker_name), None)


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    clusters: dict[str, tuple[str, ...]] = field(hash=False)  # cluster -> sorted broker names
    brokers: dict[str, BrokerData] = field(hash=False)  # broker name -> its addresses
    version: int = WIRE_VERSION
