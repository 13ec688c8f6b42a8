"""``python -m dledger.sim --seeds N --steps M``: run seeds, print failures with how to replay them.

    python -m dledger.sim --seeds 200 --steps 3000            # seeds 1..200
    python -m dledger.sim --seed 137 --steps 3000 --verbose   # replay one seed, bit for bit
    python -m dledger.sim --seeds 200 --plant vote-not-durable   # show a planted bug is caught
    python -m dledger.sim --seeds 50 --json                   # figures for docs/PERFORMANCE.md
    python -m dledger.sim --seeds 20 --membership             # membership changes under faults

Exit 0 when every seed passed (or, with --plant, when some seed caught the plant), 1 otherwise,
2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import sys
import time

from dledger.sim.plants import PLANT_OPTIONS, PLANTS, run_job
from dledger.sim.world import SimOptions


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dledger.sim", description=__doc__.split("\n")[0])
    group = p.add_mutually_exclusive_group()
    group.add_argument("--seeds", type=int, default=20, help="run seeds first..first+N-1 (default 20)")
    group.add_argument("--seed", type=int, help="run exactly this seed")
    p.add_argument("--first", type=int, default=1, help="first seed of --seeds (default 1)")
    p.add_argument("--steps", type=int, default=3000, help="events in the fault phase of each seed")
    p.add_argument("--nodes", type=int, default=3, help="replicas per group (default 3)")
    p.add_argument("--no-faults", action="store_true", help="no faults: only clocks, delays, a client")
    p.add_argument("--membership", action="store_true",
                   help="membership changes under faults (two spare replicas; issue 27); "
                   "a plant that needs it turns it on")
    p.add_argument("--plant", choices=sorted(PLANTS), help="plant a known bug (the run should then fail)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.add_argument("--verbose", action="store_true", help="log the replicas (one seed)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.nodes < 1 or args.jobs < 1 or (args.seed is None and args.seeds < 1):
        p.error("--steps, --nodes, --jobs and --seeds must be positive")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.CRITICAL, stream=sys.stderr)
    seeds = [args.seed] if args.seed is not None else list(range(args.first, args.first + args.seeds))
    membership = args.membership or bool(PLANT_OPTIONS.get(args.plant or "", {}).get("membership"))
    options = SimOptions(nodes=args.nodes, steps=args.steps, faults=not args.no_faults, membership=membership)
    started = time.monotonic()
    work = [(s, options, args.plant) for s in seeds]
    if args.jobs > 1 and len(seeds) > 1:
        with multiprocessing.get_context("spawn").Pool(min(args.jobs, len(seeds))) as pool:
            results = pool.map(run_job, work, chunksize=1)
    else:
        results = [run_job(w) for w in work]
    wall_s = time.monotonic() - started
    failed = [r for r in results if not r.ok]
    replay = "python -m dledger.sim --seed {} --steps {}" + (
        f" --nodes {args.nodes}" if args.nodes != 3 else ""
    )
    replay += " --membership" if membership and not args.plant else ""
    replay += f" --plant {args.plant}" if args.plant else ""
    for r in results if (args.verbose or len(results) == 1) else failed:
        print(r.line())
        if not r.ok:
            print("  replay: " + replay.format(r.seed, args.steps))
    summary = {
        "seeds": len(results),
        "failed": len(failed),
        "failed_seeds": [r.seed for r in failed],
        "first_failure": failed[0].error if failed else None,
        "plant": args.plant,
        "steps_per_seed": args.steps,
        "nodes": args.nodes,
        "wall_s": round(wall_s, 2),
        "seeds_per_minute": round(len(results) / wall_s * 60, 1) if wall_s else None,
        "sim_seconds": round(sum(r.sim_time_s for r in results), 1),
        "acked": sum(r.acked for r in results),
        "crashes": sum(r.crashes for r in results),
        "messages": sum(r.messages for r in results),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{len(results) - len(failed)}/{len(results)} seeds passed in {wall_s:.1f} s "
            f"({summary['seeds_per_minute']} seeds/min; {summary['sim_seconds']} simulated s, "
            f"{summary['acked']} acked, {summary['crashes']} crashes)"
            + (f"; plant {args.plant}: {'CAUGHT' if failed else 'NOT CAUGHT'}" if args.plant else "")
        )
    if args.plant:
        return 0 if failed else 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
