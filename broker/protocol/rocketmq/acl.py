"""The signature of RocketMQ's ``AclClientRPCHook`` (ACL 1.0): compute it, verify it.

A signed request carries the ext fields ``AccessKey``, ``Signature`` and, optionally,
``SecurityToken``. The signed content is the values (not the names) of every ext field except
``Signature`` — the header's fields, ``AccessKey`` and ``SecurityToken`` included — in the order of
their names (Java ``String.compareTo``: UTF-16 code units), concatenated and UTF-8 encoded, followed
by the body's bytes. ``Signature`` = Base64(HMAC-SHA1(secret key, content)).

There is no timestamp or nonce: a captured request can be replayed for as long as the account
exists (docs/REMOTING.md; a server may refuse these signatures by policy).

One exception, as RocketMQ 5.x's servers apply it: clients up to 4.9.3 (``version`` <=
``VERSION_V4_9_3``) add ``_UNIQUE_KEY_QUERY`` to a QUERY_MESSAGE after signing, so the field is
left out of their content.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from typing import Final

from broker.protocol.rocketmq.command import VERSION_V4_9_3
from broker.protocol.rocketmq.headers import UNIQUE_MSG_QUERY_FLAG

ACCESS_KEY: Final = "AccessKey"
SIGNATURE: Final = "Signature"
SECURITY_TOKEN: Final = "SecurityToken"


def _java_order(name: str) -> bytes:
    return name.encode("utf-16-be", "surrogatepass")


def signature_content(ext_fields: Mapping[str, str], body: bytes | None, *,
                      skip: frozenset[str] = frozenset()) -> bytes:
    names = sorted((n for n in ext_fields if n != SIGNATURE and n not in skip), key=_java_order)
    text = "".join(ext_fields[n] for n in names).encode("utf-8", "replace")
    return text + body if body else text


def sign(ext_fields: Mapping[str, str], body: bytes | None, secret_key: str) -> str:
    """The ``Signature`` of a request with these ext fields (``AccessKey`` etc. already in) and body."""
    mac = hmac.new(secret_key.encode("utf-8"), signature_content(ext_fields, body), hashlib.sha1)
    return base64.b64encode(mac.digest()).decode("ascii")


def sign_request(ext_fields: Mapping[str, str], body: bytes | None, access_key: str, secret_key: str,
                 security_token: str | None = None) -> dict[str, str]:
    """The ext fields of the signed request: ``AccessKey``, ``SecurityToken`` and ``Signature`` added."""
    out = dict(ext_fields)
    out[ACCESS_KEY] = access_key
    if security_token is not None:
        out[SECURITY_TOKEN] = security_token
    out[SIGNATURE] = sign(out, body, secret_key)
    return out


def verify(ext_fields: Mapping[str, str], body: bytes | None, secret_key: str, *, version: int) -> bool:
    """Whether the request's ``Signature`` is the one ``secret_key`` gives (constant-time compare).
    The caller found ``secret_key`` by the request's ``AccessKey`` and checks permissions itself."""
    given = ext_fields.get(SIGNATURE)
    if not given:
        return False
    skip = frozenset({UNIQUE_MSG_QUERY_FLAG}) if version <= VERSION_V4_9_3 else frozenset()
    mac = hmac.new(secret_key.encode("utf-8"), signature_content(ext_fields, body, skip=skip), hashlib.sha1)
    expected = base64.b64encode(mac.digest())
    return hmac.compare_digest(expected, given.encode("utf-8", "replace"))
