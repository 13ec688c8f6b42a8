"""Shared fixtures: one SparkSession for the whole run, synthetic run directories audited once."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ALL_PLANTS = {
    "lost": 2,
    "unconsumed": 1,
    "unseen": 1,
    "dup": 2,
    "logdup": 2,
    "unexpected": 2,
    "qorder": 2,
    "skip": 1,
    "korder": 2,
    "ackoff": 1,
    "incons": 1,
    "aborted": 1,
    "corrupt": 1,
    "rewind": 1,
    "diverge_body": 1,
    "diverge_chain": 1,
    "cq": 2,
    "unavail": 1,
    "drainerr": 1,
    "prefix": 1,
    "crc": 1,
    "truncation": 1,
    "offset": 1,
    "election": 1,
}


@dataclass
class AuditedRun:
    path: Path
    plan: dict[str, Any]
    exit_code: int
    summary: dict[str, Any]
    replica_files_unchanged: bool

    def details(self, check: str) -> list[dict[str, Any]]:
        with open(self.path / "audit" / "details" / f"{check}.json") as f:
            rows: list[dict[str, Any]] = json.load(f)
        return rows


# The tests on the synthetic audited runs are the slow tier's: each of those fixtures is a whole Spark
# audit (planted_run 77-100 s, clean_run 23-47 s of setup on the shared 2-core machine; docs/ARCHITECTURE.md,
# "Test tiers"). The fast tier keeps the checks against their rules (test_checks*.py).
AUDITED_RUN_FIXTURES = ("planted_run", "clean_run")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(name in getattr(item, "fixturenames", ()) for name in AUDITED_RUN_FIXTURES):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    import pyspark  # noqa: F401 - the spark extra is installed by .ci/setup.sh: fail loudly without it

    from spark_jobs.session import get_session

    # Tiny inputs: interpreting expressions beats compiling them on a cold JVM (~20 % of the
    # fast tier). The CLI test (slow tier) runs with Spark's defaults in its own JVM.
    spec = os.environ.get(
        "AUDIT_TEST_CONF", "spark.sql.codegen.wholeStage=false,spark.sql.codegen.factoryMode=NO_CODEGEN"
    )
    conf = dict(kv.split("=", 1) for kv in spec.split(",") if kv)
    session = get_session("local[2]", shuffle_partitions=2, conf=conf)
    yield session
    session.stop()


def audited(base: Path, seed: int, plants: dict[str, int], torn_tail: bool, *extra: str) -> AuditedRun:
    from spark_jobs import audit
    from spark_jobs.synth import SynthConfig, generate

    run = base / "run"
    print(f"synthetic run {run}: seed {seed}, plants {plants}")
    plan = generate(
        str(run),
        SynthConfig(
            events=4000,
            seed=seed,
            plants=plants,
            torn_tail=torn_tail,
            segment_bytes=64 << 10,
            units_per_file=200,
        ),
    )
    before = tree(run / "cluster")
    code = audit.main([str(run), "--keep-work", *extra])
    with open(run / "audit" / "summary.json") as f:
        summary = json.load(f)
    return AuditedRun(run, plan, code, summary, tree(run / "cluster") == before)


def tree(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under ``root``: (size, mtime_ns, sha256)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(root))] = (
                st.st_size,
                st.st_mtime_ns,
                hashlib.sha256(p.read_bytes()).hexdigest(),
            )
    return out


@pytest.fixture(scope="session")
def planted_run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> AuditedRun:
    seed = int(os.environ.get("AUDIT_TEST_SEED", "11"))
    return audited(tmp_path_factory.mktemp("planted"), seed, ALL_PLANTS, False)


@pytest.fixture(scope="session")
def clean_run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> AuditedRun:
    seed = int(os.environ.get("AUDIT_TEST_SEED", "12"))
    return audited(tmp_path_factory.mktemp("clean"), seed, {}, True)
