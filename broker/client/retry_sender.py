"""Send-back (clustering push consumers): a message whose listener call failed goes back to its
broker group, which stores a copy in ``%RETRY%<group>`` (or ``%DLQ%<group>`` after
``max_reconsume_times``; broker/store/retry.py). ``RetrySender`` remembers which broker groups took one:
those have the retry topic now, and the consumer's rebalance waits until the retry topic's route
names them all.
"""

from __future__ import annotations

import logging
from typing import Any

from broker.client.message import MessageExt, MessageQueue
from broker.client.route_cache import RouteCache, call_leader, subscribe_queues
from broker.client.transport import ClientError, Transport
from broker.protocol.properties import retry_topic

log = logging.getLogger(__name__)


class RetrySender:
    def __init__(
        self,
        transport: Transport,
        routes: RouteCache,
        group: str,
        *,
        max_reconsume_times: int | None,
        timeout_s: float,
    ):
        self.transport = transport
        self.routes = routes
        self.group = group
        self.max_reconsume_times = max_reconsume_times
        self.timeout_s = timeout_s
        self.brokers: set[str] = set()  # broker groups that took a send-back (have %RETRY%<group>)

    async def send(self, mq: MessageQueue, msgs: list[MessageExt], *, dlq: bool = False) -> list[MessageExt]:
        """Send failed messages back to their broker group; returns those the broker did not take."""
        failed = []
        for m in msgs:
            body: dict[str, Any] = {"group": self.group, "msg_id": m.msg_id, "dlq": dlq}
            if self.max_reconsume_times is not None:
                body["max_reconsume_times"] = self.max_reconsume_times
            try:
                answer = await call_leader(
                    self.transport, self.routes, mq.topic, mq.broker_name, "/v1/consumer/sendback", body,
                    timeout_s=self.timeout_s,
                )
            except ClientError as exc:
                log.warning("%s: send-back of %s failed (consumed again here): %s", mq, m.msg_id, exc)
                failed.append(m)
                continue
            if answer.get("dlq"):
                log.warning("%s: %s went to the dead-letter queue %s after %s re-consumptions",
                            mq, m.msg_id, answer.get("topic"), answer.get("reconsume_times"))
            else:
                self.brokers.add(mq.broker_name)
        return failed

    async def route_current(self) -> bool:
        """The retry topic's route names every broker group this consumer sent messages back to
        (refreshed when not: those groups created it since); False while one is still missing."""
        if not self.brokers:
            return True
        topic = retry_topic(self.group)
        cached = self.routes.cached(topic)
        if cached is not None and self.brokers <= {mq.broker_name for mq in subscribe_queues(cached)}:
            return True
        route = await self.routes.refresh(topic)
        return self.brokers <= {mq.broker_name for mq in subscribe_queues(route)}
