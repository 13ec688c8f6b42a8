"""The cluster id (issue 28, evidence 2): two clusters with the same group name and peer password
must not mix. Replicas of different ids refuse each other's handshakes; a data directory recorded
for one id refuses to start under another; a replica without an id (legacy, or a previous release
that knows only the DLH1 handshake) still joins replicas that carry one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dledger import peer_tcp
from dledger.apps import node_server
from dledger.cluster_id import (
    FILE_NAME,
    ClusterIdMismatch,
    check_cluster_id,
    new_cluster_id,
    recorded_cluster_id,
)
from dledger.config import ConfigError, parse_dledger_config
from dledger.node import DLedgerNode
from tests.dledger.harness import InProcCluster, settings_for, wait_until

ID_A, ID_B = "AAAAAAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBBBBBB"


def _counter(node: Any, name: str) -> int:
    return int(node._sync.dl_transport.counters[name])


async def _all_linked(cluster: InProcCluster) -> None:
    async def linked() -> bool:
        for n in cluster.nodes.values():
            st = await n.status()
            if not all(p["connected"] for p in st["peers"].values()):
                return False
        return True

    for _ in range(200):  # each round waits on the leader's append: no sleep
        if await linked():
            return
        await (await cluster.leader()).append([b"tick"])
    raise AssertionError("the replicas never all linked up")


async def test_replicas_of_another_cluster_with_the_same_group_and_password_are_refused(tmp_path: Path) -> None:
    """n2 belongs to cluster B, n0 and n1 to A: same group name, same password, same peer list
    (B's replica answers on the port A expects). Before issue 28 all three formed one group."""
    cluster = InProcCluster(str(tmp_path))
    cluster.per_node = {"n0": {"cluster_id": ID_A}, "n1": {"cluster_id": ID_A}, "n2": {"cluster_id": ID_B}}
    await cluster.start()
    try:
        def two_agree() -> Any:
            leaders = [n for n in cluster.nodes.values() if n.role == "LEADER"]
            return leaders[0] if len(leaders) == 1 and leaders[0].settings.self_id != "n2" else None

        leader = await wait_until(two_agree, 10, "a leader of cluster A")
        await leader.append([b"cluster A's data"])
        await wait_until(
            lambda: _counter(cluster.nodes["n2"], "cluster_id_mismatch") > 0
            and sum(_counter(cluster.nodes[n], "cluster_id_mismatch") for n in ("n0", "n1")) > 0,
            10, "both sides counting the mismatch",
        )
        st = await cluster.nodes["n2"].status()
        assert not any(p["connected"] for p in st["peers"].values()), st["peers"]
        assert cluster.nodes["n2"].store.last_index < leader.store.last_index  # nothing of A's reached B
    finally:
        await cluster.stop()


async def test_legacy_replicas_and_a_previous_release_join_replicas_with_an_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Backward compatibility: a replica without an id sends DLH1, which an id-carrying acceptor
    takes; a previous release (simulated: it closes on DLH2 as 7787d9f does, "not a dledger peer")
    gets DLH1 from an id-carrying initiator after its first refusal."""
    cluster = InProcCluster(str(tmp_path))
    by_address = sorted(cluster.ids, key=lambda nid: f"127.0.0.1:{cluster.ports[cluster.ids.index(nid)]}")
    # The greater address initiates: the carrier (an id) dials the previous release (DLH2, refused,
    # then DLH1); the legacy replica (new code, no id) dials the carrier with DLH1.
    old, carrier = by_address[0], by_address[1]
    old_address = f"127.0.0.1:{cluster.ports[cluster.ids.index(old)]}"
    cluster.per_node = {carrier: {"cluster_id": ID_A}}  # old and legacy: no id
    seen_v2: list[bytes] = []
    real_on_hello = peer_tcp.TcpPeerTransport._on_hello

    def previous_release(self: peer_tcp.TcpPeerTransport, conn: Any, hello: bytes) -> None:
        if self._self.address == old_address and not hello.startswith(peer_tcp._HELLO):
            seen_v2.append(hello[:4])
            raise peer_tcp.HandshakeError("not a dledger peer")
        real_on_hello(self, conn, hello)

    monkeypatch.setattr(peer_tcp.TcpPeerTransport, "_on_hello", previous_release)
    await cluster.start()
    try:
        await _all_linked(cluster)
        assert seen_v2 and set(seen_v2) == {b"DLH2"}, seen_v2  # the carrier tried DLH2 first, then fell back
        for n in cluster.nodes.values():
            assert _counter(n, "cluster_id_mismatch") == 0
    finally:
        await cluster.stop()


def test_a_data_directory_records_its_cluster_id_and_refuses_another(tmp_path: Path) -> None:
    data = str(tmp_path / "node")
    assert recorded_cluster_id(data) is None
    check_cluster_id(data, ID_A)
    assert recorded_cluster_id(data) == ID_A
    assert (tmp_path / "node" / FILE_NAME).stat().st_mode & 0o777 == 0o600
    check_cluster_id(data, ID_A)  # the same id: fine
    with pytest.raises(ClusterIdMismatch, match=f"belongs to cluster '{ID_A}'.*clusterId={ID_B}"):
        check_cluster_id(data, ID_B)
    assert recorded_cluster_id(data) == ID_A  # nothing overwritten


def test_a_replica_refuses_a_data_directory_of_another_cluster(tmp_path: Path) -> None:
    s = settings_for(str(tmp_path), ["n0", "n1", "n2"], [41001, 41002, 41003], "n0", cluster_id=ID_B)
    check_cluster_id(s.data_dir, ID_A)
    with pytest.raises(ClusterIdMismatch):
        DLedgerNode(s)


def test_a_legacy_data_directory_adopts_the_id_and_legacy_config_checks_nothing(tmp_path: Path) -> None:
    s = settings_for(str(tmp_path), ["n0", "n1", "n2"], [41001, 41002, 41003], "n0")
    DLedgerNode(s)  # no id: nothing recorded
    assert recorded_cluster_id(s.data_dir) is None
    check_cluster_id(s.data_dir, ID_A)  # a legacy data directory given an id takes it
    assert recorded_cluster_id(s.data_dir) == ID_A
    DLedgerNode(s)  # a config without an id still opens it (legacy: no check)


def test_the_node_process_exits_2_on_a_data_directory_of_another_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "n0.conf"
    conf.write_text(
        "dLegerGroup=G\ndLegerPeers=n0-127.0.0.1:41001;n1-127.0.0.1:41002;n2-127.0.0.1:41003\ndLegerSelfId=n0\n"
        f"storePathRootDir={tmp_path / 'data'}\ndLegerPeerPassword=secret-123\nclusterId={ID_B}\n"
    )
    check_cluster_id(str(tmp_path / "data" / "dledger-n0"), ID_A)
    assert node_server.main(["-c", str(conf)]) == 2
    err = capsys.readouterr().err
    assert "belongs to cluster" in err and ID_A in err and ID_B in err


def test_cluster_id_config_key() -> None:
    base = {
        "dLegerGroup": "G",
        "dLegerPeers": "n0-127.0.0.1:41001;n1-127.0.0.1:41002;n2-127.0.0.1:41003",
        "dLegerSelfId": "n0",
        "storePathRootDir": "./d",
        "dLegerPeerPassword": "secret-123",
    }
    assert parse_dledger_config(base, source="t").cluster_id is None
    assert parse_dledger_config({**base, "clusterId": ID_A}, source="t").cluster_id == ID_A
    for bad in ("has space", "x" * 65, "a/b"):
        with pytest.raises(ConfigError, match="clusterId"):
            parse_dledger_config({**base, "clusterId": bad}, source="t")


def test_new_cluster_ids_are_22_base64url_characters_and_differ() -> None:
    ids = {new_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(len(i) == 22 and i.replace("-", "").replace("_", "").isalnum() for i in ids)


def test_cluster_up_plans_one_id_for_every_replica_and_keeps_it(tmp_path: Path) -> None:
    from dledger.apps import cluster as cluster_app
    from dledger.apps.cluster_plan import ClusterSettings, plan

    planned = plan(str(tmp_path), 2, "127.0.0.1", 40911, 10911, "sync", {}, kind="broker", namesrv=1,
                   cluster_id=ID_A)
    replicas = [text for info, text in planned if info.kind == "broker"]
    assert len(replicas) == 6 and all(f"clusterId={ID_A}\n" in t for t in replicas)
    parsed = parse_dledger_config(
        dict(line.split("=", 1) for line in replicas[0].splitlines() if "=" in line and not line.startswith("#")),
        source="t", extra_known_keys=frozenset({"brokerClusterName", "namesrvAddr", "brokerPeerClientAddrs"}),
    )
    assert parsed.cluster_id == ID_A
    legacy = plan(str(tmp_path), 1, "127.0.0.1", 40911, 10911, "sync", {}, kind="node")
    assert not any("clusterId" in t for _, t in legacy)  # no id asked for: the configs of before

    root = str(tmp_path / "c")
    made = cluster_app._cluster_id_for(root, {}, "")
    assert len(made) == 22
    assert cluster_app._cluster_id_for(root, {}, "/old/tree") == ""  # an older release knows no clusterId
    assert cluster_app._cluster_id_for(root, {"clusterId": ID_B}, "") == ID_B
    cluster_app._save_state(root, [], settings=ClusterSettings(cluster_id=made))
    assert cluster_app._cluster_id_for(root, {}, "") == made  # `up` after `down` keeps the directory's id
