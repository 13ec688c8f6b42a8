"""The one coded error of the broker, its edges, the NameServer and the SDK.

``ProtocolError`` is an expected failure a user can read: a RocketMQ-style ``code``
(``TOPIC_NOT_EXIST``, ``NOT_LEADER`` ...), a human ``message``, the HTTP ``status`` it is answered
with (0: none given — the SDK's errors that never had an answer, and the NameServer's, whose
classes it maps to a status itself), ``extra`` fields that belong in the answer (``leader_addr``
with ``NOT_LEADER``, ``offsets`` with ``OFFSET_RESET`` ...), and two verdicts a caller acts on:

- ``retryable``: another attempt (at another broker group, or here a moment later) may succeed;
- ``outcome_unknown``: the call may have taken effect anyway (a send to retry with the same unique
  ids: the broker's de-duplication window stores it once).

The service raises it (and turns what the layers below raise into it, ``BrokerService.translate``);
each edge answers it in one place — HTTP: ``broker.serving.http_edge.error_middleware``, the
binary port: ``broker.edge.binary`` — as ``body()``, ``{code, message, **extra}``; the SDK raises it
again from that answer (``broker.client.ClientError`` is this class), keeping the whole map as
``answer``. docs/API.md ("Error codes") lists the codes; tests/test_errors.py checks every raise
site against that list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

# A failure is *definite* ("the request cannot have taken effect": a send cannot have been stored)
# only when the request never reached a broker (no connection, a check in the client) or a broker
# refused it before acting on it: a 4xx answer, or 503 NOT_READY / 507 DISK_FULL. Everything else
# may have taken effect. APPEND_FAILED (409) is not definite: the entry was replaced on the replica
# that answered, but another replica holding it may still be elected and commit it (Raft §5.4.2,
# Figure 8). A garbled answer or a 5xx may come after the append.
UNKNOWN_OUTCOME_CODES: Final = frozenset({"TIMEOUT", "SEND_TIMEOUT", "CONNECTION_LOST", "APPEND_FAILED", "BAD_ANSWER"})
# 5xx answers that say the request was refused before anything was done.
REFUSED_5XX_CODES: Final = frozenset({"NOT_READY", "DISK_FULL"})
# Failures after which another attempt (another group, or the same one later) may succeed; any 5xx too.
RETRYABLE_CODES: Final = frozenset(
    {
        "CONNECT_FAILED",
        "CONNECTION_LOST",
        "TIMEOUT",
        "SEND_TIMEOUT",
        "NOT_LEADER",
        "NO_LEADER",
        "NO_ROUTE",
        "NOT_READY",
        "BUSY",
        "APPEND_FAILED",
        "SHUTTING_DOWN",
        "DISK_FULL",
        "NO_PERMISSION",
        "TOPIC_NOT_EXIST",
    }
)


def outcome_unknown(code: str, status: int) -> bool:
    """True when a call that failed with ``code`` (HTTP ``status``, 0 without an answer) may still
    have taken effect (see ``UNKNOWN_OUTCOME_CODES``)."""
    if code in UNKNOWN_OUTCOME_CODES:
        return True
    return status >= 500 and code not in REFUSED_5XX_CODES


def retryable(code: str, status: int) -> bool:
    """True when another attempt may succeed (``RETRYABLE_CODES``, or any 5xx answer)."""
    return code in RETRYABLE_CODES or status >= 500


class ProtocolError(Exception):
    """An expected failure with a code users can read (the module's docstring says the rest).

    ``addr``: the server that answered or was called (the SDK's errors; None on a server);
    ``answer``: the whole error map that server answered with (None when it answered none)."""

    def __init__(self, code: str, message: str, status: int = 0, *, retryable: bool | None = None,
                 outcome_unknown: bool | None = None, addr: str | None = None,
                 answer: Mapping[str, Any] | None = None, **extra: Any):
        super().__init__(f"{code}: {message}" + (f" ({addr})" if addr else ""))
        self.code = code
        self.message = message
        self.status = status
        self.extra = extra
        self.addr = addr
        self.answer = answer
        leader_addr = extra.get("leader_addr")  # with NOT_LEADER: where the leader serves clients
        self.leader_addr: str | None = leader_addr if isinstance(leader_addr, str) else None
        self.retryable = _retryable(code, status) if retryable is None else retryable
        # the SDK also sets it when an earlier attempt of the same send had an unknown outcome
        self.outcome_unknown = _outcome_unknown(code, status) if outcome_unknown is None else outcome_unknown

    def body(self) -> dict[str, Any]:
        """The ``{code, message, ...extra}`` error map every edge answers with."""
        return {"code": self.code, "message": self.message, **self.extra}


_retryable = retryable
_outcome_unknown = outcome_unknown
