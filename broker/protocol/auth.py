"""Signed requests: HMAC-SHA256 over the request and its target server, a timestamp window and a
per-key nonce (replay) window.

Pure: no sockets, no clock reads (callers pass ``now_ms`` from ``Clock.wall()``), no globals. Used
by the SDK and the broker's registrar to sign, and by the broker and the NameServer to verify.

A signed request carries one header (format 2; docs/SECURITY.md)::

    Authorization: DLEDGER-HMAC-SHA256 AccessKey=<ak>, Scope=<scope>, Timestamp=<ms>, Nonce=<32 hex>,
                   BodySha256=<64 hex>, Signature=<b64>

where ``Signature = base64(HMAC-SHA256(secretKey, string_to_sign))`` and::

    string_to_sign = "DLEDGER-HMAC-SHA256\\n2\\n" ak "\\n" scope "\\n" ts "\\n" nonce "\\n" METHOD "\\n" target
                     "\\n" hex(sha256(body))

- ``scope`` names the one server that may accept the request (``broker_scope``: the broker group and
  replica; ``namesrv_scope``: one NameServer process). A request captured on its way to one replica
  is refused by every other replica and NameServer (``WRONG_SCOPE``, whose answer names the
  server's scope, so a client learns it from its first refusal and signs again).
- ``target`` is the request target exactly as sent on the request line (path and query string), so
  neither side has to canonicalise anything.
- ``BodySha256`` declares the body's hash and the signature covers it, so a server verifies the
  signature from the head alone, *before* it buffers a byte of the body (``Verifier.verify_head``),
  and compares the hash once the body is in (``check_body``).

Format 1 (no ``Scope``, no ``BodySha256``) is refused with a message that says so: a signature that
names no server could be replayed at any of them, and our SDK and tools are its only signers.

Verification order (``Verifier.verify_head``): header syntax -> scope -> account -> signature
(constant time) -> timestamp (at most ``window_ms`` old, at most ``future_ms`` ahead of the server's
wall clock) -> nonce not seen. Only requests with a valid signature reach the nonce window, so
strangers cannot fill it.

``NonceWindow`` keeps, **per access key**, every nonce accepted in the last ``window_ms`` (older
requests fail the timestamp check anyway), at most ``entries_per_key_max`` of them: when one key's
set is full its oldest entry is dropped and *that key's* floor rises to its timestamp; a request of
that key stamped at or before its floor is refused (``REQUEST_TOO_OLD``: its nonce might have been
dropped), so a replay is never accepted. No state is shared between keys: one account's requests,
however stamped, never refuse another account's; and since a request may be stamped at most
``future_ms`` ahead, a client sharing an access key with others can push that key's floor at most
``future_ms`` past the true time.
"""

from __future__ import annotations

import binascii
import dataclasses
import functools
import hashlib
import heapq
import hmac
import os
import re
import secrets
from collections.abc import Callable, Mapping
from typing import Any, Final

import yaml

from broker.protocol.errors import ProtocolError
from broker.protocol.names import ACCESS_KEY_RULE, is_access_key

SCHEME: Final = "DLEDGER-HMAC-SHA256"
FORMAT: Final = "2"  # the string-to-sign's second line (format 1 had none)
HEADER: Final = "Authorization"
WINDOW_MS_DEFAULT: Final = 300_000  # how old a request may be (like AWS SigV4's tolerated skew, 5 min)
# How far ahead of the server's clock a request may be stamped: NTP keeps hosts within milliseconds,
# and the SDK corrects a larger offset itself from the refusal (``server_time_ms``), so 10 s refuses
# no honest client; it bounds how long a future-stamped request stays replayable past the window and
# how far one client can move its own access key's floor (see NonceWindow).
FUTURE_MS_DEFAULT: Final = 10_000
NONCES_PER_KEY_MAX_DEFAULT: Final = 100_000
SECRET_CHARS_MIN: Final = 8
HEADER_CHARS_MAX: Final = 1024
SCOPE_RULE: Final = "[!-+\\--~]{1,255}"  # printable ASCII, no ',' (the header's separator)
UNKNOWN_SCOPE: Final = "-"  # what a client signs for before a server told it its scope
CREDENTIALS_FILE_BYTES_MAX: Final = 64 << 10
ENV_ACCESS_KEY: Final = "DLEDGER_ACCESS_KEY"
ENV_SECRET_KEY: Final = "DLEDGER_SECRET_KEY"
ENV_CREDENTIALS_FILE: Final = "DLEDGER_CREDENTIALS_FILE"

_SCOPE: Final = re.compile(SCOPE_RULE)
_HEADER_RE: Final = re.compile(
    SCHEME + r" AccessKey=([^,\s]{1,255}), Scope=(" + SCOPE_RULE + r"), Timestamp=([0-9]{1,15}), "
    r"Nonce=([0-9a-f]{32}), BodySha256=([0-9a-f]{64}), Signature=([A-Za-z0-9+/]{43}=)"
)
_FORMAT_1_RE: Final = re.compile(SCHEME + r" AccessKey=[^,\s]{1,255}, Timestamp=[0-9]{1,15}, Nonce=")


def broker_scope(cluster: str, broker_name: str, self_id: str) -> str:
    """The scope of one broker replica: its cluster, group (brokerName) and Raft peer id."""
    return f"broker:{cluster}/{broker_name}/{self_id}"


def namesrv_scope(instance: str) -> str:
    """The scope of one NameServer process (``instance``: random, made at its start — its state and
    its nonce window live in memory only, so a request signed for an earlier process is void)."""
    return f"namesrv:{instance}"


def is_scope(value: object) -> bool:
    return isinstance(value, str) and _SCOPE.fullmatch(value) is not None


class AuthError(ProtocolError):
    """A refused request: ``status`` 401 (who are you?) or 403 (not allowed), ``code`` for users,
    ``extra`` fields for the answer (the server's ``scope``, its ``server_time_ms``)."""

    def __init__(self, status: int, code: str, message: str, **extra: Any):
        super().__init__(code, message, status, **extra)


@dataclasses.dataclass(frozen=True, slots=True)
class Credentials:
    """An access key and its secret (never printed)."""

    access_key: str
    secret_key: str = dataclasses.field(repr=False)

    def __post_init__(self) -> None:
        if not is_access_key(self.access_key):
            raise ValueError(f"accessKey {self.access_key[:40]!r} must match {ACCESS_KEY_RULE}")
        if not isinstance(self.secret_key, str) or len(self.secret_key) < SECRET_CHARS_MIN:
            raise ValueError(f"the secretKey of {self.access_key!r} must be at least {SECRET_CHARS_MIN} characters")


@dataclasses.dataclass(frozen=True, slots=True)
class SignedHeader:
    access_key: str
    scope: str
    timestamp_ms: int
    nonce: str
    digest: str  # hex sha256 of the body, as declared (check_body compares)
    signature: str


# -- signing (client side) -------------------------------------------------------------------------
def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def string_to_sign(
    access_key: str, scope: str, timestamp_ms: int, nonce: str, method: str, target: str, digest: str
) -> bytes:
    return "\n".join((SCHEME, FORMAT, access_key, scope, str(timestamp_ms), nonce, method.upper(), target,
                      digest)).encode("utf-8", "surrogateescape")


_BLOCK: Final = 64  # SHA-256's block size (RFC 2104's B)
_IPAD: Final = bytes(x ^ 0x36 for x in range(256))
_OPAD: Final = bytes(x ^ 0x5C for x in range(256))


@functools.lru_cache(maxsize=256)  # the secrets of the ACL's accounts, or a client's own
def _keyed(secret_key: str) -> tuple[Any, Any]:
    """The SHA-256 states after HMAC's inner and outer padded key (RFC 2104, as ``hmac`` builds
    them), hashed once per secret: a signature then copies them instead of keying a new HMAC.
    Never updated in place (``signature`` copies them; a copy is made under the object's lock)."""
    key = secret_key.encode("utf-8")
    if len(key) > _BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    return hashlib.sha256(key.translate(_IPAD)), hashlib.sha256(key.translate(_OPAD))


def signature(secret_key: str, message: bytes) -> str:
    """base64(HMAC-SHA256(secret_key, message)): ``hmac.new(...).digest()``'s bytes."""
    inner, outer = _keyed(secret_key)
    inner = inner.copy()
    inner.update(message)
    outer = outer.copy()
    outer.update(inner.digest())
    return binascii.b2a_base64(outer.digest(), newline=False).decode("ascii")


def new_nonce() -> str:
    return secrets.token_hex(16)


def authorization(
    creds: Credentials,
    method: str,
    target: str,
    body: bytes,
    timestamp_ms: int,
    nonce: str | None = None,
    *,
    scope: str = UNKNOWN_SCOPE,
) -> str:
    """The ``Authorization`` header value for one request to the server named by ``scope`` (a fresh
    nonce unless given). ``UNKNOWN_SCOPE`` is refused by every server with its own scope named."""
    if not is_scope(scope):
        raise ValueError(f"scope {scope[:60]!r} must match {SCOPE_RULE}")
    nonce = nonce or new_nonce()
    digest = body_digest(body)
    msg = string_to_sign(creds.access_key, scope, timestamp_ms, nonce, method, target, digest)
    return (
        f"{SCHEME} AccessKey={creds.access_key}, Scope={scope}, Timestamp={timestamp_ms}, Nonce={nonce}, "
        f"BodySha256={digest}, Signature={signature(creds.secret_key, msg)}"
    )


# -- verifying (server side) -----------------------------------------------------------------------
def parse_authorization(value: str | None) -> SignedHeader:
    if value is None or value == "":
        raise AuthError(401, "NO_CREDENTIALS", "this request must be signed (Authorization: DLEDGER-HMAC-SHA256 ...)")
    m = _HEADER_RE.fullmatch(value) if len(value) <= HEADER_CHARS_MAX else None
    if m is None:
        if len(value) <= HEADER_CHARS_MAX and _FORMAT_1_RE.match(value):
            raise AuthError(401, "BAD_AUTHORIZATION", "this signature names no Scope (format 1, from an older "
                            "client): it could be replayed at any server and is refused; upgrade the client")
        raise AuthError(401, "BAD_AUTHORIZATION", f"Authorization must be '{SCHEME} AccessKey=.., Scope=.., "
                        "Timestamp=.., Nonce=<32 hex>, BodySha256=<64 hex>, Signature=<base64>'")
    access_key, scope, timestamp, nonce, digest, sig = m.groups()  # one call, not one per field
    return SignedHeader(access_key, scope, int(timestamp), nonce, digest, sig)


def check_time(timestamp_ms: int, now_ms: int, window_ms: int, future_ms: int) -> None:
    """``TIMESTAMP_OUT_OF_WINDOW`` (with the server's time, so a client can correct its offset) when
    the request is more than ``window_ms`` old or more than ``future_ms`` ahead."""
    ahead = timestamp_ms - now_ms
    if ahead > future_ms or -ahead > window_ms:
        raise AuthError(
            401,
            "TIMESTAMP_OUT_OF_WINDOW",
            f"request time {timestamp_ms} is {ahead:+d} ms from the server's clock (accepted: {-window_ms} to "
            f"+{future_ms} ms): check the client's clock",
            server_time_ms=now_ms,
        )


class KeyNonces:
    """One access key's nonces: nonce -> timestamp, a heap by timestamp, and the key's floor."""

    __slots__ = ("by_time", "floor_ms", "seen")

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}
        self.by_time: list[tuple[int, str]] = []
        self.floor_ms = -1

    def drop_through(self, ts_ms: int) -> None:
        """Forget every nonce stamped at or before ``ts_ms``."""
        heap, seen = self.by_time, self.seen
        while heap and heap[0][0] <= ts_ms:
            t, n = heapq.heappop(heap)
            if seen.get(n) == t:
                del seen[n]


class NonceWindow:
    """Nonces accepted in the last ``window_ms``, per access key, at most ``entries_per_key_max`` per
    key (see the module doc). Pure: time is passed in. One owner (the server's event loop)."""

    def __init__(
        self,
        window_ms: int = WINDOW_MS_DEFAULT,
        entries_per_key_max: int = NONCES_PER_KEY_MAX_DEFAULT,
        future_ms: int = FUTURE_MS_DEFAULT,
    ):
        assert window_ms > 0 and entries_per_key_max > 0 and future_ms >= 0
        self.window_ms = window_ms
        self.future_ms = future_ms
        self.entries_per_key_max = entries_per_key_max
        self._keys: dict[str, KeyNonces] = {}
        self._swept_ms: int | None = None
        self.evicted = 0

    def __len__(self) -> int:
        return sum(len(k.seen) for k in self._keys.values())

    def floor_of(self, access_key: str) -> int:
        k = self._keys.get(access_key)
        return k.floor_ms if k is not None else -1

    def admit(self, access_key: str, nonce: str, timestamp_ms: int, now_ms: int) -> None:
        """Accept the request once, or raise ``AuthError``."""
        check_time(timestamp_ms, now_ms, self.window_ms, self.future_ms)
        self._sweep(now_ms)
        k = self._keys.get(access_key)
        if k is None:
            k = self._keys[access_key] = KeyNonces()
        k.drop_through(now_ms - self.window_ms - 1)
        if nonce in k.seen:
            raise AuthError(401, "REPLAYED_REQUEST", "this signed request was already received (nonce reused)")
        if timestamp_ms <= k.floor_ms:
            raise AuthError(401, "REQUEST_TOO_OLD", "this access key sent too many requests since this one was "
                            "signed: sign it again")
        k.seen[nonce] = timestamp_ms
        heapq.heappush(k.by_time, (timestamp_ms, nonce))
        if len(k.seen) > self.entries_per_key_max:
            oldest = k.by_time[0][0]
            before = len(k.seen)
            k.floor_ms = max(k.floor_ms, oldest)
            k.drop_through(k.floor_ms)
            self.evicted += before - len(k.seen)

    def _sweep(self, now_ms: int) -> None:
        """Every quarter window: age every key, and forget keys with nothing left to remember."""
        if self._swept_ms is not None and now_ms - self._swept_ms < self.window_ms // 4:
            return
        self._swept_ms = now_ms
        horizon = now_ms - self.window_ms - 1
        for ak in list(self._keys):
            k = self._keys[ak]
            k.drop_through(horizon)
            if not k.seen and k.floor_ms <= horizon:
                del self._keys[ak]


# Checks a server adds after the signature (e.g. the broker's replicated nonces, broker/store/replay.py):
# raises ``AuthError`` to refuse.
ExtraCheck = Callable[[SignedHeader], None]


class Verifier:
    """Authenticates signed requests for the server named ``scope`` against a secret lookup
    (access key -> secret or None)."""

    def __init__(
        self,
        secret_of: Callable[[str], str | None],
        nonces: NonceWindow | None = None,
        *,
        scope: str,
        extra_check: ExtraCheck | None = None,
    ):
        assert is_scope(scope), scope
        self._secret_of = secret_of
        self.nonces = nonces if nonces is not None else NonceWindow()
        self.scope = scope
        self.extra_check = extra_check

    def verify_head(self, header: str | None, method: str, target: str, now_ms: int) -> SignedHeader:
        """Everything but the body (whose hash the signature covers as declared): the caller reads
        the body only after this passed, then calls ``check_body``."""
        signed = parse_authorization(header)
        if signed.scope != self.scope:
            raise AuthError(401, "WRONG_SCOPE", f"this request is signed for {signed.scope[:80]!r}, this server is "
                            f"{self.scope!r}: sign it for this server", scope=self.scope)
        secret = self._secret_of(signed.access_key)
        # One answer for an unknown key and a wrong signature: no oracle for which keys exist.
        expected = "" if secret is None else signature(
            secret, string_to_sign(signed.access_key, signed.scope, signed.timestamp_ms, signed.nonce, method,
                                   target, signed.digest)
        )
        if secret is None or not hmac.compare_digest(expected, signed.signature):
            raise AuthError(401, "SIGNATURE_INVALID", "unknown access key or wrong signature")
        check_time(signed.timestamp_ms, now_ms, self.nonces.window_ms, self.nonces.future_ms)
        if self.extra_check is not None:
            self.extra_check(signed)
        self.nonces.admit(signed.access_key, signed.nonce, signed.timestamp_ms, now_ms)
        return signed

    def verify(self, header: str | None, method: str, target: str, body: bytes, now_ms: int) -> str:
        """The authenticated access key, or ``AuthError`` (head and body at once)."""
        signed = self.verify_head(header, method, target, now_ms)
        check_body(signed, body)
        return signed.access_key


def check_body(signed: SignedHeader, body: bytes) -> None:
    """The body is the one the signature declared (``BODY_DIGEST_MISMATCH`` otherwise)."""
    if not hmac.compare_digest(body_digest(body), signed.digest):
        raise AuthError(401, "BODY_DIGEST_MISMATCH", "the body is not the one the signature covers")


# -- credentials for clients -------------------------------------------------------------------------
class CredentialsError(ValueError):
    """A credentials file or environment that cannot be used (the message says why)."""


def parse_credentials(text: str, source: str) -> Credentials:
    """RocketMQ's ``tools.yml`` shape: ``accessKey: ...`` and ``secretKey: ...`` (nothing else)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CredentialsError(f"{source}: not YAML: {str(exc)[:200]}") from None
    if not isinstance(doc, dict) or set(doc) != {"accessKey", "secretKey"}:
        raise CredentialsError(f"{source}: must hold exactly accessKey and secretKey")
    ak, sk = doc["accessKey"], doc["secretKey"]
    if not isinstance(ak, str) or not isinstance(sk, str):
        raise CredentialsError(f"{source}: accessKey and secretKey must be strings")
    try:
        return Credentials(ak, sk)
    except ValueError as exc:
        raise CredentialsError(f"{source}: {exc}") from None


def load_credentials(path: str | os.PathLike[str]) -> Credentials:
    """Read a credentials file (refused when others may read it, like ssh refuses a loose key)."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as f:
            st = os.fstat(f.fileno())
            raw = f.read(CREDENTIALS_FILE_BYTES_MAX + 1)
    except OSError as exc:
        raise CredentialsError(f"{source}: {exc.strerror or exc}") from None
    if st.st_mode & 0o077:
        raise CredentialsError(f"{source}: mode {st.st_mode & 0o777:o} lets others read it: chmod 600 {source}")
    if len(raw) > CREDENTIALS_FILE_BYTES_MAX:
        raise CredentialsError(f"{source}: larger than {CREDENTIALS_FILE_BYTES_MAX} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CredentialsError(f"{source}: not UTF-8") from None
    return parse_credentials(text, source)


def credentials_from_env(env: Mapping[str, str] | None = None) -> Credentials | None:
    """``DLEDGER_ACCESS_KEY`` + ``DLEDGER_SECRET_KEY``, else ``DLEDGER_CREDENTIALS_FILE``, else None."""
    env = os.environ if env is None else env
    ak, sk = env.get(ENV_ACCESS_KEY), env.get(ENV_SECRET_KEY)
    if ak or sk:
        if not (ak and sk):
            raise CredentialsError(f"set both {ENV_ACCESS_KEY} and {ENV_SECRET_KEY}, or neither")
        try:
            return Credentials(ak, sk)
        except ValueError as exc:
            raise CredentialsError(f"{ENV_ACCESS_KEY}/{ENV_SECRET_KEY}: {exc}") from None
    path = env.get(ENV_CREDENTIALS_FILE)
    return load_credentials(path) if path else None


def credentials_text(creds: Credentials) -> str:
    """A credentials file's content (``parse_credentials`` reads it back)."""
    return yaml.safe_dump({"accessKey": creds.access_key, "secretKey": creds.secret_key}, sort_keys=False)


def as_credentials(value: Credentials | tuple[str, str] | Any) -> Credentials:
    if isinstance(value, Credentials):
        return value
    if isinstance(value, tuple) and len(value) == 2:
        return Credentials(*value)
    raise TypeError("credentials must be a Credentials or an (access key, secret key) pair")
