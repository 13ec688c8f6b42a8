"""Consumer offsets and queue offsets:

    QUERY_CONSUMER_OFFSET (14)        the group's committed offset -> ``service.committed_offset`` (any
                                      replica: offsets are replicated); never committed:
                                      QUERY_NOT_FOUND (the client starts per its consumeFromWhere)
    UPDATE_CONSUMER_OFFSET (15)       commit through the Raft log -> ``service.commit_offsets`` (the
                                      ready leader; a follower answers SERVICE_NOT_AVAILABLE, and a
                                      oneway commit is simply made again by the client 5 s later);
                                      ignored while a reset of the queue waits for the client's next
                                      pull (``offset_reset_pending``: the commit predates the reset)
    GET_MAX_OFFSET (30) / GET_MIN_OFFSET (31)   -> ``service.queue_bounds`` (0 for a queue never written)
    SEARCH_OFFSET_BY_TIMESTAMP (29)   the first offset stored at or after the time (5.x
                                      ``boundaryType=upper``: the last one stored at or before it)
                                      -> ``service.search_offset``
    GET_EARLIEST_MSG_STORETIME (32)   store time of the queue's first message, -1 when empty
                                      -> ``service.earliest_store_time``
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.protocol.rocketmq import headers
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode
from broker.protocol.rocketmq.command import RemotingCommand
from broker.serving.remoting_server import Request

if TYPE_CHECKING:
    from broker.edge.rocketmq.host import EdgeHost

NOT_FOUND_REMARK = "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"


def register(edge: EdgeHost) -> None:
    h = Offsets(edge)
    edge.route(RequestCode.QUERY_CONSUMER_OFFSET, h.query)
    edge.route(RequestCode.UPDATE_CONSUMER_OFFSET, h.update, writes=True)
    edge.route(RequestCode.GET_MAX_OFFSET, h.max_offset)
    edge.route(RequestCode.GET_MIN_OFFSET, h.min_offset)
    edge.route(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, h.search)
    edge.route(RequestCode.GET_EARLIEST_MSG_STORETIME, h.earliest)


def _offset(req: Request, offset: int) -> RemotingCommand:
    return req.ok(ext_fields=headers.to_ext(headers.OffsetResponseHeader(offset=offset)))


class Offsets:
    def __init__(self, edge: EdgeHost):
        self.svc = edge.service

    async def query(self, req: Request) -> RemotingCommand:
        h = req.header(headers.QueryConsumerOffsetRequestHeader)
        offset = self.svc.committed_offset(h.consumer_group, h.topic, h.queue_id)
        if offset is None:
            return req.answer(ResponseCode.QUERY_NOT_FOUND, NOT_FOUND_REMARK)
        return _offset(req, offset)

    async def update(self, req: Request) -> RemotingCommand:
        h = req.header(headers.UpdateConsumerOffsetRequestHeader)
        if self.svc.offset_reset_pending(h.consumer_group, h.topic, h.queue_id):  # made before the client knew
            return req.answer(ResponseCode.SUCCESS, "Offset has been previously reset")
        await self.svc.commit_offsets(h.consumer_group, h.topic, {h.queue_id: h.commit_offset})
        return req.ok()

    async def max_offset(self, req: Request) -> RemotingCommand:
        h = req.header(headers.TopicQueueHeader)
        return _offset(req, self.svc.queue_bounds(h.topic, h.queue_id)[1])

    async def min_offset(self, req: Request) -> RemotingCommand:
        h = req.header(headers.TopicQueueHeader)
        return _offset(req, self.svc.queue_bounds(h.topic, h.queue_id)[0])

    async def search(self, req: Request) -> RemotingCommand:
        h = req.header(headers.SearchOffsetRequestHeader)
        if (h.boundary_type or "lower").lower() == "upper":
            lo, _hi = self.svc.queue_bounds(h.topic, h.queue_id)
            after = self.svc.search_offset(h.topic, h.queue_id, h.timestamp + 1) if h.timestamp < 2**63 - 1 else _hi
            return _offset(req, max(lo, after - 1))
        return _offset(req, self.svc.search_offset(h.topic, h.queue_id, max(h.timestamp, 0)))

    async def earliest(self, req: Request) -> RemotingCommand:
        h = req.header(headers.TopicQueueHeader)
        stamp = self.svc.earliest_store_time(h.topic, h.queue_id)
        return req.ok(ext_fields=headers.to_ext(headers.TimestampResponseHeader(timestamp=stamp)))
