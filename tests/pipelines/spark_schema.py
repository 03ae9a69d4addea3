"""Spark schemas for the lake tests, written as (name, type) pairs."""

from __future__ import annotations

from typing import Final

from pyspark.sql import types

__all__ = ["ITEM", "SCALARS", "struct"]


def struct(*fields: tuple[str, types.DataType]) -> types.StructType:
    """A struct of nullable fields, as Spark reads JSON into."""
    return types.StructType([types.StructField(name, kind, True) for name, kind in fields])


ITEM: Final = struct(("sku", types.StringType()), ("qty", types.LongType()))
"""An order's line: the element type of the `items` array in the lake tests' schemas."""

SCALARS: Final = (
    ("id", types.LongType()),
    ("name", types.StringType()),
    ("at", types.TimestampType()),
    ("day", types.DateType()),
    ("price", types.DoubleType()),
    ("ok", types.BooleanType()),
)
"""An order's first fields, one of each type a JSON Schema maps to: integer, string, string
with format date-time and date, number, boolean."""
