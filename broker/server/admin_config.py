"""A broker's configuration as ``mqadmin getBrokerConfig`` shows it, and the few keys
``updateBrokerConfig`` may change on a running replica (docs/TOOLS.md).

``config_view``: every setting as ``key -> text``, broker keys under their property names
(``autoCreateTopicEnable``...), the dledger ones as ``dledger.<field>``; secrets (peer passwords,
account keys, TLS key paths) left out.

``update``: a new ``BrokerConfig`` with one hot key changed, checked with the same bounds as the
config file. Only keys read per request are hot; the change lives in the replica's memory until it
restarts (edit its config file to keep it)."""

from __future__ import annotations

import dataclasses
from typing import Any

from broker.server.config import BrokerConfig
from dledger.config import ConfigError, PropertyReader

# BrokerConfig field -> property name (broker/server/config.py parse_broker_config)
PROPERTY_OF = {
    "cluster": "brokerClusterName",
    "broker_name": "brokerName",
    "namesrv_addrs": "namesrvAddr",
    "register_period_ms": "registerNameServerPeriod",
    "auto_create_topic": "autoCreateTopicEnable",
    "default_topic_queue_nums": "defaultTopicQueueNums",
    "max_message_size": "maxMessageSize",
    "long_polling_max_ms": "longPollingMaxMs",
    "client_expiry_ms": "clientExpiryMs",
    "snapshot_interval_ms": "storeSnapshotIntervalMs",
    "peer_client_addrs": "brokerPeerClientAddrs",
    "state_entry_interval_ms": "stateEntryIntervalMs",
    "bind_address": "bindAddress",
    "advertised_port": "brokerAdvertisedPort",
    "remoting_listen_port": "remotingListenPort",
    "remoting_in_flight_max": "remotingInFlightMax",
    "remoting_advertised_port": "remotingAdvertisedPort",
}
# property -> (field, parse(reader)); the same bounds as parse_broker_config
HOT_KEYS = {
    "autoCreateTopicEnable": ("auto_create_topic", lambda r: r.boolean("autoCreateTopicEnable", True)),
    "defaultTopicQueueNums": ("default_topic_queue_nums", lambda r: r.integer("defaultTopicQueueNums", 4, 1, 1024)),
    "longPollingMaxMs": ("long_polling_max_ms", lambda r: r.integer("longPollingMaxMs", 30_000, 0, 300_000)),
}
_SECRET_WORDS = ("password", "secret", "credential", "key_file")


class NotUpdatable(ValueError):
    pass


def config_view(cfg: BrokerConfig) -> dict[str, str]:
    out: dict[str, str] = {}

    def walk(value: Any, key: str) -> None:
        if any(w in key.lower() for w in _SECRET_WORDS):
            return
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            for f in dataclasses.fields(value):
                walk(getattr(value, f.name), f"{key}.{f.name}" if key else f.name)
        elif isinstance(value, dict):
            out[key] = ";".join(f"{k}-{v}" for k, v in sorted(value.items()))
        elif isinstance(value, (list, tuple)):
            out[key] = ";".join(str(v) for v in value)
        else:
            out[key] = str(value).lower() if isinstance(value, bool) else str(value)

    for f in dataclasses.fields(cfg):
        walk(getattr(cfg, f.name), PROPERTY_OF.get(f.name, f.name))
    return out


def update(cfg: BrokerConfig, key: str, value: str) -> BrokerConfig:
    """Raises NotUpdatable (a key that cannot change at run time) or ConfigError (a bad value)."""
    hot = HOT_KEYS.get(key)
    if hot is None:
        raise NotUpdatable(
            f"{key[:80]!r} cannot change on a running broker (updatable: {', '.join(sorted(HOT_KEYS))}); "
            "edit the config file and restart the replica"
        )
    field, parse = hot
    parsed = parse(PropertyReader({key: value}, "updateBrokerConfig"))
    return dataclasses.replace(cfg, **{field: parsed})


__all__ = ["ConfigError", "NotUpdatable", "config_view", "update"]
