"""The NameServer's KV config (RocketMQ's ``KVConfigManager``): string values by namespace and key.

What the official tools keep here: ``mqadmin updateKvConfig`` / ``deleteKvConfig`` (any namespace),
``mqadmin updateOrderConf`` and ``updateTopic -o true`` (namespace ``ORDER_TOPIC_CONFIG``: per topic
``brokerName:queueNums;...``, which routes carry as ``orderTopicConf`` when ``orderMessageEnable=true``).

Pure: no I/O, no clock; one owner (the server's table task). Kept in memory only, like the routes:
a restarted NameServer starts empty, and the tools write every NameServer themselves (RocketMQ
persists kvConfig.json; we do not, see docs/NAMESRV.md).

Bounds (every input is network input): at most ``entries_max`` entries in all and
``namespaces_max`` namespaces; a namespace or key of at most ``name_bytes_max`` UTF-8 bytes, a value
of at most ``value_bytes_max``. Beyond them: ``KvConfigError`` (a coded error, nothing stored).
"""

from __future__ import annotations

from typing import Final

from broker.protocol.errors import ProtocolError

ORDER_TOPIC_CONFIG: Final = "ORDER_TOPIC_CONFIG"  # RocketMQ's NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG
ENTRIES_MAX_DEFAULT: Final = 100_000
NAMESPACES_MAX_DEFAULT: Final = 1_000
NAME_BYTES_MAX: Final = 255
VALUE_BYTES_MAX: Final = 64 << 10


class KvConfigError(ProtocolError):
    """``INVALID_KV`` (an empty or oversized namespace, key or value) or ``TABLE_FULL``."""


class KvConfigTable:
    def __init__(self, entries_max: int = ENTRIES_MAX_DEFAULT, namespaces_max: int = NAMESPACES_MAX_DEFAULT):
        assert entries_max > 0 and namespaces_max > 0
        self.entries_max = entries_max
        self.namespaces_max = namespaces_max
        self._spaces: dict[str, dict[str, str]] = {}
        self._entries = 0

    def put(self, namespace: str, key: str, value: str) -> bool:
        """Set a value; True when it is new or changed."""
        _check_name(namespace, "namespace")
        _check_name(key, "key")
        if len(value.encode("utf-8", "surrogatepass")) > VALUE_BYTES_MAX:
            raise KvConfigError("INVALID_KV", f"a value is at most {VALUE_BYTES_MAX} bytes")
        space = self._spaces.get(namespace)
        if space is None and len(self._spaces) >= self.namespaces_max:
            raise KvConfigError("TABLE_FULL", f"at most {self.namespaces_max} namespaces")
        if (space is None or key not in space) and self._entries >= self.entries_max:
            raise KvConfigError("TABLE_FULL", f"at most {self.entries_max} entries")
        space = self._spaces.setdefault(namespace, {})
        old = space.get(key)
        if old is None:
            self._entries += 1
        space[key] = value
        return old != value

    def get(self, namespace: str, key: str) -> str | None:
        space = self._spaces.get(namespace)
        return None if space is None else space.get(key)

    def delete(self, namespace: str, key: str) -> bool:
        space = self._spaces.get(namespace)
        if space is None or space.pop(key, None) is None:
            return False
        self._entries -= 1
        if not space:
            del self._spaces[namespace]
        return True

    def namespace(self, namespace: str) -> dict[str, str] | None:
        """A copy of one namespace's entries; None for a namespace with none."""
        space = self._spaces.get(namespace)
        return None if space is None else dict(space)

    def counts(self) -> dict[str, int]:
        return {"namespaces": len(self._spaces), "entries": self._entries}


def _check_name(name: str, what: str) -> None:
    if not name or len(name.encode("utf-8", "surrogatepass")) > NAME_BYTES_MAX:
        raise KvConfigError("INVALID_KV", f"a {what} is 1..{NAME_BYTES_MAX} bytes, got {len(name)} characters")
