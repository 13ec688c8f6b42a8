"""One synchronous binary SEND at a time through the broker's edge (issue 26, the leader's per-request
cost at one request in flight): not a test, a measuring harness.

A broker process of the code tree ``--tree`` (``serve``): a real ``BrokerServer`` (ACL on, its
``RemotingServer``, ``RemotingOps``, ``BrokerService``, metrics, dedup, replay guard) whose node is
a fake leader answering every append on the next loop turn (no Raft, no disk). This process is the
client: one signed 1 KiB message per request (the SDK's map, a fresh nonce each), one request in
flight over loopback, the answer read before the next request.

- ``time``: CPU of each server per request (``/proc/PID/schedstat``: ns on CPU, every thread),
  blocks of ``-n`` requests alternating between the trees given, best of ``-r`` blocks each.
- ``count``: Python function calls (``sys.setprofile`` call and c_call events) per request in the
  server, over ``-n`` requests after a warm-up, with the top functions.

    python tests/broker/bench_edge_round.py time --tree /old/tree --tree . -n 3000 -r 7
    python tests/broker/bench_edge_round.py count --tree . -n 200
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

TOPIC = "EdgeBench"


# -- the server (runs with the tree under test first on sys.path) ----------------------------------
def serve(tree: str, count: int, warm: int) -> None:
    sys.path.insert(0, tree)
    import asyncio
    import collections

    import uvloop

    from broker.server.broker_server import BrokerServer
    from broker.server.config import parse_broker_config
    from broker.store.replay import ReplayGuardedNode
    from dledger.node import DLedgerNode
    from dledger.records import BodyLocation
    from tests.acl_fixtures import write_acl
    from tests.broker.harness import broker_props

    class _FakeCommit(DLedgerNode):
        """A leader whose every append commits on the next loop turn."""

        role = "LEADER"
        term = 1
        leader_id = "n0"
        last_index = 0
        position = 0
        offset = 0

        async def append(self, bodies: Any, timeout_s: float = 3.0) -> list[BodyLocation]:
            self.last_index += 1
            locs: list[BodyLocation] = []
            for b in bodies:
                result: Any = {}  # the replay guard's nonce command: admitted
                if b[:1] == b"N":  # a message: its queue offset
                    result = self.offset
                    self.offset += 1
                locs.append(BodyLocation(self.last_index, 1, len(locs), self.position, len(b), result))
                self.position += len(b)
            fut = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(fut.set_result, locs)
            return await fut

    class FakeNode(ReplayGuardedNode, _FakeCommit):
        pass

    async def main() -> None:
        root = tempfile.mkdtemp(prefix="edge-bench-")
        acl = write_acl(os.path.join(root, "acl.yml"))
        props = broker_props(root, "n0", [1, 2, 3], [4, 5, 6], [0, 0, 0], ["127.0.0.1:9"],
                             aclEnable="true", aclFile=acl)
        cfg = parse_broker_config(props, source="<bench>", env={})
        server = BrokerServer(cfg)
        node = FakeNode.__new__(FakeNode)
        node.leader_ms = server.wall_ms
        server.node = node
        server._ready_term = 1
        server.store.metadata.apply({"op": "topic.put", "topic": TOPIC, "read_queue_nums": 4,
                                     "write_queue_nums": 4, "perm": 6})
        port = await server.remoting.start("127.0.0.1", 0)
        print(json.dumps({"port": port, "scope": server.security.scope, "root": root}), flush=True)
        if count:
            from broker.edge.binary import _Connection

            marker = _Connection.data_received.__code__
            seen = [0]
            calls: collections.Counter[str] = collections.Counter()
            total = [0]

            def prof(frame: Any, event: str, arg: Any) -> None:
                if event == "call":
                    code = frame.f_code
                    if code is marker:
                        seen[0] += 1
                        if seen[0] == warm + count + 1:
                            sys.setprofile(None)
                            out = {"calls_per_request": total[0] / count,
                                   "top": [(k, v / count) for k, v in calls.most_common(400)]}
                            print(json.dumps(out), flush=True)
                            return
                    if seen[0] > warm:
                        total[0] += 1
                        calls[f"{code.co_filename.rsplit('/', 2)[-1]}:{code.co_qualname}"] += 1
                elif event == "c_call" and seen[0] > warm:
                    total[0] += 1
                    calls[f"C:{getattr(arg, '__qualname__', arg)}"] += 1

            sys.setprofile(prof)
            import threading
            threading.setprofile(None)
        await asyncio.Event().wait()

    uvloop.run(main())


# -- the client --------------------------------------------------------------------------------------
class Server:
    def __init__(self, tree: str, count: int = 0, warm: int = 0):
        self.tree = os.path.abspath(tree)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "serve", "--tree", self.tree, "--count", str(count),
             "--warm", str(warm)],
            cwd=self.tree, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": self.tree},
        )
        assert self.proc.stdout is not None
        hello = json.loads(self.proc.stdout.readline())
        self.scope = hello["scope"]
        self.root = hello["root"]  # the server's store and ACL file, removed at stop
        self.sock = socket.create_connection(("127.0.0.1", hello["port"]))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.seq = 0

    def cpu_ns(self) -> int:
        total = 0
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            with open(f"/proc/{self.proc.pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        return total

    def frames(self, n: int) -> list[bytes]:
        if self.tree not in sys.path:
            sys.path.insert(0, self.tree)
        import msgpack

        from broker.protocol.auth import authorization
        from broker.protocol.frames import AUTH_METHOD, Op, encode, op_name
        from tests.acl_fixtures import PRODUCER

        out = []
        body = os.urandom(1024)
        now = int(time.time() * 1000)
        for _ in range(n):
            self.seq += 1
            req = {"topic": TOPIC, "queue_id": 0, "producer_group": "PG", "messages": [{
                "body": body, "unique_id": os.urandom(16).hex().upper(), "born_ts": now, "born_host": "127.0.0.1",
                "properties": {"bench_ts_ns": str(time.time_ns())}}]}
            raw = msgpack.packb(req, use_bin_type=True)
            auth = authorization(PRODUCER, AUTH_METHOD, op_name(Op.SEND), raw, now, scope=self.scope)
            out.append(encode(Op.SEND, self.seq, raw, auth=auth))
        return out

    def run(self, frames: list[bytes]) -> None:
        sock = self.sock
        for f in frames:
            sock.sendall(f)
            head = b""
            while len(head) < 4:
                head += sock.recv(4 - len(head))
            need = int.from_bytes(head, "big")
            got = bytearray()
            while len(got) < need:
                got += sock.recv(need - len(got))
            if got[1] & 0x02:  # FLAG_ERROR
                raise SystemExit(f"error answer: {bytes(got[10:])!r}")

    def stop(self) -> None:
        self.sock.close()
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def cmd_time(args: argparse.Namespace) -> None:
    servers = [Server(t) for t in args.tree]
    try:
        for s in servers:
            s.run(s.frames(args.warm))
        results: list[list[float]] = [[] for _ in servers]
        for _ in range(args.rounds):
            for i, s in enumerate(servers):
                frames = s.frames(args.n)
                before = s.cpu_ns()
                t0 = time.perf_counter()
                s.run(frames)
                wall = time.perf_counter() - t0
                results[i].append((s.cpu_ns() - before) / args.n / 1000)
                print(f"{args.tree[i]}: {results[i][-1]:.2f} us CPU/request, {wall / args.n * 1e6:.1f} us wall",
                      flush=True)
        for t, r in zip(args.tree, results, strict=True):
            rs = sorted(r)
            print(f"{t}: best {rs[0]:.2f}  median {rs[len(rs) // 2]:.2f}  all {' '.join(f'{x:.2f}' for x in r)}")
    finally:
        for s in servers:
            s.stop()


def cmd_count(args: argparse.Namespace) -> None:
    for tree in args.tree:
        s = Server(tree, count=args.n, warm=args.warm)
        try:
            s.run(s.frames(args.warm + args.n + 1))
            assert s.proc.stdout is not None
            out = json.loads(s.proc.stdout.readline())
            print(f"{tree}: {out['calls_per_request']:.1f} Python calls (call + c_call) per request")
            for k, v in out["top"][: args.top]:
                print(f"   {v:6.2f}  {k}")
        finally:
            s.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    sv = sub.add_parser("serve")
    sv.add_argument("--tree", required=True)
    sv.add_argument("--count", type=int, default=0)
    sv.add_argument("--warm", type=int, default=0)
    for name in ("time", "count"):
        c = sub.add_parser(name)
        c.add_argument("--tree", action="append", required=True)
        c.add_argument("-n", type=int, default=3000 if name == "time" else 200)
        c.add_argument("-r", "--rounds", type=int, default=7)
        c.add_argument("--warm", type=int, default=500)
        c.add_argument("--top", type=int, default=40)
    args = p.parse_args()
    if args.cmd == "serve":
        serve(args.tree, args.count, args.warm)
    elif args.cmd == "time":
        cmd_time(args)
    else:
        cmd_count(args)


if __name__ == "__main__":
    main()
