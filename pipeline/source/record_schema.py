"""The columns of `rows=records`: those of Spark's Kafka source, as a Spark StructType and in
Arrow's types. Apart from the decoding (pipeline.source.record_rows), so that what plans a read
never loads the compiled kernels."""

from __future__ import annotations

from functools import cache

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
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

__all__ = ["record_arrow_schema", "record_struct"]


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


@cache
def record_arrow_schema(*, include_headers: bool) -> pa.Schema:
    """record_struct's columns in Arrow's types, by Spark's own conversion (the one it checks
    the data source's batches with); timestamps are UTC instants."""
    return to_arrow_schema(record_struct(include_headers=include_headers), timezone="UTC")
