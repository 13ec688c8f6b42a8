"""``chaos replace``: replace a dead replica under load through a Raft membership change, lose the old
leader afterwards, then drain and audit (issue 27 part 4; docs/OPERATIONS.md, "Replacing a replica").

    up (1 group) ─▶ workload ─▶ kill -9 a follower (its disk counts as lost)
        ─▶ dledger-cluster replace (learner, catch-up, promote, remove) ─▶ steady load
        ─▶ kill -9 the old leader ─▶ a writable leader among the others (one of them the new
           replica) ─▶ steady load ─▶ start the old leader again (it rejoins as a voter)
        ─▶ wind down (drain) ─▶ down ─▶ audit

Each step is a fault record in the run's history (``replace-kill``, ``replace``, ``replace-kill-leader``),
so the audit covers a membership change under faults. Targets: 0 acknowledged messages lost (the
run's check, then the audit), the replacement done, a new leader after the old one died. Exit
code: the audit's (0 clean) or 1 when a target is missed; 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from chaos.fleet_base import FleetOptions, FleetRun, add_load_arguments, add_run_arguments
from chaos.target import groups_of, wait_for

STEADY_S_DEFAULT = 3.0


class ReplaceDrill:
    def __init__(self, fleet: FleetOptions, steady_s: float = STEADY_S_DEFAULT, out: Any = sys.stdout):
        self.run = FleetRun(fleet, "chaos replace", out)
        self.steady_s = steady_s

    async def execute(self) -> int:
        run = self.run
        run.prepare()
        summary: dict[str, Any] = {"replaced": None, "new_leader_after_kill": None}
        try:
            await run.start({"replace": {"steady_s": self.steady_s}})
            await asyncio.sleep(self.steady_s)  # load before the fault (the drill's pace, not a synchronisation)
            assert run.target is not None
            group, members = sorted(groups_of(run.target.members()).items())[0]
            leader = (await run.group_state())[group]["leader"]
            dead = next(m.name for m in members if m.name != leader)
            run.fault("replace-kill", "apply", (dead,), {"was_leader": False})
            await run.cluster("kill", dead)
            run.say(f"killed {dead} (kill -9; its disk counts as lost)")
            run.fault("replace", "apply", (dead,), {})
            r = await run.cluster("replace", dead, "--json", timeout_s=600)
            out = json.loads(r.stdout)
            summary["replaced"] = out
            run.fault("replace", "heal", (dead, out["by"]), {k: out.get(k) for k in ("seconds", "caught_up_s")})
            run.say(f"replaced {dead} by {out['by']} in {out['seconds']} s (caught up after {out['caught_up_s']} s)")
            await asyncio.sleep(self.steady_s)
            assert leader is not None
            run.fault("replace-kill-leader", "apply", (leader,), {})
            await run.cluster("kill", leader)

            async def new_leader() -> str | None:
                now = (await run.group_state())[group]["leader"]
                return now if now not in (None, leader) else None

            summary["new_leader_after_kill"] = await wait_for(new_leader, 60, "a writable leader after the kill", 0.1)
            run.say(f"killed the old leader {leader}: {summary['new_leader_after_kill']} leads")
            await asyncio.sleep(self.steady_s)
            await run.cluster("start", leader)
            run.fault("replace-kill-leader", "heal", (leader,), {})
            await run.caught_up(next(m for m in run.target.members() if m.name == leader))
            await run.wind_down()
            run.info["status"] = "done"
        finally:
            await run.close()
        check = run.check()
        lost = check["acknowledged_lost"]
        summary["lost"] = lost
        summary["targets"] = {
            "no_acknowledged_lost": lost == 0,
            "replaced": summary["replaced"] is not None,
            "new_leader": summary["new_leader_after_kill"] is not None,
        }
        run.info["replace_summary"] = summary
        rc = run.audit()
        run.write_run_json()
        run.say("replace drill: lost " + str(lost) + "; targets "
                + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in summary["targets"].items()))
        return rc or (0 if all(summary["targets"].values()) else 1)


def add_parser(sub: Any, bounded: Any, port_base: Any) -> None:
    p = sub.add_parser("replace", help="replace a dead replica under load, then lose the old leader; audit")
    p.add_argument("--dir", required=True, help="the run directory (new or empty)")
    add_load_arguments(p, bounded, consumers_min=0, steady_s=STEADY_S_DEFAULT, between="two steps")
    add_run_arguments(p, port_base)


def run_from_args(args: argparse.Namespace) -> int:
    fleet = FleetOptions(run_dir=args.dir, groups=1, namesrv=1, port_base=args.port_base, producers=args.producers,
                         consumers=args.consumers, rate=args.rate, audit=not args.no_audit, seed=args.seed)
    return asyncio.run(ReplaceDrill(fleet, steady_s=args.steady).execute())
