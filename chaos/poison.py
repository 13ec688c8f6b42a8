"""The ``poison`` fault (issue 23): send the requests that once made a poison entry — a committed
Raft entry whose apply raised on every replica — to every group's leader, then check that every
replica is alive and refused exactly the same records (docs/CHAOS.md, "Poison entries").

apply: per group, a message in a topic of the fault's own (``ChaosPoisonTopic``: the workload's
histories stay as they are), then send-backs of it for groups of 121, 200 and 255 characters (their
``%RETRY%``/``%DLQ%`` topics exceed the 127-character topic limit), to the DLQ and to the retry
topic. Each answer is recorded (``{status, code}``): the broker refuses them at its edge
(``INVALID_GROUP``). Run with ``--plant sendback-unchecked`` (the edge checks taken out: a
validation gap) the records reach the log and every replica must refuse them at apply
(``RECORD_REFUSED``, or accepted into the schedule and dropped at delivery). Then the check: every
replica still runs and answers, applies past the requests, and lists the same refused records
(``GET /v1/admin/refused``, compared up to the lowest applied index). ``detail.ok`` says whether it
held; the run's audit proves the logs identical (``divergence``, ``commit_crc_mismatch``).

heal: the admin deletes what the requests left (the poison topic, and with the plant the
over-long retry/DLQ topics an older release would have kept: docs/OPERATIONS.md).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from broker.client.transport import FROM_ENV, ClientError, Transport
from broker.protocol.frames import Op
from chaos.history import now_us
from chaos.target import Member, Target, find_leader, groups_of, wait_for

if TYPE_CHECKING:
    from chaos.faults import FaultContext

POISON_FAULT = "poison"
POISON_TOPIC = "ChaosPoisonTopic"
GROUP_LENGTHS = (121, 200, 255)  # one past the limit, and what releases before issue 23 allowed
REQUEST_TIMEOUT_S = 10.0
SETTLE_S = 20.0  # every replica applies past the requests within this


def poison_groups() -> list[str]:
    return ["p" * n for n in GROUP_LENGTHS]


class PoisonFault:
    def __init__(self, name: str = POISON_FAULT):
        self.name = name
        self.leftovers: dict[str, list[str]] = {}  # group -> topics to delete at heal

    async def apply(self, ctx: FaultContext) -> None:
        from chaos.faults import ms_since  # (faults imports this module)

        at_us, t0 = now_us(), time.monotonic()
        t = Transport(timeout_s=REQUEST_TIMEOUT_S, credentials=getattr(ctx.target, "credentials", FROM_ENV))
        detail: dict[str, Any] = {"groups": {}}
        try:
            for group, members in sorted(groups_of(ctx.target.members()).items()):
                detail["groups"][group] = await self._poison_group(ctx, t, members)
        finally:
            await t.close()
        detail["ok"] = all(g.get("ok") for g in detail["groups"].values()) and bool(detail["groups"])
        detail["took_ms"] = ms_since(t0)
        ctx.record(self.name, "apply", [m.name for m in ctx.target.members()], detail, at_us)

    async def _poison_group(self, ctx: FaultContext, t: Transport, members: list[Member]) -> dict[str, Any]:
        try:
            leader_name = await wait_for(lambda: find_leader(ctx.target, members, writable=True), ctx.leader_wait_s,
                                         "a writable leader", 0.05)
        except TimeoutError:
            return {"ok": False, "skipped": "no writable leader"}
        leader = next(m for m in members if m.name == leader_name)
        await t.call(leader.control_addr, "POST", "/v1/topics",
                     {"topic": POISON_TOPIC, "read_queue_nums": 1, "write_queue_nums": 1, "perm": 6})
        sent = await t.operation(leader.control_addr, Op.SEND,
                                 {"topic": POISON_TOPIC, "queue_id": 0, "messages": [{"body": b"poison"}]})
        msg_id = sent["results"][0]["msg_id"]
        answers = []
        for name in poison_groups():
            for dlq in (True, False):
                answers.append({"group_chars": len(name), "dlq": dlq,
                                **await _answer(t, leader.control_addr, {"group": name, "msg_id": msg_id, "dlq": dlq})})
        self.leftovers[leader.group] = [POISON_TOPIC] + [p + name for name in poison_groups()
                                                         for p in ("%RETRY%", "%DLQ%")]
        return {"leader": leader.name, "answers": answers, **await check_replicas(ctx.target, t, members)}

    async def heal(self, ctx: FaultContext) -> None:
        from chaos.faults import ms_since

        at_us, t0 = now_us(), time.monotonic()
        t = Transport(timeout_s=REQUEST_TIMEOUT_S, credentials=getattr(ctx.target, "credentials", FROM_ENV))
        deleted: dict[str, list[str]] = {}
        try:
            for group, members in sorted(groups_of(ctx.target.members()).items()):
                leader_name = await find_leader(ctx.target, members, writable=True)
                leader = next((m for m in members if m.name == leader_name), None)
                if leader is None:
                    continue
                for topic in self.leftovers.get(group, []):
                    try:
                        await t.call(leader.control_addr, "DELETE", f"/v1/topics/{quote(topic, safe='')}")
                    except ClientError:
                        continue  # never created (the edge refused the request)
                    deleted.setdefault(group, []).append(topic)
        finally:
            await t.close()
        ctx.record(self.name, "heal", sorted(deleted), {"deleted": deleted, "took_ms": ms_since(t0)}, at_us)
        self.leftovers = {}


async def _answer(t: Transport, addr: str, body: dict[str, Any]) -> dict[str, Any]:
    try:
        got = await t.call(addr, "POST", "/v1/consumer/sendback", body)
    except ClientError as exc:
        return {"status": exc.status, "code": exc.code}
    return {"status": 200, "code": "OK", "topic": got.get("topic")}


async def check_replicas(target: Target, t: Transport, members: list[Member]) -> dict[str, Any]:
    """Every replica runs, answers, applies past the leader's commit index as it is now, and lists
    the same refused records (up to the lowest applied index of the group)."""
    statuses = {m.name: await target.status(m) for m in members}
    commit = max((int(s["commit_index"]) for s in statuses.values() if s), default=0)

    async def applied_past() -> bool:
        for m in members:
            st = await target.status(m)
            if not target.is_running(m) or st is None or int(st["applied_index"]) < commit:
                return False
        return True

    try:
        await wait_for(applied_past, SETTLE_S, f"every replica to apply index {commit}", 0.1)
        settled = True
    except TimeoutError:
        settled = False
    running = {m.name: target.is_running(m) for m in members}
    refused: dict[str, Any] = {}
    for m in members:
        try:
            refused[m.name] = await t.call(m.control_addr, "GET", "/v1/admin/refused")
        except ClientError as exc:
            refused[m.name] = {"error": exc.code}
    floor = min((int(r.get("applied_index", 0)) for r in refused.values()), default=0)
    lists = {name: [x for x in r.get("recent", []) if int(x["index"]) <= floor] for name, r in refused.items()}
    same = len({repr(v) for v in lists.values()}) == 1 and not any("error" in r for r in refused.values())
    return {
        "commit_index": commit,
        "running": running,
        "settled": settled,
        "refused": {name: r.get("total") for name, r in refused.items()},
        "refusals_identical": same,
        "ok": all(running.values()) and settled and same,
    }
