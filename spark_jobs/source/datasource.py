"""The ``dledger-mq`` format: Spark 4's Python Data Source API over the broker's pull API.

Batch (``spark.read.format("dledger-mq")``): the driver resolves start and end offsets per queue
(``plan.resolve``) and plans one partition per (group, queue, offset range); executors pull their
range from the replicas (``reader.RangeReader``) and hand Spark Arrow batches.

Streaming (``spark.readStream.format("dledger-mq")``): offsets are the JSON of
``{topic: {group: {queue id: next offset}}}``, checkpointed by Spark. ``latestOffset`` picks a
micro-batch's end (``plan.next_end``, under ``maxRecordsPerTrigger``); ``partitions(start, end)``
covers exactly ``[start, end)`` of every queue, so a batch replayed from the checkpoint after a
restart reads the very same offsets. ``Trigger.AvailableNow`` is supported: the target is every
queue's max offset when the query starts.

Where each method runs: ``DataSource``, ``reader()``/``streamReader()``, ``partitions``,
``latestOffset``, ``initialOffset`` run in Python workers on the driver (the stream reader lives
as long as the query, so it keeps the last ``ClusterView`` for ``partitions`` and
``reportLatestOffset``); ``read`` runs in executor workers and keeps no state between calls.

Credentials and TLS are resolved with the options, in the driver's worker (``reader()`` /
``streamReader()``: options, else the driver's environment), and travel inside the pickled reader
to the executors; every transport of the planner and of the tasks is built from them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from broker.client.message import MessageQueue
from broker.client.transport import Transport
from spark_jobs.source import cluster
from spark_jobs.source.options import (
    Mode,
    SourceOptionError,
    SourceOptions,
    offsets_from_json,
    offsets_to_json,
    parse_options,
)
from spark_jobs.source.plan import (
    ClusterView,
    DataLossError,
    QueueView,
    ReadRange,
    check_batch_bounds,
    next_end,
    plan_ranges,
    probe_targets,
    require_available,
    resolve,
    timestamp_queries,
)
from spark_jobs.source.reader import RangeReader, record_skipped
from spark_jobs.source.schema import SCHEMA

log = logging.getLogger(__name__)

FORMAT = "dledger-mq"


class RangePartition(InputPartition):
    def __init__(self, rng: ReadRange):
        super().__init__(rng)
        self.rng = rng


class DledgerMQDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        return BatchReader(_options(self.options, "batch"))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_schema(schema)
        return StreamReader(_options(self.options, "stream"))


def _options(raw: Any, mode: Mode) -> SourceOptions:
    """Parsed here, in the driver's Python worker: credentials and TLS not given as options come
    from the driver's environment, and travel with the reader to every task."""
    return parse_options(raw, mode)


def _check_schema(schema: StructType) -> None:
    if schema != SCHEMA:
        raise SourceOptionError(f"dledger-mq has a fixed schema ({SCHEMA.simpleString()}); got {schema.simpleString()}")


def read_partition(opts: SourceOptions, partition: InputPartition) -> Iterator[Any]:
    rng = getattr(partition, "rng", None)
    if rng is None:  # Spark's stand-in when there is nothing to read
        return iter(())
    return RangeReader(opts, rng).batches()


async def _resolve(
    transport: Transport, opts: SourceOptions, queues: dict[MessageQueue, QueueView], which: str
) -> dict[MessageQueue, int]:
    spec = opts.starting if which == "starting" else opts.ending
    queries = timestamp_queries(spec, queues)
    by_time = await cluster.offsets_by_time(transport, queues, queries, opts.security) if queries else {}
    return resolve(spec, queues, f"{which} offsets", by_time)


async def _readable(
    transport: Transport,
    opts: SourceOptions,
    queues: dict[MessageQueue, QueueView],
    start: dict[MessageQueue, int],
) -> dict[MessageQueue, int]:
    """``start`` with "oldest data" starts moved past messages retention already removed."""
    targets = probe_targets(opts.starting, start)
    if not targets:
        return dict(start)
    return {**start, **await cluster.first_readable(transport, queues, targets)}


def plan_batch(opts: SourceOptions) -> list[ReadRange]:
    async def go(transport: Transport) -> list[ReadRange]:
        queues = require_available(await cluster.fetch_view(opts, transport))
        asked = await _resolve(transport, opts, queues, "starting")
        end = await _resolve(transport, opts, queues, "ending")
        check_batch_bounds(asked, end)
        start = await _readable(transport, opts, queues, asked)
        for mq in start:
            if start[mq] > asked[mq]:  # the oldest messages are gone: nothing to read before the end
                end[mq] = max(end[mq], start[mq])
        return plan_ranges(
            start,
            end,
            queues,
            max_records_per_partition=opts.max_records_per_partition,
            prefer_followers=opts.prefer_followers,
        )

    ranges: list[ReadRange] = cluster.run(opts, go)
    return ranges


class BatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions):
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        return [RangePartition(r) for r in plan_batch(self.opts)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(self.opts, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions):
        self.opts = opts
        self._view: ClusterView | None = None
        self._target: dict[MessageQueue, int] | None = None

    def _fetch(self) -> ClusterView:
        async def go(transport: Transport) -> ClusterView:
            return await cluster.fetch_view(self.opts, transport)

        view: ClusterView = cluster.run(self.opts, go)
        self._view = view
        return view

    def initialOffset(self) -> dict[str, Any]:
        async def go(transport: Transport) -> dict[MessageQueue, int]:
            queues = require_available(await cluster.fetch_view(self.opts, transport))
            asked = await _resolve(transport, self.opts, queues, "starting")
            return await _readable(transport, self.opts, queues, asked)

        return offsets_to_json(cluster.run(self.opts, go))

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_records_per_trigger
        return ReadMaxRows(n) if n is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {mq: q.max_offset for mq, q in self._fetch().available().items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = offsets_from_json(start)
        view = self._fetch()
        max_records = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end, events = next_end(begin, view, max_records=max_records, cap=self._target)
        for e in events:
            if self.opts.fail_on_data_loss:
                raise DataLossError(f"DATA_LOSS: {e.describe()}; set failOnDataLoss=false to go on")
            record_skipped(self.opts, e.mq, [(e.from_offset, e.to_offset)], e.describe())
        for group, why in view.unreachable:
            log.warning("dledger-mq: no replica of %s answered (%s): its queues wait", group, why)
        return offsets_to_json(end)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        if self._view is None:
            return None
        return offsets_to_json({mq: q.max_offset for mq, q in self._view.available().items()})

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        view = self._view or self._fetch()
        ranges = plan_ranges(
            offsets_from_json(start),
            offsets_from_json(end),
            view.available(),
            max_records_per_partition=self.opts.max_records_per_partition,
            prefer_followers=self.opts.prefer_followers,
        )
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: Spark's checkpoint holds the offsets; the brokers keep no state for us."""
