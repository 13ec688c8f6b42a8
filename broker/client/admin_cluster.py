"""``Admin``'s calls on the cluster: NameServer listings and routes, topics, subscription groups and
offsets, brokers (status, leadership transfer). Over ``AdminBase``."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from typing import Any

from broker.client.admin_base import AdminBase
from broker.client.admin_checks import (
    answers_checked,
    check_addr,
    check_group,
    check_name,
    check_range,
    check_stored_topic,
    check_topic,
    path_part,
)
from broker.client.admin_records import (
    BrokerMember,
    ConsumerProgress,
    FanOutError,
    InvalidArgument,
    Outcome,
    QueueOffset,
    QueueProgress,
    QueueStatus,
    TransferResult,
)
from broker.client.transport import ClientError, TopicRoute
from broker.protocol.limits import QUEUE_NUMS_MAX
from broker.protocol.names import is_topic

PEER_ID_RE = re.compile(r"[a-zA-Z0-9_]{1,64}")  # dledger.config.PEER_ID_RE
STATUS_TIMEOUT_S = 2.0  # per member in cluster_list: a dead member must not stall the listing


class AdminClusterOps(AdminBase):
    """Clusters, topics, groups, offsets and brokers (see ``broker/client/admin.py`` for where each call goes)."""

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
        path = f"/v1/topics/{path_part(check_stored_topic(topic))}"
        groups = await self.cluster_groups(check_name(cluster, "cluster"))
        outcomes = await self.fan_out_groups(
            groups, lambda bd: self.write(bd, "DELETE", path, None), absent_ok=True
        )
        if not is_topic(topic):  # a name an older release stored: never routable, no NameServer holds it
            return outcomes

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
        path = f"/v1/topics/{path_part(topic)}/status"
        answers = await asyncio.gather(*(self.read(bd, path) for bd in route.broker_datas))
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
            groups = await self.all_groups()
        path = f"/v1/groups/{path_part(group)}/progress"
        results = await asyncio.gather(*(self.read(bd, path) for bd in groups), return_exceptions=True)
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
        outcomes = await self.fan_out_groups(
            route.broker_datas, lambda bd: self.write(bd, "POST", "/v1/offsets/reset", body)
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
        answer, addr = await self.write(bd, "POST", "/v1/admin/transfer", body)
        leader = answer.get("leader_id")
        return TransferResult(broker_name, str(leader) if leader is not None else None, addr)
