"""The RocketMQ clients connected to this replica: which connection each client id heartbeats on,
its language and version, and the producer and consumer groups it named (RocketMQ's broker keeps
the same in its ProducerManager / ConsumerManager channel tables).

What the edge needs it for: the broker's own requests to a client (NOTIFY_CONSUMER_IDS_CHANGED to a
consumer group's members; CHECK_TRANSACTION_STATE to a producer of a group; GET_CONSUMER_RUNNING_INFO
and the connection lists of mqadmin), and removing a client from its groups when its connection
closes. Membership itself (groups, subscriptions, expiry) is the service's (``broker.service.consumers``).

Bounded: a client id is bound to one connection at a time (its latest heartbeat's), at most
``CLIENTS_PER_CONNECTION_MAX`` client ids per connection (one process runs a few client instances)
and ``CLIENTS_MAX`` in all; entries go when their connection closes. Owned by the event loop.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from broker.protocol.errors import ProtocolError
from broker.protocol.rocketmq.bodies import ConsumerData
from broker.serving.remoting_server import RemotingConnection
from broker.serving.security import ALL, Principal

CLIENTS_MAX: Final = 10_000
CLIENTS_PER_CONNECTION_MAX: Final = 64


class TooManyClients(ProtocolError):
    """A heartbeat refused: this connection, or the broker, holds too many client ids (SYSTEM_BUSY)."""

    def __init__(self, message: str):
        super().__init__("TOO_MANY_CLIENTS", message, 429)


@dataclasses.dataclass(slots=True)
class Channel:
    client_id: str
    connection: RemotingConnection
    language: int
    version: int
    owner: str  # the account that heartbeated it ("*" with ACL off)
    client_addr: str
    producer_groups: frozenset[str] = frozenset()
    consumer_groups: frozenset[str] = frozenset()
    principal: Principal = ALL  # who heartbeated it (a check-back goes only where it may publish)
    consumer_data: tuple[ConsumerData, ...] = ()  # its latest heartbeat's (mqadmin consumerConnection)


class ClientChannels:
    def __init__(self) -> None:
        self._by_client: dict[str, Channel] = {}
        self._by_connection: dict[RemotingConnection, set[str]] = {}

    def __len__(self) -> int:
        return len(self._by_client)

    def bind(self, channel: Channel) -> None:
        """The client's latest heartbeat came on ``channel.connection`` (``TooManyClients`` when the
        connection or the table is full with other client ids)."""
        current = self._by_client.get(channel.client_id)
        conn = channel.connection
        ids = self._by_connection.get(conn)
        if current is None or current.connection is not conn:
            if ids is not None and len(ids) >= CLIENTS_PER_CONNECTION_MAX:
                raise TooManyClients(f"at most {CLIENTS_PER_CONNECTION_MAX} client ids heartbeat on one connection")
            if current is None and len(self._by_client) >= CLIENTS_MAX:
                raise TooManyClients(f"the broker tracks {CLIENTS_MAX} clients")
        if current is not None and current.connection is not conn:
            self._unlink(current)
        self._by_client[channel.client_id] = channel
        self._by_connection.setdefault(conn, set()).add(channel.client_id)

    def get(self, client_id: str) -> Channel | None:
        return self._by_client.get(client_id)

    def forget_producer(self, client_id: str, group: str) -> None:
        channel = self._by_client.get(client_id)
        if channel is not None:
            channel.producer_groups = channel.producer_groups - {group}
            if not channel.producer_groups and not channel.consumer_groups:
                self.unbind(client_id)

    def forget_consumer(self, client_id: str, group: str | None) -> None:
        channel = self._by_client.get(client_id)
        if channel is not None:
            channel.consumer_groups = frozenset() if group is None else channel.consumer_groups - {group}
            if not channel.producer_groups and not channel.consumer_groups:
                self.unbind(client_id)

    def unbind(self, client_id: str) -> None:
        channel = self._by_client.pop(client_id, None)
        if channel is not None:
            self._unlink(channel)

    def _unlink(self, channel: Channel) -> None:
        ids = self._by_connection.get(channel.connection)
        if ids is not None:
            ids.discard(channel.client_id)
            if not ids:
                del self._by_connection[channel.connection]

    def drop_connection(self, conn: RemotingConnection) -> list[Channel]:
        """The clients bound to ``conn``, which closed: unbound and returned."""
        ids = self._by_connection.pop(conn, set())
        return [channel for cid in sorted(ids) if (channel := self._by_client.pop(cid, None)) is not None]

    def producers(self, group: str) -> list[Channel]:
        """The live channels of the producers of ``group`` (a transaction's check-back goes to one)."""
        return [c for c in self._by_client.values() if group in c.producer_groups and not c.connection.closed]

    def consumers(self, group: str) -> list[Channel]:
        return [c for c in self._by_client.values() if group in c.consumer_groups and not c.connection.closed]
