"""``chaos rolling-restart``: restart every replica of every group in turn under load, then drain
and audit (docs/CHAOS.md, "Rolling restart"; docs/OPERATIONS.md, "Rolling restart and upgrade").

    up (G groups) ─▶ workload ─▶ per group: followers, then the leader:
        [transfer first (--transfer-first)] ─▶ dledger-cluster stop NAME (SIGTERM: a leader hands
        over, then unregisters) ─▶ start NAME [from the new tree] ─▶ caught up ─▶ steady load
    ─▶ wind down (drain) ─▶ down ─▶ audit

With ``--upgrade-from REV`` the cluster starts from ``git archive REV`` (RUN_DIR/old-tree, run with
this checkout's Python environment) and every restart starts the replica from this tree: mid-roll a
group runs both versions, the peer protocol and the client protocol crossing between them (an
upgrade; docs/OPERATIONS.md says which releases interoperate). Releases before issue 27 do not hand
over on SIGTERM: ``--transfer-first`` (implied by ``--upgrade-from``) asks the leader to transfer
leadership (``POST /v1/admin/transfer``, retried while the follower is behind) before stopping it.

Targets (issue 27), each checked and printed: 0 acknowledged messages lost (the run's check, then
the audit); at most one leadership change (term step) per stopped leader and none for a stopped
follower; no send failing, and no producer waiting more than ``GAP_TARGET_MS`` between two acks
(the worst send gap). Exit code: the audit's (0 clean) or 1 when a target is missed; 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from broker.client.transport import ClientError, NamesrvClient, Transport
from chaos.fleet_base import (
    FleetOptions,
    FleetRun,
    add_load_arguments,
    add_run_arguments,
    read_sends,
    send_gaps,
)
from chaos.target import REPO, Member, groups_of, wait_for
from dledger.apps.cluster import ProcessInfo, load_processes

GAP_TARGET_MS = 1000.0
STEADY_S_DEFAULT = 3.0
TRANSFER_TRY_S = 10.0  # --transfer-first asks this long at most
# With --roll-namesrv the brokers register every 3 s (registerNameServerPeriod; default 30 s), so a
# restarted NameServer is whole again within seconds; with the default a roll waits up to 30 s each.
NAMESRV_REFILL_MS = 3000


class UsageError(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class RollingOptions:
    fleet: FleetOptions
    steady_s: float = STEADY_S_DEFAULT
    upgrade_from: str | None = None  # a git revision: the cluster starts from it, restarts from this tree
    transfer_first: bool = False
    roll_namesrv: bool = False  # NameServers too, first


def old_tree(rev: str, dest: str) -> str:
    """``git archive REV`` of this repository unpacked into ``dest``; the commit id. UsageError when
    the revision is unknown (a shallow clone: fetch it first)."""
    r = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO, capture_output=True,
                       text=True, check=False)
    if r.returncode != 0:
        raise UsageError(f"--upgrade-from {rev}: not a commit of this repository ({r.stderr.strip()}); in a "
                         "shallow clone run `git fetch --unshallow` first")
    commit = r.stdout.strip()
    os.makedirs(dest)
    with tempfile.TemporaryFile() as tar:
        subprocess.run(["git", "archive", "--format=tar", commit], cwd=REPO, stdout=tar, check=True)
        tar.seek(0)
        subprocess.run(["tar", "-x", "-C", dest], stdin=tar, check=True)
    return commit


def roll_order(group_members: list[Member], leader: str | None) -> list[Member]:
    """Followers first (by name), the leader last: one leadership change per group (pure)."""
    return sorted(group_members, key=lambda m: (m.name == leader, m.name))


def judge(steps: list[dict[str, Any]], gaps: dict[str, Any], lost: int) -> dict[str, Any]:
    """The targets, from the per-restart rows, the send gaps and the lost count (pure)."""
    leader_steps = [s for s in steps if s["was_leader"]]
    follower_steps = [s for s in steps if not s["was_leader"] and s.get("kind") != "namesrv"]
    out = {
        "lost": lost,
        "restarts": len(steps),
        "namesrv_restarts": sum(1 for s in steps if s.get("kind") == "namesrv"),
        "leader_restarts": len(leader_steps),
        "term_steps_max_per_leader_stop": max((s["term_steps"] for s in leader_steps), default=0),
        "term_steps_max_per_follower_stop": max((s["term_steps"] for s in follower_steps), default=0),
        "handed_over": sum(1 for s in leader_steps if s["handed_over"]),
        "worst_gap_ms": gaps["worst_gap_ms"],
        "worst_ack_ms": gaps["worst_ack_ms"],
        "sends_not_acked": gaps["not_acked"],
    }
    out["targets"] = {
        "no_acknowledged_lost": lost == 0,
        "one_change_per_leader_stop": out["term_steps_max_per_leader_stop"] <= 1
        and out["term_steps_max_per_follower_stop"] == 0,
        "no_send_failed": gaps["not_acked"] == 0,
        "gap_within_1s": gaps["worst_gap_ms"] <= GAP_TARGET_MS,
    }
    out["targets_met"] = all(out["targets"].values())
    return out


class RollingRestart:
    def __init__(self, opts: RollingOptions, out: Any = sys.stdout):
        self.opts = opts
        self.run = FleetRun(opts.fleet, "chaos rolling-restart", out)
        self.steps: list[dict[str, Any]] = []

    async def execute(self) -> int:
        run, o = self.run, self.opts
        fleet = o.fleet
        extra: dict[str, Any] = {"rolling": {"steady_s": o.steady_s, "transfer_first": o.transfer_first}}
        run.prepare()
        if o.upgrade_from:
            tree = os.path.join(run.dir, "old-tree")
            commit = old_tree(o.upgrade_from, tree)
            run.opts = dataclasses.replace(fleet, code_dir=tree)
            extra["upgrade"] = {"from": o.upgrade_from, "from_commit": commit, "old_tree": "old-tree"}
            run.say(f"upgrade drill: the cluster starts from {commit[:12]} ({tree}), restarts from {REPO}")
        try:
            await run.start(extra)
            await asyncio.sleep(o.steady_s)
            assert run.target is not None
            if o.roll_namesrv:  # NameServers first (RocketMQ's upgrade order): stateless, re-filled by registrations
                for ns in [p for p in load_processes(run.cluster_dir) if p.kind == "namesrv"]:
                    await self.restart_namesrv(ns)
                    await asyncio.sleep(o.steady_s)
            for group, members in sorted(groups_of(run.target.members()).items()):
                state = await run.group_state()
                for m in roll_order(members, state[group]["leader"]):
                    await self.restart(m)
                    await asyncio.sleep(o.steady_s)
            await run.wind_down()
            run.info["status"] = "done"
        finally:
            await run.close()
        check = run.check()
        gaps = send_gaps(read_sends(run.dir))
        verdict = judge(self.steps, gaps, check["acknowledged_lost"])
        run.info.update({"steps": self.steps, "send_gaps": gaps, "rolling_summary": verdict})
        rc = run.audit()
        run.write_run_json()
        t = verdict["targets"]
        run.say(
            f"rolling restart of {verdict['restarts']} replicas ({verdict['leader_restarts']} leaders, "
            f"{verdict['handed_over']} handed over): lost {verdict['lost']}; term steps per stopped leader "
            f"<= {verdict['term_steps_max_per_leader_stop']}, per stopped follower "
            f"<= {verdict['term_steps_max_per_follower_stop']}; worst send gap {verdict['worst_gap_ms']:.0f} ms "
            f"(slowest ack {verdict['worst_ack_ms']:.0f} ms); sends not acknowledged {verdict['sends_not_acked']}; "
            "targets " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in t.items())
        )
        return rc or (0 if verdict["targets_met"] else 1)

    async def restart(self, m: Member) -> None:
        run = self.run
        assert run.target is not None
        before = (await run.group_state())[m.group]
        was_leader = before["leader"] == m.name
        started = time.monotonic()
        run.fault("rolling-restart", "apply", (m.name,), {"was_leader": was_leader})
        handed_over = False
        if was_leader and self.opts.transfer_first:
            handed_over = await self.transfer(m)
        await run.cluster("stop", m.name)
        stopped_s = time.monotonic() - started
        start_args = ["start", m.name]
        if self.opts.upgrade_from:
            start_args += ["--code-dir", ""]  # back to this tree: the upgrade
        await run.cluster(*start_args)
        await run.caught_up(m)
        after = (await run.group_state())[m.group]
        if was_leader and not handed_over:
            handed_over = self.logged_hand_over(m)
        row = {"replica": m.name, "group": m.group, "was_leader": was_leader, "handed_over": handed_over,
               "leader_before": before["leader"], "leader_after": after["leader"],
               "term_before": before["term"], "term_after": after["term"],
               "term_steps": after["term"] - before["term"], "stop_s": round(stopped_s, 2),
               "restart_s": round(time.monotonic() - started, 2),
               "code": "new" if self.opts.upgrade_from else "same"}
        self.steps.append(row)
        run.fault("rolling-restart", "heal", (m.name,), {k: row[k] for k in ("term_steps", "leader_after")})
        run.say(f"restarted {m.name} ({'leader' if was_leader else 'follower'}"
                f"{', handed over' if handed_over else ''}): {row['leader_before']} -> {row['leader_after']}, "
                f"term {row['term_before']} -> {row['term_after']}, back in {row['restart_s']:.1f} s")

    async def restart_namesrv(self, ns: ProcessInfo) -> None:
        """Stop and start one NameServer, then wait until every live broker registered at it again."""
        run = self.run
        assert run.target is not None
        target = run.target
        started = time.monotonic()
        run.fault("rolling-restart", "apply", (ns.name,), {"kind": "namesrv"})
        await run.cluster("stop", ns.name)
        await run.cluster(*(["start", ns.name] + (["--code-dir", ""] if self.opts.upgrade_from else [])))
        addr = f"{ns.host}:{ns.http_port}"
        want = {m.control_addr for m in target.members()}
        t = Transport(timeout_s=2.0, credentials=target.credentials)
        try:
            async def registered() -> bool:
                try:
                    info = await NamesrvClient(addr, t).clusters(timeout_s=1.0)
                except ClientError:
                    return False
                return {a for bd in info.brokers.values() for a in bd.broker_addrs.values()} >= want

            await wait_for(registered, 120, f"every broker registered at {ns.name} again", 0.2)
        finally:
            await t.close()
        took = round(time.monotonic() - started, 2)
        self.steps.append({"replica": ns.name, "group": "-", "was_leader": False, "handed_over": False,
                           "kind": "namesrv", "term_steps": 0, "restart_s": took,
                           "code": "new" if self.opts.upgrade_from else "same"})
        run.fault("rolling-restart", "heal", (ns.name,), {"kind": "namesrv"})
        run.say(f"restarted {ns.name}: every broker registered there again after {took:.1f} s")

    def logged_hand_over(self, m: Member) -> bool:
        """Whether the stopped leader's log says it handed leadership over (broker/server/broker_server.py)."""
        assert self.run.target is not None
        try:
            with open(self.run.target.process(m).log, errors="replace") as f:
                return "handed leadership of term" in f.read()
        except OSError:
            return False

    async def transfer(self, m: Member) -> bool:
        """Ask ``m`` (the leader) to hand over, again while it refuses (its follower behind under load)."""
        assert self.run.target is not None
        target = self.run.target
        t = Transport(timeout_s=5.0, credentials=target.credentials)

        async def once() -> bool:
            try:
                await t.call(m.control_addr, "POST", "/v1/admin/transfer", {})
            except ClientError:  # refused (follower behind), or the answer was lost: did it move?
                st = await target.status(m)
                return st is not None and st.get("role") != "LEADER"
            return True

        try:
            return bool(await wait_for(once, TRANSFER_TRY_S, f"{m.name} to hand leadership over", 0.01))
        except TimeoutError:
            self.run.say(f"WARNING: {m.name} did not hand over within {TRANSFER_TRY_S:g} s: stopping it anyway")
            return False
        finally:
            await t.close()


def add_parser(sub: Any, bounded: Any, port_base: Any) -> None:
    p = sub.add_parser("rolling-restart",
                       help="restart every replica of every group in turn under load (optionally: an upgrade)")
    p.add_argument("--dir", required=True, help="the run directory (new or empty)")
    p.add_argument("--groups", type=bounded(int, 1, 9), default=2)
    add_load_arguments(p, bounded, consumers_min=0, steady_s=STEADY_S_DEFAULT, between="two restarts")
    p.add_argument("--upgrade-from", default=None, metavar="REV",
                   help="start the cluster from this git revision and restart every replica from this tree")
    p.add_argument("--transfer-first", action="store_true",
                   help="ask a leader to transfer leadership before stopping it (implied by --upgrade-from)")
    p.add_argument("--namesrv", type=bounded(int, 1, 5), default=1, help="NameServers (1)")
    p.add_argument("--roll-namesrv", action="store_true",
                   help="restart the NameServers too, first (each waits until every broker registered again)")
    add_run_arguments(p, port_base)


def run_from_args(args: argparse.Namespace) -> int:
    extra = {"registerNameServerPeriod": str(NAMESRV_REFILL_MS)} if args.roll_namesrv else {}
    fleet = FleetOptions(run_dir=args.dir, groups=args.groups, namesrv=args.namesrv, port_base=args.port_base,
                         producers=args.producers, consumers=args.consumers, rate=args.rate, audit=not args.no_audit,
                         seed=args.seed, extra=extra)
    opts = RollingOptions(fleet, steady_s=args.steady, upgrade_from=args.upgrade_from,
                          transfer_first=args.transfer_first or args.upgrade_from is not None,
                          roll_namesrv=args.roll_namesrv)
    try:
        return asyncio.run(RollingRestart(opts).execute())
    except UsageError as exc:
        print(f"chaos rolling-restart: {exc}", file=sys.stderr)
        return 2
