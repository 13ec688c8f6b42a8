"""Fixtures: a fresh ``FakeCluster`` per test (one NameServer, two groups of three replicas) and a
way to run ``mqadmin``'s ``main`` in-process and capture what it prints."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker.mqadmin import main as mqadmin_main
from tests.broker.tools.fakes import FakeCluster


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    with FakeCluster() as c:
        yield c


@dataclasses.dataclass
class Run:
    rc: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture
def mqadmin(cluster: FakeCluster, capsys: pytest.CaptureFixture[str]) -> Callable[..., Run]:
    """``mqadmin("topicList", "--json")``: runs ``main`` against the fake cluster (``-n`` added
    unless given)."""

    def run(*args: str) -> Run:
        argv = list(args)
        if "-n" not in argv and "--help" not in argv and "-h" not in argv:
            argv += ["-n", cluster.namesrv]
        capsys.readouterr()
        rc = mqadmin_main(argv)
        cap = capsys.readouterr()
        return Run(rc, cap.out, cap.err)

    return run
