"""The lake's schema file: the typed columns JSON record values become, as Spark types.

The file is read by kipside.protocol's value schema (`parse_json_schema`, one copy shared with
the sidecar's columnar rules; docs/lake.md, "The schema file", says what it takes). This module
only adds what is the lake's own:
- a Spark DDL file (`.ddl`, `.sql`, `.txt`) is parsed by Spark itself (StructType.fromDDL), so
  the lake takes everything Spark does and Spark's syntax errors keep their line; NOT NULL makes a
  top-level field required;
- the value types become Spark's;
- columns the lake adds itself (topic, date, kafka_partition, kafka_offset, kafka_timestamp) may
  not be top-level fields of the schema, whatever their case (Spark's column names ignore case).

Either way a problem is a SchemaError "FILE:LINE: what is wrong; what to write instead".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pyspark.sql.types import DataType, StructField, StructType

from kipside.pipeline.source.record_schema import spark_type
from kipside.protocol import (
    SCHEMA_DDL_SUFFIXES,
    SCHEMA_JSON_SUFFIXES,
    ValueSchemaError,
    check_reserved_names,
    ddl_field_lines,
    ddl_is_empty,
    parse_json_schema,
)

__all__ = [
    "DDL_SUFFIXES",
    "RESERVED",
    "LakeSchema",
    "SchemaError",
    "load_schema",
    "spark_type",
]

RESERVED: Final = ("topic", "date", "kafka_partition", "kafka_offset", "kafka_timestamp")
DDL_SUFFIXES: Final = SCHEMA_DDL_SUFFIXES
JSON_SUFFIXES: Final = SCHEMA_JSON_SUFFIXES
_PARSE_POSITION: Final = re.compile(r"\(line (\d+), pos (\d+)\)")
_WHO: Final = "the lake"


class SchemaError(ValueError):
    """The schema file can't be used; the message starts with FILE:LINE."""


@dataclass(frozen=True)
class LakeSchema:
    struct: StructType
    required: tuple[str, ...]
    """Top-level fields a value must have (not missing, not null)."""
    source: str


def load_schema(path: str, parse_ddl: Callable[[str], DataType] | None = None) -> LakeSchema:
    """Read a schema file. DDL needs `parse_ddl` (Spark's parser: StructType.fromDDL)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise SchemaError(f"{path}: cannot read the schema file: {exc.strerror or exc}") from None
    suffix = file.suffix.lower()
    try:
        if suffix in JSON_SUFFIXES:
            value = parse_json_schema(text, path)
            value.check_reserved(RESERVED, _WHO)
            return LakeSchema(spark_type(value.struct), value.required, path)
        if suffix in DDL_SUFFIXES:
            if parse_ddl is None:
                raise SchemaError(f"{path}: a DDL schema is read by Spark; start a session first")
            return _from_ddl(path, text, parse_ddl)
    except ValueSchemaError as exc:
        raise SchemaError(str(exc)) from None
    raise SchemaError(
        f"{path}: unknown schema file type {suffix or '(none)'!r}: name it .ddl (Spark DDL) "
        "or .json/.yaml (JSON Schema)"
    )


def _from_ddl(path: str, text: str, parse_ddl: Callable[[str], DataType]) -> LakeSchema:
    if ddl_is_empty(text):
        raise SchemaError(
            f"{path}:1: the schema is empty; list fields like `id BIGINT, name STRING`"
        )
    try:
        parsed = parse_ddl(text)  # Spark's parser skips the comments itself
    except Exception as exc:  # Spark's ParseException, with (line N, pos M) in its text
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        found = _PARSE_POSITION.search(str(exc))
        line = found.group(1) if found else "1"
        message = _PARSE_POSITION.sub("", re.sub(r"\s*SQLSTATE: \w+", "", message)).strip()
        raise SchemaError(f"{path}:{line}: {message}") from None
    if not isinstance(parsed, StructType) or not parsed.fields:
        raise SchemaError(
            f"{path}:1: the schema must be a list of fields, got {parsed.simpleString()}"
        )
    check_reserved_names(path, parsed.fieldNames(), ddl_field_lines(text), RESERVED, _WHO)
    required = tuple(f.name for f in parsed.fields if not f.nullable)
    nullable = StructType([StructField(f.name, f.dataType, True) for f in parsed.fields])
    return LakeSchema(nullable, required, path)
