"""Issue 10, finding 7 (the HTTP ports): TLS on the broker's and the NameServer's ports, with a custom
CA on the client side (SDK, registrar). A plain-HTTP client gets nothing from a TLS port, and a client
that does not trust the CA refuses the server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.client import Message, Producer
from broker.client.transport import ClientError, Transport, client_ssl_context
from broker.serving.certs import make_certs
from tests.acl_fixtures import ADMIN, PRODUCER, write_acl
from tests.broker.harness import BrokerCluster


@pytest.fixture
async def tls_cluster(tmp_path: Any) -> AsyncIterator[tuple[BrokerCluster, dict[str, str]]]:
    paths = make_certs(str(tmp_path / "tls"), ["localhost"], ["127.0.0.1"])
    acl = write_acl(str(tmp_path / "plain_acl.yml"))
    c = BrokerCluster(str(tmp_path), acl_file=acl, tlsEnable="true", tlsServerCertPath=paths["server.pem"],
                      tlsServerKeyPath=paths["server.key"], tlsClientTrustCertPath=paths["ca.pem"])
    import dataclasses

    from namesrv.server import NamesrvService

    for ns in c.namesrvs:
        ns.cfg = dataclasses.replace(ns.cfg, tls_cert_file=paths["server.pem"], tls_key_file=paths["server.key"])
        ns.service = NamesrvService(ns.cfg)
    await c.start()
    try:
        yield c, paths
    finally:
        await c.stop()


async def test_tls_end_to_end_with_a_custom_ca(tls_cluster: tuple[BrokerCluster, dict[str, str]],
                                               tmp_path: Any) -> None:
    c, paths = tls_cluster
    ctx = client_ssl_context(paths["ca.pem"])
    # the brokers registered over HTTPS (the route exists), and the SDK works over HTTPS end to end
    t = Transport(timeout_s=5.0, credentials=ADMIN, tls=ctx)
    leader = c.writable_leader()
    assert leader is not None
    await t.call(leader.cfg.address, "POST", "/v1/topics", {"topic": "TlsT"})
    async with Producer("pg", c.namesrv_addr, credentials=PRODUCER, tls=ctx) as p:
        r = await p.send(Message("TlsT", b"over tls"))
        assert r.status.name == "SEND_OK"
    st = await t.call(leader.cfg.address, "GET", "/v1/status")
    assert st["security"]["tls"] is True and st["namesrv"]["registrations"] > 0 and not st["namesrv"]["errors"]
    await t.close()
    # plain HTTP to a TLS port: no answer
    plain = Transport(timeout_s=2.0, credentials=ADMIN, tls=None)
    for addr in (leader.cfg.address, c.namesrvs[0].addr):
        with pytest.raises(ClientError) as e:
            await plain.call(addr, "GET", "/v1/status")
        assert e.value.code in ("CONNECTION_LOST", "BAD_ANSWER", "TIMEOUT"), e.value
    await plain.close()
    # a client that does not trust this CA refuses the server
    other = make_certs(str(tmp_path / "other"), ["localhost"], ["127.0.0.1"])
    stranger = Transport(timeout_s=2.0, credentials=ADMIN, tls=client_ssl_context(other["ca.pem"]))
    with pytest.raises(ClientError) as e:
        await stranger.call(leader.cfg.address, "GET", "/v1/status")
    assert e.value.code == "TLS_FAILED"
    await stranger.close()
