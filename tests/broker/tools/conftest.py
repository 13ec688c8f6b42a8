"""Fixtures: a fresh in-process cluster per test (one real NameServer, two real broker groups of three
replicas on the in-process log, ACL on: ``tests/broker/inproc_cluster.py``), the admin's credentials in
the environment as a user would export them, and a way to run ``mqadmin``'s ``main`` and capture
what it prints.

``main`` runs ``asyncio.run``, so tests run it on a worker thread (``await mqadmin(...)``) while the
cluster keeps serving on the test's event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from broker.tools.mqadmin import main as mqadmin_main
from tests.acl_fixtures import ADMIN
from tests.broker.inproc_cluster import InProcBrokerCluster, fail_on_thread_exceptions


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    fail_on_thread_exceptions(items, Path(__file__).parent)


@pytest.fixture(autouse=True)
def admin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tools (in this process and in child processes) sign as the admin; no NameServer from
    the environment."""
    monkeypatch.setenv("DLEDGER_ACCESS_KEY", ADMIN.access_key)
    monkeypatch.setenv("DLEDGER_SECRET_KEY", ADMIN.secret_key)
    for name in ("DLEDGER_CREDENTIALS_FILE", "NAMESRV_ADDR", "DLEDGER_TLS_CA_FILE", "DLEDGER_TLS"):
        monkeypatch.delenv(name, raising=False)


ClusterFactory = Callable[..., Awaitable[InProcBrokerCluster]]


@pytest.fixture
async def make_cluster(tmp_path: Path) -> AsyncIterator[ClusterFactory]:
    """``await make_cluster(namesrvs=2)``: groups RaftNode00 and RaftNode01; stopped at teardown."""
    baseline = InProcBrokerCluster.baseline()
    made: list[InProcBrokerCluster] = []

    async def make(**kwargs: Any) -> InProcBrokerCluster:
        kwargs.setdefault("groups", ("RaftNode00", "RaftNode01"))
        cluster = await InProcBrokerCluster.start(str(tmp_path / f"cluster{len(made)}"), **kwargs)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        await cluster.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)


@pytest.fixture
async def cluster(make_cluster: ClusterFactory) -> InProcBrokerCluster:
    return await make_cluster()


@dataclasses.dataclass
class Run:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


Mqadmin = Callable[..., Awaitable[Run]]


@pytest.fixture
def mqadmin(cluster: InProcBrokerCluster, capsys: pytest.CaptureFixture[str]) -> Mqadmin:
    """``await mqadmin("topicList", "--json")``: runs ``main`` against the cluster (``-n`` added
    unless given)."""

    async def run(*args: str) -> Run:
        argv = list(args)
        if "-n" not in argv and "--help" not in argv and "-h" not in argv:
            argv += ["-n", cluster.namesrv_addr]
        capsys.readouterr()
        rc = await asyncio.to_thread(mqadmin_main, argv)
        cap = capsys.readouterr()
        return Run(rc, cap.out, cap.err)

    return run
