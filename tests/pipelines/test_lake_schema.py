"""Tests for pipeline.lake.schema: the lake's schema file, as a JSON Schema subset (no Spark)
and as Spark DDL (parsed by the test session's Spark).

Every error must start with FILE:LINE (the file as given, the 1-based line of the problem), so
the error cases are one table per form: the file's lines, the line to blame, what the message
must say (for JSON Schema, the data file bad_schemas.yaml).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructType,
    TimestampType,
)

from kipside.pipeline.lake.schema import RESERVED, LakeSchema, SchemaError, load_schema

from .spark_schema import ITEM, SCALARS, struct


def write(tmp_path: Path, name: str, *lines: str) -> str:
    path = tmp_path / name
    path.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
    return str(path)


def fail(path: str, line: int, parse_ddl: Any = None) -> str:
    """The error loading `path` raises, after checking it starts with PATH:LINE."""
    with pytest.raises(SchemaError) as info:
        load_schema(path, parse_ddl)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    return message[len(f"{path}:{line}: ") :]


EXPECTED = struct(
    *SCALARS,
    ("tags", ArrayType(StringType(), True)),
    ("items", ArrayType(ITEM, True)),
    ("customer", struct(("name", StringType()), ("address", struct(("zip", StringType()))))),
)
EVERY_TYPE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "at": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "price": {"type": "number"},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
            },
        },
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "address": {"type": "object", "properties": {"zip": {"type": "string"}}},
            },
        },
    },
    "required": ["id", "at"],
}


# ---- JSON Schema: what a valid file becomes ------------------------------------------------


def test_every_supported_type_from_json(tmp_path: Path) -> None:
    path = write(tmp_path, "orders.json", json.dumps(EVERY_TYPE, indent=2))
    schema = load_schema(path)
    assert schema == LakeSchema(EXPECTED, ("id", "at"), path)


def test_the_same_schema_as_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "orders.yaml", yaml.safe_dump(EVERY_TYPE, sort_keys=False))
    assert "properties:\n  id:\n    type: integer\n" in Path(path).read_text()  # block style
    assert load_schema(path) == LakeSchema(EXPECTED, ("id", "at"), path)


@pytest.mark.parametrize(
    "kind", [["string", "null"], ["null", "integer"]], ids=["string-null", "null-integer"]
)
def test_a_type_and_null(tmp_path: Path, kind: list[str]) -> None:
    doc = {"type": ["object", "null"], "properties": {"v": {"type": kind}}}
    schema = load_schema(write(tmp_path, "s.json", json.dumps(doc)))
    expected = StringType() if "string" in kind else LongType()
    assert schema.struct == struct(("v", expected))
    assert schema.required == ()


def test_documentation_keywords_are_ignored(tmp_path: Path) -> None:
    docs = {
        "title": "t",
        "description": "d",
        "$comment": "c",
        "examples": [1],
        "default": None,
        "deprecated": False,
        "readOnly": True,
        "writeOnly": False,
    }
    doc = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://example.com/orders",
        "additionalProperties": False,
        **docs,
        "type": "object",
        "properties": {
            "id": {"type": "integer", **docs},
            "tags": {"type": "array", "items": {"type": "string", **docs}, **docs},
            "sub": {"type": "object", "properties": {"x": {"type": "number"}}, **docs},
        },
    }
    schema = load_schema(write(tmp_path, "s.json", json.dumps(doc)))
    assert schema.struct == struct(
        ("id", LongType()),
        ("tags", ArrayType(StringType(), True)),
        ("sub", struct(("x", DoubleType()))),
    )


def test_nested_fields_may_use_the_lake_s_column_names(tmp_path: Path) -> None:
    # Only top-level fields become columns next to the ones the lake adds.
    doc = {
        "type": "object",
        "properties": {"meta": {"type": "object", "properties": {"topic": {"type": "string"}}}},
    }
    schema = load_schema(write(tmp_path, "s.json", json.dumps(doc)))
    assert schema.struct == struct(("meta", struct(("topic", StringType()))))


# ---- JSON Schema: every error names its line -----------------------------------------------

# The refused files, each with the line its error must blame and what the message must say,
# are data: bad_schemas.yaml writes each file out as it is, so the blamed line can be counted.
JSON_ERRORS: dict[str, dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "bad_schemas.yaml").read_text(encoding="utf-8")
)


@pytest.mark.parametrize("case", JSON_ERRORS)
def test_json_errors(tmp_path: Path, case: str) -> None:
    bad = JSON_ERRORS[case]
    assert bad["says"] in fail(write(tmp_path, "s.json", bad["file"]), bad["line"])


# A document whose properties (from line 3) are given between P and Q.
P = '{"type": "object",\n "properties": {\n'  # lines 1 and 2; properties from line 3
Q = "\n }\n}"


@pytest.mark.parametrize("name", RESERVED)
def test_json_reserved_names(tmp_path: Path, name: str) -> None:
    path = write(
        tmp_path, "s.json", P + f'"id": {{"type": "integer"}},\n"{name}": {{"type": "string"}}' + Q
    )
    message = fail(path, 4)
    assert f"field {name!r} clashes with a column the lake adds" in message
    assert "rename it" in message


def test_yaml_errors_name_their_line(tmp_path: Path) -> None:
    path = write(tmp_path, "s.yml", "type: object", "properties:", "  id:", "    type: int")
    assert "type 'int' is not supported" in fail(path, 4)
    bad = write(tmp_path, "t.yaml", "type: object", "properties:", "  id: {type: integer", "x: 1")
    assert "not valid JSON or YAML" in fail(bad, 4)


@pytest.mark.parametrize(
    "text", ["", "\n\n", "# only a comment\n"], ids=["empty", "blank", "comment"]
)
def test_empty_json_schema(tmp_path: Path, text: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    assert fail(str(path), 1) == "the schema is empty"


# ---- files that can't be read ---------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.json")
    with pytest.raises(SchemaError) as info:
        load_schema(path)
    assert str(info.value).startswith(f"{path}: cannot read the schema file: ")
    assert "No such file" in str(info.value)


@pytest.mark.parametrize(("name", "shown"), [("s.toml", "'.toml'"), ("schema", "'(none)'")])
def test_unknown_extension(tmp_path: Path, name: str, shown: str) -> None:
    path = write(tmp_path, name, "id = 1")
    with pytest.raises(SchemaError) as info:
        load_schema(path)
    message = str(info.value)
    assert message.startswith(f"{path}: unknown schema file type {shown}")
    assert ".ddl" in message and ".json" in message


def test_ddl_without_a_parser(tmp_path: Path) -> None:
    path = write(tmp_path, "s.ddl", "id BIGINT")
    with pytest.raises(SchemaError, match="start a session first"):
        load_schema(path)


# ---- JSON Schema: cases that once were bugs -------------------------------------------------


def test_tab_indented_json(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(
        json.dumps({"type": "object", "properties": {"a": {"type": "string"}}}, indent="\t")
    )
    assert load_schema(str(path)).struct == struct(("a", StringType()))


def test_tab_indented_json_error_names_the_json_problem(tmp_path: Path) -> None:
    # Not the first tab, which YAML would blame.
    path = write(tmp_path, "s.json", "{", '\t"type": "object"', '\t"properties": {}', "}")
    assert fail(path, 3) == "not valid JSON: Expecting ',' delimiter"


def test_reserved_name_line_after_a_nested_field_of_that_name(tmp_path: Path) -> None:
    meta = '"meta": {"type": "object",\n "properties": {"date": {"type": "string"}}},\n'
    path = write(tmp_path, "s.json", P + meta + '"date": {"type": "string"}' + Q)
    assert "field 'date' clashes" in fail(path, 5)


def test_reserved_names_in_another_case(tmp_path: Path) -> None:
    path = write(tmp_path, "s.json", P + '"Topic": {"type": "string"}' + Q)
    assert "field 'Topic' clashes" in fail(path, 3)


def test_ref_in_place_of_a_type_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "s.json", P + '"c": {\n "$ref": "#/$defs/customer"\n}' + Q)
    assert "keyword '$ref' is not supported" in fail(path, 4)


def test_nested_required_is_not_silently_ignored(tmp_path: Path) -> None:
    c = '"c": {"type": "object",\n "properties": {"n": {"type": "string"}},\n "required": ["m"]}'
    message = fail(write(tmp_path, "s.json", P + c + Q), 5)
    assert "'c': required is only supported at the top level" in message


# ---- Spark DDL -----------------------------------------------------------------------------


@pytest.mark.spark
def test_ddl_fields(spark: Any, tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "orders.ddl",
        "-- orders, as the shop writes them",
        "id BIGINT NOT NULL,  -- the order number",
        "items ARRAY<STRUCT<sku: STRING, qty: INT>>,",
        "at TIMESTAMP NOT NULL, day DATE,",
        "price DOUBLE, ok BOOLEAN",
    )
    schema = load_schema(path, StructType.fromDDL)
    item = struct(("sku", StringType()), ("qty", IntegerType()))
    assert schema == LakeSchema(
        struct(
            ("id", LongType()),
            ("items", ArrayType(item, True)),
            ("at", TimestampType()),
            ("day", DateType()),
            ("price", DoubleType()),
            ("ok", BooleanType()),
        ),
        ("id", "at"),
        path,
    )


DDL_ERRORS: list[tuple[str, tuple[str, ...], int, str]] = [
    (
        "syntax-error",
        ("id BIGINT,", "name STRING,", "qty INT,,"),
        3,
        "[PARSE_SYNTAX_ERROR] Syntax error at or near ','.",
    ),
    (
        "unknown-type",
        ("-- header", "id BIGINT,", "qty INTT"),
        3,
        '[UNSUPPORTED_DATATYPE] Unsupported data type "INTT".',
    ),
    ("empty", ("-- nothing here", ""), 1, "the schema is empty; list fields like"),
    ("not-fields", ("ARRAY<INT>",), 1, "must be a list of fields, got array<int>"),
    *[
        (f"reserved-{name}", ("id BIGINT,", "name STRING,", f"`{name}` STRING"), 3, repr(name))
        for name in RESERVED
    ],
]


@pytest.mark.spark
@pytest.mark.parametrize(
    ("lines", "line", "fragment"),
    [case[1:] for case in DDL_ERRORS],
    ids=[case[0] for case in DDL_ERRORS],
)
def test_ddl_errors(
    spark: Any, tmp_path: Path, lines: tuple[str, ...], line: int, fragment: str
) -> None:
    message = fail(write(tmp_path, "s.ddl", *lines), line, StructType.fromDDL)
    assert fragment in message
    assert "SQLSTATE" not in message and "(line" not in message


@pytest.mark.spark
@pytest.mark.parametrize(
    "lines",
    [
        ("id BIGINT,", "-- topic: where the order came from", "topic STRING"),
        ("id BIGINT,", "day date NOT NULL,", "date STRING"),
        ("id BIGINT COMMENT 'topic, x',", "/* topic */ n INT, -- it's", "`Topic` STRING"),
    ],
    ids=["comment", "type-name", "literal-block-comment-quoted-name"],
)
def test_ddl_reserved_name_line(spark: Any, tmp_path: Path, lines: tuple[str, ...]) -> None:
    assert "clashes" in fail(write(tmp_path, "s.ddl", *lines), 3, StructType.fromDDL)


@pytest.mark.spark
def test_ddl_comment_literal_with_dashes(spark: Any, tmp_path: Path) -> None:
    path = write(tmp_path, "s.ddl", "id BIGINT COMMENT 'order id -- from the shop'")
    assert load_schema(path, StructType.fromDDL).struct.fieldNames() == ["id"]
