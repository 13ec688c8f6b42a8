"""In-process fakes of the NameServer and the broker HTTP APIs (docs/NAMESRV.md, docs/API.md).

``FakeCluster`` serves one or more NameServers and broker groups of three replicas each on
127.0.0.1 free ports, from an event loop on its own thread, so the code under test (``mqadmin``'s
``main``, which runs ``asyncio.run``) can be called synchronously from a test. All state lives in
plain objects owned by that loop; tests change it through ``cluster.call(fn)`` (run on the loop) or
between requests.

What the fakes model: topics (auto-created on send), messages in per-queue lists with log
positions, subscription groups, consumer offsets (never backwards except by reset), progress,
queries, heartbeats, status, leadership (a follower answers writes with ``NOT_LEADER`` and the
leader's address) and NameServer routes derived from the groups' topics. Knobs:

- ``group.leader``: index of the replica that is leader (None: no leader);
- ``group.advertised_leader``: the index the NameServer reports as id 0 (stale routes), default
  the real leader;
- ``group.claims[i] = j``: replica ``i`` (not the leader) names replica ``j`` as leader in its
  ``NOT_LEADER`` answers (a stale view), instead of the real leader;
- ``group.errors[name] = (status, code)``: the handler ``name`` answers that error;
- ``group.garbage.add(name)``: the handler ``name`` answers 200 with a list instead of a map.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack
from aiohttp import web

from broker.names import is_group, is_topic

T = TypeVar("T")
MSGPACK = "application/x-msgpack"
REPLICA = web.AppKey("replica", int)  # which replica of its group an app serves


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str = "", **extra: Any):
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message, self.extra = status, code, message, extra


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "body" and isinstance(v, bytes):
                out["body_b64"] = base64.b64encode(v).decode()
            else:
                out[str(k)] = _jsonable(v)
        return out
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def answer(request: web.Request, body: Any, status: int = 200) -> web.Response:
    wants_msgpack = MSGPACK in request.headers.get("Content-Type", "") or MSGPACK in request.headers.get(
        "Accept", ""
    )
    if wants_msgpack:
        return web.Response(body=msgpack.packb(body, use_bin_type=True), status=status, content_type=MSGPACK)
    return web.Response(text=json.dumps(_jsonable(body)), status=status, content_type="application/json")


async def read_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw:
        return {}
    try:
        if MSGPACK in request.headers.get("Content-Type", ""):
            body = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        else:
            body = json.loads(raw)
    except Exception:
        raise ApiError(400, "BAD_REQUEST", "unparsable body") from None
    if not isinstance(body, dict):
        raise ApiError(400, "BAD_REQUEST", "body must be a map")
    return body


def check_topic(topic: Any) -> str:
    if not is_topic(topic):
        raise ApiError(400, "INVALID_TOPIC", f"bad topic {topic!r}")
    return topic


def check_group(group: Any) -> str:
    if not is_group(group):
        raise ApiError(400, "INVALID_GROUP", f"bad group {group!r}")
    return group


def int_param(request: web.Request, name: str, default: int | None = None) -> int:
    raw = request.query.get(name)
    if raw is None:
        if default is None:
            raise ApiError(400, "BAD_REQUEST", f"missing {name}")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ApiError(400, "BAD_REQUEST", f"{name} must be an integer") from None


# -- broker group -----------------------------------------------------------------------------------
class FakeGroup:
    """One broker group: the state its three replicas share (as if replicated instantly)."""

    def __init__(self, cluster: FakeCluster, name: str, cluster_name: str, replicas: int = 3):
        self.cluster = cluster
        self.name = name
        self.cluster_name = cluster_name
        self.addrs: list[str] = [""] * replicas
        self.leader: int | None = 0
        self.advertised_leader: int | None = -1  # -1: the real leader
        self.term = 1
        self.errors: dict[str, tuple[int, str]] = {}
        self.garbage: set[str] = set()  # handlers that answer 200 with a body of the wrong shape
        self.claims: dict[int, int | None] = {}  # replica -> the leader it names in NOT_LEADER (stale views)
        self.topics: dict[str, dict[str, Any]] = {}
        self.queues: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.by_position: dict[int, dict[str, Any]] = {}
        self.next_position = 0
        self.groups: dict[str, dict[str, Any]] = {}
        self.offsets: dict[tuple[str, str], dict[int, int]] = {}
        self.consumers: dict[str, set[str]] = {}
        self.requests: list[tuple[int, str, str]] = []  # (replica, method, path) of every request
        self.sends = 0
        self._arrived: asyncio.Event | None = None

    # state changes (on the fake loop) ---------------------------------------------------------
    def create_topic(
        self, topic: str, read: int = 4, write: int = 4, perm: int = 6, order: bool = False
    ) -> dict:
        cfg = {
            "topic": topic,
            "read_queue_nums": read,
            "write_queue_nums": write,
            "perm": perm,
            "order": order,
        }
        self.topics[topic] = cfg
        for ns in self.cluster.namesrvs:  # the leader re-registers at once
            ns.registered.setdefault(self.name, {})[topic] = dict(cfg)
        return cfg

    def append(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        *,
        tags: str = "",
        keys: list[str] | None = None,
        properties: dict[str, str] | None = None,
        unique_id: str | None = None,
        born_ts: int | None = None,
        store_ts: int | None = None,
        born_host: str = "127.0.0.1",
    ) -> dict[str, Any]:
        if topic not in self.topics:
            self.create_topic(topic)
        q = self.queues.setdefault((topic, queue_id), [])
        position = self.next_position
        size = 64 + len(body)
        self.next_position += size
        ts = store_ts if store_ts is not None else now_ms()
        msg = {
            "topic": topic,
            "queue_id": queue_id,
            "queue_offset": len(q),
            "msg_id": f"{self.name}:{position:016X}",
            "unique_id": unique_id or uuid.uuid4().hex,
            "tags": tags,
            "keys": list(keys or []),
            "properties": dict(properties or {}),
            "body": body,
            "flag": 0,
            "born_ts": born_ts if born_ts is not None else ts,
            "born_host": born_host,
            "store_ts": ts,
            "position": position,
            "size": size,
            "broker_name": self.name,
        }
        q.append(msg)
        self.by_position[position] = msg
        if self._arrived is not None:
            self._arrived.set()
            self._arrived = None
        return msg

    def queue(self, topic: str, queue_id: int) -> list[dict[str, Any]]:
        return self.queues.get((topic, queue_id), [])

    def registered_addrs(self) -> dict[str, str]:
        """``broker_addrs`` as the NameServer reports them: the leader under "0", followers under i+1."""
        lead = self.leader if self.advertised_leader == -1 else self.advertised_leader
        out = {}
        for i, addr in enumerate(self.addrs):
            out["0" if i == lead else str(i + 1)] = addr
        return dict(sorted(out.items(), key=lambda kv: int(kv[0])))

    # HTTP -------------------------------------------------------------------------------------
    def app(self, idx: int) -> web.Application:
        app = web.Application(middlewares=[self._middleware(idx)])
        r = app.router
        r.add_post("/v1/send", self.h_send)
        r.add_post("/v1/pull", self.h_pull)
        r.add_get("/v1/msg/id/{msg_id}", self.h_msg_id)
        r.add_get("/v1/msg/key", self.h_msg_key)
        r.add_get("/v1/msg/unique", self.h_msg_unique)
        r.add_get("/v1/msg/offset", self.h_msg_offset)
        r.add_get("/v1/offset/search", self.h_offset_search)
        r.add_post("/v1/topics", self.h_topic_update)
        r.add_get("/v1/topics", self.h_topic_list)
        r.add_get("/v1/topics/{topic}/status", self.h_topic_status)
        r.add_get("/v1/topics/{topic}", self.h_topic_get)
        r.add_delete("/v1/topics/{topic}", self.h_topic_delete)
        r.add_post("/v1/groups", self.h_group_update)
        r.add_get("/v1/groups", self.h_group_list)
        r.add_delete("/v1/groups/{group}", self.h_group_delete)
        r.add_get("/v1/groups/{group}/progress", self.h_progress)
        r.add_get("/v1/groups/{group}/consumers", self.h_consumers)
        r.add_post("/v1/offsets", self.h_offsets_commit)
        r.add_get("/v1/offsets", self.h_offsets_get)
        r.add_post("/v1/offsets/reset", self.h_offsets_reset)
        r.add_post("/v1/heartbeat", self.h_heartbeat)
        r.add_post("/v1/unregister", self.h_unregister)
        r.add_get("/v1/status", self.h_status)
        r.add_post("/v1/admin/transfer", self.h_transfer)
        app[REPLICA] = idx
        return app

    _WRITES = frozenset(
        {
            "h_send",
            "h_topic_update",
            "h_topic_delete",
            "h_group_update",
            "h_group_delete",
            "h_offsets_commit",
            "h_offsets_reset",
        }
    )

    def _middleware(self, idx: int) -> Any:
        @web.middleware
        async def mw(request: web.Request, handler: Any) -> web.StreamResponse:
            name = getattr(handler, "__name__", "")
            self.requests.append((idx, request.method, request.path))
            self.cluster.sequence.append((self.name, request.method, request.path))
            try:
                if name in self.garbage:
                    return answer(request, ["not", "a", "map"])
                if name in self.errors:
                    status, code = self.errors[name]
                    raise ApiError(status, code, f"injected by the test ({name})")
                if name in self._WRITES and idx != self.leader:
                    named = self.claims.get(idx, self.leader)
                    leader = self.addrs[named] if named is not None else None
                    raise ApiError(409, "NOT_LEADER", f"replica {idx} is not the leader", leader_addr=leader)
                return await handler(request)
            except ApiError as exc:
                return answer(request, {"code": exc.code, "message": exc.message, **exc.extra}, exc.status)

        return mw

    def _topic(self, topic: Any) -> dict[str, Any]:
        cfg = self.topics.get(check_topic(topic))
        if cfg is None:
            raise ApiError(404, "TOPIC_NOT_EXIST", f"topic {topic} does not exist")
        return cfg

    async def h_send(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        topic = check_topic(body.get("topic"))
        if topic not in self.topics:
            self.create_topic(topic)
        cfg = self.topics[topic]
        if not cfg["perm"] & 2:
            raise ApiError(403, "NO_PERMISSION", f"topic {topic} is not writable")
        qid = body.get("queue_id")
        if not isinstance(qid, int) or not 0 <= qid < cfg["write_queue_nums"]:
            raise ApiError(400, "INVALID_QUEUE_ID", f"bad queue id {qid!r}")
        items = body.get("messages")
        if not isinstance(items, list) or not 1 <= len(items) <= 1024:
            raise ApiError(400, "INVALID_BATCH", "messages must be 1..1024")
        ts = now_ms()
        results = []
        for m in items:
            if not isinstance(m.get("body"), bytes) or not m["body"]:
                raise ApiError(400, "INVALID_BODY", "body must be non-empty bytes")
        for m in items:
            keys = m.get("keys") or []
            stored = self.append(
                topic,
                qid,
                m["body"],
                tags=m.get("tags") or "",
                keys=keys.split() if isinstance(keys, str) else list(keys),
                properties=m.get("properties"),
                unique_id=m.get("unique_id"),
                born_ts=m.get("born_ts"),
                store_ts=ts,
                born_host=m.get("born_host") or "127.0.0.1",
            )
            results.append({k: stored[k] for k in ("msg_id", "unique_id", "queue_offset", "position")})
        self.sends += 1
        return answer(
            request,
            {
                "status": "SEND_OK",
                "broker_name": self.name,
                "queue_id": qid,
                "store_ts": ts,
                "results": results,
            },
        )

    async def h_pull(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        cfg = self._topic(body.get("topic"))
        qid = body.get("queue_id")
        if not isinstance(qid, int) or not 0 <= qid < cfg["read_queue_nums"]:
            raise ApiError(400, "INVALID_QUEUE_ID", f"bad queue id {qid!r}")
        offset = int(body.get("offset", 0))
        max_count = int(body.get("max_count", 32))
        suspend_s = min(int(body.get("suspend_ms", 0)), 2000) / 1000  # capped: the fakes stop quickly
        tags = body.get("tags") or "*"
        q = self.queue(cfg["topic"], qid)
        if offset >= len(q) and suspend_s > 0:
            if self._arrived is None:
                self._arrived = asyncio.Event()
            try:
                await asyncio.wait_for(self._arrived.wait(), suspend_s)
            except TimeoutError:
                pass
            q = self.queue(cfg["topic"], qid)
        base = {"min_offset": 0, "max_offset": len(q)}
        if offset > len(q):
            return answer(
                request, {"status": "OFFSET_OVERFLOW", "next_offset": len(q), **base, "messages": []}
            )
        if offset == len(q):
            return answer(request, {"status": "NO_NEW_MSG", "next_offset": offset, **base, "messages": []})
        scanned = q[offset : offset + max_count]
        wanted = set(tags.split("||")) if tags != "*" else None
        msgs = [m for m in scanned if wanted is None or m["tags"] in wanted]
        status = "FOUND" if msgs else "NO_MATCHED_MSG"
        return answer(
            request, {"status": status, "next_offset": offset + len(scanned), **base, "messages": msgs}
        )

    async def h_msg_id(self, request: web.Request) -> web.Response:
        msg_id = request.match_info["msg_id"]
        name, _, hexpos = msg_id.rpartition(":")
        try:
            position = int(hexpos, 16)
        except ValueError:
            raise ApiError(400, "INVALID_MSG_ID", msg_id) from None
        msg = self.by_position.get(position) if name == self.name else None
        if msg is None:
            raise ApiError(404, "MESSAGE_NOT_FOUND", f"no message {msg_id}")
        return answer(request, msg)

    async def h_msg_key(self, request: web.Request) -> web.Response:
        topic = self._topic(request.query.get("topic"))["topic"]
        key = request.query.get("key", "")
        limit = int_param(request, "max", 64)
        found = [m for (t, _), q in self.queues.items() if t == topic for m in q if key in m["keys"]]
        found.sort(key=lambda m: -m["position"])
        return answer(request, {"messages": found[:limit]})

    async def h_msg_unique(self, request: web.Request) -> web.Response:
        topic = self._topic(request.query.get("topic"))["topic"]
        uid = request.query.get("unique_id", "")
        found = [m for (t, _), q in self.queues.items() if t == topic for m in q if m["unique_id"] == uid]
        return answer(request, {"messages": found})

    async def h_msg_offset(self, request: web.Request) -> web.Response:
        topic = self._topic(request.query.get("topic"))["topic"]
        q = self.queue(topic, int_param(request, "queue_id"))
        offset = int_param(request, "offset")
        if not 0 <= offset < len(q):
            raise ApiError(404, "MESSAGE_NOT_FOUND", f"no message at offset {offset}")
        return answer(request, q[offset])

    async def h_offset_search(self, request: web.Request) -> web.Response:
        topic = self._topic(request.query.get("topic"))["topic"]
        q = self.queue(topic, int_param(request, "queue_id"))
        ts = int_param(request, "ts")
        offset = next((m["queue_offset"] for m in q if m["store_ts"] >= ts), len(q))
        return answer(request, {"offset": offset})

    async def h_topic_update(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        topic = check_topic(body.get("topic"))
        for f in ("read_queue_nums", "write_queue_nums"):
            if not 1 <= int(body.get(f, 4)) <= 1024:
                raise ApiError(400, "INVALID_QUEUE_NUMS", f)
        if not 0 <= int(body.get("perm", 6)) <= 7:
            raise ApiError(400, "INVALID_PERM", "perm")
        cfg = self.create_topic(
            topic,
            int(body.get("read_queue_nums", 4)),
            int(body.get("write_queue_nums", 4)),
            int(body.get("perm", 6)),
            bool(body.get("order", False)),
        )
        return answer(request, cfg)

    async def h_topic_list(self, request: web.Request) -> web.Response:
        return answer(request, {"topics": [self.topics[t] for t in sorted(self.topics)]})

    async def h_topic_get(self, request: web.Request) -> web.Response:
        return answer(request, self._topic(request.match_info["topic"]))

    async def h_topic_delete(self, request: web.Request) -> web.Response:
        cfg = self._topic(request.match_info["topic"])
        del self.topics[cfg["topic"]]
        return answer(request, {"topic": cfg["topic"], "deleted": True})

    async def h_topic_status(self, request: web.Request) -> web.Response:
        cfg = self._topic(request.match_info["topic"])
        queues = []
        for qid in range(max(cfg["read_queue_nums"], cfg["write_queue_nums"])):
            q = self.queue(cfg["topic"], qid)
            queues.append(
                {
                    "queue_id": qid,
                    "min_offset": 0,
                    "max_offset": len(q),
                    "last_store_ts": q[-1]["store_ts"] if q else 0,
                }
            )
        return answer(request, {"topic": cfg["topic"], "queues": queues})

    async def h_group_update(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        group = check_group(body.get("group"))
        cfg = {
            "group": group,
            "consume_enable": bool(body.get("consume_enable", True)),
            "consume_broadcast_enable": bool(body.get("consume_broadcast_enable", True)),
            "retry_max_times": int(body.get("retry_max_times", 16)),
        }
        self.groups[group] = cfg
        return answer(request, cfg)

    async def h_group_list(self, request: web.Request) -> web.Response:
        return answer(request, {"groups": [self.groups[g] for g in sorted(self.groups)]})

    async def h_group_delete(self, request: web.Request) -> web.Response:
        group = check_group(request.match_info["group"])
        if self.groups.pop(group, None) is None:
            raise ApiError(404, "SUBSCRIPTION_GROUP_NOT_EXIST", group)
        return answer(request, {"group": group, "deleted": True})

    async def h_progress(self, request: web.Request) -> web.Response:
        group = check_group(request.match_info["group"])
        known = {t for (g, t) in self.offsets if g == group}
        if group not in self.groups and not known:
            raise ApiError(404, "SUBSCRIPTION_GROUP_NOT_EXIST", f"group {group} does not exist")
        topics, total = [], 0
        for topic in sorted(known):
            if topic not in self.topics:
                continue
            committed = self.offsets[(group, topic)]
            queues = []
            for qid in range(self.topics[topic]["read_queue_nums"]):
                q = self.queue(topic, qid)
                coff = committed.get(qid)
                lag = len(q) - (coff or 0)
                total += lag
                last = q[coff - 1]["store_ts"] if coff else None
                queues.append(
                    {
                        "queue_id": qid,
                        "broker_offset": len(q),
                        "consumer_offset": coff,
                        "lag": lag,
                        "last_ts": last,
                    }
                )
            topics.append({"topic": topic, "queues": queues})
        return answer(request, {"group": group, "topics": topics, "total_lag": total})

    async def h_consumers(self, request: web.Request) -> web.Response:
        group = check_group(request.match_info["group"])
        return answer(request, {"group": group, "client_ids": sorted(self.consumers.get(group, ()))})

    async def h_offsets_commit(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        key = (check_group(body.get("group")), self._topic(body.get("topic"))["topic"])
        committed = self.offsets.setdefault(key, {})
        updated = 0
        for qid, off in dict(body.get("offsets") or {}).items():
            if int(off) > committed.get(int(qid), -1):
                committed[int(qid)] = int(off)
                updated += 1
        return answer(request, {"updated": updated})

    async def h_offsets_get(self, request: web.Request) -> web.Response:
        key = (check_group(request.query.get("group")), check_topic(request.query.get("topic")))
        return answer(request, {"offsets": {str(q): o for q, o in self.offsets.get(key, {}).items()}})

    async def h_offsets_reset(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        group = check_group(body.get("group"))
        cfg = self._topic(body.get("topic"))
        new: dict[int, int] = {}
        if "ts" in body:
            for qid in range(cfg["read_queue_nums"]):
                q = self.queue(cfg["topic"], qid)
                new[qid] = next((m["queue_offset"] for m in q if m["store_ts"] >= int(body["ts"])), len(q))
        else:
            new = {int(q): int(o) for q, o in dict(body.get("offsets") or {}).items()}
        self.offsets.setdefault((group, cfg["topic"]), {}).update(new)
        return answer(request, {"offsets": {str(q): o for q, o in new.items()}})

    async def h_heartbeat(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        for g in body.get("groups") or []:
            self.consumers.setdefault(str(g.get("group")), set()).add(str(body.get("client_id")))
        return answer(request, {"ok": True})

    async def h_unregister(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        for ids in self.consumers.values():
            ids.discard(str(body.get("client_id")))
        return answer(request, {"ok": True})

    async def h_status(self, request: web.Request) -> web.Response:
        idx = request.app[REPLICA]
        leader = self.leader
        return answer(
            request,
            {
                "cluster": self.cluster_name,
                "broker_name": self.name,
                "self_id": f"n{idx}",
                "broker_id": 0 if idx == leader else idx + 1,
                "address": self.addrs[idx],
                "role": "LEADER" if idx == leader else "FOLLOWER",
                "term": self.term,
                "leader_id": f"n{leader}" if leader is not None else None,
                "leader_addr": self.addrs[leader] if leader is not None else None,
                "writable": idx == leader,
                "commit_index": 100 + self.sends,
                "applied_index": 100 + self.sends,
                "first_index": 1,
                "last_index": 100 + self.sends,
                "peers": {f"n{i}": {"lag": 0, "connected": True} for i in range(len(self.addrs)) if i != idx},
                "topics": len(self.topics),
                "dispatch": {"behind": 0},
                "send": {"count": self.sends},
            },
        )

    async def h_transfer(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        target = body.get("target")
        if target is None:
            new = ((self.leader or 0) + 1) % len(self.addrs)
        else:
            ids = [f"n{i}" for i in range(len(self.addrs))]
            if target not in ids:
                raise ApiError(400, "INVALID_TARGET", f"unknown peer {target!r}")
            new = ids.index(target)
        self.leader = new
        self.term += 1
        return answer(request, {"leader_id": f"n{new}"})


# -- NameServer -------------------------------------------------------------------------------------
class FakeNamesrv:
    def __init__(self, cluster: FakeCluster):
        self.cluster = cluster
        # what the leaders last registered: broker name -> topic -> config (a broker's topic deletion
        # reaches the NameServer only with its next registration, which the fake never sends)
        self.registered: dict[str, dict[str, dict[str, Any]]] = {}
        self.addr = ""
        self.requests: list[tuple[str, str]] = []

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get("/v1/routes/{topic}", self.h_route)
        app.router.add_get("/v1/clusters", self.h_clusters)
        app.router.add_get("/v1/topics", self.h_topics)
        app.router.add_delete("/v1/topics/{topic}", self.h_delete)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        self.cluster.sequence.append((self.addr, request.method, request.path))
        try:
            return await handler(request)
        except ApiError as exc:  # NameServer errors are always JSON
            body = {"v": 1, "code": exc.code, "message": exc.message}
            return web.Response(text=json.dumps(body), status=exc.status, content_type="application/json")

    def topics(self) -> set[str]:
        return {t for topics in self.registered.values() for t in topics}

    def broker_data(self, g: FakeGroup) -> dict[str, Any]:
        return {"cluster": g.cluster_name, "broker_name": g.name, "broker_addrs": g.registered_addrs()}

    async def h_route(self, request: web.Request) -> web.Response:
        topic = check_topic(request.match_info["topic"])
        groups = [g for g in self.cluster.groups if topic in self.registered.get(g.name, {})]
        if not groups:
            raise ApiError(404, "TOPIC_NOT_EXIST", f"no route for topic {topic}")
        cfgs = [self.registered[g.name][topic] for g in groups]
        qds = [
            {
                "broker_name": g.name,
                "read_queue_nums": c["read_queue_nums"],
                "write_queue_nums": c["write_queue_nums"],
                "perm": c["perm"],
            }
            for g, c in zip(groups, cfgs, strict=True)
        ]
        return answer(
            request,
            {
                "v": 1,
                "topic": topic,
                "order": any(c["order"] for c in cfgs),
                "queue_datas": qds,
                "broker_datas": [self.broker_data(g) for g in groups],
            },
        )

    async def h_clusters(self, request: web.Request) -> web.Response:
        clusters: dict[str, list[str]] = {}
        for g in self.cluster.groups:
            clusters.setdefault(g.cluster_name, []).append(g.name)
        brokers = {g.name: self.broker_data(g) for g in self.cluster.groups}
        return answer(request, {"v": 1, "clusters": clusters, "brokers": brokers})

    async def h_topics(self, request: web.Request) -> web.Response:
        return answer(request, {"v": 1, "topics": sorted(self.topics())})

    async def h_delete(self, request: web.Request) -> web.Response:
        topic = check_topic(request.match_info["topic"])
        if topic not in self.topics():
            raise ApiError(404, "TOPIC_NOT_EXIST", f"no route for topic {topic}")
        for topics in self.registered.values():
            topics.pop(topic, None)
        return answer(request, {"v": 1, "topic": topic, "deleted": True})


# -- the whole thing --------------------------------------------------------------------------------
class FakeCluster:
    """NameServers + broker groups on a private event loop thread; ``with FakeCluster() as c: ...``."""

    def __init__(
        self,
        groups: tuple[str, ...] = ("RaftNode00", "RaftNode01"),
        namesrvs: int = 1,
        cluster_name: str = "DefaultCluster",
    ):
        self.groups = [FakeGroup(self, g, cluster_name) for g in groups]
        self.namesrvs = [FakeNamesrv(self) for _ in range(namesrvs)]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-cluster", daemon=True)
        self._runners: list[web.AppRunner] = []
        self.sequence: list[tuple[str, str, str]] = []  # (group name or NameServer address, method, path)

    @property
    def namesrv(self) -> str:
        """The ``-n`` value: every NameServer, ';'-separated."""
        return ";".join(ns.addr for ns in self.namesrvs)

    def group(self, name: str) -> FakeGroup:
        return next(g for g in self.groups if g.name == name)

    def call(self, fn: Callable[[], T], timeout_s: float = 5.0) -> T:
        """Run ``fn`` on the fakes' loop (where their state lives) and return its result."""

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout_s)

    async def _serve(self, app: web.Application) -> str:
        runner = web.AppRunner(app, shutdown_timeout=0.5, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runners.append(runner)
        server = site._server
        assert server is not None
        port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return f"127.0.0.1:{port}"

    async def _start(self) -> None:
        for ns in self.namesrvs:
            ns.addr = await self._serve(ns.app())
        for g in self.groups:
            for i in range(len(g.addrs)):
                g.addrs[i] = await self._serve(g.app(i))

    async def _stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()

    def start(self) -> FakeCluster:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> FakeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
