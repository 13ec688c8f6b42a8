from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from tests.broker.client.fakes import FakeCluster

ClusterFactory = Callable[..., Awaitable[FakeCluster]]


@pytest.fixture
async def make_cluster() -> AsyncIterator[ClusterFactory]:
    made: list[FakeCluster] = []

    async def make(**kwargs: Any) -> FakeCluster:
        cluster = await FakeCluster.start(**kwargs)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        await cluster.close()
