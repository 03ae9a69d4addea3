"""The `kipside` Python data source: Kafka for PySpark through kipside's own protocol code.

`spark.read.format("kipside")` and `spark.readStream.format("kipside")` take the options of
Spark's Kafka source (pipeline.source.options). The driver plans offset ranges
(pipeline.source.planner, pipeline.source.ranges); each Spark task reads one range with the
blocking client (pipeline.kafka.fetcher) and yields pyarrow RecordBatches: whole record batches
with `rows=batches`, records otherwise. Streaming reads have admission control
(maxOffsetsPerTrigger, maxBytesPerTrigger) and Trigger.AvailableNow, as Spark's own source.

Readers are pickled to executors, so they hold options only; Kafka clients live in a
per-process cache (pipeline.kafka.shared). Nothing here decodes a protocol message.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from kipside.pipeline.kafka.errors import DataLossError, KafkaError
from kipside.pipeline.kafka.fetcher import RangeReader
from kipside.pipeline.kafka.offsets import Watermarks
from kipside.pipeline.kafka.shared import drop_client, shared_client
from kipside.pipeline.notices import post_notice
from kipside.protocol import ColumnarKeys

from .batch_rows import BATCH_STRUCT, batch_rows
from .options import OptionError, SourceOptions, load_key_file, parse_source_options
from .planner import Planner, skip_lost
from .ranges import (
    OffsetRange,
    Offsets,
    byte_limit,
    decode_offsets,
    densities,
    encode_offsets,
    plan_ranges,
    rate_limit,
)
from .record_schema import record_struct, value_arrow_type, value_struct

__all__ = ["KipsideDataSource", "RangePartition"]

log = logging.getLogger("kipside.source")
TopicPartition = tuple[str, int]


class RangePartition(InputPartition):
    """One Spark task: one partition's offset range."""

    def __init__(self, offset_range: OffsetRange) -> None:
        super().__init__(offset_range)
        self.range = offset_range


class KipsideDataSource(DataSource):
    """Spark discovers it as `kipside` (pyspark_kipside.DefaultSource)."""

    @classmethod
    def name(cls) -> str:
        return "kipside"

    def schema(self) -> StructType:
        rows = str(self.options.get("rows", "records")).strip().lower()
        if rows == "batches":
            return BATCH_STRUCT
        headers = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return record_struct(include_headers=headers, value=self._value_struct())

    def _value_struct(self) -> StructType | None:
        text = self.options.get("valueSchema")
        if text is None:
            return None
        try:
            return value_struct(str(text))
        except ValueError as exc:
            raise OptionError(f"option valueSchema: {exc}") from None

    def _options(self, schema: StructType, *, streaming: bool) -> SourceOptions:
        options = parse_source_options(dict(self.options), streaming=streaming)
        expected = self.schema()
        if schema.simpleString() != expected.simpleString():
            raise OptionError(
                "the kipside source has a fixed schema and cannot be set with a custom one: "
                f"it is {expected.simpleString()}; remove .schema(...)"
            )
        value = self._value_struct()
        if value is not None:  # executors get the struct as JSON: no parser needed there
            options = dataclasses.replace(options, value_schema=value.json())
        return options

    def reader(self, schema: StructType) -> DataSourceReader:
        return KipsideBatchReader(self._options(schema, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KipsideStreamReader(self._options(schema, streaming=True))


def _planner(options: SourceOptions) -> Planner:
    return Planner(shared_client(options.bootstrap, options.role, options.client), options)


def read_range(options: SourceOptions, offset_range: OffsetRange) -> Iterator[pa.RecordBatch]:
    """What one Spark task yields for its range (shared by batch and streaming reads)."""
    client = shared_client(options.bootstrap, options.role, options.client)
    reader = RangeReader(client, options.fetch, on_data_loss=log.warning)
    r = offset_range
    try:
        batches = reader.read(r.topic, r.partition, r.start, r.end)
        if options.rows == "batches":
            yield from batch_rows(r, batches)
        else:
            # Decoding records needs the compiled kernels (numba): loaded by the tasks that
            # decode, never by the planning processes that unpickle this module.
            from .record_rows import record_rows

            yield from record_rows(
                r,
                batches,
                include_headers=options.include_headers,
                max_batch_bytes=options.fetch.receive_message_max_bytes,
                source=client.where,
                value_type=_value_type(options.value_schema),
                keys=_keys(options.columnar_key_file),
            )
    except (KafkaError, OSError):
        drop_client(client)
        raise


@functools.cache
def _value_type(schema_json: str | None) -> pa.StructType | None:
    return None if schema_json is None else value_arrow_type(value_struct(schema_json))


@functools.cache
def _keys(path: str | None) -> ColumnarKeys | None:
    """The key file, read once per worker process."""
    return None if path is None else load_key_file(path)


def _ranges(
    options: SourceOptions, planner: Planner, start: Offsets, end: Offsets, log_start: Offsets
) -> list[InputPartition]:
    """The tasks of one read, after checking no offset in it is already gone (data loss is
    told here, on the driver, rather than found by a task)."""
    begin, notices = skip_lost(
        start, end, log_start, fail=options.fail_on_data_loss, where=planner.client.where
    )
    for text in notices:
        log.warning("%s", text)
        post_notice(options.notice_file, text)
    return [RangePartition(r) for r in plan_ranges(begin, end, options.min_partitions)]


_SAMPLE_POINTS = (0.5, 1.0)
"""Where, in a range the byte limit cuts, more batches are sampled (as fractions of it)."""


def _byte_ends(
    planner: Planner,
    begin: Offsets,
    latest: Offsets,
    marks: Mapping[TopicPartition, Watermarks],
    limit: int,
) -> Offsets:
    """End offsets that read about `limit` bytes of batches in all (maxBytesPerTrigger).

    Sizes come from real batches: those the watermark probe saw at each start, then, where the
    limit cuts a range, those at its middle and at its planned end, so a partition whose
    batches change size along the way is planned by what it holds there."""
    samples: dict[TopicPartition, list[float | None]] = {
        tp: [m.bytes_per_offset] for tp, m in marks.items()
    }
    end = byte_limit(begin, latest, limit, densities(samples, latest))
    for point in _SAMPLE_POINTS:
        cut = {tp: e for tp, e in end.items() if e < latest[tp]}
        if not cut:
            break
        probe_at = {
            tp: min(begin[tp] + int((e - begin[tp]) * point), latest[tp] - 1)
            for tp, e in cut.items()
        }
        for tp, m in planner.watermarks(probe_at).items():
            samples.setdefault(tp, []).append(m.bytes_per_offset)
        end = byte_limit(begin, latest, limit, densities(samples, latest))
    return end


class KipsideBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        planner = _planner(self.options)
        tps = planner.partitions()
        assert self.options.ending is not None
        start = planner.resolve(self.options.starting, tps, starting=True)
        end = planner.resolve(self.options.ending, tps, starting=False)
        for tp, begin in start.items():
            if begin > end[tp]:
                raise OptionError(
                    f"option {self.options.starting.option or 'startingOffsets'}: {tp[0]}-{tp[1]} "
                    f"starts at {begin}, after its end {end[tp]}"
                )
        return _ranges(self.options, planner, start, end, planner.earliest(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_range(self.options, partition.range)


class KipsideStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over offsets JSON `{topic: {partition: next_offset}}`."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: Offsets | None = None
        self._latest: Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors need the options only; driver-side progress stays on the driver.
        return {"options": self.options, "_target": None, "_latest": None}

    def initialOffset(self) -> dict[str, dict[str, int]]:
        planner = _planner(self.options)
        start = planner.resolve(self.options.starting, planner.partitions(), starting=True)
        return encode_offsets(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        planner = _planner(self.options)
        tps = planner.partitions()
        self._target = planner.latest(planner.earliest(tps))[0]

    def latestOffset(
        self, start: dict[str, dict[str, int]], limit: ReadLimit
    ) -> dict[str, dict[str, int]]:
        marker = self.options.stop_marker
        if marker is not None and os.path.exists(marker):
            return start  # the job is stopping: no new micro-batch
        planner = _planner(self.options)
        begin = self._with_current_partitions(planner, decode_offsets(start))
        latest, marks = planner.latest(begin)
        if self._target is not None:
            latest = {tp: min(end, self._target.get(tp, begin[tp])) for tp, end in latest.items()}
        self._latest = latest
        if isinstance(limit, ReadMaxRows):
            end = rate_limit(begin, latest, limit.max_rows)
        elif isinstance(limit, ReadMaxBytes):
            end = _byte_ends(planner, begin, latest, marks, limit.max_bytes)
        else:
            end = latest
        # Never move backwards (a truncated log shows as data loss when read, not here).
        return encode_offsets({tp: max(off, begin[tp]) for tp, off in end.items()})

    def _with_current_partitions(self, planner: Planner, start: Offsets) -> Offsets:
        """`start` plus new partitions (from their earliest offset, as Spark does), minus
        deleted ones (data loss unless failOnDataLoss=false)."""
        current = set(planner.partitions())
        gone = sorted(set(start) - current)
        if gone:
            names = ", ".join(f"{t}-{p}" for t, p in gone)
            text = f"partitions {names} no longer exist in {planner.client.where}"
            if self.options.fail_on_data_loss:
                raise DataLossError(
                    f"{text}: records not yet read from them are lost. Set "
                    "failOnDataLoss=false to go on without them"
                )
            log.warning("%s; going on without them (failOnDataLoss=false)", text)
        begin = {tp: off for tp, off in start.items() if tp in current}
        begin.update(planner.earliest(current - set(begin)))
        return begin

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return None if self._latest is None else encode_offsets(self._latest)

    def partitions(
        self, start: dict[str, dict[str, int]], end: dict[str, dict[str, int]]
    ) -> Sequence[InputPartition]:
        planner = _planner(self.options)
        begin = decode_offsets(start)
        stop = decode_offsets(end)
        log_start = planner.earliest(stop)
        begin = {tp: begin.get(tp, log_start[tp]) for tp in stop}  # new partitions: earliest
        return _ranges(self.options, planner, begin, stop, log_start)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_range(self.options, partition.range)

    def commit(self, end: dict[str, dict[str, int]]) -> None:
        """Nothing to do: the checkpoint keeps the offsets, no consumer group is involved."""

    def stop(self) -> None:
        """Clients are per process and closed with it."""
