"""Kill a broker group's leader and restart it: the --kill-cmd / --restart-cmd that the wire tier's client
programs run mid-scenario.

    python tests/wire/leader.py kill    --ours DIR | --rocketmq CTL   --state FILE
    python tests/wire/leader.py restart --ours DIR | --rocketmq CTL   --state FILE

ours: the leader is the broker that ``dledger-cluster status --dir DIR --json`` reports as LEADER and writable;
it is killed with SIGKILL by that PID; restart is ``dledger-cluster start --dir DIR`` (restarts the recorded
processes that are not running). rocketmq: ``ctl.sh kill-leader`` / ``ctl.sh start NODE``. ``kill`` prints one
line (``killed leader NAME pid=PID at_ms=MS``) and records NAME in FILE; exit 1 when there is no leader.

``restart`` returns once the group is whole again, so that the next scenario does not meet the rejoin (a
restarted replica can still cause an election after its process is up): ours, every replica alive and
agreeing on one leader and term with a writable leader; rocketmq, clusterList (the reference's own mqadmin)
listing three replicas of the group with exactly one BID 0. At most 180 s, else exit 1."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

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


def ours_whole(root: str) -> tuple[bool, Any]:
    r = _cluster("status", "--dir", root, "--json")
    try:
        brokers = [p for p in json.loads(r.stdout)["processes"] if p.get("kind") == "broker"]
    except (ValueError, KeyError):
        return False, r.stdout[-500:] + r.stderr[-500:]
    leaders = {(p.get("leader_id"), p.get("term")) for p in brokers}
    ok = (all(p.get("alive") for p in brokers) and len(leaders) == 1
          and any(p.get("role") == "LEADER" and p.get("writable") for p in brokers))
    return ok, [(p["name"], p.get("alive"), p.get("role"), p.get("term"), p.get("leader_id")) for p in brokers]


def reference_whole(ctl: str) -> tuple[bool, Any]:
    r = subprocess.run([ctl, "mqadmin", "clusterList", "-n", "127.0.0.1:19876"], capture_output=True, text=True,
                       timeout=120)
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("RmqBench ")]
    bids = [row[2] for row in rows if len(row) > 3 and row[1] == "RaftNode00"]
    addrs = {row[3] for row in rows if len(row) > 3 and row[1] == "RaftNode00"}
    return len(addrs) == 3 and bids.count("0") == 1, rows


def wait_whole(check: Any, what: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        ok, state = check()
        if ok:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the group did not become whole within {timeout_s} s after restarting {what}: {state}")
        time.sleep(1)


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
    t0 = time.monotonic()
    if a.ours:
        wait_whole(lambda: ours_whole(a.ours), name)
    else:
        wait_whole(lambda: reference_whole(a.rocketmq), name)
    print(f"restarted {name}; group whole {time.monotonic() - t0:.1f} s after its start")
    return 0


if __name__ == "__main__":
    sys.exit(main())
