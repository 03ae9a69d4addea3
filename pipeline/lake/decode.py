"""Record values to typed columns, and the reason a value doesn't fit.

Records of a columnar topic's carriers come typed already (the source's valueColumns struct,
read from their Parquet segment with no JSON at all): their fields are taken as they are. Other
records' JSON values are parsed by Spark's own `from_json` (in the JVM, a whole micro-batch at a
time, no Python per record) in PERMISSIVE mode: a value that isn't JSON, or whose fields don't
convert to the schema's types, comes back with the raw text in a corrupt-record column. Null values
(tombstones) and missing required fields are caught too. Such rows go to quarantine, and only
for them (a few, normally) a Python function works out the precise reason: not UTF-8, not
JSON (and where), not an object, or which field has which wrong type.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kipside.pipeline.source.record_schema import VALUE_COLUMNS

from .landing import ERROR
from .landing import PARSED as _PARSED
from .schema import LakeSchema

__all__ = [
    "ERROR",
    "decode",
    "explain",
    "good_rows",
    "landing_rows",
    "quarantine_rows",
    "table_struct",
]

_CORRUPT: Final = "_corrupt_record"
_NULL_VALUE: Final = "the value is null (a tombstone or an empty record)"
_NOT_OBJECT: Final = "the value is not a JSON object"
_MISMATCH: Final = "the value does not match the schema"
_INT_RANGES: Final[dict[type, tuple[int, int]]] = {
    LongType: (-(2**63), 2**63 - 1),
    IntegerType: (-(2**31), 2**31 - 1),
    ShortType: (-(2**15), 2**15 - 1),
}
# What from_json takes for a double or float besides numbers (allowNonNumericNumbers is on by
# default); json.loads already reads the unquoted NaN and Infinity as floats.
_NON_NUMERIC: Final = frozenset({"NaN", "Infinity", "+Infinity", "-Infinity", "+INF", "-INF"})


def decode(df: DataFrame, schema: LakeSchema) -> DataFrame:
    """The source's record rows with the parsed value and an error column (null when fine).
    Rows with the source's valueColumns (option valueSchema) take it as their parsed value."""
    with_corrupt = StructType([*schema.struct.fields, StructField(_CORRUPT, StringType())])
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
    parsed = F.from_json(F.col("value").cast("string"), with_corrupt, options)
    no_value = F.col("value").isNull()
    if VALUE_COLUMNS in df.columns:
        typed = F.struct(
            *(F.col(f"{VALUE_COLUMNS}.`{f.name}`").alias(f.name) for f in schema.struct.fields),
            F.lit(None).cast(StringType()).alias(_CORRUPT),
        )
        parsed = F.when(F.col(VALUE_COLUMNS).isNotNull(), typed).otherwise(parsed)
        no_value = no_value & F.col(VALUE_COLUMNS).isNull()
    error: Column = (
        F.when(no_value, F.lit(_NULL_VALUE))
        .when(F.col(_PARSED).isNull(), F.lit(_NOT_OBJECT))
        .when(F.col(f"{_PARSED}.{_CORRUPT}").isNotNull(), F.lit(_MISMATCH))
    )
    for name in schema.required:
        error = error.when(
            F.col(f"{_PARSED}.`{name}`").isNull(),
            F.lit(f"required field {name!r} is missing or null"),
        )
    return df.withColumn(_PARSED, parsed).withColumn(ERROR, error)


def good_rows(decoded: DataFrame, schema: LakeSchema) -> DataFrame:
    """What the table gets: the schema's fields, where each came from, topic and date."""
    fields = [F.col(f"{_PARSED}.`{f.name}`").alias(f.name) for f in schema.struct.fields]
    return decoded.where(F.col(ERROR).isNull()).select(
        *fields,
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("topic"),
        F.to_date(F.col("timestamp")).alias("date"),
    )


def table_struct(schema: LakeSchema) -> StructType:
    """The records table's columns, as good_rows makes them: the schema's fields (required
    ones not null), where each row came from, topic and date."""
    fields = [
        StructField(f.name, f.dataType, nullable=f.name not in schema.required)
        for f in schema.struct.fields
    ]
    return StructType(
        [
            *fields,
            StructField("kafka_partition", IntegerType()),
            StructField("kafka_offset", LongType()),
            StructField("kafka_timestamp", TimestampType()),
            StructField("topic", StringType()),
            StructField("date", DateType()),
        ]
    )


def landing_rows(decoded: DataFrame, schema: LakeSchema) -> DataFrame:
    """Every row for the Iceberg writer (pipeline.lake.landing splits them): the parsed value
    as a struct of the schema's fields, where the record came from, topic and date, its raw key
    and value, and the error (null when it fit)."""
    fields = [F.col(f"{_PARSED}.`{f.name}`").alias(f.name) for f in schema.struct.fields]
    return decoded.select(
        F.struct(*fields).alias(_PARSED),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("topic"),
        F.to_date(F.col("timestamp")).alias("date"),
        F.col("key"),
        F.col("value"),
        F.col(ERROR),
    )


def quarantine_rows(decoded: DataFrame, schema: LakeSchema) -> DataFrame:
    """What quarantine gets: where the value came from, its raw bytes, and why it failed."""
    schema_json = schema.struct.json()
    reason = F.udf(lambda value, hint: explain(value, hint, schema_json), StringType())
    return decoded.where(F.col(ERROR).isNotNull()).select(
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("key"),
        F.col("value"),
        reason(F.col("value"), F.col(ERROR)).alias("error"),
        F.col("topic"),
    )


def explain(value: bytes | bytearray | None, hint: str, schema_json: str) -> str:
    """The precise reason a value failed to decode (falls back to Spark's verdict `hint`)."""
    if value is None or hint.startswith("required field"):
        return hint
    try:
        text = bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the value is not UTF-8 text (byte {exc.start})"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"the value is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    if not isinstance(data, dict):
        return f"the value is a JSON {_json_type(data)}, not an object"
    schema = StructType.fromJson(json.loads(schema_json))
    found = _mismatch(data, schema, "")
    return found or hint


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _mismatch(value: Any, kind: DataType, path: str) -> str | None:
    """The first place `value` doesn't fit `kind`, described; None if it fits."""
    if value is None:
        return None
    if isinstance(kind, StructType):
        if not isinstance(value, dict):
            return _wrong(path, kind, value)
        for f in kind.fields:
            found = _mismatch(value.get(f.name), f.dataType, f"{path}.{f.name}" if path else f.name)
            if found:
                return found
        return None
    if isinstance(kind, ArrayType):
        if not isinstance(value, list):
            return _wrong(path, kind, value)
        for i, item in enumerate(value):
            found = _mismatch(item, kind.elementType, f"{path}[{i}]")
            if found:
                return found
        return None
    if not _fits_scalar(value, kind):
        return _wrong(path, kind, value)
    return None


def _fits_scalar(value: Any, kind: DataType) -> bool:
    if isinstance(kind, LongType | IntegerType | ShortType):
        return _is_int(value, kind)
    if isinstance(kind, DoubleType | FloatType):
        if isinstance(value, str):
            return value in _NON_NUMERIC
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(kind, BooleanType):
        return isinstance(value, bool)
    if isinstance(kind, StringType):
        return True  # Spark renders any JSON value as its text
    if isinstance(kind, TimestampType) and _is_int(value, LongType()):
        return True  # seconds since the epoch, as from_json reads a JSON integer
    if isinstance(kind, TimestampType | DateType):
        if not isinstance(value, str):
            return False
        try:
            parse = datetime.date if isinstance(kind, DateType) else datetime.datetime
            parse.fromisoformat(value)
        except ValueError:
            return False
        return True
    return True  # a type Spark checks and this function doesn't know: keep Spark's verdict


def _is_int(value: Any, kind: LongType | IntegerType | ShortType) -> bool:
    low, high = _INT_RANGES[type(kind)]
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _wrong(path: str, kind: DataType, value: Any) -> str:
    shown = json.dumps(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"field {path!r}: expected {kind.simpleString()}, got {_json_type(value)} {shown}"
