"""Kill a broker group's leader and restart it: the --kill-cmd / --restart-cmd that the wire tier's client
programs run mid-scenario.

    python tests/wire/leader.py kill    --ours DIR | --rocketmq CTL   --state FILE
    python tests/wire/leader.py restart --ours DIR | --rocketmq CTL   --state FILE

ours: the leader is the broker that ``dledger-cluster status --dir DIR --json`` reports as LEADER and writable;
it is killed with SIGKILL by that PID; restart is ``dledger-cluster start --dir DIR`` (restarts the recorded
processes that are not running). rocketmq: ``ctl.sh kill-leader`` / ``ctl.sh start NODE``. ``kill`` prints one
line (``killed leader NAME pid=PID at_ms=MS``) and records NAME in FILE; exit 1 when there is no leader."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dledger.apps.cluster", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def kill_ours(root: str) -> tuple[str, int]:
    r = _cluster("status", "--dir", root, "--json")
    procs = json.loads(r.stdout)["processes"] if r.stdout.strip() else []
    leaders = [p for p in procs if p.get("kind") == "broker" and p.get("alive") and p.get("role") == "LEADER"
               and p.get("writable")]
    if not leaders:
        raise SystemExit(f"no writable leader in `dledger-cluster status`: {r.stdout[-2000:]} {r.stderr[-2000:]}")
    p = leaders[0]
    with open(f"/proc/{p['pid']}/cmdline", "rb") as f:
        if root.encode() not in f.read():
            raise SystemExit(f"pid {p['pid']} is not a process of {root}")
    os.kill(int(p["pid"]), signal.SIGKILL)
    return str(p["name"]), int(p["pid"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["kill", "restart"])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--ours", metavar="DIR")
    where.add_argument("--rocketmq", metavar="CTL")
    ap.add_argument("--state", required=True)
    a = ap.parse_args()
    if a.action == "kill":
        if a.ours:
            name, pid = kill_ours(a.ours)
            line = f"killed leader {name} pid={pid} at_ms={int(time.time() * 1000)}"
        else:
            r = subprocess.run([a.rocketmq, "kill-leader"], capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                raise SystemExit(f"ctl.sh kill-leader failed: {r.stderr[-2000:]}")
            line = r.stdout.strip().splitlines()[-1]
            name = line.split()[2]                # "killed leader n2 127.0.0.1:20931 pid=.. at_ms=.."
        with open(a.state, "w") as f:
            f.write(name)
        print(line)
        return 0
    with open(a.state) as f:
        name = f.read().strip()
    if a.ours:
        r = _cluster("start", "--dir", a.ours)
    else:
        r = subprocess.run([a.rocketmq, "start", name], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"restart of {name} failed: {r.stdout[-1000:]} {r.stderr[-2000:]}")
    print(f"restarted {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
