"""Credentials and TLS of the ``dledger-mq`` data source: settled once on the driver, carried to
every task, put on every ``Transport`` the driver and the executors make.

- Credentials are ``broker.protocol.auth.Credentials`` (the SDK's): every request is signed with them
  (docs/SECURITY.md). ``None`` means unsigned — right for a cluster without ACL.
- TLS is a flag and, optionally, the PEM text of a CA (read on the driver from ``tlsCaFile`` or
  ``DLEDGER_TLS_CA_FILE``); each task builds its own ``ssl.SSLContext`` from it (contexts cannot
  be pickled). Without a CA the system's CAs are trusted (the SDK's ``client_ssl_context()``).

Why the driver settles both: executors may run on other machines, with neither the credentials
file nor the driver's environment. So a task never looks at its own environment: what the driver
resolved (explicit values, ``None`` included) is exactly what it uses.

``refusal`` turns a broker's 401/403 answer into an error that says what to do about it (which
options or environment variables give credentials, which permission is missing).
"""

from __future__ import annotations

import dataclasses
import ssl

from broker.client.transport import ClientError, Transport, client_ssl_context
from broker.protocol.auth import ENV_ACCESS_KEY, ENV_CREDENTIALS_FILE, ENV_SECRET_KEY, Credentials

AUTH_STATUSES = (401, 403)
CREDENTIALS_HINT = (
    "give the options accessKey and secretKey, or credentialsFile (else, where the driver runs, "
    f"{ENV_ACCESS_KEY} and {ENV_SECRET_KEY}, or {ENV_CREDENTIALS_FILE})"
)


class SourceAuthError(PermissionError):
    """The brokers refused the data source's credentials (or their absence); ``code`` is theirs."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclasses.dataclass(frozen=True)
class SourceSecurity:
    credentials: Credentials | None = None
    tls: bool = False
    ca_file: str | None = None  # where ``ca_pem`` was read (for messages only)
    ca_pem: str | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        assert self.tls or self.ca_pem is None, "a CA without TLS"

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        if self.ca_pem is None:
            return client_ssl_context()
        return ssl_context_from_pem(self.ca_pem)

    def transport(self, timeout_s: float) -> Transport:
        """A transport with exactly these credentials and TLS (never the environment's)."""
        return Transport(timeout_s, credentials=self.credentials, tls=self.ssl_context())


def ssl_context_from_pem(ca_pem: str) -> ssl.SSLContext:
    """The SDK's ``client_ssl_context(ca_file)`` for a CA given as text: verify servers against
    this CA only, TLS 1.2 at least. Raises ``ssl.SSLError`` for text without a certificate."""
    if "-----BEGIN CERTIFICATE-----" not in ca_pem:
        raise ssl.SSLError("no PEM certificate (-----BEGIN CERTIFICATE-----) in it")
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_pem)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2  # as client_ssl_context (a test compares them)
    return ctx


def is_refusal(exc: ClientError) -> bool:
    return exc.status in AUTH_STATUSES


def refusal(exc: ClientError, security: SourceSecurity, what: str) -> SourceAuthError:
    """What a 401/403 answer to ``what`` (e.g. "the status of topic T at RaftNode00") means for
    the user. The message keeps the broker's code, its message and the address."""
    who = f"accessKey {security.credentials.access_key!r}" if security.credentials else "no credentials"
    said = f"{exc.message} ({exc.addr})" if exc.addr else exc.message
    if exc.code == "NO_CREDENTIALS" or (security.credentials is None and exc.status == 401):
        hint = f"the brokers run with ACL and the data source has no credentials: {CREDENTIALS_HINT}"
    elif exc.code == "SIGNATURE_INVALID":
        hint = f"the cluster does not know {who}, or its secretKey is wrong"
    elif exc.code == "NO_PERMISSION":
        hint = f"{who} may not read this: the data source needs SUB on every topic it reads"
    elif exc.code == "TIMESTAMP_OUT_OF_WINDOW":
        hint = "the clocks of this machine and the brokers differ by more than the brokers allow"
    else:
        hint = f"refused for {who}"
    return SourceAuthError(exc.code, f"{what} was refused: {said}; {hint}")
