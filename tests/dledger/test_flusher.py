"""Where fdatasync runs (dledger/flusher.py, issue 26): off the replica's loop, each job completed by
exactly one call back on the loop, errors handed back (the replica then fails stop)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from dledger.flusher import SyncFlusher, ThreadFlusher, UringFlusher, make_flusher


def _uring_or_skip(loop: asyncio.AbstractEventLoop) -> UringFlusher:
    try:
        return UringFlusher(loop, "test")
    except (ImportError, OSError) as exc:  # no liburing, or the kernel refuses io_uring here
        pytest.skip(f"io_uring is not available: {exc}")


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


async def test_io_uring_syncs_every_descriptor_of_a_job_then_calls_back_once(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    flusher = _uring_or_skip(loop)
    fds = [os.open(tmp_path / f"f{k}", os.O_RDWR | os.O_CREAT, 0o600) for k in range(3)]
    try:
        for fd in fds:
            os.write(fd, b"x" * 4096)
        calls: list[BaseException | None] = []
        finished = loop.create_future()

        def done(exc: BaseException | None) -> None:
            calls.append(exc)
            finished.set_result(None)

        flusher.submit_fds(fds, done)
        await asyncio.wait_for(finished, 5)
        await asyncio.sleep(0)  # nothing else arrives for the job
        assert calls == [None] and flusher.in_flight == 0
        # a descriptor that is not open: the job completes with the kernel's error
        bad = loop.create_future()
        os.close(fds[2])
        flusher.submit_fds([fds[0], fds[2]], bad.set_result)
        exc: Any = await asyncio.wait_for(bad, 5)
        assert isinstance(exc, OSError) and exc.errno == 9
    finally:
        for fd in fds[:2]:
            os.close(fd)
        flusher.close()


async def test_make_flusher_falls_back_to_the_thread_where_io_uring_is_refused(monkeypatch: Any) -> None:
    loop = asyncio.get_running_loop()

    def refused(*_a: Any, **_k: Any) -> None:
        raise PermissionError(1, "io_uring_setup: Operation not permitted")  # a container's seccomp

    monkeypatch.setattr(UringFlusher, "__init__", refused)
    flusher = make_flusher(loop, "test", "auto")
    assert isinstance(flusher, ThreadFlusher)
    flusher.close()
    with pytest.raises(PermissionError):
        make_flusher(loop, "test", "io_uring")  # asked for by name: no silent fallback
    with pytest.raises(ValueError):
        make_flusher(loop, "test", "carrier-pigeon")


def test_the_sync_flusher_runs_at_once() -> None:
    seen: list[object] = []
    SyncFlusher().submit(lambda: seen.append("job"), seen.append)
    assert seen == ["job", None]


async def test_a_group_on_io_uring_replicates_and_counts_only_what_the_kernel_synced(tmp_path: Path) -> None:
    """The replica end to end with ``dLegerFlusher=io_uring``: appends commit on a majority, every
    replica's flush jobs went to the kernel (no flusher thread started)."""
    from tests.dledger.harness import InProcCluster, wait_until

    _uring_or_skip(asyncio.get_running_loop()).close()
    cluster = InProcCluster(str(tmp_path), overrides={"flusher": "io_uring"})
    await cluster.start()
    try:
        leader = await cluster.leader()
        locs = [await leader.append([f"m{i}".encode()]) for i in range(20)]
        last = locs[-1][0].index
        await wait_until(lambda: all(n.applied_index >= last for n in cluster.nodes.values()), 10, "applied")
        for node in cluster.nodes.values():
            assert isinstance(node._flusher, UringFlusher) and node._flusher.jobs_done > 0
            assert node.core.counters["fsync"] > 0 and node._flusher._thread is None
        assert leader.core.self_match_index() >= last  # the leader counted itself once synced
        assert not any(t.name.startswith("dledger-flush-") for t in threading.enumerate())
    finally:
        await cluster.stop()
