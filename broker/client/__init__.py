"""The client SDK of the DLedger-mode broker: producer, push and pull consumers (asyncio first, with
blocking wrappers in ``broker.client.sync``), talking to brokers over the v1 HTTP API
(docs/API.md) and to NameServers for routes (docs/NAMESRV.md).

    from broker.client import Message, Producer, PushConsumer

    async with Producer("pg", "127.0.0.1:9876") as producer:
        result = await producer.send(Message("TopicTest", b"hello", tags="TagA"))

Names are imported on first use (PEP 562): ``from broker.client.admin import Admin`` (mqadmin) or
``from broker.client import Message`` loads only what it needs, not the whole SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.client.allocate import AllocateStrategy, allocate_averagely, allocate_averagely_by_circle
    from broker.client.consumer_common import ConsumeContext, ConsumerStats, QueueStats
    from broker.client.latency import FaultStrategy, LatencyFaultTolerance, not_available_ms
    from broker.client.message import (
        ConsumeFrom,
        ConsumeStatus,
        Message,
        MessageExt,
        MessageModel,
        MessageQueue,
        PullResult,
        PullStatus,
        SendItem,
        SendResult,
        SendStatus,
        UniqueIdGenerator,
        new_unique_id,
        unique_id_info,
    )
    from broker.client.message_selector import MessageSelector
    from broker.client.offset_store import (
        LocalFileOffsetStore,
        MemoryOffsetStore,
        OffsetStore,
        RemoteOffsetStore,
    )
    from broker.client.producer import Producer
    from broker.client.pull_consumer import PullConsumer
    from broker.client.push_consumer import PushConsumer
    from broker.client.selector import HashKeySelector, QueueSelector, RandomSelector, RoundRobinSelector
    from broker.client.sync import SyncProducer, SyncPullConsumer, SyncPushConsumer
    from broker.client.transaction import (
        LocalTransactionState,
        TransactionListener,
        TransactionProducer,
        TransactionSendResult,
    )
    from broker.client.transport import ClientError

# name -> the module that defines it (imported at the first access of the name)
_WHERE = {
    "AllocateStrategy": "broker.client.allocate",
    "ClientError": "broker.client.transport",
    "ConsumeContext": "broker.client.consumer_common",
    "ConsumeFrom": "broker.client.message",
    "ConsumeStatus": "broker.client.message",
    "ConsumerStats": "broker.client.consumer_common",
    "FaultStrategy": "broker.client.latency",
    "HashKeySelector": "broker.client.selector",
    "LatencyFaultTolerance": "broker.client.latency",
    "LocalFileOffsetStore": "broker.client.offset_store",
    "LocalTransactionState": "broker.client.transaction",
    "MemoryOffsetStore": "broker.client.offset_store",
    "Message": "broker.client.message",
    "MessageExt": "broker.client.message",
    "MessageModel": "broker.client.message",
    "MessageQueue": "broker.client.message",
    "MessageSelector": "broker.client.message_selector",
    "OffsetStore": "broker.client.offset_store",
    "Producer": "broker.client.producer",
    "PullConsumer": "broker.client.pull_consumer",
    "PullResult": "broker.client.message",
    "PullStatus": "broker.client.message",
    "PushConsumer": "broker.client.push_consumer",
    "QueueSelector": "broker.client.selector",
    "QueueStats": "broker.client.consumer_common",
    "RandomSelector": "broker.client.selector",
    "RemoteOffsetStore": "broker.client.offset_store",
    "RoundRobinSelector": "broker.client.selector",
    "SendItem": "broker.client.message",
    "SendResult": "broker.client.message",
    "SendStatus": "broker.client.message",
    "SyncProducer": "broker.client.sync",
    "SyncPullConsumer": "broker.client.sync",
    "SyncPushConsumer": "broker.client.sync",
    "TransactionListener": "broker.client.transaction",
    "TransactionProducer": "broker.client.transaction",
    "TransactionSendResult": "broker.client.transaction",
    "UniqueIdGenerator": "broker.client.message",
    "allocate_averagely": "broker.client.allocate",
    "allocate_averagely_by_circle": "broker.client.allocate",
    "new_unique_id": "broker.client.message",
    "not_available_ms": "broker.client.latency",
    "unique_id_info": "broker.client.message",
}


def __getattr__(name: str) -> Any:
    if name in ("CONSUME_SUCCESS", "RECONSUME_LATER"):
        value: Any = getattr(__getattr__("ConsumeStatus"), name)
    elif name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "CONSUME_SUCCESS",
    "RECONSUME_LATER",
    "AllocateStrategy",
    "ClientError",
    "ConsumeContext",
    "ConsumeFrom",
    "ConsumeStatus",
    "ConsumerStats",
    "FaultStrategy",
    "HashKeySelector",
    "LatencyFaultTolerance",
    "LocalFileOffsetStore",
    "LocalTransactionState",
    "MemoryOffsetStore",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "MessageSelector",
    "OffsetStore",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "QueueSelector",
    "QueueStats",
    "RandomSelector",
    "RemoteOffsetStore",
    "RoundRobinSelector",
    "SendItem",
    "SendResult",
    "SendStatus",
    "SyncProducer",
    "SyncPullConsumer",
    "SyncPushConsumer",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "UniqueIdGenerator",
    "allocate_averagely",
    "allocate_averagely_by_circle",
    "new_unique_id",
    "not_available_ms",
    "unique_id_info",
]
