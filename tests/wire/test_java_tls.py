"""The official Java clients' TLS mode (``ClientConfig.setUseTLS(true)``, RocketMQ's default test mode: any
server certificate) against our cluster with TLS on: the NameServer and the brokers take TLS on their one
port, remoting inside it (``tlsMode=permissive``, so that this test's own HTTP calls work plain).

Ours only, in this process (tests/broker/inproc_cluster.py: a NameServer and a group of three replicas on an
in-memory Raft log), the wire tier's Java ``send`` scenario with ``--tls``; ACL on."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from broker.serving.certs import make_certs
from tests.acl_fixtures import ADMIN
from tests.broker.inproc_cluster import InProcBrokerCluster
from tests.wire.harness import CLIENTS, _parse_last_json, java_cmd

pytestmark = [pytest.mark.slow, pytest.mark.wire]


@pytest.mark.parametrize("client", ["4.9.8", "5.3.1"])
async def test_java_clients_send_and_read_back_over_tls(client: str, tmp_path: Path) -> None:
    certs = make_certs(str(tmp_path / "tls"), ["localhost"], ["127.0.0.1"])
    broker_tls = {"tlsEnable": "true", "tlsServerCertPath": certs["server.pem"],
                  "tlsServerKeyPath": certs["server.key"], "tlsClientTrustCertPath": certs["ca.pem"],
                  "tlsMode": "permissive"}
    ns_tls = {"tls_cert_file": certs["server.pem"], "tls_key_file": certs["server.key"], "tls_mode": "permissive"}
    cluster = await InProcBrokerCluster.start(str(tmp_path / "c"), broker_props=broker_tls, namesrv_cfg=ns_tls)
    try:
        await cluster.create_topic("TlsTopic", 4)
        home = str(tmp_path / "home")
        os.makedirs(home)
        cmd = [*java_cmd(CLIENTS[client], "wire.Scenarios", home), "send", "--namesrv", cluster.namesrv_addr,
               "--topic", "TlsTopic", "--group", "tls_g", "--timeout", "90", "--count", "10",
               "--ak", ADMIN.access_key, "--sk", ADMIN.secret_key, "--tls"]
        pipe = asyncio.subprocess.PIPE
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=pipe, stderr=pipe)
        out, err = await asyncio.wait_for(proc.communicate(), 150)
        result = _parse_last_json(out.decode())
        assert proc.returncode == 0 and result.get("ok") is True, f"{result}\n{err.decode()[-3000:]}"
        assert result["tls"] is True and result["acked"] == 30 and result["read"] >= 40
        leader = cluster.groups[0].leader()
        assert leader is not None
        sniff = (await cluster.call(leader.addr, "GET", "/v1/status"))["rocketmq"]["sniff"]
        assert sniff["tls_handshakes"] >= 1 and sniff["tls_failed"] == 0, sniff  # the client spoke TLS to the broker
    finally:
        await cluster.stop()
