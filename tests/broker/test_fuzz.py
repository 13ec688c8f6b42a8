"""The seeded fuzz of every broker and NameServer endpoint, HTTP and binary (tests/broker/fuzz.py),
against a real in-process cluster: a small seeded run in the fast tier, 20,000 requests per seed in
the slow tier. Targets (issue 10; issue 23): 0 x 5xx, 0 hangs, 0 dead replicas, every error with a
code, identical logs, no record refused at apply, nothing logged at ERROR. The figures, the seed and
the time taken are printed (pytest -s); a failure names the seed and request to replay.

    .venv/bin/python -m tests.broker.fuzz --seed 7 --requests 20000    # the same, as a command
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import pytest

from tests.broker import fuzz


async def _fuzz(tmp_path: Any, caplog: Any, seed: int, requests: int) -> None:
    caplog.set_level(logging.WARNING)
    print(f"fuzz seed {seed}, {requests} requests (replay: python -m tests.broker.fuzz --seed {seed} "
          f"--requests {requests})")
    cluster = await fuzz.fuzz_cluster(str(tmp_path / "cluster"))
    try:
        started = time.monotonic()
        figures = await fuzz.run(cluster, seed, requests)
        took_s = time.monotonic() - started
        problems = await fuzz.check_after(cluster)
    finally:
        await cluster.stop()
    print(f"fuzz seed {seed}: {figures.line()} in {took_s:.0f} s")
    assert figures.requests == requests
    assert not figures.failures, "\n".join(figures.failures[:20])
    assert figures.hangs == 0 and figures.five_xx == 0 and figures.uncoded_errors == 0
    assert not problems, problems  # every replica alive, identical logs, nothing refused at apply
    assert figures.by_status[200] > requests // 20, "the fuzz barely reached the handlers"
    assert figures.binary > requests // 10 and figures.raw_frames > requests // 40, "the binary port barely fuzzed"
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not logged, [(r.name, r.getMessage()[:200]) for r in logged[:10]]


async def test_fuzz_fast(tmp_path: Any, caplog: Any) -> None:
    seed = int(os.environ.get("FUZZ_SEED", "20261123"))
    await _fuzz(tmp_path, caplog, seed, 1500)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
async def test_fuzz_20000_per_seed(tmp_path: Any, caplog: Any, seed: int) -> None:
    await _fuzz(tmp_path, caplog, seed, 20_000)
