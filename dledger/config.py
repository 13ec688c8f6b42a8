"""RocketMQ-style properties files for a dledger node: parsing and validation (pure, no side effects).

A malformed or inconsistent file stops start-up with a ``ConfigError`` that names the key (and the
file, and the line where there is one). Unknown keys are errors too, with a "did you mean" hint:
a typo in ``flushDiskType`` must not silently leave a node on the wrong flush policy. Later
components (the broker) pass their own keys as ``extra_known_keys``.

Relative paths (``storePathRootDir``) are resolved against the current working directory.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,127}$")
PEER_ID_RE = re.compile(r"^[a-zA-Z0-9_]{1,64}$")
HOST_RE = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9.-]{0,251}[a-zA-Z0-9])?$")

DLEDGER_KEYS = frozenset(
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
        "preferredLeaderId",
        "fileReservedTime",
        "diskMaxUsedSpaceRatio",
        "diskSpaceWarningLevelRatio",
        "deleteWhen",
        "retentionCheckIntervalMs",
        "maxEntryBodyBytes",
        "listenPort",
        "brokerIP1",
    }
)


class ConfigError(ValueError):
    def __init__(self, key: str | None, message: str, source: str = "", line: int | None = None):
        self.key = key
        self.source = source
        self.line = line
        where = source + (f":{line}" if line is not None else "")
        prefix = f"{where}: " if where else ""
        subject = f"key {key!r}: " if key else ""
        super().__init__(f"{prefix}{subject}{message}")


@dataclass(frozen=True)
class Peer:
    id: str
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class DLedgerConfig:
    group: str
    peers: tuple[Peer, ...]
    self_id: str
    store_root: str
    flush_policy: str
    flush_interval_ms: int
    segment_bytes: int
    election_timeout_min_ms: int
    election_timeout_max_ms: int
    heartbeat_interval_ms: int
    leader_step_down_ms: int
    connection_timeout_ms: int
    connection_retry_ms: int
    peer_password: str
    preferred_leader_id: str | None
    file_reserved_hours: float
    disk_max_used_space_ratio: int
    disk_space_warning_level_ratio: int
    delete_when: str
    retention_check_interval_ms: int
    max_entry_body_bytes: int
    listen_port: int
    http_host: str
    source: str = ""

    @property
    def node_dir(self) -> str:
        """Where this node keeps its data: ``<storePathRootDir>/dledger-<selfId>``."""
        return f"{self.store_root.rstrip('/')}/dledger-{self.self_id}"

    @property
    def peer_by_id(self) -> dict[str, Peer]:
        return {p.id: p for p in self.peers}

    @property
    def self_peer(self) -> Peer:
        return self.peer_by_id[self.self_id]

    @property
    def other_peers(self) -> tuple[Peer, ...]:
        return tuple(p for p in self.peers if p.id != self.self_id)


def parse_properties(text: str, source: str = "<text>") -> dict[str, str]:
    """A Java ``.properties`` subset: ``key=value`` / ``key: value``, ``#``/``!`` comments."""
    props: dict[str, str] = {}
    lines_of: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        match = re.match(r"^([^=:\s]+)\s*[=:]\s*(.*)$", line)
        if match is None:
            raise ConfigError(None, f"expected 'key=value', got {line!r}", source, lineno)
        key, value = match.group(1), match.group(2).strip()
        if key in props:
            raise ConfigError(key, f"set twice (lines {lines_of[key]} and {lineno})", source, lineno)
        props[key] = value
        lines_of[key] = lineno
    return props


def load_properties(path: str) -> dict[str, str]:
    with open(path, encoding="utf-8") as f:
        return parse_properties(f.read(), path)


class _Reader:
    def __init__(self, props: Mapping[str, str], source: str):
        self.props = props
        self.source = source

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(key, message, self.source)

    def text(self, key: str, default: str | None = None) -> str:
        value = self.props.get(key)
        if value is None or value == "":
            if default is None:
                raise self.error(key, "is required")
            return default
        return value

    def integer(self, key: str, default: int, low: int, high: int) -> int:
        raw = self.props.get(key)
        if raw is None or raw == "":
            return default
        if not re.fullmatch(r"-?[0-9]+", raw):
            raise self.error(key, f"must be a decimal integer, got {raw!r}")
        value = int(raw)
        if not low <= value <= high:
            raise self.error(key, f"must be in {low}..{high}, got {value}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        raw = self.props.get(key)
        if raw is None or raw == "":
            return default
        if raw.lower() not in ("true", "false"):
            raise self.error(key, f"must be true or false, got {raw!r}")
        return raw.lower() == "true"


def parse_peers(raw: str, source: str = "") -> tuple[Peer, ...]:
    key = "dLegerPeers"
    peers: list[Peer] = []
    for item in raw.split(";"):
        item = item.strip()
        if not item:
            continue
        match = re.fullmatch(r"([^-\s]+)-([^:\s]+):([0-9]+)", item)
        if match is None:
            raise ConfigError(key, f"malformed entry {item!r} (expected id-host:port)", source)
        pid, host, port_s = match.groups()
        if not PEER_ID_RE.match(pid):
            raise ConfigError(key, f"peer id {pid!r} in {item!r} must be letters, digits or '_'", source)
        if not HOST_RE.match(host):
            raise ConfigError(key, f"bad host {host!r} in {item!r}", source)
        port = int(port_s)
        if not 1 <= port <= 65535:
            raise ConfigError(key, f"port {port} in {item!r} is not in 1..65535", source)
        peers.append(Peer(pid, host, port))
    if not peers:
        raise ConfigError(key, "lists no peers", source)
    ids = [p.id for p in peers]
    dup_ids = sorted({i for i in ids if ids.count(i) > 1})
    if dup_ids:
        raise ConfigError(key, f"duplicate peer id(s) {', '.join(dup_ids)}", source)
    addrs = [p.address for p in peers]
    dup_addrs = sorted({a for a in addrs if addrs.count(a) > 1})
    if dup_addrs:
        raise ConfigError(key, f"duplicate address(es) {', '.join(dup_addrs)}", source)
    return tuple(peers)


def parse_dledger_config(
    props: Mapping[str, str], *, source: str = "", extra_known_keys: frozenset[str] = frozenset()
) -> DLedgerConfig:
    known = DLEDGER_KEYS | extra_known_keys
    for key in props:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(key, f"unknown key{hint}", source)
    r = _Reader(props, source)
    group = r.text("dLegerGroup")
    if not NAME_RE.match(group):
        raise r.error("dLegerGroup", f"{group!r} must be 1..127 characters of [a-zA-Z0-9_-]")
    peers = parse_peers(r.text("dLegerPeers"), source)
    ids = {p.id for p in peers}
    self_id = r.text("dLegerSelfId")
    if self_id not in ids:
        raise r.error("dLegerSelfId", f"{self_id!r} is not one of the peers ({', '.join(sorted(ids))})")
    if not r.boolean("enableDLegerCommitLog", True):
        raise r.error(
            "enableDLegerCommitLog", "must be true: the Raft log is the only commit log this broker has"
        )
    flush_raw = r.text("flushDiskType", "SYNC_FLUSH")
    if flush_raw not in ("SYNC_FLUSH", "ASYNC_FLUSH"):
        raise r.error("flushDiskType", f"must be SYNC_FLUSH or ASYNC_FLUSH, got {flush_raw!r}")
    el_min = r.integer("dLegerElectionTimeoutMinMs", 300, 50, 60_000)
    el_max = r.integer("dLegerElectionTimeoutMaxMs", 600, 51, 120_000)
    if el_max <= el_min:
        raise r.error(
            "dLegerElectionTimeoutMaxMs", f"must be greater than dLegerElectionTimeoutMinMs ({el_min})"
        )
    heartbeat = r.integer("dLegerHeartbeatIntervalMs", 50, 5, 10_000)
    if heartbeat * 3 >= el_min:
        raise r.error(
            "dLegerHeartbeatIntervalMs", f"must be below a third of dLegerElectionTimeoutMinMs ({el_min})"
        )
    step_down = r.integer("dLegerLeaderStepDownMs", 1500, 100, 600_000)
    if step_down <= el_min:
        raise r.error("dLegerLeaderStepDownMs", f"must be greater than dLegerElectionTimeoutMinMs ({el_min})")
    password = r.text("dLegerPeerPassword")
    if len(password) < 8:
        raise r.error(
            "dLegerPeerPassword", "must be at least 8 characters (it authenticates every peer frame)"
        )
    preferred = props.get("preferredLeaderId") or None
    if preferred is not None and preferred not in ids:
        raise r.error("preferredLeaderId", f"{preferred!r} is not one of the peers")
    max_used = r.integer("diskMaxUsedSpaceRatio", 75, 10, 95)
    warning = r.integer("diskSpaceWarningLevelRatio", 90, 11, 99)
    if warning <= max_used:
        raise r.error(
            "diskSpaceWarningLevelRatio", f"must be greater than diskMaxUsedSpaceRatio ({max_used})"
        )
    delete_when = r.text("deleteWhen", "04")
    if not re.fullmatch(r"[0-9]{2}(;[0-9]{2})*", delete_when) or any(
        int(h) > 23 for h in delete_when.split(";")
    ):
        raise r.error("deleteWhen", f"must be hours like '04' or '04;16', got {delete_when!r}")
    reserved_raw = r.text("fileReservedTime", "72")
    try:
        reserved = float(reserved_raw)
    except ValueError:
        raise r.error("fileReservedTime", f"must be a number of hours, got {reserved_raw!r}") from None
    if not 0 <= reserved <= 24 * 3650:
        raise r.error("fileReservedTime", f"must be in 0..87600 hours, got {reserved}")
    self_host = next(p.host for p in peers if p.id == self_id)
    http_host = r.text("brokerIP1", self_host)
    if not HOST_RE.match(http_host):
        raise r.error("brokerIP1", f"bad host {http_host!r}")
    segment_bytes = r.integer("mappedFileSizeCommitLog", 1 << 30, 65536, 1 << 40)
    max_entry = r.integer("maxEntryBodyBytes", (4 << 20) + (64 << 10), 1024, 64 << 20)
    if max_entry + 64 > segment_bytes:
        raise r.error("mappedFileSizeCommitLog", f"must exceed maxEntryBodyBytes ({max_entry}) plus a header")
    return DLedgerConfig(
        group=group,
        peers=peers,
        self_id=self_id,
        store_root=r.text("storePathRootDir"),
        flush_policy="sync" if flush_raw == "SYNC_FLUSH" else "async",
        flush_interval_ms=r.integer("flushIntervalCommitLog", 10, 1, 10_000),
        segment_bytes=segment_bytes,
        election_timeout_min_ms=el_min,
        election_timeout_max_ms=el_max,
        heartbeat_interval_ms=heartbeat,
        leader_step_down_ms=step_down,
        connection_timeout_ms=r.integer("dLegerConnectionTimeoutMs", 1500, 100, 60_000),
        connection_retry_ms=r.integer("dLegerConnectionRetryMs", 300, 10, 60_000),
        peer_password=password,
        preferred_leader_id=preferred,
        file_reserved_hours=reserved,
        disk_max_used_space_ratio=max_used,
        disk_space_warning_level_ratio=warning,
        delete_when=delete_when,
        retention_check_interval_ms=r.integer("retentionCheckIntervalMs", 10_000, 10, 3_600_000),
        max_entry_body_bytes=max_entry,
        listen_port=r.integer("listenPort", 10911, 1, 65535),
        http_host=http_host,
        source=source,
    )


def load_dledger_config(
    path: str,
    extra_known_keys: frozenset[str] = frozenset(),
    overrides: Mapping[str, str] | None = None,
) -> DLedgerConfig:
    props: dict[str, Any] = load_properties(path)
    props.update(overrides or {})
    return parse_dledger_config(props, source=path, extra_known_keys=extra_known_keys)
