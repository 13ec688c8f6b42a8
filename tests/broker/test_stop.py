"""Stopping a broker replica: what clients in flight see (real brokers on the in-process log)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.broker.inproc_cluster import WAIT_S, InProcBrokerCluster
from tests.dledger.harness import wait_until


async def test_a_stopping_broker_answers_held_long_polls_at_once(tmp_path: Path) -> None:
    """A pull held for new messages is answered NO_NEW_MSG when its replica stops; the stop does not
    wait out the hold (it used to: up to longPollingMaxMs, 30 s, per shutdown)."""
    baseline = InProcBrokerCluster.baseline()
    cluster = await InProcBrokerCluster.start(str(tmp_path))
    try:
        await cluster.create_topic("T", 1)
        g = cluster.groups[0]
        await g.wait_replicated()
        n1 = g.replicas[1]
        body = {"topic": "T", "queue_id": 0, "offset": 0, "suspend_ms": 30_000}
        held = asyncio.ensure_future(cluster.call(n1.addr, "POST", "/v1/pull", body, timeout_s=60))
        await wait_until(lambda: n1.tap.seen("/v1/pull"), WAIT_S, "the pull to reach n1")
        await asyncio.wait_for(g.stop("n1"), WAIT_S)  # well before the 30 s hold ends
        answer = await asyncio.wait_for(held, WAIT_S)
        assert (answer["status"], answer["messages"]) == ("NO_NEW_MSG", [])
    finally:
        await cluster.stop()
    await InProcBrokerCluster.assert_nothing_left(baseline)


async def test_a_replica_that_failed_fails_stop(tmp_path: Path) -> None:
    """Found by the compose drill: a replica's tick thread died (an exception in a tick callback)
    and the broker went on answering HTTP; its container stayed up, unable to vote or replicate.
    The broker now sets ``failed`` (``serve`` stops it and exits 70 for a supervisor to restart).
    Issue 26: the tick runs on the broker's loop; a tick that raises fails the replica the same way."""
    baseline = InProcBrokerCluster.baseline()
    cluster = await InProcBrokerCluster.start(str(tmp_path))
    try:
        g = cluster.groups[0]
        await g.wait_replicated()
        victim = g.replicas[1].broker
        assert not victim.failed.is_set()

        def boom() -> None:
            raise RuntimeError("a tick callback failed")

        victim.node.core.sync.addOnTickCallback(boom)
        await wait_until(victim.failed.is_set, WAIT_S, "the broker to notice its failed replica")
        assert isinstance(victim.node.fatal, RuntimeError)
    finally:
        await cluster.stop(replicas_may_fail=True)
    await InProcBrokerCluster.assert_nothing_left(baseline)
