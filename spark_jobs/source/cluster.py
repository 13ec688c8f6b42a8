"""What the driver asks the cluster while planning: routes, every replica's queue offsets, and
offsets by time. Thin I/O over the SDK (``NamesrvClient``, ``Transport``); the decisions are in
``plan``.

- Routes come from any NameServer; the readable queues of a topic are the SDK's
  ``subscribe_queues`` (read permission, ``0..read_queue_nums-1`` per group).
- Each replica of each group is asked for the topic's status (``GET /v1/topics/{t}/status``):
  ``[min_offset, max_offset)`` per queue as that replica has applied it. A replica that does not
  answer (down, not ready, not yet aware of the topic) is left out; a group none of whose
  replicas answered is listed as unreachable — unless one of them refused the credentials (401,
  403): that is final, and fails the planning with ``security.SourceAuthError`` at once.
- Offsets by time (``GET /v1/offset/search``) are asked of the replica with the highest max offset
  (the newest view), falling back to the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from broker.client.message import MessageQueue
from broker.client.route_cache import subscribe_queues
from broker.client.transport import ClientError, NamesrvClient, Transport
from broker.protocol.frames import Op
from broker.protocol.routes import BrokerData
from spark_jobs.source.options import SourceOptionError, SourceOptions
from spark_jobs.source.plan import ClusterView, QueueView, ReplicaRange
from spark_jobs.source.security import SourceSecurity, is_refusal, refusal

CALL_TIMEOUT_S = 5.0
SEARCHES_IN_FLIGHT_MAX = 16
PROBE_ROUNDS_MAX = 64  # pulls per replica looking for the first readable message (1024 units each)


async def fetch_view(opts: SourceOptions, transport: Transport) -> ClusterView:
    namesrv = NamesrvClient(list(opts.namesrv), transport)
    queues: list[QueueView] = []
    unreachable: list[tuple[str, str]] = []
    for topic in opts.topics:
        try:
            route = await namesrv.route(topic, timeout_s=CALL_TIMEOUT_S)
        except ClientError as exc:
            if exc.code == "TOPIC_NOT_EXIST":
                raise SourceOptionError(f"topic {topic!r} does not exist (no NameServer has a route for it)") from None
            if is_refusal(exc):  # open to anyone, but a bad signature is refused all the same
                raise refusal(exc, opts.security, f"the route of topic {topic!r}") from None
            hint = "" if opts.security.tls else " (if the cluster runs HTTPS: give tlsCaFile, or tls=true)"
            raise RuntimeError(f"no NameServer of {', '.join(opts.namesrv)} answered: {exc}{hint}") from None
        readable = subscribe_queues(route)
        groups = sorted({mq.broker_name for mq in readable})
        answers = await asyncio.gather(
            *(_group_status(transport, route.broker(g), topic, opts.security) for g in groups)
        )
        for group, (replicas, why) in zip(groups, answers, strict=True):
            if why is not None:
                unreachable.append((group, why))
            for mq in readable:
                if mq.broker_name == group:
                    queues.append(QueueView(mq, tuple(replicas.get(mq.queue_id, ()))))
    return ClusterView(tuple(sorted(queues, key=lambda q: q.mq)), tuple(unreachable))


async def _group_status(
    transport: Transport, bd: BrokerData | None, topic: str, security: SourceSecurity
) -> tuple[dict[int, list[ReplicaRange]], str | None]:
    """Per queue id, each answering replica's range; and why none answered (or None). Raises
    ``SourceAuthError`` when none answered and one refused the credentials."""
    if bd is None or not bd.broker_addrs:
        return {}, "the route names no replica"
    path = f"/v1/topics/{quote(topic, safe='')}/status"
    addrs = sorted(bd.broker_addrs.items())

    async def ask(addr: str) -> Any:
        try:
            return await transport.call(addr, "GET", path, timeout_s=CALL_TIMEOUT_S)
        except ClientError as exc:
            return exc

    answers = await asyncio.gather(*(ask(addr) for _, addr in addrs))
    out: dict[int, list[ReplicaRange]] = {}
    errors: list[str] = []
    refused: list[ClientError] = []
    for (bid, addr), ans in zip(addrs, answers, strict=True):
        if isinstance(ans, ClientError):
            errors.append(f"{addr} {ans.code}")
            if is_refusal(ans):
                refused.append(ans)
            continue
        if not isinstance(ans, dict) or ans.get("broker_name") != bd.broker_name:
            errors.append(f"{addr} answered for another group")
            continue
        for q in ans.get("queues") or ():
            out.setdefault(int(q["queue_id"]), []).append(
                ReplicaRange(addr, bid == 0, int(q["min_offset"]), int(q["max_offset"]))
            )
    if len(errors) == len(addrs):
        if refused:
            raise refusal(refused[0], security, f"the status of topic {topic!r} at {bd.broker_name}")
        return {}, ", ".join(errors)
    return out, None


async def offsets_by_time(
    transport: Transport,
    queues: Mapping[MessageQueue, QueueView],
    queries: Mapping[MessageQueue, int],
    security: SourceSecurity,
) -> dict[MessageQueue, int]:
    """The first offset stored at or after each queried time (the max offset when none is)."""
    in_flight = asyncio.Semaphore(SEARCHES_IN_FLIGHT_MAX)

    async def search(mq: MessageQueue, ts_ms: int) -> tuple[MessageQueue, int]:
        q = queues[mq]
        last: ClientError | None = None
        refused: ClientError | None = None
        for r in sorted(q.replicas, key=lambda r: (-r.max_offset, not r.leader)):
            try:
                async with in_flight:
                    ans = await transport.call(
                        r.addr,
                        "GET",
                        "/v1/offset/search",
                        params={"topic": mq.topic, "queue_id": mq.queue_id, "ts": ts_ms},
                        timeout_s=CALL_TIMEOUT_S,
                    )
                return mq, int(ans["offset"])
            except ClientError as exc:
                last = exc
                refused = refused or (exc if is_refusal(exc) else None)
        if refused is not None:
            raise refusal(refused, security, f"an offset search in {mq}")
        raise RuntimeError(f"no replica of {mq.broker_name} answered an offset search for {mq}: {last}")

    return dict(await asyncio.gather(*(search(mq, ts) for mq, ts in sorted(queries.items()))))


async def first_readable(
    transport: Transport, queues: Mapping[MessageQueue, QueueView], targets: Mapping[MessageQueue, int]
) -> dict[MessageQueue, int]:
    """Per queue, the first offset at or after the target whose message some replica can still
    serve (the target itself when all is well).

    A consume queue drops its removed head only at the broker's next store snapshot, so its min
    offset can list messages retention already removed from the log; a pull skips those. Each
    replica is asked with ``max_bytes=1`` (one message at most, up to 1024 units scanned per pull)
    from the target or its own min offset, whichever is higher; the lowest answer wins. After
    ``PROBE_ROUNDS_MAX`` pulls without a message the offset reached is used (the read then
    reports what follows as lost). A replica that does not answer is left out; when none answers
    the target stands."""
    in_flight = asyncio.Semaphore(SEARCHES_IN_FLIGHT_MAX)

    async def probe(mq: MessageQueue, r: ReplicaRange, target: int) -> int | None:
        offset = max(target, r.min_offset)
        for _ in range(PROBE_ROUNDS_MAX):
            if offset >= r.max_offset:
                return r.max_offset
            body = {"topic": mq.topic, "queue_id": mq.queue_id, "offset": offset, "max_count": 1024, "max_bytes": 1}
            try:
                async with in_flight:
                    ans = await transport.operation(r.addr, Op.PULL, body, timeout_s=CALL_TIMEOUT_S)
            except ClientError:
                return None
            status = ans.get("status")
            if status == "FOUND":
                return int(ans["messages"][0]["queue_offset"])
            if status == "NO_MATCHED_MSG":
                offset = int(ans["next_offset"])
            elif status == "OFFSET_TOO_SMALL":
                offset = max(offset + 1, int(ans["min_offset"]))
            else:  # NO_NEW_MSG, OFFSET_OVERFLOW: nothing past here on this replica yet
                return offset
        return offset

    async def one(mq: MessageQueue, target: int) -> tuple[MessageQueue, int]:
        answers = await asyncio.gather(*(probe(mq, r, target) for r in queues[mq].replicas))
        found = [a for a in answers if a is not None]
        return mq, max(target, min(found)) if found else target

    return dict(await asyncio.gather(*(one(mq, t) for mq, t in sorted(targets.items()))))


def run(opts: SourceOptions, coro_factory: Any) -> Any:
    """Run ``coro_factory(transport)`` on a fresh loop with a transport (the options' credentials
    and TLS) closed afterwards (the planner runs in a plain Python worker: no loop of its own)."""

    async def main() -> Any:
        transport = opts.security.transport(CALL_TIMEOUT_S)
        try:
            return await coro_factory(transport)
        finally:
            await transport.close()

    return asyncio.run(main())
