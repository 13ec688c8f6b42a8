"""dledger.config: properties parsing and DLedgerConfig validation (pure; files only in tmp_path)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from dledger.config import (
    DEFAULT_MAX_ENTRY_BODY_BYTES,
    DLEDGER_KEYS,
    ConfigError,
    DLedgerConfig,
    Peer,
    load_dledger_config,
    load_properties,
    parse_dledger_config,
    parse_properties,
    settings_from_config,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SOURCE = "test.conf"
PEERS = "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913"


def base_props(**changes: str | None) -> dict[str, str]:
    """A valid minimal config; ``changes`` set keys, ``None`` removes one."""
    props = {
        "dLegerGroup": "RaftNode00",
        "dLegerPeers": PEERS,
        "dLegerSelfId": "n0",
        "storePathRootDir": "./data/n0",
        "dLegerPeerPassword": "secret-123",
    }
    for key, value in changes.items():
        if value is None:
            props.pop(key, None)
        else:
            props[key] = value
    return props


def parse(props: dict[str, str], **kwargs: frozenset[str]) -> DLedgerConfig:
    return parse_dledger_config(props, source=SOURCE, **kwargs)


FULL_CONF = (
    "\ufeff# a full node config\n"
    "! Java-style comment\n"
    "\n"
    "  dLegerGroup = RaftNode07  \n"
    "dLegerPeers: a_1-10.0.0.1:40911;b_2-broker-b.example.com:40911;c_3-10.0.0.3:40911;\n"
    "dLegerSelfId=b_2\n"
    "storePathRootDir=/var/lib/dledger\n"
    "enableDLegerCommitLog=TRUE\n"
    "flushDiskType=ASYNC_FLUSH\n"
    "flushIntervalCommitLog=25\n"
    "mappedFileSizeCommitLog=268435456\n"
    "dLegerElectionTimeoutMinMs=1000\n"
    "dLegerElectionTimeoutMaxMs=2000\n"
    "dLegerHeartbeatIntervalMs=200\n"
    "dLegerLeaderStepDownMs=3000\n"
    "dLegerConnectionTimeoutMs=2500\n"
    "dLegerConnectionRetryMs=500\n"
    "dLegerPeerPassword=p@ss=word:with#chars\n"
    "dLegerPeerPasswordPrevious=the-old-peer-password\n"
    "preferredLeaderId=a_1\n"
    "fileReservedTime=48\n"
    "diskMaxUsedSpaceRatio=80\n"
    "diskSpaceWarningLevelRatio=85\n"
    "deleteWhen=04;16\n"
    "retentionCheckIntervalMs=5000\n"
    "maxEntryBodyBytes=1048576\n"
    "listenPort=10921\n"
    "brokerIP1=192.168.1.20\n"
    "dLegerPeerConnectAddrs=a_1-10.0.0.9:50000\n"
    "clusterId=Zq3_x-9AbCdEfGhIjKlMnO\n"
    "dLegerLearner=true\n"
)


# -- valid configs ---------------------------------------------------------------------------------
def test_full_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "node.conf"
    path.write_text(FULL_CONF, encoding="utf-8")
    cfg = load_dledger_config(path)
    assert cfg.group == "RaftNode07"
    assert cfg.peers == (
        Peer("a_1", "10.0.0.1", 40911),
        Peer("b_2", "broker-b.example.com", 40911),
        Peer("c_3", "10.0.0.3", 40911),
    )
    assert cfg.self_id == "b_2"
    assert cfg.self_peer == Peer("b_2", "broker-b.example.com", 40911)
    assert [p.id for p in cfg.other_peers] == ["a_1", "c_3"]
    assert cfg.peer_by_id("c_3").address == "10.0.0.3:40911"
    assert cfg.peer_addresses == {
        "a_1": "10.0.0.1:40911",
        "b_2": "broker-b.example.com:40911",
        "c_3": "10.0.0.3:40911",
    }
    assert cfg.node_dir == os.path.join("/var/lib/dledger", "dledger-b_2")
    assert cfg.flush_policy == "async"
    assert cfg.flush_interval_ms == 25
    assert cfg.segment_bytes == 256 << 20
    assert (cfg.election_timeout_min_ms, cfg.election_timeout_max_ms) == (1000, 2000)
    assert cfg.heartbeat_interval_ms == 200
    assert cfg.leader_step_down_ms == 3000
    assert (cfg.connection_timeout_ms, cfg.connection_retry_ms) == (2500, 500)
    assert cfg.peer_password == "p@ss=word:with#chars"  # only the first separator splits
    assert cfg.preferred_leader_id == "a_1"
    assert cfg.file_reserved_hours == 48
    assert (cfg.disk_max_used_space_ratio, cfg.disk_space_warning_level_ratio) == (80, 85)
    assert cfg.delete_when == "04;16"
    assert cfg.delete_when_hours == (4, 16)
    assert cfg.retention_check_interval_ms == 5000
    assert cfg.max_entry_body_bytes == 1 << 20
    assert (cfg.http_host, cfg.listen_port) == ("192.168.1.20", 10921)
    assert cfg.cluster_id == "Zq3_x-9AbCdEfGhIjKlMnO"
    assert cfg.learner and settings_from_config(cfg).learner
    assert cfg.source == str(path)
    # The password never shows up in logs of the config.
    assert "p@ss" not in repr(cfg)
    with pytest.raises(KeyError, match="nope"):
        cfg.peer_by_id("nope")


def test_defaults_follow_rocketmq() -> None:
    cfg = parse(base_props())
    assert cfg.flush_policy == "sync"
    assert cfg.flush_interval_ms == 10
    assert cfg.segment_bytes == 1 << 30
    assert (cfg.election_timeout_min_ms, cfg.election_timeout_max_ms) == (300, 600)
    assert cfg.heartbeat_interval_ms == 50
    assert cfg.leader_step_down_ms == 1000
    assert (cfg.connection_timeout_ms, cfg.connection_retry_ms) == (1500, 300)
    assert cfg.preferred_leader_id is None
    assert cfg.file_reserved_hours == 72
    assert (cfg.disk_max_used_space_ratio, cfg.disk_space_warning_level_ratio) == (75, 90)
    assert cfg.delete_when == "04"
    assert cfg.retention_check_interval_ms == 10_000
    assert cfg.max_entry_body_bytes == DEFAULT_MAX_ENTRY_BODY_BYTES == (4 << 20) + (64 << 10)
    assert cfg.listen_port == 10911
    assert cfg.http_host == "127.0.0.1"  # the host of this node's own dLegerPeers entry
    assert cfg.node_dir == os.path.join("./data/n0", "dledger-n0")


def test_config_is_frozen_and_compares_by_value() -> None:
    a = parse_dledger_config(base_props(), source="a.conf")
    b = parse_dledger_config(base_props(), source="b.conf")
    assert a == b
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.listen_port = 1  # type: ignore[misc]


def test_empty_optional_values_mean_unset() -> None:
    cfg = parse(base_props(preferredLeaderId="", brokerIP1=""))
    assert cfg.preferred_leader_id is None
    assert cfg.http_host == "127.0.0.1"


def test_single_node_group_is_allowed() -> None:
    cfg = parse(base_props(dLegerPeers="n0-localhost:40911"))
    assert cfg.other_peers == ()


def test_extra_known_keys_are_accepted() -> None:
    props = base_props(brokerClusterName="DefaultCluster", namesrvAddr="127.0.0.1:9876")
    with pytest.raises(ConfigError) as info:
        parse(props)
    assert info.value.key == "brokerClusterName"
    cfg = parse(props, extra_known_keys=frozenset({"brokerClusterName", "namesrvAddr"}))
    assert cfg.group == "RaftNode00"


def test_overrides_replace_file_values(tmp_path: Path) -> None:
    path = tmp_path / "n0.conf"
    path.write_text("".join(f"{k}={v}\n" for k, v in base_props().items()))
    cfg = load_dledger_config(path, overrides={"listenPort": "20911", "dLegerSelfId": "n1"})
    assert (cfg.listen_port, cfg.self_id) == (20911, "n1")
    with pytest.raises(ConfigError) as info:
        load_dledger_config(path, overrides={"listenPort": "many"})
    assert info.value.key == "listenPort"
    assert str(path) in str(info.value)


def test_round_trip_file_sets_every_known_key() -> None:
    assert set(parse_properties(FULL_CONF)) == DLEDGER_KEYS


# -- invalid configs: every failure names its key --------------------------------------------------
INVALID = [
    # (case id, changes to the valid base, key the error must name, fragment of the message)
    ("group-missing", {"dLegerGroup": None}, "dLegerGroup", "required"),
    ("group-empty", {"dLegerGroup": ""}, "dLegerGroup", "empty"),
    ("group-charset", {"dLegerGroup": "Raft Node"}, "dLegerGroup", "[a-zA-Z0-9_-]"),
    ("group-too-long", {"dLegerGroup": "g" * 128}, "dLegerGroup", "127"),
    ("peers-missing", {"dLegerPeers": None}, "dLegerPeers", "required"),
    ("peers-only-separator", {"dLegerPeers": ";"}, "dLegerPeers", "empty"),
    ("peers-no-id", {"dLegerPeers": "127.0.0.1:40911"}, "dLegerPeers", "'127.0.0.1:40911'"),
    ("peers-no-port", {"dLegerPeers": "n0-127.0.0.1"}, "dLegerPeers", "'n0-127.0.0.1'"),
    ("peers-empty-entry", {"dLegerPeers": "n0-127.0.0.1:1;;n1-127.0.0.1:2"}, "dLegerPeers", "malformed"),
    ("peers-bad-id", {"dLegerPeers": "n.0-127.0.0.1:40911"}, "dLegerPeers", "'n.0-127.0.0.1:40911'"),
    ("peers-dash-in-id", {"dLegerPeers": "n-0-127.0.0.1:40911"}, "dLegerPeers", "'n-0-127.0.0.1:40911'"),
    ("peers-bad-ipv4", {"dLegerPeers": "n0-300.0.0.1:40911"}, "dLegerPeers", "300.0.0.1"),
    ("peers-bad-hostname", {"dLegerPeers": "n0-bad_host:40911"}, "dLegerPeers", "bad_host"),
    ("peers-port-zero", {"dLegerPeers": "n0-127.0.0.1:0"}, "dLegerPeers", "1..65535"),
    ("peers-port-high", {"dLegerPeers": "n0-127.0.0.1:65536"}, "dLegerPeers", "1..65535"),
    ("peers-port-text", {"dLegerPeers": "n0-127.0.0.1:http"}, "dLegerPeers", "1..65535"),
    (
        "peers-duplicate-id",
        {"dLegerPeers": "n0-127.0.0.1:40911;n0-127.0.0.1:40912"},
        "dLegerPeers",
        "duplicate peer id 'n0'",
    ),
    (
        "peers-duplicate-address",
        {"dLegerPeers": "n0-Node-A:40911;n1-node-a:40911"},
        "dLegerPeers",
        "duplicate address",
    ),
    ("self-missing", {"dLegerSelfId": None}, "dLegerSelfId", "required"),
    ("self-not-a-peer", {"dLegerSelfId": "n3"}, "dLegerSelfId", "'n3' is not one of the peers"),
    ("store-missing", {"storePathRootDir": None}, "storePathRootDir", "required"),
    ("commitlog-false", {"enableDLegerCommitLog": "false"}, "enableDLegerCommitLog", "must be true"),
    ("commitlog-not-bool", {"enableDLegerCommitLog": "yes"}, "enableDLegerCommitLog", "'yes'"),
    ("flush-type", {"flushDiskType": "sync_flush"}, "flushDiskType", "SYNC_FLUSH"),
    ("flush-interval-zero", {"flushIntervalCommitLog": "0"}, "flushIntervalCommitLog", "1..10000"),
    ("flush-interval-high", {"flushIntervalCommitLog": "10001"}, "flushIntervalCommitLog", "1..10000"),
    ("flush-interval-unit", {"flushIntervalCommitLog": "10ms"}, "flushIntervalCommitLog", "'10ms'"),
    ("segment-small", {"mappedFileSizeCommitLog": "65535"}, "mappedFileSizeCommitLog", "65536"),
    ("segment-suffix", {"mappedFileSizeCommitLog": "1g"}, "mappedFileSizeCommitLog", "'1g'"),
    (
        "segment-underscore",
        {"mappedFileSizeCommitLog": "1_073_741_824"},
        "mappedFileSizeCommitLog",
        "decimal",
    ),
    ("segment-float", {"mappedFileSizeCommitLog": "1e9"}, "mappedFileSizeCommitLog", "'1e9'"),
    ("integer-empty", {"listenPort": ""}, "listenPort", "decimal"),
    ("integer-non-ascii", {"listenPort": "\u0661\u0660"}, "listenPort", "decimal"),
    (
        "election-max-not-above-min",
        {"dLegerElectionTimeoutMinMs": "600", "dLegerElectionTimeoutMaxMs": "600"},
        "dLegerElectionTimeoutMaxMs",
        "greater than",
    ),
    ("heartbeat-too-slow", {"dLegerHeartbeatIntervalMs": "100"}, "dLegerHeartbeatIntervalMs", "third"),
    ("step-down-too-short", {"dLegerLeaderStepDownMs": "300"}, "dLegerLeaderStepDownMs", "greater than"),
    ("connection-timeout", {"dLegerConnectionTimeoutMs": "0"}, "dLegerConnectionTimeoutMs", "1..60000"),
    ("connection-retry", {"dLegerConnectionRetryMs": "-1"}, "dLegerConnectionRetryMs", "-1"),
    ("password-missing", {"dLegerPeerPassword": None}, "dLegerPeerPassword", "required"),
    ("password-empty", {"dLegerPeerPassword": ""}, "dLegerPeerPassword", "required"),
    ("password-short", {"dLegerPeerPassword": "1234567"}, "dLegerPeerPassword", "8"),
    ("preferred-not-a-peer", {"preferredLeaderId": "n9"}, "preferredLeaderId", "'n9'"),
    ("reserved-negative", {"fileReservedTime": "-1"}, "fileReservedTime", "0..87600"),
    ("reserved-unit", {"fileReservedTime": "72h"}, "fileReservedTime", "'72h'"),
    ("disk-max-low", {"diskMaxUsedSpaceRatio": "9"}, "diskMaxUsedSpaceRatio", "10..95"),
    ("disk-max-high", {"diskMaxUsedSpaceRatio": "96"}, "diskMaxUsedSpaceRatio", "10..95"),
    (
        "disk-warning-not-above-max",
        {"diskMaxUsedSpaceRatio": "85", "diskSpaceWarningLevelRatio": "85"},
        "diskSpaceWarningLevelRatio",
        "greater than diskMaxUsedSpaceRatio",
    ),
    ("delete-when-hour", {"deleteWhen": "24"}, "deleteWhen", "'24'"),
    ("delete-when-text", {"deleteWhen": "4am"}, "deleteWhen", "'4am'"),
    ("retention-interval", {"retentionCheckIntervalMs": "10"}, "retentionCheckIntervalMs", "100.."),
    ("max-entry-unit", {"maxEntryBodyBytes": "4MiB"}, "maxEntryBodyBytes", "'4MiB'"),
    (
        "max-entry-exceeds-segment",
        {"mappedFileSizeCommitLog": "65536"},
        "maxEntryBodyBytes",
        "mappedFileSizeCommitLog",
    ),
    ("listen-port-zero", {"listenPort": "0"}, "listenPort", "1..65535"),
    ("listen-port-high", {"listenPort": "70000"}, "listenPort", "1..65535"),
    ("listen-port-is-raft-port", {"listenPort": "40912"}, "listenPort", "n1-127.0.0.1:40912"),
    ("broker-ip", {"brokerIP1": "256.1.1.1"}, "brokerIP1", "256.1.1.1"),
    ("unknown-key-typo", {"flushDiskTyp": "ASYNC_FLUSH"}, "flushDiskTyp", "did you mean 'flushDiskType'"),
    ("unknown-key-spelling", {"dLedgerSelfId": "n1"}, "dLedgerSelfId", "did you mean 'dLegerSelfId'"),
    ("unknown-key-case", {"listenport": "1"}, "listenport", "did you mean 'listenPort'"),
    ("unknown-key-no-hint", {"brokerClusterName": "x"}, "brokerClusterName", "unknown key"),
    # issue 26's io_uring flusher was removed, and its key with it: fdatasync runs on the flusher thread
    ("flusher-removed", {"dLegerFlusher": "thread"}, "dLegerFlusher", "unknown key"),
]


@pytest.mark.parametrize(
    ("changes", "key", "fragment"),
    [pytest.param(changes, key, fragment, id=case) for case, changes, key, fragment in INVALID],
)
def test_invalid_config_names_the_key(changes: dict[str, str | None], key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(base_props(**changes))
    err = info.value
    assert err.key == key
    assert key in str(err)
    assert SOURCE in str(err)
    assert fragment in str(err), str(err)


def test_valid_edge_values_pass() -> None:
    cfg = parse(
        base_props(
            dLegerPeers="n0-127.0.0.1:1;n1-127.0.0.1:65535;",  # trailing ';' as Java split allows
            dLegerGroup="g" * 127,
            dLegerElectionTimeoutMinMs="151",
            dLegerHeartbeatIntervalMs="50",
            dLegerLeaderStepDownMs="152",
            mappedFileSizeCommitLog="65536",
            maxEntryBodyBytes=str(65536 - 1024),
            diskMaxUsedSpaceRatio="95",
            diskSpaceWarningLevelRatio="96",
            deleteWhen="0;23",
            fileReservedTime="0",
            listenPort="40911",
            brokerIP1="10.1.2.3",  # the Raft port number on another host is fine
        )
    )
    assert cfg.peers[1].port == 65535
    assert cfg.delete_when_hours == (0, 23)


def test_error_str_names_key_and_source() -> None:
    err = ConfigError("listenPort", "must be in 1..65535, got 0", "conf/dledger-n0.conf")
    assert str(err) == "conf/dledger-n0.conf: listenPort: must be in 1..65535, got 0"
    line_err = ConfigError(None, "expected 'key=value'", "conf/x.conf", 7)
    assert str(line_err) == "conf/x.conf:7: expected 'key=value'"
    assert isinstance(err, ValueError)


# -- the properties syntax -------------------------------------------------------------------------
def test_properties_subset() -> None:
    text = "# comment\n   ! another comment\n\na=1\nb : two words \nc=x=y:z\nd:\ne = #not a comment\n"
    assert parse_properties(text) == {
        "a": "1",
        "b": "two words",
        "c": "x=y:z",
        "d": "",
        "e": "#not a comment",
    }


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        pytest.param("a=1\njust words\n", 2, "'just words'", id="no-separator"),
        pytest.param("a=1\n\n# c\n=value\n", 4, "missing key", id="empty-key"),
        pytest.param("a b=1\n", 1, "whitespace", id="key-with-space"),
        pytest.param("a=1\\\n  2\n", 1, "continuation", id="continuation"),
    ],
)
def test_properties_syntax_errors_name_the_line(text: str, line: int, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_properties(text, "f.conf")
    assert info.value.line == line
    assert f"f.conf:{line}:" in str(info.value)
    assert fragment in str(info.value)


def test_duplicate_key_names_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "dup.conf"
    path.write_text("listenPort=1\n# x\nlistenPort = 2\n")
    with pytest.raises(ConfigError) as info:
        load_properties(path)
    err = info.value
    assert err.key == "listenPort"
    assert err.line == 3
    assert "lines 1 and 3" in str(err)
    assert str(path) in str(err)


def test_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_dledger_config(tmp_path / "absent.conf")


# -- the shipped conf/ files -----------------------------------------------------------------------
def test_shipped_conf_files_parse() -> None:
    paths = sorted((REPO_ROOT / "conf").glob("dledger-*.conf"))
    assert paths, "conf/dledger-*.conf is missing"
    for path in paths:
        load_dledger_config(path)


def test_shipped_local_group_is_consistent() -> None:
    cfgs = [load_dledger_config(REPO_ROOT / "conf" / f"dledger-n{i}.conf") for i in range(3)]
    assert {c.group for c in cfgs} == {"RaftNode00"}
    assert len({c.peers for c in cfgs}) == 1
    assert len({c.peer_password for c in cfgs}) == 1
    assert [c.self_id for c in cfgs] == ["n0", "n1", "n2"]
    assert [c.self_peer.port for c in cfgs] == [40911, 40912, 40913]
    assert [c.listen_port for c in cfgs] == [10911, 10921, 10931]
    assert [c.node_dir for c in cfgs] == [os.path.join(f"./data/n{i}", f"dledger-n{i}") for i in range(3)]
    assert all(p.host == "127.0.0.1" for c in cfgs for p in c.peers)


def test_peer_connect_addrs_route_links_without_changing_identities(tmp_path: Path) -> None:
    from dledger.apps.node_server import settings_from_config

    base = (
        "dLegerGroup=G\ndLegerPeers=n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913\n"
        "dLegerSelfId=n0\nstorePathRootDir=/tmp/x\ndLegerPeerPassword=secret-123\n"
    )
    conf = tmp_path / "a.conf"
    conf.write_text(base + "dLegerPeerConnectAddrs=n1-127.0.0.1:50001;n2-127.0.0.1:50002\n")
    s = settings_from_config(load_dledger_config(conf))
    assert s.peers["n1"] == "127.0.0.1:40912"
    assert s.view() == {"n0": "127.0.0.1:40911", "n1": "127.0.0.1:50001", "n2": "127.0.0.1:50002"}
    for bad in ("n9-127.0.0.1:1", "n1-127.0.0.1", "n1-127.0.0.1:0", "n1:127.0.0.1:5"):
        conf.write_text(base + f"dLegerPeerConnectAddrs={bad}\n")
        with pytest.raises(ConfigError, match="dLegerPeerConnectAddrs"):
            load_dledger_config(conf)
