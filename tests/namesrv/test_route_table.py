"""RouteTable: RocketMQ's route rules with DLedger roles and terms, driven by an explicit clock.

Each scenario reads as a transcript: who registered with which role at which term, and what a
client asking for the route sees. ``check_invariants`` runs after every step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from broker.protocol.routes import BrokerRegistration, QueueData, RegisterResult, Role, TopicConfig
from namesrv.route_table import (
    STALE_DATA_VERSION,
    STALE_TERM,
    ConflictError,
    InvalidRecordError,
    RouteTable,
    TableFullError,
    validate_address,
)

N0, N1, N2 = "127.0.0.1:10911", "127.0.0.1:10912", "127.0.0.1:10913"
T0 = 1_000_000  # the clock's start; any monotonic ms value works
TOPICS = (TopicConfig("TopicA", 8, 8), TopicConfig("TopicB"))


def reg(
    address: str,
    broker_id: int,
    role: Role,
    term: int,
    *,
    name: str = "RaftNode00",
    cluster: str = "DefaultCluster",
    topics: tuple[TopicConfig, ...] = TOPICS,
    data_version: int = 1,
    heartbeat_timeout_ms: int | None = None,
) -> BrokerRegistration:
    return BrokerRegistration(
        cluster, name, broker_id, address, role, term, topics, data_version, heartbeat_timeout_ms
    )


class Table:
    """A RouteTable with its own clock and an invariant check after every write."""

    def __init__(self, **kwargs: Any):
        self.t = RouteTable(**kwargs)
        self.now_ms = T0

    def register(self, r: BrokerRegistration) -> RegisterResult:
        result = self.t.register(r, self.now_ms)
        self.t.check_invariants()
        return result

    def addrs(self, topic: str = "TopicA", group: str = "RaftNode00") -> dict[int, str]:
        route = self.t.topic_route(topic)
        assert route is not None, f"no route for {topic}"
        return next(b.broker_addrs for b in route.broker_datas if b.broker_name == group)


@pytest.fixture
def table() -> Table:
    return Table()


def group_of_three(table: Table, term: int = 1) -> None:
    """n0 leads at ``term``; n1 and n2 follow with their own ids (DLedger: index + 1)."""
    table.register(reg(N0, 0, "LEADER", term))
    table.register(reg(N1, 2, "FOLLOWER", term))
    table.register(reg(N2, 3, "FOLLOWER", term))


# -- registration and roles ----------------------------------------------------------------------
def test_leader_and_two_followers_route_shows_leader_as_id_0(table: Table) -> None:
    first = table.register(reg(N0, 0, "LEADER", 1))
    assert first.accepted and first.changed and first.leader_address == N0
    table.register(reg(N1, 2, "FOLLOWER", 1))
    table.register(reg(N2, 3, "FOLLOWER", 1))
    route = table.t.topic_route("TopicA")
    assert route is not None
    assert route.queue_datas == (QueueData("RaftNode00", 8, 8, 6),)
    assert [b.broker_addrs for b in route.broker_datas] == [{0: N0, 2: N1, 3: N2}]
    assert route.broker_datas[0].cluster == "DefaultCluster"


def test_a_heartbeat_without_changes_reports_unchanged(table: Table) -> None:
    group_of_three(table)
    table.now_ms += 30_000
    again = table.register(reg(N1, 2, "FOLLOWER", 1))
    assert again.accepted and not again.changed and again.changes == ()


def test_leader_change_at_higher_term_replaces_id_0(table: Table) -> None:
    group_of_three(table)
    # n1 wins term 2: it leaves id 2 for id 0; n0 never registered as a follower, so it leaves
    # the route until it re-registers with its new role.
    result = table.register(reg(N1, 0, "LEADER", 2))
    assert result.changed and result.leader_address == N1 and result.leader_term == 2
    assert table.addrs() == {0: N1, 3: N2}
    # n0 learns of term 2 and re-registers as follower with its own id.
    table.register(reg(N0, 1, "FOLLOWER", 2))
    assert table.addrs() == {0: N1, 1: N0, 3: N2}
    # n0 leads again at term 3: n1 goes straight back to its remembered follower id 2.
    result = table.register(reg(N0, 0, "LEADER", 3))
    assert any("moved to RaftNode00/2" in c for c in result.changes)
    assert table.addrs() == {0: N0, 2: N1, 3: N2}
    assert table.t.leader_term("RaftNode00") == 3


def test_stale_lower_term_leader_registration_is_ignored(table: Table) -> None:
    group_of_three(table)
    table.register(reg(N1, 0, "LEADER", 2))
    # n0, partitioned, still believes it leads at term 1 and heartbeats.
    stale = table.register(reg(N0, 0, "LEADER", 1, data_version=99))
    assert not stale.accepted and not stale.changed
    assert stale.ignored_reason == STALE_TERM and stale.leader_address == N1 and stale.leader_term == 2
    assert table.addrs()[0] == N1
    assert table.t.leader_term("RaftNode00") == 2


def test_delayed_registration_of_the_same_broker_is_ignored(table: Table) -> None:
    table.register(reg(N0, 0, "LEADER", 2, data_version=5))
    # a follower heartbeat sent before n0 won term 2 arrives late
    assert table.register(reg(N0, 1, "FOLLOWER", 1)).ignored_reason == STALE_TERM
    # same term, older data_version: an out-of-order heartbeat with an old topic list
    late = table.register(reg(N0, 0, "LEADER", 2, data_version=4, topics=()))
    assert late.ignored_reason == STALE_DATA_VERSION
    assert table.addrs() == {0: N0}


def test_leader_stepping_down_leaves_no_id_0_but_keeps_queue_data(table: Table) -> None:
    group_of_three(table)
    result = table.register(reg(N0, 1, "FOLLOWER", 2))
    assert result.changed and result.leader_address is None
    assert table.addrs() == {1: N0, 2: N1, 3: N2}  # exactly one id per address
    route = table.t.topic_route("TopicA")
    assert route is not None and route.queue_datas == (QueueData("RaftNode00", 8, 8, 6),)


def test_same_address_never_under_two_ids_and_id_claims(table: Table) -> None:
    group_of_three(table)
    table.register(reg(N2, 2, "CANDIDATE", 2))  # n2 claims id 2, held by n1: last claim wins
    assert table.addrs() == {0: N0, 2: N2}
    assert [b.address for b in table.t.live_brokers()] == [N0, N2]


def test_queue_data_comes_from_the_leader_only(table: Table) -> None:
    table.register(reg(N0, 0, "LEADER", 1, topics=(TopicConfig("TopicA", 2, 2, 4),)))
    table.register(reg(N1, 2, "FOLLOWER", 1, topics=(TopicConfig("TopicA", 16, 16), TopicConfig("Other"))))
    route = table.t.topic_route("TopicA")
    assert route is not None and route.queue_datas == (QueueData("RaftNode00", 2, 2, 4),)
    assert table.t.topic_route("Other") is None
    # the leader's next registration (new data_version) carries an updated config
    changed = table.register(
        reg(N0, 0, "LEADER", 1, topics=(TopicConfig("TopicA", 4, 4, 6),), data_version=2)
    )
    assert changed.changed and "~[TopicA]" in changed.changes[0]
    route = table.t.topic_route("TopicA")
    assert route is not None and route.queue_datas == (QueueData("RaftNode00", 4, 4, 6),)


def test_groups_of_one_cluster_spread_a_topic(table: Table) -> None:
    table.register(reg(N0, 0, "LEADER", 1, name="RaftNode01", topics=(TopicConfig("Shared", 4, 4),)))
    table.register(
        reg(N1, 0, "LEADER", 7, name="RaftNode00", topics=(TopicConfig("Shared", 2, 2), TopicConfig("Own")))
    )
    table.register(reg(N2, 1, "FOLLOWER", 7, name="RaftNode00"))
    route = table.t.topic_route("Shared")
    assert route is not None
    assert [q.broker_name for q in route.queue_datas] == ["RaftNode00", "RaftNode01"]
    assert [q.write_queue_nums for q in route.queue_datas] == [2, 4]
    assert [b.broker_addrs for b in route.broker_datas] == [{0: N1, 1: N2}, {0: N0}]
    own = table.t.topic_route("Own")
    assert own is not None and [b.broker_name for b in own.broker_datas] == ["RaftNode00"]
    info = table.t.cluster_info()
    assert info.clusters == {"DefaultCluster": ("RaftNode00", "RaftNode01")}
    assert info.brokers["RaftNode00"].broker_addrs == {0: N1, 1: N2}
    assert table.t.topic_list() == ("Own", "Shared")
    bd = table.t.broker_for("RaftNode01")
    assert bd is not None and bd.broker_addrs == {0: N0}
    assert table.t.broker_for("Nope") is None


def test_a_broker_name_belongs_to_one_cluster(table: Table) -> None:
    table.register(reg(N0, 0, "LEADER", 1))
    with pytest.raises(ConflictError) as err:
        table.register(reg(N1, 1, "FOLLOWER", 1, cluster="OtherCluster"))
    assert err.value.code == "CLUSTER_MISMATCH"


def test_an_address_moving_to_another_group_leaves_the_old_one(table: Table) -> None:
    table.register(reg(N0, 0, "LEADER", 1, name="Old", topics=(TopicConfig("OldTopic"),)))
    table.register(reg(N0, 0, "LEADER", 1, name="New"))
    assert table.t.broker_for("Old") is None and table.t.topic_route("OldTopic") is None
    assert table.addrs(group="New") == {0: N0}


def test_table_is_bounded() -> None:
    table = Table(brokers_max=2)
    table.register(reg(N0, 0, "LEADER", 1))
    table.register(reg(N1, 1, "FOLLOWER", 1))
    with pytest.raises(TableFullError):
        table.register(reg(N2, 2, "FOLLOWER", 1))
    assert table.register(reg(N1, 1, "FOLLOWER", 1)).accepted  # known addresses still heartbeat


# -- expiry, unregister, delete ------------------------------------------------------------------
def test_expiry_after_timeout_removes_the_broker_and_its_id_0_entry(table: Table) -> None:
    group_of_three(table)
    table.now_ms += 60_000
    table.register(reg(N1, 2, "FOLLOWER", 1))
    table.register(reg(N2, 3, "FOLLOWER", 1))
    table.now_ms = T0 + 120_000
    assert table.t.scan_expired(table.now_ms) == []  # exactly at the timeout: not yet
    table.now_ms += 1
    (expired,) = table.t.scan_expired(table.now_ms)
    table.t.check_invariants()
    assert (expired.address, expired.broker_id, expired.idle_ms) == (N0, 0, 120_001)
    assert table.addrs() == {2: N1, 3: N2}  # no writable broker; queue data of the last leader kept
    # the followers expire too: the group and its topics disappear
    table.now_ms += 60_000
    assert {e.address for e in table.t.scan_expired(table.now_ms)} == {N1, N2}
    assert table.t.topic_route("TopicA") is None and table.t.cluster_info().brokers == {}


def test_expiry_honours_the_registrations_own_timeout() -> None:
    table = Table(heartbeat_timeout_ms_default=120_000)
    table.register(reg(N0, 0, "LEADER", 1, heartbeat_timeout_ms=5_000))
    table.register(reg(N1, 1, "FOLLOWER", 1))
    table.now_ms += 5_001
    assert [e.address for e in table.t.scan_expired(table.now_ms)] == [N0]


def test_unregister(table: Table) -> None:
    group_of_three(table)
    assert not table.t.unregister("OtherCluster", "RaftNode00", N0)
    assert not table.t.unregister("DefaultCluster", "RaftNode01", N0)
    assert table.t.unregister("DefaultCluster", "RaftNode00", N0)
    table.t.check_invariants()
    assert table.addrs() == {2: N1, 3: N2}
    assert not table.t.unregister("DefaultCluster", "RaftNode00", N0)  # idempotent
    with pytest.raises(InvalidRecordError):
        table.t.unregister("DefaultCluster", "RaftNode00", "no-port")


def test_delete_topic_until_the_leader_announces_it_again(table: Table) -> None:
    group_of_three(table)
    assert table.t.delete_topic("TopicA")
    assert table.t.topic_route("TopicA") is None and table.t.topic_list() == ("TopicB",)
    assert not table.t.delete_topic("TopicA")
    table.register(reg(N1, 2, "FOLLOWER", 1))  # followers do not bring it back
    assert table.t.topic_route("TopicA") is None
    back = table.register(reg(N0, 0, "LEADER", 1, data_version=2))  # the leader still has it
    assert back.changed and table.t.topic_route("TopicA") is not None


# -- validation ----------------------------------------------------------------------------------
GOOD = reg(N0, 0, "LEADER", 1)


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"cluster": ""}, "INVALID_CLUSTER_NAME"),
        ({"cluster": "a b"}, "INVALID_CLUSTER_NAME"),
        ({"cluster": "%RETRY%x"}, "INVALID_CLUSTER_NAME"),
        ({"cluster": "c" * 128}, "INVALID_CLUSTER_NAME"),
        ({"broker_name": "Raft.Node"}, "INVALID_BROKER_NAME"),
        ({"broker_name": 7}, "INVALID_BROKER_NAME"),
        ({"broker_id": -1, "role": "FOLLOWER"}, "INVALID_BROKER_ID"),
        ({"broker_id": True}, "INVALID_BROKER_ID"),
        ({"address": "127.0.0.1"}, "INVALID_ADDRESS"),
        ({"address": "127.0.0.1:0"}, "INVALID_ADDRESS"),
        ({"address": "127.0.0.1:65536"}, "INVALID_ADDRESS"),
        ({"address": "127.0.0.1:+80"}, "INVALID_ADDRESS"),
        ({"address": "bad_host:80"}, "INVALID_ADDRESS"),
        ({"address": "300.1.1.1:80"}, "INVALID_ADDRESS"),
        ({"role": "MASTER"}, "INVALID_ROLE"),
        ({"role": "FOLLOWER"}, "ROLE_ID_MISMATCH"),
        ({"broker_id": 1}, "ROLE_ID_MISMATCH"),
        ({"term": -1}, "INVALID_TERM"),
        ({"term": 2**63}, "INVALID_TERM"),
        ({"data_version": -5}, "INVALID_DATA_VERSION"),
        ({"heartbeat_timeout_ms": 0}, "INVALID_HEARTBEAT_TIMEOUT"),
        ({"topics": (TopicConfig("bad topic"),)}, "INVALID_TOPIC"),
        ({"topics": (TopicConfig("t" * 128),)}, "INVALID_TOPIC"),
        ({"topics": (TopicConfig("T", read_queue_nums=0),)}, "INVALID_QUEUE_NUMS"),
        ({"topics": (TopicConfig("T", write_queue_nums=1025),)}, "INVALID_QUEUE_NUMS"),
        ({"topics": (TopicConfig("T", perm=8),)}, "INVALID_PERM"),
        ({"topics": (TopicConfig("T", perm=-1),)}, "INVALID_PERM"),
        ({"topics": (TopicConfig("T", order=1),)}, "INVALID_ORDER"),  # type: ignore[arg-type]
        ({"topics": (TopicConfig("T"), TopicConfig("T"))}, "DUPLICATE_TOPIC"),
    ],
)
def test_invalid_registration_fields(table: Table, change: dict[str, Any], code: str) -> None:
    with pytest.raises(InvalidRecordError) as err:
        table.register(replace(GOOD, **change))
    assert err.value.code == code, err.value.message
    assert table.t.counts()["brokers"] == 0  # nothing applied


@pytest.mark.parametrize("topic", ["%RETRY%group-1", "%DLQ%g", "a|b", "T_1-x", "x" * 127])
def test_rocketmq_topic_names_are_valid(table: Table, topic: str) -> None:
    table.register(replace(GOOD, topics=(TopicConfig(topic),)))
    assert table.t.topic_list() == (topic,)


@pytest.mark.parametrize("address", ["localhost:9876", "broker-1.example.com:10911", "10.0.0.1:1"])
def test_valid_addresses(address: str) -> None:
    validate_address(address)


def test_queries_validate_topic_names(table: Table) -> None:
    for query in (table.t.topic_route, table.t.delete_topic):
        with pytest.raises(InvalidRecordError) as err:
            query("no spaces")
        assert err.value.code == "INVALID_TOPIC"
