"""Messages by key, by unique key and by offset msg id, answered in the stored layout:

    QUERY_MESSAGE (12)       topic, key, maxNum, begin/endTimestamp; ext ``_UNIQUE_KEY_QUERY=true``: the
                             key is a UNIQ_KEY (the client's message id: viewMessage(topic, msgId),
                             mqadmin queryMsgByUniqueKey) -> ``service.messages_by_key`` (the key index,
                             broker/store/key_index.py; a message's keys and its unique id are indexed with its
                             topic). Body = the messages found, newest first, at most maxNum (capped at
                             ``QUERY_MESSAGES_MAX``) and ``ANSWER_BYTES_MAX`` bytes (one at least); header
                             indexLastUpdateTimestamp / indexLastUpdatePhyoffset = the newest entry of
                             the index. None: QUERY_NOT_FOUND "can not find message, maybe time range
                             not correct" (RocketMQ's words). SUB on the topic (``needs_of``).
    VIEW_MESSAGE_BY_ID (33)  offset = the commit-log offset of an offset msg id (``messages.offset_msg_id``:
                             store host + log position; the client sends it to the store host, any
                             replica answers: they hold the same log) -> ``service.message_at``; SUB on
                             the message's topic (checked once it is read, as the HTTP API does).
                             Nothing there: SYSTEM_ERROR "MESSAGE_NOT_FOUND: ..." (RocketMQ answers
                             SYSTEM_ERROR too).

Any replica with the replicated state answers both (``require_state``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from broker.edge.rocketmq import messages
from broker.protocol.limits import QUERY_MESSAGES_MAX
from broker.protocol.rocketmq import headers
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode
from broker.protocol.rocketmq.command import RemotingCommand
from broker.service.broker_service import PulledMessage
from broker.serving.acl import Perm
from broker.serving.remoting_server import Request
from broker.store.message import check_keys, check_topic, check_unique_id

if TYPE_CHECKING:
    from broker.edge.rocketmq.host import EdgeHost

ANSWER_BYTES_MAX: Final = 4 << 20  # well under the clients' 16 MiB frame
NOT_FOUND_REMARK: Final = "can not find message, maybe time range not correct"


def register(edge: EdgeHost) -> None:
    h = Queries(edge)
    edge.route(RequestCode.QUERY_MESSAGE, h.query)
    edge.route(RequestCode.VIEW_MESSAGE_BY_ID, h.view)


class Queries:
    def __init__(self, edge: EdgeHost):
        self.edge = edge
        self.svc = edge.service

    def layout(self, pm: PulledMessage) -> list[bytes]:
        edge = self.edge
        return messages.stored_layout(pm.message, queue_offset=pm.queue_offset or 0, position=pm.position,
                                      store_host=edge.store_host, broker_name=edge.broker_name, hosts=edge.hosts)

    async def query(self, req: Request) -> RemotingCommand:
        h = req.header(headers.QueryMessageRequestHeader)
        self.svc.require_state()
        topic = check_topic(h.topic)
        if h.unique_key_query:
            key = check_unique_id(h.key)
        else:
            (key,) = check_keys([h.key])
        found = self.svc.messages_by_key(
            topic, key, max_n=min(max(h.max_num, 1), QUERY_MESSAGES_MAX), begin_ts=max(h.begin_timestamp, 0),
            end_ts=max(h.end_timestamp, 0), unique=bool(h.unique_key_query),
        )
        if not found:
            return req.answer(ResponseCode.QUERY_NOT_FOUND, NOT_FOUND_REMARK)
        parts: list[bytes] = []
        size = 0
        for pm in found:
            piece = self.layout(pm)
            piece_bytes = sum(len(p) for p in piece)
            if parts and size + piece_bytes > ANSWER_BYTES_MAX:
                break
            parts += piece
            size += piece_bytes
        ts, position = self.svc.key_index_last_update()
        header = headers.QueryMessageResponseHeader(index_last_update_timestamp=ts,
                                                    index_last_update_phyoffset=position)
        return req.ok(ext_fields=headers.to_ext(header), body=b"".join(parts))

    async def view(self, req: Request) -> RemotingCommand:
        h = req.header(headers.ViewMessageRequestHeader)
        self.svc.require_state()
        pm = self.svc.message_at(h.offset)
        req.require(topics={pm.message.topic: Perm.SUB})
        return req.ok(body=b"".join(self.layout(pm)))
