"""kipside's DDL reader (protocol.value_schema, no Spark) against Spark's own (StructType.fromDDL).

The sidecar reads a columnar topic's DDL schema without Spark; `kipside lake` reads the same file
with Spark. For every DDL below both must give the same fields, types and nullability, and the
Arrow schema the sidecar writes segments with must be the one PySpark converts Spark's types to,
so the lake can land those segments as they are.
"""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructField, StructType

from kipside.pipeline.lake.schema import spark_type
from kipside.protocol import parse_ddl_schema

DDLS = [
    "id BIGINT NOT NULL, user STRING, amount DOUBLE, paid BOOLEAN, at TIMESTAMP",
    "items ARRAY<STRUCT<sku: STRING, qty: INT>>, tags ARRAY<STRING>",
    "t TINYINT, b BYTE, s SMALLINT, sh SHORT, i INT, ig INTEGER, l LONG, f FLOAT, r REAL",
    "p DECIMAL(10, 2), q DEC, n NUMERIC(38, 9), d DATE, x BINARY",
    "ltz TIMESTAMP_LTZ, ntz TIMESTAMP_NTZ",
    "m MAP<STRING, ARRAY<INT>>, c STRUCT<a INT NOT NULL COMMENT 'x, y', `b c`: STRING>",
    "-- a comment\nid BIGINT COMMENT 'order id -- from the shop', /* more */ `we``ird` STRING",
    "deep STRUCT<a: STRUCT<b: ARRAY<STRUCT<c: DATE NOT NULL>>>>",
]


def without_metadata(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_metadata(v) for k, v in value.items() if k != "metadata"}
    if isinstance(value, list):
        return [without_metadata(v) for v in value]
    return value


@pytest.mark.spark
@pytest.mark.parametrize("ddl", DDLS)
def test_the_same_fields_as_spark(spark: Any, ddl: str) -> None:
    ours = parse_ddl_schema(ddl, "s.ddl")
    theirs = StructType.fromDDL(ddl)
    assert isinstance(theirs, StructType)
    as_spark = spark_type(ours.struct)
    # The lake makes top-level fields nullable and keeps NOT NULL as `required`. A COMMENT is
    # field metadata to Spark; kipside reads it and drops it.
    top_nullable = StructType([StructField(f.name, f.dataType, True) for f in theirs.fields])
    assert as_spark.simpleString() == top_nullable.simpleString()
    assert without_metadata(as_spark.jsonValue()) == without_metadata(top_nullable.jsonValue())
    assert ours.required == tuple(f.name for f in theirs.fields if not f.nullable)


@pytest.mark.spark
@pytest.mark.parametrize("ddl", DDLS)
def test_the_same_arrow_schema_as_pyspark(spark: Any, ddl: str) -> None:
    ours = parse_ddl_schema(ddl, "s.ddl").to_arrow()
    spark_struct = StructType.fromDDL(ddl)
    assert isinstance(spark_struct, StructType)
    theirs = to_arrow_schema(spark_struct, timezone="UTC")
    assert [f.name for f in ours] == theirs.names
    for mine, spark_field in zip(ours, theirs, strict=True):
        assert mine.type.equals(spark_field.type), (mine, spark_field)
        assert mine.nullable == spark_field.nullable
