"""``Admin``'s calls on messages: queries by id, key, unique key and queue offset, a one-off pull that
commits nothing (``consumeMessage``), and the dead-letter queues. Over ``AdminClusterOps`` (a DLQ is read
through its topic's status)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from broker.client.admin_checks import (
    answers_checked,
    check_group,
    check_key,
    check_name,
    check_range,
    check_topic,
    parse_msg_id,
    path_part,
)
from broker.client.admin_cluster import AdminClusterOps
from broker.client.admin_records import InvalidArgument, MessageView, PullResult, message_from_dict
from broker.client.message_selector import MessageSelector
from broker.client.transport import ClientError, TopicRoute
from broker.protocol.frames import Op
from broker.protocol.limits import QUERY_MESSAGES_MAX, QUEUE_NUMS_MAX
from broker.protocol.names import UNIQUE_ID_RULE, is_unique_id


class AdminMessageOps(AdminClusterOps):
    """Message queries, pulls and dead-letter queues (see ``broker/client/admin.py``)."""

    # -- messages -------------------------------------------------------------------------------
    @answers_checked
    async def query_msg_by_id(self, msg_id: str) -> MessageView:
        broker_name, _ = parse_msg_id(msg_id)
        bd = (await self.namesrv.clusters()).brokers.get(broker_name)
        if bd is None:
            raise ClientError(
                "BROKER_NOT_EXIST", f"no broker group {broker_name!r} is registered", status=404
            )
        return message_from_dict(await self.read(bd, f"/v1/msg/id/{path_part(msg_id)}"))

    async def _query_groups(self, topic: str, path: str, params: Mapping[str, Any]) -> list[MessageView]:
        route = await self.namesrv.route(check_topic(topic))
        answers = await asyncio.gather(*(self.read(bd, path, params) for bd in route.broker_datas))
        msgs = [message_from_dict(m) for ans in answers for m in ans.get("messages", [])]
        return sorted(msgs, key=lambda m: (-m.store_ts, m.broker_name, m.position))

    @answers_checked
    async def query_msg_by_key(self, topic: str, key: str, max: int = 64) -> list[MessageView]:
        """Messages of the topic carrying ``key``, newest first, at most ``max`` over all groups."""
        check_range(max, "max", 1, QUERY_MESSAGES_MAX, "BAD_REQUEST")
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
        return message_from_dict(await self.read(bd, "/v1/msg/offset", params))

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
                ans = await self.transport.operation(addr, Op.PULL, body)
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

    # -- dead-letter queues (issue 14; broker/store/retry.py) ---------------------------------------------
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
                out.append(message_from_dict(await self.read(bd, "/v1/msg/offset", params)))
        return out

    @answers_checked
    async def resend_dlq_message(self, group: str, msg_id: str) -> dict[str, Any]:
        """Send a DLQ message back to ``%RETRY%<group>`` (due at once, its count started again)."""
        check_group(group)
        broker_name, _ = parse_msg_id(msg_id)
        bd = (await self.namesrv.clusters()).brokers.get(broker_name)
        if bd is None:
            raise ClientError("BROKER_NOT_EXIST", f"no broker group {broker_name!r} is registered", status=404)
        answer, _addr = await self.write(bd, "POST", "/v1/dlq/resend", {"group": group, "msg_id": msg_id})
        return dict(answer)
