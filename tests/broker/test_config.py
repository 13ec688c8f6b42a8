"""conf/broker-nX.conf: the broker's keys on top of the dledger keys."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.server.config import BrokerConfig, load_broker_config, parse_broker_config
from dledger.config import ConfigError, parse_properties

REPO = Path(__file__).resolve().parents[2]
BASE = {
    "dLegerGroup": "RaftNode00",
    "dLegerPeers": "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913",
    "dLegerSelfId": "n1",
    "dLegerPeerPassword": "secret-123",
    "storePathRootDir": "/tmp/x",
    "namesrvAddr": "127.0.0.1:9876;127.0.0.1:9877",
    "listenPort": "10921",
}


def parse(**changes: str) -> BrokerConfig:
    return parse_broker_config({**BASE, **changes}, source="<t>", env={})


def test_shipped_configs_load() -> None:
    for i in range(3):
        cfg = load_broker_config(REPO / "conf" / f"broker-n{i}.conf")
        assert cfg.broker_name == "RaftNode00" and cfg.namesrv_addrs == ("127.0.0.1:9876", "127.0.0.1:9877")
        assert cfg.address == f"127.0.0.1:{10911 + 10 * i}"
        assert cfg.follower_broker_id == i + 1
        assert set(cfg.peer_client_addrs) == {"n0", "n1", "n2"}


def test_defaults_and_overrides() -> None:
    cfg = parse()
    assert cfg.cluster == "DefaultCluster" and cfg.auto_create_topic and cfg.max_message_size == 4 << 20
    assert cfg.address == "127.0.0.1:10921" and cfg.bind_host == "127.0.0.1"
    cfg = parse(bindAddress="0.0.0.0", brokerAdvertisedPort="20921", brokerIP1="127.0.0.1")
    assert cfg.bind_host == "0.0.0.0" and cfg.address == "127.0.0.1:20921"
    with pytest.raises(ConfigError, match="namesrvAddr"):
        parse_broker_config({k: v for k, v in BASE.items() if k != "namesrvAddr"}, source="<t>", env={})
    env_cfg = parse_broker_config(
        {k: v for k, v in BASE.items() if k != "namesrvAddr"}, source="<t>", env={"NAMESRV_ADDR": "h:1"}
    )
    assert env_cfg.namesrv_addrs == ("h:1",)
    assert parse().gc_young_threshold == 10_000 and parse(gcYoungThreshold="50000").gc_young_threshold == 50_000


def test_the_broker_process_sets_its_gc_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    # serve() sets the young-generation threshold before the broker starts; the older ones stay.
    import gc

    from broker.server import broker_server as server

    seen: list[tuple[int, int, int]] = []

    class Stop(Exception):
        pass

    def no_start(cfg: BrokerConfig) -> None:
        seen.append(gc.get_threshold())
        raise Stop

    before = gc.get_threshold()
    monkeypatch.setattr(server, "BrokerServer", no_start)
    try:
        with pytest.raises(Stop):
            asyncio.run(server.serve(parse(gcYoungThreshold="12345"), asyncio.Event()))
        assert seen == [(12345, before[1], before[2])]
    finally:
        gc.set_threshold(*before)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("brokerName", "Other"),
        ("brokerClusterName", "bad name"),
        ("namesrvAddr", "nohost"),
        ("namesrvAddr", "h:99999"),
        ("brokerPeerClientAddrs", "n9-127.0.0.1:1"),
        ("brokerPeerClientAddrs", "n0-127.0.0.1"),
        ("bindAddress", "not a host"),
        ("brokerAdvertisedPort", "0"),
        ("maxMessageSize", "0"),
        ("defaultTopicQueueNums", "2000"),
        ("autoCreateTopicEnable", "maybe"),
        ("longPollingMaxMs", "-1"),
        ("registerNameServerPeriod", "10"),
        ("gcYoungThreshold", "10"),
        ("noSuchKey", "1"),
    ],
)
def test_bad_values_name_their_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        parse(**{key: value})


def test_max_message_size_must_fit_an_entry(tmp_path: Path) -> None:
    text = "\n".join(f"{k}={v}" for k, v in BASE.items()) + "\nmaxMessageSize=16000000\n"
    f = tmp_path / "b.conf"
    f.write_text(text)
    assert parse_properties(text)["maxMessageSize"] == "16000000"
    with pytest.raises(ConfigError, match="maxMessageSize"):
        load_broker_config(f)
