"""The chaos cluster's plan: ports, proxies, and configs the broker accepts."""

from __future__ import annotations

import os
from typing import Any

import pytest

from broker.server.config import load_broker_config
from chaos.layout import PORT_SPAN, Ports, plan_chaos_cluster, with_properties


def test_ports_are_distinct_inside_the_span_and_away_from_the_defaults(tmp_path: Any) -> None:
    layout = plan_chaos_cluster(str(tmp_path), ports=Ports(15000), groups=9)
    ports = [layout.ports.toxiproxy_api]
    for p, _ in layout.processes:
        ports += [p.http_port] + ([p.raft_port] if p.raft_port else [])
    ports += [int(x.listen.rsplit(":", 1)[1]) for x in layout.proxies]
    assert len(ports) == len(set(ports)) == 1 + 1 + 27 * 2 + 9 * 9
    assert all(15000 <= port < 15000 + PORT_SPAN for port in ports)
    assert not {9876, 9877, 10911, 10921, 10931, 40911, 40912, 40913} & set(ports)
    assert max(ports) < 32768  # below Linux's ephemeral range
    with pytest.raises(ValueError):
        Ports(65000)


def test_one_proxy_per_directed_raft_link_and_per_client_link(tmp_path: Any) -> None:
    layout = plan_chaos_cluster(str(tmp_path), ports=Ports(20000))
    raft = {x.link: x for x in layout.raft_links()}
    assert len(raft) == 6 and len(layout.client_links()) == 3
    by_name = {p.name: p for p in layout.brokers()}
    x = raft["RaftNode00-n2->RaftNode00-n0"]
    assert x.upstream == f"127.0.0.1:{by_name['RaftNode00-n0'].raft_port}" and x.src == "RaftNode00-n2"
    c = next(y for y in layout.client_links() if y.dst == "RaftNode00-n1")
    assert c.upstream == f"127.0.0.1:{by_name['RaftNode00-n1'].http_port}" and c.link == "client->RaftNode00-n1"
    assert len({y.name for y in layout.proxies}) == 9


def test_each_broker_connects_to_peers_and_advertises_through_proxies(tmp_path: Any) -> None:
    layout = plan_chaos_cluster(str(tmp_path), ports=Ports(20000))
    os.makedirs(tmp_path / "conf")
    proxies = {x.link: x.listen for x in layout.proxies}
    for p, text in layout.processes:
        with open(p.conf, "w") as f:
            f.write(text)
        if p.kind != "broker":
            continue
        cfg = load_broker_config(p.conf)  # the broker accepts it
        peers = {q.node_id: q.name for q in layout.brokers() if q.group == p.group}
        assert cfg.dledger.peer_connect_addrs == {
            nid: proxies[f"{p.name}->{name}"] for nid, name in peers.items() if name != p.name}
        assert cfg.address == proxies[f"client->{p.name}"]  # what the NameServer will hand to clients
        assert cfg.peer_client_addrs == {nid: proxies[f"client->{name}"] for nid, name in peers.items()}
        assert [peer.address for peer in cfg.dledger.peers] == [  # identities stay the real Raft ports
            f"127.0.0.1:{q.raft_port}" for q in layout.brokers() if q.group == p.group]
        assert text.count("brokerPeerClientAddrs=") == 1


def test_with_properties_replaces_or_appends() -> None:
    text = "# comment a=b\na=1\nb=2\n"
    assert with_properties(text, {"b": "3", "c": "4"}) == "# comment a=b\na=1\nb=3\nc=4\n"
