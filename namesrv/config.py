"""The NameServer's configuration: a RocketMQ-style properties file (``conf/namesrv.conf``).

Keys (RocketMQ's names; all optional):

    listenPort=9876                     0 = any free port (the bound port is logged)
    bindAddress=127.0.0.1               IPv4 literal or host name to bind
    scanNotActiveBrokerInterval=10000   ms between scans for brokers that stopped heartbeating
    brokerChannelMaxIdleTime=120000     ms without a heartbeat before a broker is removed
                                        (a registration's own heartbeat_timeout_ms overrides it)
    aclEnable=false                     true: registrations, unregistrations and route deletions
                                        must be signed (docs/SECURITY.md)
    aclFile=                            plain_acl.yml (required with aclEnable): broker accounts
                                        (brokerNames) register their groups, admins delete routes
    tlsEnable=false                     true: serve HTTPS with the two files below
    tlsServerCertPath=                  PEM certificate chain of this NameServer
    tlsServerKeyPath=                   PEM private key (keep it 0600)
    tlsMode=enforcing                   with tlsEnable: enforcing = TLS only; permissive = plain
                                        connections too (RocketMQ's tls.server.mode)
    remotingAclV1=accept                with aclEnable: what RocketMQ's own clients' ACL 1.0
                                        signatures may do: accept | readonly | refuse (they have
                                        no nonce: a recorded request can be replayed)
    orderMessageEnable=false            routes carry orderTopicConf from the KV config
                                        ORDER_TOPIC_CONFIG (RocketMQ's key; updatable at run time)
    serverConnectionsMax=1024           open client connections at most (more are closed at once)
    serverHeaderTimeoutMs=10000         time a connection has to send a complete request head
    serverIdleTimeoutMs=60000           an idle keep-alive connection is closed after this
    serverBodyTimeoutMs=30000           time a request body has to arrive

Invariant: scanNotActiveBrokerInterval <= brokerChannelMaxIdleTime, so a dead broker leaves the
routes at most idle + interval after its last heartbeat. Every failure is a ``ConfigError`` naming
the key and the file; unknown keys are errors (with a "did you mean" hint), never ignored.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from dledger.config import ConfigError, is_valid_host, load_properties

NAMESRV_KEYS: Final = frozenset(
    {
        "listenPort",
        "bindAddress",
        "scanNotActiveBrokerInterval",
        "brokerChannelMaxIdleTime",
        "aclEnable",
        "aclFile",
        "tlsEnable",
        "tlsServerCertPath",
        "tlsServerKeyPath",
        "serverConnectionsMax",
        "serverHeaderTimeoutMs",
        "serverIdleTimeoutMs",
        "serverBodyTimeoutMs",
        "tlsMode",
        "remotingAclV1",
        "orderMessageEnable",
    }
)
TLS_MODES: Final = ("enforcing", "permissive")  # broker.serving.sniff.TlsMode's values
ACL_V1_POLICIES: Final = ("accept", "readonly", "refuse")  # broker.serving.remoting_acl.AclV1Policy's
_DECIMAL_RE: Final = re.compile(r"-?[0-9]+")  # ASCII only: int() would also take '1_000' or '١'


@dataclass(frozen=True, slots=True)
class NamesrvConfig:
    listen_port: int = 9876
    bind_address: str = "127.0.0.1"
    scan_not_active_broker_interval_ms: int = 10_000
    broker_channel_max_idle_time_ms: int = 120_000
    acl_file: str | None = None  # None: ACL off
    tls_cert_file: str | None = None  # None: plain HTTP
    tls_key_file: str | None = None
    connections_max: int = 1024
    header_timeout_ms: int = 10_000
    idle_timeout_ms: int = 60_000
    body_timeout_ms: int = 30_000
    tls_mode: str = "enforcing"
    remoting_acl_v1: str = "accept"
    order_message_enable: bool = False
    source: str = ""

    def as_properties(self) -> dict[str, Any]:
        """The effective settings under their file keys (for /v1/status)."""
        return {
            "listenPort": self.listen_port,
            "bindAddress": self.bind_address,
            "scanNotActiveBrokerInterval": self.scan_not_active_broker_interval_ms,
            "brokerChannelMaxIdleTime": self.broker_channel_max_idle_time_ms,
            "aclEnable": self.acl_file is not None,
            "aclFile": self.acl_file or "",
            "tlsEnable": self.tls_cert_file is not None,
            "serverConnectionsMax": self.connections_max,
            "serverHeaderTimeoutMs": self.header_timeout_ms,
            "serverIdleTimeoutMs": self.idle_timeout_ms,
            "serverBodyTimeoutMs": self.body_timeout_ms,
            "tlsMode": self.tls_mode,
            "remotingAclV1": self.remoting_acl_v1,
            "orderMessageEnable": self.order_message_enable,
        }


def _integer(props: Mapping[str, str], key: str, default: int, low: int, high: int, source: str) -> int:
    raw = props.get(key)
    if raw is None:
        return default
    if not _DECIMAL_RE.fullmatch(raw):
        raise ConfigError(key, f"must be a decimal integer, got {raw!r}", source)
    value = int(raw)
    if not low <= value <= high:
        raise ConfigError(key, f"must be in {low}..{high}, got {value}", source)
    return value


def _check_known_keys(props: Mapping[str, str], source: str) -> None:
    for key in props:
        if key not in NAMESRV_KEYS:
            close = difflib.get_close_matches(key, NAMESRV_KEYS, n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(key, f"unknown key{hint}", source)


def parse_namesrv_config(props: Mapping[str, str], source: str = "<properties>") -> NamesrvConfig:
    _check_known_keys(props, source)
    bind_address = props.get("bindAddress", "127.0.0.1")
    if not is_valid_host(bind_address):
        raise ConfigError(
            "bindAddress", f"must be an IPv4 address or host name, got {bind_address!r}", source
        )
    scan_ms = _integer(props, "scanNotActiveBrokerInterval", 10_000, 100, 3_600_000, source)
    idle_ms = _integer(props, "brokerChannelMaxIdleTime", 120_000, 1_000, 86_400_000, source)
    if scan_ms > idle_ms:
        raise ConfigError(
            "scanNotActiveBrokerInterval",
            f"({scan_ms} ms) must not exceed brokerChannelMaxIdleTime ({idle_ms} ms)",
            source,
        )
    acl_file = _enabled_path(props, "aclEnable", "aclFile", source)
    tls_cert = _enabled_path(props, "tlsEnable", "tlsServerCertPath", source)
    tls_key = _enabled_path(props, "tlsEnable", "tlsServerKeyPath", source)
    return NamesrvConfig(
        listen_port=_integer(props, "listenPort", 9876, 0, 65535, source),
        bind_address=bind_address,
        scan_not_active_broker_interval_ms=scan_ms,
        broker_channel_max_idle_time_ms=idle_ms,
        acl_file=acl_file,
        tls_cert_file=tls_cert,
        tls_key_file=tls_key,
        connections_max=_integer(props, "serverConnectionsMax", 1024, 1, 1_000_000, source),
        header_timeout_ms=_integer(props, "serverHeaderTimeoutMs", 10_000, 100, 600_000, source),
        idle_timeout_ms=_integer(props, "serverIdleTimeoutMs", 60_000, 100, 3_600_000, source),
        body_timeout_ms=_integer(props, "serverBodyTimeoutMs", 30_000, 100, 600_000, source),
        tls_mode=_choice(props, "tlsMode", TLS_MODES, source),
        remoting_acl_v1=_choice(props, "remotingAclV1", ACL_V1_POLICIES, source),
        order_message_enable=_boolean(props, "orderMessageEnable", source),
        source=source,
    )


def _choice(props: Mapping[str, str], key: str, choices: tuple[str, ...], source: str) -> str:
    """One of ``choices`` (the first is the default)."""
    raw = props.get(key, choices[0])
    if raw not in choices:
        raise ConfigError(key, f"must be one of {', '.join(choices)}, got {raw!r:.60}", source)
    return raw


def _boolean(props: Mapping[str, str], key: str, source: str) -> bool:
    raw = props.get(key, "false")
    if raw.lower() not in ("true", "false"):
        raise ConfigError(key, f"must be true or false, got {raw!r}", source)
    return raw.lower() == "true"


def _enabled_path(props: Mapping[str, str], flag: str, key: str, source: str) -> str | None:
    """The path under ``key`` when ``flag`` is true (then required), else None."""
    if not _boolean(props, flag, source):
        return None
    path = props.get(key, "")
    if not path:
        raise ConfigError(key, f"is required when {flag}=true", source)
    return path


def load_namesrv_config(path: str | os.PathLike[str]) -> NamesrvConfig:
    """Read and validate a file; raises ConfigError (or OSError when it cannot be read)."""
    return parse_namesrv_config(load_properties(path), os.fspath(path))
