"""A dledger group of three OS processes on 127.0.0.1, driven over HTTP; processes ended by PID."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from typing import Any

import pytest

from tests.dledger.harness import ProcessCluster, wait_until

pytestmark = pytest.mark.slow


async def send_many(
    c: ProcessCluster, leader: str, total: int, concurrency: int = 64
) -> list[tuple[int, int]]:
    """``total`` single-body appends, ``concurrency`` at a time; returns (index, position) per ack."""
    acked: list[tuple[int, int]] = []
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            status, body = await c.append(leader, [f"msg-{i:06d}".encode()])
            assert status == 200, body
            acked.append((body["locations"][0][0], body["locations"][0][2]))

    await asyncio.gather(*(one(i) for i in range(total)))
    return acked


async def chains_equal(c: ProcessCluster, ids: list[str], upto: int) -> None:
    firsts = [(await c.status(n))["first_index"] for n in ids]
    first = max(firsts)
    chains = {n: await c.chain(n, first, upto) for n in ids}
    ref = chains[ids[0]]
    assert len(ref) == upto - first + 1
    for n in ids[1:]:
        diverge = next(
            (first + i for i, (a, b) in enumerate(zip(ref, chains[n], strict=True)) if a != b), None
        )
        assert diverge is None, f"{ids[0]} and {n} diverge at index {diverge}"


async def all_caught_up(c: ProcessCluster, ids: list[str], index: int, timeout_s: float = 30) -> None:
    async def ok() -> bool:
        applied = [(await c.status(n))["applied_index"] for n in ids]
        return all(a >= index for a in applied)

    await wait_until(ok, timeout_s, f"{ids} to apply index {index}", step_s=0.1)


async def test_group_replicates_fails_over_and_recovers(tmp_path: Any) -> None:
    async with ProcessCluster(str(tmp_path)) as c:
        try:
            leader = await c.leader()
            acked = await send_many(c, leader, 10_000)
            top = max(i for i, _ in acked)
            ids = list(c.nodes)
            await all_caught_up(c, ids, top)
            await chains_equal(c, ids, top)
            states = [await c.state(n) for n in ids]
            assert {s["bodies"] for s in states} == {10_000} and len({s["digest"] for s in states}) == 1

            # kill -9 the leader: a new leader commits, nothing acknowledged is lost
            c.kill(leader, signal.SIGKILL)
            new_leader = await c.leader(exclude={leader})
            assert new_leader != leader
            status, body = await c.append(new_leader, [b"after-failover"])
            assert status == 200, body
            after = body["locations"][0][0]
            survivors = [n for n in ids if n != leader]
            await all_caught_up(c, survivors, after)
            await chains_equal(c, survivors, after)
            states = [await c.state(n) for n in survivors]
            assert {s["bodies"] for s in states} == {10_001}

            # the killed node restarts and catches up, applying nothing twice
            c.start_node(leader)
            await all_caught_up(c, ids, after)
            await chains_equal(c, ids, after)
            states = [await c.state(n) for n in ids]
            assert {s["bodies"] for s in states} == {10_001} and len({s["digest"] for s in states}) == 1
        except BaseException:
            print(c.dump_logs())
            raise


async def test_wiped_follower_catches_up(tmp_path: Any) -> None:
    async with ProcessCluster(
        str(tmp_path), extra={"mappedFileSizeCommitLog": str(256 << 10), "maxEntryBodyBytes": str(64 << 10)}
    ) as c:
        try:
            leader = await c.leader()
            acked = await send_many(c, leader, 2000)
            victim = next(n for n in c.nodes if n != leader)
            c.kill(victim, signal.SIGKILL)
            shutil.rmtree(c.data_dir(victim))
            assert not os.path.exists(c.data_dir(victim))
            more = await send_many(c, leader, 500)
            top = max(i for i, _ in acked + more)
            c.start_node(victim)
            await all_caught_up(c, list(c.nodes), top)
            await chains_equal(c, list(c.nodes), top)
            states = [await c.state(n) for n in c.nodes]
            assert {s["bodies"] for s in states} == {2500} and len({s["digest"] for s in states}) == 1
        except BaseException:
            print(c.dump_logs())
            raise


async def test_bad_input_gets_clear_errors(tmp_path: Any) -> None:
    async with ProcessCluster(str(tmp_path)) as c:
        leader = await c.leader()
        assert c.session is not None
        port = c.nodes[leader].http_port
        base = f"http://127.0.0.1:{port}"
        cases = [
            ("POST", "/v1/append", b"\xc1not msgpack", 400, "BAD_MSGPACK"),
            ("POST", "/v1/append", b"\x93\x01\x02\x03", 400, "BAD_REQUEST"),
            ("POST", "/v1/append", b"\x81\xa6bodies\x90", 400, "BAD_REQUEST"),
            ("POST", "/v1/append", b"\x81\xa6bodies\x91\xa3str", 400, "BAD_REQUEST"),
            ("GET", "/v1/entries?from=abc", None, 400, "BAD_PARAMETER"),
            ("GET", "/v1/entries?from=1&count=0", None, 400, "BAD_PARAMETER"),
            ("POST", "/v1/transfer", b"{not json", 400, "BAD_JSON"),
            ("GET", "/v1/nope", None, 404, "NOT_FOUND"),
        ]
        for method, path, data, want_status, want_code in cases:
            async with c.session.request(method, base + path, data=data) as r:
                body = await r.json()
                assert (r.status, body["code"]) == (want_status, want_code), (path, body)
                assert body["message"]
        follower = next(n for n in c.nodes if n != leader)
        status, body = await c.append(follower, [b"x"])
        assert status == 409 and body["code"] == "NOT_LEADER" and body["leader_id"] == leader
        # still healthy after all that
        status, body = await c.append(leader, [b"ok"])
        assert status == 200
