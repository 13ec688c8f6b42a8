"""What the SDK signs each request with, per server address (docs/SECURITY.md, "Signatures").

A signature names the one server that may accept it (its *scope*, ``broker.protocol.auth``), and is
stamped with the client's clock. The client does not know a server's scope before it answered, and
its clock may be off: ``Signer`` learns both from the servers themselves —

- every answer of a broker or NameServer names its scope (header ``Dledger-Scope``), and a request
  signed for another scope is refused with ``WRONG_SCOPE`` naming it; the client signs again for it;
- a request stamped outside the server's window is refused with ``TIMESTAMP_OUT_OF_WINDOW`` and the
  server's time; the client keeps the difference for that server and signs again.

Both refusals come before the server acted on the request, so the one retry (the caller's) is safe
for every method. One owner: the event loop of the transport that holds it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any, Final

from broker.protocol.auth import UNKNOWN_SCOPE, Credentials, authorization, is_scope

SCOPE_HEADER: Final = "Dledger-Scope"  # the header every answer names its server's scope in
RETRY_CODES: Final = frozenset({"WRONG_SCOPE", "TIMESTAMP_OUT_OF_WINDOW"})
ADDRESSES_MAX: Final = 4096  # servers remembered (a client talks to a cluster, not to the world)


NONCE_BYTES: Final = 16  # broker.protocol.auth.new_nonce: 16 random bytes as 32 hex digits
NONCE_POOL_BYTES: Final = NONCE_BYTES * 256  # one getrandom() call per 256 requests, not one each


class _NoncePool:
    """``secrets.token_hex(16)`` (auth.new_nonce), drawn from the OS's random bytes 4 KiB at a
    time. A forked child starts with an empty pool (never the parent's nonces)."""

    def __init__(self) -> None:
        self.pool = b""
        self.at = 0

    def next(self) -> str:
        at = self.at
        if at >= len(self.pool):
            self.pool, at = os.urandom(NONCE_POOL_BYTES), 0
        self.at = at + NONCE_BYTES
        return self.pool[at:at + NONCE_BYTES].hex()

    def clear(self) -> None:
        self.pool, self.at = b"", 0


_nonces = _NoncePool()
os.register_at_fork(after_in_child=_nonces.clear)


class Signer:
    def __init__(self, credentials: Credentials | None):
        self.credentials = credentials
        self._scopes: dict[str, str] = {}
        self._offsets_ms: dict[str, int] = {}

    def knows(self, addr: str) -> bool:
        return addr in self._scopes

    def scope_of(self, addr: str) -> str:
        return self._scopes.get(addr, UNKNOWN_SCOPE)

    def now_ms(self, addr: str) -> int:
        """This client's wall clock, corrected by what the server at ``addr`` said its time was."""
        return int(time.time() * 1000) + self._offsets_ms.get(addr, 0)

    def sign(self, addr: str, method: str, target: str, body: bytes) -> str | None:
        """The ``Authorization`` value for one attempt (None without credentials)."""
        if self.credentials is None:
            return None
        return self.header(addr, method, target, body, self.now_ms(addr), _nonces.next())

    def header(self, addr: str, method: str, target: str, body: bytes, timestamp_ms: int, nonce: str) -> str:
        """``auth.authorization`` for the server at ``addr`` (its learnt scope, or ``UNKNOWN_SCOPE``)."""
        assert self.credentials is not None, "a signer without credentials signs nothing"
        return authorization(self.credentials, method, target, body, timestamp_ms, nonce,
                             scope=self._scopes.get(addr, UNKNOWN_SCOPE))

    def learn_scope(self, addr: str, scope: str | None) -> None:
        if scope is None or not is_scope(scope) or self._scopes.get(addr) == scope:
            return
        if len(self._scopes) >= ADDRESSES_MAX:
            self._scopes.clear()
        self._scopes[addr] = scope

    def learn_refusal(self, addr: str, code: str, answer: Mapping[str, Any] | None) -> bool:
        """True when the refusal taught something, so that signing again may succeed."""
        if self.credentials is None or code not in RETRY_CODES or not isinstance(answer, Mapping):
            return False
        if code == "WRONG_SCOPE":  # (the answer's header may have taught the scope already)
            scope = answer.get("scope")
            if not is_scope(scope):
                return False
            self.learn_scope(addr, scope)
            return True
        server_ms = answer.get("server_time_ms")
        if not isinstance(server_ms, int) or isinstance(server_ms, bool):
            return False
        offset = server_ms - int(time.time() * 1000)
        if abs(offset - self._offsets_ms.get(addr, 0)) < 1000:
            return False  # already corrected: refused for another reason (a request held too long)
        if len(self._offsets_ms) >= ADDRESSES_MAX:
            self._offsets_ms.clear()
        self._offsets_ms[addr] = offset
        return True
