"""A fake broker cluster and NameServer for SDK tests: aiohttp apps on 127.0.0.1 free ports.

``FakeGroup`` is one broker group (one Raft group): its state (topics, queues, offsets) is shared
by its replicas, as if replication were instant; any replica serves reads, only the leader takes
writes (others answer ``409 NOT_LEADER {leader_addr}``). Membership is per replica, as in the
real broker. ``FakeNamesrv`` computes routes from the groups live, unless a test pins a stale
leader. Faults: ``fail_next`` (answer an error), ``hang_next`` (hold the request until teardown, so
the client times out) and ``stop``/``restart`` (connection refused).

Only what docs/API.md says the SDK uses is implemented.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
from aiohttp import web

HOST = "127.0.0.1"
MSGPACK = "application/x-msgpack"
BODY = web.RequestKey("body", dict)


def pack(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgpack.packb(value, use_bin_type=True), status=status, content_type=MSGPACK)


def error(status: int, code: str, message: str = "", **extra: str | None) -> web.Response:
    return pack({"code": code, "message": message or code, **extra}, status)


async def read(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    return dict(msgpack.unpackb(raw, raw=False, strict_map_key=False)) if raw else {}


async def wait_until(cond: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition") -> None:
    """Poll ``cond`` until it holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)


@dataclasses.dataclass
class Fault:
    path: str
    status: int
    code: str
    times: int
    leader_addr: str | None = None
    hang: bool = False


@dataclasses.dataclass
class TopicConf:
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = 6


class FakeBroker:
    """One replica: an HTTP server over its group's shared state."""

    def __init__(self, group: FakeGroup, index: int):
        self.group = group
        self.index = index
        self.port = 0
        self.members: dict[str, list[dict[str, Any]]] = {}  # client id → groups (per replica)
        self.requests: list[tuple[str, dict[str, Any]]] = []  # (path, body) of every request
        self.faults: list[Fault] = []
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None

    @property
    def addr(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def is_leader(self) -> bool:
        return self.group.leader_index == self.index

    def sent(self) -> list[dict[str, Any]]:
        return [body for path, body in self.requests if path == "/v1/send"]

    # -- faults ------------------------------------------------------------------------------------
    def fail_next(
        self, path: str, code: str, status: int = 503, *, times: int = 1, leader_addr: str | None = None
    ) -> None:
        self.faults.append(Fault(path, status, code, times, leader_addr))

    def hang_next(self, path: str, *, times: int = 1) -> None:
        self.faults.append(Fault(path, 0, "", times, hang=True))

    def _take_fault(self, path: str) -> Fault | None:
        for f in self.faults:
            if f.path == path and f.times > 0:
                f.times -= 1
                return f
        return None

    # -- life cycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        app = web.Application(middlewares=[self._middleware])
        r = app.router
        r.add_post("/v1/send", self.send)
        r.add_post("/v1/pull", self.pull)
        r.add_get("/v1/offset/search", self.offset_search)
        r.add_get("/v1/topics/{topic}/status", self.topic_status)
        r.add_get("/v1/offsets", self.offsets_get)
        r.add_post("/v1/offsets", self.offsets_commit)
        r.add_post("/v1/heartbeat", self.heartbeat)
        r.add_post("/v1/unregister", self.unregister)
        r.add_get("/v1/groups/{group}/consumers", self.consumers)
        self._runner = web.AppRunner(app, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, self.port)
        await site.start()
        if self.port == 0:
            self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        """Refuse connections from now on (``restart`` to serve again on the same port)."""
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def restart(self) -> None:
        self._release = asyncio.Event()
        await self.start()

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        body = await read(request) if request.method == "POST" else dict(request.query)
        self.requests.append((request.path, body))
        fault = self._take_fault(request.path)
        if fault is not None:
            if fault.hang:
                await self._release.wait()
                return error(503, "SHUTTING_DOWN")
            if fault.code == "NOT_LEADER":
                return error(fault.status, fault.code, leader_addr=fault.leader_addr)
            return error(fault.status, fault.code)
        request[BODY] = body
        return await handler(request)

    def _not_leader(self) -> web.Response:
        leader = self.group.leader
        return error(409, "NOT_LEADER", leader_addr=leader.addr if leader else None)

    # -- handlers ---------------------------------------------------------------------------------
    async def send(self, request: web.Request) -> web.StreamResponse:
        if not self.is_leader:
            return self._not_leader()
        body = request[BODY]
        return pack(self.group.append(body["topic"], int(body.get("queue_id", 0)), body["messages"]))

    async def pull(self, request: web.Request) -> web.StreamResponse:
        body = request[BODY]
        topic, qid, offset = body["topic"], int(body["queue_id"]), int(body["offset"])
        conf = self.group.topics.get(topic)
        if conf is None:
            return error(404, "TOPIC_NOT_EXIST")
        if not 0 <= qid < conf.read_queue_nums:
            return error(400, "INVALID_QUEUE_ID")
        q = self.group.queue(topic, qid)
        deadline = time.monotonic() + int(body.get("suspend_ms", 0)) / 1000
        while offset == len(q) and time.monotonic() < deadline:
            event = self.group.arrival(topic, qid)
            try:
                await asyncio.wait_for(event.wait(), deadline - time.monotonic())
            except TimeoutError:
                break
        hi = len(q)
        if offset > hi:
            return pack(_pull_answer("OFFSET_OVERFLOW", hi, hi, []))
        if offset == hi:
            return pack(_pull_answer("NO_NEW_MSG", offset, hi, []))
        tags = body.get("tags") or "*"
        wanted = None if tags == "*" else set(tags.split("||"))
        max_count = int(body.get("max_count", 32))
        out: list[dict[str, Any]] = []
        i = offset
        while i < hi and len(out) < max_count and i - offset < max_count * 8:
            if wanted is None or q[i]["tags"] in wanted:
                out.append(q[i])
            i += 1
        return pack(_pull_answer("FOUND" if out else "NO_MATCHED_MSG", i, hi, out))

    async def offset_search(self, request: web.Request) -> web.StreamResponse:
        q = self.group.queue(request.query["topic"], int(request.query["queue_id"]))
        ts = int(request.query["ts"])
        return pack({"offset": next((m["queue_offset"] for m in q if m["store_ts"] >= ts), len(q))})

    async def topic_status(self, request: web.Request) -> web.StreamResponse:
        topic = request.match_info["topic"]
        conf = self.group.topics.get(topic)
        if conf is None:
            return error(404, "TOPIC_NOT_EXIST")
        queues = [
            {
                "queue_id": i,
                "min_offset": 0,
                "max_offset": len(self.group.queue(topic, i)),
                "last_store_ts": 0,
            }
            for i in range(max(conf.read_queue_nums, conf.write_queue_nums))
        ]
        return pack({"topic": topic, "queues": queues})

    async def offsets_get(self, request: web.Request) -> web.StreamResponse:
        group, topic = request.query["group"], request.query["topic"]
        offsets = {str(q): o for (g, t, q), o in self.group.offsets.items() if g == group and t == topic}
        return pack({"offsets": offsets})

    async def offsets_commit(self, request: web.Request) -> web.StreamResponse:
        if not self.is_leader:
            return self._not_leader()
        body = request[BODY]
        updated = 0
        for qid, off in body["offsets"].items():
            key = (body["group"], body["topic"], int(qid))
            for hook in self.group.commit_hooks:
                hook(body["group"], body["topic"], int(qid), int(off))
            self.group.commits.append((*key, int(off)))
            if off > self.group.offsets.get(key, -1):
                self.group.offsets[key] = int(off)
                updated += 1
        return pack({"updated": updated})

    async def heartbeat(self, request: web.Request) -> web.StreamResponse:
        body = request[BODY]
        self.members[body["client_id"]] = list(body["groups"])
        return pack({"ok": True})

    async def unregister(self, request: web.Request) -> web.StreamResponse:
        self.members.pop(request[BODY]["client_id"], None)
        return pack({"removed": 1})

    async def consumers(self, request: web.Request) -> web.StreamResponse:
        group = request.match_info["group"]
        ids = sorted(cid for cid, groups in self.members.items() if any(g["group"] == group for g in groups))
        return pack({"group": group, "client_ids": ids})


def _pull_answer(status: str, next_offset: int, hi: int, msgs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"status": status, "next_offset": next_offset, "min_offset": 0, "max_offset": hi, "messages": msgs}


class FakeGroup:
    """One broker group: state shared by its replicas (replication is instant here)."""

    def __init__(self, name: str, replicas: int, cluster: str = "DefaultCluster"):
        self.name = name
        self.cluster = cluster
        self.replicas = [FakeBroker(self, i) for i in range(replicas)]
        self.leader_index: int | None = 0
        self.topics: dict[str, TopicConf] = {}
        self.auto_create = True
        self._queues: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self._arrivals: dict[tuple[str, int], asyncio.Event] = {}
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.commits: list[tuple[str, str, int, int]] = []
        self.commit_hooks: list[Callable[[str, str, int, int], None]] = []
        self._position = 0

    @property
    def leader(self) -> FakeBroker | None:
        return None if self.leader_index is None else self.replicas[self.leader_index]

    def queue(self, topic: str, qid: int) -> list[dict[str, Any]]:
        return self._queues.setdefault((topic, qid), [])

    def arrival(self, topic: str, qid: int) -> asyncio.Event:
        return self._arrivals.setdefault((topic, qid), asyncio.Event())

    def append(self, topic: str, qid: int, items: list[dict[str, Any]]) -> dict[str, Any]:
        if topic not in self.topics:
            assert self.auto_create, f"topic {topic} does not exist"
            self.topics[topic] = TopicConf()
        q = self.queue(topic, qid)
        store_ts = int(time.time() * 1000)
        results = []
        for item in items:
            self._position += 100
            msg = {
                "topic": topic,
                "queue_id": qid,
                "queue_offset": len(q),
                "msg_id": f"{self.name}:{self._position:016X}",
                "unique_id": item.get("unique_id") or f"SRV{self._position}",
                "tags": item.get("tags", ""),
                "keys": list(item.get("keys", [])),
                "properties": dict(item.get("properties", {})),
                "body": item["body"],
                "flag": item.get("flag", 0),
                "born_ts": item.get("born_ts", store_ts),
                "born_host": item.get("born_host", ""),
                "store_ts": store_ts,
                "position": self._position,
                "size": len(item["body"]) + 64,
                "broker_name": self.name,
            }
            q.append(msg)
            results.append(
                {
                    "msg_id": msg["msg_id"],
                    "unique_id": msg["unique_id"],
                    "queue_offset": msg["queue_offset"],
                    "position": msg["position"],
                }
            )
        event = self._arrivals.pop((topic, qid), None)
        if event is not None:
            event.set()
        return {
            "status": "SEND_OK",
            "broker_name": self.name,
            "queue_id": qid,
            "store_ts": store_ts,
            "results": results,
        }

    def put(self, topic: str, qid: int, n: int, *, tags: str = "", prefix: str = "m") -> None:
        """Store ``n`` messages directly (no HTTP)."""
        start = len(self.queue(topic, qid))
        self.append(
            topic, qid, [{"body": f"{prefix}-{qid}-{start + i}".encode(), "tags": tags} for i in range(n)]
        )

    def total(self, topic: str) -> int:
        return sum(len(q) for (t, _), q in self._queues.items() if t == topic)


class FakeNamesrv:
    def __init__(self, groups: list[FakeGroup]):
        self.groups = groups
        self.port = 0
        self.route_calls: dict[str, int] = {}
        self.stale_leader: dict[str, str | None] = {}  # group → the leader address the routes show
        self._runner: web.AppRunner | None = None

    @property
    def addr(self) -> str:
        return f"{HOST}:{self.port}"

    def broker_data(self, g: FakeGroup) -> dict[str, Any]:
        if g.name in self.stale_leader:
            leader_addr = self.stale_leader[g.name]
        else:
            leader_addr = g.leader.addr if g.leader else None
        addrs = {str(i + 1): r.addr for i, r in enumerate(g.replicas) if r.addr != leader_addr}
        if leader_addr is not None:
            addrs["0"] = leader_addr
        return {"cluster": g.cluster, "broker_name": g.name, "broker_addrs": addrs}

    def route(self, topic: str) -> dict[str, Any] | None:
        groups = sorted((g for g in self.groups if topic in g.topics), key=lambda g: g.name)
        if not groups:
            return None
        return {
            "v": 1,
            "topic": topic,
            "order": False,
            "queue_datas": [
                {
                    "broker_name": g.name,
                    "read_queue_nums": g.topics[topic].read_queue_nums,
                    "write_queue_nums": g.topics[topic].write_queue_nums,
                    "perm": g.topics[topic].perm,
                }
                for g in groups
            ],
            "broker_datas": [self.broker_data(g) for g in groups],
        }

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/routes/{topic}", self._route)
        app.router.add_get("/v1/clusters", self._clusters)
        self._runner = web.AppRunner(app, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _route(self, request: web.Request) -> web.StreamResponse:
        topic = request.match_info["topic"]
        self.route_calls[topic] = self.route_calls.get(topic, 0) + 1
        route = self.route(topic)
        if route is None:
            return pack({"v": 1, "code": "TOPIC_NOT_EXIST", "message": topic}, 404)
        return pack(route)

    async def _clusters(self, request: web.Request) -> web.StreamResponse:
        return pack(
            {
                "v": 1,
                "clusters": {"DefaultCluster": [g.name for g in self.groups]},
                "brokers": {g.name: self.broker_data(g) for g in self.groups},
            }
        )


class FakeCluster:
    """Broker groups + one NameServer, all started."""

    def __init__(self, groups: list[FakeGroup], namesrv: FakeNamesrv):
        self.groups = groups
        self.namesrv = namesrv

    @classmethod
    async def start(
        cls, n_groups: int = 1, replicas: int = 3, topics: dict[str, int] | None = None
    ) -> FakeCluster:
        groups = [FakeGroup(f"RaftNode{i:02d}", replicas) for i in range(n_groups)]
        for g in groups:
            for topic, nums in (topics or {}).items():
                g.topics[topic] = TopicConf(nums, nums)
            for r in g.replicas:
                await r.start()
        namesrv = FakeNamesrv(groups)
        await namesrv.start()
        return cls(groups, namesrv)

    @property
    def namesrv_addr(self) -> str:
        return self.namesrv.addr

    def group(self, name: str) -> FakeGroup:
        return next(g for g in self.groups if g.name == name)

    def all_requests(self, path: str) -> list[dict[str, Any]]:
        return [body for g in self.groups for r in g.replicas for p, body in r.requests if p == path]

    async def close(self) -> None:
        for g in self.groups:
            for r in g.replicas:
                await r.stop()
        await self.namesrv.stop()
