"""The broker's per-request work at one request in flight made cheaper (issue 26, one synchronous
sender): each fast path gives exactly what the plain code it replaced gives — the same decisions,
the same bytes, the same answers and errors."""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import random
import threading
from typing import Any

import pytest

from broker.protocol import auth
from broker.protocol.auth import AuthError
from broker.protocol.frames import OPS, Op
from broker.serving import acl
from broker.serving.acl import Account, Perm

PERMS = [Perm.DENY, Perm.PUB, Perm.SUB, Perm.ANY]


def _check_plain(account: Account, topics: dict[str, Perm], groups: dict[str, Perm], admin: bool) -> None:
    """``acl.check`` as it was: the permissions compared with Perm's own operators."""
    if admin and not account.admin:
        raise AuthError(403, "NO_PERMISSION", f"{account.access_key!r} is not an admin account")
    for topic, need in topics.items():
        if need & ~acl.topic_perm(account, topic):
            raise AuthError(403, "NO_PERMISSION", f"{account.access_key!r} may not {acl._verb(need)} topic {topic!r}")
    for group, need in groups.items():
        if need & ~acl.group_perm(account, group):
            raise AuthError(403, "NO_PERMISSION", f"{account.access_key!r} may not {acl._verb(need)} group {group!r}")


def _check_fast(account: Account, topics: dict[str, Perm], groups: dict[str, Perm], admin: bool) -> None:
    acl.check(account, topics=topics, groups=groups, admin=admin)


def _outcome(f: Any, *args: Any) -> Any:
    try:
        return ("ok", f(*args))
    except AuthError as exc:
        return ("refused", exc.status, exc.code, exc.message)


@pytest.mark.parametrize("is_admin", [False, True])
def test_acl_check_decides_as_the_flag_operators_did(is_admin: bool) -> None:
    decided = 0
    for default_topic, default_group, listed_topic, listed_group in itertools.product(PERMS, PERMS, PERMS, PERMS):
        account = Account("ak", "secret-key-1", admin=is_admin, default_topic_perm=default_topic,
                          default_group_perm=default_group, topic_perms={"Listed": listed_topic},
                          group_perms={"G": listed_group})
        for topic, group, need_t, need_g, admin in itertools.product(
            ["Listed", "Other", "%RETRY%G", "%DLQ%H"], ["G", "H"], PERMS, PERMS, [False, True]
        ):
            topics, groups = {topic: need_t}, {group: need_g}
            got = _outcome(_check_fast, account, topics, groups, admin)
            assert got == _outcome(_check_plain, account, topics, groups, admin)
            decided += got[0] == "refused"
    assert decided  # both outcomes were seen


# -- signatures: HMAC-SHA256 from the secret's hashed pads ---------------------------------------------
def _signature_plain(secret_key: str, message: bytes) -> str:
    """``auth.signature`` as it was: a new HMAC keyed per call."""
    return base64.b64encode(hmac.new(secret_key.encode("utf-8"), message, hashlib.sha256).digest()).decode("ascii")


def test_signature_is_the_hmac_modules() -> None:
    seed = random.randrange(2**32)
    print("seed", seed)
    rnd = random.Random(seed)
    lengths = [0, 1, 8, 31, 32, 63, 64, 65, 100, 128, 129, 300]
    for _ in range(400):
        n = rnd.choice(lengths)
        secret = "".join(rnd.choice("aZ09-_é漢\x00") for _ in range(n))  # multi-byte: past 64 bytes sooner
        for _ in range(3):  # the same secret again: its pads are reused
            message = rnd.randbytes(rnd.choice([0, 1, 55, 56, 64, 300, 5000]))
            assert auth.signature(secret, message) == _signature_plain(secret, message)


def test_signature_of_a_secret_that_cannot_be_encoded_fails_as_before() -> None:
    with pytest.raises(UnicodeEncodeError):
        _signature_plain("bad\ud800secret", b"m")
    with pytest.raises(UnicodeEncodeError):
        auth.signature("bad\ud800secret", b"m")


def test_signature_from_many_threads_at_once() -> None:
    rnd = random.Random(11)
    cases = [(f"secret-{i % 3}-key", rnd.randbytes(200)) for i in range(300)]
    expected = [_signature_plain(s, m) for s, m in cases]
    bad: list[int] = []

    def run() -> None:
        for _ in range(5):
            bad.extend(i for i, (s, m) in enumerate(cases) if auth.signature(s, m) != expected[i])

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


# -- the edge's op lookup ---------------------------------------------------------------------------------
def test_ops_table_gives_what_op_gives() -> None:
    for n in [*range(-2, 70), 0xFFFF, 2**32]:
        try:
            expected: Op | None = Op(n)
        except ValueError:
            expected = None
        assert OPS.get(n) is expected
