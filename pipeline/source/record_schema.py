"""The columns of `rows=records`: those of Spark's Kafka source, as a Spark StructType and in
Arrow's types. Apart from the decoding (pipeline.source.record_rows), so that what plans a read
never loads the compiled kernels."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

__all__ = [
    "VALUE_COLUMNS",
    "record_arrow_schema",
    "record_struct",
    "value_arrow_type",
    "value_columns_field",
    "value_struct",
]

VALUE_COLUMNS = "valueColumns"
"""With option valueSchema: the column of carriers' values as the schema's typed fields."""


def record_struct(*, include_headers: bool, value: StructType | None = None) -> StructType:
    """The columns of Spark's Kafka source (KafkaRecordToRowConverter), in its order; with
    `value` (option valueSchema) then the valueColumns struct."""
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
    if value is not None:
        fields.append(StructField(VALUE_COLUMNS, value))
    return StructType(fields)


@cache
def record_arrow_schema(*, include_headers: bool) -> pa.Schema:
    """record_struct's columns in Arrow's types, by Spark's own conversion (the one it checks
    the data source's batches with); timestamps are UTC instants."""
    return to_arrow_schema(record_struct(include_headers=include_headers), timezone="UTC")


def value_struct(text: str, parse_ddl: Callable[[str], DataType] | None = None) -> StructType:
    """Option valueSchema as a StructType: a StructType's JSON (`{"type": "struct", ...}`, what
    StructType.json() writes) or Spark DDL (needs `parse_ddl`, Spark's StructType.fromDDL, so
    only where a session runs). Raises ValueError saying what is wrong."""
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            parsed: DataType = StructType.fromJson(json.loads(stripped))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"not a Spark StructType's JSON: {exc}") from None
    elif parse_ddl is None:
        raise ValueError("Spark DDL is read by Spark; give the StructType's JSON here")
    else:
        try:
            parsed = parse_ddl(stripped)
        except Exception as exc:  # Spark's ParseException
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"not Spark DDL: {first}") from None
    if not isinstance(parsed, StructType) or not parsed.fields:
        raise ValueError(f"expected a list of fields, got {parsed.simpleString()}")
    return parsed


def value_arrow_type(struct: StructType) -> pa.StructType:
    """The Arrow type Spark converts `struct` to (and checks a batch's valueColumns against)."""
    converted = to_arrow_schema(StructType([StructField(VALUE_COLUMNS, struct)]), timezone="UTC")
    kind = converted.field(VALUE_COLUMNS).type
    assert isinstance(kind, pa.StructType)
    return kind


def value_columns_field(kind: pa.StructType) -> pa.Field:
    return pa.field(VALUE_COLUMNS, kind)
