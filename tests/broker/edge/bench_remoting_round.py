"""CPU and Python calls per SEND_MESSAGE_V2 request through the broker's RocketMQ edge (issue 26, the
official Java client's path), without Raft: the real ``RocketMQEdge`` (``RemotingServer``, dispatch,
the ACL guard with ACL off, ``Sender``) on uvloop over a loopback socket, and a fake broker service
whose sends all commit at the end of the loop turn they were made in (one "entry" per turn).

    .venv/bin/python -m tests.broker.edge.bench_remoting_round [--mode cpu|calls] [--batch 32]
        [--rounds 7] [--writes 200] [--rocketmq-header]

A client in the same process writes ``--batch`` requests framed as the 4.9.8 Java client frames them
(JSON header with its one-letter ext fields, 1 KiB body) in one write and reads the answers, ``--writes``
times per round. ``cpu``: process CPU µs per request (``time.process_time``: the client's share is
included, the same for every tree), best and median of ``--rounds``; ``calls``: Python and C calls
per request (``sys.setprofile``) and the Python functions called most. To compare two trees, run it
with ``-m`` from each tree's root (it measures the tree it is run from; copy this file into an older
tree), alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import time
from typing import Any

import uvloop

from broker.edge.rocketmq.edge import RocketMQEdge
from broker.protocol.rocketmq import command as rc
from broker.protocol.rocketmq.codes import RequestCode, SerializeType
from broker.protocol.rocketmq.command import RemotingCommand
from broker.protocol.rocketmq.message import Host
from broker.service.send import SendAnswer, SendResult


class FakeService:
    """Sends commit at the end of the turn they were made in; every other method does nothing."""

    def __init__(self) -> None:
        self.pending: list[asyncio.Future[None]] = []
        self.position = 0
        self.offset = 0

    def _commit(self) -> None:
        pending, self.pending = self.pending, []
        for fut in pending:
            fut.set_result(None)

    async def send(self, topic: str, queue_id: int, msgs: list[dict[str, Any]], *, producer_group: str | None = None,
                   client_addr: str = "") -> SendAnswer:
        loop = asyncio.get_running_loop()
        if not self.pending:
            loop.call_soon(self._commit)
        fut: asyncio.Future[None] = loop.create_future()
        self.pending.append(fut)
        await fut
        results = []
        for m in msgs:
            self.position += 1100
            self.offset += 1
            results.append(SendResult(f"B:{self.position:016X}", m.get("unique_id", "U"), self.offset, self.position))
        return SendAnswer("B", queue_id, 1700000000000, tuple(results))

    send_half = send

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def frame(opaque: int, serialize_type: SerializeType) -> bytes:
    props = f"UNIQ_KEY\u00017F000001{opaque:024X}\u0002WAIT\u0001true\u0002TAGS\u0001TagA"
    ext = {"a": "bench_pg", "b": "bench_1k", "c": "TBW102", "d": "4", "e": str(opaque % 8), "f": "0",
           "g": "1700000000123", "h": "0", "i": props, "j": "0", "k": "false", "m": "false"}
    return rc.encode(RemotingCommand(code=RequestCode.SEND_MESSAGE_V2, opaque=opaque, version=409, ext_fields=ext,
                                     body=b"x" * 1024, serialize_type=serialize_type))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    stype = SerializeType.ROCKETMQ if args.rocketmq_header else SerializeType.JSON
    edge = RocketMQEdge(FakeService(), broker_name="B",  # type: ignore[arg-type]
                        store_host=Host(b"\x7f\x00\x00\x01", 10911))
    server = await asyncio.get_running_loop().create_server(edge.server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    batch = args.batch
    writes = [b"".join(frame(i * batch + j, stype) for j in range(batch)) for i in range(args.writes)]

    async def one(data: bytes) -> None:
        writer.write(data)
        for _ in range(batch):
            n = int.from_bytes(await reader.readexactly(4), "big")
            await reader.readexactly(n)

    for data in writes[:20]:  # warm-up
        await one(data)
    requests = args.writes * batch
    figures: list[float] = []
    top: collections.Counter[str] = collections.Counter()
    count = [0]

    def profile(f: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            count[0] += 1
            if event == "call":
                top[f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_code.co_name}"] += 1

    for _ in range(args.rounds):
        if args.mode == "calls":
            count[0] = 0
            sys.setprofile(profile)
            for data in writes:
                await one(data)
            sys.setprofile(None)
            figures.append(count[0] / requests)
        else:
            t0 = time.process_time()
            for data in writes:
                await one(data)
            figures.append((time.process_time() - t0) * 1e6 / requests)
    writer.close()
    server.close()
    out: dict[str, Any] = {"mode": args.mode, "batch": batch, "header": stype.name,
                           "best": round(min(figures), 2), "median": round(sorted(figures)[len(figures) // 2], 2)}
    if args.mode == "calls":
        rounds = args.rounds * requests
        out["python_calls"] = round(sum(top.values()) / rounds, 2)
        out["top"] = [(name, round(n / rounds, 2)) for name, n in top.most_common(25)]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("cpu", "calls"), default="cpu")
    p.add_argument("--batch", type=int, default=32, help="requests per client write (in flight at once)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--writes", type=int, default=200, help="client writes per round")
    p.add_argument("--rocketmq-header", action="store_true", help="ROCKETMQ (binary) headers instead of JSON")
    print(uvloop.run(run(p.parse_args())))


if __name__ == "__main__":
    main()
