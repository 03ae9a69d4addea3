"""`rows=records`: one row per Kafka record, with the columns of Spark's Kafka source."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from protocol.records import RecordBatchView

from .ranges import OffsetRange

__all__ = ["record_rows", "record_struct"]


def record_struct(*, include_headers: bool) -> StructType:
    """The columns of Spark's Kafka source (KafkaRecordToRowConverter), in its order."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


def record_rows(
    r: OffsetRange, batches: Iterable[RecordBatchView], *, include_headers: bool
) -> Iterator[pa.RecordBatch]:
    raise NotImplementedError("rows=records: being written")
