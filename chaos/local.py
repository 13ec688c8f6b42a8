"""The local cluster of a chaos run: a NameServer, broker groups behind Toxiproxy, all under
RUN_DIR/cluster (the layout is ``chaos.layout``; the files are those of ``dledger-cluster``).

``up`` writes the configs, starts Toxiproxy and creates every proxy, starts the NameServer and the
brokers (through ``chaos.launch``: each records its fsynced sizes for the crash fault), records
the processes in cluster.json (so ``dledger-cluster status/down --dir RUN_DIR/cluster`` work too)
and waits until every group has a writable leader. ``down`` ends exactly the processes it started,
by PID (suspended ones are continued first: a stopped process ignores SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import time
from collections.abc import Sequence
from typing import Any

from chaos.layout import ChaosLayout, Ports, ProxySpec, plan_chaos_cluster
from chaos.target import LocalTarget, launch_broker, reap, start_namesrv
from chaos.toxi import ProxyNetwork, ToxiproxyServer
from dledger.apps.cluster import STATE_FILE, ProcessInfo, healthy, is_running, node_status, stop_process


class LocalNetwork:
    """``chaos.target.Network`` over a ProxyNetwork (blocking calls moved to a thread)."""

    def __init__(self, proxies: ProxyNetwork, specs: Sequence[ProxySpec]):
        self.proxies = proxies
        self.specs = list(specs)

    def links(self, group: str) -> list[ProxySpec]:
        return [s for s in self.specs if s.group == group]

    async def cut(self, links: Sequence[ProxySpec]) -> None:
        await asyncio.to_thread(self.proxies.cut, links)

    async def restore(self, links: Sequence[ProxySpec]) -> None:
        await asyncio.to_thread(self.proxies.restore, links)

    async def add_toxic(self, links: Sequence[ProxySpec], toxic_type: str, attributes: dict[str, int]) -> None:
        await asyncio.to_thread(self.proxies.add_toxic, links, toxic_type, attributes)

    async def remove_toxics(self, links: Sequence[ProxySpec]) -> None:
        await asyncio.to_thread(self.proxies.remove_toxics, links)

    async def heal_all(self) -> None:
        await asyncio.to_thread(self.proxies.heal_all)


class LocalChaosCluster:
    def __init__(
        self,
        run_dir: str,
        *,
        ports: Ports,
        groups: int = 1,
        flush: str = "sync",
        extra: dict[str, str] | None = None,
        toxiproxy_binary: str | None = None,
        broker_env: dict[str, str] | None = None,
    ):
        self.root = os.path.join(os.path.abspath(run_dir), "cluster")
        self.broker_env = dict(broker_env or {})  # e.g. DLEDGER_TEST_PLANT: every broker start
        self.layout: ChaosLayout = plan_chaos_cluster(self.root, ports=ports, groups=groups, flush=flush, extra=extra)
        self.toxiproxy = ToxiproxyServer(
            self.layout.host, ports.toxiproxy_api, os.path.join(self.root, "logs", "toxiproxy.log"), toxiproxy_binary
        )
        self.proxies: ProxyNetwork | None = None
        self.started: list[ProcessInfo] = []

    def up(self, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        if os.path.exists(os.path.join(self.root, STATE_FILE)):
            raise RuntimeError(f"{self.root} already holds a cluster: use a new run directory")
        os.makedirs(os.path.join(self.root, "conf"), exist_ok=True)
        for p, text in self.layout.processes:
            with open(p.conf, "w") as f:
                f.write(text)
        self.toxiproxy.start()
        self.proxies = ProxyNetwork(self.layout.host, self.layout.ports.toxiproxy_api, self.layout.proxies)
        self.proxies.create_all()
        for p, _ in self.layout.processes:
            if p.kind == "namesrv":
                p.pid = start_namesrv(p)
            else:
                p.pid = launch_broker(p, os.path.join(self.root, "synced", f"{p.name}.table"), self.broker_env)
            self.started.append(dataclasses.replace(p))
            self._save()
        with open(os.path.join(self.root, "layout.json"), "w") as f:
            json.dump(self.layout.to_json(), f, indent=2)
        return self.wait_healthy(timeout_s)

    def wait_healthy(self, timeout_s: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        procs = self.processes()
        rows = [node_status(p) for p in procs]
        while not healthy(rows):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the chaos cluster did not elect writable leaders within {timeout_s} s; "
                                   f"see {self.root}/logs")
            time.sleep(0.2)
            rows = [node_status(p) for p in procs]
        return rows

    def _save(self) -> None:
        path = os.path.join(self.root, STATE_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump({"processes": [dataclasses.asdict(p) for p in self.started]}, f, indent=2)
        os.replace(path + ".tmp", path)

    def processes(self) -> list[ProcessInfo]:
        with open(os.path.join(self.root, STATE_FILE)) as f:
            return [ProcessInfo(**p) for p in json.load(f)["processes"]]

    def target(self) -> LocalTarget:
        assert self.proxies is not None, "up() first"
        return LocalTarget(self.root, restart="launch", network=LocalNetwork(self.proxies, self.layout.proxies),
                           broker_env=self.broker_env)

    def down(self) -> None:
        """Stop every process this cluster started (brokers first), then Toxiproxy. Safe to call twice."""
        try:
            procs = self.processes()
        except FileNotFoundError:
            procs = list(self.started)
        brokers = [p for p in procs if p.kind == "broker"]
        for p in brokers:  # continued (a stopped process ignores SIGTERM), then all asked to stop at once
            _signal(p, signal.SIGCONT)
            _signal(p, signal.SIGTERM)
        for p in brokers + [p for p in procs if p.kind != "broker"]:
            stop_process(p, timeout_s=10)
            reap(p.pid)
        self.toxiproxy.stop()


def _signal(p: ProcessInfo, sig: signal.Signals) -> None:
    if is_running(p):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, sig)
