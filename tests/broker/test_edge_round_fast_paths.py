"""The broker's per-request work at one request in flight made cheaper (issue 26, one synchronous
sender): each fast path gives exactly what the plain code it replaced gives — the same decisions,
the same bytes, the same answers and errors."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from broker.protocol.auth import AuthError
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
            got = _outcome(lambda: acl.check(account, topics=topics, groups=groups, admin=admin))
            assert got == _outcome(_check_plain, account, topics, groups, admin)
            decided += got[0] == "refused"
    assert decided  # both outcomes were seen
