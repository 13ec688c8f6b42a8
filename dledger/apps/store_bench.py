"""``python -m dledger.apps.store_bench``: the cost of one durable append on this machine's disk.

Each round opens a fresh ``EntryStore`` in a temporary directory (under ``--dir``: put it on the
disk the brokers use) and appends ``--appends`` entries of ``--size`` bytes, each followed by
``flush()`` — what a replica does before it acknowledges an entry with the sync flush policy. It
prints the latency of append+flush (p50/p99 over every append of every round), the fdatasync calls
per append, and, for scale, one bare ``fdatasync`` of a 1 KiB write to a plain file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from dledger.entry_store import EntryStore


def _pct(sorted_ms: list[float], q: float) -> float:
    return round(sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))], 3)


def run(appends: int, rounds: int, size: int, base: str | None) -> dict[str, Any]:
    store_ms: list[float] = []
    bare_ms: list[float] = []
    syncs = 0
    real = os.fdatasync

    def counted(fd: int) -> None:
        nonlocal syncs
        syncs += 1
        real(fd)

    body = os.urandom(size)
    for _ in range(rounds):
        root = tempfile.mkdtemp(prefix="store-bench-", dir=base)
        try:
            store = EntryStore(os.path.join(root, "log"))
            os.fdatasync = counted  # type: ignore[assignment]
            try:
                for i in range(1, appends + 1):
                    t0 = time.perf_counter()
                    store.append(i, 1, body)
                    store.flush()
                    store_ms.append((time.perf_counter() - t0) * 1e3)
            finally:
                os.fdatasync = real
            store.close()
            fd = os.open(os.path.join(root, "plain"), os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
            try:
                for _ in range(appends):
                    os.write(fd, body)
                    t0 = time.perf_counter()
                    os.fdatasync(fd)
                    bare_ms.append((time.perf_counter() - t0) * 1e3)
            finally:
                os.close(fd)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    store_ms.sort()
    bare_ms.sort()
    return {
        "appends": appends * rounds,
        "size": size,
        "append_flush_ms": {"p50": _pct(store_ms, 0.5), "p99": _pct(store_ms, 0.99)},
        "fdatasync_per_append": round(syncs / (appends * rounds), 2),
        "bare_fdatasync_ms": {"p50": _pct(bare_ms, 0.5), "p99": _pct(bare_ms, 0.99)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dledger.apps.store_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--appends", type=int, default=300, help="durable appends per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=1024, help="entry body bytes")
    parser.add_argument("--dir", help="directory on the disk to measure (default: the temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.appends < 1 or args.rounds < 1 or not 0 < args.size <= 4 << 20:
        print("store_bench: --appends and --rounds must be >= 1, --size 1..4194304", file=sys.stderr)
        return 2
    out = run(args.appends, args.rounds, args.size, args.dir)
    if args.json:
        print(json.dumps(out))
    else:
        a, b = out["append_flush_ms"], out["bare_fdatasync_ms"]
        print(
            f"{out['appends']} durable appends of {out['size']} B: append+flush p50 {a['p50']} ms, "
            f"p99 {a['p99']} ms, {out['fdatasync_per_append']} fdatasync per append "
            f"(a bare fdatasync: p50 {b['p50']} ms, p99 {b['p99']} ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
