"""A replica whose data directory is a small real file system fills it up (issue 27 part 5).

Run by tests/dledger/test_disk_full_tmpfs.py inside a private mount namespace (``unshare``) in which
``ROOT/n0`` is a tmpfs of a few MiB; ``python -m tests.dledger.disk_full_drill ROOT``. A group of
three in-process replicas; n0 (on the tmpfs) leads; a ballast file leaves it ~1 MiB; appends to n0
go on until the log refuses one with DISK_FULL; then: n0 stepped down and another replica leads and
takes writes; n0's segment files hold no partial entry and n0 stored nothing it could not write;
the ballast goes, and n0 catches up and takes writes again; reopened from disk, n0's log reads back
whole (checksums verified) with the same chain CRC as the leader's. Prints one JSON line; exit 0
when every check held, 1 otherwise (the failed check on stderr).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import sys
from typing import Any

from dledger.entry_store import EntryStore
from dledger.node import DiskFullError, DLedgerNode, NotLeaderError
from tests.dledger.harness import InProcCluster, wait_until

BODY = 16 << 10
SEGMENT = 256 << 10


def fill(path: str, leave: int) -> int:
    """Write ``path`` until the file system is full, then give back ``leave`` bytes."""
    chunk = b"\0" * (64 << 10)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    size = 0
    try:
        while True:
            try:
                size += os.pwrite(fd, chunk, size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
        size = max(0, size - leave)
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    return size


async def drill(root: str) -> dict[str, Any]:
    c = InProcCluster(root, overrides={"segment_bytes": SEGMENT})
    await c.start()
    out: dict[str, Any] = {}
    try:
        leader = await c.leader()
        if leader.settings.self_id != "n0":
            await leader.transfer_leadership("n0")
        n0 = c.nodes["n0"]
        await wait_until(lambda: n0.role == "LEADER" and all(n.leader_id == "n0" for n in c.nodes.values()),
                         10, "n0 to lead")
        await n0.append([b"first"])
        ballast = os.path.join(root, "n0", "ballast")
        out["ballast_bytes"] = fill(ballast, 1 << 20)
        acked = 0
        refusal: DiskFullError | None = None
        for _ in range(400):
            try:
                await n0.append([os.urandom(BODY)])
                acked += 1
            except DiskFullError as exc:
                refusal = exc
                break
            except NotLeaderError:
                break
        out["acked_until_full"] = acked
        assert refusal is not None, f"no DISK_FULL after {acked} appends of {BODY} bytes"
        out["refusal"] = str(refusal)[:300]
        assert refusal.code == "DISK_FULL"
        assert n0.fatal is None, f"n0 failed: {n0.fatal}"
        new: DLedgerNode = await wait_until(
            lambda: next((n for n in c.nodes.values() if n.role == "LEADER" and n is not n0), None),
            15, "another replica to lead",
        )
        out["new_leader"] = new.settings.self_id
        assert n0.role != "LEADER"
        for seg in n0.store.segments():  # nothing past the published bytes: no partial entry
            assert os.path.getsize(seg.path) == seg.size_bytes, f"{seg.path}: {os.path.getsize(seg.path)} bytes"
        for _ in range(20):
            await new.append([os.urandom(BODY)])
        out["stored_while_full"] = {"n0": n0.last_index, new.settings.self_id: new.last_index}
        assert n0.last_index < new.last_index
        assert (await n0.status())["write_blocked"]
        os.unlink(ballast)
        await wait_until(lambda: n0.last_index >= new.last_index and n0.core.write_blocked is None,
                         20, "n0 to catch up once space returned")
        last = new.last_index
        await wait_until(lambda: n0.applied_index >= last, 10, "n0 to apply")
        out["caught_up_to"] = last
        out["chain_crc_equal"] = n0.store.chain_crc_at(last) == new.store.chain_crc_at(last)
        assert out["chain_crc_equal"]
        out["n0_fatal"] = None if n0.fatal is None else str(n0.fatal)
        out["n0_counters"] = {k: v for k, v in (await n0.status())["counters"].items() if "disk_full" in k}
    finally:
        await c.stop()
    store = EntryStore(os.path.join(root, "n0", "store"), segment_bytes=SEGMENT)
    try:  # reopened: every entry reads back with its checksums verified
        entries = store.read_range(store.first_index, 1 << 30, 1 << 40)
        out["reopened_entries"] = len(entries)
        assert entries[-1].index == store.last_index >= out["caught_up_to"]
    finally:
        store.close()
    return out


def main() -> int:
    root = sys.argv[1]
    try:
        out = asyncio.run(drill(root))
    except AssertionError as exc:
        print(f"disk-full drill failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
