"""The one set of name rules shared by the broker, the NameServer and the SDK (RocketMQ's charsets).

Every rule is a *full* match of the whole string (``re.fullmatch``): ``re.match`` with a pattern
ending in ``$`` also accepts a trailing newline, and a topic named ``"Evil\\n"`` once got into the
Raft log, made every registration of its group fail at the NameServers and created a directory
with a newline in its name. Nothing here exports a compiled pattern, so no caller can use
``.match`` by mistake: callers ask the predicates.

| name | rule |
|---|---|
| topic | 1..127 of ``[%|a-zA-Z0-9_-]`` (``%RETRY%group``-style system topics included) |
| group (producer/consumer) | 1..120 of ``[%|a-zA-Z0-9_-]`` (``GROUP_CHARS_MAX``, below) |
| cluster, broker name | 1..127 of ``[a-zA-Z0-9_-]`` |
| unique id (message) | 1..64 of ``[0-9A-Za-z_-]`` |
| property name | 1..64 of ``[a-zA-Z0-9_.-]`` |
| client id | 1..255 printable ASCII characters, no space |
| access key (ACL) | 1..255 of ``[a-zA-Z0-9_.@-]`` |

Every accepted name is a safe single path component (no ``/``, no ``.`` alone, no control chars).

Groups are at most 120 characters (RocketMQ's ``GROUP_MAX_LENGTH`` since 5.3.2, for the same
reason): a group's retry and dead-letter topics, ``%RETRY%<group>`` and ``%DLQ%<group>``, are topics
and must fit the topic rule (127 - len("%RETRY%") = 120). Releases before issue 23 allowed 255, and
a send-back for a longer group made a topic no replica could apply (docs/SECURITY.md). Names those
releases may have stored (``is_stored_group``, ``is_stored_topic``: groups up to 255, retry and DLQ
topics of them up to 262) are accepted only to read or remove what a store holds — never to create.
"""

from __future__ import annotations

import re
from typing import Final

TOPIC_CHARS_MAX: Final = 127
GROUP_CHARS_MAX: Final = TOPIC_CHARS_MAX - len("%RETRY%")  # 120: the retry topic is a topic too
TOPIC_RULE: Final = "[%|a-zA-Z0-9_-]{1,127}"
GROUP_RULE: Final = "[%|a-zA-Z0-9_-]{1,120}"
STORED_GROUP_RULE: Final = "[%|a-zA-Z0-9_-]{1,255}"  # what releases before issue 23 let into a store
STORED_TOPIC_RULE: Final = "[%|a-zA-Z0-9_-]{1,262}"  # ... and the %RETRY% / %DLQ% topics of such groups
NAME_RULE: Final = "[a-zA-Z0-9_-]{1,127}"
UNIQUE_ID_RULE: Final = "[0-9A-Za-z_-]{1,64}"
PROPERTY_NAME_RULE: Final = "[a-zA-Z0-9_.-]{1,64}"
CLIENT_ID_RULE: Final = "[!-~]{1,255}"
ACCESS_KEY_RULE: Final = "[a-zA-Z0-9_.@-]{1,255}"

_TOPIC: Final = re.compile(TOPIC_RULE)
_GROUP: Final = re.compile(GROUP_RULE)
_STORED_GROUP: Final = re.compile(STORED_GROUP_RULE)
_STORED_TOPIC: Final = re.compile(STORED_TOPIC_RULE)
_NAME: Final = re.compile(NAME_RULE)
_UNIQUE_ID: Final = re.compile(UNIQUE_ID_RULE)
_PROPERTY_NAME: Final = re.compile(PROPERTY_NAME_RULE)
_CLIENT_ID: Final = re.compile(CLIENT_ID_RULE)
_ACCESS_KEY: Final = re.compile(ACCESS_KEY_RULE)
_HEX16: Final = re.compile("[0-9A-Fa-f]{16}")
_DECIMAL: Final = re.compile("[0-9]{1,19}")


def _full(pattern: re.Pattern[str], value: object) -> bool:
    return isinstance(value, str) and pattern.fullmatch(value) is not None


def is_topic(value: object) -> bool:
    return _full(_TOPIC, value)


def is_group(value: object) -> bool:
    return _full(_GROUP, value)


def is_stored_group(value: object) -> bool:
    """A group name an older release may have stored (up to 255 chars): read or removed, never created."""
    return _full(_STORED_GROUP, value)


def is_stored_topic(value: object) -> bool:
    """A topic name an older release may have stored (the retry or DLQ topic of a group of up to 255
    chars: up to 262): read or removed, never created."""
    return _full(_STORED_TOPIC, value)


def is_name(value: object) -> bool:
    """A cluster or broker (group) name."""
    return _full(_NAME, value)


def is_unique_id(value: object) -> bool:
    return _full(_UNIQUE_ID, value)


def is_property_name(value: object) -> bool:
    return _full(_PROPERTY_NAME, value)


def is_client_id(value: object) -> bool:
    return _full(_CLIENT_ID, value)


def is_access_key(value: object) -> bool:
    return _full(_ACCESS_KEY, value)


def is_hex16(value: object) -> bool:
    return _full(_HEX16, value)


def is_decimal(value: object) -> bool:
    """1..19 ASCII digits (``str.isdigit`` also accepts '²' and '١', which ``int()`` refuses or reads)."""
    return _full(_DECIMAL, value)
