"""The columns of `rows=records`: those of Spark's Kafka source, as a Spark StructType and in
Arrow's types. Apart from the decoding (pipeline.source.record_rows), so that what plans a read
never loads the compiled kernels."""

from __future__ import annotations

import json
from functools import cache
from typing import Final

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from kipside.protocol import (
    ArrayOf,
    Atomic,
    DecimalOf,
    MapOf,
    StructOf,
    ValueSchemaError,
    ValueType,
    parse_ddl_schema,
)

__all__ = [
    "VALUE_COLUMNS",
    "record_arrow_schema",
    "record_struct",
    "spark_type",
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


def value_struct(text: str) -> StructType:
    """Option valueSchema as a StructType: a StructType's JSON (`{"type": "struct", ...}`, what
    StructType.json() writes) or Spark DDL, read by kipside's own DDL reader (the one the
    sidecar's columnar rules use: no JVM, so it works where a data source is planned). Top-level
    fields are nullable. Raises ValueError saying what is wrong."""
    stripped = text.strip()
    if not stripped.startswith("{"):
        try:
            return spark_type(parse_ddl_schema(stripped, "option valueSchema").struct)
        except ValueSchemaError as exc:
            raise ValueError(str(exc)) from None
    try:
        parsed: DataType = StructType.fromJson(json.loads(stripped))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a Spark StructType's JSON: {exc}") from None
    if not isinstance(parsed, StructType) or not parsed.fields:
        raise ValueError(f"expected a list of fields, got {parsed.simpleString()}")
    return parsed


def spark_type(kind: ValueType) -> StructType:
    """A struct value type (protocol.value_schema) as Spark's StructType (fields as given,
    nullable or not)."""
    converted = _spark(kind)
    assert isinstance(converted, StructType)
    return converted


_SPARK_ATOMIC: Final[dict[str, DataType]] = {
    "boolean": BooleanType(),
    "tinyint": ByteType(),
    "smallint": ShortType(),
    "int": IntegerType(),
    "bigint": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "string": StringType(),
    "binary": BinaryType(),
    "date": DateType(),
    "timestamp": TimestampType(),
    "timestamp_ntz": TimestampNTZType(),
}


def _spark(kind: ValueType) -> DataType:
    if isinstance(kind, Atomic):
        return _SPARK_ATOMIC[kind.name]
    if isinstance(kind, DecimalOf):
        return DecimalType(kind.precision, kind.scale)
    if isinstance(kind, ArrayOf):
        return ArrayType(_spark(kind.element), kind.contains_null)
    if isinstance(kind, MapOf):
        return MapType(_spark(kind.key), _spark(kind.value), kind.value_contains_null)
    assert isinstance(kind, StructOf)
    return StructType([StructField(f.name, _spark(f.type), f.nullable) for f in kind.fields])


def value_arrow_type(struct: StructType) -> pa.StructType:
    """The Arrow type Spark converts `struct` to (and checks a batch's valueColumns against)."""
    converted = to_arrow_schema(StructType([StructField(VALUE_COLUMNS, struct)]), timezone="UTC")
    kind = converted.field(VALUE_COLUMNS).type
    assert isinstance(kind, pa.StructType)
    return kind


def value_columns_field(kind: pa.StructType) -> pa.Field:
    return pa.field(VALUE_COLUMNS, kind)
