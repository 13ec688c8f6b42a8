"""Consumer retries and dead-letter queues (RocketMQ's consumerSendMsgBack).

A clustering consumer whose listener answers RECONSUME_LATER (or raises) sends the message back to
the broker group that holds it (``POST /v1/consumer/sendback``). The broker reads the message and
stores a copy:

- in ``%RETRY%<group>`` (created on demand: 1 queue, perm 6) with delay level
  ``3 + reconsumeTimes`` (broker/store/schedule.py delivers it when due); the group's consumers subscribe
  their retry topic by themselves;
- in ``%DLQ%<group>`` (created on demand: 1 queue, perm 2 = write only, like RocketMQ, until an
  operator changes it) once the message was already re-consumed ``maxReconsumeTimes`` times (the
  group's ``retry_max_times``, default 16, or what the consumer sends), or when the consumer asks
  for it (orderly consumers, after retrying in place).

Every copy keeps the body, tags, keys, properties and unique id, and carries ``RETRY_TOPIC`` (the
original topic), ``ORIGIN_MESSAGE_ID`` (the first msg id), ``RECONSUME_TIME`` (re-consumptions so
far, the consumer's ``reconsume_times``) and, in the DLQ, ``DLQ_ORIGIN_GROUP``. Once the copy is
committed the consumer counts the original as consumed (its offset moves past it).
"""

from __future__ import annotations

import dataclasses
from typing import Final

from broker.protocol.properties import (
    PROP_DELAY,
    PROP_DLQ_ORIGIN_GROUP,
    PROP_ORIGIN_MESSAGE_ID,
    PROP_RECONSUME_TIME,
    PROP_RETRY_TOPIC,
    RESERVED_PROPS,
    SCHEDULE_PROPS,
    dlq_topic,
    reconsume_times,
    retry_topic,
)
from broker.store.message import StoredMessage
from broker.store.metadata import PERM_READ, PERM_WRITE

DEFAULT_MAX_RECONSUME_TIMES: Final = 16
RETRY_QUEUE_NUMS: Final = 1
RETRY_PERM: Final = PERM_READ | PERM_WRITE
DLQ_PERM: Final = PERM_WRITE  # write only: nobody consumes it until an operator allows it
FIRST_RETRY_LEVEL: Final = 3



@dataclasses.dataclass(frozen=True)
class SendBack:
    topic: str  # %RETRY%group or %DLQ%group
    dlq: bool
    message: StoredMessage  # to append (a retry still carries DELAY: the schedule rewrites it)
    reconsume_times: int


def send_back(
    m: StoredMessage,
    msg_id: str,
    *,
    group: str,
    max_reconsume_times: int,
    to_dlq: bool,
    store_ts: int,
    levels: int,
) -> SendBack:
    """The copy of ``m`` (``msg_id``) that goes back for ``group``."""
    before = reconsume_times(m.properties)
    props = {k: v for k, v in m.properties.items() if k not in SCHEDULE_PROPS and k not in RESERVED_PROPS}
    props[PROP_RETRY_TOPIC] = m.properties.get(PROP_RETRY_TOPIC) or m.topic
    props[PROP_ORIGIN_MESSAGE_ID] = m.properties.get(PROP_ORIGIN_MESSAGE_ID) or msg_id
    dlq = to_dlq or before >= max_reconsume_times
    if dlq:
        topic = dlq_topic(group)
        props[PROP_RECONSUME_TIME] = str(before)
        props[PROP_DLQ_ORIGIN_GROUP] = group
    else:
        topic = retry_topic(group)
        props[PROP_RECONSUME_TIME] = str(before + 1)
        props[PROP_DELAY] = str(min(FIRST_RETRY_LEVEL + before, levels))
    copy = m._replace(topic=topic, queue_id=0, properties=props, store_ts=store_ts)
    return SendBack(topic, dlq, copy, int(props[PROP_RECONSUME_TIME]))


def resend_from_dlq(m: StoredMessage, group: str, store_ts: int) -> StoredMessage:
    """An operator's resend of a DLQ message: back to the group's retry topic, due at once, its
    re-consumption count started again."""
    props = {k: v for k, v in m.properties.items() if k not in SCHEDULE_PROPS and k not in RESERVED_PROPS}
    props.pop(PROP_DLQ_ORIGIN_GROUP, None)
    props[PROP_RECONSUME_TIME] = "0"
    return m._replace(topic=retry_topic(group), queue_id=0, properties=props, store_ts=store_ts)
