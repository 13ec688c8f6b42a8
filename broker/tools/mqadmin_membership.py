"""``mqadmin`` commands on a broker group's Raft membership (issue 27 part 4): getReplicas,
addLearner, promoteLearner, removeReplica, replaceReplica. Each change goes to the group's leader
(``POST /v1/admin/membership``, admin account), one server at a time through the log; the broker
refuses with a coded error (``MEMBERSHIP_CHANGE_PENDING``, ``REMOVE_LEADER``,
``LEARNER_NOT_CAUGHT_UP``, ``NOT_A_LEARNER``, ...), which the tool prints with exit code 1; bad
arguments exit 2. docs/OPERATIONS.md "Replacing a replica" walks through a replacement."""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from typing import Any

from broker.client.admin import Admin
from broker.client.admin_checks import answers_checked
from broker.client.admin_records import InvalidArgument
from broker.client.transport import ClientError
from broker.tools.mqadmin_format import Output, format_kv, format_table

PEER_ID_RE = re.compile(r"[a-zA-Z0-9_]{1,64}")
HOST_PORT_RE = re.compile(r"[A-Za-z0-9.\-\[\]:]{1,250}:[0-9]{1,5}")


def _check_id(value: str, what: str) -> str:
    if not PEER_ID_RE.fullmatch(value or ""):
        raise InvalidArgument("INVALID_PEER_ID", f"{what} {value!r} must be 1..64 characters of [a-zA-Z0-9_]")
    return value


def _check_addr(value: str) -> str:
    if not HOST_PORT_RE.fullmatch(value or "") or not 0 < int(value.rpartition(":")[2]) < 65536:
        raise InvalidArgument("INVALID_ADDRESS", f"raft address {value!r} must be host:port")
    return value


async def _group(admin: Admin, broker_name: str) -> Any:
    if not PEER_ID_RE.fullmatch(broker_name.replace("-", "_")):
        raise InvalidArgument("INVALID_BROKER_NAME", f"broker name {broker_name!r} is not valid")
    bd = (await admin.namesrv.clusters()).brokers.get(broker_name)
    if bd is None:
        raise ClientError("BROKER_NOT_EXIST", f"no broker group {broker_name!r} is registered", status=404)
    return bd


@answers_checked
async def leader_status(admin: Admin, broker_name: str) -> tuple[dict[str, Any], str]:
    """The leader's ``/v1/status`` (it knows each member's match index) and its address."""
    bd = await _group(admin, broker_name)
    addrs = [a for _bid, a in sorted(bd.broker_addrs.items())]
    last: ClientError | None = None
    for addr in addrs:
        try:
            st = await admin.transport.call(addr, "GET", "/v1/status")
        except ClientError as exc:
            last = exc
            continue
        if isinstance(st, dict) and st.get("role") == "LEADER":
            return st, addr
    raise last or ClientError("NO_LEADER", f"no replica of {broker_name} says it leads", status=503)


@answers_checked
async def change(admin: Admin, broker_name: str, body: dict[str, Any]) -> dict[str, Any]:
    bd = await _group(admin, broker_name)
    answer, _addr = await admin.write(bd, "POST", "/v1/admin/membership", body)
    return dict(answer)


def replicas_rows(status: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per member: id, role, raft address, match index, lag (from the leader's status)."""
    m = status.get("membership") or {}
    rows = [
        {
            "id": status.get("self_id"),
            "role": "voter (leader)",
            "address": (m.get("voters") or {}).get(status.get("self_id")),
            "match_index": status.get("last_index"),
            "lag": 0,
            "connected": True,
        }
    ]
    for pid, p in sorted((status.get("peers") or {}).items()):
        rows.append(
            {
                "id": pid,
                "role": p.get("role"),
                "address": p.get("address"),
                "match_index": p.get("match_index"),
                "lag": p.get("lag"),
                "connected": p.get("connected"),
            }
        )
    return rows


def _membership_output(broker_name: str, status: dict[str, Any]) -> Output:
    m = status.get("membership") or {}
    rows = replicas_rows(status)
    text = format_table(
        ["Id", "Role", "Raft Address", "Match Index", "Lag", "Connected"],
        [(r["id"], r["role"], r["address"], r["match_index"], r["lag"], r["connected"]) for r in rows],
    )
    text += "\n" + format_kv(
        [
            ("membership index", m.get("index")),
            ("committed", m.get("committed")),
            ("source", m.get("source")),
        ]
    )
    return Output({"broker_name": broker_name, "membership": m, "replicas": rows}, text)


async def run_get_replicas(admin: Admin, args: argparse.Namespace) -> Output:
    status, _addr = await leader_status(admin, args.broker_name)
    return _membership_output(args.broker_name, status)


async def run_add_learner(admin: Admin, args: argparse.Namespace) -> Output:
    body = {"op": "add_learner", "id": _check_id(args.id, "id"), "address": _check_addr(args.address)}
    return _change_output(args.broker_name, await change(admin, args.broker_name, body))


async def run_promote_learner(admin: Admin, args: argparse.Namespace) -> Output:
    peer_id = _check_id(args.id, "id")
    answer = await _promote_when_caught_up(admin, args.broker_name, peer_id, args.wait)
    return _change_output(args.broker_name, answer)


async def run_remove_replica(admin: Admin, args: argparse.Namespace) -> Output:
    body = {"op": "remove", "id": _check_id(args.id, "id")}
    return _change_output(args.broker_name, await change(admin, args.broker_name, body))


async def run_replace_replica(admin: Admin, args: argparse.Namespace) -> Output:
    """Promote the caught-up learner ``--new`` (waiting up to ``--wait`` s for it), then remove
    ``--old``: the group has 4 voters between the two (a majority of 3 of them), never 2."""
    old, new = _check_id(args.old, "old id"), _check_id(args.new, "new id")
    if old == new:
        raise InvalidArgument("INVALID_PEER_ID", "--old and --new must differ")
    started = time.monotonic()
    await _promote_when_caught_up(admin, args.broker_name, new, args.wait)
    answer = await change(admin, args.broker_name, {"op": "remove", "id": old})
    answer["seconds"] = round(time.monotonic() - started, 3)
    return _change_output(args.broker_name, answer)


async def _promote_when_caught_up(admin: Admin, broker_name: str, peer_id: str, wait_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return await change(admin, broker_name, {"op": "promote", "id": peer_id})
        except ClientError as exc:
            if exc.code not in ("LEARNER_NOT_CAUGHT_UP", "MEMBERSHIP_CHANGE_PENDING", "LEADER_NOT_READY"):
                raise
            if time.monotonic() >= deadline:
                raise
        await asyncio.sleep(0.5)  # a poll interval toward the deadline, not a synchronisation


def _change_output(broker_name: str, answer: dict[str, Any]) -> Output:
    voters = answer.get("voters") or {}
    learners = answer.get("learners") or {}
    rows = [(pid, "voter", a) for pid, a in sorted(voters.items())]
    rows += [(pid, "learner", a) for pid, a in sorted(learners.items())]
    text = format_table(["Id", "Role", "Raft Address"], rows) + f"\ncommitted at log index {answer.get('index')}"
    return Output({"broker_name": broker_name, **answer}, text)
