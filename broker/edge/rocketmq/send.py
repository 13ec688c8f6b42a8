"""SEND_MESSAGE (long header names: the Go client), SEND_MESSAGE_V2 (one-letter names: the Java
clients) and SEND_BATCH_MESSAGE, answered by ``BrokerService.send`` (a transaction's half message,
``TRAN_MSG=true``: ``send_half``).

    header + body ──▶ messages (messages.message_in) ──▶ service.send ──▶ SUCCESS: msgId (offset msg
    ids, comma-separated for a batch), queueId, queueOffset (the first message's), transactionId
    (the message's UNIQ_KEY; a 5.x batch's own), MSG_REGION, TRACE_ON

An acknowledged send is on a majority (the service answers once the records are committed). A send
to an unknown topic creates it when ``autoCreateTopicEnable`` (clients route such a topic by
RocketMQ's default topic TBW102, which the broker registers then). Errors: ``errors.py``; a send
whose outcome is unknown (no commit within the send timeout: the leader lost its quorum, or its
leadership) answers FLUSH_SLAVE_TIMEOUT with the header the client needs to read it as a
``SendStatus``; the application may send the same message again, which the de-duplication window
stores once. Oneway sends are handled the same and answered by nobody.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from broker.edge.rocketmq import messages
from broker.edge.rocketmq.errors import SEND_TIMEOUT, command_error
from broker.protocol.errors import ProtocolError
from broker.protocol.limits import BATCH_MESSAGES_MAX
from broker.protocol.rocketmq import headers
from broker.protocol.rocketmq import properties as rp
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode
from broker.protocol.rocketmq.command import RemotingCommand
from broker.protocol.rocketmq.errors import RemotingError
from broker.protocol.rocketmq.message import decode_batch
from broker.service.broker_service import SendAnswer
from broker.serving.remoting_server import CommandError, Request

if TYPE_CHECKING:
    from broker.edge.rocketmq.host import EdgeHost

MSG_REGION: Final = "DefaultRegion"
SEND_CODES: Final = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)


def register(edge: EdgeHost) -> None:
    handler = Sender(edge)
    for code in SEND_CODES:
        edge.route(code, handler.send, writes=True)


class Sender:
    def __init__(self, edge: EdgeHost):
        self.edge = edge
        self.svc = edge.service

    async def send(self, req: Request) -> RemotingCommand:
        cmd = req.cmd
        h = headers.parse_send_header(cmd.code, cmd.ext_fields)
        born_host = self.edge.peer_addr(req)
        batch = cmd.code == RequestCode.SEND_BATCH_MESSAGE
        try:
            props = rp.decode_properties(h.properties or "")
            if batch:
                items = decode_batch(cmd.body, messages_max=BATCH_MESSAGES_MAX)
                msgs = [messages.message_in(i.body, i.flag, h.sys_flag, i.properties, h.born_timestamp, born_host)
                        for i in items]
            else:
                msgs = [messages.message_in(cmd.body, h.flag, h.sys_flag, props, h.born_timestamp, born_host)]
        except RemotingError as exc:
            raise CommandError(ResponseCode.MESSAGE_ILLEGAL, f"{exc.code}: {exc.message}") from None
        try:
            if not batch and messages.is_half(h.sys_flag, props):
                sent = await self.svc.send_half(h.topic, h.queue_id, msgs, producer_group=h.producer_group,
                                                client_addr=born_host)
            else:
                sent = await self.svc.send(h.topic, h.queue_id, msgs, producer_group=h.producer_group,
                                           client_addr=born_host)
        except ProtocolError as exc:
            if exc.code == SEND_TIMEOUT:
                return self.unknown_outcome(req, h.queue_id, exc)
            raise command_error(exc, send=True) from None
        return req.ok(ext_fields=self.answer_ext(sent, msgs, props if batch else None))

    def answer_ext(self, sent: SendAnswer, msgs: list[dict[str, Any]], batch_props: dict[str, str] | None
                   ) -> dict[str, str]:
        store_host = self.edge.store_host
        first = sent.results[0]
        if batch_props is None:
            txn_id: str | None = first.unique_id
        else:
            txn_id = batch_props.get(rp.UNIQ_KEY)  # 5.x names the batch; 4.9.x and Go do not
        return answer_ext(
            ",".join(messages.offset_msg_id(store_host, r.position) for r in sent.results),
            first.queue_id if first.queue_id >= 0 else sent.queue_id,
            first.queue_offset if first.queue_offset is not None else -1,
            txn_id,
        )

    def unknown_outcome(self, req: Request, queue_id: int, exc: ProtocolError) -> RemotingCommand:
        """FLUSH_SLAVE_TIMEOUT: the client reads it as a send result (``SendStatus``), whose header
        must be there; no message id or offset is known."""
        return req.answer(ResponseCode.FLUSH_SLAVE_TIMEOUT, f"{exc.code}: {exc.message}",
                          ext_fields=answer_ext("", queue_id, -1, None))


def answer_ext(msg_id: str, queue_id: int, queue_offset: int, transaction_id: str | None) -> dict[str, str]:
    """A send answer's ext fields: ``headers.SendMessageResponseHeader`` as ``headers.to_ext`` writes
    it (no batchUniqId), then MSG_REGION and TRACE_ON — written out, one map per answer (a test pins
    it to the header class)."""
    ext = {"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(queue_offset)}
    if transaction_id is not None:
        ext["transactionId"] = transaction_id
    ext[rp.MSG_REGION] = MSG_REGION
    ext[rp.TRACE_ON] = "true"
    return ext
