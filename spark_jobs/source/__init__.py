"""``dledger-mq``: a PySpark data source (Spark 4's Python Data Source API) that reads topics of
this broker, in batch and in Structured Streaming. See docs/SPARK.md.

    from spark_jobs.source import register
    register(spark)                      # also done on import when a SparkSession is active
    df = (spark.read.format("dledger-mq")
          .option("namesrv", "127.0.0.1:9876").option("topic", "TopicTest")
          .option("credentialsFile", "run/admin-credentials.yml")   # brokers with ACL
          .load())

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

from typing import Any

from spark_jobs.source.datasource import FORMAT, DledgerMQDataSource

__all__ = ["FORMAT", "DledgerMQDataSource", "register"]


def register(spark: Any = None) -> None:
    """Make ``format("dledger-mq")`` known to ``spark`` (default: the active session)."""
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise RuntimeError("no active SparkSession: pass one to register(spark)")
    spark.dataSource.register(DledgerMQDataSource)


def _register_with_active_session() -> None:
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:
        register()


_register_with_active_session()
