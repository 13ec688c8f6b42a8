"""What the store's leader loops — delayed delivery (``schedule``) and transaction check-backs
(``transactions``) — use of the replica they run on (``BrokerServer`` is one): its node, to append,
whether it is the ready leader, and its clock. Each loop adds the store queries it reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dledger.node import DLedgerNode


class LeaderHost(Protocol):
    send_timeout_s: float
    stopping: bool

    @property
    def node(self) -> DLedgerNode: ...
    @property
    def ready(self) -> bool: ...  # the leader of the current term, applied up to its log end then
    def wall_ms(self) -> int: ...
