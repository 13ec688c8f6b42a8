"""Issue 23, finding 5, as a command: what unsigned partial frames (or bodies) cost a broker's memory.

Against a cluster made by ``dledger-cluster up --dir DIR`` (ACL on): opens ``--connections``
connections to the leader's binary port (or its HTTP port with ``--port http``), sends on each a
request head announcing ``--frame-mib`` MiB of body and then ``--sent-mib`` MiB of it, unsigned, and
keeps the connections open. Prints the leader's resident memory (VmRSS of its pid) before and once
it stopped growing, then closes the connections::

    .venv/bin/python -m tests.broker.remoting_flood --dir ./run --connections 30
    .venv/bin/python -m tests.broker.remoting_flood --dir ./run --connections 30 --port http

Before the fix a broker buffered every byte of such frames before checking their signature (the
finding: 30 partial frames took a leader from 63 to 394 MiB); now a frame is refused from its head
and its body discarded as it arrives, and an HTTP body is never read before the signature verified.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from typing import Any

from broker.protocol.frames import HEADER, Op

MIB = 1 << 20


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def leader_of(cluster_dir: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "dledger.apps.cluster", "status", "--dir", cluster_dir, "--json"],
                         capture_output=True, text=True, timeout=60)
    rows = json.loads(out.stdout)["processes"]
    leaders = [r for r in rows if r.get("role") == "LEADER"]
    if not leaders:
        raise SystemExit(f"no leader in {cluster_dir}: {out.stdout[-400:]}")
    return dict(leaders[0])


def head(port_kind: str, frame_bytes: int, host: str) -> bytes:
    if port_kind == "binary":
        return HEADER.pack(10 + frame_bytes, 1, 0, int(Op.SEND), 1, 0)
    return (f"POST /v1/send HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-msgpack\r\n"
            f"Content-Length: {frame_bytes}\r\n\r\n").encode()


async def flood(args: argparse.Namespace) -> None:
    leader = leader_of(args.dir)
    pid = int(leader["pid"])
    port = int(leader["http_port"]) + (1 if args.port == "binary" else 0)
    addr = f"127.0.0.1:{port}"
    before = rss_kib(pid)
    chunk = b"\0" * MIB
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    sent_ok = 0
    for _ in range(args.connections):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        conns.append((reader, writer))
        writer.write(head(args.port, args.frame_mib * MIB, addr))
        try:
            for _ in range(args.sent_mib):
                writer.write(chunk)
                await asyncio.wait_for(writer.drain(), 10.0)
            sent_ok += 1
        except (OSError, TimeoutError):
            pass  # refused and closed by the broker (the fix), or a full socket
    # let the broker take what it will; report once its RSS stopped growing (or after 20 s)
    last, peak, deadline = before, before, time.monotonic() + 20.0
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        now = rss_kib(pid)
        peak = max(peak, now)
        if abs(now - last) < 1024 and now != before:
            break
        last = now
    after = rss_kib(pid)
    print(f"leader pid {pid} ({args.port} port {addr}): {args.connections} connections x {args.sent_mib} MiB sent of "
          f"{args.frame_mib} MiB announced, unsigned ({sent_ok} sent in full): VmRSS {before / 1024:.0f} MiB before, "
          f"{after / 1024:.0f} MiB after (peak {peak / 1024:.0f} MiB)")
    for _r, w in conns:
        w.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="remoting_flood", description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--dir", required=True, help="the cluster directory of dledger-cluster up")
    p.add_argument("--connections", type=int, default=30)
    p.add_argument("--frame-mib", type=int, default=11, help="announced body (the frame cap is 12 MiB)")
    p.add_argument("--sent-mib", type=int, default=10)
    p.add_argument("--port", choices=["binary", "http"], default="binary")
    args = p.parse_args(argv)
    asyncio.run(flood(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
