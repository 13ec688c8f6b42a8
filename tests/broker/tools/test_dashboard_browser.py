"""``dledger-dashboard`` in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
installed by .ci/setup.sh, driven by selenium) against a live in-process cluster: the pages load, the
numbers match mqadmin's, and a crash (kill) of a group's leader shows up in the open page as a role
change, through the page's own polling script. Screenshots are kept under
``build/test-artifacts/dashboard/`` (git-ignored) and the test's tmp dir."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from broker.client.admin import Admin
from broker.tools.dashboard.server import start
from tests.acl_fixtures import ADMIN
from tests.broker.inproc_cluster import InProcBrokerCluster
from tests.broker.tools.conftest import Mqadmin
from tests.broker.tools.test_mqadmin import seed

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).parents[3] / "build" / "test-artifacts" / "dashboard"
WAIT_S = 60.0


def _binary(*names: str) -> str:
    for n in names:
        found = shutil.which(n)
        if found:
            return found
    raise AssertionError(f"none of {names} is installed: run .ci/setup.sh (it installs chromium, chromium-driver)")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    opts = Options()
    opts.binary_location = _binary("chromium", "chromium-browser")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=_binary("chromedriver")), options=opts)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
async def dashboard(cluster: InProcBrokerCluster) -> AsyncIterator[str]:
    runner, port = await start(Admin(cluster.namesrv_addr), "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def table_rows(driver: webdriver.Chrome, table_id: str) -> list[list[str]]:
    """The rendered cell texts, read in one script call (the live script replaces rows in between
    webdriver calls, which would leave stale element references)."""
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map("
        "tr => Array.from(tr.querySelectorAll('td')).map(td => td.innerText.trim()))",
        f"#{table_id} tbody tr",
    )
    return [list(map(str, r)) for r in rows]


async def in_browser(fn: Callable[[], Any]) -> Any:
    """Blocking webdriver calls run on a worker thread: the cluster keeps serving on this loop."""
    return await asyncio.to_thread(fn)


async def wait_in_browser(driver: webdriver.Chrome, cond: Callable[[webdriver.Chrome], Any], what: str) -> Any:
    def waiting() -> Any:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.25).until(cond, f"waiting for {what}")

    return await asyncio.to_thread(waiting)


def shot(driver: webdriver.Chrome, tmp_path: Path, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for d in (ARTIFACTS, tmp_path):
        assert driver.save_screenshot(str(d / f"{name}.png"))


async def test_dashboard_in_chromium(
    browser: webdriver.Chrome, dashboard: str, mqadmin: Mqadmin, cluster: InProcBrokerCluster, tmp_path: Path
) -> None:
    await seed(cluster)
    await cluster.group("RaftNode00").commit_offsets("G1", "T1", {0: 1, 1: 2})

    # every page needs a login (issue 23, finding 6): the browser is sent to the form, then back
    await in_browser(lambda: browser.get(f"{dashboard}/"))
    await wait_in_browser(browser, lambda d: "/login" in d.current_url, "the login page")

    def sign_in() -> None:
        browser.find_element(By.NAME, "access_key").send_keys(ADMIN.access_key)
        browser.find_element(By.NAME, "secret_key").send_keys(ADMIN.secret_key)
        browser.find_element(By.CSS_SELECTOR, "#login button").click()

    await in_browser(sign_in)
    await wait_in_browser(browser, lambda d: d.current_url.rstrip("/") == dashboard, "back on the cluster page")
    assert await in_browser(lambda: browser.find_element(By.ID, "account").text) == ADMIN.access_key

    # the cluster page: one row per replica, roles as mqadmin clusterList reports them
    await wait_in_browser(browser, lambda d: len(table_rows(d, "members")) == 6, "six replica rows")
    await wait_in_browser(browser, lambda d: int(d.find_element(By.TAG_NAME, "body").get_attribute("data-polls")
                                                  or 0) >= 1, "the page's first live poll")
    listed = (await mqadmin("clusterList", "--json")).json()["brokers"]
    rows = await in_browser(lambda: table_rows(browser, "members"))
    assert sorted((r[1], r[2], r[5], r[6]) for r in rows) == sorted(
        (b["broker_name"], b["self_id"], b["role"], str(b["term"])) for b in listed
    )
    await in_browser(lambda: shot(browser, tmp_path, "1-cluster"))

    # a topic: queue offsets as mqadmin topicStatus
    await in_browser(lambda: browser.get(f"{dashboard}/topic?t=T1"))
    queues = await in_browser(lambda: table_rows(browser, "queues"))
    status = (await mqadmin("topicStatus", "-t", "T1", "--json")).json()["queues"]
    assert [(r[0], int(r[1]), int(r[2]), int(r[3])) for r in queues] == [
        (q["broker_name"], q["queue_id"], q["min_offset"], q["max_offset"]) for q in status
    ]
    await in_browser(lambda: shot(browser, tmp_path, "2-topic"))

    # a consumer group: lag per queue as mqadmin consumerProgress
    await in_browser(lambda: browser.get(f"{dashboard}/group?g=G1"))
    progress = await in_browser(lambda: table_rows(browser, "progress"))
    admin_rows = (await mqadmin("consumerProgress", "-g", "G1", "--json")).json()
    assert [(r[0], r[1], int(r[2]), int(r[5])) for r in progress] == [
        (q["topic"], q["broker_name"], q["queue_id"], q["lag"]) for q in admin_rows["queues"]
    ]
    total = await in_browser(lambda: browser.find_element(By.ID, "total-lag").text)
    assert int(total) == admin_rows["total_lag"]
    await in_browser(lambda: shot(browser, tmp_path, "3-group"))

    # a message by key, through the query form
    await in_browser(lambda: browser.get(f"{dashboard}/message"))

    def query() -> None:
        browser.find_element(By.NAME, "topic").send_keys("T1")
        browser.find_element(By.NAME, "key").send_keys("k5")
        browser.find_element(By.CSS_SELECTOR, "#query button").click()

    await in_browser(query)
    await wait_in_browser(browser, lambda d: len(table_rows(d, "messages")) == 1, "the query's answer")
    (msg,) = await in_browser(lambda: table_rows(browser, "messages"))
    assert msg[-1] == "body 5"
    await in_browser(lambda: shot(browser, tmp_path, "4-message"))

    # kill the leader of RaftNode00: the open cluster page shows the role change by itself
    await in_browser(lambda: browser.get(f"{dashboard}/"))
    await wait_in_browser(browser, lambda d: int(d.find_element(By.TAG_NAME, "body").get_attribute("data-polls")
                                                  or 0) >= 1, "the page's first live poll")
    before = await in_browser(lambda: table_rows(browser, "members"))
    assert ["RaftNode00", "n0", "LEADER"] in [[r[1], r[2], r[5]] for r in before]
    g0 = cluster.group("RaftNode00")
    await g0.kill("n0")

    def new_leader_shown(d: webdriver.Chrome) -> bool:
        rows = table_rows(d, "members")
        return any(r[1] == "RaftNode00" and r[2] in ("n1", "n2") and r[5] == "LEADER" for r in rows) and not any(
            r[1] == "RaftNode00" and r[2] == "n0" and r[5] == "LEADER" for r in rows
        )

    await wait_in_browser(browser, new_leader_shown, "a new RaftNode00 leader in the page")
    events = await in_browser(lambda: browser.find_element(By.ID, "events").text)
    assert "-> LEADER" in events, events
    new = await g0.wait_leader()
    rows = await in_browser(lambda: table_rows(browser, "members"))
    assert [r[5] for r in rows if r[1] == "RaftNode00" and r[2] == new.nid] == ["LEADER"]
    await in_browser(lambda: shot(browser, tmp_path, "5-after-leader-kill"))
