"""``dledger-broker -c conf/broker-n0.conf``: one broker replica (a dledger node + the message store +
the HTTP API and RocketMQ's remoting on ``listenPort`` (told apart by the first byte; the remoting
also on the VIP channel ``listenPort - 2``), our binary port + NameServer registration).

Roles (DLedger mode):

    FOLLOWER/CANDIDATE --elected--> LEADER (not ready: applying up to its log end)
          ^                            | applied >= last index at election
          |                            v
          +------ stepped down ---- LEADER (ready: accepts writes, registers as brokerId 0)

Every role change re-registers with every NameServer at once (``Registrar.trigger``); a leader
registers as id 0 only once ready, before that as CANDIDATE under its own id.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import ipaddress
import logging
import os
import socket
import sys
from collections.abc import Iterator, Mapping
from typing import Any, cast

from aiohttp import web

from broker.client.transport import Transport, client_ssl_context
from broker.edge.binary import RemotingLimits, RemotingServer
from broker.edge.binary_ops import RemotingOps
from broker.edge.http_api import BrokerApi
from broker.edge.rocketmq.edge import RocketMQEdge
from broker.edge.rocketmq.messages import NO_HOST, parse_host
from broker.protocol.auth import broker_scope
from broker.protocol.errors import ProtocolError
from broker.protocol.properties import AUTO_CREATE_TOPIC
from broker.protocol.rocketmq.command import Bounds
from broker.protocol.rocketmq.message import Host
from broker.protocol.routes import PERM_INHERIT, PERM_READ, PERM_WRITE, BrokerRegistration, Role, TopicConfig
from broker.server.admin_config import NotUpdatable, check_updates, config_view
from broker.server.admin_config import update as update_config
from broker.server.config import BrokerConfig, load_broker_config
from broker.server.metrics import BrokerMetrics
from broker.server.registration import Registrar
from broker.service.broker_service import BrokerService
from broker.service.consumers import ConsumerManager, QueueLocks
from broker.service.producers import ProducerTable
from broker.serving import remoting_server as rmq
from broker.serving.acl import AclConfig, AclError, AclWatcher
from broker.serving.http_edge import Guard, Limits, server_ssl_context
from broker.serving.process_main import run_until_signalled, set_gc_young_threshold, setup_logging
from broker.serving.remoting_acl import AclV1Policy, RemotingAuthenticator
from broker.serving.security import Security
from broker.serving.sniff import SniffingSite, SniffLimits, TlsMode, start_dual_server
from broker.store.message import encode_command
from broker.store.message_store import MessageStore
from broker.store.replay import ReplayGuardedNode
from broker.store.schedule import SchedulePolicy, ScheduleService
from broker.store.transactions import TransactionPolicy, TransactionService
from dledger.clock import Clock, process_clock
from dledger.cluster_id import ClusterIdMismatch, check_cluster_id
from dledger.config import ConfigError, settings_from_config
from dledger.durable import private_dir
from dledger.inproc import InProcNetwork
from dledger.log_store import LogStore
from dledger.meta_store import MetaStore
from dledger.node import DLedgerNode, RoleChange

log = logging.getLogger("broker.server")

HAND_OVER_TIMEOUT_S = 3.0  # a graceful stop waits this long at most for a follower to take over




@contextlib.contextmanager
def _config_errors() -> Iterator[None]:
    """A refused configuration change as the coded error the service answers with."""
    try:
        yield
    except NotUpdatable as exc:
        raise ProtocolError("NOT_UPDATABLE", str(exc), 400) from None
    except ConfigError as exc:
        raise ProtocolError("BAD_PARAMETER", str(exc), 400) from None

class BrokerServer:
    def __init__(
        self,
        cfg: BrokerConfig,
        *,
        raft_overrides: dict[str, Any] | None = None,
        clock: Clock | None = None,
        network: InProcNetwork | None = None,
        log_store: LogStore | None = None,
        meta: MetaStore | None = None,
    ):
        """``network``: the group's Raft traffic stays inside this process (every replica of the
        group runs here on that ``InProcNetwork``) instead of TCP. ``log_store`` / ``meta``: the
        Raft log and term/vote (e.g. ``MemoryLogStore`` / ``MemoryMetaStore``) instead of files
        under the node directory; consume queues, index and snapshots stay under ``store_dir``.
        All three are for tests and in-process clusters; a broker process uses none of them."""
        self.cfg = cfg
        self.clock: Clock = clock if clock is not None else process_clock()
        self.store = MessageStore(
            cfg.store_dir, cfg.broker_name, snapshot_interval_ms=cfg.snapshot_interval_ms, clock=self.clock,
            dedup_max_messages=cfg.duplicate_window_messages, dedup_window_ms=cfg.duplicate_window_ms,
        )
        settings = dataclasses.replace(settings_from_config(cfg.dledger), **(raft_overrides or {}))
        # The node carries each signed request's nonce into its Raft entry (broker/store/replay.py).
        self.node: DLedgerNode = ReplayGuardedNode(
            settings, self.store, clock=self.clock, network=network, store=log_store, meta=meta,
            leader_ms=self.wall_ms,
        )
        self.consumers = ConsumerManager(cfg.client_expiry_ms)
        self.locks = QueueLocks()  # orderly consumers' queue locks (RocketMQ's LOCK_BATCH_MQ)
        self.producers = ProducerTable(cfg.client_expiry_ms)  # seen sending (mqadmin producerConnection)
        self.send_timeout_s = 3.0
        self._ready_term = -1  # ready = leader of exactly this term, applied up to its log end
        self.creating: dict[str, asyncio.Task[Any]] = {}
        self.counters: collections.Counter[str] = collections.Counter()
        self._waiters: dict[tuple[str, int], set[asyncio.Future[None]]] = {}
        self.applied_seq = 0  # apply calls so far (see on_applied, wait_for_queue)
        self.stopping = False  # held pulls answer at once from now on (stop does not wait them out)
        self._role_generation = 0
        self._tasks: list[asyncio.Task[Any]] = []
        self.failed = asyncio.Event()  # set when the replica can no longer run (the process exits)
        self.loop = asyncio.get_running_loop()  # constructed inside the serving loop
        self._ready_task: asyncio.Task[None] | None = None
        sec = cfg.security
        self.guard = Guard(
            Limits(
                connections_max=sec.connections_max,
                header_timeout_s=sec.header_timeout_ms / 1000,
                idle_timeout_s=sec.idle_timeout_ms / 1000,
                body_timeout_s=sec.body_timeout_ms / 1000,
                body_bytes_in_flight_max=sec.body_bytes_in_flight_max,
                client_max_size=cfg.max_message_size + (8 << 20),
            ),
            lambda code, message: {"code": code, "message": message},
        )
        # Every replica enforces the same ACL file (followers serve pulls too). A signature names
        # this replica (its scope), and a nonce this group's log admitted is refused here at once.
        self.security = Security(
            sec.acl_file, self.wall_ms, self.guard,
            scope=broker_scope(cfg.cluster, cfg.broker_name, cfg.dledger.self_id),
            anonymous=lambda request: request.method == "GET" and request.path in ("/v1/status", "/metrics"),
            extra_check=self.store.nonces.check,
        )
        ns_tls = client_ssl_context(sec.namesrv_ca_file) if sec.namesrv_tls else None
        self.registrar = Registrar(
            cfg.namesrv_addrs,
            self.registration_record,
            period_ms=cfg.register_period_ms,
            clock=self.clock,
            # The group's own account only (never a client's from the environment).
            transport=Transport(timeout_s=3.0, credentials=sec.broker_credentials, tls=ns_tls),
        )
        self.metrics = BrokerMetrics(self)
        self.node.set_observer(self.metrics.observe)
        self.schedule = ScheduleService(  # delayed and timed messages (broker/store/schedule.py)
            self, SchedulePolicy(cfg.message_delay_levels_ms, cfg.timer_max_delay_sec * 1000)
        )
        self.transactions = TransactionService(  # half messages and check-backs (broker/store/transactions.py)
            self, TransactionPolicy(cfg.transaction_timeout_ms, cfg.transaction_check_interval_ms,
                                    cfg.transaction_check_max)
        )
        self.service = BrokerService(self)  # send, pull, query, admin: shared by every transport
        self.api = BrokerApi(self, self.service)
        self._runner: web.AppRunner | None = None
        # The binary protocol (broker/edge/binary.py): the SDK's send and pull path.
        self.remoting = RemotingServer(
            RemotingOps(self).dispatch,
            security=self.security,
            limits=RemotingLimits(
                frame_bytes_max=self.guard.limits.client_max_size,
                in_flight_max=cfg.remoting_in_flight_max,
                connections_max=sec.connections_max,
                handshake_timeout_s=sec.header_timeout_ms / 1000,
                frame_timeout_s=sec.body_timeout_ms / 1000,
                idle_timeout_s=sec.idle_timeout_ms / 1000,
                unauthenticated_connections_max=max(1, sec.connections_max * 3 // 4),
            ),
            guard=self.guard,
        )
        self.remoting_address: str | None = None
        # RocketMQ's remoting for the official clients (broker/edge/rocketmq/): on listenPort beside
        # HTTP, and on the VIP channel; the store host (in offset msg ids) is resolved at start.
        self.rocketmq = RocketMQEdge(
            self.service, broker_name=cfg.broker_name, store_host=parse_host(cfg.address),
            authenticator=RemotingAuthenticator(self._acl_rules, AclV1Policy(cfg.remoting_acl_v1)),
            limits=rmq.RemotingLimits(
                bounds=Bounds(frame_bytes_max=self.guard.limits.client_max_size),
                connections_max=sec.connections_max,
                in_flight_max=cfg.remoting_in_flight_max,
                first_frame_timeout_s=sec.header_timeout_ms / 1000,
                frame_timeout_s=sec.body_timeout_ms / 1000,
                idle_timeout_s=sec.idle_timeout_ms / 1000,
            ),
        )
        self.vip_address: str | None = None
        self._site: SniffingSite | None = None
        self._vip_site: SniffingSite | None = None
        self.started_at = self.clock.monotonic()

    def _acl_rules(self) -> AclConfig | None:
        watcher = self.security.watcher
        return None if watcher is None else watcher.current

    def monotonic_ms(self) -> int:
        """For liveness (client heartbeats): never the wall clock, which NTP may step."""
        return int(self.clock.monotonic() * 1000)

    def wall_ms(self) -> int:
        """For timestamps stored in records (a message's store time)."""
        return int(self.clock.wall() * 1000)

    # -- configuration (mqadmin getBrokerConfig / updateBrokerConfig) ---------------------------------
    def config_view(self) -> dict[str, str]:
        return config_view(self.cfg)

    def update_config(self, key: str, value: str) -> None:
        """Change one hot key until this replica restarts; a refused change is a ``ProtocolError``."""
        with _config_errors():
            self.cfg = update_config(self.cfg, key, value)

    def check_config(self, updates: Mapping[str, str]) -> None:
        """Whether every one of ``updates`` would apply (hot keys, valid values); else the
        ``ProtocolError`` ``update_config`` would raise, and nothing changes."""
        with _config_errors():
            check_updates(self.cfg, updates)

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        private_dir(self.cfg.dledger.node_dir)
        self.store.open(self.node.log)
        self.store.listener = self
        await self.node.start()
        sec = self.cfg.security
        ssl_ctx = server_ssl_context(sec.tls_cert_file, sec.tls_key_file or "") if sec.tls_cert_file else None
        await self._resolve_store_host()
        # connections that sent nothing yet: as many as HTTP's unproven ones (3/4 of the cap), oldest evicted
        sniff = SniffLimits(pending_max=self.guard.unproven_max, first_byte_timeout_s=sec.header_timeout_ms / 1000,
                            tls_handshake_timeout_s=self.guard.limits.tls_handshake_timeout_s)
        tls_mode = TlsMode(self.cfg.tls_mode)
        self._runner, self._site = await start_dual_server(
            self.api.app(), self.guard, self.cfg.bind_host, self.cfg.dledger.listen_port,
            remoting=self.rocketmq.server, limits=sniff, ssl_context=ssl_ctx, tls_mode=tls_mode,
        )
        vip_port = self.cfg.vip_channel_port
        if vip_port is not None:  # the same application and remoting server on a second port
            vip = SniffingSite(self._runner, self.cfg.bind_host, vip_port, remoting=self.rocketmq.server,
                               limits=sniff, ssl_context=ssl_ctx, tls_mode=tls_mode)
            try:
                await vip.start()
            except BaseException:
                await self._runner.cleanup()
                raise
            self._vip_site = vip
            self.vip_address = f"{self.cfg.dledger.http_host}:{vip.bound_port}"
        if self.cfg.remoting_listen_port >= 0:
            try:
                bound = await self.remoting.start(self.cfg.bind_host, self.cfg.remoting_listen_port, ssl_ctx)
            except BaseException:
                await self._runner.cleanup()
                raise
            self.remoting_address = self.cfg.remoting_address(bound)
        self._tasks = [
            self.loop.create_task(self.security.run(), name="acl"),
            self.loop.create_task(self._watch_roles(), name="roles"),
            self.loop.create_task(self.registrar.run(), name="registrar"),
            self.loop.create_task(self._expire_clients(), name="clients"),
            self.loop.create_task(self._state_entries(), name="state-entries"),
            self.loop.create_task(self._watch_replica(), name="replica-watch"),
            self.loop.create_task(self.schedule.run(), name="schedule"),
            self.loop.create_task(self.transactions.run(), name="transactions"),
        ]
        log.info(
            "broker %s/%s (%s) serving %s (HTTP and RocketMQ remoting; VIP channel: %s; binary: %s), NameServers %s",
            self.cfg.cluster, self.cfg.broker_name, self.cfg.dledger.self_id, self.cfg.address,
            self.vip_address or "off", self.remoting_address or "off", ";".join(self.cfg.namesrv_addrs),
        )

    async def _resolve_store_host(self) -> None:
        """The store host RocketMQ clients see (offset msg ids name it): the advertised address as an
        IP address, its host name resolved once here when it is a name (a container's)."""
        if self.rocketmq.store_host is not NO_HOST:
            return
        host = self.cfg.dledger.http_host
        port = self.cfg.advertised_port or self.cfg.dledger.listen_port
        try:
            infos = await self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            log.warning("cannot resolve %s for RocketMQ's store host: %s; offset msg ids name 0.0.0.0", host, exc)
            return
        infos.sort(key=lambda info: info[0] != socket.AF_INET)  # IPv4 first, as RocketMQ's clients prefer
        if infos:
            self.rocketmq.store_host = Host(ipaddress.ip_address(infos[0][4][0]).packed, port)

    async def _watch_replica(self) -> None:
        """Fail-stop: a replica that failed (its tick, a peer handler or a flush raised) can neither
        vote nor replicate, yet would keep answering HTTP (and look alive to a health check that
        only opens a socket). ``failed`` is set so that the process exits (``serve``) and its
        supervisor restarts it from its log."""
        while self.node.fatal is None:
            await asyncio.sleep(0.2)
        log.critical("the replica failed (%s): stopping the broker", self.node.fatal)
        self.failed.set()

    async def stop(self, *, unregister: bool = True, hand_over: bool | None = None) -> None:
        """``unregister=False``: leave the NameServers as a crash would (they keep the routes until
        the broker's registration expires). ``hand_over`` (default: as ``unregister``): a leader
        first hands leadership to a caught-up follower (``hand_over_leadership``), so a planned stop
        (SIGTERM: a rolling restart) costs clients a redirect instead of an election timeout."""
        if unregister if hand_over is None else hand_over:
            await self.hand_over_leadership()
        self.stopping = True
        for waiters in self._waiters.values():  # long polls answer now, not after their hold
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        for t in self._tasks:
            t.cancel()
        if self._tasks:  # bounded: a task that ignores its cancellation must not hang shutdown
            _done, pending = await asyncio.wait(self._tasks, timeout=5.0)
            for t in pending:
                log.error("task %s did not stop within 5 s of its cancellation", t.get_name())
        try:
            if unregister:
                await asyncio.wait_for(
                    self.registrar.unregister_all(self.cfg.cluster, self.cfg.broker_name, self.cfg.address), 3.0
                )
        except TimeoutError:
            log.warning("unregistering timed out")
        await self.registrar.close()
        await self.rocketmq.stop()
        await self.remoting.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        # The store's last snapshot runs after the replica's last apply, with the log open.
        await self.node.stop(before_log_close=self.store.close)

    async def hand_over_leadership(self, timeout_s: float = HAND_OVER_TIMEOUT_S) -> str | None:
        """As leader, transfer leadership to the most caught-up follower and wait (at most
        ``timeout_s``) until another replica leads: the new leader id, or None when this replica
        does not lead or no follower could take over (then the stop goes on: the others elect one
        after their election timeout, as after a crash). Still serving meanwhile: sends keep landing
        here until the follower takes over, then get ``NOT_LEADER`` with the new leader's address."""
        if self.node.role != "LEADER" or self.node.fatal is not None:
            return None
        term = self.node.term
        try:
            new_leader = await self.node.transfer_leadership(None, timeout_s=timeout_s)
        except Exception as exc:  # no follower connected or caught up; the stop must go on
            log.warning("stopping as leader of term %d without handing over: %s", term, exc)
            return None
        log.info("stopping: handed leadership of term %d over to %s (now term %d)", term, new_leader,
                 self.node.term)
        return new_leader

    # -- roles ----------------------------------------------------------------------------------
    async def _watch_roles(self) -> None:
        queue = self.node.role_changes()
        change = RoleChange(self.node.role, self.node.term, self.node.leader_id, self.clock.wall())
        try:
            while True:
                if self._ready_task is not None:
                    self._ready_task.cancel()
                self._ready_task = self.loop.create_task(self._on_role(change))
                change = await queue.get()
        finally:
            if self._ready_task is not None:
                self._ready_task.cancel()

    @property
    def ready(self) -> bool:
        """Writable: leader of the current term, and applied everything up to its log end then.
        Tied to the term read from the node, so a new term is never ready by mistake."""
        return self.node.role == "LEADER" and self._ready_term == self.node.term

    async def _on_role(self, change: RoleChange) -> None:
        self._role_generation += 1
        generation = self._role_generation
        self._ready_term = -1
        if change.role != "LEADER":
            self.registrar.trigger()
            return
        if self.store.needs_state_after is not None:
            log.error("elected leader while waiting for state from a leader: handing leadership over")
            try:
                await self.node.transfer_leadership(None)
            except Exception as exc:  # the next election may pick a replica with state
                log.error("leadership transfer failed: %s", exc)
            return
        target = self.node.last_index
        self.registrar.trigger()  # as CANDIDATE under its own id until ready
        started = self.clock.monotonic()
        while self.node.applied_index < target or self.node.commit_index < target:
            if generation != self._role_generation or self.node.role != "LEADER":
                return
            await asyncio.sleep(0.002)
        if generation != self._role_generation or self.node.term != change.term:
            return
        self._ready_term = change.term
        log.info(
            "leader of term %d ready after applying to index %d (%.0f ms)",
            change.term, target, (self.clock.monotonic() - started) * 1000,
        )
        self.registrar.trigger()
        if self.cfg.trace_topic_enable:
            await self._create_trace_topic()

    async def _create_trace_topic(self) -> None:
        """traceTopicEnable (RocketMQ): a ready leader creates msgTraceTopicName (one read and one
        write queue) through the log when it is missing; every later leader checks again."""
        topic = self.cfg.msg_trace_topic_name
        if self.store.topic(topic) is not None:
            return
        cmd = {"op": "topic.put", "topic": topic, "read_queue_nums": 1, "write_queue_nums": 1, "perm": 6}
        try:
            await self.node.append([encode_command(cmd)], timeout_s=self.send_timeout_s)
            log.info("created the trace topic %s (traceTopicEnable)", topic)
        except Exception as exc:  # the next leadership tries again; traced sends may auto-create it
            log.warning("trace topic %s not created: %s", topic, exc)

    def client_addr_of(self, peer_id: str | None) -> str | None:
        if peer_id is None:
            return None
        if peer_id == self.cfg.dledger.self_id:
            return self.cfg.address
        return self.cfg.peer_client_addrs.get(peer_id)

    def registration_record(self) -> BrokerRegistration:
        """What this replica registers now (the Registrar stamps ``data_version``)."""
        leader = self.node.role == "LEADER" and self.ready
        md = self.store.metadata_view()
        topics = list(md.topics.values())
        if self.cfg.auto_create_topic and AUTO_CREATE_TOPIC not in md.topics:
            n = self.cfg.default_topic_queue_nums
            topics.append(TopicConfig(AUTO_CREATE_TOPIC, n, n, PERM_READ | PERM_WRITE | PERM_INHERIT))
        role = cast(Role, "CANDIDATE" if self.node.role == "LEADER" and not leader else self.node.role)
        return BrokerRegistration(
            cluster=self.cfg.cluster,
            broker_name=self.cfg.broker_name,
            broker_id=0 if leader else self.cfg.follower_broker_id,
            address=self.cfg.address,
            role=role,
            term=self.node.term,
            topics=tuple(topics),
            remoting_address=self.remoting_address,
            cluster_id=self.cfg.dledger.cluster_id,
        )

    # -- applies wake the long polls (the loop's thread: it owns the replica) ----------------------
    def on_applied(self, touched: set[tuple[str, int]], metadata_changed: bool) -> None:
        """Called by the store's apply, on this loop (which owns the replica): wakes the long polls
        waiting on a touched queue, and re-registers at once when topics changed. An apply nobody
        waits for costs a counter and a set test."""
        self.applied_seq += 1
        if metadata_changed or (self._waiters and not self._waiters.keys().isdisjoint(touched)):
            self._wake_waiters(touched, metadata_changed)

    def _wake_waiters(self, touched: set[tuple[str, int]], metadata_changed: bool) -> None:
        for key in touched:
            for fut in self._waiters.pop(key, ()):
                if not fut.done():
                    fut.set_result(None)
        if metadata_changed:
            self.registrar.trigger()

    async def wait_for_queue(self, topic: str, queue_id: int, timeout_s: float, since: int | None = None) -> None:
        """Until an apply touches the queue, or ``timeout_s``. ``since``: ``applied_seq`` as read
        before the caller last found the queue empty; if an apply happened since (the caller
        awaited something between its look and this wait), return at once: the caller looks again."""
        key = (topic, queue_id)
        if since is not None and self.applied_seq != since:
            return
        fut: asyncio.Future[None] = self.loop.create_future()
        waiters = self._waiters.setdefault(key, set())
        waiters.add(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            waiters.discard(fut)
            if not waiters and self._waiters.get(key) is waiters:
                del self._waiters[key]

    # -- status ---------------------------------------------------------------------------------
    def first_log_position(self) -> int:
        st = self.node.log
        return st.position_at(st.first_index) if st.first_index <= st.last_index else st.next_position

    async def status(self) -> dict[str, Any]:
        node = await self.node.status()
        leader = node["role"] == "LEADER" and self.ready
        return {
            "cluster": self.cfg.cluster,
            "cluster_id": self.cfg.dledger.cluster_id,  # None: a legacy broker without clusterId
            "broker_name": self.cfg.broker_name,
            "self_id": self.cfg.dledger.self_id,
            "broker_id": 0 if leader else self.cfg.follower_broker_id,
            "address": self.cfg.address,
            "role": node["role"],
            "writable": leader,
            "term": node["term"],
            "leader_id": node["leader_id"],
            "leader_addr": self.client_addr_of(node["leader_id"]),
            "commit_index": node["commit_index"],
            "applied_index": node["applied_index"],
            "first_index": node["first_index"],
            "last_index": node["last_index"],
            "last_term": node["last_term"],
            "chain_crc_at_commit": node["chain_crc_at_commit"],
            "entries_truncated": node["counters"]["entries_truncated"],
            "peers": {
                pid: {
                    "lag": p["lag"],
                    "connected": p["connected"],
                    "match_index": p["match_index"],
                    "role": p.get("role"),
                    "address": p.get("address"),
                }
                for pid, p in node["peers"].items()
            },
            # issue 27: the membership this replica uses and where it came from (dLegerPeers, or
            # the log entry that set it, saved in meta/membership)
            "membership": node.get("membership"),
            "topics": len(self.store.metadata_view().topics),
            "queues": self.store.queue_count(),
            "dispatch": dict(self.store.counters),
            "refused_records": self.store.refusals.total,  # GET /v1/admin/refused lists them
            "send": dict(self.counters),
            "commit_latency_ms": node["commit_latency_ms"],
            "raft": {
                "elections": node["counters"].get("elections", 0),
                "prevotes_started": node["counters"].get("prevotes_started", 0),
                "became_leader": node["counters"].get("became_leader", 0),
                "stepdowns": node["counters"].get("stepdowns_check_quorum", 0)
                + node["counters"].get("stepdowns_stale_term", 0),
                "votes_ignored_in_lease": node["counters"].get("votes_ignored_in_lease", 0),
                "max_append_gap_ms": node["max_append_gap_ms"],
                "loop": node.get("loop"),  # the serving loop's lag (it owns the replica) and flush jobs
                "live_followers": node["live_followers"],
                "retention_floor": node["retention_floor"],
            },
            "remoting": {"address": self.remoting_address, **self.remoting.stats.as_dict()},
            "rocketmq": {
                "address": self.cfg.address, "vip_address": self.vip_address, **self.rocketmq.status(),
                # connections before their first byte (both protocols): the sniffers' bounds
                "sniff": self._site.listener.stats.as_dict() if self._site is not None else None,
                "vip_sniff": self._vip_site.listener.stats.as_dict() if self._vip_site is not None else None,
            },
            "namesrv": {
                "registrations": self.registrar.registrations,
                "errors": dict(self.registrar.last_error),
                "last_role": list(self.registrar.last_registered_role or ()),
                "unroutable_topics": list(self.registrar.unroutable),
            },
            "consumer_groups": self.consumers.groups(),
            "schedule": self.schedule.status(),
            "transactions": self.transactions.status(),
            "security": {
                "acl": self.security.enabled,
                "scope": self.security.scope,
                "replicated_nonces": len(self.store.nonces),
                "replays_refused_at_apply": dict(self.store.nonces.refused),
                "tls": self.cfg.security.tls_cert_file is not None,
                "refused": dict(self.security.refused),
                "edge": self.guard.stats(),
                "clients": self.consumers.client_count(),
                "subscriptions": self.consumers.subscriptions,
            },
            "uptime_s": round(self.clock.monotonic() - self.started_at, 1),
            "pid": os.getpid(),
        }

    async def _state_entries(self) -> None:
        """As ready leader, append a ``state`` entry every interval and after installing a follower
        (a follower re-anchored past retention needs one to serve again; see broker/store/message_store.py)."""
        last_sent = self.clock.monotonic()
        installs_seen = 0
        while True:
            await asyncio.sleep(0.5)
            if not (self.node.role == "LEADER" and self.ready):
                continue
            installs = self.node.installs_sent()
            due = self.clock.monotonic() - last_sent >= self.cfg.state_entry_interval_ms / 1000
            if not due and installs == installs_seen:
                continue
            try:
                cmd = await self.node.run_on_replica_thread(self.store.capture_state, 5.0)
                record = encode_command(cmd)
                if len(record) + 1024 > self.node.settings.max_entry_bytes:
                    raise ValueError(
                        f"the state ({len(record)} bytes) exceeds one entry (maxEntryBodyBytes): followers "
                        "behind retention must be wiped and re-synced by hand"
                    )
                await self.node.append([record], timeout_s=self.send_timeout_s)
                installs_seen, last_sent = installs, self.clock.monotonic()
            except Exception as exc:  # next round tries again
                log.warning("state entry not appended: %s", exc)

    async def _expire_clients(self) -> None:
        while True:
            await asyncio.sleep(10)
            self.consumers.expire(self.monotonic_ms())
            self.producers.expire(self.monotonic_ms())


EXIT_REPLICA_FAILED = 70  # EX_SOFTWARE: the replica failed (see BrokerServer.failed)


async def serve(cfg: BrokerConfig, stop: asyncio.Event) -> None:
    set_gc_young_threshold(cfg.gc_young_threshold)  # the process's, so not in BrokerServer
    server = BrokerServer(cfg)
    await server.start()
    try:
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(server.failed.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
    finally:
        await server.stop()
    if server.failed.is_set():
        raise SystemExit(EXIT_REPLICA_FAILED)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dledger-broker", description="Run one broker replica (DLedger mode).")
    parser.add_argument("-c", "--config", required=True, help="properties file (see conf/broker-n0.conf)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    if os.environ.get("BROKER_GIL_SWITCH_MS"):
        sys.setswitchinterval(float(os.environ["BROKER_GIL_SWITCH_MS"]) / 1000)
    os.umask(0o077)  # data, snapshots and logs this process creates are its own (0600 files, 0700 dirs)
    try:
        cfg = load_broker_config(args.config)
        if cfg.security.acl_file:
            AclWatcher(cfg.security.acl_file)  # a broken ACL file stops the start, with its reason
        if cfg.dledger.cluster_id is not None:
            check_cluster_id(cfg.dledger.node_dir, cfg.dledger.cluster_id)  # another cluster's data: refuse
    except (ConfigError, OSError, AclError, ClusterIdMismatch) as exc:
        print(f"dledger-broker: {exc}", file=sys.stderr)
        return 2
    run_until_signalled(lambda stop: serve(cfg, stop))
    return 0


if __name__ == "__main__":
    sys.exit(main())
