"""ACL enforcement at an HTTP port (the broker's and the NameServer's): who is asking, and may they.

``Security`` ties the pure parts together — the ACL file (``broker.serving.acl``), signature verification
and the nonce window (``broker.protocol.auth``) — with the server's injected wall clock. Its middleware
authenticates every request that is not anonymous-by-route, and stores the ``Principal`` on the
request; handlers then ask ``require(request, topics=..., groups=..., admin=...)`` once they know
which topic and group the request touches. With ACL off every request is allowed (``Principal.ALL``).

Invariant: a handler that changes state or returns messages calls ``require`` (or ``require_broker``)
before it acts; ``tests/broker/test_acl_api.py`` drives every route with an account that may do
nothing and expects 401/403 everywhere but the anonymous routes.

The signature is checked from the request head alone (``Verifier.verify_head``: the signature covers
the body's declared hash) *before* the body is read: an unsigned or wrongly signed request never
gets a byte of its body buffered, and its connection is closed instead of drained. Every answer
names the server's scope (header ``Dledger-Scope``), so clients learn what to sign for.

``SIGNED`` (a context variable) holds the verified signature of the request being handled, for the
one consumer that needs it below the API: the broker's replicated replay guard (broker/store/replay.py),
which carries the (access key, nonce, time) of a state-changing request into its Raft entry.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from aiohttp import web

from broker.protocol.auth import (
    FUTURE_MS_DEFAULT,
    HEADER,
    NONCES_PER_KEY_MAX_DEFAULT,
    WINDOW_MS_DEFAULT,
    AuthError,
    ExtraCheck,
    NonceWindow,
    SignedHeader,
    Verifier,
    check_body,
)
from broker.serving.acl import Account, AclWatcher, Perm, check, check_broker
from broker.serving.http_edge import EdgeError, Guard

log = logging.getLogger("broker.security")

Anonymous = Callable[[web.Request], bool]
SCOPE_HEADER: Final = "Dledger-Scope"


@dataclasses.dataclass(slots=True)
class SignedRequest:
    """The verified signature of the request being handled (``SIGNED``). ``carried``: its nonce went
    into a Raft entry already (broker/store/replay.py: the first append of a request carries it)."""

    header: SignedHeader
    carried: bool = False


SIGNED: Final[contextvars.ContextVar[SignedRequest | None]] = contextvars.ContextVar("dledger_signed", default=None)


@dataclasses.dataclass(frozen=True, slots=True)
class Principal:
    """Who sent a request: an ACL account, or ``everyone`` (ACL off, or a white-listed address)."""

    account: Account | None
    everything: bool = False

    @property
    def name(self) -> str:
        return self.account.access_key if self.account is not None else "*"


PRINCIPAL_KEY: Final = web.RequestKey("security.principal", Principal)
ALL: Final = Principal(None, everything=True)
NOBODY: Final = Principal(None)


class Security:
    def __init__(
        self,
        acl_file: str | None,
        wall_ms: Callable[[], int],
        guard: Guard,
        *,
        scope: str,
        anonymous: Anonymous = lambda request: False,
        window_ms: int = WINDOW_MS_DEFAULT,
        nonces_per_key_max: int = NONCES_PER_KEY_MAX_DEFAULT,
        future_ms: int = FUTURE_MS_DEFAULT,
        extra_check: ExtraCheck | None = None,
    ):
        """``scope``: this server's (``broker_scope`` / ``namesrv_scope``); ``extra_check``: refuses a
        correctly signed request for reasons of the server's own (the broker's replicated nonces)."""
        self.watcher = AclWatcher(acl_file) if acl_file else None
        self._wall_ms = wall_ms
        self._guard = guard
        self._anonymous = anonymous
        self.scope = scope
        self.verifier = Verifier(
            self._secret_of, NonceWindow(window_ms, nonces_per_key_max, future_ms), scope=scope,
            extra_check=extra_check,
        )
        self.refused: dict[str, int] = {}
        guard.response_headers[SCOPE_HEADER] = scope

    def wall_ms(self) -> int:
        return self._wall_ms()

    @property
    def enabled(self) -> bool:
        return self.watcher is not None

    def _secret_of(self, access_key: str) -> str | None:
        return self.watcher.current.secret_of(access_key) if self.watcher is not None else None

    async def run(self, interval_s: float = 1.0) -> None:
        if self.watcher is not None:
            await self.watcher.run(interval_s)

    # -- who ---------------------------------------------------------------------------------------
    async def authenticate(self, request: web.Request) -> Principal:
        if self.watcher is None:
            return ALL
        acl = self.watcher.current
        if acl.white_listed(request.remote):
            return ALL
        if HEADER not in request.headers and self._anonymous(request):
            return NOBODY
        try:
            signed = self.verifier.verify_head(
                request.headers.get(HEADER), request.method, request.raw_path, self._wall_ms()
            )
        except AuthError as exc:
            self._refused(exc)
            if request.body_exists:  # never read (nor drained) for a request we refuse anyway
                raise EdgeError(exc.status, exc.code, exc.message, close=True, **exc.extra) from None
            raise
        body = await self._guard.read_body(request)  # bounded by the guard; only now, once signed
        try:
            check_body(signed, body)
        except AuthError as exc:
            self._refused(exc)
            raise
        account = acl.accounts.get(signed.access_key)
        if account is None:  # removed by a reload between the two reads
            raise AuthError(401, "SIGNATURE_INVALID", "unknown access key or wrong signature")
        SIGNED.set(SignedRequest(signed))
        return Principal(account)

    def _refused(self, exc: AuthError) -> None:
        self.refused[exc.code] = self.refused.get(exc.code, 0) + 1

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        request[PRINCIPAL_KEY] = await self.authenticate(request)
        return await handler(request)

    # -- may they ----------------------------------------------------------------------------------
    def principal(self, request: web.Request) -> Principal:
        return request.get(PRINCIPAL_KEY, NOBODY)

    def _account(self, request: web.Request) -> Account | None:
        """None when everything is allowed; raises 401 for an anonymous request."""
        p = self.principal(request)
        if p.everything:
            return None
        if p.account is None:
            raise AuthError(401, "NO_CREDENTIALS", "this request must be signed (ACL is enabled)")
        return p.account

    def require(
        self,
        request: web.Request,
        *,
        topics: Mapping[str, Perm] | None = None,
        groups: Mapping[str, Perm] | None = None,
        admin: bool = False,
    ) -> None:
        account = self._account(request)
        if account is not None:
            self._count(lambda: check(account, topics=topics or {}, groups=groups or {}, admin=admin))

    def require_signed(self, request: web.Request) -> None:
        """Any known account (reads of metadata)."""
        self._account(request)

    def require_broker(self, request: web.Request, broker_name: str) -> None:
        account = self._account(request)
        if account is not None:
            self._count(lambda: check_broker(account, broker_name))

    def is_admin(self, request: web.Request) -> bool:
        p = self.principal(request)
        return p.everything or (p.account is not None and p.account.admin)

    def _count(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except AuthError as exc:
            self._refused(exc)
            raise
