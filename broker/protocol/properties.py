"""Message properties and topic names with a meaning to the broker (RocketMQ's names): what the
SDK sets and reads, what the broker's schedule (broker/store/schedule.py) and retry paths
(broker/store/retry.py) act on. One definition for both sides."""

from __future__ import annotations

from typing import Final

# -- delayed and timed delivery (broker/store/schedule.py) ----------------------------------------------
SCHEDULE_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"
PROP_DELAY: Final = "DELAY"  # delay level 1..N (messageDelayLevel)
PROP_START_DELIVER: Final = "__STARTDELIVERTIME"  # deliver time, ms since the epoch (RocketMQ 4 timers)
PROP_TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"  # deliver time, ms since the epoch (RocketMQ 5)
PROP_TIMER_DELAY_MS: Final = "TIMER_DELAY_MS"
PROP_TIMER_DELAY_SEC: Final = "TIMER_DELAY_SEC"
PROP_REAL_TOPIC: Final = "REAL_TOPIC"  # on a schedule record: where it goes when due
PROP_REAL_QID: Final = "REAL_QID"
PROP_DUE_MS: Final = "__DUE_MS"
PROP_SCHED_POS: Final = "__SCHED_POS"  # on a delivered copy: the schedule record it delivers
PROP_LEVEL: Final = "__DELAY_LEVEL"
SCHEDULE_PROPS: Final = (PROP_DELAY, PROP_START_DELIVER, PROP_TIMER_DELIVER_MS, PROP_TIMER_DELAY_MS,
                         PROP_TIMER_DELAY_SEC)
# -- transactional messages (broker/store/transactions.py) ---------------------------------------------------
HALF_TOPIC: Final = "RMQ_SYS_TRANS_HALF_TOPIC"  # half (prepared) messages, invisible to consumers
OP_HALF_TOPIC: Final = "RMQ_SYS_TRANS_OP_HALF_TOPIC"  # RocketMQ's resolutions; here commands in the log
PROP_TRAN_MSG: Final = "TRAN_MSG"  # "true" on a half and on its committed message
PROP_PGROUP: Final = "PGROUP"  # the producer group that checks a half back
PROP_CHECK_IMMUNITY: Final = "CHECK_IMMUNITY_TIME_IN_SECONDS"  # first check-back after this (per message)
PROP_CHECK_TIMES: Final = "TRANSACTION_CHECK_TIMES"  # shown to the listener on a check-back
PROP_HALF_POS: Final = "__TXN_HALF_POS"  # on a committed message: the half it commits

RESERVED_PROPS: Final = (PROP_REAL_TOPIC, PROP_REAL_QID, PROP_DUE_MS, PROP_SCHED_POS, PROP_LEVEL, PROP_HALF_POS)
BROKER_TOPICS: Final = (SCHEDULE_TOPIC, HALF_TOPIC, OP_HALF_TOPIC)  # nobody sends to or pulls these

# -- consumer retries and dead-letter queues (broker/store/retry.py) --------------------------------------
RETRY_PREFIX: Final = "%RETRY%"
DLQ_PREFIX: Final = "%DLQ%"
PROP_RETRY_TOPIC: Final = "RETRY_TOPIC"  # on a retry or DLQ copy: the original topic
PROP_ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
PROP_RECONSUME_TIME: Final = "RECONSUME_TIME"  # re-consumptions so far
PROP_DLQ_ORIGIN_GROUP: Final = "DLQ_ORIGIN_GROUP"


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def reconsume_times(props: dict[str, str]) -> int:
    """RECONSUME_TIME of a message (0 for a first delivery or a bad value)."""
    try:
        return max(0, int(props.get(PROP_RECONSUME_TIME, "0")))
    except (TypeError, ValueError):
        return 0
