"""Signed requests: HMAC-SHA256 over the request, a timestamp window and a nonce (replay) window.

Pure: no sockets, no clock reads (callers pass ``now_ms`` from ``Clock.wall()``), no globals. Used
by the SDK and the broker's registrar to sign, and by the broker and the NameServer to verify.

A signed request carries one header::

    Authorization: DLEDGER-HMAC-SHA256 AccessKey=<ak>, Timestamp=<ms>, Nonce=<32 hex>, Signature=<b64>

where ``Signature = base64(HMAC-SHA256(secretKey, string_to_sign))`` and::

    string_to_sign = "DLEDGER-HMAC-SHA256\\n" ak "\\n" ts "\\n" nonce "\\n" METHOD "\\n" target "\\n" hex(sha256(body))

``target`` is the request target exactly as sent on the request line (path and query string), so
neither side has to canonicalise anything; the body hash binds the body (a message, a registration).

Verification order (``Verifier.verify``): header syntax -> account -> signature (constant-time)
-> timestamp within ``window_ms`` of the server's wall clock -> nonce not seen. Only requests with
a valid signature reach the nonce window, so strangers cannot fill it.

``NonceWindow`` keeps every (access key, nonce) accepted in the last ``window_ms`` (older requests
fail the timestamp check anyway). It is bounded by ``entries_max``: when full it evicts the oldest
entry and raises ``floor_ms`` to its timestamp; a request stamped at or before ``floor_ms`` is then
refused (its nonce might have been evicted), so a replay is never accepted, at worst a very late
request is refused and its client signs it again.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import heapq
import hmac
import os
import re
import secrets
from collections.abc import Callable, Mapping
from typing import Any, Final

import yaml

from broker.protocol.names import ACCESS_KEY_RULE, is_access_key

SCHEME: Final = "DLEDGER-HMAC-SHA256"
HEADER: Final = "Authorization"
WINDOW_MS_DEFAULT: Final = 300_000  # like AWS SigV4's 5 minutes of tolerated clock skew (each way)
NONCES_MAX_DEFAULT: Final = 100_000
SECRET_CHARS_MIN: Final = 8
HEADER_CHARS_MAX: Final = 1024
CREDENTIALS_FILE_BYTES_MAX: Final = 64 << 10
ENV_ACCESS_KEY: Final = "DLEDGER_ACCESS_KEY"
ENV_SECRET_KEY: Final = "DLEDGER_SECRET_KEY"
ENV_CREDENTIALS_FILE: Final = "DLEDGER_CREDENTIALS_FILE"

_HEADER_RE: Final = re.compile(
    SCHEME + r" AccessKey=([^,\s]{1,255}), Timestamp=([0-9]{1,15}), Nonce=([0-9a-f]{32}), "
    r"Signature=([A-Za-z0-9+/]{43}=)"
)


class AuthError(Exception):
    """A refused request: ``status`` 401 (who are you?) or 403 (not allowed), ``code`` for users."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


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
    timestamp_ms: int
    nonce: str
    signature: str


# -- signing (client side) -------------------------------------------------------------------------
def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def string_to_sign(access_key: str, timestamp_ms: int, nonce: str, method: str, target: str, digest: str) -> bytes:
    return "\n".join((SCHEME, access_key, str(timestamp_ms), nonce, method.upper(), target, digest)).encode(
        "utf-8", "surrogateescape"
    )


def signature(secret_key: str, message: bytes) -> str:
    mac = hmac.new(secret_key.encode("utf-8"), message, hashlib.sha256).digest()
    return base64.b64encode(mac).decode("ascii")


def new_nonce() -> str:
    return secrets.token_hex(16)


def authorization(
    creds: Credentials, method: str, target: str, body: bytes, timestamp_ms: int, nonce: str | None = None
) -> str:
    """The ``Authorization`` header value for one request (a fresh nonce unless given)."""
    nonce = nonce or new_nonce()
    msg = string_to_sign(creds.access_key, timestamp_ms, nonce, method, target, body_digest(body))
    return (
        f"{SCHEME} AccessKey={creds.access_key}, Timestamp={timestamp_ms}, Nonce={nonce}, "
        f"Signature={signature(creds.secret_key, msg)}"
    )


# -- verifying (server side) -----------------------------------------------------------------------
def parse_authorization(value: str | None) -> SignedHeader:
    if value is None or value == "":
        raise AuthError(401, "NO_CREDENTIALS", "this request must be signed (Authorization: DLEDGER-HMAC-SHA256 ...)")
    m = _HEADER_RE.fullmatch(value) if len(value) <= HEADER_CHARS_MAX else None
    if m is None:
        raise AuthError(401, "BAD_AUTHORIZATION", f"Authorization must be '{SCHEME} AccessKey=.., Timestamp=.., "
                        "Nonce=<32 hex>, Signature=<base64>'")
    return SignedHeader(m.group(1), int(m.group(2)), m.group(3), m.group(4))


class NonceWindow:
    """Nonces accepted in the last ``window_ms``, at most ``entries_max`` of them (see the module doc).
    Pure: time is passed in. One owner (the server's event loop)."""

    def __init__(self, window_ms: int = WINDOW_MS_DEFAULT, entries_max: int = NONCES_MAX_DEFAULT):
        assert window_ms > 0 and entries_max > 0
        self.window_ms = window_ms
        self.entries_max = entries_max
        self.floor_ms = -1  # requests stamped at or before this are refused (their nonce may be gone)
        self._seen: set[tuple[str, str]] = set()
        self._by_time: list[tuple[int, str, str]] = []  # heap of (timestamp, access key, nonce)
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, access_key: str, nonce: str, timestamp_ms: int, now_ms: int) -> None:
        """Accept the request once, or raise ``AuthError``."""
        if abs(now_ms - timestamp_ms) > self.window_ms:
            raise AuthError(
                401,
                "TIMESTAMP_OUT_OF_WINDOW",
                f"request time {timestamp_ms} is {now_ms - timestamp_ms:+d} ms from the server's clock "
                f"(window ±{self.window_ms} ms): check the client's clock",
            )
        while self._by_time and self._by_time[0][0] < now_ms - self.window_ms:
            _, ak, n = heapq.heappop(self._by_time)
            self._seen.discard((ak, n))
        key = (access_key, nonce)
        if key in self._seen:
            raise AuthError(401, "REPLAYED_REQUEST", "this signed request was already received (nonce reused)")
        if len(self._seen) >= self.entries_max:
            ts, ak, n = heapq.heappop(self._by_time)
            self._seen.discard((ak, n))
            self.floor_ms = max(self.floor_ms, ts)
            self.evicted += 1
        if timestamp_ms <= self.floor_ms:
            raise AuthError(401, "REQUEST_TOO_OLD", "the server saw too many requests since this one was signed: "
                            "sign it again")
        self._seen.add(key)
        heapq.heappush(self._by_time, (timestamp_ms, access_key, nonce))


class Verifier:
    """Authenticates signed requests against a secret lookup (access key -> secret or None)."""

    def __init__(self, secret_of: Callable[[str], str | None], nonces: NonceWindow | None = None):
        self._secret_of = secret_of
        self.nonces = nonces if nonces is not None else NonceWindow()

    def verify(self, header: str | None, method: str, target: str, body: bytes, now_ms: int) -> str:
        """The authenticated access key, or ``AuthError``."""
        signed = parse_authorization(header)
        secret = self._secret_of(signed.access_key)
        # One answer for an unknown key and a wrong signature: no oracle for which keys exist.
        expected = "" if secret is None else signature(
            secret, string_to_sign(signed.access_key, signed.timestamp_ms, signed.nonce, method, target,
                                   body_digest(body))
        )
        if secret is None or not hmac.compare_digest(expected, signed.signature):
            raise AuthError(401, "SIGNATURE_INVALID", "unknown access key or wrong signature")
        self.nonces.admit(signed.access_key, signed.nonce, signed.timestamp_ms, now_ms)
        return signed.access_key


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
