"""The broker service: what a broker replica does for its clients — send, pull, query, topic and
group admin, offsets — as plain async methods over the message store and the dledger node, with
typed arguments and results. No transport here: ``broker/edge/http_api.py`` (HTTP + msgpack/JSON) decodes a
request, checks ACL, calls one method and encodes the answer; a binary transport does the same.

    transport (broker/edge/http_api.py, ...) ──decode, ACL──▶ BrokerService ──▶ MessageStore / DLedgerNode
             ◀──encode (to_dict / view)──  SendAnswer, PullAnswer, ... | ProtocolError

The contract (every method validates its own arguments: a transport may pass what it decoded):

- ``await send(topic, queue_id, messages, *, producer_group=None, client_addr="") -> SendAnswer``
  ``messages``: 1..1024 maps (``MessageIn``: body, tags, keys, properties, unique_id, born_ts,
  born_host, flag). ``SendAnswer``: broker_name, queue_id, store_ts and one ``SendResult``
  (msg_id, unique_id, queue_offset, position, duplicate) per message, in order. Leader only.
- ``await pull(topic, queue_id, offset, *, group=None, max_count=32, max_bytes=4 MiB, tags=None,
  sql=None, suspend_ms=0) -> PullAnswer``: status (FOUND, NO_NEW_MSG, NO_MATCHED_MSG,
  OFFSET_TOO_SMALL, OFFSET_OVERFLOW), next/min/max offset, ``PulledMessage``s (message, position,
  size, queue_offset; ``view(broker_name)`` is the API's message map), topic_epoch. Any replica.
- queries: ``message_by_id(msg_id)``, ``message_at(position)``, ``messages_by_key(topic, key, *,
  max_n, begin_ts, end_ts, unique)``, ``message_at_offset(topic, queue_id, offset)``,
  ``search_offset(topic, queue_id, ts)`` (plain methods: they read, never wait).
- retries: ``send_back(group, position, *, max_reconsume_times, to_dlq)``, ``resend_dlq(group,
  position)`` -> ``SendBackAnswer``.
- transactions (broker/service/txn.py): ``send_half``, ``end_transaction`` -> ``EndAnswer``,
  ``transaction_checks``, ``pending_halves``.
- admin: ``put_topic``, ``topics``, ``get_topic``, ``delete_topic``, ``topic_status``,
  ``put_group``, ``groups``, ``delete_group``, ``commit_offsets``, ``group_offsets``,
  ``reset_offsets``, ``group_progress``, ``heartbeat``, ``unregister``, ``group_members``,
  ``producer_connections``, ``status``, ``config``, ``update_config``, ``clean_expired_queues``,
  ``transfer_leadership``.

Errors: every method raises the coded ``ProtocolError`` only (``code``, ``message``, ``status``,
``extra`` fields for the answer; ``answer()`` is the ``{code, message, ...}`` map) — Raft,
store and validation errors are translated at this boundary (broker/service/base.py). ACL is the
transport's job (it knows the caller); the service trusts the principal it is handed.

Dependencies: ``BrokerHost`` (broker/service/base.py) lists what the service uses of the replica it
runs in (store, node, configuration, clock, client tables, metrics, the long-poll wait);
``BrokerServer`` is one, checked by mypy where it builds its service.

Threads: every method runs on the broker's event loop (store reads are safe there, see
docs/ARCHITECTURE.md); appends go to the node on the same loop (it owns the replica).

Split by concern: broker/service/send.py (send, retries), broker/service/txn.py (transactions),
broker/service/query.py (pull, queries), broker/service/admin.py (topics, groups, offsets, membership, the replica).
"""

from __future__ import annotations

from broker.service.admin import AdminOps, CommitAnswer, GroupOffsets, ResetAnswer, offsets_answer
from broker.service.base import BrokerHost
from broker.service.query import PullAnswer, PulledMessage, QueryOps
from broker.service.send import MessageIn, SendAnswer, SendBackAnswer, SendResult
from broker.service.txn import EndAnswer, TxnOps

__all__ = [
    "BrokerHost",
    "BrokerService",
    "CommitAnswer",
    "EndAnswer",
    "GroupOffsets",
    "MessageIn",
    "PullAnswer",
    "PulledMessage",
    "ResetAnswer",
    "SendAnswer",
    "SendBackAnswer",
    "SendResult",
    "offsets_answer",
]


class BrokerService(TxnOps, QueryOps, AdminOps):  # TxnOps extends SendOps
    """One per broker replica (``BrokerServer.service``), shared by every transport."""

    def __init__(self, server: BrokerHost):
        super().__init__(server)
        self._init_send()
