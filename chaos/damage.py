"""Damaged replica files: the ``bitflip-<sel>`` and ``truncate-<sel>`` faults (docs/CHAOS.md,
"Damaged files"). The store must refuse damaged data or repair it, never serve it.

apply: stop the replica, damage its log on disk — one bit of a committed message's body
(``flip_a_message_bit``), or the newest segment cut short (``cut_newest_segment``) —, start it, wait
until it answers or exits, and read the damaged message back from it (``probe``: ``intact``,
``corrupt``, ``refused <code>``, ``no answer``). heal: a replica that refused to start gets its data
directory set aside and starts empty (it catches up from the leader); a running one is probed again.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import zlib
from typing import TYPE_CHECKING, Any

from broker.client.transport import FROM_ENV, ClientError, Transport
from chaos.history import now_us
from chaos.selection import NODE_SELECTORS
from chaos.target import Member, Target

if TYPE_CHECKING:
    from chaos.faults import FaultContext

DAMAGE_KINDS = ("bitflip", "truncate")
TRUNCATE_MAX_BYTES = 2048
START_WAIT_S = 15.0  # a damaged replica either answers or exits within this


class DamageFault:
    """Damage a stopped replica's log on disk, start it, see whether it serves the damage."""

    def __init__(self, name: str, kind: str, selector: str):
        assert kind in DAMAGE_KINDS and selector in NODE_SELECTORS
        self.name, self.kind, self.selector = name, kind, selector
        self.victims: list[Member] = []
        self.probes: dict[str, dict[str, Any]] = {}

    async def apply(self, ctx: FaultContext) -> None:
        from chaos.faults import ms_since, pick_victims  # (faults imports this module)

        self.victims, leaders, skipped = await pick_victims(ctx, self.selector)
        at_us, t0 = now_us(), time.monotonic()
        damage: dict[str, Any] = {}
        for m in self.victims:
            await ctx.target.kill(m)
            store = os.path.join(ctx.target.data_path(m), "store")
            if self.kind == "bitflip":
                done = await asyncio.to_thread(flip_a_message_bit, store, ctx.rng, m.group)
            else:
                done = await asyncio.to_thread(cut_newest_segment, store, ctx.rng)
            damage[m.name] = done
            await ctx.target.start(m)
        for m in self.victims:
            damage[m.name]["started"] = await _started(ctx.target, m)
            if self.kind == "bitflip" and damage[m.name].get("msg_id"):
                self.probes[m.name] = damage[m.name]
                damage[m.name]["probe"] = await probe(m, damage[m.name], _credentials(ctx.target))
        detail: dict[str, Any] = {"leaders": leaders, "damage": damage, "took_ms": ms_since(t0)}
        if skipped:
            detail["skipped"] = skipped
        ctx.record(self.name, "apply", [m.name for m in self.victims], detail, at_us)

    async def heal(self, ctx: FaultContext) -> None:
        from chaos.faults import ms_since

        at_us, t0 = now_us(), time.monotonic()
        outcome: dict[str, Any] = {}
        for m in self.victims:
            if ctx.target.is_running(m):
                outcome[m.name] = {"running": True}
                if m.name in self.probes:
                    outcome[m.name]["probe"] = await probe(m, self.probes[m.name], _credentials(ctx.target))
                continue
            dest = os.path.join(ctx.damaged_dir or os.path.join(ctx.target.data_path(m), os.pardir, "damaged"),
                                f"{m.name}-{at_us}")
            await ctx.target.set_aside(m, dest)
            await ctx.target.start(m)
            outcome[m.name] = {"running": False, "set_aside": dest}
        ctx.record(self.name, "heal", [m.name for m in self.victims], {"replicas": outcome,
                                                                       "took_ms": ms_since(t0)}, at_us)
        self.victims, self.probes = [], {}


async def _started(target: Target, m: Member) -> str:
    """"answering" once the replica answers its status, "exited" when its process ends first."""
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        if not target.is_running(m):
            return "exited"
        if await target.status(m) is not None:
            return "answering"
        await asyncio.sleep(0.1)
    return "no answer"


async def probe(m: Member, damage: dict[str, Any], credentials: Any = FROM_ENV) -> str:
    """Read the damaged message back from the replica: "intact" (the original body: repaired),
    "corrupt" (the damaged body: served!), "refused <code>" (an error: not served) or "no answer"."""
    t = Transport(timeout_s=2.0, credentials=credentials)
    try:
        got = await t.call(m.control_addr, "GET", f"/v1/msg/id/{damage['msg_id']}")
    except ClientError as exc:
        return "no answer" if exc.status == 0 else f"refused {exc.code}"
    finally:
        await t.close()
    body = got.get("body") if isinstance(got, dict) else None
    if not isinstance(body, bytes):
        return "refused BAD_ANSWER"
    return "intact" if zlib.crc32(body) == damage["body_crc"] else "corrupt"


def flip_a_message_bit(store_dir: str, rng: random.Random, group: str) -> dict[str, Any]:
    """Flip one bit in the body of a random committed message of a stopped replica's log (up to its
    commit-index hint); the detail says where, and the CRC-32 of the body before the flip."""
    from broker.store.message import decode_header
    from dledger.entry_codec import HEADER_SIZE
    from spark_jobs.replica_reader import LogReader, MessageRecord, decode_records, read_commit_hint

    commit = read_commit_hint(os.path.join(os.path.dirname(store_dir), "meta")) or 0
    reader = LogReader(store_dir)
    candidates = []
    for e in reader.entries():
        if e.index > commit:
            break
        candidates.append(e)
    rng.shuffle(candidates)
    for e in candidates[:100]:
        records = [r for r in decode_records(e)[0] if isinstance(r, MessageRecord)]
        if records:
            r = rng.choice(records)
            break
    else:
        return {"kind": "bitflip", "skipped": f"no committed message up to index {commit}"}
    at = r.position - e.position - HEADER_SIZE  # the record inside the entry's body
    record = e.body[at : at + r.size]
    h, body_start = decode_header(record)
    body = record[body_start : body_start + int(h.body_len)]
    if not body:
        return {"kind": "bitflip", "skipped": f"message {r.unique_id} has an empty body"}
    body_at = r.position + body_start  # global log position of the body's first byte
    start = max(s for s, _ in reader.segments if s <= body_at)
    path = os.path.join(store_dir, "log", f"{start:020d}")
    offset = body_at - start + rng.randrange(len(body))
    bit = rng.randrange(8)
    with open(path, "r+b") as f:
        f.seek(offset)
        original = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([original ^ (1 << bit)]))
    return {"kind": "bitflip", "file": os.path.relpath(path, os.path.dirname(os.path.dirname(store_dir))),
            "offset": offset, "bit": bit, "index": e.index, "commit_hint": commit,
            "newest_segment": start == reader.segments[-1][0], "msg_id": f"{group}:{r.position:016X}",
            "unique_id": r.unique_id, "body_crc": zlib.crc32(body)}


def cut_newest_segment(store_dir: str, rng: random.Random) -> dict[str, Any]:
    """Cut the newest log segment of a stopped replica short by 1..2 KiB (a torn write)."""
    log_dir = os.path.join(store_dir, "log")
    names = sorted(n for n in os.listdir(log_dir) if n.isdigit())
    if not names:
        return {"kind": "truncate", "skipped": "no segment"}
    path = os.path.join(log_dir, names[-1])
    size = os.path.getsize(path)
    cut = min(size, rng.randrange(1, TRUNCATE_MAX_BYTES + 1))
    os.truncate(path, size - cut)
    return {"kind": "truncate", "file": os.path.relpath(path, os.path.dirname(os.path.dirname(store_dir))),
            "size": size, "cut_bytes": cut}


def _credentials(target: Target) -> Any:
    """The cluster's admin account when ACL is on (a LocalTarget knows it)."""
    return getattr(target, "credentials", FROM_ENV)
