"""``make_cluster``: real broker groups and a real NameServer on the in-process log
(``tests/broker/inproc_cluster.py``), stopped at teardown with nothing left running."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.broker.inproc_cluster import InProcBrokerCluster, fail_on_thread_exceptions

ClusterFactory = Callable[..., Awaitable[InProcBrokerCluster]]
GROUP_NAMES = ("RaftNode00", "RaftNode01")  # the groups tests/acl_fixtures.py has accounts for


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    fail_on_thread_exceptions(items, Path(__file__).parent)


@pytest.fixture
async def make_cluster(tmp_path: Path) -> AsyncIterator[ClusterFactory]:
    """``await make_cluster(n_groups=2, topics={"T": 4})``: groups RaftNode00.. of three replicas
    each, every topic created on every group with that many read and write queues."""
    baseline = InProcBrokerCluster.baseline()
    made: list[InProcBrokerCluster] = []

    async def make(n_groups: int = 1, topics: dict[str, int] | None = None, **kwargs: Any) -> InProcBrokerCluster:
        root = str(tmp_path / f"cluster{len(made)}")
        cluster = await InProcBrokerCluster.start(root, groups=GROUP_NAMES[:n_groups], **kwargs)
        made.append(cluster)
        for topic, nums in (topics or {}).items():
            await cluster.create_topic(topic, nums)
        return cluster

    yield make
    for cluster in made:
        await cluster.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)
