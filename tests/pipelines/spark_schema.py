"""Spark schemas for the lake tests, written as (name, type) pairs."""

from __future__ import annotations

from typing import Final

from pyspark.sql.types import DataType, LongType, StringType, StructField, StructType

__all__ = ["ITEM", "struct"]


def struct(*fields: tuple[str, DataType]) -> StructType:
    """A struct of nullable fields, as Spark reads JSON into."""
    return StructType([StructField(name, kind, True) for name, kind in fields])


ITEM: Final = struct(("sku", StringType()), ("qty", LongType()))
"""An order's line: the element type of the `items` array in the lake tests' schemas."""
