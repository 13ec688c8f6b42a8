"""``chaos grow-shrink``: add a broker group to a running cluster and extend the topic onto it, then
retire a group, all under load; drain and audit (docs/CHAOS.md, "Growing and shrinking";
docs/OPERATIONS.md, "Adding and retiring a group").

    up (G groups) ─▶ workload ─▶ steady
      ─▶ grow:   dledger-cluster add-group ─▶ the topic created on every group's leader again (as
                 `mqadmin updateTopic -c`) ─▶ an ack stored by the new group ─▶ a receipt from it
      ─▶ steady
      ─▶ shrink: `mqadmin wipeWritePerm -b R` at every NameServer ─▶ R's queues stop growing (the
                 producers' routes refresh) ─▶ the consumer group's lag on R is 0 ─▶
                 dledger-cluster remove-group R (each replica unregisters) ─▶ R gone from the routes
      ─▶ steady ─▶ wind down (drain the live groups) ─▶ down ─▶ audit

What is checked: every acknowledged send was received by a consumer or is in the final drain
(a retired group is not drained: its messages must have been consumed before it went), first by
the run itself, then by the audit (``lost``/``unseen``: the retired group's log is read from its
data, which stays under RUN_DIR/cluster/data/R). Exit code: the audit's (0 clean), 1 when
something acknowledged was not consumed; 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from typing import Any
from urllib.parse import quote

from broker.client.transport import ClientError, NamesrvClient, Transport
from chaos.fleet_base import FleetOptions, FleetRun, add_load_arguments, add_run_arguments
from chaos.target import REPO, LocalTarget, Member, find_leader, groups_of, wait_for
from chaos.workload import CONSUMER_GROUP, create_topic

STEADY_S_DEFAULT = 5.0
QUIET_S = 3.0  # past the producers' route refresh: a retired group's queues must stay still this long


@dataclasses.dataclass(frozen=True)
class GrowShrinkOptions:
    fleet: FleetOptions
    steady_s: float = STEADY_S_DEFAULT
    retire: str | None = None  # default: the first group (the one with the longest history)


async def group_queues(t: Transport, leader: Member, topic: str) -> dict[int, int]:
    """queue id -> max offset of ``topic`` on the group ``leader`` leads."""
    st = await t.call(leader.control_addr, "GET", f"/v1/topics/{quote(topic, safe='')}/status")
    return {int(q["queue_id"]): int(q["max_offset"]) for q in st["queues"]}


async def group_lag(t: Transport, leader: Member, group: str, topic: str) -> int:
    ans = await t.call(leader.control_addr, "GET", f"/v1/groups/{quote(group, safe='')}/progress",
                       params={"topic": topic})
    return int(ans["total_lag"])


class GrowShrink:
    def __init__(self, opts: GrowShrinkOptions, out: Any = sys.stdout):
        self.opts = opts
        self.run = FleetRun(opts.fleet, "chaos grow-shrink", out)
        self.timeline: dict[str, Any] = {}

    @property
    def target(self) -> LocalTarget:
        assert self.run.target is not None
        return self.run.target

    async def execute(self) -> int:
        run, o = self.run, self.opts
        run.prepare()
        try:
            await run.start({"grow_shrink": {"steady_s": o.steady_s}})
            await asyncio.sleep(o.steady_s)
            added = await self.grow()
            await asyncio.sleep(o.steady_s)
            retire = o.retire or sorted(groups_of(self.target.members()))[0]
            if retire == added:
                raise RuntimeError(f"retiring {retire}, the group just added, proves nothing: pick another")
            await self.shrink(retire)
            await asyncio.sleep(o.steady_s)
            await run.wind_down()
            run.info["status"] = "done"
        finally:
            run.info["grow_shrink"] = {"steady_s": o.steady_s, **self.timeline}
            await run.close()
        check = run.check()
        run.say(f"check: {check['acknowledged']} acknowledged, {check['acknowledged_lost']} neither received by a "
                f"consumer nor in the drain; {check['stored_twice_or_more']} unique ids drained more than once")
        rc = run.audit()
        run.write_run_json()
        return rc or (1 if check["acknowledged_lost"] else 0)

    async def grow(self) -> str:
        run = self.run
        before = set(groups_of(self.target.members()))
        t0 = time.monotonic()
        run.fault("add-group", "apply", ())
        await run.cluster("add-group", "--wait", "90", "--json")
        added = sorted(set(groups_of(self.target.members())) - before)[0]
        await create_topic(self.target, run.opts.topic, run.opts.queues)  # as `mqadmin updateTopic -c`
        members = groups_of(self.target.members())[added]
        t = Transport(timeout_s=5.0, credentials=self.target.credentials)
        try:
            lead_name = await wait_for(lambda: find_leader(self.target, members, writable=True), 30,
                                       f"a writable leader of {added}", 0.1)
            lead = next(m for m in members if m.name == lead_name)

            async def stored() -> bool:
                return sum((await group_queues(t, lead, run.opts.topic)).values()) > 0

            async def consumed() -> bool:
                ans = await t.call(lead.control_addr, "GET", "/v1/offsets", params={
                    "group": CONSUMER_GROUP, "topic": run.opts.topic})
                return any(int(v) > 0 for v in (ans.get("offsets") or {}).values())

            await wait_for(stored, 90, f"a send stored by {added}", 0.2)
            first_ack_s = time.monotonic() - t0
            await wait_for(consumed, 90, f"{CONSUMER_GROUP} committing an offset on {added}", 0.2)
            first_receipt_s = time.monotonic() - t0
        finally:
            await t.close()
        run.fault("add-group", "heal", (added,), {"first_ack_s": round(first_ack_s, 2)})
        self.timeline["added"] = {"group": added, "first_stored_s": round(first_ack_s, 2),
                                  "first_consumed_s": round(first_receipt_s, 2)}
        run.say(f"added {added}: first message stored there {first_ack_s:.1f} s after add-group, first offset "
                f"committed on it after {first_receipt_s:.1f} s")
        return added

    async def wipe_write_perm(self, group: str) -> None:
        """``mqadmin wipeWritePerm -b GROUP`` (every NameServer), as an operator runs it."""
        env = {**os.environ, "NAMESRV_ADDR": self.target.namesrv_addr,
               "DLEDGER_CREDENTIALS_FILE": os.path.join(self.run.cluster_dir, "admin-credentials.yml")}
        r = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "broker.tools.mqadmin", "wipeWritePerm",
                                                     "-b", group], capture_output=True, text=True, timeout=60,
                                    cwd=REPO, env=env, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"mqadmin wipeWritePerm -b {group} failed: {r.stderr.strip()[-500:]}")

    async def shrink(self, group: str) -> None:
        run, topic = self.run, self.run.opts.topic
        target = self.target
        members = groups_of(target.members())[group]
        t0 = time.monotonic()
        run.fault("retire-group", "apply", (group,), {"step": "wipeWritePerm"})
        await self.wipe_write_perm(group)
        t = Transport(timeout_s=5.0, credentials=target.credentials)
        try:
            async def leader() -> Member:
                name = await wait_for(lambda: find_leader(target, members, writable=True), 30,
                                      f"a writable leader of {group}", 0.1)
                return next(m for m in members if m.name == name)

            # quiet: no queue of the group grew for QUIET_S + the producers' route refresh
            quiet_s = QUIET_S + run.opts.route_refresh_s
            last: dict[int, int] = {}
            still_since = time.monotonic()

            async def quiet() -> bool:
                nonlocal last, still_since
                now = await group_queues(t, await leader(), topic)
                if now != last:
                    last, still_since = now, time.monotonic()
                return time.monotonic() - still_since >= quiet_s

            await wait_for(quiet, 120, f"{group}'s queues to stop growing", 0.5)
            quiet_at = time.monotonic() - t0

            async def drained() -> bool:
                try:
                    return await group_lag(t, await leader(), CONSUMER_GROUP, topic) == 0
                except ClientError:
                    return False

            await wait_for(drained, 120, f"{CONSUMER_GROUP}'s lag on {group} to reach 0", 0.5)
            drained_at = time.monotonic() - t0
            final = await group_queues(t, await leader(), topic)
            run.fault("retire-group", "apply", (group,), {"step": "remove-group", "max_offsets": final})
            await run.cluster("remove-group", group)
            ns = NamesrvClient(target.namesrv_addr, t)

            async def unrouted() -> bool:
                try:
                    route = await ns.route(topic, timeout_s=2.0)
                except ClientError:
                    return False
                return group not in {q.broker_name for q in route.queue_datas}

            await wait_for(unrouted, 60, f"{group} gone from the route of {topic}", 0.2)
        finally:
            await t.close()
        run.fault("retire-group", "heal", (group,), {"drained_s": round(drained_at, 2)})
        self.timeline["retired"] = {"group": group, "quiet_s": round(quiet_at, 2), "drained_s": round(drained_at, 2),
                                    "removed_s": round(time.monotonic() - t0, 2), "messages": sum(final.values())}
        run.say(f"retired {group}: writes stopped after {quiet_at:.1f} s, lag 0 after {drained_at:.1f} s, removed "
                f"after {time.monotonic() - t0:.1f} s ({sum(final.values())} messages, every one consumed)")


def add_parser(sub: Any, bounded: Any, port_base: Any) -> None:
    p = sub.add_parser("grow-shrink", help="add a group and extend the topic onto it, then retire a group, under load")
    p.add_argument("--dir", required=True, help="the run directory (new or empty)")
    p.add_argument("--groups", type=bounded(int, 2, 8), default=2, help="groups at the start (2)")
    p.add_argument("--retire", default=None, metavar="GROUP", help="the group to retire (default: the first)")
    add_load_arguments(p, bounded, consumers_min=1, steady_s=STEADY_S_DEFAULT, between="the steps")
    add_run_arguments(p, port_base)


def run_from_args(args: argparse.Namespace) -> int:
    fleet = FleetOptions(run_dir=args.dir, groups=args.groups, port_base=args.port_base, producers=args.producers,
                         consumers=args.consumers, rate=args.rate, audit=not args.no_audit, seed=args.seed)
    return asyncio.run(GrowShrink(GrowShrinkOptions(fleet, steady_s=args.steady, retire=args.retire)).execute())
