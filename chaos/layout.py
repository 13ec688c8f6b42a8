"""The cluster of a chaos run, planned as plain data (no I/O): processes, ports, config texts and
one Toxiproxy proxy per link.

Processes come from ``dledger.apps.cluster.plan`` (the same config files ``dledger-cluster up``
writes); each broker's text then gets three per-node keys so that all its traffic crosses a proxy:

    dLegerPeerConnectAddrs  n<j>-host:<proxy i->j> for every peer j: node i reaches peer j through
                            the proxy of the directed link i->j (identities stay the dLegerPeers
                            addresses; pysyncobj opens one connection per pair, from the peer with
                            the greater address, so the pair's traffic crosses that side's proxy)
    brokerAdvertisedPort    the port of the proxy client->i: NameServer routes name the proxy
    brokerPeerClientAddrs   every replica's client proxy: NOT_LEADER answers name a proxy too

Ports (``base``, default 15000, keeps every port below the ephemeral range 32768 and away from a
user's 9876/10911/40911 cluster); group g, node i, peer j, NameServer k:

    Toxiproxy API    base + 474
    NameServer k     base + 876 + k
    Raft (identity)  base + 911 + 100 g + i
    client API       base + 1911 + 100 g + 10 i      (control traffic of the chaos tools goes here)
    proxy i->j       base + 2911 + 100 g + 10 i + j   (Raft)
    proxy client->i  base + 3911 + 100 g + 10 i
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Literal

from dledger.apps.cluster import NODES_PER_GROUP, ProcessInfo, plan

DEFAULT_PORT_BASE = 15000
GROUPS_MAX = 9
PORT_SPAN = 4800  # every port of a layout lies in [base, base + PORT_SPAN)


@dataclasses.dataclass(frozen=True)
class Ports:
    base: int = DEFAULT_PORT_BASE

    def __post_init__(self) -> None:
        if not 1024 <= self.base <= 65535 - PORT_SPAN:
            raise ValueError(f"port base {self.base} must be in 1024..{65535 - PORT_SPAN}")

    @property
    def toxiproxy_api(self) -> int:
        return self.base + 474

    @property
    def namesrv(self) -> int:
        return self.base + 876

    @property
    def raft(self) -> int:
        return self.base + 911

    @property
    def http(self) -> int:
        return self.base + 1911

    def raft_proxy(self, g: int, i: int, j: int) -> int:
        return self.base + 2911 + 100 * g + 10 * i + j

    def client_proxy(self, g: int, i: int) -> int:
        return self.base + 3911 + 100 * g + 10 * i


@dataclasses.dataclass(frozen=True)
class ProxySpec:
    name: str  # the Toxiproxy proxy name (URL-safe)
    link: str  # the link as faults.jsonl names it: "RaftNode00-n0->RaftNode00-n1", "client->RaftNode00-n1"
    kind: Literal["raft", "client"]
    group: str
    src: str | None  # process name of the connecting side (None: clients)
    dst: str  # process name of the side listening behind the proxy
    listen: str
    upstream: str


@dataclasses.dataclass
class ChaosLayout:
    root: str
    host: str
    ports: Ports
    processes: list[tuple[ProcessInfo, str]]  # (process, config text)
    proxies: list[ProxySpec]

    @property
    def toxiproxy_api(self) -> str:
        return f"{self.host}:{self.ports.toxiproxy_api}"

    @property
    def namesrv_addr(self) -> str:
        return ";".join(f"{p.host}:{p.http_port}" for p, _ in self.processes if p.kind == "namesrv")

    def brokers(self) -> list[ProcessInfo]:
        return [p for p, _ in self.processes if p.kind == "broker"]

    def raft_links(self) -> list[ProxySpec]:
        return [x for x in self.proxies if x.kind == "raft"]

    def client_links(self) -> list[ProxySpec]:
        return [x for x in self.proxies if x.kind == "client"]

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port_base": self.ports.base,
            "toxiproxy_api": self.toxiproxy_api,
            "namesrv_addr": self.namesrv_addr,
            "processes": [dataclasses.asdict(p) for p, _ in self.processes],
            "proxies": [dataclasses.asdict(x) for x in self.proxies],
        }


def raft_link(src: str, dst: str) -> str:
    return f"{src}->{dst}"


def client_link(dst: str) -> str:
    return f"client->{dst}"


def with_properties(text: str, overrides: dict[str, str]) -> str:
    """``text`` (a properties file) with each key in ``overrides`` set: replaced where present,
    appended otherwise (a key must not appear twice)."""
    out, seen = [], set()
    for line in text.splitlines():
        key = line.split("=", 1)[0].strip() if "=" in line and not line.lstrip().startswith("#") else None
        if key in overrides:
            out.append(f"{key}={overrides[key]}")
            seen.add(key)
        else:
            out.append(line)
    out += [f"{k}={v}" for k, v in overrides.items() if k not in seen]
    return "\n".join(out) + "\n"


def plan_chaos_cluster(
    root: str,
    *,
    ports: Ports,
    groups: int = 1,
    host: str = "127.0.0.1",
    flush: str = "sync",
    extra: dict[str, str] | None = None,
) -> ChaosLayout:
    if not 1 <= groups <= GROUPS_MAX:
        raise ValueError(f"groups must be in 1..{GROUPS_MAX}")
    planned = plan(
        root, groups, host, ports.raft, ports.http, flush, dict(extra or {}),
        kind="broker", namesrv=1, namesrv_base=ports.namesrv,
    )
    by_group: dict[str, list[ProcessInfo]] = {}
    for p, _ in planned:
        if p.kind == "broker":
            by_group.setdefault(p.group, []).append(p)
    proxies: list[ProxySpec] = []
    texts: dict[str, str] = {}
    for g, (group, members) in enumerate(sorted(by_group.items())):
        assert len(members) == NODES_PER_GROUP
        client_addrs = ";".join(
            f"{m.node_id}-{host}:{ports.client_proxy(g, i)}" for i, m in enumerate(members)
        )
        for i, m in enumerate(members):
            proxies.append(ProxySpec(
                name=f"client_to_{m.name}", link=client_link(m.name), kind="client", group=group,
                src=None, dst=m.name, listen=f"{host}:{ports.client_proxy(g, i)}",
                upstream=f"{m.host}:{m.http_port}",
            ))
            connect = []
            for j, peer in enumerate(members):
                if j == i:
                    continue
                listen = f"{host}:{ports.raft_proxy(g, i, j)}"
                connect.append(f"{peer.node_id}-{listen}")
                proxies.append(ProxySpec(
                    name=f"{m.name}_to_{peer.name}", link=raft_link(m.name, peer.name), kind="raft",
                    group=group, src=m.name, dst=peer.name, listen=listen,
                    upstream=f"{peer.host}:{peer.raft_port}",
                ))
            texts[m.name] = "\n".join([
                f"dLegerPeerConnectAddrs={';'.join(connect)}",
                f"brokerAdvertisedPort={ports.client_proxy(g, i)}",
                f"brokerPeerClientAddrs={client_addrs}",
            ])
    processes: list[tuple[ProcessInfo, str]] = []
    for p, text in planned:
        if p.name in texts:
            overrides = dict(line.split("=", 1) for line in texts[p.name].splitlines())
            text = with_properties(text, overrides)
        processes.append((p, text))
    return ChaosLayout(root=root, host=host, ports=ports, processes=processes, proxies=proxies)


def data_dir(p: ProcessInfo, root: str) -> str:
    """A replica's data directory (as ``dledger.apps.cluster.plan`` lays it out)."""
    return os.path.join(root, "data", p.group, f"dledger-{p.node_id}")
