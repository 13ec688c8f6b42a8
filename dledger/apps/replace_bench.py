"""``python -m dledger.apps.replace_bench --log-mib 1024 [--json]``: how long replacing a replica takes
with a log of that size on this machine (issue 27 part 4's figure).

It starts a local 3-node group (``dledger-cluster up --kind node``, loopback, ports from
``--raft-port``/``--http-port``), fills the log with ``--log-mib`` MiB (appends of 64 x 16 KiB
bodies, 4 in flight), kills a follower (kill -9: its disk counts as lost), runs ``dledger-cluster
replace`` on it (a new replica joins as a learner, receives the whole log, is promoted, the dead one
removed), prints what ``replace`` measured (seconds to catch up, in total, bytes the new replica
received) and the fill time, and ends every process it started (``down``). Exit 0 when the
replacement succeeded, 1 otherwise, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp
import msgpack

BODY_BYTES = 16 << 10
BODIES_PER_APPEND = 64
IN_FLIGHT = 4


def _cluster(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dledger.apps.cluster", *args], capture_output=True, text=True,
                          timeout=timeout_s)


async def _fill(url: str, target_bytes: int) -> float:
    started = time.monotonic()
    sent = 0
    body = os.urandom(BODY_BYTES)
    payload = msgpack.packb({"bodies": [body] * BODIES_PER_APPEND})
    async with aiohttp.ClientSession() as http:

        async def one() -> None:
            nonlocal sent
            while sent < target_bytes:
                sent += BODY_BYTES * BODIES_PER_APPEND
                async with http.post(url, data=payload, headers={"Content-Type": "application/msgpack"},
                                     timeout=aiohttp.ClientTimeout(total=30)) as resp:
                    answer = await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"append answered {resp.status}: {answer[:300]!r}")

        await asyncio.gather(*(one() for _ in range(IN_FLIGHT)))
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dledger.apps.replace_bench", description=__doc__.split("\n")[0])
    p.add_argument("--log-mib", type=int, default=1024, help="MiB of log before the replacement (default 1024)")
    p.add_argument("--raft-port", type=int, default=44911)
    p.add_argument("--http-port", type=int, default=14911)
    p.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed after)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not 1 <= args.log_mib <= 64 << 10:
        p.error("--log-mib must be in 1..65536")
    root = args.dir or tempfile.mkdtemp(prefix="replace-bench-")
    out: dict[str, Any] = {"log_mib": args.log_mib}
    try:
        up = _cluster(["up", "--kind", "node", "--dir", root, "--raft-port", str(args.raft_port),
                       "--http-port", str(args.http_port), "--wait", "30", "--json"], 90)
        if up.returncode != 0:
            print(f"replace_bench: cluster up failed: {up.stderr[-500:]}", file=sys.stderr)
            return 1
        rows = json.loads(up.stdout)["processes"]
        leader = next(r for r in rows if r["role"] == "LEADER")
        follower = next(r for r in rows if r["role"] == "FOLLOWER")
        out["fill_s"] = round(asyncio.run(_fill(f"http://127.0.0.1:{leader['http_port']}/v1/append",
                                                args.log_mib << 20)), 3)
        killed = _cluster(["kill", "--dir", root, follower["name"]], 30)
        if killed.returncode != 0:
            print(f"replace_bench: kill failed: {killed.stderr}", file=sys.stderr)
            return 1
        replaced = _cluster(["replace", "--dir", root, follower["name"], "--json"], 3600)
        if replaced.returncode != 0:
            print(f"replace_bench: replace failed: {replaced.stderr[-1000:]}", file=sys.stderr)
            return 1
        out["replace"] = json.loads(replaced.stdout)
    finally:
        _cluster(["down", "--dir", root], 120)
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        r = out["replace"]
        print(f"{args.log_mib} MiB of log (filled in {out['fill_s']} s): replaced {r['replaced']} by {r['by']} in "
              f"{r['seconds']} s (caught up after {r['caught_up_s']} s, {r['log_bytes_received']} bytes received)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
