"""The KV config table (pure) and the route table's additions for the remoting side: bounds, coded errors,
topics by cluster, a deletion limited to one cluster."""

from __future__ import annotations

import pytest

from broker.protocol.routes import BrokerRegistration, TopicConfig
from namesrv.kv_config import NAME_BYTES_MAX, VALUE_BYTES_MAX, KvConfigError, KvConfigTable
from namesrv.route_table import RouteTable


def test_put_get_delete_and_namespaces() -> None:
    kv = KvConfigTable()
    assert kv.put("ORDER_TOPIC_CONFIG", "T", "RaftNode00:4") is True
    assert kv.put("ORDER_TOPIC_CONFIG", "T", "RaftNode00:4") is False  # unchanged
    assert kv.put("ORDER_TOPIC_CONFIG", "T", "RaftNode00:8") is True
    assert kv.get("ORDER_TOPIC_CONFIG", "T") == "RaftNode00:8" and kv.get("NS", "T") is None
    copy = kv.namespace("ORDER_TOPIC_CONFIG")
    assert copy == {"T": "RaftNode00:8"}
    assert copy is not None
    copy["x"] = "y"  # a copy: the table is not changed through it
    assert kv.namespace("ORDER_TOPIC_CONFIG") == {"T": "RaftNode00:8"}
    assert kv.delete("ORDER_TOPIC_CONFIG", "T") is True and kv.delete("ORDER_TOPIC_CONFIG", "T") is False
    assert kv.namespace("ORDER_TOPIC_CONFIG") is None and kv.counts() == {"namespaces": 0, "entries": 0}


def test_bounds_are_coded_errors_that_store_nothing() -> None:
    kv = KvConfigTable(entries_max=3, namespaces_max=2)
    for bad in (("", "k", "v"), ("ns", "", "v"), ("n" * (NAME_BYTES_MAX + 1), "k", "v"),
                ("ns", "é" * (NAME_BYTES_MAX // 2 + 1), "v"), ("ns", "k", "v" * (VALUE_BYTES_MAX + 1))):
        with pytest.raises(KvConfigError) as e:
            kv.put(*bad)
        assert e.value.code == "INVALID_KV"
    kv.put("a", "1", "v")
    kv.put("b", "1", "v")
    with pytest.raises(KvConfigError) as e:
        kv.put("c", "1", "v")  # a third namespace
    assert e.value.code == "TABLE_FULL"
    kv.put("a", "2", "v")
    with pytest.raises(KvConfigError) as e:
        kv.put("a", "3", "v")  # a fourth entry
    assert e.value.code == "TABLE_FULL"
    kv.put("a", "2", "changed")  # replacing an entry needs no room
    assert kv.counts() == {"namespaces": 2, "entries": 3}


def _reg(name: str, cluster: str, address: str, *topics: str) -> BrokerRegistration:
    return BrokerRegistration(cluster, name, 0, address, "LEADER", 1, tuple(TopicConfig(t) for t in topics))


def test_topics_of_cluster_and_delete_in_one_cluster() -> None:
    t = RouteTable()
    t.register(_reg("G1", "C1", "127.0.0.1:10911", "A", "B"), 0)
    t.register(_reg("G2", "C1", "127.0.0.1:10921", "B", "C"), 0)
    t.register(_reg("G3", "C2", "127.0.0.1:10931", "C", "D"), 0)
    assert t.topics_of_cluster("C1") == ("A", "B", "C") and t.topics_of_cluster("C2") == ("C", "D")
    assert t.topics_of_cluster("C3") == ()
    assert t.delete_topic("C", "C2") is True
    route = t.topic_route("C")
    assert route is not None and [q.broker_name for q in route.queue_datas] == ["G2"]
    assert t.delete_topic("D", "C1") is False and t.topic_route("D") is not None
    assert t.delete_topic("B") is True and t.topic_route("B") is None
    t.check_invariants()
