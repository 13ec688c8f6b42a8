"""The SparkSession the audit runs in: local mode by default, ``--master`` (or spark-submit) otherwise.

Settings suit a small machine and small jobs: no UI, no console progress bar, few shuffle partitions
(2 per core locally), adaptive execution, UTC. Python workers run the interpreter that runs the
audit (``PYSPARK_PYTHON`` defaults to ``sys.executable``), so the venv's packages are there.
An active session (spark-submit, a test fixture) is reused as it is.
"""

from __future__ import annotations

import os
import sys

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

__all__ = ["get_session"]


def get_session(
    master: str | None = None,
    *,
    app_name: str = "dledger-audit",
    shuffle_partitions: int | None = None,
    driver_memory: str = "2g",
    conf: dict[str, str] | None = None,
) -> SparkSession:
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if SparkContext._active_spark_context is not None:  # a session made in another thread: reuse as is
        return SparkSession.builder.getOrCreate()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    configured = SparkConf().get("spark.master", None)  # set when launched by spark-submit
    master = master or configured or "local[*]"
    if shuffle_partitions is None:
        shuffle_partitions = 2 * (os.cpu_count() or 1) if master.startswith("local") else 200
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", driver_memory)
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
