"""``Admin``: the operator's client — clusters, topics, groups, offsets, message queries, leadership.

Where each call goes:

- routes, clusters and topic lists: any NameServer (``NamesrvClient``: tried in random order);
- reads of a broker group: its leader (``broker_addrs[0]``) first, then the other replicas, moving
  on only when a replica cannot be reached (an answer, even an error, is final);
- writes: the group's leader (any replica when the NameServer knows none; the next replica when
  one refuses the connection); a ``NOT_LEADER`` answer that names ``leader_addr`` is followed
  once, never more, so stale routes cost one extra hop and a leader-less group fails fast.

Operations that write to several targets (every group of a cluster, every NameServer) try all of
them and raise ``FanOutError`` — carrying every target's ``Outcome`` — when any failed, so one dead
group never hides what happened on the others. Arguments are checked before any request: a bad one
raises ``InvalidArgument``, a ``ClientError`` with ``status`` 0 that never reached the cluster.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar
from urllib.parse import quote

from broker.client.message_selector import MessageSelector
from broker.client.transport import (
    FROM_ENV,
    ClientError,
    CredentialsArg,
    NamesrvClient,
    TlsArg,
    TopicRoute,
    Transport,
)
from broker.protocol.names import (
    GROUP_RULE,
    NAME_RULE,
    TOPIC_RULE,
    UNIQUE_ID_RULE,
    is_decimal,
    is_group,
    is_name,
    is_topic,
    is_unique_id,
)
from broker.protocol.routes import BrokerData

P = ParamSpec("P")
R = TypeVar("R")

PEER_ID_RE = re.compile(r"[a-zA-Z0-9_]{1,64}")  # dledger.config.PEER_ID_RE
QUEUE_NUMS_MAX = 1024
QUERY_MAX = 512  # the broker's limit for /v1/msg/key and /v1/msg/unique
STATUS_TIMEOUT_S = 2.0  # per member in cluster_list: a dead member must not stall the listing


class InvalidArgument(ClientError):
    """A bad argument, refused before any request was sent (``status`` 0)."""


class FanOutError(ClientError):
    """Some targets of a multi-target operation failed; ``outcomes`` says what happened on each."""

    def __init__(self, outcomes: Sequence[Outcome]):
        failed = [o for o in outcomes if not o.ok]
        assert failed, "FanOutError without a failed target"
        first = failed[0]
        super().__init__(
            first.code,
            f"{len(failed)} of {len(outcomes)} targets failed; first: {first.name}: {first.message}",
            status=first.status,
            addr=first.addr,
        )
        self.outcomes = tuple(outcomes)


# -- results ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one target of a write answered. ``code`` is ``OK``, ``NOT_EXIST`` (nothing to delete)
    or the error code; ``answer`` is the target's answer when it succeeded."""

    target: str  # "broker" or "namesrv"
    name: str  # broker name, or the address when only an address is known
    addr: str | None
    ok: bool
    code: str
    message: str = ""
    status: int = 0
    answer: Any = None


@dataclasses.dataclass(frozen=True)
class BrokerMember:
    """One replica as the NameServer lists it, with what its own ``/v1/status`` says."""

    cluster: str
    broker_name: str
    broker_id: int  # NameServer id: 0 = leader, else the follower's own id
    addr: str
    role: str | None = None
    term: int | None = None
    self_id: str | None = None
    leader_id: str | None = None
    writable: bool | None = None
    commit_index: int | None = None
    applied_index: int | None = None
    topics: int | None = None
    error: str | None = None  # the code when the status call failed


@dataclasses.dataclass(frozen=True)
class QueueStatus:
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_store_ts: int


@dataclasses.dataclass(frozen=True)
class QueueProgress:
    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int | None  # None: never committed
    lag: int
    last_ts: int | None


@dataclasses.dataclass(frozen=True)
class ConsumerProgress:
    group: str
    queues: tuple[QueueProgress, ...]

    @property
    def total_lag(self) -> int:
        return sum(q.lag for q in self.queues)


@dataclasses.dataclass(frozen=True)
class QueueOffset:
    broker_name: str
    queue_id: int
    offset: int


@dataclasses.dataclass(frozen=True)
class MessageView:
    """A stored message as the broker answers it (the API's Message)."""

    topic: str
    queue_id: int
    queue_offset: int | None
    msg_id: str
    unique_id: str
    tags: str
    keys: tuple[str, ...]
    properties: dict[str, str]
    body: bytes
    born_ts: int
    born_host: str
    store_ts: int
    position: int
    size: int
    broker_name: str


@dataclasses.dataclass(frozen=True)
class PullResult:
    status: str
    next_offset: int
    min_offset: int
    max_offset: int
    messages: tuple[MessageView, ...]


@dataclasses.dataclass(frozen=True)
class TransferResult:
    broker_name: str
    leader_id: str | None
    addr: str


def message_from_dict(m: Mapping[str, Any]) -> MessageView:
    body = m.get("body", b"")
    if isinstance(body, str):  # a JSON answer would carry body_b64; msgpack carries bin
        body = body.encode()
    qoff = m.get("queue_offset")
    return MessageView(
        topic=str(m.get("topic", "")),
        queue_id=int(m.get("queue_id", 0)),
        queue_offset=int(qoff) if qoff is not None else None,
        msg_id=str(m.get("msg_id", "")),
        unique_id=str(m.get("unique_id", "")),
        tags=str(m.get("tags") or ""),
        keys=tuple(str(k) for k in m.get("keys") or ()),
        properties={str(k): str(v) for k, v in dict(m.get("properties") or {}).items()},
        body=bytes(body),
        born_ts=int(m.get("born_ts", 0)),
        born_host=str(m.get("born_host", "")),
        store_ts=int(m.get("store_ts", 0)),
        position=int(m.get("position", 0)),
        size=int(m.get("size", 0)),
        broker_name=str(m.get("broker_name", "")),
    )




# -- argument checks --------------------------------------------------------------------------------
def check_topic(topic: str) -> str:
    if not is_topic(topic):
        raise InvalidArgument("INVALID_TOPIC", f"topic {topic!r} must match {TOPIC_RULE}")
    return topic


def check_group(group: str) -> str:
    if not is_group(group):
        raise InvalidArgument("INVALID_GROUP", f"group {group!r} must match {GROUP_RULE}")
    return group


def check_name(name: str, what: str) -> str:
    if not is_name(name):
        code = "INVALID_CLUSTER_NAME" if what == "cluster" else "INVALID_BROKER_NAME"
        raise InvalidArgument(code, f"{what} name {name!r} must match {NAME_RULE}")
    return name


def check_addr(addr: str) -> str:
    host, sep, port = addr.rpartition(":") if isinstance(addr, str) else ("", "", "")
    if not sep or not host or not is_decimal(port) or not 0 < int(port) < 65536:
        raise InvalidArgument("INVALID_ADDRESS", f"broker address {addr!r} must be host:port")
    return addr


def check_range(value: int, what: str, lo: int, hi: int, code: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidArgument(code, f"{what} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def check_key(key: str) -> str:
    if not isinstance(key, str) or not 1 <= len(key) <= 255 or any(c.isspace() for c in key):
        raise InvalidArgument("INVALID_KEYS", f"key {key!r} must be 1..255 chars without whitespace")
    return key


def parse_msg_id(msg_id: str) -> tuple[str, int]:
    """``"<brokerName>:<16 hex digits>"`` → (broker name, log position)."""
    name, sep, hexpos = msg_id.rpartition(":") if isinstance(msg_id, str) else ("", "", "")
    if not sep or not is_name(name) or len(hexpos) != 16:
        raise InvalidArgument("INVALID_MSG_ID", f"msg id {msg_id!r} is not <brokerName>:<16 hex digits>")
    try:
        return name, int(hexpos, 16)
    except ValueError:
        raise InvalidArgument("INVALID_MSG_ID", f"msg id {msg_id!r} has a bad position") from None


def _path_part(name: str) -> str:
    return quote(name, safe="")


def answers_checked(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """An answer of the wrong shape (a broker of another version, a proxy's page) becomes a
    ``BAD_ANSWER`` ClientError instead of a KeyError deep in the parsing."""

    @functools.wraps(fn)
    async def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise ClientError("BAD_ANSWER", f"unexpected answer from the cluster: {exc!r}") from exc

    return checked


# -- the client -------------------------------------------------------------------------------------
class Admin:
    """Admin calls on a cluster; ``async with Admin("a:9876;b:9877") as admin: ...``."""

    def __init__(
        self,
        namesrv: str | Sequence[str] | None = None,
        transport: Transport | None = None,
        *,
        timeout_s: float = 3.0,
        credentials: CredentialsArg = FROM_ENV,
        tls: TlsArg = FROM_ENV,
    ):
        try:
            self._owns_transport = transport is None
            self.transport = transport or Transport(timeout_s, credentials=credentials, tls=tls)
            self.namesrv = NamesrvClient(namesrv, self.transport)
        except ValueError as exc:
            raise InvalidArgument("INVALID_ADDRESS", str(exc)) from None

    async def close(self) -> None:
        if self._owns_transport:
            await self.transport.close()

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- plumbing -------------------------------------------------------------------------------
    async def _read(self, bd: BrokerData, path: str, params: Mapping[str, Any] | None = None) -> Any:
        """GET from the group's replicas, leader first; the next one only when one is unreachable."""
        last: ClientError | None = None
        for addr in bd.addrs_leader_first():
            try:
                return await self.transport.call(addr, "GET", path, params=params)
            except ClientError as exc:
                if exc.status:  # the replica answered: another one would say the same
                    raise
                last = exc
        if last is not None:
            raise last
        raise ClientError("NO_BROKER", f"broker group {bd.broker_name} has no registered address")

    async def _write_addr(
        self, addr: str, method: str, path: str, body: Mapping[str, Any] | None
    ) -> tuple[Any, str]:
        """One write; a ``NOT_LEADER`` answer naming another leader is followed once.
        Returns the answer and the address that gave it."""
        try:
            return await self.transport.call(addr, method, path, body), addr
        except ClientError as exc:
            if exc.code != "NOT_LEADER" or not exc.leader_addr or exc.leader_addr == addr:
                raise
            leader = exc.leader_addr
        return await self.transport.call(leader, method, path, body), leader

    async def _write(
        self, bd: BrokerData, method: str, path: str, body: Mapping[str, Any] | None
    ) -> tuple[Any, str]:
        """To the group's leader (id 0) when known, else to a follower, which redirects. A replica
        that cannot be connected to never saw the request, so the next one is tried (a stale route
        whose leader died); any other failure — a timeout may have applied the write — is final."""
        last: ClientError | None = None
        for addr in bd.addrs_leader_first():
            try:
                return await self._write_addr(addr, method, path, body)
            except ClientError as exc:
                if exc.code != "CONNECT_FAILED" or exc.addr != addr:
                    raise
                last = exc
        if last is not None:
            raise last
        raise ClientError("NO_BROKER", f"broker group {bd.broker_name} has no registered address")

    async def _cluster_groups(self, cluster: str) -> list[BrokerData]:
        info = await self.namesrv.clusters()
        names = info.clusters.get(cluster)
        if names is None:
            raise ClientError("CLUSTER_NOT_EXIST", f"no cluster {cluster!r} is registered", status=404)
        return [info.brokers[n] for n in names if n in info.brokers]

    async def _all_groups(self) -> list[BrokerData]:
        info = await self.namesrv.clusters()
        return [info.brokers[n] for n in sorted(info.brokers)]

    async def _fan_out_groups(
        self,
        groups: Sequence[BrokerData],
        call: Callable[[BrokerData], Awaitable[tuple[Any, str]]],
        *,
        absent_ok: bool = False,
    ) -> list[Outcome]:
        async def one(bd: BrokerData) -> Outcome:
            addr = bd.any_addr()
            try:
                answer, landed = await call(bd)
            except ClientError as exc:
                if absent_ok and exc.status == 404:
                    return Outcome(
                        "broker", bd.broker_name, exc.addr or addr, True, "NOT_EXIST", exc.message, 404
                    )
                return Outcome(
                    "broker", bd.broker_name, exc.addr or addr, False, exc.code, exc.message, exc.status
                )
            return Outcome("broker", bd.broker_name, landed, True, "OK", answer=answer)

        return list(await asyncio.gather(*(one(bd) for bd in groups)))

    async def _write_targets(
        self, body: Mapping[str, Any], path: str, *, cluster: str | None, broker_addr: str | None
    ) -> list[Outcome]:
        """POST ``body`` to one broker (``broker_addr``) or to every group leader of ``cluster``."""
        if (cluster is None) == (broker_addr is None):
            raise InvalidArgument(
                "BAD_REQUEST", "give exactly one of a cluster (-c) or a broker address (-b)"
            )
        if broker_addr is not None:
            check_addr(broker_addr)
            try:
                answer, landed = await self._write_addr(broker_addr, "POST", path, body)
            except ClientError as exc:
                outcome = Outcome(
                    "broker", broker_addr, exc.addr or broker_addr, False, exc.code, exc.message, exc.status
                )
                raise FanOutError([outcome]) from None
            return [Outcome("broker", broker_addr, landed, True, "OK", answer=answer)]
        assert cluster is not None
        groups = await self._cluster_groups(check_name(cluster, "cluster"))
        if not groups:
            raise ClientError("CLUSTER_NOT_EXIST", f"cluster {cluster!r} has no broker group", status=404)
        outcomes = await self._fan_out_groups(groups, lambda bd: self._write(bd, "POST", path, body))
        if not all(o.ok for o in outcomes):
            raise FanOutError(outcomes)
        return outcomes

    async def _route_group(self, topic: str, broker_name: str) -> BrokerData:
        route = await self.namesrv.route(topic)
        bd = route.broker(broker_name)
        if bd is None:
            raise ClientError(
                "BROKER_NOT_EXIST", f"broker group {broker_name!r} serves no queue of {topic!r}", status=404
            )
        return bd

    # -- NameServer -----------------------------------------------------------------------------
    @answers_checked
    async def cluster_list(self) -> list[BrokerMember]:
        """Every registered replica, sorted by cluster, broker name and id, with its live status."""
        info = await self.namesrv.clusters()
        rows: list[BrokerMember] = []
        for cluster, names in sorted(info.clusters.items()):
            for name in sorted(names):
                bd = info.brokers.get(name)
                for bid, addr in sorted((bd.broker_addrs if bd else {}).items()):
                    rows.append(BrokerMember(str(cluster), name, bid, addr))
        return list(await asyncio.gather(*(self._with_status(r) for r in rows)))

    async def _with_status(self, m: BrokerMember) -> BrokerMember:
        try:
            st = await self.transport.call(m.addr, "GET", "/v1/status", timeout_s=STATUS_TIMEOUT_S)
        except ClientError as exc:
            return dataclasses.replace(m, error=exc.code)
        if not isinstance(st, dict):
            return dataclasses.replace(m, error="BAD_ANSWER")
        topics = st.get("topics")
        return dataclasses.replace(
            m,
            role=st.get("role"),
            term=st.get("term"),
            self_id=st.get("self_id"),
            leader_id=st.get("leader_id"),
            writable=st.get("writable"),
            commit_index=st.get("commit_index"),
            applied_index=st.get("applied_index"),
            topics=len(topics) if isinstance(topics, (list, dict)) else topics,
        )

    @answers_checked
    async def topic_list(self) -> list[str]:
        return sorted(await self.namesrv.topics())

    @answers_checked
    async def topic_route(self, topic: str) -> TopicRoute:
        return await self.namesrv.route(check_topic(topic))

    # -- topics ---------------------------------------------------------------------------------
    @answers_checked
    async def update_topic(
        self,
        topic: str,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        read_queue_nums: int = 4,
        write_queue_nums: int = 4,
        perm: int = 6,
        order: bool = False,
    ) -> list[Outcome]:
        """Create or update the topic on every group leader of ``cluster``, or on one broker."""
        body = {
            "topic": check_topic(topic),
            "read_queue_nums": check_range(
                read_queue_nums, "read queue nums", 1, QUEUE_NUMS_MAX, "INVALID_QUEUE_NUMS"
            ),
            "write_queue_nums": check_range(
                write_queue_nums, "write queue nums", 1, QUEUE_NUMS_MAX, "INVALID_QUEUE_NUMS"
            ),
            "perm": check_range(perm, "perm", 0, 7, "INVALID_PERM"),
            "order": bool(order),
        }
        return await self._write_targets(body, "/v1/topics", cluster=cluster, broker_addr=broker_addr)

    @answers_checked
    async def delete_topic(self, topic: str, cluster: str) -> list[Outcome]:
        """Delete on every group leader of the cluster first, then on every NameServer (else the
        leaders' next registration would bring the route back)."""
        path = f"/v1/topics/{_path_part(check_topic(topic))}"
        groups = await self._cluster_groups(check_name(cluster, "cluster"))
        outcomes = await self._fan_out_groups(
            groups, lambda bd: self._write(bd, "DELETE", path, None), absent_ok=True
        )

        async def on_namesrv(addr: str) -> Outcome:
            try:
                answer = await self.transport.call(addr, "DELETE", path, params={"v": 1})
            except ClientError as exc:
                if exc.status == 404:
                    return Outcome("namesrv", addr, addr, True, "NOT_EXIST", exc.message, 404)
                return Outcome("namesrv", addr, addr, False, exc.code, exc.message, exc.status)
            return Outcome("namesrv", addr, addr, True, "OK", answer=answer)

        outcomes += await asyncio.gather(*(on_namesrv(a) for a in self.namesrv.addrs))
        if not all(o.ok for o in outcomes):
            raise FanOutError(outcomes)
        if all(o.code == "NOT_EXIST" for o in outcomes):
            raise ClientError(
                "TOPIC_NOT_EXIST",
                f"topic {topic!r} exists on no broker of {cluster!r} and no NameServer",
                status=404,
            )
        return outcomes

    @answers_checked
    async def topic_status(self, topic: str) -> list[QueueStatus]:
        route = await self.namesrv.route(check_topic(topic))
        path = f"/v1/topics/{_path_part(topic)}/status"
        answers = await asyncio.gather(*(self._read(bd, path) for bd in route.broker_datas))
        rows = [
            QueueStatus(
                bd.broker_name,
                int(q["queue_id"]),
                int(q["min_offset"]),
                int(q["max_offset"]),
                int(q.get("last_store_ts") or 0),
            )
            for bd, ans in zip(route.broker_datas, answers, strict=True)
            for q in ans.get("queues", [])
        ]
        return sorted(rows, key=lambda r: (r.broker_name, r.queue_id))

    # -- groups and offsets ---------------------------------------------------------------------
    @answers_checked
    async def update_sub_group(
        self,
        group: str,
        *,
        cluster: str | None = None,
        broker_addr: str | None = None,
        consume_enable: bool = True,
        consume_broadcast_enable: bool = True,
        retry_max_times: int = 16,
    ) -> list[Outcome]:
        body = {
            "group": check_group(group),
            "consume_enable": bool(consume_enable),
            "consume_broadcast_enable": bool(consume_broadcast_enable),
            "retry_max_times": check_range(retry_max_times, "retry max times", 0, 1000, "BAD_REQUEST"),
        }
        return await self._write_targets(body, "/v1/groups", cluster=cluster, broker_addr=broker_addr)

    @answers_checked
    async def consumer_progress(self, group: str, topic: str | None = None) -> ConsumerProgress:
        """Per queue: broker offset, committed offset and lag, over the topic's groups (or all)."""
        check_group(group)
        if topic is not None:
            groups = list((await self.namesrv.route(check_topic(topic))).broker_datas)
        else:
            groups = await self._all_groups()
        path = f"/v1/groups/{_path_part(group)}/progress"
        results = await asyncio.gather(*(self._read(bd, path) for bd in groups), return_exceptions=True)
        rows: list[QueueProgress] = []
        not_found: ClientError | None = None
        answered = 0
        for bd, res in zip(groups, results, strict=True):
            if isinstance(res, ClientError) and res.status == 404:
                not_found = res  # the group is unknown to this broker group
                continue
            if isinstance(res, BaseException):
                raise res
            answered += 1
            for t in res.get("topics", []):
                if topic is not None and t.get("topic") != topic:
                    continue
                for q in t.get("queues", []):
                    coff = q.get("consumer_offset")
                    rows.append(
                        QueueProgress(
                            str(t["topic"]),
                            bd.broker_name,
                            int(q["queue_id"]),
                            int(q["broker_offset"]),
                            int(coff) if coff is not None else None,
                            int(q.get("lag") or 0),
                            int(q["last_ts"]) if q.get("last_ts") else None,
                        )
                    )
        if not answered and not_found is not None:
            raise not_found
        rows.sort(key=lambda r: (r.topic, r.broker_name, r.queue_id))
        return ConsumerProgress(group, tuple(rows))

    @answers_checked
    async def reset_offset_by_time(self, group: str, topic: str, ts_ms: int) -> list[QueueOffset]:
        """Move the group's offsets of every queue of the topic to the first message stored at or
        after ``ts_ms`` (backwards too: the one explicit way to rewind), on every group's leader."""
        body = {
            "group": check_group(group),
            "topic": check_topic(topic),
            "ts": check_range(ts_ms, "timestamp", 0, 2**63 - 1, "INVALID_TIMESTAMP"),
        }
        route = await self.namesrv.route(topic)
        outcomes = await self._fan_out_groups(
            route.broker_datas, lambda bd: self._write(bd, "POST", "/v1/offsets/reset", body)
        )
        if not all(o.ok for o in outcomes):
            raise FanOutError(outcomes)
        rows = [
            QueueOffset(o.name, int(qid), int(off))
            for o in outcomes
            for qid, off in dict((o.answer or {}).get("offsets") or {}).items()
        ]
        return sorted(rows, key=lambda r: (r.broker_name, r.queue_id))

    # -- brokers --------------------------------------------------------------------------------
    @answers_checked
    async def broker_status(self, broker_addr: str) -> dict[str, Any]:
        return dict(await self.transport.call(check_addr(broker_addr), "GET", "/v1/status"))

    @answers_checked
    async def transfer_leader(self, broker_name: str, target_id: str | None = None) -> TransferResult:
        """Ask the group to hand leadership to ``target_id`` (a peer id such as ``n1``; None: any)."""
        check_name(broker_name, "broker")
        if target_id is not None and not PEER_ID_RE.fullmatch(target_id):
            raise InvalidArgument(
                "INVALID_TARGET", f"target id {target_id!r} must match [a-zA-Z0-9_.-]{{1,64}}"
            )
        bd = (await self.namesrv.clusters()).brokers.get(broker_name)
        if bd is None:
            raise ClientError(
                "BROKER_NOT_EXIST", f"no broker group {broker_name!r} is registered", status=404
            )
        body = {"target": target_id} if target_id is not None else {}
        answer, addr = await self._write(bd, "POST", "/v1/admin/transfer", body)
        leader = answer.get("leader_id")
        return TransferResult(broker_name, str(leader) if leader is not None else None, addr)

    # -- messages -------------------------------------------------------------------------------
    @answers_checked
    async def query_msg_by_id(self, msg_id: str) -> MessageView:
        broker_name, _ = parse_msg_id(msg_id)
        bd = (await self.namesrv.clusters()).brokers.get(broker_name)
        if bd is None:
            raise ClientError(
                "BROKER_NOT_EXIST", f"no broker group {broker_name!r} is registered", status=404
            )
        return message_from_dict(await self._read(bd, f"/v1/msg/id/{_path_part(msg_id)}"))

    async def _query_groups(self, topic: str, path: str, params: Mapping[str, Any]) -> list[MessageView]:
        route = await self.namesrv.route(check_topic(topic))
        answers = await asyncio.gather(*(self._read(bd, path, params) for bd in route.broker_datas))
        msgs = [message_from_dict(m) for ans in answers for m in ans.get("messages", [])]
        return sorted(msgs, key=lambda m: (-m.store_ts, m.broker_name, m.position))

    @answers_checked
    async def query_msg_by_key(self, topic: str, key: str, max: int = 64) -> list[MessageView]:
        """Messages of the topic carrying ``key``, newest first, at most ``max`` over all groups."""
        check_range(max, "max", 1, QUERY_MAX, "BAD_REQUEST")
        msgs = await self._query_groups(
            topic, "/v1/msg/key", {"topic": topic, "key": check_key(key), "max": max}
        )
        return msgs[:max]

    @answers_checked
    async def query_msg_by_unique_key(self, topic: str, unique_id: str) -> list[MessageView]:
        if not is_unique_id(unique_id):
            raise InvalidArgument("INVALID_UNIQUE_ID", f"unique id {unique_id!r} must match {UNIQUE_ID_RULE}")
        return await self._query_groups(topic, "/v1/msg/unique", {"topic": topic, "unique_id": unique_id})

    @answers_checked
    async def query_msg_by_offset(
        self, topic: str, broker_name: str, queue_id: int, offset: int
    ) -> MessageView:
        check_topic(topic)
        check_name(broker_name, "broker")
        check_range(queue_id, "queue id", 0, QUEUE_NUMS_MAX - 1, "INVALID_QUEUE_ID")
        check_range(offset, "offset", 0, 2**63 - 1, "INVALID_OFFSET")
        bd = await self._route_group(topic, broker_name)
        params = {"topic": topic, "queue_id": queue_id, "offset": offset}
        return message_from_dict(await self._read(bd, "/v1/msg/offset", params))

    @answers_checked
    async def pull(
        self,
        topic: str,
        broker_name: str,
        queue_id: int,
        offset: int,
        *,
        max_count: int = 32,
        consumer_group: str | None = None,
        route: TopicRoute | None = None,
        sql: str | None = None,
    ) -> PullResult:
        """One pull without suspending and without committing anything (``consumeMessage``);
        ``route`` saves the route lookup when the caller has it; ``sql`` an SQL92 filter."""
        check_range(max_count, "max count", 1, 1024, "BAD_REQUEST")
        check_topic(topic)
        check_name(broker_name, "broker")
        bd = route.broker(broker_name) if route is not None else None
        if bd is None:
            bd = await self._route_group(topic, broker_name)
        body: dict[str, Any] = {
            "topic": topic,
            "queue_id": queue_id,
            "offset": offset,
            "max_count": max_count,
        }
        if consumer_group is not None:
            body["consumer_group"] = check_group(consumer_group)
        if sql is not None:
            try:
                body["sql"] = MessageSelector.by_sql(sql).expression
            except ClientError as exc:
                raise InvalidArgument(exc.code, exc.message) from None
        last: ClientError | None = None
        for addr in bd.addrs_leader_first():  # a POST, but a read: any replica may serve it
            try:
                ans = await self.transport.call(addr, "POST", "/v1/pull", body)
                break
            except ClientError as exc:
                if exc.status:
                    raise
                last = exc
        else:
            raise last or ClientError("NO_BROKER", f"broker group {broker_name} has no registered address")
        return PullResult(
            str(ans.get("status")),
            int(ans.get("next_offset", offset)),
            int(ans.get("min_offset", 0)),
            int(ans.get("max_offset", 0)),
            tuple(message_from_dict(m) for m in ans.get("messages", [])),
        )

    # -- dead-letter queues (issue 14; broker/retry.py) ---------------------------------------------
    @answers_checked
    async def query_dlq_messages(self, group: str, max_count: int = 64) -> list[MessageView]:
        """The newest ``max_count`` messages per queue of ``%DLQ%<group>`` (read by offset: a DLQ is
        write only, pulls are refused). RocketMQ dashboard's queryDlqMessageByConsumerGroup."""
        topic = "%DLQ%" + check_group(group)
        check_range(max_count, "max count", 1, 1024, "BAD_REQUEST")
        out: list[MessageView] = []
        for qs in await self.topic_status(topic):
            bd = await self._route_group(topic, qs.broker_name)
            for offset in range(max(qs.min_offset, qs.max_offset - max_count), qs.max_offset):
                params = {"topic": topic, "queue_id": qs.queue_id, "offset": offset}
                out.append(message_from_dict(await self._read(bd, "/v1/msg/offset", params)))
        return out

    @answers_checked
    async def resend_dlq_message(self, group: str, msg_id: str) -> dict[str, Any]:
        """Send a DLQ message back to ``%RETRY%<group>`` (due at once, its count started again)."""
        check_group(group)
        broker_name, _ = parse_msg_id(msg_id)
        bd = (await self.namesrv.clusters()).brokers.get(broker_name)
        if bd is None:
            raise ClientError("BROKER_NOT_EXIST", f"no broker group {broker_name!r} is registered", status=404)
        answer, _addr = await self._write(bd, "POST", "/v1/dlq/resend", {"group": group, "msg_id": msg_id})
        return dict(answer)
