"""Where fdatasync runs (dledger/flusher.py, issue 26): off the replica's loop on its flusher thread,
each job completed by exactly one call back on the loop, errors handed back (the replica then fails
stop)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from dledger.flusher import SyncFlusher, ThreadFlusher


async def test_a_thread_job_runs_off_the_loop_and_completes_once_on_it(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    flusher = ThreadFlusher(loop, "test")
    ran_on: list[int] = []
    done_on: list[tuple[int, BaseException | None]] = []
    finished = loop.create_future()

    def done(exc: BaseException | None) -> None:
        done_on.append((threading.get_ident(), exc))
        finished.set_result(None)

    flusher.submit(lambda: ran_on.append(threading.get_ident()), done)
    await asyncio.wait_for(finished, 5)
    flusher.close()
    assert ran_on and ran_on[0] != threading.get_ident()
    assert done_on == [(threading.get_ident(), None)]


async def test_a_failing_thread_job_hands_its_error_back() -> None:
    loop = asyncio.get_running_loop()
    flusher = ThreadFlusher(loop, "test")
    got = loop.create_future()

    def job() -> None:
        raise OSError(5, "EIO from a dying disk")

    flusher.submit(job, got.set_result)
    exc = await asyncio.wait_for(got, 5)
    flusher.close()
    assert isinstance(exc, OSError) and exc.errno == 5


def test_the_sync_flusher_runs_at_once() -> None:
    seen: list[object] = []
    SyncFlusher().submit(lambda: seen.append("job"), seen.append)
    assert seen == ["job", None]


async def test_a_group_flushes_on_each_replicas_flusher_thread(tmp_path: Path) -> None:
    """The replica end to end: appends commit on a majority, every replica's flush jobs ran on its
    own flusher thread, and the leader counted itself once they returned."""
    from tests.dledger.harness import InProcCluster, wait_until

    cluster = InProcCluster(str(tmp_path))
    await cluster.start()
    try:
        leader = await cluster.leader()
        locs = [await leader.append([f"m{i}".encode()]) for i in range(20)]
        last = locs[-1][0].index
        await wait_until(lambda: all(n.applied_index >= last for n in cluster.nodes.values()), 10, "applied")
        for node in cluster.nodes.values():
            assert isinstance(node._flusher, ThreadFlusher) and node._flusher.jobs_done > 0
            assert node.core.counters["fsync"] > 0
        assert leader.core.self_match_index() >= last  # the leader counted itself once synced
    finally:
        await cluster.stop()
