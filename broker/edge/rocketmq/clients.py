"""What consumers and producers tell the broker about themselves, and their retries:

    HEART_BEAT (34)                  producer and consumer groups, subscriptions (TAG / SQL92) ->
                                     ``service.heartbeat`` (a member for 120 s without heartbeats,
                                     as RocketMQ keeps one); the client's connection is remembered;
                                     groups whose member list changed get NOTIFY_CONSUMER_IDS_CHANGED;
                                     a consumer group's missing retry topic is created (the leader)
    UNREGISTER_CLIENT (35)           the client leaves the group it names -> ``service.leave``
    GET_CONSUMER_LIST_BY_GROUP (38)  the group's client ids -> ``service.group_members``; none:
                                     SYSTEM_ERROR "no consumer for this group" (RocketMQ's answer)
    CHECK_CLIENT_CONFIG (46)         a push consumer's SQL92 subscription, checked before it starts
                                     -> ``service.check_subscription``
    LOCK_BATCH_MQ (41) / UNLOCK_BATCH_MQ (42)   orderly consumers' queue locks -> ``service.lock_queues``
                                     / ``unlock_queues`` (the queues of this broker group only)
    CONSUMER_SEND_MSG_BACK (36)      a message the listener could not consume -> ``service.send_back``:
                                     %RETRY%<group> with the delay level asked for (0: 3 + reconsume
                                     times), %DLQ%<group> past maxReconsumeTimes or for delayLevel < 0;
                                     the caller must be allowed to read (SUB) the stored message's
                                     topic and its group must consume it (issue 23)

Every client id stays its first account's (``broker.service.consumers``: another account can neither take it
over nor unregister it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from broker.edge.rocketmq.channels import Channel
from broker.protocol.errors import ProtocolError
from broker.protocol.rocketmq import bodies, headers
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode
from broker.protocol.rocketmq.command import RemotingCommand
from broker.service.consumers import Subscription
from broker.serving.acl import Perm
from broker.serving.remoting_server import Request

if TYPE_CHECKING:
    from broker.edge.rocketmq.host import EdgeHost

log = logging.getLogger("broker.edge.rocketmq")
CLIENT_EXPIRY_MS: Final = 120_000
"""How long a RocketMQ client stays a member without heartbeats (RocketMQ's broker: 120 s; its clients
heartbeat every 30 s). A client whose connection closes leaves at once."""


def register(edge: EdgeHost) -> None:
    h = Clients(edge)
    edge.route(RequestCode.HEART_BEAT, h.heartbeat)
    edge.route(RequestCode.UNREGISTER_CLIENT, h.unregister)
    edge.route(RequestCode.GET_CONSUMER_LIST_BY_GROUP, h.consumer_list)
    edge.route(RequestCode.CHECK_CLIENT_CONFIG, h.check_client_config)
    edge.route(RequestCode.LOCK_BATCH_MQ, h.lock)
    edge.route(RequestCode.UNLOCK_BATCH_MQ, h.unlock)
    edge.route(RequestCode.CONSUMER_SEND_MSG_BACK, h.send_back, writes=True)


class Clients:
    def __init__(self, edge: EdgeHost):
        self.edge = edge
        self.svc = edge.service

    async def heartbeat(self, req: Request) -> RemotingCommand:
        beat = bodies.decode(bodies.HeartbeatData, req.cmd.body)
        groups = []
        filters: dict[str, dict[str, Subscription]] = {}
        for c in beat.consumer_data_set:
            subs = {s.topic: Subscription(s.expression_type or bodies.EXPRESSION_TAG, s.sub_string)
                    for s in c.subscription_data_set}
            groups.append((c.group_name, c.message_model or "CLUSTERING", tuple(subs)))
            filters[c.group_name] = subs
        principal = req.principal
        changed = self.svc.heartbeat(beat.client_id, groups, principal.name, admin=self.edge.is_admin(principal),
                                     filters=filters, expiry_ms=CLIENT_EXPIRY_MS)
        self.edge.channels.bind(Channel(
            client_id=beat.client_id, connection=req.connection, language=req.cmd.language,
            version=req.cmd.version, owner=principal.name, client_addr=self.edge.peer_addr(req),
            producer_groups=frozenset(p.group_name for p in beat.producer_data_set),
            consumer_groups=frozenset(filters), principal=principal, consumer_data=beat.consumer_data_set,
        ))
        if changed:
            self.edge.notify_changed(changed)
        for group in filters:  # RocketMQ's broker creates a consumer group's retry topic at its heartbeat
            if self.svc.retry_topic_missing(group):
                self.edge.spawn(self._create_retry_topic(group))
        return req.ok()

    async def _create_retry_topic(self, group: str) -> None:
        try:
            await self.svc.ensure_retry_topic(group)
        except ProtocolError as exc:  # not the leader any more, ...: the next heartbeat tries again
            log.info("retry topic of %s not created: %s", group, exc.message)

    async def unregister(self, req: Request) -> RemotingCommand:
        h = req.header(headers.UnregisterClientRequestHeader)
        principal = req.principal
        if h.consumer_group:
            changed = self.svc.leave(h.client_id, h.consumer_group, principal.name,
                                     admin=self.edge.is_admin(principal))
            self.edge.channels.forget_consumer(h.client_id, h.consumer_group)
            if changed:
                self.edge.notify_changed(changed)
        if h.producer_group:
            channel = self.edge.channels.get(h.client_id)
            if channel is not None and (channel.owner == principal.name or self.edge.is_admin(principal)):
                self.edge.channels.forget_producer(h.client_id, h.producer_group)
        return req.ok()

    async def consumer_list(self, req: Request) -> RemotingCommand:
        group = req.header(headers.ConsumerGroupHeader).consumer_group
        ids = self.svc.group_members(group)["client_ids"]
        if not ids:
            return req.answer(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return req.ok(body=bodies.encode(bodies.GetConsumerListByGroupResponseBody(consumer_id_list=tuple(ids))))

    async def check_client_config(self, req: Request) -> RemotingCommand:
        body = bodies.decode(bodies.CheckClientRequestBody, req.cmd.body)
        sub = body.subscription_data
        self.svc.check_subscription(sub.expression_type or bodies.EXPRESSION_TAG, sub.sub_string)
        return req.ok()

    def _queues(self, req: Request, body: bodies.LockBatchRequestBody) -> list[tuple[str, int]]:
        mine = [(mq.topic, mq.queue_id) for mq in body.mq_set if mq.broker_name == self.edge.broker_name]
        req.require(topics=dict.fromkeys((t for t, _q in mine), Perm.SUB), groups={body.consumer_group: Perm.SUB})
        return mine

    async def lock(self, req: Request) -> RemotingCommand:
        body = bodies.decode(bodies.LockBatchRequestBody, req.cmd.body)
        locked = set(self.svc.lock_queues(body.consumer_group, body.client_id, self._queues(req, body)))
        ok = tuple(mq for mq in body.mq_set
                   if mq.broker_name == self.edge.broker_name and (mq.topic, mq.queue_id) in locked)
        return req.ok(body=bodies.encode(bodies.LockBatchResponseBody(lock_ok_mq_set=ok)))

    async def unlock(self, req: Request) -> RemotingCommand:
        body = bodies.decode(bodies.UnlockBatchRequestBody, req.cmd.body)
        self.svc.unlock_queues(body.consumer_group, body.client_id, self._queues(req, body))
        return req.ok()

    async def send_back(self, req: Request) -> RemotingCommand:
        h = req.header(headers.ConsumerSendMsgBackRequestHeader)

        def may_read(topic: str) -> None:
            req.require(topics={topic: Perm.SUB})

        await self.svc.send_back(
            h.group, h.offset, max_reconsume_times=h.max_reconsume_times, to_dlq=h.delay_level < 0,
            delay_level=h.delay_level if h.delay_level > 0 else None, may_read=may_read,
        )
        return req.ok()
