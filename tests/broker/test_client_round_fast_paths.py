"""The client's per-send fast paths (issue 26, one synchronous sender) give what the slow paths give.

- ``Signer.sign``/``Signer.header`` make ``broker.protocol.auth.authorization``'s header byte for byte
  (the same HMAC, the fixed parts made once) and draw nonces like ``auth.new_nonce``.
"""

from __future__ import annotations

import os
import random
import re

import pytest

from broker.client.signer import NONCE_POOL_BYTES, Signer
from broker.protocol.auth import UNKNOWN_SCOPE, Credentials, authorization, parse_authorization

SEED = int(os.environ.get("TEST_SEED", random.randrange(1 << 30)))


@pytest.fixture
def rng() -> random.Random:
    print(f"seed {SEED}")
    return random.Random(SEED)


def test_the_signers_header_is_authorizations_byte_for_byte(rng: random.Random) -> None:
    for _ in range(200):
        creds = Credentials("ak" + str(rng.randrange(10**6)), "".join(rng.choice("abcXYZ019+/=é") for _ in range(40)))
        signer = Signer(creds)
        addr = f"127.0.0.{rng.randrange(1, 9)}:{rng.randrange(1024, 65536)}"
        scope = rng.choice([UNKNOWN_SCOPE, "RaftNode00-n1", "namesrv-0"])
        if scope != UNKNOWN_SCOPE:
            signer.learn_scope(addr, scope)
        method = rng.choice(["REMOTING", "POST", "get"])
        target = rng.choice(["SEND", "/v1/send", "/v1/routes/T%C3%A9?v=1", "PULL"])
        body = rng.randbytes(rng.randrange(0, 3000))
        ts = rng.randrange(1, 2**41)
        nonce = rng.randbytes(16).hex()
        assert signer.header(addr, method, target, body, ts, nonce) == authorization(
            creds, method, target, body, ts, nonce, scope=scope)


def test_sign_stamps_now_and_a_fresh_nonce_for_the_learnt_scope() -> None:
    creds = Credentials("bench", "s" * 32)
    signer = Signer(creds)
    signer.learn_scope("h:1", "RaftNode00-n1")
    nonces = set()
    for _ in range(NONCE_POOL_BYTES // 16 * 2 + 3):  # across refills of the pool
        value = signer.sign("h:1", "REMOTING", "SEND", b"body")
        assert value is not None
        head = parse_authorization(value)
        assert head.scope == "RaftNode00-n1" and re.fullmatch(r"[0-9a-f]{32}", head.nonce)
        assert value == signer.header("h:1", "REMOTING", "SEND", b"body", head.timestamp_ms, head.nonce)
        nonces.add(head.nonce)
    assert len(nonces) == NONCE_POOL_BYTES // 16 * 2 + 3
    assert Signer(None).sign("h:1", "REMOTING", "SEND", b"") is None
