"""Transactional messages for the official clients, on our half messages (broker/store/transactions.py):

    SEND_MESSAGE(_V2) with TRAN_MSG=true     a half (send.py -> ``service.send_half``): answered with
                                             the half's offset msg id and its offset in the half queue
    END_TRANSACTION (37), producer -> broker commitOrRollback 8 commit, 12 rollback, 0 unknown, for the
      (Java: oneway; Go: a request)          half at commitLogOffset -> ``service.end_transaction_at``
                                             (PUB on the half's real topic; the producer group must be
                                             the half's; transactionId, when given, its UNIQ_KEY; 5.x's
                                             topic, when it is not the half topic a check-back names,
                                             the half's real topic)
    CHECK_TRANSACTION_STATE (39), broker ->  the leader's check-back of a half left unresolved past its
      a producer of the half's group,        immunity (transactionTimeOut, CHECK_IMMUNITY_TIME_IN_SECONDS),
      oneway                                 every transactionCheckInterval, at most transactionCheckMax
                                             times (counted through the Raft log); body = the half in the
                                             stored layout, in its real topic and queue; the producer
                                             answers with END_TRANSACTION fromTransactionCheck=true

The check service (``TransactionService``, on the ready leader) queues a round's check requests per
producer group; ``service.watch_transaction_checks`` tells this module, which takes the group's
requests (``take_transaction_checks``) and pushes each to one connected producer of the group
(round robin over the producers whose HEART_BEAT named the group, bound on this replica) that may
publish to the half's topic (ACL: a check-back carries the half's body). Requests no connected
producer may take stay queued for our SDK's long poll (``/v1/transaction/checks``) and are queued
again by the next round; a push that cannot be written within ``PUSH_TIMEOUT_S`` is dropped (the
next round checks the half again). A new leader checks back every pending half at once (its
scheduler restarts with its term), so a leader kill between a half and its end loses nothing: the
producer's next heartbeat binds it on the new leader, whose next round reaches it.

Ownership: the event loop; one push task per producer group at a time (``_pushing``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

from broker.edge.rocketmq import messages
from broker.edge.rocketmq.channels import Channel
from broker.protocol.auth import AuthError
from broker.protocol.properties import HALF_TOPIC
from broker.protocol.rocketmq import headers
from broker.protocol.rocketmq import properties as rp
from broker.protocol.rocketmq.codes import RequestCode, ResponseCode
from broker.protocol.rocketmq.command import RemotingCommand
from broker.service.broker_service import HalfCheck
from broker.serving.acl import Perm, check
from broker.serving.remoting_server import CommandError, Request
from broker.serving.security import Principal

if TYPE_CHECKING:
    from broker.edge.rocketmq.host import EdgeHost

STATE_OF: Final = {
    rp.TRANSACTION_COMMIT_TYPE: "COMMIT_MESSAGE",
    rp.TRANSACTION_ROLLBACK_TYPE: "ROLLBACK_MESSAGE",
    rp.TRANSACTION_NOT_TYPE: "UNKNOW",
}
PUSH_BATCH: Final = 64  # check requests taken per step of a push
PUSH_TIMEOUT_S: Final = 5.0  # writing one check to a producer's connection


def register(edge: EdgeHost) -> None:
    h = Transactions(edge)
    edge.route(RequestCode.END_TRANSACTION, h.end, writes=True)
    edge.service.watch_transaction_checks(h.checks_queued)


def may_publish(principal: Principal, topic: str) -> bool:
    """Whether ``principal`` may publish to ``topic`` (ACL off: everyone)."""
    if principal.everything:
        return True
    if principal.account is None:
        return False
    try:
        check(principal.account, topics={topic: Perm.PUB})
    except AuthError:
        return False
    return True


class Transactions:
    def __init__(self, edge: EdgeHost):
        self.edge = edge
        self.svc = edge.service
        self._pushing: set[str] = set()
        self._turn = 0
        self.checks_pushed = 0
        self.checks_dropped = 0

    # -- END_TRANSACTION ------------------------------------------------------------------------------
    async def end(self, req: Request) -> RemotingCommand:
        h = req.header(headers.EndTransactionRequestHeader)
        state = STATE_OF.get(h.commit_or_rollback)
        if state is None:
            raise CommandError(ResponseCode.SYSTEM_ERROR, f"BAD_FIELD: commitOrRollback {h.commit_or_rollback} is "
                               f"none of {rp.TRANSACTION_NOT_TYPE}, {rp.TRANSACTION_COMMIT_TYPE}, "
                               f"{rp.TRANSACTION_ROLLBACK_TYPE}")

        def may_end(topic: str) -> None:
            req.require(topics={topic: Perm.PUB})

        # 5.x names the real topic when it ends a transaction, and echoes the check's topic (the half
        # topic) when it answers a check-back: that one names no topic to match.
        topic = h.topic if h.topic and h.topic != HALF_TOPIC else None
        await self.svc.end_transaction_at(
            h.producer_group, h.commit_log_offset, state, topic=topic,
            transaction_id=h.transaction_id or None, from_check=bool(h.from_transaction_check), may_end=may_end,
        )
        return req.ok()

    # -- CHECK_TRANSACTION_STATE ----------------------------------------------------------------------
    def checks_queued(self, group: str) -> None:
        """The check service queued requests for ``group``: push them to its producers here (if any)."""
        if group in self._pushing or not self.edge.channels.producers(group):
            return
        self._pushing.add(group)
        if not self.edge.spawn(self._push(group)):  # too many tasks: the next round tries again
            self._pushing.discard(group)

    async def _push(self, group: str) -> None:
        try:
            while True:
                producers = self.edge.channels.producers(group)
                if not producers:
                    return

                def wanted(topic: str, producers: list[Channel] = producers) -> bool:
                    return any(may_publish(c.principal, topic) for c in producers)

                checks = self.svc.take_transaction_checks(group, max_count=PUSH_BATCH, wanted=wanted)
                if not checks:
                    return
                for chk in checks:
                    await self._push_one(producers, chk)
        finally:
            self._pushing.discard(group)

    async def _push_one(self, producers: list[Channel], chk: HalfCheck) -> None:
        eligible = [c for c in producers if not c.connection.closed and may_publish(c.principal, chk.message.topic)]
        if not eligible:
            self.checks_dropped += 1
            return
        self._turn += 1
        channel = eligible[self._turn % len(eligible)]
        edge = self.edge
        uid = chk.message.unique_id
        header = headers.CheckTransactionStateRequestHeader(
            topic=HALF_TOPIC, tran_state_table_offset=chk.half_queue_offset, commit_log_offset=chk.position,
            msg_id=uid, transaction_id=uid, offset_msg_id=messages.offset_msg_id(edge.store_host, chk.position),
        )
        body = b"".join(messages.stored_layout(
            chk.message, queue_offset=max(chk.half_queue_offset, 0), position=chk.position,
            store_host=edge.store_host, broker_name=edge.broker_name, hosts=edge.hosts))
        ext = {**headers.to_ext(header), "bname": edge.broker_name}
        try:
            async with asyncio.timeout(PUSH_TIMEOUT_S):
                await channel.connection.invoke_oneway(RequestCode.CHECK_TRANSACTION_STATE, ext, body)
        except (TimeoutError, ConnectionError, OSError):
            self.checks_dropped += 1
            return
        self.checks_pushed += 1

    def status(self) -> dict[str, int]:
        return {"checks_pushed": self.checks_pushed, "checks_dropped": self.checks_dropped}
