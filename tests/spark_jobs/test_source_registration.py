"""``spark.read.format("dledger-mq")`` without calling ``register(spark)`` (issue 28, papercut 7): it
failed with Spark's bare ``DATA_SOURCE_NOT_FOUND`` unless a session was active when
``spark_jobs.source`` was imported. Each case is a fresh Python process (Spark looks its static
Python data sources up once per JVM) that loads the format with no options: found, it answers
with its schema (nothing is read until an action)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READ = (
    "from pyspark.sql import SparkSession\n"
    "spark = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate()\n"
    "try:\n"
    "    print('RESULT found', ','.join(spark.read.format('dledger-mq').load().columns))\n"
    "except Exception as exc:\n"
    "    print('RESULT', 'DATA_SOURCE_NOT_FOUND' if 'DATA_SOURCE_NOT_FOUND' in str(exc) else repr(exc)[:500])\n"
    "spark.stop()\n"
)


def read_format(prelude: str, env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    r = subprocess.run([sys.executable, "-c", prelude + READ], capture_output=True, text=True, timeout=280,
                       cwd="/", env={**clean, **env})
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT")]
    assert lines, f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return lines[-1]


def test_importing_the_source_before_the_session_exists_is_enough() -> None:
    got = read_format("import spark_jobs.source\n", {})
    assert got.startswith("RESULT found") and "queue_offset" in got, got


def test_an_installed_source_is_found_without_any_import() -> None:
    """What a (non-editable) install gives: the top-level ``pyspark_dledger_mq`` on the workers'
    path and PYSPARK_PYTHON an interpreter that has the project."""
    got = read_format("", {"PYTHONPATH": REPO, "PYSPARK_PYTHON": sys.executable})
    assert got.startswith("RESULT found") and "queue_offset" in got, got
