"""``dledger-cluster up|down|status|start|stop|kill|restart|add-group|remove-group|replace --dir DIR``: a
local cluster as processes on loopback.

By default (``--kind broker``) it runs ``--namesrv N`` NameServers (ports 9876, 9877, ...) and
``--groups G`` broker groups (``RaftNode00``, ``RaftNode01``, ...) of 3 replicas each, every broker
registering at every NameServer; ``--kind node`` runs bare dledger nodes instead. ``up`` writes one
RocketMQ-style properties file per process under DIR/conf, starts each as a detached process (logs
in DIR/logs), records the processes and the settings in DIR/cluster.json and waits until every
group has a leader that every replica knows (and, for brokers, that accepts writes).

Per process (names as ``status`` prints them, e.g. ``RaftNode01-n2``): ``stop`` sends SIGTERM (a
broker that leads hands leadership over first, then unregisters) and waits for the exit; ``kill``
sends SIGKILL (a crash); ``start`` starts recorded processes that are not running; ``restart`` is
stop + start and waits until the replica's group is healthy again. ``--code-dir`` on ``up``,
``start`` and ``restart`` runs the processes from another source tree (an older release during an
upgrade drill; ``--code-dir ''`` goes back to this one).

Per group: ``add-group`` plans the next group number (numbers are never reused), gives it an ACL
account, starts it and waits for its writable leader; ``remove-group GROUP`` stops its replicas
(each unregisters from the NameServers) and moves them to ``retired`` in cluster.json — its data
stays under DIR/data/GROUP. Retire a group only once it is drained (docs/OPERATIONS.md).

Per replica: ``replace NAME`` swaps a dead replica for a new one through the group's log (a learner
that catches up, is promoted, then the dead one removed; ``dledger/apps/cluster_replace.py``), and
records the new process in cluster.json in place of the old one.

``down`` ends exactly the processes it recorded (checking /proc/<pid>/cmdline, so a recycled pid is
never signalled). ``status`` asks each process; ``--json`` adds one summary per group.

Ports: ``dledger.apps.cluster_plan``. Exit codes: 0 ok, 1 the cluster (or group) did not become
healthy, 2 bad usage.

Security (docs/SECURITY.md): broker clusters run with ACL on unless ``--no-acl``. ``up`` writes
DIR/conf/plain_acl.yml (an admin account and one account per broker group, random secrets) and
DIR/admin-credentials.yml, which the tools read through ``DLEDGER_CREDENTIALS_FILE`` or
``--credentials``. Every file ``up`` writes is 0600 and every directory 0700; the processes run
with umask 077, so their data and logs are theirs alone too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from typing import Any

from dledger.apps.cluster_plan import (
    ACL_FILE,
    GROUPS_MAX,
    NAMESRV_MAX,
    NODES_PER_GROUP,
    ClusterAcl,
    ClusterSettings,
    ProcessInfo,
    acl_with_group,
    group_name,
    group_number,
    make_acl,
    new_broker_keys,
    node_conf_text,
    plan,
    plan_group,
    port_clashes,
    ports_of,
    skew_for,
)
from dledger.clock import SYSTEM
from dledger.cluster_id import new_cluster_id

__all__ = [
    "ACL_FILE", "ADMIN_CREDENTIALS_FILE", "NODES_PER_GROUP", "STATE_FILE", "ClusterAcl", "ClusterSettings",
    "ProcessInfo", "group_summaries", "healthy", "http_json", "is_running", "load_processes", "main", "make_acl",
    "node_conf_text", "node_status", "plan", "skew_for", "start_process", "stop_process", "write_private",
]

SKEW_ENV = "DLEDGER_CLOCK_SKEW"
STATE_FILE = "cluster.json"
STATE_VERSION = 2  # 1: {"processes"}; 2: + "settings", "retired"
ADMIN_CREDENTIALS_FILE = "admin-credentials.yml"
PROCESS_UMASK = 0o077


class UsageError(Exception):
    pass


def write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` as 0600 (created so: never readable by others, not even briefly)."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


# -- cluster.json ------------------------------------------------------------------------------------
def _load_raw(root: str) -> dict[str, Any]:
    try:
        with open(os.path.join(root, STATE_FILE)) as f:
            raw = json.load(f)
    except FileNotFoundError:
        return {}
    return raw if isinstance(raw, dict) else {}


def _load_state(root: str) -> list[ProcessInfo]:
    return [ProcessInfo(**p) for p in _load_raw(root).get("processes", [])]


def load_processes(root: str) -> list[ProcessInfo]:
    """The processes ``dledger-cluster`` recorded in ROOT/cluster.json ([] when none)."""
    return _load_state(os.path.abspath(root))


def _load_settings(root: str) -> ClusterSettings | None:
    raw = _load_raw(root).get("settings")
    return ClusterSettings.from_json(raw) if isinstance(raw, dict) else None


def _save_state(root: str, procs: list[ProcessInfo], *, settings: ClusterSettings | None = None,
                retired: list[dict[str, Any]] | None = None) -> None:
    """Write cluster.json; what is not given (settings, retired groups) is kept from the file."""
    old = _load_raw(root)
    state: dict[str, Any] = {"version": STATE_VERSION, "processes": [asdict(p) for p in procs]}
    if settings is not None:
        state["settings"] = settings.to_json()
    elif "settings" in old:
        state["settings"] = old["settings"]
    state["retired"] = retired if retired is not None else old.get("retired", [])
    if "replaced" in old:  # replicas swapped out by `replace` (issue 27): their ids are not reused
        state["replaced"] = old["replaced"]
    write_private(os.path.join(root, STATE_FILE), json.dumps(state, indent=2))


# -- processes ---------------------------------------------------------------------------------------
def is_running(proc: ProcessInfo) -> bool:
    """True when ``proc.pid`` is alive *and* is the node we started (not a recycled pid)."""
    try:
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            cmdline = f.read().split(b"\0")
        with open(f"/proc/{proc.pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z" and proc.conf.encode() in cmdline


_MODULES = {"node": "dledger.apps.node_server", "broker": "broker.server", "namesrv": "namesrv.server"}


def start_process(info: ProcessInfo, python: str = sys.executable) -> int:
    """Start ``info`` detached; from ``info.code_dir`` when set (its modules before this tree's)."""
    os.makedirs(os.path.dirname(info.log), mode=0o700, exist_ok=True)
    fd = os.open(info.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    env = dict(os.environ)
    env.pop(SKEW_ENV, None)
    if info.clock_skew:
        env[SKEW_ENV] = info.clock_skew
    cwd = None
    if info.code_dir:
        cwd = info.code_dir  # `python -m` puts the working directory first on sys.path
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [info.code_dir, env.get("PYTHONPATH")]))
    with os.fdopen(fd, "ab") as logf:
        child = subprocess.Popen(
            [python, "-m", _MODULES[info.kind], "-c", info.conf],
            env=env,
            cwd=cwd,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
            umask=PROCESS_UMASK,
        )
    return child.pid


def stop_process(proc: ProcessInfo, timeout_s: float = 15.0) -> None:
    """SIGTERM, wait up to ``timeout_s`` (a broker leader hands over, then unregisters), then SIGKILL."""
    if not is_running(proc):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    deadline = SYSTEM.monotonic() + timeout_s
    while is_running(proc) and SYSTEM.monotonic() < deadline:
        time.sleep(0.05)
    if is_running(proc):
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)


def kill_process(proc: ProcessInfo, timeout_s: float = 10.0) -> None:
    if not is_running(proc):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGKILL)
    deadline = SYSTEM.monotonic() + timeout_s
    while is_running(proc) and SYSTEM.monotonic() < deadline:
        time.sleep(0.02)


def http_json(host: str, port: int, path: str, timeout_s: float = 1.0, data: bytes | None = None) -> Any:
    req = urllib.request.Request(
        f"http://{host}:{port}{path}", data=data, method="POST" if data is not None else "GET"
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def node_status(proc: ProcessInfo) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": proc.name,
        "group": proc.group,
        "node_id": proc.node_id,
        "pid": proc.pid,
        "host": proc.host,
        "raft_port": proc.raft_port,
        "http_port": proc.http_port,
        "kind": proc.kind,
        "alive": is_running(proc),
        "role": None,
        "term": None,
        "leader_id": None,
        "commit_index": None,
    }
    if proc.code_dir:
        row["code_dir"] = proc.code_dir
    if row["alive"]:
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            st = http_json(proc.host, proc.http_port, "/v1/status")
            if proc.kind == "namesrv":
                row["role"] = "NAMESRV"
            else:
                row.update({k: st.get(k) for k in ("role", "term", "leader_id", "commit_index")})
                if proc.kind == "broker":
                    row["writable"] = st.get("writable")
                    row["applied_index"] = st.get("applied_index")
    return row


def _by_group(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("kind") != "namesrv":
            groups.setdefault(r["group"], []).append(r)
    return groups


def group_healthy(members: list[dict[str, Any]]) -> bool:
    """Exactly one leader, every replica names it, and (brokers) it accepts writes."""
    leaders = [r for r in members if r["role"] == "LEADER"]
    if len(leaders) != 1:
        return False
    if any(r["leader_id"] != leaders[0]["node_id"] for r in members):
        return False
    return not (leaders[0].get("kind") == "broker" and not leaders[0].get("writable"))


def healthy(rows: list[dict[str, Any]]) -> bool:
    """Every NameServer answers and every group is healthy (``group_healthy``)."""
    if any(r.get("kind") == "namesrv" and r["role"] != "NAMESRV" for r in rows):
        return False
    return all(group_healthy(members) for members in _by_group(rows).values())


def group_summaries(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per group (pure): its leader, term, whether it is writable and healthy, replicas alive."""
    out = []
    for group, members in sorted(_by_group(rows).items()):
        leaders = [r for r in members if r["role"] == "LEADER"]
        top = max(leaders, key=lambda r: r["term"] or 0) if leaders else None
        out.append({
            "group": group,
            "leader": top["name"] if top else None,
            "term": top["term"] if top else max((r["term"] or 0 for r in members), default=None),
            "writable": bool(top and top.get("writable")) if members[0].get("kind") == "broker" else None,
            "alive": sum(1 for r in members if r["alive"]),
            "replicas": len(members),
            "healthy": group_healthy(members),
        })
    return out


def wait_healthy(procs: list[ProcessInfo], timeout_s: float) -> list[dict[str, Any]]:
    deadline = SYSTEM.monotonic() + timeout_s
    rows = [node_status(p) for p in procs]
    while not healthy(rows) and SYSTEM.monotonic() < deadline:
        time.sleep(0.2)
        rows = [node_status(p) for p in procs]
    return rows


def ports_in_use(procs: list[ProcessInfo]) -> list[str]:
    """The planned ports something already listens on (a cluster left running, another service)."""
    busy = []
    for p in procs:
        for port in ports_of(p):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
                try:
                    sock.bind((p.host, port))
                except OSError:
                    busy.append(f"{p.host}:{port} ({p.name})")
    return busy


def _code_dir(arg: str | None) -> str | None:
    """``--code-dir``: None = unchanged, "" = this tree, else an existing tree with the packages."""
    if arg is None or arg == "":
        return arg
    path = os.path.abspath(arg)
    if not all(os.path.isdir(os.path.join(path, pkg)) for pkg in ("dledger", "broker", "namesrv")):
        raise UsageError(f"--code-dir {path}: not a dledger-mq source tree (needs dledger/, broker/, namesrv/)")
    return path


# -- commands ----------------------------------------------------------------------------------------
def _cluster_id_for(root: str, extra: dict[str, str], code_dir: str) -> str:
    """The cluster's id: ``--set clusterId=...``, else the one this directory already has (an ``up``
    after ``down`` keeps it: the data directories recorded it), else a new one. None ("") when the
    cluster starts from an older release (``--code-dir``): its config parser refuses unknown keys."""
    if "clusterId" in extra:
        return extra["clusterId"]
    previous = _load_settings(root)
    if previous is not None and previous.cluster_id:
        return previous.cluster_id
    return "" if code_dir else new_cluster_id()


def cmd_up(args: argparse.Namespace) -> int:
    root = os.path.abspath(args.dir)
    running = [p for p in _load_state(root) if is_running(p)]
    if running:
        raise UsageError(
            f"a cluster is already running from {root} ({len(running)} processes); run 'down' first"
        )
    extra = dict(kv.split("=", 1) for kv in args.set or [])
    acl = make_acl(root, args.groups) if args.kind == "broker" and not args.no_acl else None
    code_dir = _code_dir(args.code_dir) or ""
    cluster_id = _cluster_id_for(root, extra, code_dir)
    settings = ClusterSettings(kind=args.kind, host=args.host, raft_base=args.raft_port, http_base=args.http_port,
                               namesrv_base=args.namesrv_port, namesrv=args.namesrv, flush=args.flush, extra=extra,
                               acl=acl is not None, cluster_id=cluster_id)
    planned = plan(
        root, args.groups, args.host, args.raft_port, args.http_port, args.flush, extra,
        kind=args.kind, namesrv=args.namesrv, namesrv_base=args.namesrv_port, acl=acl, cluster_id=cluster_id,
    )
    clashes = port_clashes([p for p, _ in planned])
    if clashes:
        raise UsageError("the port layout clashes: " + "; ".join(clashes[:5]))
    busy = ports_in_use([p for p, _ in planned])
    if busy:
        raise UsageError("ports already in use: " + ", ".join(busy[:5]) + " (another cluster? pick other bases)")
    os.makedirs(root, mode=0o700, exist_ok=True)
    os.chmod(root, 0o700)  # configs hold the peer password and secrets; data and logs are private
    if acl is not None:
        write_private(acl.path, acl.text())
        write_private(os.path.join(root, ADMIN_CREDENTIALS_FILE), acl.admin_text())
    procs = []
    for k, (info, text) in enumerate(planned):
        if args.clock_skew and info.kind != "namesrv":
            info.clock_skew = skew_for(k)
        info.code_dir = code_dir
        write_private(info.conf, text)
        info.pid = start_process(info)
        procs.append(info)
    _save_state(root, procs, settings=settings, retired=[])
    rows = wait_healthy(procs, args.wait)
    print_rows(rows, args.json)
    if acl is not None and not args.json:
        creds = os.path.join(root, ADMIN_CREDENTIALS_FILE)
        print(f"ACL on; admin credentials in {creds}: export DLEDGER_CREDENTIALS_FILE={creds}")
    if not healthy(rows):
        print(
            f"dledger-cluster: the cluster did not elect leaders within {args.wait} s; see {root}/logs",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    root = os.path.abspath(args.dir)
    procs = _load_state(root)
    for p in procs:
        stop_process(p)
    print(f"stopped {len(procs)} process(es) from {root}")
    return 0


def _recorded(root: str) -> list[ProcessInfo]:
    procs = _load_state(root)
    if not procs:
        raise UsageError(f"no cluster recorded in {root}")
    return procs


def _named(procs: list[ProcessInfo], names: list[str]) -> list[ProcessInfo]:
    known = {p.name for p in procs}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown process name(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return [p for p in procs if p.name in names]


def cmd_start(args: argparse.Namespace) -> int:
    """Start recorded processes that are not running (a replica killed in a failover drill)."""
    root = os.path.abspath(args.dir)
    procs = _recorded(root)
    chosen = _named(procs, args.names) if args.names else procs
    code_dir = _code_dir(args.code_dir)
    started = []
    for p in chosen:
        if code_dir is not None and not is_running(p):
            p.code_dir = code_dir
        if not is_running(p):
            p.pid = start_process(p)
            started.append(p.name)
    _save_state(root, procs)
    print(f"started {', '.join(started) if started else 'nothing (all running)'}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    """SIGTERM each named process in turn and wait for its exit (a broker leader hands over first)."""
    root = os.path.abspath(args.dir)
    chosen = _named(_recorded(root), args.names)
    for p in chosen:
        (kill_process if args.command == "kill" else stop_process)(p)
    verb = "killed" if args.command == "kill" else "stopped"
    print(f"{verb} {', '.join(p.name for p in chosen)}")
    return 0


def cmd_restart(args: argparse.Namespace) -> int:
    """Per named process, in turn: stop (graceful), start (from ``--code-dir`` if given), and wait
    until its group is healthy again before the next one."""
    root = os.path.abspath(args.dir)
    procs = _recorded(root)
    chosen = _named(procs, args.names)
    code_dir = _code_dir(args.code_dir)
    for p in chosen:
        stop_process(p)
        if code_dir is not None:
            p.code_dir = code_dir
        p.pid = start_process(p)
        _save_state(root, procs)
        group = [q for q in procs if q.group == p.group or q.kind == "namesrv"]
        rows = wait_healthy(group, args.wait)
        if not healthy(rows):
            print_rows(rows, False)
            print(f"dledger-cluster: {p.group} did not become healthy within {args.wait} s after restarting "
                  f"{p.name}; see {root}/logs", file=sys.stderr)
            return 1
        print(f"restarted {p.name} (pid {p.pid}{', from ' + p.code_dir if p.code_dir else ''}); {p.group} healthy")
    return 0


def cmd_add_group(args: argparse.Namespace) -> int:
    """Plan, configure and start the next broker group, and wait for its writable leader."""
    root = os.path.abspath(args.dir)
    procs = _recorded(root)
    settings = _load_settings(root)
    if settings is None:
        raise UsageError(f"{root}/{STATE_FILE} records no settings (a cluster from an older dledger-cluster, or a "
                         "chaos run): add-group needs a cluster started by this version's `up`")
    retired = _load_raw(root).get("retired", [])
    used = [group_number(p.group) for p in procs if p.kind != "namesrv"]
    used += [group_number(str(r.get("group", ""))) for r in retired]
    g = max((n for n in used if n is not None), default=-1) + 1
    if g >= GROUPS_MAX:
        raise UsageError(f"group numbers go up to {GROUPS_MAX - 1}; this cluster used them all")
    group = group_name(g)
    acl_path = os.path.join(root, ACL_FILE) if settings.acl else None
    keys = new_broker_keys(group) if acl_path else None
    planned = plan_group(root, settings, g, password=secrets.token_hex(16), acl_path=acl_path, broker_keys=keys)
    clashes = port_clashes(procs + [p for p, _ in planned])
    if clashes:
        raise UsageError(f"{group} would clash: " + "; ".join(clashes[:5]))
    busy = ports_in_use([p for p, _ in planned])
    if busy:
        raise UsageError(f"{group}'s ports are in use: " + ", ".join(busy[:5]))
    if acl_path is not None and keys is not None:
        with open(acl_path) as f:
            acl_text = f.read()
        try:
            write_private(acl_path, acl_with_group(acl_text, group, keys))
        except ValueError as exc:
            raise UsageError(f"{acl_path}: {exc}") from None
    code_dir = _code_dir(args.code_dir) or ""
    new = []
    for info, text in planned:
        info.code_dir = code_dir
        write_private(info.conf, text)
        info.pid = start_process(info)
        new.append(info)
        _save_state(root, procs + new)
    namesrvs = [p for p in procs if p.kind == "namesrv"]
    rows = wait_healthy(namesrvs + new, args.wait)
    print_rows(rows, args.json)
    if not healthy(rows):
        print(f"dledger-cluster: {group} did not elect a writable leader within {args.wait} s; see {root}/logs",
              file=sys.stderr)
        return 1
    if not args.json:
        print(f"added {group}; extend topics onto it: mqadmin updateTopic -c <cluster> -t <topic> ...")
    return 0


def cmd_remove_group(args: argparse.Namespace) -> int:
    """Stop a group's replicas (each unregisters) and record the group as retired; its data stays."""
    root = os.path.abspath(args.dir)
    procs = _recorded(root)
    members = [p for p in procs if p.group == args.group and p.kind != "namesrv"]
    if not members:
        groups = sorted({p.group for p in procs if p.kind != "namesrv"})
        raise UsageError(f"no group {args.group!r}; groups: {', '.join(groups)}")
    if len({p.group for p in procs if p.kind != "namesrv"}) == 1:
        raise UsageError(f"{args.group} is the cluster's only group: use `down`")
    followers_first = sorted(members, key=lambda p: node_status(p).get("role") == "LEADER")
    for p in followers_first:
        stop_process(p)
    retired = list(_load_raw(root).get("retired", []))
    retired.append({"group": args.group, "data": os.path.join(root, "data", args.group),
                    "processes": [asdict(p) for p in members], "retired_at": time.time()})
    _save_state(root, [p for p in procs if p not in members], retired=retired)
    print(f"removed {args.group}: stopped {', '.join(p.name for p in members)}; its data stays in "
          f"{os.path.join(root, 'data', args.group)}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    root = os.path.abspath(args.dir)
    rows = [node_status(p) for p in _recorded(root)]
    retired = [str(r.get("group")) for r in _load_raw(root).get("retired", [])]
    print_rows(rows, args.json, retired=retired)
    return 0 if healthy(rows) else 1


def print_rows(rows: list[dict[str, Any]], as_json: bool, *, retired: list[str] | None = None) -> None:
    if as_json:
        print(json.dumps({"processes": rows, "groups": group_summaries(rows), "retired": retired or []}, indent=2))
        return
    cols = ["name", "pid", "alive", "raft_port", "http_port", "role", "term", "leader_id", "commit_index"]
    table = [cols] + [[str(r[c]) if r.get(c) is not None else "-" for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    if retired:
        print(f"retired groups (data kept): {', '.join(retired)}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dledger-cluster", description="Run a local dledger cluster on loopback."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the processes and wait for leaders")
    up.add_argument("--dir", required=True)
    up.add_argument("--groups", type=int, default=1, help=f"broker groups RaftNode00.. (1..{GROUPS_MAX})")
    up.add_argument("--kind", choices=["broker", "node"], default="broker",
                    help="broker groups with NameServers (default) or bare dledger nodes")
    up.add_argument("--namesrv", type=int, default=1, help=f"NameServers to run (broker kind, 1..{NAMESRV_MAX})")
    up.add_argument("--namesrv-port", type=int, default=9876)
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--raft-port", type=int, default=40911)
    up.add_argument("--http-port", type=int, default=10911)
    up.add_argument("--flush", choices=["sync", "async"], default="sync")
    up.add_argument("--wait", type=float, default=20.0, help="seconds to wait for leaders")
    up.add_argument("--set", action="append", metavar="KEY=VALUE", help="extra properties for every node")
    up.add_argument("--json", action="store_true")
    up.add_argument("--code-dir", default=None, metavar="DIR",
                    help="run every process from this source tree (e.g. an older release) instead of this one")
    up.add_argument(
        "--clock-skew",
        action="store_true",
        help="run each replica on a clock of its own (hours apart, drifting +-500 ppm): a test of the one-clock rule",
    )
    up.add_argument("--no-acl", action="store_true",
                    help="run the broker cluster without ACL (every request allowed; not for shared hosts)")
    down = sub.add_parser("down", help="stop the processes recorded in DIR")
    down.add_argument("--dir", required=True)
    start = sub.add_parser("start", help="start recorded processes that are not running (all, or NAMEs)")
    start.add_argument("--dir", required=True)
    start.add_argument("names", nargs="*", metavar="NAME", help="e.g. RaftNode00-n1 (see status)")
    start.add_argument("--code-dir", default=None, metavar="DIR", help="start them from this source tree ('' = this)")
    for verb, text in (("stop", "SIGTERM the named processes and wait (a broker leader hands over first)"),
                       ("kill", "SIGKILL the named processes (a crash)")):
        p = sub.add_parser(verb, help=text)
        p.add_argument("--dir", required=True)
        p.add_argument("names", nargs="+", metavar="NAME")
    restart = sub.add_parser("restart", help="stop and start each named process in turn, waiting for its group")
    restart.add_argument("--dir", required=True)
    restart.add_argument("names", nargs="+", metavar="NAME")
    restart.add_argument("--code-dir", default=None, metavar="DIR",
                         help="start them from this source tree ('' = this one): a rolling upgrade")
    restart.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the group (60)")
    add = sub.add_parser("add-group", help="start one more broker group and wait for its writable leader")
    add.add_argument("--dir", required=True)
    add.add_argument("--wait", type=float, default=60.0)
    add.add_argument("--json", action="store_true")
    add.add_argument("--code-dir", default=None, metavar="DIR")
    rm = sub.add_parser("remove-group", help="stop a (drained) group's replicas; its data is kept")
    rm.add_argument("--dir", required=True)
    rm.add_argument("group", metavar="GROUP", help="e.g. RaftNode01")
    rep = sub.add_parser("replace", help="replace a (dead) replica by a new one: learner, catch-up, swap (issue 27)")
    rep.add_argument("--dir", required=True)
    rep.add_argument("name", metavar="NAME", help="the replica to replace, e.g. RaftNode00-n2 (not running)")
    rep.add_argument("--new-id", default=None, help="the new replica's peer id (default: the group's next, n3...)")
    rep.add_argument("--max-lag", type=int, default=1000, help="entries behind the leader that count as caught up")
    rep.add_argument("--wait", type=float, default=3600.0, help="seconds for the whole replacement (3600)")
    rep.add_argument("--json", action="store_true")
    status = sub.add_parser("status", help="role, term and commit index of every process")
    status.add_argument("--dir", required=True)
    status.add_argument("--json", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "up":
            if not 1 <= args.groups <= GROUPS_MAX:
                raise UsageError(f"--groups must be in 1..{GROUPS_MAX}")
            if not 1 <= args.namesrv <= NAMESRV_MAX:
                raise UsageError(f"--namesrv must be in 1..{NAMESRV_MAX}")
            if any("=" not in kv for kv in args.set or []):
                raise UsageError("--set takes KEY=VALUE")
            return cmd_up(args)
        if args.command == "replace":
            from dledger.apps.cluster_replace import cmd_replace

            return cmd_replace(
                args, load_state=_load_state, save_state=_save_state, load_raw=_load_raw,
                start_process=start_process, is_running=is_running, write_private=write_private,
                usage_error=UsageError,
            )
        commands = {"down": cmd_down, "start": cmd_start, "stop": cmd_stop, "kill": cmd_stop,
                    "restart": cmd_restart, "add-group": cmd_add_group, "remove-group": cmd_remove_group}
        return commands.get(args.command, cmd_status)(args)
    except UsageError as exc:
        print(f"dledger-cluster: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
