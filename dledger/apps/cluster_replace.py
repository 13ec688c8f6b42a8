"""``dledger-cluster replace --dir DIR NAME``: replace one replica of a local cluster (issue 27 part 4).

NAME is a recorded process (``RaftNode00-n2``), typically dead (killed, its disk lost). The steps,
each one server at a time through the group's Raft log:

1. plan the new replica: the next free peer id of the group (``n3``, then ``n4``...), its Raft and
   client ports from the group's layout (raft base + 100 g + i, client base + 100 g + 10 i), its
   config: the group's config with the dead replica's ``dLegerPeers`` / ``brokerPeerClientAddrs``
   entries replaced in place (so the broker ids derived from the position in ``dLegerPeers`` stay
   what they were: the new replica takes the dead one's) and ``dLegerLearner=true``;
2. start it (it joins as a learner), and ask the leader to add it as a learner;
3. wait until it has caught up (its lag, from the leader's status, at most ``--max-lag`` entries);
4. promote it (the group has four voters, a majority of three: the three live ones), then remove
   the dead replica (three voters again);
5. rewrite the other replicas' configs the same way (for their next restart; the membership in
   force is in their logs and meta/membership either way) and cluster.json: the new process
   replaces the old one (recorded under ``replaced``), so ``status``, ``stop``, ``restart`` and
   ``down`` know it.

It prints the timings (``--json``: one document): seconds to catch up and in total, the log the
new replica received (entries, bytes). Exit codes as the tool's: 0 done, 1 a step failed (the
message says which, and what state the group is in), 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from typing import Any

from dledger.apps.cluster_plan import GROUP_PORT_STRIDE, ProcessInfo, group_number, port_clashes
from dledger.clock import SYSTEM

ID_RE = re.compile(r"n([0-9]+)")
MAX_REPLICAS_PER_GROUP = 10  # client ports are base + 100 g + 10 i: i stays below 10


class ReplaceError(Exception):
    """A step failed after the replacement started (exit 1)."""


def new_peer_id(members: list[ProcessInfo], replaced: list[dict[str, Any]], group: str) -> tuple[str, int]:
    """The group's next unused peer id ``n<i>`` and ``i`` (ids are never reused: a replaced one's
    log may still exist)."""
    used = [int(m.group(1)) for p in members if (m := ID_RE.fullmatch(p.node_id))]
    used += [
        int(m.group(1))
        for r in replaced
        if r.get("group") == group and (m := ID_RE.fullmatch(str(r.get("node_id", ""))))
    ]
    i = max(used, default=-1) + 1
    return f"n{i}", i


def swap_in_list(value: str, old_id: str, new_entry: str) -> str:
    """``id-host:port;...`` with ``old_id``'s entry replaced by ``new_entry`` in place."""
    items = [x.strip() for x in value.split(";") if x.strip()]
    out = [new_entry if x.partition("-")[0] == old_id else x for x in items]
    if out == items:
        out.append(new_entry)
    return ";".join(out)


def rewrite_conf(text: str, changes: dict[str, str], old_id: str, new_id: str, raft: str, client: str | None) -> str:
    """A config text with ``changes`` set and the peer lists swapped (pure)."""
    lines = []
    seen = set()
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        key = key.strip()
        if sep and not line.lstrip().startswith("#"):
            if key == "dLegerPeers":
                value = swap_in_list(value, old_id, f"{new_id}-{raft}")
            elif key == "brokerPeerClientAddrs" and client is not None:
                value = swap_in_list(value, old_id, f"{new_id}-{client}")
            if key in changes:
                value = changes[key]
                seen.add(key)
            line = f"{key}={value}"
        lines.append(line)
    lines += [f"{k}={v}" for k, v in changes.items() if k not in seen]
    return "\n".join(lines) + "\n"


def _membership_call(proc: ProcessInfo, root: str, body: dict[str, Any] | None, timeout_s: float = 15.0) -> Any:
    """POST (or GET, ``body`` None) the membership endpoint of ``proc``: ``/v1/membership`` on a
    bare node, ``/v1/admin/membership`` on a broker (signed with the cluster's admin account)."""
    if proc.kind == "node":
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"http://{proc.host}:{proc.http_port}/v1/membership",
            data=data,
            method="POST" if data is not None else "GET",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                err = json.loads(exc.read())
            except ValueError:
                err = {"code": str(exc.code), "message": exc.reason}
            raise ReplaceError(f"{err.get('code')}: {err.get('message')}") from None
    from broker.client.transport import ClientError, Transport, cluster_credentials

    async def call() -> Any:
        transport = Transport(timeout_s, credentials=cluster_credentials(root))
        try:
            return await transport.call(
                f"{proc.host}:{proc.http_port}", "POST" if body is not None else "GET", "/v1/admin/membership", body
            )
        finally:
            await transport.close()

    try:
        return asyncio.run(call())
    except ClientError as exc:
        raise ReplaceError(f"{exc.code}: {exc}") from None


def _status(proc: ProcessInfo) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://{proc.host}:{proc.http_port}/v1/status", timeout=2.0) as resp:
            st = json.loads(resp.read())
    except (OSError, urllib.error.URLError, ValueError):
        return None
    return st if isinstance(st, dict) else None


def _leader(procs: list[ProcessInfo], deadline: float) -> tuple[ProcessInfo, dict[str, Any]]:
    while True:
        for p in procs:
            st = _status(p)
            if st is not None and st.get("role") == "LEADER":
                return p, st
        if SYSTEM.monotonic() >= deadline:
            raise ReplaceError("the group has no leader")
        time.sleep(0.2)


def cmd_replace(args: argparse.Namespace, *, load_state: Any, save_state: Any, load_raw: Any,
                start_process: Any, is_running: Any, write_private: Any, usage_error: type[Exception]) -> int:
    root = os.path.abspath(args.dir)
    procs: list[ProcessInfo] = load_state(root)
    old = next((p for p in procs if p.name == args.name and p.kind != "namesrv"), None)
    if old is None:
        known = sorted(p.name for p in procs if p.kind != "namesrv")
        raise usage_error(f"unknown replica {args.name!r}; known: {', '.join(known)}")
    if is_running(old):
        raise usage_error(
            f"{old.name} is running (pid {old.pid}): stop or kill it first (replace swaps out a dead one)"
        )
    g = group_number(old.group)
    if g is None:
        raise usage_error(f"{old.group} is not a group this tool made")
    members = [p for p in procs if p.group == old.group and p.kind != "namesrv"]
    raw = load_raw(root)
    replaced_log: list[dict[str, Any]] = list(raw.get("replaced", []))
    new_id, i = new_peer_id(members, replaced_log, old.group)
    if args.new_id:
        if not ID_RE.fullmatch(args.new_id) or args.new_id in {p.node_id for p in members}:
            raise usage_error(f"--new-id {args.new_id!r} must be n<number>, not already a member")
        new_id, i = args.new_id, int(args.new_id[1:])
    if i >= MAX_REPLICAS_PER_GROUP:
        raise usage_error(f"{old.group} used every peer id n0..n{MAX_REPLICAS_PER_GROUP - 1}")
    settings = raw.get("settings") or {}
    raft_base, http_base = settings.get("raft_base"), settings.get("http_base")
    if not isinstance(raft_base, int) or not isinstance(http_base, int):
        raise usage_error(f"{root}/cluster.json records no port layout: replace needs a cluster made by `up`")
    raft_port = raft_base + GROUP_PORT_STRIDE * g + i
    http_port = http_base + GROUP_PORT_STRIDE * g + 10 * i
    name = f"{old.group}-{new_id}"
    info = ProcessInfo(
        name=name, group=old.group, node_id=new_id, pid=0, conf=os.path.join(root, "conf", f"{name}.conf"),
        host=old.host, raft_port=raft_port, http_port=http_port, log=os.path.join(root, "logs", f"{name}.log"),
        kind=old.kind, code_dir=old.code_dir,
    )
    clashes = port_clashes([p for p in procs if p is not old] + [info])
    if clashes:
        raise usage_error("the new replica's ports clash: " + "; ".join(clashes[:5]))
    raft_addr = f"{old.host}:{raft_port}"
    client_addr = f"{old.host}:{http_port}" if old.kind == "broker" else None
    with open(old.conf) as f:
        template = f.read()
    changes = {"dLegerSelfId": new_id, "listenPort": str(http_port), "dLegerLearner": "true"}
    write_private(info.conf, rewrite_conf(template, changes, old.node_id, new_id, raft_addr, client_addr))

    started = SYSTEM.monotonic()
    live = [p for p in members if p is not old]
    info.pid = start_process(info)
    save_state(root, [*procs, info])
    out: dict[str, Any] = {"replaced": old.name, "by": name, "peer_id": new_id, "raft_address": raft_addr}
    try:
        deadline = started + args.wait
        leader, _st = _leader(live, deadline)
        added = _membership_call(leader, root, {"op": "add_learner", "id": new_id, "address": raft_addr})
        added_at = int(added.get("index") or 0)  # the entry that made it a learner: the whole log before it
        out["learner_added_s"] = round(SYSTEM.monotonic() - started, 3)
        last_print = 0.0
        while True:  # caught up: the leader's view of its lag
            leader, st = _leader(live, deadline)
            peer = (st.get("peers") or {}).get(new_id) or {}
            lag, match = peer.get("lag"), peer.get("match_index") or 0
            if lag is not None and lag <= args.max_lag and match >= added_at and peer.get("connected"):
                break
            now = SYSTEM.monotonic()
            if now >= deadline:
                raise ReplaceError(f"{name} did not catch up within {args.wait} s (lag {lag})")
            if not args.json and now - last_print >= 5.0:
                print(f"  {name}: {lag if lag is not None else '?'} entries behind the leader "
                      f"(last index {st.get('last_index')})", flush=True)
                last_print = now
            time.sleep(0.2)
        out["caught_up_s"] = round(SYSTEM.monotonic() - started, 3)
        out["log_entries"] = st.get("last_index")
        while True:  # promote: retried while the leader finds it behind (writes go on meanwhile)
            leader, _st = _leader(live, deadline)
            try:
                _membership_call(leader, root, {"op": "promote", "id": new_id})
                break
            except ReplaceError as exc:
                if "LEARNER_NOT_CAUGHT_UP" not in str(exc) or SYSTEM.monotonic() >= deadline:
                    raise
            time.sleep(0.2)
        leader, _st = _leader([*live, info], deadline)
        answer = _membership_call(leader, root, {"op": "remove", "id": old.node_id})
        out["seconds"] = round(SYSTEM.monotonic() - started, 3)
        out["membership"] = {k: answer.get(k) for k in ("voters", "learners", "index")}
        out["log_bytes_received"] = (_status(info) or {}).get("bytes_stored")  # a bare node's status has it
    except ReplaceError as exc:
        print(f"dledger-cluster: replace {old.name}: {exc}; {name} stays recorded (pid {info.pid}); the group's "
              f"membership: GET /v1/status of a replica", file=sys.stderr)
        return 1
    # The run files: the new process instead of the old one; the others' configs for their restarts.
    for p in live:
        with open(p.conf) as f:
            text = f.read()
        write_private(p.conf, rewrite_conf(text, {}, old.node_id, new_id, raft_addr, client_addr))
    final = [*(p for p in procs if p is not old), info]
    entry = {**asdict(old), "replaced_by": name, "replaced_at": time.time()}
    _save_replaced(root, final, [*replaced_log, entry], save_state, load_raw, write_private)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"replaced {old.name} by {name} in {out['seconds']} s (caught up after {out['caught_up_s']} s, "
              f"{out['log_entries']} entries, {out['log_bytes_received']} bytes); voters now "
              f"{', '.join(sorted(out['membership']['voters'] or {}))}")
    return 0


def _save_replaced(root: str, procs: list[ProcessInfo], replaced: list[dict[str, Any]], save_state: Any,
                   load_raw: Any, write_private: Any) -> None:
    save_state(root, procs)
    raw = load_raw(root)
    raw["replaced"] = replaced
    write_private(os.path.join(root, "cluster.json"), json.dumps(raw, indent=2))
