"""The NameServer over HTTP: every endpoint, a table of bad inputs, expiry with an injected clock,
a restart, and the command line.

In-process servers run on 127.0.0.1 through aiohttp's test utilities with the scan task off: tests
drive expiry by moving the clock and calling ``scan_now``. Nothing sleeps to synchronise.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
from aiohttp.test_utils import TestClient, TestServer

from broker.protocol import route_wire as wire
from broker.protocol.errors import ProtocolError
from broker.protocol.routes import BrokerRegistration, Role, TopicConfig, UnregisterRequest
from namesrv.config import NamesrvConfig, load_namesrv_config
from namesrv.route_table import RouteTable, validate_registration
from namesrv.server import BODY_BYTES_MAX, NamesrvService

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MSGPACK = {"Content-Type": "application/x-msgpack"}
JSON = {"Content-Type": "application/json"}
N0, N1, N2 = "127.0.0.1:10911", "127.0.0.1:10912", "127.0.0.1:10913"


class Clock:
    def __init__(self, now_ms: int = 5_000_000):
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


@dataclass
class Namesrv:
    service: NamesrvService
    client: TestClient[Any, Any]
    clock: Clock

    async def register(self, reg: BrokerRegistration, *, use_json: bool = False) -> dict[str, Any]:
        body = wire.registration_to_dict(reg)
        if use_json:
            resp = await self.client.post("/v1/brokers/register", data=json.dumps(body), headers=JSON)
            assert resp.status == 200, await resp.text()
            assert resp.content_type == "application/json"
            return dict(await resp.json())
        resp = await self.client.post("/v1/brokers/register", data=msgpack.packb(body), headers=MSGPACK)
        assert resp.status == 200, await resp.text()
        assert resp.content_type == "application/x-msgpack"
        return dict(msgpack.unpackb(await resp.read()))

    async def get_json(self, path: str, status: int = 200) -> dict[str, Any]:
        resp = await self.client.get(path)
        assert resp.status == status, await resp.text()
        return dict(await resp.json())


async def start_namesrv(clock: Clock | None = None) -> Namesrv:
    clock = clock or Clock()
    service = NamesrvService(
        NamesrvConfig(), clock_ms=clock, wall_clock_ms=lambda: 1_700_000_000_000, run_scanner=False
    )
    client: TestClient[Any, Any] = TestClient(TestServer(service.app(), host="127.0.0.1"))
    await client.start_server()
    return Namesrv(service, client, clock)


@pytest.fixture
async def ns() -> AsyncIterator[Namesrv]:
    srv = await start_namesrv()
    yield srv
    await srv.client.close()


def reg(address: str, broker_id: int, term: int, **kw: Any) -> BrokerRegistration:
    role: Role = "LEADER" if broker_id == 0 else "FOLLOWER"
    base: dict[str, Any] = {
        "cluster": "DefaultCluster",
        "broker_name": "RaftNode00",
        "topics": (TopicConfig("TopicA"), TopicConfig("%RETRY%group-1", 1, 1)),
        "data_version": 1,
    }
    base.update(kw)
    return BrokerRegistration(broker_id=broker_id, address=address, role=role, term=term, **base)


async def register_group(ns: Namesrv, term: int = 1) -> None:
    await ns.register(reg(N0, 0, term))
    await ns.register(reg(N1, 2, term))
    await ns.register(reg(N2, 3, term), use_json=True)


# -- happy paths ---------------------------------------------------------------------------------
async def test_register_then_route_in_json_and_msgpack(ns: Namesrv) -> None:
    first = await ns.register(reg(N0, 0, 1))
    assert first["v"] == 1 and first["changed"] and first["accepted"]
    assert first["namesrv_time_ms"] == 1_700_000_000_000 and first["leader_address"] == N0
    await ns.register(reg(N1, 2, 1))
    again = await ns.register(reg(N1, 2, 1), use_json=True)
    assert again["changed"] is False

    route = wire.topic_route_from_dict(await ns.get_json("/v1/routes/TopicA"))
    assert [q.write_queue_nums for q in route.queue_datas] == [4]
    assert route.broker_datas[0].broker_addrs == {0: N0, 2: N1}

    resp = await ns.client.get("/v1/routes/%25RETRY%25group-1", headers={"Accept": "application/x-msgpack"})
    assert resp.status == 200 and resp.content_type == "application/x-msgpack"
    retry = wire.topic_route_from_dict(msgpack.unpackb(await resp.read(), strict_map_key=False))
    assert retry.queue_datas[0].read_queue_nums == 1


async def test_leader_change_and_stale_registration_over_http(ns: Namesrv) -> None:
    await register_group(ns)
    assert (await ns.register(reg(N1, 0, 2)))["changed"]
    stale = await ns.register(reg(N0, 0, 1, data_version=9))
    assert stale["accepted"] is False and stale["ignored_reason"] == "STALE_TERM"
    assert stale["leader_address"] == N1 and stale["leader_term"] == 2
    route = await ns.get_json("/v1/routes/TopicA")
    assert route["broker_datas"][0]["broker_addrs"] == {"0": N1, "3": N2}


async def test_unregister_clusters_topics_delete_status(ns: Namesrv) -> None:
    await register_group(ns)
    clusters = wire.cluster_info_from_dict(await ns.get_json("/v1/clusters"))
    assert clusters.clusters == {"DefaultCluster": ("RaftNode00",)}
    assert clusters.brokers["RaftNode00"].broker_addrs == {0: N0, 2: N1, 3: N2}
    topics = wire.topic_list_from_dict(await ns.get_json("/v1/topics"))
    assert topics == ("%RETRY%group-1", "TopicA")

    body = {"v": 1, "cluster": "DefaultCluster", "broker_name": "RaftNode00", "address": N2}
    resp = await ns.client.post("/v1/brokers/unregister", data=json.dumps(body), headers=JSON)
    assert resp.status == 200 and (await resp.json()) == {"v": 1, "removed": True}
    resp = await ns.client.post("/v1/brokers/unregister", data=msgpack.packb(body), headers=MSGPACK)
    assert msgpack.unpackb(await resp.read()) == {"v": 1, "removed": False}

    resp = await ns.client.delete("/v1/topics/TopicA")
    assert resp.status == 200 and (await resp.json())["deleted"] is True
    missing = await ns.get_json("/v1/routes/TopicA", status=404)
    assert missing["code"] == "TOPIC_NOT_EXIST" and "TopicA" in missing["message"]
    assert (await ns.client.delete("/v1/topics/TopicA")).status == 404

    status = await ns.get_json("/v1/status")
    assert status["counts"] == {"clusters": 1, "broker_groups": 1, "brokers": 2, "topics": 1, "topic_routes": 1}
    assert status["totals"]["registrations"] == 3 and status["totals"]["unregistrations"] == 1
    assert status["config"]["listenPort"] == 9876 and status["uptime_ms"] >= 0
    assert [b["address"] for b in status["brokers"]] == [N0, N1]


async def test_scan_expires_silent_brokers_with_the_injected_clock(ns: Namesrv) -> None:
    await register_group(ns)
    ns.clock.now_ms += 60_000
    await ns.register(reg(N1, 2, 1))
    await ns.register(reg(N2, 3, 1))
    ns.clock.now_ms += 60_001  # n0 silent for 120.001 s, the followers for 60.001 s
    expired = await ns.service.scan_now()
    assert [(e.address, e.broker_id) for e in expired] == [(N0, 0)]
    route = await ns.get_json("/v1/routes/TopicA")
    assert route["broker_datas"][0]["broker_addrs"] == {"2": N1, "3": N2}  # no writable broker
    status = await ns.get_json("/v1/status")
    assert status["totals"]["expired"] == 1 and status["totals"]["scans"] == 1


async def test_restarted_namesrv_is_empty_until_brokers_register_again() -> None:
    first = await start_namesrv()
    await register_group(first)
    await first.client.close()

    second = await start_namesrv()
    try:
        assert (await second.get_json("/v1/routes/TopicA", status=404))["code"] == "TOPIC_NOT_EXIST"
        await register_group(second, term=4)  # the brokers' next periodic registration
        route = await second.get_json("/v1/routes/TopicA")
        assert route["broker_datas"][0]["broker_addrs"] == {"0": N0, "2": N1, "3": N2}
    finally:
        await second.client.close()


# -- bad input -----------------------------------------------------------------------------------
def _reg_body(**change: Any) -> dict[str, Any]:
    body = wire.registration_to_dict(reg(N0, 0, 1))
    body.update(change)
    return {k: v for k, v in body.items() if v is not _DROP}


_DROP: Any = object()
_REG = "/v1/brokers/register"
_UNREG = "/v1/brokers/unregister"
_UNREG_BODY = {"v": 1, "cluster": "C", "broker_name": "B", "address": N0}


Request = tuple[str, str, dict[str, str], bytes]  # method, path, headers, body


def _mp(body: Any) -> bytes:
    return bytes(msgpack.packb(body))


def reg_mp(**change: Any) -> Request:
    return ("POST", _REG, MSGPACK, _mp(_reg_body(**change)))


def reg_json(**change: Any) -> Request:
    return ("POST", _REG, JSON, json.dumps(_reg_body(**change)).encode())


def topic_mp(**fields: Any) -> Request:
    return reg_mp(topics=[{"topic": "T", **fields}])


def unreg(headers: dict[str, str], body: Any, **change: Any) -> Request:
    if isinstance(body, dict):
        body = {k: v for k, v in {**body, **change}.items() if v is not _DROP}
        body = _mp(body) if headers is MSGPACK else json.dumps(body).encode()
    return ("POST", _UNREG, headers, body)


def get(path: str) -> Request:
    return ("GET", path, {}, b"")


def delete(path: str) -> Request:
    return ("DELETE", path, {}, b"")


BAD_INPUTS: list[tuple[str, Request, int, str]] = [
    # (case, request, expected status, expected code)
    ("bad msgpack", ("POST", _REG, MSGPACK, b"\xc1\xc1"), 400, "BAD_MSGPACK"),
    ("truncated msgpack", ("POST", _REG, MSGPACK, _mp(_reg_body())[:-3]), 400, "BAD_MSGPACK"),
    ("trailing bytes", ("POST", _REG, MSGPACK, _mp(_reg_body()) + b"\x00"), 400, "BAD_MSGPACK"),
    ("empty body", ("POST", _REG, MSGPACK, b""), 400, "BAD_MSGPACK"),
    ("int map key", ("POST", _REG, MSGPACK, b"\x82\xa1v\x01\x01\x01"), 400, "BAD_MSGPACK"),
    ("bad json", ("POST", _REG, JSON, b"{not json"), 400, "BAD_JSON"),
    ("deep json", ("POST", _REG, JSON, b"[" * 100_000), 400, "BAD_JSON"),
    ("json not a map", ("POST", _REG, JSON, b"[1, 2]"), 400, "BAD_REQUEST"),
    ("octet-stream", ("POST", _REG, {}, _mp(_reg_body())), 415, "UNSUPPORTED_MEDIA_TYPE"),
    ("text/plain", ("POST", _REG, {"Content-Type": "text/plain"}, b"x"), 415, "UNSUPPORTED_MEDIA_TYPE"),
    ("oversized body", ("POST", _REG, MSGPACK, b"\x00" * (BODY_BYTES_MAX + 1)), 413, "BODY_TOO_LARGE"),
    ("version 2", reg_mp(v=2), 400, "UNSUPPORTED_VERSION"),
    ("version 2 json", reg_json(v=2), 400, "UNSUPPORTED_VERSION"),
    ("no version", reg_mp(v=_DROP), 400, "MISSING_FIELD"),
    ("version a string", reg_json(v="1"), 400, "BAD_FIELD_TYPE"),
    ("missing cluster", reg_mp(cluster=_DROP), 400, "MISSING_FIELD"),
    ("missing term", reg_json(term=_DROP), 400, "MISSING_FIELD"),
    ("term a string", reg_mp(term="1"), 400, "BAD_FIELD_TYPE"),
    ("term a float", reg_json(term=1.0), 400, "BAD_FIELD_TYPE"),
    ("term a bool", reg_mp(term=True), 400, "BAD_FIELD_TYPE"),
    ("term huge", reg_json(term=10**30), 400, "BAD_FIELD_TYPE"),
    ("term negative", reg_mp(term=-3), 400, "INVALID_TERM"),
    ("broker_id null", reg_mp(broker_id=None), 400, "BAD_FIELD_TYPE"),
    ("address bytes", reg_mp(address=b"127.0.0.1:1"), 400, "BAD_FIELD_TYPE"),
    ("topics a map", reg_mp(topics={"a": 1}), 400, "BAD_FIELD_TYPE"),
    ("topic item a string", reg_mp(topics=["TopicA"]), 400, "BAD_FIELD_TYPE"),
    ("topic perm a string", topic_mp(perm="6"), 400, "BAD_FIELD_TYPE"),
    ("topic unknown field", topic_mp(queues=4), 400, "UNKNOWN_FIELD"),
    ("unknown field", reg_mp(brokerName="x"), 400, "UNKNOWN_FIELD"),
    ("bytes key", ("POST", _REG, MSGPACK, _mp({**_reg_body(), b"k": 1})), 400, "UNKNOWN_FIELD"),
    ("bad cluster name", reg_mp(cluster="my cluster"), 400, "INVALID_CLUSTER_NAME"),
    ("bad broker name", reg_json(broker_name=""), 400, "INVALID_BROKER_NAME"),
    ("bad topic name", topic_mp(topic="a/b"), 400, "INVALID_TOPIC"),
    ("bad address", reg_mp(address="host:99999"), 400, "INVALID_ADDRESS"),
    ("bad role", reg_mp(role="SLAVE"), 400, "INVALID_ROLE"),
    ("follower as id 0", reg_mp(role="FOLLOWER"), 400, "ROLE_ID_MISMATCH"),
    ("queue nums 0", topic_mp(read_queue_nums=0), 400, "INVALID_QUEUE_NUMS"),
    ("perm 9", topic_mp(perm=9), 400, "INVALID_PERM"),
    ("unregister bad json", unreg(JSON, b"\xff\xfe\x00"), 400, "BAD_JSON"),
    ("unregister bad msgpack", unreg(MSGPACK, b"\x91"), 400, "BAD_MSGPACK"),
    ("unregister version 2", unreg(JSON, _UNREG_BODY, v=2), 400, "UNSUPPORTED_VERSION"),
    ("unregister no address", unreg(MSGPACK, _UNREG_BODY, address=_DROP), 400, "MISSING_FIELD"),
    ("unregister wrong type", unreg(MSGPACK, _UNREG_BODY, cluster=5), 400, "BAD_FIELD_TYPE"),
    ("unregister bad address", unreg(MSGPACK, _UNREG_BODY, address="x"), 400, "INVALID_ADDRESS"),
    ("unregister oversized", unreg(JSON, b" " * (BODY_BYTES_MAX + 1)), 413, "BODY_TOO_LARGE"),
    ("route bad topic", get("/v1/routes/bad%20topic"), 400, "INVALID_TOPIC"),
    ("route too long", get("/v1/routes/" + "t" * 128), 400, "INVALID_TOPIC"),
    ("route unknown", get("/v1/routes/Unknown"), 404, "TOPIC_NOT_EXIST"),
    ("route version 2", get("/v1/routes/TopicA?v=2"), 400, "UNSUPPORTED_VERSION"),
    ("clusters version 2", get("/v1/clusters?v=2"), 400, "UNSUPPORTED_VERSION"),
    ("topics version x", get("/v1/topics?v=x"), 400, "UNSUPPORTED_VERSION"),
    ("status version 2", get("/v1/status?v=2"), 400, "UNSUPPORTED_VERSION"),
    ("delete bad topic", delete("/v1/topics/a%2Fb"), 400, "INVALID_TOPIC"),
    ("delete unknown", delete("/v1/topics/Unknown"), 404, "TOPIC_NOT_EXIST"),
    ("delete version 2", delete("/v1/topics/TopicA?v=2"), 400, "UNSUPPORTED_VERSION"),
    ("register via GET", get(_REG), 405, "METHOD_NOT_ALLOWED"),
    ("unknown path", get("/v1/nothing"), 404, "NOT_FOUND"),
]


async def test_bad_inputs_get_4xx_with_a_code_and_the_server_keeps_serving(ns: Namesrv) -> None:
    await ns.register(reg(N0, 0, 1))
    failures = []
    for case_id, (method, path, headers, body), status, code in BAD_INPUTS:
        data = io.BytesIO(body) if len(body) > 1 << 20 else body or None  # big bodies stream
        resp = await ns.client.request(method, path, data=data, headers=headers)
        text = await resp.text()
        try:
            answer = json.loads(text)
        except ValueError:
            failures.append(f"{case_id}: not JSON: {resp.status} {text[:200]!r}")
            continue
        if (resp.status, answer.get("code")) != (status, code) or not answer.get("message"):
            failures.append(f"{case_id}: expected {status} {code}, got {resp.status} {text[:300]}")
    assert not failures, "\n".join(failures)
    # nothing bad was applied, and the server still answers
    route = await ns.get_json("/v1/routes/TopicA")
    assert route["broker_datas"][0]["broker_addrs"] == {"0": N0}
    assert (await ns.register(reg(N1, 1, 1)))["changed"]
    assert (await ns.get_json("/v1/status"))["counts"]["brokers"] == 2


async def test_cluster_mismatch_is_a_conflict(ns: Namesrv) -> None:
    await ns.register(reg(N0, 0, 1))
    body = wire.registration_to_dict(reg(N1, 1, 1, cluster="Other"))
    resp = await ns.client.post(_REG, data=_mp(body), headers=MSGPACK)
    assert resp.status == 409 and (await resp.json())["code"] == "CLUSTER_MISMATCH"


async def test_one_log_line_per_route_change_and_per_expiry(
    ns: Namesrv, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="namesrv")
    await ns.register(reg(N0, 0, 1))
    await ns.register(reg(N0, 0, 1))  # a heartbeat: no line
    await ns.register(reg(N1, 0, 0))  # stale: one warning
    ns.clock.now_ms += 120_001
    await ns.service.scan_now()
    lines = [(r.levelname, r.getMessage().split(" ")[0]) for r in caplog.records if r.name == "namesrv"]
    assert lines == [("INFO", "route"), ("WARNING", "ignored"), ("WARNING", "expired")]


# -- the codec -----------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["msgpack", "json"])
def test_records_round_trip(fmt: wire.Format) -> None:
    def through(body: dict[str, Any]) -> dict[str, Any]:
        return wire.parse_body(wire.dump_body(body, fmt), fmt)

    r = reg(N0, 0, 3, heartbeat_timeout_ms=5_000, topics=(TopicConfig("T", 2, 3, 4, True),))
    assert wire.registration_from_dict(through(wire.registration_to_dict(r))) == r
    u = UnregisterRequest("C", "B", N1)
    assert wire.unregister_from_dict(through(wire.unregister_to_dict(u))) == u
    table = RouteTable()
    result = table.register(r, 0)
    resp = wire.RegisterResponse(result, 42)
    assert wire.register_response_from_dict(through(wire.register_response_to_dict(resp))) == resp
    route = table.topic_route("T")
    assert route is not None and route.order
    assert wire.topic_route_from_dict(through(wire.topic_route_to_dict(route))) == route
    info = table.cluster_info()
    assert wire.cluster_info_from_dict(through(wire.cluster_info_to_dict(info))) == info
    assert wire.topic_list_from_dict(through(wire.topic_list_to_dict(("a", "b")))) == ("a", "b")


def test_mutated_bodies_raise_only_coded_errors() -> None:
    """Flip, cut and splice bytes of valid bodies: decoding returns a record or raises a
    ProtocolError, never anything else. Replay with NAMESRV_FUZZ_SEED=<seed>."""
    seed = int(os.environ.get("NAMESRV_FUZZ_SEED", random.randrange(2**32)))
    print(f"NAMESRV_FUZZ_SEED={seed}")
    rng = random.Random(seed)
    body = _reg_body(topics=[{"topic": "T", "perm": 6, "order": True}], heartbeat_timeout_ms=9)
    seeds: list[tuple[wire.Format, bytes]] = [("msgpack", _mp(body)), ("json", json.dumps(body).encode())]
    for _ in range(3_000):
        fmt, good = rng.choice(seeds)
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(data))
            action = rng.randrange(3)
            if action == 0:
                data[i] = rng.randrange(256)
            elif action == 1:
                del data[i:]
                data.extend(b"{}" if fmt == "json" else b"\x80")
            else:
                data[i:i] = good[rng.randrange(len(good)) :][: rng.randint(1, 8)]
        try:
            validate_registration(wire.registration_from_dict(wire.parse_body(bytes(data), fmt)))
        except ProtocolError:
            pass


# -- the process ---------------------------------------------------------------------------------
def _run_module(*args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "namesrv.server", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
    )


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("listenPortt=9876", "listenPortt"),
        ("listenPort=abc", "listenPort"),
        ("listenPort=70000", "listenPort"),
        ("scanNotActiveBrokerInterval=1e4", "scanNotActiveBrokerInterval"),
        ("brokerChannelMaxIdleTime=-1", "brokerChannelMaxIdleTime"),
        ("bindAddress=not an address", "bindAddress"),
        ("tlsMode=disabled", "tlsMode"),
        ("remotingAclV1=maybe", "remotingAclV1"),
        ("orderMessageEnable=yes", "orderMessageEnable"),
    ],
)
def test_bad_config_exits_2_naming_the_key_and_file(tmp_path: Any, line: str, key: str) -> None:
    conf = tmp_path / "bad.conf"
    conf.write_text(f"# a NameServer\n{line}\n")
    r = _run_module("-c", str(conf))
    assert r.returncode == 2, r.stderr
    assert key in r.stderr and str(conf) in r.stderr


@pytest.mark.parametrize(("name", "port"), [("namesrv.conf", 9876), ("namesrv-2.conf", 9877)])
def test_shipped_configs_parse(name: str, port: int) -> None:
    cfg = load_namesrv_config(os.path.join(REPO, "conf", name))
    assert (cfg.listen_port, cfg.bind_address) == (port, "127.0.0.1")
    assert cfg.scan_not_active_broker_interval_ms == 10_000 and cfg.broker_channel_max_idle_time_ms == 120_000


def test_missing_config_exits_2() -> None:
    r = _run_module("-c", "/nonexistent/namesrv.conf")
    assert r.returncode == 2 and "/nonexistent/namesrv.conf" in r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_process_serves_and_stops_cleanly_on_sigterm(tmp_path: Any) -> None:
    conf = tmp_path / "namesrv.conf"
    port = _free_port()
    conf.write_text(f"listenPort={port}\nbindAddress=127.0.0.1\nscanNotActiveBrokerInterval=1000\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "namesrv.server", "-c", str(conf)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        status = _wait_for_status(port, proc, deadline_s=20)
        assert status["config"]["listenPort"] == port
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
        assert proc.returncode == 0, stderr
        assert "NameServer stopped" in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _wait_for_status(port: int, proc: subprocess.Popen[str], deadline_s: float) -> dict[str, Any]:
    """Poll /v1/status until it answers (a condition with a deadline, not a sleep)."""
    deadline = time.monotonic() + deadline_s
    while True:
        assert proc.poll() is None, f"namesrv exited early: {proc.communicate()[1]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=2) as resp:
                return dict(json.loads(resp.read()))
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)
