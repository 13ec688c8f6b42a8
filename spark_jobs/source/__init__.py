"""``dledger-mq``: a PySpark data source (Spark 4's Python Data Source API) that reads topics of
this broker, in batch and in Structured Streaming. See docs/SPARK.md.

    import spark_jobs.source             # before or after the SparkSession is made
    df = (spark.read.format("dledger-mq")
          .option("namesrv", "127.0.0.1:9876").option("topic", "TopicTest")
          .option("credentialsFile", "run/admin-credentials.yml")   # brokers with ACL
          .load())

How Spark finds the format: importing this package registers it with the active SparkSession
(``register``); with none active yet, it points the session made later at the top-level package
``pyspark_dledger_mq``, which Spark 4 finds by itself (it registers the ``DefaultSource`` of every
``pyspark_*`` module it sees in a Python worker started with ``PYSPARK_PYTHON`` and the JVM's
``PYTHONPATH``): ``PYSPARK_PYTHON`` defaults to this interpreter and the directory holding
``pyspark_dledger_mq`` is added to ``PYTHONPATH``. An installed (non-editable) package is found
that way without any import, given ``PYSPARK_PYTHON`` (or ``python3`` on PATH) is this interpreter.

Modules:
- ``options``    the options, parsed and checked (credentials and TLS resolved on the driver)
- ``security``   credentials and TLS as they travel to the tasks; refusals (401/403) explained
- ``plan``       offsets and ranges from what the cluster said (pure)
- ``schema``     the row schema and the pull answer → Arrow codec
- ``cluster``    the driver's questions to the cluster (routes, queue offsets, offsets by time)
- ``reader``     one range read on an executor (the pure ``step`` and the pull loop)
- ``datasource`` the DataSource, batch and stream readers
- ``bench``      ``python -m spark_jobs.source.bench``: load N messages, time a batch read
"""

from __future__ import annotations

import os
import sys
from typing import Any

from spark_jobs.source.datasource import FORMAT, DledgerMQDataSource

__all__ = ["FORMAT", "DledgerMQDataSource", "register"]


def register(spark: Any = None) -> None:
    """Make ``format("dledger-mq")`` known to ``spark`` (default: the active session)."""
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise RuntimeError(
                "no active SparkSession to register the dledger-mq data source with: pass one to "
                "register(spark); or import spark_jobs.source before making the session, which then finds "
                "the source by itself (docs/SPARK.md, 'Quick start')"
            )
    spark.dataSource.register(DledgerMQDataSource)


def _let_spark_find_it() -> None:
    """No session yet: make the one made later find ``pyspark_dledger_mq`` (module doc). Spark's
    lookup runs once per JVM, in a Python worker that inherits this process's environment."""
    import pyspark_dledger_mq

    root = os.path.dirname(os.path.dirname(os.path.abspath(pyspark_dledger_mq.__file__)))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, root])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def _register_on_import() -> None:
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:
        register()
    else:
        _let_spark_find_it()


_register_on_import()
