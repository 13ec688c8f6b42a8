"""The rows the ``dledger-mq`` data source produces, and the one codec from pull answers to Arrow.

One row per stored message (the broker API's Message, docs/API.md)::

    topic string, broker string, queue_id int, queue_offset bigint, msg_id string,
    unique_id string, keys array<string>, tags string, properties map<string,string>,
    body binary, born_timestamp timestamp, store_timestamp timestamp

``tags`` is ``""`` for a message sent without tags; ``keys`` and ``properties`` are empty, never
null. Timestamps are the broker's milliseconds as UTC instants.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs._arrow import pa

SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("broker", StringType(), False),
        StructField("queue_id", IntegerType(), False),
        StructField("queue_offset", LongType(), False),
        StructField("msg_id", StringType(), False),
        StructField("unique_id", StringType(), False),
        StructField("keys", ArrayType(StringType(), False), False),
        StructField("tags", StringType(), False),
        StructField("properties", MapType(StringType(), StringType(), False), False),
        StructField("body", BinaryType(), False),
        StructField("born_timestamp", TimestampType(), False),
        StructField("store_timestamp", TimestampType(), False),
    ]
)

# What Spark checks a Python data source's Arrow batches against (plan_data_source_read.py).
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")


def to_record_batch(messages: Sequence[Mapping[str, Any]]) -> Any:
    """Pull-answer messages (msgpack-decoded maps) → one ``pyarrow.RecordBatch`` of ``SCHEMA``."""
    f = ARROW_SCHEMA.field
    columns = [
        pa.array([m["topic"] for m in messages], f("topic").type),
        pa.array([m["broker_name"] for m in messages], f("broker").type),
        pa.array([m["queue_id"] for m in messages], f("queue_id").type),
        pa.array([m["queue_offset"] for m in messages], f("queue_offset").type),
        pa.array([m["msg_id"] for m in messages], f("msg_id").type),
        pa.array([m["unique_id"] for m in messages], f("unique_id").type),
        pa.array([m.get("keys") or [] for m in messages], f("keys").type),
        pa.array([m.get("tags") or "" for m in messages], f("tags").type),
        pa.array([list((m.get("properties") or {}).items()) for m in messages], f("properties").type),
        pa.array([m["body"] for m in messages], f("body").type),
        pa.array([m["born_ts"] * 1000 for m in messages], f("born_timestamp").type),
        pa.array([m["store_ts"] * 1000 for m in messages], f("store_timestamp").type),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)
