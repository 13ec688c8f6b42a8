"""The dledger-mq data source over HTTPS with ACL: an in-process NameServer and 3-replica group
(tests/broker/harness.py) serve TLS with a private CA; Spark (local mode) reads a topic with
``tlsCaFile`` and a SUB-only account, so the driver's planner and the executors' readers all
speak HTTPS with the CA the driver read. Plain HTTP, and TLS trusting only the system's CAs, fail
with errors that say so. Spark runs in a thread: the cluster lives on the test's event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import pytest

from broker.client import Message, Producer
from broker.client.admin import Admin
from broker.client.transport import Transport, client_ssl_context
from broker.serving.certs import make_certs
from namesrv.server import NamesrvService
from spark_jobs.source import FORMAT, register
from tests.acl_fixtures import ADMIN, CONSUMER, PRODUCER, write_acl
from tests.broker.harness import IDS, BrokerCluster
from tests.dledger.harness import wait_until

pytestmark = pytest.mark.slow

TOPIC = "SrcTls"
ENV_SECURITY = ("DLEDGER_ACCESS_KEY", "DLEDGER_SECRET_KEY", "DLEDGER_CREDENTIALS_FILE", "DLEDGER_TLS",
                "DLEDGER_TLS_CA_FILE")  # fmt: skip


@pytest.fixture
async def tls_cluster(tmp_path: Any) -> AsyncIterator[tuple[BrokerCluster, str]]:
    paths = make_certs(str(tmp_path / "tls"), ["localhost"], ["127.0.0.1"])
    acl = write_acl(str(tmp_path / "plain_acl.yml"))
    c = BrokerCluster(str(tmp_path), acl_file=acl, tlsEnable="true", tlsServerCertPath=paths["server.pem"],
                      tlsServerKeyPath=paths["server.key"], tlsClientTrustCertPath=paths["ca.pem"])
    for ns in c.namesrvs:
        ns.cfg = dataclasses.replace(ns.cfg, tls_cert_file=paths["server.pem"], tls_key_file=paths["server.key"])
        ns.service = NamesrvService(ns.cfg)
    await c.start()
    try:
        yield c, paths["ca.pem"]
    finally:
        await c.stop()


async def load(c: BrokerCluster, ca: str, count: int) -> dict[tuple[int, int], bytes]:
    """Create the topic, send ``count`` messages, wait until every replica holds them all."""
    ctx = client_ssl_context(ca)
    async with Admin(c.namesrv_addr, credentials=ADMIN, tls=ctx) as admin:
        await admin.update_topic(TOPIC, cluster="TestCluster", read_queue_nums=2, write_queue_nums=2)
        await wait_until(lambda: admin.topic_route(TOPIC), 30, "the topic's route")
    sent: dict[tuple[int, int], bytes] = {}
    async with Producer("src_tls_pg", c.namesrv_addr, credentials=PRODUCER, tls=ctx) as producer:
        for i in range(count):
            r = await producer.send(Message(TOPIC, f"over tls {i}".encode()))
            sent[(r.message_queue.queue_id, r.queue_offset)] = f"over tls {i}".encode()
    transport = Transport(5.0, credentials=ADMIN, tls=ctx)
    try:
        async def held() -> bool:
            for nid in IDS:
                st = await transport.call(c.addr(nid), "GET", f"/v1/topics/{quote(TOPIC)}/status")
                if sum(int(q["max_offset"]) for q in st["queues"]) != count:
                    return False
            return True

        await wait_until(held, 30, "every replica to hold the topic")
    finally:
        await transport.close()
    return sent


async def test_a_read_over_https_with_a_private_ca(tls_cluster: tuple[BrokerCluster, str], spark: Any) -> None:
    assert not [k for k in ENV_SECURITY if os.environ.get(k)], "the test needs an environment without these"
    c, ca = tls_cluster
    sent = await load(c, ca, 40)
    register(spark)
    as_consumer = {"namesrv": c.namesrv_addr, "topic": TOPIC, "accessKey": CONSUMER.access_key,
                   "secretKey": CONSUMER.secret_key}  # fmt: skip

    def read(**kv: str) -> dict[tuple[int, int], bytes]:
        df = spark.read.format(FORMAT).options(**as_consumer, **kv).load()
        return {(r["queue_id"], r["queue_offset"]): bytes(r["body"]) for r in df.collect()}

    assert await asyncio.to_thread(read, tlsCaFile=ca, pullBatchSize="7") == sent
    with pytest.raises(Exception, match=r"no NameServer of .* answered: .*\(if the cluster runs HTTPS: give "
                                        r"tlsCaFile, or tls=true\)"):
        await asyncio.to_thread(read)
    with pytest.raises(Exception, match=r"no NameServer of .* answered: TLS_FAILED: .*certificate verify failed"):
        await asyncio.to_thread(read, tls="true")
