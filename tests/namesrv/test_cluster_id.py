"""Issue 28: a NameServer remembers the clusterId first registered under a cluster name and refuses
a broker of another cluster with the same name (CLUSTER_ID_MISMATCH); brokers without an id
(legacy) register as before."""

from __future__ import annotations

import msgpack
import pytest

from broker.protocol import route_wire as wire
from namesrv.route_table import ConflictError, InvalidRecordError, RouteTable
from tests.namesrv.test_server import MSGPACK, N0, N1, N2, Namesrv, ns, reg  # noqa: F401  (ns: fixture)

ID_A, ID_B = "AAAAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBBBB"


def test_a_second_cluster_with_the_same_name_is_refused() -> None:
    table = RouteTable()
    assert table.register(reg(N0, 0, 1, cluster_id=ID_A), 1000).accepted
    with pytest.raises(ConflictError) as err:  # another group, same cluster name, another cluster
        table.register(reg(N2, 0, 1, broker_name="RaftNode01", cluster_id=ID_B), 1000)
    assert err.value.code == "CLUSTER_ID_MISMATCH" and ID_A in str(err.value) and ID_B in str(err.value)
    with pytest.raises(ConflictError):  # nor may it take over a member of the first cluster's group
        table.register(reg(N1, 2, 1, cluster_id=ID_B), 1000)
    assert table.register(reg(N1, 2, 1, cluster_id=ID_A), 1000).accepted  # the right id: fine
    assert table.register(reg(N2, 3, 1), 1000).accepted  # a legacy broker (no id) as before
    assert table.register(reg("127.0.0.1:10914", 0, 1, cluster="Other", broker_name="RaftNode09",
                              cluster_id=ID_B), 1000).accepted  # another cluster name: its own id


def test_the_id_is_forgotten_when_the_cluster_leaves_the_table() -> None:
    table = RouteTable()
    table.register(reg(N0, 0, 1, cluster_id=ID_A), 1000)
    assert table.unregister("DefaultCluster", "RaftNode00", N0)
    assert table.register(reg(N0, 0, 1, cluster_id=ID_B), 1000).accepted  # no group of A is left


def test_a_malformed_cluster_id_is_refused() -> None:
    with pytest.raises(InvalidRecordError) as err:
        RouteTable().register(reg(N0, 0, 1, cluster_id="not an id"), 1000)
    assert err.value.code == "INVALID_CLUSTER_ID"


def test_the_wire_carries_the_id_only_when_set() -> None:
    assert "cluster_id" not in wire.registration_to_dict(reg(N0, 0, 1))  # a previous NameServer refuses unknown fields
    body = wire.registration_to_dict(reg(N0, 0, 1, cluster_id=ID_A))
    assert wire.registration_from_dict(body).cluster_id == ID_A
    assert wire.registration_from_dict(wire.registration_to_dict(reg(N0, 0, 1))).cluster_id is None


async def test_the_namesrv_answers_409_cluster_id_mismatch(ns: Namesrv) -> None:  # noqa: F811
    await ns.register(reg(N0, 0, 1, cluster_id=ID_A))
    body = wire.registration_to_dict(reg(N2, 0, 1, broker_name="RaftNode01", cluster_id=ID_B))
    resp = await ns.client.post("/v1/brokers/register", data=msgpack.packb(body), headers=MSGPACK)
    assert resp.status == 409
    assert (await resp.json())["code"] == "CLUSTER_ID_MISMATCH"
