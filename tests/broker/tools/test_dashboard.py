"""``dledger-dashboard`` over HTTP (no browser): its pages against a real in-process cluster show what
mqadmin shows, and acting needs the operator's own account. The browser test is
``test_dashboard_browser.py``."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import aiohttp
import pytest

from broker.client.admin import Admin
from broker.tools.dashboard.server import start
from tests.acl_fixtures import ADMIN, CONSUMER
from tests.broker.inproc_cluster import InProcBrokerCluster
from tests.broker.tools.conftest import Mqadmin
from tests.broker.tools.test_mqadmin import seed


@pytest.fixture
async def dashboard(cluster: InProcBrokerCluster) -> AsyncIterator[str]:
    runner, port = await start(Admin(cluster.namesrv_addr), "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def get(url: str) -> str:
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as resp:
            assert resp.status == 200, url
            return await resp.text()


def cells(page: str, table_id: str) -> list[list[str]]:
    """The body rows of table ``table_id`` (cell text with tags stripped)."""
    m = re.search(rf'<table id="{table_id}">.*?<tbody>(.*?)</tbody>', page, re.S)
    assert m, f"no table {table_id}"
    rows = re.findall(r"<tr>(.*?)</tr>", m.group(1), re.S)
    return [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td>(.*?)</td>", r, re.S)] for r in rows]


async def test_pages_show_what_mqadmin_shows(dashboard: str, mqadmin: Mqadmin, cluster: InProcBrokerCluster) -> None:
    await seed(cluster)
    await cluster.group("RaftNode00").commit_offsets("G1", "T1", {0: 1, 1: 2})
    members = cells(await get(f"{dashboard}/"), "members")
    listed = (await mqadmin("clusterList", "--json")).json()["brokers"]
    assert sorted((r[1], r[2], r[5]) for r in members) == sorted(
        (b["broker_name"], b["self_id"], b["role"]) for b in listed
    )
    assert {r[11] for r in members if r[5] == "FOLLOWER"} <= {"0", "1", "2", "-"}  # follower lag, from the leader
    queues = cells(await get(f"{dashboard}/topic?t=T1"), "queues")
    status = (await mqadmin("topicStatus", "-t", "T1", "--json")).json()["queues"]
    assert [(r[0], int(r[1]), int(r[3])) for r in queues] == [
        (q["broker_name"], q["queue_id"], q["max_offset"]) for q in status
    ]
    progress = cells(await get(f"{dashboard}/group?g=G1"), "progress")
    admin_rows = (await mqadmin("consumerProgress", "-g", "G1", "--json")).json()["queues"]
    assert [(r[0], r[1], int(r[2]), int(r[5])) for r in progress] == [
        (q["topic"], q["broker_name"], q["queue_id"], q["lag"]) for q in admin_rows
    ]
    groups = cells(await get(f"{dashboard}/groups"), "groups")
    assert ["G1", "5"] in [r[:2] for r in groups]  # RaftNode00 lag: 8 - 3
    topics = cells(await get(f"{dashboard}/topics"), "topics")
    assert next(r for r in topics if r[0] == "T1")[:2] == ["T1", "10"]
    # message query by key, by unique key, by id; an unknown id names the error
    page = await get(f"{dashboard}/message?topic=T1&key=k3")
    (row,) = cells(page, "messages")
    assert row[-1] == "body 3"
    page = await get(f"{dashboard}/message?topic=T1&unique={row[4]}")
    assert cells(page, "messages")[0][3] == row[3]
    page = await get(f"{dashboard}/message?id={row[3]}")
    assert cells(page, "messages")[0][-1] == "body 3"
    page = await get(f"{dashboard}/message?id=RaftNode00:00000000FFFFFFFF")
    assert 'class="error"' in page
    # the live JSON the page's script polls
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{dashboard}/api/live") as resp:
            live = await resp.json()
    assert len(live["members"]) == 6 and live["tps"]["T1"] > 0 and live["lag"]["G1"] == 5
    # static files are served (no CDN)
    assert "poll()" in await get(f"{dashboard}/static/dashboard.js")


async def test_transfer_needs_the_operators_admin_account(dashboard: str, cluster: InProcBrokerCluster) -> None:
    async def post(form: dict[str, str]) -> str:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{dashboard}/transfer", data=form) as resp:
                assert resp.status == 200
                return await resp.text()

    g0 = cluster.group("RaftNode00")
    page = await post({"broker": "RaftNode00", "target": "n1", "access_key": "", "secret_key": ""})
    assert "CREDENTIALS_REQUIRED" in page
    page = await post(
        {"broker": "RaftNode00", "target": "n1", "access_key": CONSUMER.access_key, "secret_key": CONSUMER.secret_key}
    )
    assert 'class="error"' in page and "admin" in page.lower(), page
    assert (g0.leader() or await g0.wait_leader()).nid == "n0"
    page = await post({"broker": "RaftNode00", "target": "n1", "access_key": ADMIN.access_key,
                       "secret_key": ADMIN.secret_key})
    assert "the new leader is n1" in page, page
    assert (await g0.wait_leader("n1")).nid == "n1"


async def test_unreachable_cluster_shows_the_error_not_a_crash() -> None:
    from tests.broker.tools.test_mqadmin import closed_port

    runner, port = await start(Admin(f"127.0.0.1:{closed_port()}"), "127.0.0.1", 0)
    try:
        for path in ("/", "/topics", "/groups", "/topic?t=T", "/group?g=G", "/message?id=RaftNode00:0000000000000000"):
            page = await get(f"http://127.0.0.1:{port}{path}")
            assert 'class="error"' in page and "CONNECT_FAILED" in page, (path, page)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/api/live") as resp:
                assert resp.status == 502 and (await resp.json())["code"] == "CONNECT_FAILED"
    finally:
        await runner.cleanup()


def test_bad_listen_address_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from broker.tools.dashboard.server import main

    assert main(["--listen", "nowhere"]) == 2
    assert "host:port" in capsys.readouterr().err
