"""``chaos compose-drill``: the failover drill against the docker compose cluster, ending in the audit.

Steps (each fault logged into RUN_DIR/faults.jsonl):
1. ``bash .ci/compose.sh up`` (a Docker engine started if none answers, the image built offline if
   needed, every container healthy, a writable leader); exit 3 from it means no engine could be
   started: the drill prints ``COMPOSE DRILL NOT RUN: <reason>`` and returns 3.
2. The chaos workload on the host (producers and consumers through the published ports) records
   histories into RUN_DIR/history; the drill's own producers time the failovers.
3. ``--rounds`` times: ``docker kill`` of the leader's container, time until a new leader is
   registered at the NameServer and until the first acknowledged send the new leader stored,
   ``docker start`` again, wait until it caught up.
4. ``docker network disconnect`` of one follower for ``--cut-s`` seconds, then reconnect and wait.
5. Producers stop, consumers settle, every queue is drained, final replica statuses go to run.json,
   the containers are stopped and each volume's data is copied to RUN_DIR/cluster/data/.
6. ``python -m spark_jobs.audit RUN_DIR``; ``compose.sh down`` (containers, network, volumes) at the
   end, also on failure. Exit code: the audit's (0 clean), 1 when the failover targets are missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from broker.client.transport import ClientError, Transport
from chaos.drill import Drill, DrillOptions
from chaos.fleet_base import other_groups_during, read_faults, read_sends
from chaos.history import HISTORY_VERSION, FaultRecord, JsonlWriter, now_us
from chaos.target import REPO, Member, Network, NotSupported, find_leader, wait_for
from chaos.unsynced import LossReport
from chaos.workload import Workload, WorkloadConfig, create_topic, drain

COMPOSE_SH = os.path.join(REPO, ".ci", "compose.sh")
GROUP = "RaftNode00"
NODES = {"n0": 10911, "n1": 10921, "n2": 10931}
# With --fleet (the compose profile "fleet"): group -> replica id -> (compose service, host client port)
FLEET_GROUPS = {
    GROUP: {nid: (nid, port) for nid, port in NODES.items()},
    "RaftNode01": {"n0": ("g1n0", 11011), "n1": ("g1n1", 11021), "n2": ("g1n2", 11031)},
    "RaftNode02": {"n0": ("g2n0", 11111), "n1": ("g2n1", 11121), "n2": ("g2n2", 11131)},
}
FIRST_ACK_MEDIAN_TARGET_MS = 3000
STATUS_TIMEOUT_S = 1.0


class ComposeUnavailable(Exception):
    """No Docker engine could be started (the drill is not run)."""


def _compose_cmd() -> list[str]:
    project = os.environ.get("COMPOSE_PROJECT_NAME", "dledgermq")
    base = ["-p", project, "-f", os.path.join(REPO, "docker-compose.yml")]
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, check=False)
    return ["docker", "compose", *base] if probe.returncode == 0 else ["docker-compose", *base]


def _run(cmd: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=REPO, check=False)


def use_compose_secrets() -> None:
    """The compose cluster runs TLS and ACL (docker/run/, made by compose.sh): every client of this
    process (workload, drill, target) trusts its CA and signs with its admin account."""
    run = os.path.join(REPO, "docker", "run")
    os.environ.setdefault("DLEDGER_TLS_CA_FILE", os.path.join(run, "tls", "ca.pem"))
    os.environ.setdefault("DLEDGER_CREDENTIALS_FILE", os.path.join(run, "admin-credentials.yml"))


class ComposeTarget:
    """The compose cluster's brokers as a ``chaos.target.Target``: containers killed, started,
    paused with docker; page-cache loss is not supported (the volumes live in the engine)."""

    namesrv_addr = "127.0.0.1:9876;127.0.0.1:9877"
    network: Network | None = None  # links are cut with `docker network disconnect` by the drill

    def __init__(self, fleet: bool = False) -> None:
        self.compose = _compose_cmd()
        self.transport = Transport(timeout_s=STATUS_TIMEOUT_S)
        self._ids: dict[str, str] = {}
        groups = FLEET_GROUPS if fleet else {GROUP: FLEET_GROUPS[GROUP]}
        self._members = [Member(f"{group}-{nid}", group, nid, f"127.0.0.1:{port}")
                         for group, nodes in groups.items() for nid, (_svc, port) in nodes.items()]
        self._services = {f"{group}-{nid}": svc for group, nodes in groups.items()
                          for nid, (svc, _port) in nodes.items()}

    def members(self) -> list[Member]:
        return list(self._members)

    def service(self, m: Member) -> str:
        """The compose service (and host name on the private network) of a replica."""
        return self._services[m.name]

    def container(self, m: Member) -> str:
        svc = self.service(m)
        cid = self._ids.get(svc)
        if cid is None:
            r = _run([*self.compose, "ps", "-q", svc])
            cid = r.stdout.strip()
            if not cid:
                raise RuntimeError(f"no container for service {svc}: {r.stderr.strip()[-300:]}")
            self._ids[svc] = cid
        return cid

    def is_running(self, m: Member) -> bool:
        r = _run(["docker", "inspect", "-f", "{{.State.Running}} {{.State.Paused}}", self.container(m)])
        return r.stdout.strip() == "true false"

    async def _docker(self, *args: str) -> None:
        r = await asyncio.to_thread(_run, ["docker", *args])
        if r.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} failed: {r.stderr.strip()[-300:]}")

    async def kill(self, m: Member) -> None:
        await self._docker("kill", self.container(m))

    async def kill_all(self, ms: Sequence[Member]) -> None:
        if ms:
            await self._docker("kill", *(self.container(m) for m in ms))

    async def freeze(self, ms: Sequence[Member]) -> None:
        if ms:
            await self._docker("pause", *(self.container(m) for m in ms))

    async def thaw(self, ms: Sequence[Member]) -> None:
        if ms:
            await self._docker("unpause", *(self.container(m) for m in ms))

    async def start(self, m: Member) -> None:
        if not self.is_running(m):
            await self._docker("start", self.container(m))

    async def suspend(self, m: Member) -> None:
        await self._docker("pause", self.container(m))

    async def resume(self, m: Member) -> None:
        await self._docker("unpause", self.container(m))

    async def lose_unsynced(self, m: Member) -> LossReport:
        raise NotSupported("page-cache loss is not modelled for containers")

    def synced_sizes(self, m: Member) -> dict[tuple[int, int], int]:
        raise NotSupported("fsynced sizes are not recorded in containers")

    def set_env(self, m: Member, env: dict[str, str] | None) -> None:
        raise NotSupported("a container's environment is fixed by docker-compose.yml")

    def data_path(self, m: Member) -> str:
        raise NotSupported("the replicas' data lives in docker volumes")

    async def set_aside(self, m: Member, dest: str) -> None:
        raise NotSupported("the replicas' data lives in docker volumes")

    async def status(self, m: Member) -> dict[str, Any] | None:
        try:
            st = await self.transport.call(m.control_addr, "GET", "/v1/status", timeout_s=STATUS_TIMEOUT_S)
        except ClientError:
            return None
        return dict(st) if isinstance(st, dict) else None

    def network_name(self) -> str:
        r = _run(["docker", "inspect", "-f", "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}",
                  self.container(self.members()[0])])
        names = r.stdout.split()
        if not names:
            raise RuntimeError(f"no network for the compose cluster: {r.stderr.strip()[-300:]}")
        return names[0]

    async def close(self) -> None:
        await self.transport.close()


@dataclasses.dataclass(frozen=True)
class ComposeDrillOptions:
    run_dir: str
    rounds: int = 3
    cut_s: float = 10.0
    producers: int = 2
    consumers: int = 2
    rate: float = 50.0
    keep: bool = False
    audit: bool = True
    fleet: bool = False  # the profile "fleet": three groups; the drill's faults hit RaftNode00


class ComposeDrill:
    def __init__(self, opts: ComposeDrillOptions, out: Any = sys.stdout):
        self.opts = opts
        self.out = out
        self.dir = os.path.abspath(opts.run_dir)
        self.info: dict[str, Any] = {}

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def write_run_json(self) -> None:
        path = os.path.join(self.dir, "run.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.info, f, indent=2, default=str)
        os.replace(path + ".tmp", path)

    async def execute(self) -> int:
        if os.path.isdir(self.dir) and os.listdir(self.dir):
            raise RuntimeError(f"{self.dir} is not empty: every run needs a new directory")
        os.makedirs(os.path.join(self.dir, "history"), exist_ok=True)
        self.info = {"version": 1, "history_version": HISTORY_VERSION, "tool": "chaos compose-drill",
                     "start_us": now_us(), "status": "running", "options": dataclasses.asdict(self.opts),
                     "topics": [{"topic": "ComposeChaos", "queues": 8}], "cluster_dir": "cluster"}
        self.write_run_json()
        up = await asyncio.to_thread(_run, ["bash", COMPOSE_SH, "up", *(["fleet"] if self.opts.fleet else [])], 900)
        if up.returncode == 3:
            raise ComposeUnavailable(up.stderr.strip().splitlines()[-1] if up.stderr.strip() else "no engine")
        if up.returncode != 0:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(_run, ["bash", COMPOSE_SH, "down"], 300)
            raise RuntimeError(f"compose up failed: {up.stderr.strip()[-1500:]}")
        self.say("compose cluster up:\n" + up.stdout.strip())
        use_compose_secrets()
        target = ComposeTarget(fleet=self.opts.fleet)
        faults = JsonlWriter(os.path.join(self.dir, "faults.jsonl"))
        workload: Workload | None = None
        rc = 1
        try:
            cfg = WorkloadConfig(topic="ComposeChaos", queues=8, producers=self.opts.producers,
                                 keyed=self.opts.producers // 2, consumers=self.opts.consumers, rate=self.opts.rate)
            await create_topic(target, cfg.topic, cfg.queues)
            workload = Workload(os.path.join(self.dir, "history"), target.namesrv_addr, cfg, random.Random(7))
            await workload.start()
            drill = Drill(DrillOptions(rounds=self.opts.rounds, producers=2, rate=0.0, steady_s=2.0,
                                       topic="ComposeDrill", queues=8, group=GROUP), target, self.out)
            result = await self._drill_rounds(drill, faults)
            self.info["drill"] = result
            if self.opts.fleet:
                workload.flush()
                self.info["other_groups"] = others = other_groups_during(
                    read_sends(self.dir), read_faults(self.dir, "docker-kill-leader"), GROUP)
                self.say(f"other groups' sends: p99 {others['steady']['p99_ms']:.1f} ms outside the failovers, "
                         f"{others['failover']['p99_ms']:.1f} ms during them (max {others['failover']['max_ms']:.0f} "
                         f"ms, not acknowledged {others['failover']['not_acked']})")
            await self._cut_follower(target, faults)
            await self._wind_down(target, workload, cfg)
            workload = None
            await self._copy_volumes(target)
            rc = self._audit() if self.opts.audit else 0
            median = result["summary"]["first_ack_ms_median"]
            if median > FIRST_ACK_MEDIAN_TARGET_MS:
                self.say(f"compose drill: first-ack median {median:.0f} ms misses {FIRST_ACK_MEDIAN_TARGET_MS} ms")
                rc = rc or 1
            self.info["status"] = "done"
        finally:
            if workload is not None:
                await workload.close()
            faults.close()
            await target.close()
            self.info["end_us"] = now_us()
            self.write_run_json()
            if not self.opts.keep:
                down = await asyncio.to_thread(_run, ["bash", COMPOSE_SH, "down"], 300)
                self.say("compose cluster removed (down -v)" if down.returncode == 0
                         else f"WARNING: compose down failed: {down.stderr.strip()[-300:]}")
        return rc

    async def _drill_rounds(self, drill: Drill, faults: JsonlWriter) -> dict[str, Any]:
        target = drill.target
        original_kill = target.kill

        async def logged_kill(m: Member) -> None:
            faults.write(FaultRecord(now_us(), "docker-kill-leader", "apply", (m.name,), {}))
            faults.flush()
            await original_kill(m)

        original_start = target.start

        async def logged_start(m: Member) -> None:
            was_down = not target.is_running(m)
            await original_start(m)
            if was_down:
                faults.write(FaultRecord(now_us(), "docker-kill-leader", "heal", (m.name,), {"docker": "start"}))
                faults.flush()

        target.kill = logged_kill  # type: ignore[method-assign]
        target.start = logged_start  # type: ignore[method-assign]
        return await drill.run()

    async def _cut_follower(self, target: ComposeTarget, faults: JsonlWriter) -> None:
        members = [m for m in target.members() if m.group == GROUP]
        leader = await wait_for(lambda: find_leader(target, members, writable=True), 60, "a writable leader", 0.1)
        follower = next(m for m in members if m.name != leader and m.group == GROUP)
        net = target.network_name()
        cid = target.container(follower)
        faults.write(FaultRecord(now_us(), "network-disconnect", "apply", (follower.name,), {"network": net}))
        faults.flush()
        await target._docker("network", "disconnect", net, cid)
        self.say(f"disconnected {follower.name} from {net} for {self.opts.cut_s:g} s")
        try:
            await asyncio.sleep(self.opts.cut_s)
        finally:
            await target._docker("network", "connect", "--alias", target.service(follower), net, cid)
            faults.write(FaultRecord(now_us(), "network-disconnect", "heal", (follower.name,), {"network": net}))
            faults.flush()

        async def caught_up() -> bool:
            st = await target.status(follower)
            lead = await find_leader(target, members, writable=True)
            if st is None or lead is None:
                return False
            lst = await target.status(next(m for m in members if m.name == lead)) or {}
            return int(st.get("applied_index") or 0) >= int(lst.get("commit_index") or 0) - 50

        await wait_for(caught_up, 120, f"{follower.name} to catch up after the reconnect", 0.2)
        self.say(f"{follower.name} reconnected and caught up")

    async def _wind_down(self, target: ComposeTarget, workload: Workload, cfg: WorkloadConfig) -> None:
        await workload.stop_producers()
        workload.flush()
        c = workload.counters
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not c.acked <= c.received:
            await asyncio.sleep(0.2)
        await workload.close()
        with JsonlWriter(os.path.join(self.dir, "history", "drain.jsonl")) as dw:
            drained = await drain(target, cfg.topic, cfg.queues, dw)
        self.say(f"drained {drained.messages} messages; {len(c.acked)} acknowledged by the workload")
        rows = []
        for m in target.members():
            st = await target.status(m) or {}
            rows.append({"name": m.name, "group": m.group, "node_id": m.node_id,
                         "data_dir": f"cluster/data/{m.group}/dledger-{m.node_id}",
                         **{k: st.get(k) for k in ("role", "term", "leader_id", "commit_index", "applied_index",
                                                   "first_index", "last_index", "writable")}})
        self.info["replicas"] = rows
        self.info["counts"] = {**c.snapshot(), "drained": drained.messages}

    async def _copy_volumes(self, target: ComposeTarget) -> None:
        """Stop the brokers (a quiescent log) and copy each replica's data out of its volume."""
        services = [target.service(m) for m in target.members()]
        r = await asyncio.to_thread(_run, [*target.compose, "stop", "-t", "10", *services], 180)
        if r.returncode != 0:
            raise RuntimeError(f"compose stop failed: {r.stderr.strip()[-300:]}")
        for m in target.members():
            dest = os.path.join(self.dir, "cluster", "data", m.group)
            os.makedirs(dest, exist_ok=True)
            shutil.rmtree(os.path.join(dest, f"dledger-{m.node_id}"), ignore_errors=True)
            await target._docker("cp", f"{target.container(m)}:/var/lib/dledger/dledger-{m.node_id}", dest)
        self.say(f"replica data copied to {os.path.join(self.dir, 'cluster', 'data')}")

    def _audit(self) -> int:
        self.say(f"audit: python -m spark_jobs.audit {self.dir}")
        started = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "spark_jobs.audit", self.dir], cwd=REPO, check=False)
        self.info["audit"] = {"ran": True, "exit_code": r.returncode, "took_s": round(time.monotonic() - started, 1)}
        self.say(f"audit exit code {r.returncode} ({'clean' if r.returncode == 0 else 'lost or diverged'})")
        return r.returncode


async def run_compose_drill(opts: ComposeDrillOptions, out: Any = sys.stdout) -> int:
    try:
        return await ComposeDrill(opts, out).execute()
    except ComposeUnavailable as exc:
        print(f"COMPOSE DRILL NOT RUN: {exc}", file=out, flush=True)
        return 3
