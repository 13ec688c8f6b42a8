"""ACL enforcement at an HTTP port (the broker's and the NameServer's): who is asking, and may they.

``Security`` ties the pure parts together — the ACL file (``broker.serving.acl``), signature verification
and the nonce window (``broker.protocol.auth``) — with the server's injected wall clock. Its middleware
authenticates every request that is not anonymous-by-route, and stores the ``Principal`` on the
request; handlers then ask ``require(request, topics=..., groups=..., admin=...)`` once they know
which topic and group the request touches. With ACL off every request is allowed (``Principal.ALL``).

Invariant: a handler that changes state or returns messages calls ``require`` (or ``require_broker``)
before it acts; ``tests/broker/test_acl_api.py`` drives every route with an account that may do
nothing and expects 401/403 everywhere but the anonymous routes.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

from aiohttp import web

from broker.protocol.auth import (
    HEADER,
    NONCES_MAX_DEFAULT,
    WINDOW_MS_DEFAULT,
    AuthError,
    NonceWindow,
    Verifier,
)
from broker.serving.acl import Account, AclWatcher, Perm, check, check_broker
from broker.serving.http_edge import Guard

log = logging.getLogger("broker.security")

Anonymous = Callable[[web.Request], bool]


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
        anonymous: Anonymous = lambda request: False,
        window_ms: int = WINDOW_MS_DEFAULT,
        nonces_max: int = NONCES_MAX_DEFAULT,
    ):
        self.watcher = AclWatcher(acl_file) if acl_file else None
        self._wall_ms = wall_ms
        self._guard = guard
        self._anonymous = anonymous
        self.verifier = Verifier(self._secret_of, NonceWindow(window_ms, nonces_max))
        self.refused: dict[str, int] = {}

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
        body = await self._guard.read_body(request)
        access_key = self.verifier.verify(
            request.headers.get(HEADER), request.method, request.raw_path, body, self._wall_ms()
        )
        account = acl.accounts.get(access_key)
        if account is None:  # removed by a reload between the two reads
            raise AuthError(401, "SIGNATURE_INVALID", "unknown access key or wrong signature")
        return Principal(account)

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
            self.refused[exc.code] = self.refused.get(exc.code, 0) + 1
            raise
