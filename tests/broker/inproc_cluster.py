"""Real broker groups inside the test's event loop: the in-process twin of a cluster.

- One (or more) real NameServers (``namesrv.server.NamesrvService``) on free 127.0.0.1 ports.
- Per broker group, three real ``BrokerServer`` replicas whose Raft traffic goes over the group's own
  ``InProcNetwork`` (no Raft sockets) and whose Raft log and term/vote live in memory
  (``MemoryLogStore`` / ``MemoryMetaStore``, kept across a restart like a disk would be); consume
  queues, key index and snapshots live under the test's tmp dir. The HTTP APIs listen on free
  127.0.0.1 ports, so the SDK and the tools talk to them for real.
- ACL on everywhere (``tests/acl_fixtures.py``): each group registers with its own account; tests
  hand ``cluster.credentials`` (the admin) or a narrower account to the SDK.
- Every group starts with ``n0`` as its ready leader, registered as broker id 0 at every NameServer
  (leadership is handed to it if another replica won the first election), so tests start from a
  known shape.

Faults are produced for real where the real system can produce them: ``kill`` (a crash as the
NameServers see it: no unregistration), ``stop``/``start`` a replica, ``cut``/``isolate`` Raft links,
``transfer`` leadership, refuse registrations at a NameServer (a route that stays stale).

``Tap``: each replica and NameServer has one, an aiohttp middleware placed right after the edge
guard. It records every request (method, path, decoded body) and injects the few faults the real
servers cannot produce on demand: an error answer (``fail``), a request held until teardown
(``hang``), a 200 answer of the wrong shape (``garbage``), a request handled for real whose answer is
replaced by an error (``lose_answer``: stored, but the client cannot know). It is the only thing here that is not the
real server, and it never answers a request it was not told to fault.

Everything is stopped by ``stop()`` (the fixtures' teardown): held requests are released, then the
brokers (their tick threads joined), then the NameServers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import os
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import msgpack
import pytest
from aiohttp import web

from broker.client.transport import Transport
from broker.edge.http_api import BrokerApi
from broker.edge.http_codec import answer, error
from broker.protocol.auth import AuthError, Credentials, parse_authorization
from broker.server.broker_server import BrokerServer
from broker.server.config import BrokerConfig, parse_broker_config
from broker.serving.http_edge import request_body
from dledger.inproc import InProcNetwork
from dledger.memory_store import MemoryLogStore
from dledger.meta_store import MemoryMetaStore
from namesrv.config import NamesrvConfig
from namesrv.server import NamesrvService
from tests.acl_fixtures import ADMIN, BROKER_G0, BROKER_G1, write_acl
from tests.dledger.harness import HOST, PASSWORD, free_ports, wait_until

CLUSTER = "DefaultCluster"
GROUP_ACCOUNTS = {"RaftNode00": BROKER_G0, "RaftNode01": BROKER_G1}
WAIT_S = 20.0  # every wait on a condition fails after this (a busy 2-core machine), never hangs
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# -- Tap: what a server saw, and the faults it is told to inject --------------------------------------
@dataclasses.dataclass(frozen=True)
class Seen:
    server: str  # "RaftNode00/n1" or "namesrv0"
    method: str
    path: str
    body: dict[str, Any]  # the decoded body of a request that has one, else the query
    # what a capture of the request on the wire holds (a test replays it: tests/broker/client/test_replays.py)
    target: str = ""
    authorization: str | None = None
    raw: bytes = b""


@dataclasses.dataclass
class _Fault:
    path: str
    method: str | None
    times: int
    status: int = 0
    code: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    hang: bool = False
    garbage: bool = False
    lose: bool = False
    when: Callable[[Seen], bool] | None = None

    def matches(self, seen: Seen) -> bool:
        return (
            self.times > 0
            and seen.path == self.path
            and self.method in (None, seen.method)
            and (self.when is None or self.when(seen))
        )


class Tap:
    """An aiohttp middleware: records requests, injects scripted faults (see the module docstring)."""

    def __init__(self, name: str, journal: list[Seen]):
        self.name = name
        self.requests: list[Seen] = []
        self._journal = journal  # every server's requests, in arrival order
        self._faults: list[_Fault] = []
        self._observers: list[Callable[[Seen], None]] = []
        self._released = asyncio.Event()
        self.scope: str | None = None  # the server's signing scope (set with the server)

    # -- scripting ------------------------------------------------------------------------------
    def fail(
        self,
        path: str,
        code: str,
        status: int = 503,
        *,
        times: int = 1,
        method: str | None = None,
        when: Callable[[Seen], bool] | None = None,
        **extra: Any,
    ) -> None:
        """The next ``times`` requests to ``path`` (that ``when`` accepts) are answered ``status``
        ``{code, message, **extra}``."""
        self._faults.append(_Fault(path, method, times, status, code, extra, when=when))

    def hang(self, path: str, *, times: int = 1, method: str | None = None) -> None:
        """The next ``times`` requests to ``path`` are held unanswered until teardown."""
        self._faults.append(_Fault(path, method, times, hang=True))

    def lose_answer(
        self, path: str, code: str = "SEND_TIMEOUT", status: int = 504, *, times: int = 1, method: str | None = None
    ) -> None:
        """The next ``times`` requests to ``path`` are handled for real, then their answer is
        replaced by ``status`` ``{code, message}``: the request took effect, the client cannot know."""
        self._faults.append(_Fault(path, method, times, status, code, lose=True))

    def garbage(self, path: str, *, times: int = 1_000_000, method: str | None = None) -> None:
        """Requests to ``path`` are answered 200 with a list where a map belongs."""
        self._faults.append(_Fault(path, method, times, garbage=True))

    def observe(self, fn: Callable[[Seen], None]) -> None:
        """``fn(seen)`` for every request, as it arrives (before the server handles it)."""
        self._observers.append(fn)

    def release(self) -> None:
        self._released.set()

    # -- reading --------------------------------------------------------------------------------
    def seen(self, path: str, method: str | None = None, *, prefix: bool = False) -> list[Seen]:
        return [
            s
            for s in self.requests
            if (s.path.startswith(path) if prefix else s.path == path) and method in (None, s.method)
        ]

    # -- the middleware -------------------------------------------------------------------------
    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._signed_for_another_scope(request):
            # the client's first request to this server, signed before it knew the scope: refused
            # from its head, signed again and resent; not what a test counts or faults
            return await handler(request)
        seen = Seen(self.name, request.method, request.path, await _decoded(request), request.raw_path,
                    request.headers.get("Authorization"), await request_body(request) if request.body_exists else b"")
        self.requests.append(seen)
        self._journal.append(seen)
        for fn in self._observers:
            fn(seen)
        fault = next((f for f in self._faults if f.matches(seen)), None)
        if fault is None:
            return await handler(request)
        if fault.lose:  # only an answer the server gave for real is lost (not a refusal, e.g. WRONG_SCOPE)
            real = await handler(request)
            if real.status >= 400:
                return real
            fault.times -= 1
            return error(request, fault.status, fault.code, f"answer lost, injected by the test ({self.name})")
        fault.times -= 1
        if fault.hang:
            await self._released.wait()
            return error(request, 503, "SHUTTING_DOWN", "released at teardown")
        if fault.garbage:
            return answer(request, ["not", "a", "map"])
        return error(request, fault.status, fault.code, f"injected by the test ({self.name})", **fault.extra)


    def _signed_for_another_scope(self, request: web.Request) -> bool:
        try:
            signed = parse_authorization(request.headers.get("Authorization"))
        except AuthError:
            return False
        return self.scope is not None and signed.scope != self.scope


async def _decoded(request: web.Request) -> dict[str, Any]:
    if not request.body_exists:
        return dict(request.query)
    raw = await request_body(request)  # cached: the handler reads the same bytes
    try:
        if request.content_type == "application/json":
            value = json.loads(raw)
        else:
            value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception:  # the server answers it; the record keeps what could be read
        return {"raw": raw}
    return value if isinstance(value, dict) else {"raw": value}


class _TappedBrokerApi(BrokerApi):
    def __init__(self, server: BrokerServer, tap: Tap):
        super().__init__(server, server.service)
        self.tap = tap
        tap.scope = server.security.scope

    def app(self) -> web.Application:
        app = super().app()
        app.middlewares.insert(1, self.tap.middleware)  # after the edge guard, before ACL and handlers
        return app


class _TappedNamesrv(NamesrvService):
    def __init__(self, cfg: NamesrvConfig, tap: Tap):
        super().__init__(cfg)
        self.tap = tap
        tap.scope = self.security.scope

    def app(self) -> web.Application:
        app = super().app()
        app.middlewares.insert(1, self.tap.middleware)
        return app


# -- the parts ----------------------------------------------------------------------------------------
class NameServer:
    def __init__(self, index: int, acl_file: str, journal: list[Seen], **cfg: Any):
        self.tap = Tap(f"namesrv{index}", journal)
        self.service = _TappedNamesrv(NamesrvConfig(listen_port=0, acl_file=acl_file, **cfg), self.tap)
        self.runner: web.AppRunner | None = None
        self.addr = ""

    async def start(self) -> None:
        self.runner, self.addr = await self.service.serve(HOST, 0)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    def refuse_registrations(self, group: str | None = None) -> None:
        """From now on registrations (of ``group``, or of everyone) are refused: the routes this
        NameServer gives stay as they are, however leadership moves."""

        self.tap.fail(
            "/v1/brokers/register", "SHUTTING_DOWN", 503, times=1_000_000,
            when=lambda seen: group in (None, seen.body.get("broker_name")),
        )


class Replica:
    def __init__(self, group: Group, index: int, http_port: int):
        self.group = group
        self.index = index
        self.nid = f"n{index}"
        self.http_port = http_port
        self.tap = Tap(f"{group.name}/{self.nid}", group.cluster.journal)
        self.log_store = MemoryLogStore()  # the replica's "disk"
        self.meta = MemoryMetaStore()
        self.server: BrokerServer | None = None
        self.starts = 0

    def reopen_disk(self) -> None:
        """What a restarted process finds: every entry written (a process crash keeps the page
        cache), the durable term and vote."""
        self.log_store = self.log_store.crash_image(keep_unsynced=1 << 62)
        self.meta = self.meta.crash_image()

    @property
    def addr(self) -> str:
        return f"{HOST}:{self.http_port}"

    @property
    def raft_addr(self) -> str:
        """Only a name on the group's InProcNetwork: nothing listens there."""
        return f"{HOST}:{self.group.raft_base_port + self.index}"

    @property
    def alive(self) -> bool:
        return self.server is not None

    @property
    def broker(self) -> BrokerServer:
        assert self.server is not None, f"{self.tap.name} is not running"
        return self.server

    @property
    def is_ready_leader(self) -> bool:
        return self.server is not None and self.server.node.role == "LEADER" and self.server.ready

    def __repr__(self) -> str:
        return f"Replica({self.tap.name}, {self.addr}, {'up' if self.alive else 'down'})"


class Group:
    """One broker group: three replicas on one InProcNetwork."""

    def __init__(self, cluster: InProcBrokerCluster, name: str, index: int, http_ports: Sequence[int]):
        self.cluster = cluster
        self.name = name
        # Virtual Raft addresses (InProcNetwork): ports below the OS's ephemeral range, so that no
        # free HTTP port it hands out can equal one (a config naming its HTTP port as a peer's Raft
        # port is refused; 40000-range ports collided on a busy machine).
        self.raft_base_port = 1000 + 10 * index
        self.network = InProcNetwork()
        self.replicas = [Replica(self, i, port) for i, port in enumerate(http_ports)]

    def replica(self, nid: str) -> Replica:
        return next(r for r in self.replicas if r.nid == nid)

    def config(self, r: Replica) -> BrokerConfig:
        account = GROUP_ACCOUNTS[self.name]
        props = {
            "brokerClusterName": CLUSTER,
            "brokerName": self.name,
            "dLegerGroup": self.name,
            "dLegerPeers": ";".join(f"{p.nid}-{p.raft_addr}" for p in self.replicas),
            "dLegerSelfId": r.nid,
            "dLegerPeerPassword": PASSWORD,
            "storePathRootDir": os.path.join(self.cluster.root, self.name, r.nid),
            "listenPort": str(r.http_port),
            "brokerIP1": HOST,
            "namesrvAddr": self.cluster.namesrv_addr,
            "brokerPeerClientAddrs": ";".join(f"{p.nid}-{p.addr}" for p in self.replicas),
            "storeSnapshotIntervalMs": "200",
            "aclEnable": "true",
            "aclFile": self.cluster.acl_file,
            "brokerAccessKey": account.access_key,
            "brokerSecretKey": account.secret_key,
            "remotingListenPort": "-1",  # HTTP only (the Tap sees every request); tests turn it on
            **self.cluster.broker_props,
        }
        return parse_broker_config(props, source=f"<in-process {self.name}/{r.nid}>", env={})

    # -- life cycle of replicas -----------------------------------------------------------------
    async def start(self, nid: str) -> Replica:
        r = self.replica(nid)
        assert r.server is None, f"{r} is running"
        if r.starts:
            r.reopen_disk()
        r.starts += 1
        server = BrokerServer(self.config(r), network=self.network, log_store=r.log_store, meta=r.meta)
        server.api = _TappedBrokerApi(server, r.tap)
        try:
            await server.start()
        except BaseException:  # e.g. its port was taken meanwhile: end what did start (the tick thread)
            await server.stop(unregister=False)
            raise
        r.server = server
        return r

    async def kill(self, nid: str) -> None:
        """End a replica as a crash looks from outside: its port refuses connections, its Raft
        links go down, the NameServers keep its registration (until it would expire)."""
        r = self.replica(nid)
        server, r.server = r.broker, None
        await server.stop(unregister=False)

    async def stop(self, nid: str) -> None:
        """End a replica the way SIGTERM does (it unregisters)."""
        r = self.replica(nid)
        server, r.server = r.broker, None
        await server.stop()

    # -- Raft links -----------------------------------------------------------------------------
    def cut(self, a: str, b: str) -> None:
        self.network.cut(self.replica(a).raft_addr, self.replica(b).raft_addr)

    def isolate(self, nid: str) -> None:
        r = self.replica(nid)
        for other in self.replicas:
            if other is not r:
                self.network.cut(r.raft_addr, other.raft_addr)

    def heal(self) -> None:
        self.network.heal_all()

    # -- leadership -----------------------------------------------------------------------------
    def leader(self) -> Replica | None:
        """The ready leader (writable), if exactly one replica is."""
        ready = [r for r in self.replicas if r.is_ready_leader]
        return ready[0] if len(ready) == 1 else None

    async def wait_leader(self, nid: str | None = None, *, registered: bool = True) -> Replica:
        """A ready leader (``nid`` if given) that every live replica follows and, with
        ``registered``, that every NameServer routes as broker id 0."""

        async def found() -> Replica | None:
            r = self.leader()
            if r is None or nid not in (None, r.nid):
                return None
            if any(p.alive and p.broker.node.leader_id != r.nid for p in self.replicas):
                return None
            if registered and not await self.cluster.routed_as_leader(self.name, r.addr):
                return None
            return r

        return await wait_until(found, WAIT_S, f"a leader of {self.name}" + (f" ({nid})" if nid else ""))

    async def transfer(self, nid: str, *, registered: bool = True) -> Replica:
        """Hand leadership to ``nid`` (from the current ready leader) and wait until it leads. A
        transfer the leader refuses (``nid`` not caught up yet, e.g. right after an election) is
        asked again until the deadline."""

        async def moved() -> bool:
            current = self.leader() or await self.wait_leader(registered=False)
            if current.nid != nid:
                await current.broker.node.transfer_leadership(nid, timeout_s=3.0)  # raises when refused
            return True

        await wait_until(moved, WAIT_S, f"leadership of {self.name} handed to {nid}", step_s=0.05)
        return await self.wait_leader(nid, registered=registered)

    async def wait_replicated(self) -> None:
        """Until every live replica has applied everything the leader has committed."""
        leader = self.leader() or await self.wait_leader(registered=False)
        commit = leader.broker.node.commit_index
        await wait_until(
            lambda: all(r.broker.node.applied_index >= commit for r in self.replicas if r.alive),
            WAIT_S, f"every replica of {self.name} to apply index {commit}",
        )

    # -- state, read from the replicas ----------------------------------------------------------
    def _reader(self) -> BrokerServer:
        r = self.leader() or next((p for p in self.replicas if p.alive), None)
        assert r is not None, f"no replica of {self.name} is running"
        return r.broker

    def offsets(self, consumer_group: str, topic: str) -> dict[int, int]:
        """Committed offsets of ``consumer_group`` on ``topic``, as the leader has applied them."""
        md = self._reader().store.metadata_view()
        return {q: o for (g, t, q), o in md.offsets.items() if g == consumer_group and t == topic}

    def offset(self, consumer_group: str, topic: str, queue_id: int) -> int | None:
        return self.offsets(consumer_group, topic).get(queue_id)

    def topics(self) -> set[str]:
        return set(self._reader().store.metadata_view().topics)

    def topic_config(self, topic: str) -> dict[str, Any] | None:
        tc = self._reader().store.topic(topic)
        return tc.to_dict() if tc is not None else None

    def subscription_groups(self) -> dict[str, dict[str, Any]]:
        return {g: gc.to_dict() for g, gc in self._reader().store.metadata_view().groups.items()}

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self._reader().store.cqs.get(topic, queue_id)
        return cq.max_offset if cq is not None else 0

    # -- through the API (as the admin) ---------------------------------------------------------
    async def put(
        self,
        topic: str,
        queue_id: int,
        n: int,
        *,
        tags: str = "",
        keys: Iterable[str] = (),
        prefix: str = "m",
        body: bytes | None = None,
        properties: dict[str, str] | None = None,
    ) -> list[dict[str, Any]]:
        """Send ``n`` messages to one queue in one request (bodies ``body``, else
        ``{prefix}-{queue}-{offset}``); returns the send results (msg_id, unique_id, queue_offset,
        position)."""
        leader = self.leader() or await self.wait_leader(registered=False)
        start = self.max_offset(topic, queue_id)
        msgs = [
            {"body": body if body is not None else f"{prefix}-{queue_id}-{start + i}".encode(), "tags": tags,
             "keys": list(keys), "properties": dict(properties or {})}
            for i in range(n)
        ]
        sent = await self.cluster.call(
            leader.addr, "POST", "/v1/send", {"topic": topic, "queue_id": queue_id, "messages": msgs}
        )
        results: list[dict[str, Any]] = sent["results"]
        assert [x["queue_offset"] for x in results] == list(range(start, start + n)), results
        return results

    async def commit_offsets(self, consumer_group: str, topic: str, offsets: dict[int, int]) -> None:
        """Commit consumer offsets through the leader, as a consumer would."""
        leader = self.leader() or await self.wait_leader(registered=False)
        body = {"group": consumer_group, "topic": topic, "offsets": {str(q): o for q, o in offsets.items()}}
        await self.cluster.call(leader.addr, "POST", "/v1/offsets", body)

    async def messages(self, topic: str, queue_id: int) -> list[dict[str, Any]]:
        """Every message of one queue, pulled from the leader (at most 1024)."""
        leader = self.leader() or await self.wait_leader(registered=False)
        got = await self.cluster.call(
            leader.addr, "POST", "/v1/pull", {"topic": topic, "queue_id": queue_id, "offset": 0, "max_count": 1024}
        )
        return list(got["messages"])

    def requests(self, path: str, method: str | None = None) -> list[tuple[int, Seen]]:
        """(replica index, request) of every request to ``path`` at any replica, in arrival order."""
        index = {r.tap.name: r.index for r in self.replicas}
        return [(index[s.server], s) for s in self.cluster.journal
                if s.server in index and s.path == path and method in (None, s.method)]


class InProcBrokerCluster:
    """NameServers + broker groups in this event loop (see the module docstring)."""

    def __init__(
        self,
        root: str,
        *,
        groups: Sequence[str] = ("RaftNode00",),
        namesrvs: int = 1,
        broker_props: dict[str, str] | None = None,
        namesrv_cfg: dict[str, Any] | None = None,
    ):
        self.root = root
        self.journal: list[Seen] = []
        os.makedirs(root, exist_ok=True)
        self.acl_file = write_acl(os.path.join(root, "plain_acl.yml"))
        self.credentials: Credentials = ADMIN
        self.broker_props = dict(broker_props or {})
        self.namesrvs = [NameServer(i, self.acl_file, self.journal, **(namesrv_cfg or {})) for i in range(namesrvs)]
        ports = free_ports(3 * len(groups))
        self.groups = [Group(self, name, i, ports[3 * i : 3 * i + 3]) for i, name in enumerate(groups)]
        self.transport = Transport(timeout_s=10.0, credentials=ADMIN)

    @property
    def namesrv_addr(self) -> str:
        """Every NameServer, ';'-separated (the SDK's and the tools' ``-n``)."""
        return ";".join(ns.addr for ns in self.namesrvs)

    def group(self, name: str) -> Group:
        return next(g for g in self.groups if g.name == name)

    @classmethod
    async def start(cls, root: str, **kwargs: Any) -> InProcBrokerCluster:
        """Start everything; a port taken between ``free_ports`` and the bind (other processes share
        the machine) makes a second attempt on fresh ports."""
        for attempt in range(3):
            cluster = cls(root if attempt == 0 else f"{root}-retry{attempt}", **kwargs)
            try:
                for ns in cluster.namesrvs:
                    await ns.start()
                for g in cluster.groups:
                    for r in g.replicas:
                        await g.start(r.nid)
                for g in cluster.groups:
                    await g.transfer("n0")
            except OSError as exc:
                await cluster.stop()
                if exc.errno != errno.EADDRINUSE or attempt == 2:
                    raise
                continue
            except BaseException:
                await cluster.stop()
                raise
            return cluster
        raise AssertionError("unreachable")

    async def stop(self, *, replicas_may_fail: bool = False) -> None:
        """Stop everything; a part whose stop fails does not keep the others running (the first
        failure is raised once all were stopped). A replica that failed during the test (its tick,
        a peer handler or a flush raised: ``DLedgerNode.fatal``) fails the stop too, unless
        ``replicas_may_fail`` (the failure is what the test is about)."""
        for tap in [r.tap for g in self.groups for r in g.replicas] + [ns.tap for ns in self.namesrvs]:
            tap.release()
        failures: list[BaseException] = []
        for g in self.groups:
            for r in g.replicas:
                fatal = r.server.node.fatal if r.server is not None else None
                if fatal is not None and not replicas_may_fail:
                    failures.append(AssertionError(f"replica {g.name}/{r.nid} failed: {fatal!r}"))
                if r.alive:
                    try:
                        await g.kill(r.nid)  # the NameServers stop too: nobody to unregister from
                    except Exception as exc:
                        failures.append(exc)
        for ns in self.namesrvs:
            try:
                await ns.stop()
            except Exception as exc:
                failures.append(exc)
        await self.transport.close()
        if failures:
            raise failures[0]

    @staticmethod
    def baseline() -> tuple[set[asyncio.Task[Any]], set[threading.Thread]]:
        """What runs before a test's clusters start (for ``assert_nothing_left``)."""
        return set(asyncio.all_tasks()), set(threading.enumerate())

    @staticmethod
    async def assert_nothing_left(baseline: tuple[set[asyncio.Task[Any]], set[threading.Thread]]) -> None:
        """After ``stop()`` (and the SDK clients' shutdown): no thread (replicas' flushers, store
        syncers, the SDK's loop threads) and no task started since ``baseline`` is left. The loop's own
        executor threads (``asyncio_N``) end with the loop."""
        baseline_tasks, baseline_threads = baseline
        threads = [
            t.name
            for t in threading.enumerate()
            if t not in baseline_threads and t.is_alive() and not t.name.startswith("asyncio_")
        ]
        assert not threads, f"threads still running: {threads}"

        def leftover() -> list[asyncio.Task[Any]]:
            return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and t not in baseline_tasks]

        try:
            await wait_until(lambda: not leftover(), 5.0, "the cluster's tasks to end")
        except AssertionError:
            raise AssertionError(f"tasks left running: {leftover()}") from None

    # -- helpers ------------------------------------------------------------------------------------
    async def call(
        self, addr: str, method: str, path: str, body: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        """One request as the admin account."""
        return await self.transport.call(addr, method, path, body, **kwargs)

    async def route(self, topic: str, namesrv: int = 0) -> dict[str, Any] | None:
        """The NameServer's route of ``topic`` as it answers it (None: no route)."""
        ns = self.namesrvs[namesrv]
        try:
            got = await self.transport.call(ns.addr, "GET", f"/v1/routes/{topic}")
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise
        return dict(got)

    async def routed_as_leader(self, group: str, addr: str) -> bool:
        for ns in self.namesrvs:
            info = await self.transport.call(ns.addr, "GET", "/v1/clusters")
            bd = dict(info.get("brokers") or {}).get(group) or {}
            if dict(bd.get("broker_addrs") or {}).get("0") != addr:
                return False
        return True

    async def create_topic(
        self, topic: str, queue_nums: int = 4, *, perm: int = 6, order: bool = False,
        groups: Sequence[str] | None = None,
    ) -> None:
        """Create ``topic`` on ``groups`` (default: all) through their leaders, then wait until every
        NameServer routes it to each of them."""
        names = list(groups) if groups is not None else [g.name for g in self.groups]
        body = {"topic": topic, "read_queue_nums": queue_nums, "write_queue_nums": queue_nums, "perm": perm,
                "order": order}
        for name in names:
            leader = self.group(name).leader() or await self.group(name).wait_leader(registered=False)
            await self.call(leader.addr, "POST", "/v1/topics", body)
        await self.wait_route(topic, names, queue_nums)

    async def wait_route(self, topic: str, groups: Sequence[str], queue_nums: int | None = None) -> None:
        async def routed() -> bool:
            for i in range(len(self.namesrvs)):
                route = await self.route(topic, i)
                if route is None:
                    return False
                qds = {q["broker_name"]: q for q in route["queue_datas"]}
                if set(qds) != set(groups):
                    return False
                if queue_nums is not None and any(q["write_queue_nums"] != queue_nums for q in qds.values()):
                    return False
            return True

        await wait_until(routed, WAIT_S, f"every NameServer to route {topic} to {list(groups)}")

    def route_calls(self, topic: str) -> int:
        """How many route queries of ``topic`` the NameServers answered so far."""
        return sum(len(ns.tap.seen(f"/v1/routes/{topic}", "GET")) for ns in self.namesrvs)

    def all_requests(self, path: str, method: str | None = None) -> list[Seen]:
        return [s for s in self.journal if s.path == path and method in (None, s.method)]

    def client_requests(self, since: int = 0) -> list[Seen]:
        """Requests since journal entry ``since``, leaving out the brokers' own registrations."""
        return [s for s in self.journal[since:] if not s.path.startswith("/v1/brokers/")]


def fail_on_thread_exceptions(items: list[pytest.Item], under: Path) -> None:
    """For conftests: a thread dying in a test under ``under`` (a replica's flusher, a store's
    syncer, the SDK's loop thread) fails the test, instead of only warning. A replica that fails on
    its loop is caught by ``InProcBrokerCluster.stop``."""
    for item in items:
        if under in item.path.parents:
            item.add_marker(pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning"))
