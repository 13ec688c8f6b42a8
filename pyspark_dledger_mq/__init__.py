"""Spark finds the ``dledger-mq`` data source here by itself (Spark 4 registers the ``DefaultSource``
of every top-level module named ``pyspark_*`` at the first use of a Python data source), so
``spark.read.format("dledger-mq")`` works without ``spark_jobs.source.register(spark)``."""

from spark_jobs.source.datasource import DledgerMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
