"""``dledger-dashboard`` over HTTP (no browser): its pages against a real in-process cluster show what
mqadmin shows, every page needs a login, what a page shows is what the signed-in account may read
(message bodies only with SUB on the topic), acting needs an admin account, and errors answer with
their status. The browser test is ``test_dashboard_browser.py``."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import aiohttp
import pytest

from broker.client.admin import Admin
from broker.protocol.auth import Credentials
from broker.tools.dashboard.server import start
from tests.acl_fixtures import ADMIN, CONSUMER, PRODUCER, STRANGER
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


def browser() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))  # keeps cookies of 127.0.0.1


async def sign_in(http: aiohttp.ClientSession, dashboard: str, creds: Credentials, next_path: str = "/") -> int:
    """Sign in through the form; the status of the page it leads to (or of the refusal)."""
    async with http.post(f"{dashboard}/login", data={"access_key": creds.access_key, "secret_key": creds.secret_key,
                                                     "next": next_path}) as resp:
        return resp.status


async def get(url: str, creds: Credentials = ADMIN, status: int = 200) -> str:
    async with browser() as http:
        dashboard = url[: url.index("/", len("http://"))]
        assert await sign_in(http, dashboard, creds) == 200
        async with http.get(url) as resp:
            assert resp.status == status, (url, resp.status)
            return await resp.text()


def csrf(page: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', page)
    assert m, "no CSRF token in the page"
    return m.group(1)


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
    page = await get(f"{dashboard}/message?id=RaftNode00:00000000FFFFFFFF", status=404)
    assert 'class="error"' in page
    # the live JSON the page's script polls
    async with browser() as http:
        await sign_in(http, dashboard, ADMIN)
        async with http.get(f"{dashboard}/api/live") as resp:
            live = await resp.json()
    assert len(live["members"]) == 6 and live["tps"]["T1"] > 0 and live["lag"]["G1"] == 5
    # static files are served (no CDN)
    assert "poll()" in await get(f"{dashboard}/static/dashboard.js")


async def test_transfer_needs_an_admin_account_signed_in(dashboard: str, cluster: InProcBrokerCluster) -> None:
    async def post(creds: Credentials, form: dict[str, str], status: int, *, token: bool = True) -> str:
        async with browser() as http:
            assert await sign_in(http, dashboard, creds) == 200
            async with http.get(f"{dashboard}/") as resp:
                page = await resp.text()
            data = {**form, "csrf": csrf(page)} if token else form
            async with http.post(f"{dashboard}/transfer", data=data) as resp:
                assert resp.status == status
                return await resp.text()

    g0 = cluster.group("RaftNode00")
    page = await post(CONSUMER, {"broker": "RaftNode00", "target": "n1"}, 403)
    assert 'class="error"' in page and "admin" in page.lower(), page
    page = await post(ADMIN, {"broker": "RaftNode00", "target": "n1"}, 403, token=False)
    assert "BAD_CSRF" in page  # a form that did not come from the page (another site's) acts on nothing
    assert (g0.leader() or await g0.wait_leader()).nid == "n0"
    page = await post(ADMIN, {"broker": "RaftNode00", "target": "n1"}, 200)
    assert "the new leader is n1" in page, page
    assert (await g0.wait_leader("n1")).nid == "n1"


async def test_every_page_needs_a_login_and_shows_bodies_only_to_readers_of_the_topic(
    dashboard: str, cluster: InProcBrokerCluster
) -> None:
    """Issue 23, finding 6: started with the admin's credentials as the README shows, the dashboard
    served any message body to an anonymous local user. Now nothing is served without a login, and
    the pages read with the signed-in account: the broker shows a body to an account with SUB on its
    topic only."""
    await seed(cluster)
    by_key = cells(await get(f"{dashboard}/message?topic=T1&key=k3"), "messages")
    msg_id = by_key[0][3]
    async with browser() as http:  # anonymous
        for path in ("/", "/topics", "/groups", "/topic?t=T1", "/group?g=G1", f"/message?id={msg_id}"):
            async with http.get(f"{dashboard}{path}", allow_redirects=False) as resp:
                assert resp.status == 303 and resp.headers["Location"].startswith("/login?next="), path
                assert "body 3" not in await resp.text()
        async with http.get(f"{dashboard}/api/live") as resp:
            assert resp.status == 401 and (await resp.json())["code"] == "LOGIN_REQUIRED"
        async with http.post(f"{dashboard}/transfer", data={"broker": "RaftNode00", "target": "n1"}) as resp:
            assert resp.status == 401
        for who in (STRANGER, Credentials(ADMIN.access_key, "not-the-admin-secret")):
            assert await sign_in(http, dashboard, who) == 401
        async with http.get(f"{dashboard}/message?id={msg_id}", allow_redirects=False) as resp:
            assert resp.status == 303  # a refused login opens no session
    # PRODUCER may publish to T1 but not read it: refused by the broker, no body in the page
    page = await get(f"{dashboard}/message?id={msg_id}", PRODUCER, status=403)
    assert "NO_PERMISSION" in page and "body 3" not in page
    page = await get(f"{dashboard}/message?topic=T1&key=k3", PRODUCER, status=403)
    assert "body 3" not in page
    # CONSUMER may read it
    assert cells(await get(f"{dashboard}/message?id={msg_id}", CONSUMER), "messages")[0][-1] == "body 3"
    # after the login, back where the user was going; a foreign "next" goes home instead
    async with browser() as http:
        async with http.post(f"{dashboard}/login", allow_redirects=False, data={
                "access_key": CONSUMER.access_key, "secret_key": CONSUMER.secret_key, "next": "/topics"}) as resp:
            assert resp.status == 303 and resp.headers["Location"] == "/topics"
            cookie = resp.headers["Set-Cookie"]
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        async with http.post(f"{dashboard}/login", allow_redirects=False, data={
                "access_key": CONSUMER.access_key, "secret_key": CONSUMER.secret_key,
                "next": "//evil.example/x"}) as resp:
            assert resp.headers["Location"] == "/"


async def test_error_pages_answer_with_their_status(dashboard: str, cluster: InProcBrokerCluster) -> None:
    """Issue 28, papercut 8: every error page answered 200."""
    await get(f"{dashboard}/no-such-page", status=404)
    page = await get(f"{dashboard}/topic?t=NoSuchTopic", status=404)
    assert 'class="error"' in page
    page = await get(f"{dashboard}/message?id=not-a-message-id", status=400)
    assert 'class="error"' in page
    page = await get(f"{dashboard}/group?g=" + "x" * 300, status=400)
    assert 'class="error"' in page


async def test_unreachable_cluster_shows_the_error_not_a_crash() -> None:
    from tests.broker.tools.test_mqadmin import closed_port

    runner, port = await start(Admin(f"127.0.0.1:{closed_port()}"), "127.0.0.1", 0)
    try:
        async with browser() as http:
            async with http.post(f"http://127.0.0.1:{port}/login", data={
                    "access_key": ADMIN.access_key, "secret_key": ADMIN.secret_key}) as resp:
                page = await resp.text()
                assert resp.status == 502 and 'class="error"' in page and "CONNECT_FAILED" in page, page
    finally:
        await runner.cleanup()


def test_bad_listen_address_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from broker.tools.dashboard.server import main

    assert main(["--listen", "nowhere"]) == 2
    assert "host:port" in capsys.readouterr().err
