"""In-memory implementations of ``chaos.target.Target`` and ``Network`` for tests of the faults:
they record every action and keep a small model of the cluster (who runs, who is suspended, which
links are cut, which toxics are on)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from chaos.layout import Ports, ProxySpec, plan_chaos_cluster
from chaos.target import Member
from chaos.unsynced import LossReport


class FakeNetwork:
    def __init__(self, specs: Sequence[ProxySpec]):
        self.specs = list(specs)
        self.cut_links: set[str] = set()
        self.toxics: dict[str, set[str]] = {}
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def links(self, group: str) -> list[ProxySpec]:
        return [s for s in self.specs if s.group == group]

    async def cut(self, links: Sequence[ProxySpec]) -> None:
        self.calls.append(("cut", tuple(x.link for x in links)))
        self.cut_links |= {x.link for x in links}

    async def restore(self, links: Sequence[ProxySpec]) -> None:
        self.calls.append(("restore", tuple(x.link for x in links)))
        self.cut_links -= {x.link for x in links}

    async def add_toxic(self, links: Sequence[ProxySpec], toxic_type: str, attributes: dict[str, int]) -> None:
        self.calls.append((f"toxic:{toxic_type}", tuple(x.link for x in links)))
        for x in links:
            self.toxics.setdefault(x.link, set()).add(toxic_type)

    async def remove_toxics(self, links: Sequence[ProxySpec]) -> None:
        self.calls.append(("untoxic", tuple(x.link for x in links)))
        for x in links:
            self.toxics.pop(x.link, None)

    async def heal_all(self) -> None:
        self.cut_links.clear()
        self.toxics.clear()


class FakeTarget:
    namesrv_addr = "127.0.0.1:1"

    def __init__(self, tmp: str, groups: int = 1, leader_node: str | None = "n1"):
        layout = plan_chaos_cluster(tmp, ports=Ports(20000), groups=groups)
        self._members = [Member(p.name, p.group, p.node_id, f"{p.host}:{p.http_port}") for p in layout.brokers()]
        self.network: FakeNetwork | None = FakeNetwork(layout.proxies)
        self.running = {m.name for m in self._members}
        self.suspended: set[str] = set()
        self.leader_node = leader_node
        self.calls: list[tuple[str, str]] = []
        self.env: dict[str, dict[str, str]] = {}
        self.tmp = tmp
        self.kill_batches: list[tuple[str, ...]] = []  # the members of each kill_all
        self.freezes = 0
        self.on_freeze: Callable[[int], None] | None = None  # called with the count after every freeze
        self.synced: dict[str, dict[tuple[int, int], int]] = {}  # member -> its synced-size table

    def members(self) -> list[Member]:
        return list(self._members)

    def is_running(self, m: Member) -> bool:
        return m.name in self.running

    async def kill(self, m: Member) -> None:
        self.calls.append(("kill", m.name))
        self.running.discard(m.name)

    async def kill_all(self, ms: Sequence[Member]) -> None:
        self.kill_batches.append(tuple(m.name for m in ms))
        for m in ms:
            await self.kill(m)
        self.suspended -= {m.name for m in ms}

    async def freeze(self, ms: Sequence[Member]) -> None:
        self.freezes += 1
        self.calls += [("freeze", m.name) for m in ms]
        self.suspended |= {m.name for m in ms}
        if self.on_freeze is not None:
            self.on_freeze(self.freezes)

    async def thaw(self, ms: Sequence[Member]) -> None:
        self.calls += [("thaw", m.name) for m in ms]
        self.suspended -= {m.name for m in ms}

    def synced_sizes(self, m: Member) -> dict[tuple[int, int], int]:
        return dict(self.synced.get(m.name, {}))

    async def start(self, m: Member) -> None:
        self.calls.append(("start", m.name))
        self.running.add(m.name)
        self.started_with = {**getattr(self, "started_with", {}), m.name: dict(self.env.get(m.name, {}))}

    def set_env(self, m: Member, env: dict[str, str] | None) -> None:
        if env:
            self.env[m.name] = dict(env)
        else:
            self.env.pop(m.name, None)

    def data_path(self, m: Member) -> str:
        return f"{self.tmp}/data/{m.name}"

    async def set_aside(self, m: Member, dest: str) -> None:
        assert m.name not in self.running, "move data only of a stopped node"
        self.calls.append(("set_aside", m.name))

    async def suspend(self, m: Member) -> None:
        self.calls.append(("suspend", m.name))
        self.suspended.add(m.name)

    async def resume(self, m: Member) -> None:
        self.calls.append(("resume", m.name))
        self.suspended.discard(m.name)

    async def lose_unsynced(self, m: Member) -> LossReport:
        assert m.name not in self.running, "cut files only of a dead node"
        self.calls.append(("lose_unsynced", m.name))
        return LossReport(3, 1, 42, (("store/log/0", 100, 58),))

    async def status(self, m: Member) -> dict[str, Any] | None:
        if m.name not in self.running or m.name in self.suspended:
            return None
        leads = m.node_id == self.leader_node
        return {"role": "LEADER" if leads else "FOLLOWER", "term": 3, "writable": leads, "self_id": m.node_id}
