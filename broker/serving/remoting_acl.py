"""Who sent a remoting request, and what RocketMQ's ACL asks of each request code.

The official clients sign with ``AclClientRPCHook`` (ACL 1.0): ext fields ``AccessKey``, ``Signature``
and optionally ``SecurityToken``; the signature's bytes are ``broker.protocol.rocketmq.acl``'s. The
accounts are ours (``broker.serving.acl``: a ``plain_acl.yml``, the same file, accounts and permissions as our
own HMAC-SHA256 signatures), read through a callable so that a reloaded file takes effect at once.

``RemotingAuthenticator.authenticate`` (run by ``RemotingServer.dispatch`` before any handler):

    ACL off, or the peer is white-listed          -> everyone (``ALL``)
    no AccessKey: the route is anonymous           -> nobody in particular (``NOBODY``: reads only)
                  otherwise                        -> refused  NO_CREDENTIALS
    AccessKey, but the operator refuses ACL 1.0    -> refused  ACL_V1_REFUSED   (``remotingAclV1``)
    unknown AccessKey or a wrong Signature         -> refused  SIGNATURE_INVALID
    else                                           -> the account (handlers check its permissions)

A refusal is an ``AuthError``; the server answers it NO_PERMISSION (16) with ``CODE: message`` as
remark (as RocketMQ 5.3's authorization answers; RocketMQ's ACL 1.0 check, 4.9.x and 5.x, answers
SYSTEM_ERROR with the exception's text; clients treat both as a failure, producers retry both).

ACL 1.0 has no timestamp and no nonce: a recorded request verifies again for as long as the account
exists. ``AclV1Policy`` lets an operator refuse those signatures on requests that change state
(``readonly``) or altogether (``refuse``); docs/SECURITY.md ("ACL 1.0: RocketMQ's own clients").

``needs_of(code, ext, body)`` is RocketMQ's ``PlainAccessValidator.parse`` + ``Permission.ADMIN_CODE``
mapped onto our ``Perm`` model: which topics and groups a request needs which permission on, and
whether it needs an admin account. A retry topic ``%RETRY%g`` is asked as group ``g`` (our model checks
retry and DLQ topics as their group, RocketMQ asks SUB on the retry topic). Stricter than 4.9.8 where
it left holes: SEND_BATCH_MESSAGE needs PUB like a single send, LITE_PULL_MESSAGE what a pull needs,
QUERY_CONSUMER_OFFSET what UPDATE_CONSUMER_OFFSET needs.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Final

from broker.protocol.auth import AuthError
from broker.protocol.rocketmq import acl as rmq_acl
from broker.protocol.rocketmq import bodies
from broker.protocol.rocketmq.codes import RequestCode
from broker.protocol.rocketmq.command import RemotingCommand
from broker.serving.acl import RETRY_PREFIX, AclConfig, Perm
from broker.serving.remoting_server import Authenticator, Route
from broker.serving.security import ALL, NOBODY, Principal


class AclV1Policy(enum.Enum):
    """``remotingAclV1``: what an ``AclClientRPCHook`` signature may do on this server."""

    ACCEPT = "accept"  # every request (the default: official clients with ACL work unchanged)
    READONLY = "readonly"  # requests that change nothing; state-changing ones are refused
    REFUSE = "refuse"  # none: only anonymous reads (NameServer) and white-listed addresses remain


ACL_V1_POLICIES: Final = tuple(p.value for p in AclV1Policy)


class RemotingAuthenticator(Authenticator):
    """Checks a request's ACL 1.0 signature against ``acl()`` (None: ACL off)."""

    def __init__(self, acl: Callable[[], AclConfig | None], policy: AclV1Policy = AclV1Policy.ACCEPT):
        self._acl = acl
        self.policy = policy
        self.refused: dict[str, int] = {}

    def authenticate(self, cmd: RemotingCommand, peer: str, route: Route) -> Principal:
        acl = self._acl()
        if acl is None or acl.white_listed(peer):
            return ALL
        ext = cmd.ext_fields or {}
        access_key = ext.get(rmq_acl.ACCESS_KEY)
        if not access_key:
            if route.anonymous:
                return NOBODY
            raise self._refuse(401, "NO_CREDENTIALS", "this request must be signed (ACL is enabled): "
                               "give the client an AclClientRPCHook with an account of this cluster")
        if self.policy is AclV1Policy.REFUSE or (self.policy is AclV1Policy.READONLY and route.writes):
            which = "altogether" if self.policy is AclV1Policy.REFUSE else "on requests that change state"
            raise self._refuse(403, "ACL_V1_REFUSED", f"this server refuses ACL 1.0 signatures {which} "
                               f"(remotingAclV1={self.policy.value}): they can be replayed")
        account = acl.accounts.get(access_key)
        if account is None or not rmq_acl.verify(ext, cmd.body, account.secret_key, version=cmd.version):
            raise self._refuse(401, "SIGNATURE_INVALID", "unknown access key or wrong signature")
        return Principal(account)

    def _refuse(self, status: int, code: str, message: str) -> AuthError:
        self.refused[code] = self.refused.get(code, 0) + 1
        return AuthError(status, code, message)


# -- what each request code needs (RocketMQ's PlainAccessValidator, on our Perm model) -------------------
ADMIN_CODES: Final = frozenset({
    RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.UPDATE_BROKER_CONFIG, RequestCode.DELETE_TOPIC_IN_BROKER,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, RequestCode.DELETE_SUBSCRIPTIONGROUP,
})
"""``Permission.ADMIN_CODE``: an admin account only."""


@dataclasses.dataclass(frozen=True, slots=True)
class Needs:
    """Permissions a request needs; names the request leaves empty are not asked for (a producer's
    UNREGISTER_CLIENT names no consumer group)."""

    topics: tuple[tuple[str, Perm], ...] = ()
    groups: tuple[tuple[str, Perm], ...] = ()
    admin: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", tuple(p for p in self.topics if p[0]))
        object.__setattr__(self, "groups", tuple(p for p in self.groups if p[0]))

    def topic_map(self) -> dict[str, Perm]:
        return _merge(self.topics)

    def group_map(self) -> dict[str, Perm]:
        return _merge(self.groups)


def _merge(pairs: tuple[tuple[str, Perm], ...]) -> dict[str, Perm]:
    out: dict[str, Perm] = {}
    for name, perm in pairs:
        out[name] = out.get(name, Perm.DENY) | perm
    return out


def needs_of(code: int, ext: Mapping[str, str] | None, body: bytes = b"") -> Needs:
    """What RocketMQ's ACL asks of a request with ``code``: every other code needs a valid signature
    only. Reads the HEART_BEAT body (``RemotingError`` if it is not one)."""
    ext = ext or {}
    sub, pub = Perm.SUB, Perm.PUB
    if code in ADMIN_CODES:
        return Needs(admin=True)
    if code in (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        v2 = code != RequestCode.SEND_MESSAGE
        topic, group = ext.get("b" if v2 else "topic", ""), ext.get("a" if v2 else "producerGroup", "")
        if topic.startswith(RETRY_PREFIX):  # a consumer sending a message back: its group's retry topic
            return Needs(groups=((group, sub),))
        return Needs(topics=((topic, pub),))
    if code == RequestCode.CONSUMER_SEND_MSG_BACK:
        return Needs(groups=((ext.get("group", ""), sub),))
    if code in (RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE):
        return Needs(topics=((ext.get("topic", ""), sub),), groups=((ext.get("consumerGroup", ""), sub),))
    if code == RequestCode.QUERY_MESSAGE:
        return Needs(topics=((ext.get("topic", ""), sub),))
    if code == RequestCode.HEART_BEAT:
        beat = bodies.decode(bodies.HeartbeatData, body)
        groups = tuple((c.group_name, sub) for c in beat.consumer_data_set)
        topics = tuple((s.topic, sub) for c in beat.consumer_data_set for s in c.subscription_data_set)
        return Needs(topics=topics, groups=groups)
    if code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        return Needs(groups=((ext.get("consumerGroup", ""), sub),))
    if code in (RequestCode.UPDATE_CONSUMER_OFFSET, RequestCode.QUERY_CONSUMER_OFFSET):
        return Needs(topics=((ext.get("topic", ""), sub),), groups=((ext.get("consumerGroup", ""), sub),))
    return Needs()
