"""``conf/broker-nX.conf``: the broker's keys on top of the dledger keys (RocketMQ names).

| key | default | meaning |
|---|---|---|
| brokerClusterName | DefaultCluster | cluster the group registers under |
| brokerName | = dLegerGroup | must equal dLegerGroup (DLedger mode: one group = one broker name) |
| namesrvAddr | env NAMESRV_ADDR | `a:9876;b:9877`; every NameServer gets every registration |
| registerNameServerPeriod | 30000 | ms between periodic registrations (heartbeats) |
| autoCreateTopicEnable | true | a send to an unknown topic creates it (defaultTopicQueueNums queues) |
| defaultTopicQueueNums | 4 | read and write queues of an auto-created topic |
| traceTopicEnable | false | the group's leader creates msgTraceTopicName (1 queue) for message traces |
| msgTraceTopicName | RMQ_SYS_TRACE_TOPIC | the trace topic traceTopicEnable creates |
| maxMessageSize | 4194304 | body bytes of one message, and of a batch's bodies together |
| longPollingMaxMs | 30000 | longest hold a pull may ask for (suspend_ms) |
| clientExpiryMs | 40000 | a consumer silent this long leaves its group's member list |
| storeSnapshotIntervalMs | 1000 | how often consume queues and metadata reach disk (the apply checkpoint) |
| bindAddress | = brokerIP1 | address the client API binds (0.0.0.0 in containers); brokerIP1 is advertised |
| brokerAdvertisedPort | = listenPort | port advertised to NameServers and clients (a proxy's port in chaos runs) |
| stateEntryIntervalMs | 60000 | how often the leader logs its state (for followers behind retention) |
| messageDelayLevel | 1s 5s 10s 30s 1m 2m ... 30m 1h 2h | the 18 delay levels (`DELAY=N` picks the N-th) |
| timerMaxDelaySec | 259200 | how far ahead a deliver time may be (3 days) |
| remotingListenPort | = listenPort + 1 | binary protocol port (broker/edge/binary.py); 0 = any free port, -1 = off |
| remotingAdvertisedPort | = the bound remoting port | advertised to NameServers (routes' `remoting_addrs`); with a |
|  |  | brokerAdvertisedPort (a proxy in front) the remoting port is advertised only when this is set |
| remotingInFlightMax | 256 | requests handled at once per binary connection (reading stops at the cap) |
| brokerPeerClientAddrs | (none) | `n0-host:10911;n1-host:10921`: every peer's client address |
|  |  | (so a follower's NOT_LEADER names the leader's address) |
| aclEnable | false | true: every request but GET /v1/status is signed and checked (docs/SECURITY.md) |
| aclFile | (none) | the plain_acl.yml (required with aclEnable; reloaded when it changes) |
| brokerAccessKey, brokerSecretKey | (none) | the group's account at the NameServers (its `brokerNames`) |
| tlsEnable | false | true: serve HTTPS with tlsServerCertPath / tlsServerKeyPath |
| tlsClientTrustCertPath | (none) | CA file to verify HTTPS NameServers with (system CAs when unset) |
| namesrvTlsEnable | = tlsEnable | register with the NameServers over HTTPS |
| serverConnectionsMax | 1024 | client connections at most |
| serverHeaderTimeoutMs | 10000 | time a connection has to send a complete request head |
| serverIdleTimeoutMs | 60000 | an idle keep-alive connection is closed after this |
| serverBodyTimeoutMs | 30000 | time a request body has to arrive |
| serverBodyBytesInFlightMax | 268435456 | request bodies being read or handled, all together (503 BUSY beyond) |
| gcYoungThreshold | 10000 | the broker process's young-generation garbage-collection threshold (Python's |
|  |  | default is 700; see docs/PERFORMANCE.md, "Garbage collection") |
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from broker.protocol.auth import Credentials
from broker.protocol.limits import MESSAGE_BYTES_MAX
from broker.protocol.names import is_decimal, is_name, is_topic
from broker.store.schedule import DEFAULT_DELAY_LEVELS, DEFAULT_TIMER_MAX_DELAY_SEC, parse_delay_levels
from dledger.config import (
    ConfigError,
    DLedgerConfig,
    PropertyReader,
    is_valid_host,
    load_properties,
    parse_dledger_config,
)

BROKER_KEYS = frozenset(
    {
        "brokerClusterName",
        "brokerName",
        "namesrvAddr",
        "registerNameServerPeriod",
        "autoCreateTopicEnable",
        "defaultTopicQueueNums",
        "maxMessageSize",
        "longPollingMaxMs",
        "clientExpiryMs",
        "storeSnapshotIntervalMs",
        "stateEntryIntervalMs",
        "messageDelayLevel",
        "timerMaxDelaySec",
        "bindAddress",
        "brokerAdvertisedPort",
        "brokerPeerClientAddrs",
        "remotingListenPort",
        "remotingInFlightMax",
        "remotingAdvertisedPort",
        "brokerId",  # RocketMQ key; in DLedger mode the role decides the id, so it is ignored
        "brokerRole",  # likewise (ASYNC_MASTER/SLAVE are meaningless with Raft)
        "aclEnable",
        "aclFile",
        "brokerAccessKey",
        "brokerSecretKey",
        "tlsEnable",
        "tlsServerCertPath",
        "tlsServerKeyPath",
        "tlsClientTrustCertPath",
        "namesrvTlsEnable",
        "serverConnectionsMax",
        "serverHeaderTimeoutMs",
        "serverIdleTimeoutMs",
        "serverBodyTimeoutMs",
        "serverBodyBytesInFlightMax",
        "enablePropertyFilter",
        "duplicateWindowMessages",
        "duplicateWindowMs",
        "transactionTimeOut",
        "transactionCheckInterval",
        "transactionCheckMax",
        "traceTopicEnable",
        "gcYoungThreshold",
        "msgTraceTopicName",
    }
)


@dataclasses.dataclass(frozen=True)
class SecurityConfig:
    """ACL, the group's NameServer credentials, TLS and the HTTP edge's limits."""

    acl_file: str | None = None  # None: ACL off
    broker_credentials: Credentials | None = dataclasses.field(default=None, repr=False)
    tls_cert_file: str | None = None  # None: plain HTTP
    tls_key_file: str | None = None
    namesrv_tls: bool = False
    namesrv_ca_file: str | None = None
    connections_max: int = 1024
    header_timeout_ms: int = 10_000
    idle_timeout_ms: int = 60_000
    body_timeout_ms: int = 30_000
    body_bytes_in_flight_max: int = 256 << 20


@dataclasses.dataclass(frozen=True)
class BrokerConfig:
    dledger: DLedgerConfig
    cluster: str
    broker_name: str
    namesrv_addrs: tuple[str, ...]
    register_period_ms: int
    auto_create_topic: bool
    default_topic_queue_nums: int
    max_message_size: int
    long_polling_max_ms: int
    client_expiry_ms: int
    snapshot_interval_ms: int
    peer_client_addrs: dict[str, str]
    state_entry_interval_ms: int = 60_000
    message_delay_levels_ms: tuple[int, ...] = parse_delay_levels(DEFAULT_DELAY_LEVELS)
    timer_max_delay_sec: int = DEFAULT_TIMER_MAX_DELAY_SEC
    bind_address: str = ""
    advertised_port: int = 0
    security: SecurityConfig = dataclasses.field(default_factory=SecurityConfig)
    # SQL92 filters on pulls (RocketMQ's key; off by default there, on here).
    enable_property_filter: bool = True
    # The idempotent send window (broker/store/dedup.py): 0 messages turns de-duplication off.
    duplicate_window_messages: int = 100_000
    duplicate_window_ms: int = 120_000
    # Transactional messages (broker/store/transactions.py; RocketMQ's keys and defaults).
    transaction_timeout_ms: int = 6000
    transaction_check_interval_ms: int = 60_000
    transaction_check_max: int = 15
    # The binary protocol (broker/edge/binary.py): -1 off, 0 any free port.
    remoting_listen_port: int = -1
    remoting_in_flight_max: int = 256
    remoting_advertised_port: int | None = None  # None: the bound port (unless behind a proxy)
    # Message trace (RocketMQ's traceTopicEnable / msgTraceTopicName): the leader creates the topic.
    trace_topic_enable: bool = False
    msg_trace_topic_name: str = "RMQ_SYS_TRACE_TOPIC"
    gc_young_threshold: int = 10_000

    @property
    def address(self) -> str:
        """The client API address this broker advertises."""
        return f"{self.dledger.http_host}:{self.advertised_port or self.dledger.listen_port}"

    def remoting_address(self, bound_port: int) -> str | None:
        """The binary protocol's address to advertise, or None (off, or behind an HTTP proxy
        without ``remotingAdvertisedPort``: clients then keep to the proxied HTTP port)."""
        if self.remoting_listen_port < 0 or bound_port <= 0:
            return None
        if self.remoting_advertised_port is not None:
            return f"{self.dledger.http_host}:{self.remoting_advertised_port}"
        if self.advertised_port and self.advertised_port != self.dledger.listen_port:
            return None
        return f"{self.dledger.http_host}:{bound_port}"

    @property
    def bind_host(self) -> str:
        return self.bind_address or self.dledger.http_host

    @property
    def follower_broker_id(self) -> int:
        """RocketMQ's DLedger id for a non-leader: the peer's place in dLegerPeers + 1."""
        ids = [p.id for p in self.dledger.peers]
        return ids.index(self.dledger.self_id) + 1

    @property
    def store_dir(self) -> str:
        return os.path.join(self.dledger.node_dir, "broker")


def parse_broker_config(
    props: Mapping[str, str], *, source: str, env: Mapping[str, str] | None = None
) -> BrokerConfig:
    env = os.environ if env is None else env
    dl = parse_dledger_config(props, source=source, extra_known_keys=BROKER_KEYS)
    r = PropertyReader(props, source)
    cluster = r.optional("brokerClusterName") or "DefaultCluster"
    if not is_name(cluster):
        raise r.error("brokerClusterName", f"{cluster!r} must be 1..127 characters of [a-zA-Z0-9_-]")
    name = r.optional("brokerName") or dl.group
    if name != dl.group:
        raise r.error("brokerName", f"{name!r} must equal dLegerGroup ({dl.group!r}) in DLedger mode")
    raw_ns = r.optional("namesrvAddr") or env.get("NAMESRV_ADDR", "")
    addrs = tuple(a.strip() for a in raw_ns.replace(",", ";").split(";") if a.strip())
    if not addrs:
        raise ConfigError("namesrvAddr", "required (or set NAMESRV_ADDR): e.g. 127.0.0.1:9876;127.0.0.1:9877", source)
    for a in addrs:
        if not _is_host_port(a):
            raise r.error("namesrvAddr", f"{a!r} is not host:port")
    peer_ids = {p.id for p in dl.peers}
    client_addrs: dict[str, str] = {}
    for item in (r.optional("brokerPeerClientAddrs") or "").split(";"):
        if not item.strip():
            continue
        pid, sep, addr = item.strip().partition("-")
        if not sep or pid not in peer_ids or not _is_host_port(addr):
            raise r.error("brokerPeerClientAddrs", f"{item!r} must be <peer id>-<host>:<port> for a dLegerPeers id")
        client_addrs[pid] = addr
    return BrokerConfig(
        dledger=dl,
        cluster=cluster,
        broker_name=name,
        namesrv_addrs=addrs,
        register_period_ms=r.integer("registerNameServerPeriod", 30_000, 100, 600_000),
        auto_create_topic=r.boolean("autoCreateTopicEnable", True),
        default_topic_queue_nums=r.integer("defaultTopicQueueNums", 4, 1, 1024),
        max_message_size=r.integer("maxMessageSize", MESSAGE_BYTES_MAX, 1, 16 << 20),
        long_polling_max_ms=r.integer("longPollingMaxMs", 30_000, 0, 300_000),
        client_expiry_ms=r.integer("clientExpiryMs", 40_000, 1000, 3_600_000),
        snapshot_interval_ms=r.integer("storeSnapshotIntervalMs", 1000, 10, 600_000),
        peer_client_addrs=client_addrs,
        state_entry_interval_ms=r.integer("stateEntryIntervalMs", 60_000, 100, 86_400_000),
        message_delay_levels_ms=_delay_levels(r),
        timer_max_delay_sec=r.integer("timerMaxDelaySec", DEFAULT_TIMER_MAX_DELAY_SEC, 1, 365 * 86_400),
        bind_address=_bind_address(r),
        advertised_port=r.integer("brokerAdvertisedPort", dl.listen_port, 1, 65535),
        security=_security(r),
        enable_property_filter=r.boolean("enablePropertyFilter", True),
        duplicate_window_messages=r.integer("duplicateWindowMessages", 100_000, 0, 10_000_000),
        duplicate_window_ms=r.integer("duplicateWindowMs", 120_000, 1000, 86_400_000),
        transaction_timeout_ms=r.integer("transactionTimeOut", 6000, 0, 86_400_000),
        transaction_check_interval_ms=r.integer("transactionCheckInterval", 60_000, 10, 86_400_000),
        transaction_check_max=r.integer("transactionCheckMax", 15, 1, 10_000),
        remoting_listen_port=r.integer(
            "remotingListenPort", dl.listen_port + 1 if 0 < dl.listen_port < 65535 else 0, -1, 65535
        ),
        remoting_in_flight_max=r.integer("remotingInFlightMax", 256, 1, 65536),
        remoting_advertised_port=(
            r.integer("remotingAdvertisedPort", 0, 1, 65535) if r.optional("remotingAdvertisedPort") else None
        ),
        trace_topic_enable=r.boolean("traceTopicEnable", False),
        msg_trace_topic_name=_trace_topic(r),
        gc_young_threshold=r.integer("gcYoungThreshold", 10_000, 100, 1_000_000),
    )


def _trace_topic(r: PropertyReader) -> str:
    topic = r.optional("msgTraceTopicName") or "RMQ_SYS_TRACE_TOPIC"
    if not is_topic(topic):
        raise r.error("msgTraceTopicName", f"{topic[:140]!r} is not a valid topic name")
    return topic


def _delay_levels(r: PropertyReader) -> tuple[int, ...]:
    try:
        return parse_delay_levels(r.optional("messageDelayLevel") or DEFAULT_DELAY_LEVELS)
    except ValueError as exc:
        raise r.error("messageDelayLevel", str(exc)) from None


def _enabled_path(r: PropertyReader, flag: str, key: str) -> str | None:
    if not r.boolean(flag, False):
        return None
    path = r.optional(key)
    if path is None:
        raise r.error(key, f"is required when {flag}=true")
    return path


def _security(r: PropertyReader) -> SecurityConfig:
    ak, sk = r.optional("brokerAccessKey"), r.optional("brokerSecretKey")
    creds = None
    if ak or sk:
        if not (ak and sk):
            missing = "brokerSecretKey" if ak else "brokerAccessKey"
            raise r.error(missing, "set brokerAccessKey and brokerSecretKey together")
        try:
            creds = Credentials(ak, sk)
        except ValueError as exc:
            raise r.error("brokerAccessKey", str(exc)) from None
    tls_enable = r.boolean("tlsEnable", False)
    return SecurityConfig(
        acl_file=_enabled_path(r, "aclEnable", "aclFile"),
        broker_credentials=creds,
        tls_cert_file=_enabled_path(r, "tlsEnable", "tlsServerCertPath"),
        tls_key_file=_enabled_path(r, "tlsEnable", "tlsServerKeyPath"),
        namesrv_tls=r.boolean("namesrvTlsEnable", tls_enable),
        namesrv_ca_file=r.optional("tlsClientTrustCertPath"),
        connections_max=r.integer("serverConnectionsMax", 1024, 1, 1_000_000),
        header_timeout_ms=r.integer("serverHeaderTimeoutMs", 10_000, 100, 600_000),
        idle_timeout_ms=r.integer("serverIdleTimeoutMs", 60_000, 100, 3_600_000),
        body_timeout_ms=r.integer("serverBodyTimeoutMs", 30_000, 100, 600_000),
        body_bytes_in_flight_max=r.integer("serverBodyBytesInFlightMax", 256 << 20, 1 << 20, 1 << 40),
    )


def _bind_address(r: PropertyReader) -> str:
    value = r.optional("bindAddress") or ""
    if value and not is_valid_host(value):
        raise r.error("bindAddress", f"{value!r} is not an IPv4 address or host name")
    return value


def _is_host_port(value: str) -> bool:
    host, sep, port = value.rpartition(":")
    return bool(sep and host and is_decimal(port) and 0 < int(port) < 65536)


def load_broker_config(
    path: str | os.PathLike[str], overrides: Mapping[str, str] | None = None
) -> BrokerConfig:
    props = load_properties(path)
    props.update(overrides or {})
    cfg = parse_broker_config(props, source=os.fspath(path))
    if cfg.max_message_size + (64 << 10) > cfg.dledger.max_entry_body_bytes:
        raise ConfigError(
            "maxMessageSize",
            f"{cfg.max_message_size} plus 64 KiB of headers must fit in maxEntryBodyBytes "
            f"({cfg.dledger.max_entry_body_bytes})",
            os.fspath(path),
        )
    return cfg
