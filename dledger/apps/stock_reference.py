"""The benchmark's reference: stock pysyncobj 0.3.17 (memory journal, default settings) behind the
same ``/v1/append`` and ``/v1/status`` HTTP surface as a dledger node, so one load generator
drives both. Nothing in dledger uses this module; ``python -m dledger.apps.bench`` starts it.

    python -m dledger.apps.stock_reference --self 127.0.0.1:41001 --peers 127.0.0.1:41002,127.0.0.1:41003 --http 41011
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

import msgpack
from aiohttp import web
from pysyncobj import SyncObj, SyncObjConf, replicated

ROLE = {0: "FOLLOWER", 1: "CANDIDATE", 2: "LEADER"}


class Counter(SyncObj):
    def __init__(self, self_addr: str, peers: list[str]):
        super().__init__(self_addr, peers, conf=SyncObjConf())
        self.bodies = 0

    @replicated
    def append(self, bodies: list[bytes]) -> int:
        self.bodies += len(bodies)
        return self.bodies


def _settle(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def make_app(obj: Counter, self_addr: str) -> web.Application:
    async def append(request: web.Request) -> web.Response:
        payload = msgpack.unpackb(await request.read())
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def done(res: Any, err: Any) -> None:
            loop.call_soon_threadsafe(_settle, fut, (res, err))

        obj.append(payload["bodies"], callback=done)
        try:
            _res, err = await asyncio.wait_for(fut, payload.get("timeout_ms", 3000) / 1000)
        except TimeoutError:
            return web.json_response({"code": "APPEND_TIMEOUT", "message": "timeout"}, status=504)
        if err != 0:
            return web.json_response({"code": "APPEND_FAILED", "message": f"fail reason {err}"}, status=409)
        n = len(payload["bodies"])
        return web.Response(
            body=msgpack.packb({"term": 0, "locations": [[0, i, 0, 0] for i in range(n)]}),
            content_type="application/x-msgpack",
        )

    async def status(request: web.Request) -> web.Response:
        st = obj.getStatus()
        leader = st.get("leader")
        role = ROLE[st["state"]]
        return web.json_response(
            {
                "role": role,
                "term": st["raft_term"],
                "leader_id": self_addr
                if role == "LEADER"
                else (leader.address if leader is not None else None),
                "commit_index": st["commit_idx"],
                "applied_index": st["last_applied"],
            }
        )

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/append", append)
    app.router.add_get("/v1/status", status)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dledger.apps.stock_reference")
    parser.add_argument("--self", required=True, dest="self_addr")
    parser.add_argument("--peers", required=True)
    parser.add_argument("--http", type=int, required=True)
    args = parser.parse_args(argv)
    obj = Counter(args.self_addr, [p for p in args.peers.split(",") if p])

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        runner = web.AppRunner(make_app(obj, args.self_addr), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, args.self_addr.rsplit(":", 1)[0], args.http).start()
        await stop.wait()
        await runner.cleanup()
        obj.destroy()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
