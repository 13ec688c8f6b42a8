"""Raft traffic through per-link proxies (how chaos runs put Toxiproxy between peers).

Peers keep their identity (the dLegerPeers address each announces) while connecting through the
proxy named by ``raft_addresses``. pysyncobj opens one connection per pair, from the peer with the
greater address, so a pair's traffic flows through the connecting side's proxy — cutting the
proxies of the leader's pairs really isolates it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tests.dledger.harness import HOST, InProcCluster, free_ports, wait_until


class Forwarder:
    """A TCP proxy that can be cut (close every connection, refuse new ones) and healed."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        self.cut = False
        self.bytes = 0
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self, port: int) -> None:
        self.port = port
        self.server = await asyncio.start_server(self._handle, HOST, port)

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if self.cut:
            w.close()
            return
        try:
            ur, uw = await asyncio.open_connection(HOST, self.target_port)
        except OSError:
            w.close()
            return
        self.writers |= {w, uw}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    self.bytes += len(data)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(r, uw), pipe(ur, w))

    def set_cut(self, cut: bool) -> None:
        self.cut = cut
        if cut:
            for w in list(self.writers):
                w.close()
            self.writers.clear()

    async def stop(self) -> None:
        self.set_cut(True)
        if self.server is not None:
            self.server.close()


async def test_traffic_flows_through_proxies_and_cutting_them_isolates_the_leader(tmp_path: Any) -> None:
    c = InProcCluster(str(tmp_path))
    ids = c.ids
    proxy_ports = free_ports(len(ids) * len(ids))
    proxies: dict[tuple[str, str], Forwarder] = {}
    k = 0
    for src in ids:  # one proxy per directed link src -> dst
        view = {}
        for dst, port in zip(ids, c.ports, strict=True):
            if dst == src:
                view[dst] = f"{HOST}:{port}"
                continue
            fw = Forwarder(port)
            await fw.start(proxy_ports[k])
            k += 1
            proxies[(src, dst)] = fw
            view[dst] = f"{HOST}:{fw.port}"
        c.per_node[src] = {"raft_addresses": view}
    await c.start()
    try:
        leader = await c.leader()
        await leader.append([b"through the proxies"])
        # every pair's single connection runs through exactly one of its two proxies
        for a in ids:
            for b in ids:
                if a < b:
                    assert proxies[(a, b)].bytes + proxies[(b, a)].bytes > 0, (a, b)
        lid = leader.settings.self_id
        for (a, b), fw in proxies.items():
            if lid in (a, b):
                fw.set_cut(True)
        # the isolated leader steps down (check-quorum) and the majority elects another
        await wait_until(lambda: leader.role != "LEADER", 10, "the isolated leader to step down")
        others = [n for n in c.nodes.values() if n is not leader]
        new = await wait_until(
            lambda: next((n for n in others if n.role == "LEADER"), None), 10, "a new leader in the majority"
        )
        locs = await new.append([b"majority side"])
        assert locs[0].index > 0
        assert leader.commit_index < locs[0].index  # the cut-off node did not see it
        for fw in proxies.values():
            fw.set_cut(False)
        await wait_until(lambda: leader.commit_index >= locs[0].index, 15, "the healed node catches up")
        assert leader.chain_crc_at(locs[0].index) == new.chain_crc_at(locs[0].index)
    finally:
        await c.stop()
        for fw in proxies.values():
            await fw.stop()
