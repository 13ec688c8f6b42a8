"""In-process broker clusters for tests: a NameServer and a 3-replica broker group in one loop.

Each broker has its own dledger node (own tick thread), store directory and HTTP port on
127.0.0.1; they talk over real sockets. ``stop_broker`` ends one replica the way SIGTERM would
(unregistering) or abruptly (``crash=True``: no unregister, no final snapshot).
"""

from __future__ import annotations

import os
from typing import Any

from aiohttp import web

from broker.server.broker_server import BrokerServer
from broker.server.config import BrokerConfig, parse_broker_config
from namesrv.config import NamesrvConfig
from namesrv.server import NamesrvService
from tests.acl_fixtures import BROKER_G0
from tests.dledger.harness import HOST, PASSWORD, free_ports, wait_until

IDS = ["n0", "n1", "n2"]


class NameServer:
    def __init__(self, port: int, idle_ms: int = 120_000, scan_ms: int = 10_000, acl_file: str | None = None):
        self.cfg = NamesrvConfig(
            listen_port=port,
            scan_not_active_broker_interval_ms=scan_ms,
            broker_channel_max_idle_time_ms=idle_ms,
            acl_file=acl_file,
        )
        self.service = NamesrvService(self.cfg)
        self.runner: web.AppRunner | None = None
        self.addr = f"{HOST}:{port}"

    async def start(self) -> None:
        self.runner, _ = await self.service.serve(HOST, self.cfg.listen_port)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None


def broker_props(
    root: str,
    self_id: str,
    raft_ports: list[int],
    http_ports: list[int],
    remoting_ports: list[int],
    namesrv: list[str],
    **extra: Any,
) -> dict[str, str]:
    props = {
        "brokerClusterName": "TestCluster",
        "brokerName": "RaftNode00",
        "dLegerGroup": "RaftNode00",
        "dLegerPeers": ";".join(f"{nid}-{HOST}:{p}" for nid, p in zip(IDS, raft_ports, strict=True)),
        "dLegerSelfId": self_id,
        "dLegerPeerPassword": PASSWORD,
        "storePathRootDir": os.path.join(root, self_id),
        "listenPort": str(http_ports[IDS.index(self_id)]),
        "brokerIP1": HOST,
        "namesrvAddr": ";".join(namesrv),
        "brokerPeerClientAddrs": ";".join(f"{nid}-{HOST}:{p}" for nid, p in zip(IDS, http_ports, strict=True)),
        "storeSnapshotIntervalMs": "200",
        "remotingListenPort": str(remoting_ports[IDS.index(self_id)]),
    }
    props.update({k: str(v) for k, v in extra.items()})
    return props


class BrokerCluster:
    def __init__(
        self,
        root: str,
        *,
        namesrv_count: int = 1,
        namesrv_idle_ms: int = 120_000,
        namesrv_scan_ms: int = 10_000,
        raft_overrides: dict[str, Any] | None = None,
        acl_file: str | None = None,
        **extra: Any,
    ):
        """``acl_file``: ACL on at the NameServers and brokers, which register with ``BROKER_G0``."""
        self.raft_overrides = raft_overrides
        ports = free_ports(9 + namesrv_count)
        self.raft_ports, self.http_ports, self.remoting_ports = ports[:3], ports[3:6], ports[6:9]
        self.namesrvs = [NameServer(p, namesrv_idle_ms, namesrv_scan_ms, acl_file) for p in ports[9:]]
        if acl_file is not None:
            extra = {
                "aclEnable": "true",
                "aclFile": acl_file,
                "brokerAccessKey": BROKER_G0.access_key,
                "brokerSecretKey": BROKER_G0.secret_key,
                **extra,
            }
        self.root = root
        self.extra = extra
        self.brokers: dict[str, BrokerServer] = {}

    @property
    def namesrv_addr(self) -> str:
        return ";".join(ns.addr for ns in self.namesrvs)

    def config(self, nid: str) -> BrokerConfig:
        props = broker_props(
            self.root,
            nid,
            self.raft_ports,
            self.http_ports,
            self.remoting_ports,
            [ns.addr for ns in self.namesrvs],
            **self.extra,
        )
        return parse_broker_config(props, source=f"<test {nid}>", env={})

    async def start(self, wait_leader: bool = True) -> None:
        for ns in self.namesrvs:
            await ns.start()
        for nid in IDS:
            await self.start_broker(nid)
        if wait_leader:
            await self.wait_writable()

    async def start_broker(self, nid: str) -> BrokerServer:
        server = BrokerServer(self.config(nid), raft_overrides=self.raft_overrides)
        await server.start()
        self.brokers[nid] = server
        return server

    async def stop_broker(self, nid: str, crash: bool = False) -> None:
        server = self.brokers.pop(nid)
        if crash:
            for t in server._tasks:
                t.cancel()
            await server.registrar.close()
            if server._runner is not None:
                await server._runner.cleanup()
            await server.remoting.stop()  # a dead process's listening sockets go with it
            await server.node.stop()
            server.store._syncer.shutdown(wait=True)
            server.store.cqs.close()
            server.store.index.close()
        else:
            await server.stop()

    async def wait_writable(self, timeout_s: float = 20.0) -> BrokerServer:
        return await wait_until(self.writable_leader, timeout_s, "a writable leader")  # type: ignore[no-any-return]

    def writable_leader(self) -> BrokerServer | None:
        for b in self.brokers.values():
            if b.node.role == "LEADER" and b.ready:
                return b
        return None

    def addr(self, nid: str) -> str:
        return f"{HOST}:{self.http_ports[IDS.index(nid)]}"

    async def __aenter__(self) -> BrokerCluster:
        """``async with BrokerCluster(...) as c``: started (with a writable leader), stopped after."""
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        for nid in list(self.brokers):
            await self.stop_broker(nid)
        for ns in self.namesrvs:
            await ns.stop()
