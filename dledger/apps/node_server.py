"""``dledger-node -c conf/dledger-n0.conf``: one dledger replica as a process with an HTTP API.

Endpoints (msgpack where bodies are binary, JSON for admin; errors are ``{code, message}``):

    GET  /v1/status                      JSON status snapshot (role, term, indexes, peers, counters)
    POST /v1/append     msgpack {bodies: [bin, ...]}  -> msgpack {term, locations: [[index, slot, position, size]]}
    GET  /v1/entries?from=N&count=M      msgpack [{index, term, chain_crc, bodies: [[position, bin]]}]
    GET  /v1/chain?from=N&to=M           JSON {from, crcs: [...]} chain CRCs of committed entries
    GET  /v1/state                       JSON of the apply checkpoint (index, bodies, digest)
    POST /v1/transfer   JSON {target?}   leadership transfer
    GET  /v1/membership                  JSON: voters, learners, the entry that set them, its source
    POST /v1/membership JSON {op, id, address?}  one membership change (add_learner|promote|remove)
    POST /v1/retention                   run the retention check now

The broker (issue "namesrv/, broker/ and the client SDK") replaces this API with RocketMQ's; this
process stays as the log's own admin/test surface.

**No authentication.** Anyone who reaches this port can append, read every entry and move
leadership. So the node binds its HTTP API to a loopback address only (``brokerIP1`` 127.x.x.x,
``::1`` or ``localhost``; anything else stops the start with exit code 2), and says at every
start, at WARNING, that every local user of the host can use it. A network-facing group is a
broker group (``dledger-broker``: ACL, signed requests, TLS; docs/SECURITY.md). The peer port is
authenticated either way (``dLegerPeerPassword``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import sys

import msgpack
from aiohttp import web

from broker.protocol.errors import ProtocolError
from broker.serving.http_edge import ErrorAnswer, error_middleware, query_int
from broker.serving.process_main import run_until_signalled, setup_logging
from dledger.apps.checkpoint import ApplyCheckpoint
from dledger.cluster_id import ClusterIdMismatch, check_cluster_id
from dledger.config import ConfigError, DLedgerConfig, load_dledger_config, settings_from_config
from dledger.membership import MembershipError, check_membership_request
from dledger.node import (
    AppendFailedError,
    AppendTimeoutError,
    BusyError,
    DiskFullError,
    DLedgerError,
    DLedgerNode,
    EntryRemovedError,
    EntryTooLargeError,
    NotCommittedError,
    NotLeaderError,
)

log = logging.getLogger("dledger.apps.node_server")

MAX_REQUEST_BYTES = 16 << 20
MAX_READ_COUNT = 10_000
_STATUS_BY_ERROR: dict[type[DLedgerError], int] = {
    NotLeaderError: 409,
    EntryTooLargeError: 413,
    BusyError: 429,
    DiskFullError: 507,
    AppendFailedError: 409,
    AppendTimeoutError: 504,
    NotCommittedError: 404,
    EntryRemovedError: 410,
}


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a port on this machine (no name resolution: ``localhost`` is
    the one name taken as loopback)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _classify(exc: Exception) -> ErrorAnswer | None:
    """The log's errors, with the status that fits (``error_middleware`` answers the rest)."""
    if isinstance(exc, MembershipError):
        return ErrorAnswer(400 if exc.code == "BAD_REQUEST" else 409, exc.code, str(exc), {})
    if not isinstance(exc, DLedgerError):
        return None
    extra = {"leader_id": exc.leader_id} if isinstance(exc, NotLeaderError) else {}
    return ErrorAnswer(_STATUS_BY_ERROR.get(type(exc), 500), exc.code, str(exc), extra)


class HttpApi:
    def __init__(self, node: DLedgerNode, checkpoint: ApplyCheckpoint):
        self.node = node
        self.checkpoint = checkpoint

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[error_middleware(_classify, logger=log)])
        app.router.add_get("/v1/status", self.status)
        app.router.add_post("/v1/append", self.append)
        app.router.add_get("/v1/entries", self.entries)
        app.router.add_get("/v1/chain", self.chain)
        app.router.add_get("/v1/state", self.state)
        app.router.add_post("/v1/transfer", self.transfer)
        app.router.add_get("/v1/membership", self.membership)
        app.router.add_post("/v1/membership", self.change_membership)
        app.router.add_post("/v1/retention", self.retention)
        app.router.add_post("/v1/metrics/reset", self.reset_metrics)
        return app

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response(await self.node.status())

    async def append(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            payload = msgpack.unpackb(raw, raw=False)
        except Exception as exc:
            raise ProtocolError("BAD_MSGPACK", f"request body is not msgpack: {exc}", 400) from None
        if (
            not isinstance(payload, dict)
            or not isinstance(payload.get("bodies"), list)
            or not payload["bodies"]
        ):
            raise ProtocolError("BAD_REQUEST", "expected a map with a non-empty 'bodies' array", 400)
        bodies = payload["bodies"]
        if not all(isinstance(b, bytes) for b in bodies):
            raise ProtocolError("BAD_REQUEST", "every body must be binary (msgpack bin)", 400)
        timeout_s = payload.get("timeout_ms", 3000)
        if not isinstance(timeout_s, int) or not 1 <= timeout_s <= 60_000:
            raise ProtocolError("BAD_REQUEST", "timeout_ms must be an integer in 1..60000", 400)
        locations = await self.node.append(bodies, timeout_s=timeout_s / 1000)
        body = msgpack.packb(
            {
                "term": locations[0].term,
                "locations": [[loc.index, loc.slot, loc.position, loc.size] for loc in locations],
            }
        )
        return web.Response(body=body, content_type="application/x-msgpack")

    async def entries(self, request: web.Request) -> web.Response:
        first = query_int(request, "from", 1, 1, 2**62)
        count = query_int(request, "count", 100, 1, MAX_READ_COUNT)
        out = [
            {
                "index": e.index,
                "term": e.term,
                "chain_crc": e.chain_crc,
                "bodies": [[pos, b] for pos, b in e.bodies],
            }
            for e in self.node.read_range(first, count)
        ]
        return web.Response(body=msgpack.packb(out), content_type="application/x-msgpack")

    async def chain(self, request: web.Request) -> web.Response:
        first = query_int(request, "from", 1, 1, 2**62)
        last = query_int(request, "to", self.node.commit_index, 0, 2**62)
        last = min(last, self.node.commit_index, first + 1_000_000)
        first = max(first, self.node.log.first_index)
        crcs = [self.node.chain_crc_at(i) for i in range(first, last + 1)]
        return web.json_response({"from": first, "crcs": crcs})

    async def state(self, request: web.Request) -> web.Response:
        cp = self.checkpoint
        return web.json_response({"applied_index": cp.index, "bodies": cp.bodies, "digest": cp.digest})

    async def transfer(self, request: web.Request) -> web.Response:
        target = None
        if request.can_read_body:
            try:
                payload = await request.json()
            except (json.JSONDecodeError, ValueError):
                raise ProtocolError("BAD_JSON", "request body is not JSON", 400) from None
            target = payload.get("target") if isinstance(payload, dict) else None
            if target is not None and not isinstance(target, str):
                raise ProtocolError("BAD_REQUEST", "target must be a peer id string", 400)
        leader = await self.node.transfer_leadership(target)
        return web.json_response({"leader_id": leader})

    async def membership(self, request: web.Request) -> web.Response:
        return web.json_response(await self.node.membership())

    async def change_membership(self, request: web.Request) -> web.Response:
        """One membership change (issue 27): ``{op: add_learner|promote|remove, id, address?}``."""
        try:
            payload = await request.json()
        except (json.JSONDecodeError, ValueError):
            raise ProtocolError("BAD_JSON", "request body is not JSON", 400) from None
        op, peer_id, address = check_membership_request(payload)
        return web.json_response(await self.node.change_membership(op, peer_id, address))

    async def reset_metrics(self, request: web.Request) -> web.Response:
        self.node.commit_latency_ms.clear()
        return web.json_response({"ok": True})

    async def retention(self, request: web.Request) -> web.Response:
        await self.node.run_on_replica_thread(self.node.run_retention_now, 5.0)
        return web.json_response(await self.node.status())


async def serve(cfg: DLedgerConfig, stop: asyncio.Event) -> None:
    settings = settings_from_config(cfg)
    checkpoint = ApplyCheckpoint(os.path.join(settings.data_dir, "meta", "apply_checkpoint"))
    node = DLedgerNode(settings, checkpoint)
    await node.start()
    runner = web.AppRunner(HttpApi(node, checkpoint).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.http_host, cfg.listen_port, reuse_address=True)
    await site.start()
    log.info(
        "dledger node %s of %s serving HTTP on %s:%d", cfg.self_id, cfg.group, cfg.http_host, cfg.listen_port
    )
    log.warning(
        "the HTTP API on %s:%d has NO AUTHENTICATION: every local user of this host can append, read every "
        "entry and transfer leadership (it never binds beyond loopback; serve a network with dledger-broker)",
        cfg.http_host, cfg.listen_port,
    )
    try:
        while not stop.is_set() and node.fatal is None:  # fail-stop: a dead tick thread ends the process
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
    finally:
        await runner.cleanup()
        await node.stop()
        checkpoint.close()
    if node.fatal is not None:
        log.critical("the replica's tick thread died (%s): exiting", node.fatal)
        raise SystemExit(70)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dledger-node", description="Run one dledger replica.")
    parser.add_argument("-c", "--config", required=True, help="properties file (see conf/dledger-n0.conf)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        cfg = load_dledger_config(args.config)
        if cfg.cluster_id is not None:
            check_cluster_id(cfg.node_dir, cfg.cluster_id)  # another cluster's data: refuse
    except (ConfigError, OSError, ClusterIdMismatch) as exc:
        print(f"dledger-node: {exc}", file=sys.stderr)
        return 2
    if not is_loopback(cfg.http_host):
        print(f"dledger-node: {args.config}: brokerIP1={cfg.http_host} is not a loopback address: the node's HTTP "
              "API (append, read, transfer) has no authentication, so it binds to 127.0.0.1, ::1 or localhost "
              "only; a network-facing group is a broker group (dledger-broker, with ACL)", file=sys.stderr)
        return 2

    run_until_signalled(lambda stop: serve(cfg, stop))
    return 0


if __name__ == "__main__":
    sys.exit(main())
