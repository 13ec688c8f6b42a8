"""PULL_MESSAGE and LITE_PULL_MESSAGE (5.x lite pull consumers), answered by ``BrokerService.pull``
(with its long polling: a pull at the end of a queue with the suspend flag is held until a message
arrives or ``suspendTimeoutMillis``, at most ``longPollingMaxMs``).

The filter: the request's subscription when its sysFlag says it carries one (lite pull, Go), else
the subscription the group's heartbeats named for the topic (push consumers do not repeat it);
none known: SUBSCRIPTION_NOT_EXIST (the client retries after its heartbeat). TAG expressions filter
by tag, SQL92 ones by properties (``enablePropertyFilter``). The commit-offset flag notes the
consumer's offset, committed through the log behind the pull (``commit_offset_behind``).

The answer, as the clients interpret its code:

    service status     answer                   nextBeginOffset        the client then
    FOUND              SUCCESS "FOUND"          after the last one     consumes the body's messages
    NO_NEW_MSG         PULL_NOT_FOUND           the offset asked       pulls again from it
    NO_MATCHED_MSG     PULL_RETRY_IMMEDIATELY   past the filtered ones pulls again at once
    OFFSET_TOO_SMALL   PULL_OFFSET_MOVED        the queue's minimum    moves there (removed messages)
    (a reset pending)  PULL_OFFSET_MOVED        the reset's offset     moves there (``take_offset_reset``)
    OFFSET_OVERFLOW    PULL_OFFSET_MOVED        the queue's maximum    moves there — from the ready
                       (on a replica that may   the offset asked       leader only (it has applied all
                       lag: PULL_NOT_FOUND)                            that is committed); elsewhere the
                                                                       queue may just be behind

``suggestWhichBrokerId`` is always 0 (the leader): a client that had to pull from a follower
(no leader in its route) comes back to the leader. The body is the messages in the stored layout
(``messages.stored_layout``), at most ``PULL_ANSWER_BYTES_MAX`` of bodies (one message at least),
well under the clients' 16 MiB frame.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from broker.edge.rocketmq import messages
from broker.protocol.limits import PULL_COUNT_MAX, PULL_SUSPEND_MS_MAX
from broker.protocol.rocketmq import headers
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode
from broker.protocol.rocketmq.command import RemotingCommand
from broker.service.broker_service import PullAnswer
from broker.serving.remoting_server import Request

if TYPE_CHECKING:
    from broker.edge.rocketmq.host import EdgeHost

PULL_ANSWER_BYTES_MAX: Final = 4 << 20
EXPRESSION_TAG: Final = "TAG"
EXPRESSION_SQL92: Final = "SQL92"


def register(edge: EdgeHost) -> None:
    handler = Puller(edge)
    edge.route(RequestCode.PULL_MESSAGE, handler.pull)
    edge.route(RequestCode.LITE_PULL_MESSAGE, handler.pull)


class Puller:
    def __init__(self, edge: EdgeHost):
        self.edge = edge
        self.svc = edge.service

    async def pull(self, req: Request) -> RemotingCommand:
        h = req.header(headers.PullMessageRequestHeader)
        group, topic, qid = h.consumer_group, h.topic, h.queue_id
        if h.has_subscription:
            kind, expression = (h.expression_type or EXPRESSION_TAG), (h.subscription or "*")
        else:
            sub = self.svc.subscription_of(group, topic)
            if sub is None:
                return req.answer(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                                  f"the consumer's subscription not exist: group {group} has no member subscribed to "
                                  f"{topic} here (heartbeat first)")
            kind, expression = sub.expression_type, sub.expression
        self.svc.check_subscription(kind, expression)
        reset = self.svc.take_offset_reset(group, topic, qid)
        if reset is not None:  # an offset reset the client has not seen: it moves there (RocketMQ 5's way)
            lo, hi = self.svc.queue_bounds(topic, qid)
            return self._answer(req, ResponseCode.PULL_OFFSET_MOVED, "OFFSET_RESET", reset, lo, hi)
        if h.queue_offset < 0:
            lo, hi = self.svc.queue_bounds(topic, qid)
            return self._answer(req, ResponseCode.PULL_OFFSET_MOVED, "OFFSET_TOO_SMALL", lo, lo, hi)
        if h.commit_offset_flag and h.commit_offset >= 0 and self.edge.v1_writes_allowed(req.principal):
            self.svc.commit_offset_behind(group, topic, qid, h.commit_offset)
        max_bytes = min(h.max_msg_bytes or PULL_ANSWER_BYTES_MAX, PULL_ANSWER_BYTES_MAX)
        pulled = await self.svc.pull(
            topic, qid, h.queue_offset, group=group,
            max_count=min(max(h.max_msg_nums, 1), PULL_COUNT_MAX),
            max_bytes=max(max_bytes, 1),
            tags=expression if kind == EXPRESSION_TAG else None,
            sql=expression if kind == EXPRESSION_SQL92 else None,
            # (the service holds it at most longPollingMaxMs)
            suspend_ms=min(h.suspend_timeout_millis, PULL_SUSPEND_MS_MAX) if h.suspend else 0,
        )
        return self.answer(req, h.queue_offset, pulled)

    def answer(self, req: Request, asked: int, p: PullAnswer) -> RemotingCommand:
        if p.status == "FOUND":
            return self._answer(req, ResponseCode.SUCCESS, "FOUND", p.next_offset, p.min_offset, p.max_offset,
                                body=self.body(p))
        if p.status == "NO_MATCHED_MSG":
            return self._answer(req, ResponseCode.PULL_RETRY_IMMEDIATELY, "NO_MATCHED_MESSAGE", p.next_offset,
                                p.min_offset, p.max_offset)
        if p.status == "OFFSET_TOO_SMALL":
            return self._answer(req, ResponseCode.PULL_OFFSET_MOVED, "OFFSET_TOO_SMALL", p.next_offset, p.min_offset,
                                p.max_offset)
        if p.status == "OFFSET_OVERFLOW":
            if self.svc.leads():
                return self._answer(req, ResponseCode.PULL_OFFSET_MOVED, "OFFSET_OVERFLOW_BADLY", p.next_offset,
                                    p.min_offset, p.max_offset)
            return self._answer(req, ResponseCode.PULL_NOT_FOUND, "OFFSET_OVERFLOW_BADLY: this replica may be behind",
                                asked, p.min_offset, p.max_offset)
        remark = "NO_MESSAGE_IN_QUEUE" if p.max_offset == 0 else "OFFSET_OVERFLOW_ONE"
        return self._answer(req, ResponseCode.PULL_NOT_FOUND, remark, p.next_offset, p.min_offset, p.max_offset)

    def body(self, p: PullAnswer) -> bytes:
        edge = self.edge
        parts: list[bytes] = []
        for pm in p.messages:
            parts += messages.stored_layout(pm.message, queue_offset=pm.queue_offset or 0, position=pm.position,
                                            store_host=edge.store_host, broker_name=edge.broker_name,
                                            hosts=edge.hosts)
        return b"".join(parts)

    @staticmethod
    def _answer(req: Request, code: int, remark: str, next_offset: int, lo: int, hi: int,
                body: bytes = b"") -> RemotingCommand:
        header = headers.PullMessageResponseHeader(suggest_which_broker_id=0, next_begin_offset=next_offset,
                                                   min_offset=lo, max_offset=hi)
        return req.answer(code, remark, ext_fields=headers.to_ext(header), body=body)
