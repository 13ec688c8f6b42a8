"""What every part of the broker service shares (broker/service/broker_service.py): the
translation of store and Raft errors into the one coded error, and the checks every write or read
starts with (``require_writable``, ``require_state``, the topic lookup, the replicated admin
command); what the service uses of its host (``BrokerHost``).

``ProtocolError`` (broker/protocol/errors.py) is the only exception a service method raises on
purpose: a RocketMQ-style ``code`` (``TOPIC_NOT_EXIST``, ``NOT_LEADER``, ...), a human ``message``,
the HTTP ``status`` it is answered with, and ``extra`` fields that belong in the error answer
(``leader_addr`` with ``NOT_LEADER``, ``offsets`` with ``OFFSET_RESET``, ...); the validators and
the membership table raise it too. Errors from below (``NotLeaderError`` and the other
``DLedgerError``s, ``CorruptMessage``, a ``TimeoutError`` of the apply thread) are translated at
the service boundary by ``translated``, in one place (``translate``); an edge never sees them.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

from broker.protocol.errors import ProtocolError
from broker.store.message import encode_command
from broker.store.message_store import CorruptMessage
from broker.store.metadata import TopicConfig
from dledger.log_store import StoreClosedError
from dledger.node import (
    AppendFailedError,
    AppendTimeoutError,
    BusyError,
    DiskFullError,
    DLedgerError,
    EntryRemovedError,
    EntryTooLargeError,
    NotLeaderError,
    Refused,
)

if TYPE_CHECKING:
    import asyncio
    import collections
    from collections.abc import Mapping

    from broker.service.consumers import ConsumerManager
    from broker.service.producers import ProducerTable
    from broker.store.message_store import MessageStore
    from broker.store.schedule import ScheduleService
    from broker.store.transactions import TransactionService
    from dledger.clock import Clock
    from dledger.config import DLedgerConfig
    from dledger.node import DLedgerNode

INT64_MAX = 2**63 - 1

DLEDGER_ERRORS: dict[type[DLedgerError], tuple[int, str]] = {
    AppendFailedError: (409, "APPEND_FAILED"),
    AppendTimeoutError: (504, "SEND_TIMEOUT"),
    BusyError: (429, "BUSY"),
    DiskFullError: (507, "DISK_FULL"),
    EntryTooLargeError: (413, "MESSAGE_TOO_LARGE"),
    EntryRemovedError: (410, "MESSAGE_REMOVED"),
}


def refusal_error(refusal: Refused, what: str = "record", **extra: Any) -> ProtocolError:
    """The answer to a request whose record was committed but refused by every replica's apply
    (broker/store/record_rules.py): a coded error, never a success. ``RECORD_REFUSED`` (422) for records
    admission refused; ``BAD_COMMAND`` (400) for a metadata command the state machine refused."""
    status = 400 if refusal.code == "BAD_COMMAND" else 422
    return ProtocolError(
        refusal.code,
        f"the broker group refused to apply this {what} (every replica alike; listed by GET /v1/admin/refused):"
        f" {refusal.reason}",
        status,
        **extra,
    )


def raise_if_refused(result: Any, what: str = "record") -> Any:
    """``result`` (a ``BodyLocation.result``) unless it is a refusal, which is raised as its error."""
    if isinstance(result, Refused):
        raise refusal_error(result, what)
    return result


class ServiceConfig(Protocol):
    """What the service reads of the replica's configuration (``BrokerConfig`` is one; read-only
    members, as its fields are)."""

    @property
    def dledger(self) -> DLedgerConfig: ...
    @property
    def broker_name(self) -> str: ...
    @property
    def auto_create_topic(self) -> bool: ...
    @property
    def default_topic_queue_nums(self) -> int: ...
    @property
    def max_message_size(self) -> int: ...
    @property
    def long_polling_max_ms(self) -> int: ...
    @property
    def enable_property_filter(self) -> bool: ...


class ServiceMetrics(Protocol):
    """The events the service reports (``BrokerMetrics`` counts them)."""

    def sent(self, topic: str, count: int, nbytes: int, seconds: float) -> None: ...
    def send_failed(self, code: str) -> None: ...
    def pulled(self, topic: str, group: str | None, count: int, nbytes: int, seconds: float) -> None: ...


class Announcer(Protocol):
    """Registration with the NameServers (``Registrar`` is one)."""

    def trigger(self) -> None: ...  # register now: what the registration announces changed


class BrokerHost(Protocol):
    """What the service uses of the broker replica it runs in (``BrokerServer`` is one): the store
    and the node, the configuration (read, shown and changed through ``config_view`` and
    ``update_config``), the clock, the tables of clients, counters and metrics, and the long-poll
    wait. Nothing else reaches the service."""

    clock: Clock
    store: MessageStore
    node: DLedgerNode
    consumers: ConsumerManager
    producers: ProducerTable
    schedule: ScheduleService
    transactions: TransactionService  # check-backs (broker/store/transactions.py)
    counters: collections.Counter[str]
    creating: dict[str, asyncio.Task[Any]]  # topics being auto-created: one command per topic
    loop: asyncio.AbstractEventLoop
    send_timeout_s: float
    stopping: bool
    applied_seq: int  # apply calls so far (see BrokerServer.on_applied)

    @property
    def cfg(self) -> ServiceConfig: ...
    @property
    def registrar(self) -> Announcer: ...
    @property
    def metrics(self) -> ServiceMetrics: ...
    @property
    def ready(self) -> bool: ...  # the leader of the current term, applied up to its log end then

    def wall_ms(self) -> int: ...
    def monotonic_ms(self) -> int: ...
    def client_addr_of(self, peer_id: str | None) -> str | None: ...
    def first_log_position(self) -> int: ...
    async def wait_for_queue(self, topic: str, queue_id: int, timeout_s: float, since: int | None = None) -> None: ...
    async def status(self) -> dict[str, Any]: ...
    def config_view(self) -> Mapping[str, str]: ...  # every setting as text, secrets left out
    def update_config(self, key: str, value: str) -> None: ...  # one hot key; refused: a ProtocolError


P = ParamSpec("P")
R = TypeVar("R")


class ServiceBase:
    """The broker replica the service runs on, and the checks shared by its parts."""

    def __init__(self, server: BrokerHost):
        self.s = server

    # -- errors -------------------------------------------------------------------------------------
    def translate(self, exc: BaseException) -> ProtocolError | None:
        """The coded error for an error raised below the service, or None (not ours to map)."""
        if isinstance(exc, ProtocolError):
            return exc
        if isinstance(exc, NotLeaderError):
            return self.not_leader()
        if isinstance(exc, DLedgerError):
            status, code = DLEDGER_ERRORS.get(type(exc), (503, "SERVICE_UNAVAILABLE"))
            return ProtocolError(code, str(exc), status)
        if isinstance(exc, CorruptMessage):  # logged by the store; other replicas hold a good copy
            return ProtocolError("STORE_CORRUPT", f"{exc}: read it from another replica", 500)
        if isinstance(exc, StoreClosedError):  # the replica is stopping: its log closed under a read
            return ProtocolError("SERVICE_UNAVAILABLE", "this replica is stopping; retry (another replica)", 503)
        if isinstance(exc, TimeoutError):  # the replica's apply thread did not answer in time
            return ProtocolError("SERVICE_UNAVAILABLE", "the replica is busy; retry shortly", 503)
        return None

    def not_leader(self) -> ProtocolError:
        node = self.s.node
        leader_id = node.leader_id
        return ProtocolError(
            "NOT_LEADER",
            f"this broker ({node.settings.self_id}) is not the leader; leader is {leader_id}",
            409,
            leader_addr=self.s.client_addr_of(leader_id),
            leader_id=leader_id,
        )

    # -- the checks a call starts with ---------------------------------------------------------------
    def require_state(self) -> None:
        """Reads need the replicated state: a replica still waiting for it from the leader refuses."""
        if self.s.store.needs_state_after is not None:
            raise ProtocolError(
                "NOT_READY", "this replica is waiting for state from the leader; ask another replica", 503
            )

    def require_writable(self) -> None:
        """Writes go to the ready leader only (``NOT_LEADER`` names the leader to retry at)."""
        if self.s.node.role != "LEADER":
            raise self.not_leader()
        if not self.s.ready:
            raise ProtocolError("NOT_READY", "new leader is still applying committed entries; retry shortly", 503)

    def topic(self, topic: str) -> TopicConfig:
        tc = self.s.store.topic(topic)
        if tc is None:
            raise ProtocolError("TOPIC_NOT_EXIST", f"topic {topic!r} does not exist", 404)
        return tc

    async def command(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Append one admin command (broker/store/metadata.py) and return what its apply answered."""
        self.require_writable()
        locs = await self.s.node.append([encode_command(cmd)], timeout_s=self.s.send_timeout_s)
        result = raise_if_refused(locs[0].result, "command")
        if not isinstance(result, dict):  # applied, but not as a command (never expected)
            raise ProtocolError("INTERNAL", f"command {cmd.get('op')!r} was applied without a result", 500)
        if "error" in result:
            raise ProtocolError("BAD_COMMAND", str(result["error"]), 400)
        return dict(result)


def _reraise(service: object, exc: Exception) -> None:
    """Raise the coded error for ``exc`` if it differs from ``exc``; return to re-raise as is."""
    assert isinstance(service, ServiceBase)
    mapped = service.translate(exc)
    if mapped is not None and mapped is not exc:
        raise mapped from exc


def translated(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Decorate a public service coroutine: every error it raises that the service knows leaves as
    a ``ProtocolError`` (see ``ServiceBase.translate``); anything else propagates unchanged."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except Exception as exc:
            _reraise(args[0], exc)
            raise

    return wrapper


def translated_sync(fn: Callable[P, R]) -> Callable[P, R]:
    """``translated`` for the plain (non-async) service methods."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            _reraise(args[0], exc)
            raise

    return wrapper
