"""The client SDK of the DLedger-mode broker: producer, push and pull consumers (asyncio first, with
blocking wrappers in ``broker.client.sync``), talking to brokers over the v1 HTTP API
(docs/API.md) and to NameServers for routes (docs/NAMESRV.md).

    from broker.client import Message, Producer, PushConsumer

    async with Producer("pg", "127.0.0.1:9876") as producer:
        result = await producer.send(Message("TopicTest", b"hello", tags="TagA"))
"""

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
from broker.client.offset_store import LocalFileOffsetStore, MemoryOffsetStore, OffsetStore, RemoteOffsetStore
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

CONSUME_SUCCESS = ConsumeStatus.CONSUME_SUCCESS
RECONSUME_LATER = ConsumeStatus.RECONSUME_LATER

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
