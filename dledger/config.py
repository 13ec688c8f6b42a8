"""A dledger node's configuration: RocketMQ-style ``.properties`` files, parsed and validated.

Pure functions over plain data; the only I/O is reading the file in ``load_properties`` /
``load_dledger_config``. Keys, meanings and defaults follow RocketMQ's DLedger mode
(``dLegerGroup``, ``dLegerPeers``, ``flushDiskType``, ...).

Invariants of a ``DLedgerConfig`` (checked once here, relied on everywhere else):
- peer ids and peer ``host:port`` pairs are unique, and ``self_id`` is one of the peers;
- heartbeat * 3 < election timeout min < election timeout max, and step-down > election timeout min;
- the largest entry body (plus framing) fits in one log segment;
- retention stops writes (``diskSpaceWarningLevelRatio``) only above where it starts cleaning
  (``diskMaxUsedSpaceRatio``).

Every failure is a ``ConfigError`` naming the key (or the line) and the file. Unknown keys are
errors with a "did you mean" hint: a typo in ``flushDiskType`` must not silently leave a node on
the wrong flush policy. The broker, which reads more keys from the same file, passes them as
``extra_known_keys``.

Relative paths (``storePathRootDir``) are kept as written, so they resolve against the working
directory of the process that uses them, not against the file's directory.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from dledger.records import RaftSettings

# Every key this module reads. A broker config adds its own through ``extra_known_keys``.
DLEDGER_KEYS: frozenset[str] = frozenset(
    {
        "dLegerGroup",
        "dLegerPeers",
        "dLegerSelfId",
        "storePathRootDir",
        "enableDLegerCommitLog",
        "flushDiskType",
        "flushIntervalCommitLog",
        "mappedFileSizeCommitLog",
        "dLegerElectionTimeoutMinMs",
        "dLegerElectionTimeoutMaxMs",
        "dLegerHeartbeatIntervalMs",
        "dLegerLeaderStepDownMs",
        "dLegerConnectionTimeoutMs",
        "dLegerConnectionRetryMs",
        "dLegerPeerPassword",
        "dLegerPeerPasswordPrevious",
        "preferredLeaderId",
        "fileReservedTime",
        "diskMaxUsedSpaceRatio",
        "diskSpaceWarningLevelRatio",
        "deleteWhen",
        "retentionCheckIntervalMs",
        "maxEntryBodyBytes",
        "listenPort",
        "brokerIP1",
        "dLegerPeerConnectAddrs",
        "clusterId",
        "dLegerLearner",
    }
)

GROUP_NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,127}")  # RocketMQ's name charset and length
CLUSTER_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # made by `dledger-cluster up`: 22 base64url chars
PEER_ID_RE = re.compile(r"[a-zA-Z0-9_]{1,64}")  # no '-': it separates the id from the host
_HOST_LABEL_RE = re.compile(r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?")
_DECIMAL_RE = re.compile(r"-?[0-9]+")  # ASCII digits only: int() would also take '1_000' or '١'

DEFAULT_SEGMENT_BYTES = 1 << 30
DEFAULT_MAX_ENTRY_BODY_BYTES = (4 << 20) + (64 << 10)  # a 4 MiB message plus room for its properties
# Room a segment must keep beyond the largest entry body: the entry header, the end-of-segment
# pad and the Raft command framing (all well under this).
ENTRY_FRAMING_BYTES_MAX = 1024
PASSWORD_CHARS_MIN = 8
# The peer passwords shipped in conf/ (samples): accepted only for a group whose every address is
# on loopback, i.e. the embedded local cluster (issue 10, finding 5).
SAMPLE_PASSWORDS: frozenset[str] = frozenset({"local-dev-only-change-me", "compose-dev-only-change-me"})


def is_loopback_host(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.IPv4Address(host).is_loopback
    except ValueError:
        return False

FlushPolicy = Literal["sync", "async"]


class ConfigError(ValueError):
    """An invalid configuration. ``key`` is None for errors of the file's syntax (see ``line``)."""

    code = "CONFIG_INVALID"

    def __init__(self, key: str | None, message: str, source: str = "", line: int | None = None):
        self.key = key
        self.message = message
        self.source = source
        self.line = line
        where = source + (f":{line}" if line is not None else "")
        parts = [p for p in (where, key, message) if p]
        super().__init__(": ".join(parts))


@dataclass(frozen=True, slots=True)
class Peer:
    """One member of the Raft group, as written in ``dLegerPeers`` (``id-host:port``)."""

    id: str
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.id}-{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class DLedgerConfig:
    group: str
    peers: tuple[Peer, ...]
    self_id: str
    store_path_root_dir: str
    flush_policy: FlushPolicy
    flush_interval_ms: int
    segment_bytes: int
    election_timeout_min_ms: int
    election_timeout_max_ms: int
    heartbeat_interval_ms: int
    leader_step_down_ms: int
    connection_timeout_ms: int
    connection_retry_ms: int
    peer_password: str = field(repr=False)
    preferred_leader_id: str | None
    file_reserved_hours: int
    disk_max_used_space_ratio: int  # percent
    disk_space_warning_level_ratio: int  # percent
    delete_when: str
    retention_check_interval_ms: int
    max_entry_body_bytes: int
    listen_port: int
    http_host: str
    source: str = field(default="", compare=False)
    # How this node reaches each peer's Raft port when that differs from dLegerPeers (e.g. through
    # a Toxiproxy proxy per link in chaos runs). Peers identify each other by their dLegerPeers
    # address whatever path the connection takes.
    peer_connect_addrs: dict[str, str] = field(default_factory=dict)
    # During a rolling change of the peer password: the old one, still accepted from peers that
    # have not switched yet (connections this node opens use peer_password).
    peer_password_previous: str | None = field(default=None, repr=False)
    # clusterId: which cluster this node belongs to (None: legacy, no id). See docs/OPERATIONS.md.
    cluster_id: str | None = None
    # dLegerLearner=true: this replica joins its group as a learner (issue 27, docs/OPERATIONS.md
    # "Replacing a replica"); once the group's log has a membership, the log decides.
    learner: bool = False

    @property
    def node_dir(self) -> str:
        """Where this node keeps its data: ``<storePathRootDir>/dledger-<selfId>``."""
        return os.path.join(self.store_path_root_dir, f"dledger-{self.self_id}")

    def peer_by_id(self, peer_id: str) -> Peer:
        for peer in self.peers:
            if peer.id == peer_id:
                return peer
        raise KeyError(f"no peer {peer_id!r} in group {self.group} ({', '.join(p.id for p in self.peers)})")

    @property
    def self_peer(self) -> Peer:
        return self.peer_by_id(self.self_id)

    @property
    def other_peers(self) -> tuple[Peer, ...]:
        return tuple(p for p in self.peers if p.id != self.self_id)

    @property
    def peer_addresses(self) -> dict[str, str]:
        """Peer id -> ``host:port`` of its Raft port, this node included."""
        return {p.id: p.address for p in self.peers}

    @property
    def delete_when_hours(self) -> tuple[int, ...]:
        """The hours of day of ``deleteWhen`` ("04;16" -> (4, 16))."""
        return tuple(int(h) for h in self.delete_when.split(";"))

# -- the properties file -----------------------------------------------------------------------
def parse_properties(text: str, source: str = "<text>") -> dict[str, str]:
    """A subset of Java ``.properties``: ``key=value`` or ``key: value`` (split at the first ``=``
    or ``:``), ``#``/``!`` comment lines, blank lines; keys and values trimmed. Not supported, and
    rejected rather than misread: line continuations, keys with whitespace, repeated keys."""
    props: dict[str, str] = {}
    line_of: dict[str, int] = {}
    for lineno, raw in enumerate(text.removeprefix("\ufeff").splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        if line.endswith("\\"):
            raise ConfigError(None, "line continuations ('\\' at the end) are not supported", source, lineno)
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut < 0:
            raise ConfigError(None, f"expected 'key=value' or 'key: value', got {line!r}", source, lineno)
        key, value = line[:cut].strip(), line[cut + 1 :].strip()
        if not key:
            raise ConfigError(None, f"missing key before {line[cut]!r}", source, lineno)
        if any(c.isspace() for c in key):
            raise ConfigError(None, f"key {key!r} contains whitespace", source, lineno)
        if key in props:
            raise ConfigError(key, f"set twice, on lines {line_of[key]} and {lineno}", source, lineno)
        props[key] = value
        line_of[key] = lineno
    return props


def load_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read and parse a properties file (UTF-8, BOM tolerated)."""
    with open(path, encoding="utf-8") as f:
        return parse_properties(f.read(), os.fspath(path))


# -- values --------------------------------------------------------------------------------------
def is_valid_host(host: str) -> bool:
    """An IPv4 literal or an RFC 1123 host name."""
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return False
        return True
    labels = host.split(".")
    if len(host) > 253 or labels[-1].isdigit():  # an all-numeric top label is a mistyped address
        return False
    return all(_HOST_LABEL_RE.fullmatch(label) for label in labels)


def parse_peers(raw: str, source: str = "") -> tuple[Peer, ...]:
    """``n0-127.0.0.1:40911;n1-127.0.0.1:40912``. A trailing ``;`` is tolerated (as in Java)."""
    key = "dLegerPeers"
    entries = [e.strip() for e in raw.split(";")]
    if entries and entries[-1] == "":
        entries.pop()
    if not any(entries):
        raise ConfigError(key, "is empty: list the group's peers as id-host:port;id-host:port;...", source)
    peers: list[Peer] = []
    for entry in entries:
        peer_id, dash, host_port = entry.partition("-")
        host, colon, port_raw = host_port.rpartition(":")
        if not (dash and colon and peer_id and host and port_raw):
            raise ConfigError(key, f"malformed entry {entry!r}: expected id-host:port", source)
        if not PEER_ID_RE.fullmatch(peer_id):
            raise ConfigError(key, f"entry {entry!r}: peer id must be 1..64 of [a-zA-Z0-9_]", source)
        if not is_valid_host(host):
            raise ConfigError(key, f"entry {entry!r}: {host!r} is not an IPv4 address or host name", source)
        if not re.fullmatch(r"[0-9]{1,5}", port_raw) or not 1 <= int(port_raw) <= 65535:
            raise ConfigError(key, f"entry {entry!r}: port must be in 1..65535", source)
        peers.append(Peer(peer_id, host, int(port_raw)))
    seen_ids: dict[str, Peer] = {}
    seen_addresses: dict[tuple[str, int], Peer] = {}
    for peer in peers:
        if peer.id in seen_ids:
            raise ConfigError(key, f"duplicate peer id {peer.id!r} ({seen_ids[peer.id]} and {peer})", source)
        address = (peer.host.lower(), peer.port)
        if address in seen_addresses:
            raise ConfigError(
                key, f"duplicate address {peer.address} ({seen_addresses[address]} and {peer})", source
            )
        seen_ids[peer.id] = peer
        seen_addresses[address] = peer
    return tuple(peers)


class PropertyReader:
    """Typed access to one mapping of properties; every error names the key and the source. Public:
    the broker's configuration (broker/server/config.py, broker/server/admin_config.py) is read through it too."""

    def __init__(self, props: Mapping[str, str], source: str):
        self.props = props
        self.source = source

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(key, message, self.source)

    def required(self, key: str) -> str:
        value = self.props.get(key, "")
        if value == "":
            raise self.error(
                key, "is required" if key not in self.props else "is required (the value is empty)"
            )
        return value

    def optional(self, key: str) -> str | None:
        """An optional string; an empty value counts as unset."""
        return self.props.get(key) or None

    def integer(self, key: str, default: int, low: int, high: int) -> int:
        raw = self.props.get(key)
        if raw is None:
            return default
        if not _DECIMAL_RE.fullmatch(raw):
            raise self.error(key, f"must be a decimal integer, got {raw!r}")
        value = int(raw)
        if not low <= value <= high:
            raise self.error(key, f"must be in {low}..{high}, got {value}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        raw = self.props.get(key)
        if raw is None:
            return default
        if raw.lower() not in ("true", "false"):
            raise self.error(key, f"must be true or false, got {raw!r}")
        return raw.lower() == "true"

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.props.get(key, default)
        if value not in choices:
            raise self.error(key, f"must be one of {', '.join(choices)}, got {value!r}")
        return value


def _check_known_keys(props: Mapping[str, str], known: frozenset[str], source: str) -> None:
    by_lower = {k.lower(): k for k in known}
    for key in props:
        if key in known:
            continue
        close = difflib.get_close_matches(key.lower(), by_lower, n=1, cutoff=0.75)
        hint = f" (did you mean {by_lower[close[0]]!r}?)" if close else ""
        raise ConfigError(key, f"unknown key{hint}", source)


# -- the node's configuration --------------------------------------------------------------------
def parse_dledger_config(
    props: Mapping[str, str], *, source: str, extra_known_keys: frozenset[str] = frozenset()
) -> DLedgerConfig:
    """Validate ``props`` (from ``load_properties``) into a ``DLedgerConfig``; ``source`` names the
    file in errors. Keys in ``extra_known_keys`` are allowed and ignored here."""
    _check_known_keys(props, DLEDGER_KEYS | extra_known_keys, source)
    r = PropertyReader(props, source)

    group = r.required("dLegerGroup")
    if not GROUP_NAME_RE.fullmatch(group):
        raise r.error("dLegerGroup", f"{group!r} must be 1..127 characters of [a-zA-Z0-9_-]")
    peers = parse_peers(r.required("dLegerPeers"), source)
    peer_ids = [p.id for p in peers]
    self_id = r.required("dLegerSelfId")
    if self_id not in peer_ids:
        raise r.error("dLegerSelfId", f"{self_id!r} is not one of the peers ({', '.join(peer_ids)})")
    self_peer = next(p for p in peers if p.id == self_id)
    store_root = r.required("storePathRootDir")

    if not r.boolean("enableDLegerCommitLog", True):
        raise r.error("enableDLegerCommitLog", "must be true: the Raft log is the only commit log here")
    flush_type = r.choice("flushDiskType", "SYNC_FLUSH", ("SYNC_FLUSH", "ASYNC_FLUSH"))
    flush_policy: FlushPolicy = "sync" if flush_type == "SYNC_FLUSH" else "async"

    election_min_ms = r.integer("dLegerElectionTimeoutMinMs", 300, 50, 60_000)
    election_max_ms = r.integer("dLegerElectionTimeoutMaxMs", 600, 51, 120_000)
    if election_max_ms <= election_min_ms:
        raise r.error(
            "dLegerElectionTimeoutMaxMs",
            f"{election_max_ms} must be greater than dLegerElectionTimeoutMinMs ({election_min_ms})",
        )
    heartbeat_ms = r.integer("dLegerHeartbeatIntervalMs", 50, 1, 20_000)
    if heartbeat_ms * 3 >= election_min_ms:
        raise r.error(
            "dLegerHeartbeatIntervalMs",
            f"{heartbeat_ms} must be less than a third of dLegerElectionTimeoutMinMs ({election_min_ms}): "
            "followers would start elections between heartbeats",
        )
    step_down_ms = r.integer("dLegerLeaderStepDownMs", 1000, 51, 600_000)
    if step_down_ms <= election_min_ms:
        raise r.error(
            "dLegerLeaderStepDownMs",
            f"{step_down_ms} must be greater than dLegerElectionTimeoutMinMs ({election_min_ms})",
        )

    password = r.required("dLegerPeerPassword")
    if len(password) < PASSWORD_CHARS_MIN:
        raise r.error(
            "dLegerPeerPassword",
            f"must be at least {PASSWORD_CHARS_MIN} characters (it authenticates every peer frame)",
        )
    if password in SAMPLE_PASSWORDS and not all(is_loopback_host(p.host) for p in peers):
        raise r.error(
            "dLegerPeerPassword",
            "is a sample password shipped in conf/ and everybody knows it: set your own (samples are accepted "
            "only when every peer is on loopback)",
        )
    previous = r.optional("dLegerPeerPasswordPrevious")
    if previous is not None and (len(previous) < PASSWORD_CHARS_MIN or previous == password):
        raise r.error(
            "dLegerPeerPasswordPrevious",
            f"must be at least {PASSWORD_CHARS_MIN} characters and differ from dLegerPeerPassword",
        )
    preferred = r.optional("preferredLeaderId")
    if preferred is not None and preferred not in peer_ids:
        raise r.error("preferredLeaderId", f"{preferred!r} is not one of the peers ({', '.join(peer_ids)})")

    max_used_pct = r.integer("diskMaxUsedSpaceRatio", 75, 10, 95)
    warning_pct = r.integer("diskSpaceWarningLevelRatio", 90, 11, 99)
    if warning_pct <= max_used_pct:
        raise r.error(
            "diskSpaceWarningLevelRatio",
            f"{warning_pct} must be greater than diskMaxUsedSpaceRatio ({max_used_pct})",
        )
    delete_when = props.get("deleteWhen", "04")
    if not all(re.fullmatch(r"[0-9]{1,2}", h) and int(h) <= 23 for h in delete_when.split(";")):
        raise r.error("deleteWhen", f"must be hours of the day like '04' or '04;16', got {delete_when!r}")

    segment_bytes = r.integer("mappedFileSizeCommitLog", DEFAULT_SEGMENT_BYTES, 65536, (1 << 31) - 1)
    max_entry_bytes = r.integer("maxEntryBodyBytes", DEFAULT_MAX_ENTRY_BODY_BYTES, 1024, 256 << 20)
    if max_entry_bytes + ENTRY_FRAMING_BYTES_MAX > segment_bytes:
        raise r.error(
            "maxEntryBodyBytes",
            f"{max_entry_bytes} plus {ENTRY_FRAMING_BYTES_MAX} bytes of framing does not fit in one "
            f"mappedFileSizeCommitLog segment ({segment_bytes})",
        )

    connect_addrs: dict[str, str] = {}
    for item in (r.optional("dLegerPeerConnectAddrs") or "").split(";"):
        if not item.strip():
            continue
        pid, sep, addr = item.strip().partition("-")
        host, sep2, port = addr.rpartition(":")
        if not sep or pid not in peer_ids or not sep2 or not is_valid_host(host) or not port.isdigit():
            raise r.error("dLegerPeerConnectAddrs", f"{item!r} must be <peer id>-<host>:<port> for a dLegerPeers id")
        if not 0 < int(port) < 65536:
            raise r.error("dLegerPeerConnectAddrs", f"port of {item!r} must be in 1..65535")
        connect_addrs[pid] = addr
    cluster_id = r.optional("clusterId")
    if cluster_id is not None and not CLUSTER_ID_RE.fullmatch(cluster_id):
        raise r.error("clusterId", f"{cluster_id[:80]!r} must be 1..64 characters of [A-Za-z0-9_-]")
    listen_port = r.integer("listenPort", 10911, 1, 65535)
    http_host = r.optional("brokerIP1") or self_peer.host
    if not is_valid_host(http_host):
        raise r.error("brokerIP1", f"{http_host!r} is not an IPv4 address or host name")
    for peer in peers:
        if peer.port == listen_port and http_host.lower() in (peer.host.lower(), "0.0.0.0"):
            raise r.error("listenPort", f"{listen_port} is the Raft port of peer {peer}")

    return DLedgerConfig(
        group=group,
        peers=peers,
        self_id=self_id,
        store_path_root_dir=store_root,
        flush_policy=flush_policy,
        flush_interval_ms=r.integer("flushIntervalCommitLog", 10, 1, 10_000),
        segment_bytes=segment_bytes,
        election_timeout_min_ms=election_min_ms,
        election_timeout_max_ms=election_max_ms,
        heartbeat_interval_ms=heartbeat_ms,
        leader_step_down_ms=step_down_ms,
        connection_timeout_ms=r.integer("dLegerConnectionTimeoutMs", 1500, 1, 60_000),
        connection_retry_ms=r.integer("dLegerConnectionRetryMs", 300, 1, 60_000),
        peer_password=password,
        peer_password_previous=previous,
        preferred_leader_id=preferred,
        # 0 keeps nothing beyond what replication and the consume queues still need.
        file_reserved_hours=r.integer("fileReservedTime", 72, 0, 24 * 3650),
        disk_max_used_space_ratio=max_used_pct,
        disk_space_warning_level_ratio=warning_pct,
        delete_when=delete_when,
        retention_check_interval_ms=r.integer("retentionCheckIntervalMs", 10_000, 100, 3_600_000),
        max_entry_body_bytes=max_entry_bytes,
        listen_port=listen_port,
        http_host=http_host,
        source=source,
        peer_connect_addrs=connect_addrs,
        cluster_id=cluster_id,
        learner=r.boolean("dLegerLearner", False),
    )


def load_dledger_config(
    path: str | os.PathLike[str],
    extra_known_keys: frozenset[str] = frozenset(),
    overrides: Mapping[str, str] | None = None,
) -> DLedgerConfig:
    """Read ``path`` and validate it; ``overrides`` (e.g. from a command line) replace file values."""
    props = load_properties(path)
    props.update(overrides or {})
    return parse_dledger_config(props, source=os.fspath(path), extra_known_keys=extra_known_keys)


def settings_from_config(cfg: DLedgerConfig) -> RaftSettings:
    """The replicated log's settings from a node or broker config."""
    return RaftSettings(
        group=cfg.group,
        self_id=cfg.self_id,
        peers={p.id: p.address for p in cfg.peers},
        data_dir=cfg.node_dir,
        password=cfg.peer_password,
        password_previous=cfg.peer_password_previous,
        cluster_id=cfg.cluster_id,
        learner=cfg.learner,
        flush_policy=cfg.flush_policy,
        flush_interval_ms=cfg.flush_interval_ms,
        segment_bytes=cfg.segment_bytes,
        election_min_ms=cfg.election_timeout_min_ms,
        election_max_ms=cfg.election_timeout_max_ms,
        heartbeat_ms=cfg.heartbeat_interval_ms,
        stepdown_ms=cfg.leader_step_down_ms,
        connection_timeout_ms=cfg.connection_timeout_ms,
        connection_retry_ms=cfg.connection_retry_ms,
        max_entry_bytes=cfg.max_entry_body_bytes,
        retention_hours=cfg.file_reserved_hours,
        disk_max_used_ratio=cfg.disk_max_used_space_ratio / 100,
        disk_warning_ratio=cfg.disk_space_warning_level_ratio / 100,
        retention_check_ms=cfg.retention_check_interval_ms,
        raft_addresses=(
            {p.id: cfg.peer_connect_addrs.get(p.id, p.address) for p in cfg.peers}
            if cfg.peer_connect_addrs
            else None
        ),
    )
