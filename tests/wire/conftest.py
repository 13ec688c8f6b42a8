"""The wire tier (issue 25): the official RocketMQ clients and mqadmin against a cluster.

Target: ``--wire-target ours|rocketmq`` (when tests/wire is on the command line) or WIRE_TARGET (default
``ours``). ``ours`` starts ``dledger-cluster up`` twice (ACL on, then off); ``rocketmq`` uses the Apache
RocketMQ 5.3.1 reference of ../shared/bench/rocketmq (ACL off; its conf has none), to validate the harness."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.wire.harness import OursCluster, ReferenceCluster, Target, mqadmin_home, remoting_probe


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--wire-target", choices=["ours", "rocketmq"], default=None,
                     help="wire tier: our dledger-cluster (default) or the Apache RocketMQ 5.3.1 reference")


def wire_target_name(config: pytest.Config) -> str:
    name = config.getoption("--wire-target", default=None) or os.environ.get("WIRE_TARGET", "ours")
    if name not in ("ours", "rocketmq"):
        raise pytest.UsageError(f"WIRE_TARGET must be ours or rocketmq, not {name!r}")
    return str(name)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "target" in metafunc.fixturenames:
        if wire_target_name(metafunc.config) == "ours":
            # WIRE_ACL=on|off|both (default both): both is the requirement; one mode halves the time.
            choice = os.environ.get("WIRE_ACL", "both")
            modes = {"on": ["acl"], "off": ["noacl"]}.get(choice, ["acl", "noacl"])
        else:
            modes = ["noacl"]
        metafunc.parametrize("target", modes, indirect=True, scope="session")


@pytest.fixture(scope="session")
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    name = wire_target_name(request.config)
    root = tempfile.mkdtemp(prefix=f"wire-{name}-{request.param}-")
    seed = random.randrange(1 << 30)
    print(f"wire target {name} {request.param} in {root} (seed {seed})")
    cluster: OursCluster | ReferenceCluster
    if name == "ours":
        cluster = OursCluster(os.path.join(root, "cluster"), acl=request.param == "acl", seed=seed)
    else:
        cluster = ReferenceCluster(root)
    t = cluster.up()
    t.extra["probe"] = remoting_probe(t.namesrv, t.credentials)
    print(f"remoting probe of {t.namesrv}: {t.extra['probe']}")
    try:
        yield t
    finally:
        cluster.down()
        if os.environ.get("WIRE_KEEP") != "1":   # WIRE_KEEP=1 keeps the cluster's data and logs for a post-mortem
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def home(tmp_path: Path) -> str:
    """user.home / HOME for one client program: its logs and local offsets stay in the test's temp dir."""
    return str(tmp_path)


@pytest.fixture
def admin_home(tmp_path: Path, target: Target) -> str:
    return mqadmin_home(str(tmp_path), target)
