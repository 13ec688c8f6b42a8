"""``Admin``'s argument checks (run before any request: a bad argument raises ``InvalidArgument``), the
msg id parser, URL path quoting, and ``answers_checked`` (an answer of the wrong shape becomes ``BAD_ANSWER``).
Shared with mqadmin, mq-bench and the trace query."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar
from urllib.parse import quote

from broker.client.admin_records import InvalidArgument
from broker.client.transport import ClientError
from broker.protocol.names import (
    GROUP_RULE,
    NAME_RULE,
    STORED_GROUP_RULE,
    STORED_TOPIC_RULE,
    TOPIC_RULE,
    is_decimal,
    is_group,
    is_name,
    is_stored_group,
    is_stored_topic,
    is_topic,
)

P = ParamSpec("P")
R = TypeVar("R")


# -- argument checks --------------------------------------------------------------------------------
def check_topic(topic: str) -> str:
    if not is_topic(topic):
        raise InvalidArgument("INVALID_TOPIC", f"topic {topic!r} must match {TOPIC_RULE}")
    return topic


def check_group(group: str) -> str:
    if not is_group(group):
        raise InvalidArgument("INVALID_GROUP", f"group {group!r} must match {GROUP_RULE}")
    return group


def check_stored_topic(topic: str) -> str:
    """A topic to remove: any valid topic, or a longer name an older release stored (issue 23)."""
    if not is_topic(topic) and not is_stored_topic(topic):
        raise InvalidArgument("INVALID_TOPIC", f"topic {topic!r} must match {TOPIC_RULE} (or {STORED_TOPIC_RULE})")
    return topic


def check_stored_group(group: str) -> str:
    """A group to remove: any valid group, or a longer name an older release stored (issue 23)."""
    if not is_group(group) and not is_stored_group(group):
        raise InvalidArgument("INVALID_GROUP", f"group {group!r} must match {GROUP_RULE} (or {STORED_GROUP_RULE})")
    return group


def check_name(name: str, what: str) -> str:
    if not is_name(name):
        code = "INVALID_CLUSTER_NAME" if what == "cluster" else "INVALID_BROKER_NAME"
        raise InvalidArgument(code, f"{what} name {name!r} must match {NAME_RULE}")
    return name


def check_addr(addr: str) -> str:
    host, sep, port = addr.rpartition(":") if isinstance(addr, str) else ("", "", "")
    if not sep or not host or not is_decimal(port) or not 0 < int(port) < 65536:
        raise InvalidArgument("INVALID_ADDRESS", f"broker address {addr!r} must be host:port")
    return addr


def check_range(value: int, what: str, lo: int, hi: int, code: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidArgument(code, f"{what} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def check_key(key: str) -> str:
    if not isinstance(key, str) or not 1 <= len(key) <= 255 or any(c.isspace() for c in key):
        raise InvalidArgument("INVALID_KEYS", f"key {key!r} must be 1..255 chars without whitespace")
    return key


def parse_msg_id(msg_id: str) -> tuple[str, int]:
    """``"<brokerName>:<16 hex digits>"`` → (broker name, log position)."""
    name, sep, hexpos = msg_id.rpartition(":") if isinstance(msg_id, str) else ("", "", "")
    if not sep or not is_name(name) or len(hexpos) != 16:
        raise InvalidArgument("INVALID_MSG_ID", f"msg id {msg_id!r} is not <brokerName>:<16 hex digits>")
    try:
        return name, int(hexpos, 16)
    except ValueError:
        raise InvalidArgument("INVALID_MSG_ID", f"msg id {msg_id!r} has a bad position") from None


def path_part(name: str) -> str:
    """``name`` quoted as one URL path segment (topic, group and client names in admin paths)."""
    return quote(name, safe="")


def answers_checked(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """An answer of the wrong shape (a broker of another version, a proxy's page) becomes a
    ``BAD_ANSWER`` ClientError instead of a KeyError deep in the parsing."""

    @functools.wraps(fn)
    async def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise ClientError("BAD_ANSWER", f"unexpected answer from the cluster: {exc!r}") from exc

    return checked
