"""mqadmin's codes about topics' queues, consumer groups and their clients:

    GET_TOPIC_STATS_INFO (202)         TopicStatsTable: per queue min / max offset and the store time
                                       of the last message (``service.topic_status``); TOPIC_NOT_EXIST
    GET_CONSUME_STATS (208)            ConsumeStats of the group (``service.consume_stats``): per queue
                                       of each topic it consumes here the max offset, its committed
                                       offset and the last consumed message's store time; its pull rate
    GET_CONSUMER_CONNECTION_LIST (203) ConsumerConnection: the group's members heartbeating here
                                       (client id, address, language, version of the official clients'
                                       connections; our SDK's members as language OTHER, version 0),
                                       their subscriptions, consume type, model and where they start;
                                       no member: CONSUMER_NOT_ONLINE (206)
    GET_PRODUCER_CONNECTION_LIST (204) ProducerConnection: the producers that heartbeated the group
                                       here, and the addresses seen sending for it (our SDK's);
                                       none: SYSTEM_ERROR "the producer group[G] not exist"
    QUERY_TOPIC_CONSUME_BY_WHO (300)   GroupList (``service.topic_consumer_groups``)
    QUERY_CONSUME_TIME_SPAN (303)      QueryConsumeTimeSpanBody (``service.consume_time_span``)
    INVOKE_BROKER_TO_RESET_OFFSET (222) the group's offsets on the topic reset through the Raft log
                                       (by time: ``service.reset_offsets_by_time``, -1 = the queues'
                                       ends, isForce false = never forward; 5.x by queue: queueId +
                                       offset), then RESET_CONSUMER_CLIENT_OFFSET (oneway, the same
                                       header and the offset table) to each of the group's clients
                                       connected here, which restart from there; answer ResetOffsetBody
    CLONE_GROUP_OFFSET (314)           ``service.clone_group_offsets`` through the Raft log
    GET_CONSUMER_RUNNING_INFO (307)    relayed to the client (``invoke`` on its connection, at most
                                       ``RELAY_TIMEOUT_S``: CONSUME_MSG_TIMEOUT), its answer returned

ACL (``needs_of``): SUB on the group for its stats, connections, time span and running info;
admin for resets, clones and producer connections (as the HTTP API); a signature for the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from broker.edge.rocketmq.channels import Channel
from broker.protocol.rocketmq import admin_headers as ah
from broker.protocol.rocketmq import bodies, headers
from broker.protocol.rocketmq import properties as rp
from broker.protocol.rocketmq.codes import LanguageCode, RequestCode, ResponseCode
from broker.protocol.rocketmq.command import RemotingCommand
from broker.service.broker_service import ResetAnswer
from broker.serving.remoting_server import Request

if TYPE_CHECKING:
    from broker.edge.rocketmq.host import EdgeHost

RELAY_TIMEOUT_S: Final = 5.0  # what mqadmin waits for the whole call by default
OTHER_LANGUAGE: Final = LanguageCode.OTHER.name  # a member known by HTTP heartbeats (our SDK)


def register(edge: EdgeHost) -> None:
    h = Stats(edge)
    edge.route(RequestCode.GET_TOPIC_STATS_INFO, h.topic_stats)
    edge.route(RequestCode.GET_CONSUME_STATS, h.consume_stats)
    edge.route(RequestCode.GET_CONSUMER_CONNECTION_LIST, h.consumer_connections)
    edge.route(RequestCode.GET_PRODUCER_CONNECTION_LIST, h.producer_connections)
    edge.route(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, h.consumed_by)
    edge.route(RequestCode.QUERY_CONSUME_TIME_SPAN, h.time_span)
    edge.route(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, h.reset_offset, writes=True)
    edge.route(RequestCode.CLONE_GROUP_OFFSET, h.clone_offsets, writes=True)
    edge.route(RequestCode.GET_CONSUMER_RUNNING_INFO, h.running_info)


def language_name(code: int) -> str:
    try:
        return LanguageCode(code).name
    except ValueError:
        return OTHER_LANGUAGE


def connection_of(channel: Channel) -> bodies.Connection:
    return bodies.Connection(client_id=channel.client_id, client_addr=channel.client_addr,
                             language=language_name(channel.language), version=channel.version)


def subscription_data(topic: str, expression_type: str, expression: str) -> bodies.SubscriptionData:
    """A subscription our SDK's heartbeat gave, as RocketMQ's SubscriptionData."""
    tags, codes = rp.subscription_tags(expression) if expression_type == bodies.EXPRESSION_TAG else ((), ())
    return bodies.SubscriptionData(topic=topic, sub_string=expression, tags_set=tags, code_set=codes,
                                   expression_type=expression_type)


class Stats:
    def __init__(self, edge: EdgeHost):
        self.edge = edge
        self.svc = edge.service

    def mq(self, topic: str, queue_id: int) -> bodies.MessageQueue:
        return bodies.MessageQueue(topic=topic, broker_name=self.edge.broker_name, queue_id=queue_id)

    # -- topics and groups ----------------------------------------------------------------------------------
    async def topic_stats(self, req: Request) -> RemotingCommand:
        status = self.svc.topic_status(req.header(ah.TopicHeader).topic)
        table = tuple(
            (self.mq(status["topic"], q["queue_id"]),
             bodies.TopicOffset(min_offset=q["min_offset"], max_offset=q["max_offset"],
                                last_update_timestamp=q["last_store_ts"]))
            for q in status["queues"]
        )
        return req.ok(body=bodies.encode(bodies.TopicStatsTable(offset_table=table)))

    async def consume_stats(self, req: Request) -> RemotingCommand:
        h = req.header(ah.GetConsumeStatsRequestHeader)
        stats = self.svc.consume_stats(h.consumer_group, h.topic or None)
        table = tuple(
            (self.mq(q.topic, q.queue_id),
             bodies.OffsetWrapper(broker_offset=q.broker_offset, consumer_offset=q.consumer_offset,
                                  last_timestamp=q.last_ts))
            for q in stats.queues
        )
        return req.ok(body=bodies.encode(bodies.ConsumeStats(offset_table=table, consume_tps=stats.consume_tps)))

    async def consumed_by(self, req: Request) -> RemotingCommand:
        groups = self.svc.topic_consumer_groups(req.header(ah.TopicHeader).topic)
        return req.ok(body=bodies.encode(bodies.GroupList(group_list=tuple(groups))))

    async def time_span(self, req: Request) -> RemotingCommand:
        h = req.header(ah.TopicGroupHeader)
        spans = tuple(
            bodies.QueueTimeSpan.of(self.mq(h.topic, s.queue_id), s.min_ts, s.max_ts, s.consume_ts, s.delay_ms)
            for s in self.svc.consume_time_span(h.group, h.topic)
        )
        return req.ok(body=bodies.encode(bodies.QueryConsumeTimeSpanBody(consume_time_span_set=spans)))

    # -- clients ------------------------------------------------------------------------------------------------
    async def consumer_connections(self, req: Request) -> RemotingCommand:
        group = req.header(headers.ConsumerGroupHeader).consumer_group
        members = self.svc.group_members(group)["members"]
        if not members:
            return req.answer(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        connections: list[bodies.Connection] = []
        subscriptions: dict[str, bodies.SubscriptionData] = {}
        latest: bodies.ConsumerData | None = None
        model: str | None = None
        for member in members:
            model = model or member["model"]
            channel = self.edge.channels.get(member["client_id"])
            data = None
            if channel is not None and group in channel.consumer_groups:
                data = next((c for c in channel.consumer_data if c.group_name == group), None)
            if channel is None or data is None:  # known by our SDK's heartbeats (HTTP)
                connections.append(bodies.Connection(client_id=member["client_id"], client_addr="",
                                                     language=OTHER_LANGUAGE, version=0))
                sub = None
                for topic in member["topics"]:
                    sub = self.svc.subscription_of(group, topic)
                    subscriptions.setdefault(topic, subscription_data(
                        topic, sub.expression_type if sub else bodies.EXPRESSION_TAG, sub.expression if sub else "*"))
                continue
            connections.append(connection_of(channel))
            latest = latest or data
            for s in data.subscription_data_set:
                subscriptions.setdefault(s.topic, s)
        body = bodies.ConsumerConnection(
            connection_set=tuple(connections), subscription_table=subscriptions,
            consume_type=latest.consume_type if latest else None,
            message_model=(latest.message_model if latest else None) or model,
            consume_from_where=latest.consume_from_where if latest else None,
        )
        return req.ok(body=bodies.encode(body))

    async def producer_connections(self, req: Request) -> RemotingCommand:
        group = req.header(ah.GetProducerConnectionListRequestHeader).producer_group
        channels = self.edge.channels.producers(group)
        connections = [connection_of(c) for c in channels]
        known = {c.client_addr for c in channels}
        for seen in self.svc.producer_connections(group):  # sends of producers that never heartbeated here
            addr = str(seen["client_addr"])
            if addr not in known:
                connections.append(bodies.Connection(client_id=addr, client_addr=addr, language=OTHER_LANGUAGE,
                                                     version=0))
        if not connections:
            return req.answer(ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        return req.ok(body=bodies.encode(bodies.ProducerConnection(connection_set=tuple(connections))))

    async def running_info(self, req: Request) -> RemotingCommand:
        h = req.header(ah.GetConsumerRunningInfoRequestHeader)
        channel = self.edge.channels.get(h.client_id)
        if channel is None or channel.connection.closed or h.consumer_group not in channel.consumer_groups:
            return req.answer(ResponseCode.SYSTEM_ERROR,
                              f"The Consumer <{h.consumer_group}> <{h.client_id}> not online")
        try:
            got = await channel.connection.invoke(RequestCode.GET_CONSUMER_RUNNING_INFO, headers.to_ext(h),
                                                  timeout_s=RELAY_TIMEOUT_S)
        except TimeoutError:
            return req.answer(ResponseCode.CONSUME_MSG_TIMEOUT, f"consumer <{h.consumer_group}> <{h.client_id}> "
                              f"Timeout: no answer in {RELAY_TIMEOUT_S} s")
        except (ConnectionError, OSError) as exc:
            return req.answer(ResponseCode.SYSTEM_ERROR,
                              f"invoke consumer <{h.consumer_group}> <{h.client_id}> Exception: {exc}")
        return req.answer(got.code, got.remark, ext_fields=got.ext_fields, body=got.body)

    # -- offsets ------------------------------------------------------------------------------------------------
    async def reset_offset(self, req: Request) -> RemotingCommand:
        h = req.header(ah.ResetOffsetRequestHeader)
        if h.queue_id is not None and h.queue_id >= 0 and h.offset is not None and h.offset >= 0:  # 5.x, one queue
            reset: ResetAnswer = await self.svc.reset_offsets(h.group, h.topic, offsets={h.queue_id: h.offset})
        else:
            reset = await self.svc.reset_offsets_by_time(h.group, h.topic, h.timestamp, force=h.is_force)
        body = bodies.encode(bodies.ResetOffsetBody(
            offset_table=tuple((self.mq(h.topic, q), o) for q, o in sorted(reset.offsets.items()))))
        ext = headers.to_ext(ah.ResetOffsetRequestHeader(topic=h.topic, group=h.group, timestamp=h.timestamp,
                                                         is_force=h.is_force))
        for channel in self.edge.channels.consumers(h.group):
            self.edge.spawn(channel.connection.invoke_oneway(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, ext, body))
        return req.ok(body=body)

    async def clone_offsets(self, req: Request) -> RemotingCommand:
        h = req.header(ah.CloneGroupOffsetRequestHeader)
        await self.svc.clone_group_offsets(h.src_group, h.dest_group, h.topic or None)
        return req.ok()
