"""Tests for protocol.value_schema: schema files read without Spark (the sidecar's columnar rules),
and what a columnar schema may hold (protocol.columnar.check_columnar_schema).

The JSON Schema subset is the lake's (tests/pipelines/test_lake_schema.py checks it through the
lake's wrapper, error by error); here: the DDL reader, the Arrow types, and the checks a columnar
topic adds. tests/pipelines/test_value_schema_spark.py holds the DDL reader to Spark's own.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from kipside.protocol import (
    ArrayOf,
    Atomic,
    DecimalOf,
    MapOf,
    SchemaField,
    StructOf,
    ValueSchema,
    ValueSchemaError,
    check_columnar_schema,
    parse_ddl_schema,
    parse_json_schema,
    parse_value_schema,
)

ORDERS_DDL = """-- orders, as the shop writes them
id BIGINT NOT NULL,  -- the order number
user STRING COMMENT 'who, -- not a comment',
amount DOUBLE, paid BOOLEAN,
at TIMESTAMP NOT NULL,
items ARRAY<STRUCT<sku: STRING, qty BIGINT>>,
/* block
   comment */ `note, quoted` STRING
"""


def test_ddl_fields_types_and_lines() -> None:
    schema = parse_ddl_schema(ORDERS_DDL, "orders.ddl")
    item = StructOf((SchemaField("sku", Atomic("string")), SchemaField("qty", Atomic("bigint"))))
    assert schema.struct == StructOf(
        (
            SchemaField("id", Atomic("bigint")),
            SchemaField("user", Atomic("string")),
            SchemaField("amount", Atomic("double")),
            SchemaField("paid", Atomic("boolean")),
            SchemaField("at", Atomic("timestamp")),
            SchemaField("items", ArrayOf(item)),
            SchemaField("note, quoted", Atomic("string")),
        )
    )
    assert schema.required == ("id", "at")
    assert dict(schema.lines) == {
        "id": 2,
        "user": 3,
        "amount": 4,
        "paid": 4,
        "at": 5,
        "items": 6,
        "note, quoted": 8,
    }


@pytest.mark.parametrize(
    ("ddl", "kind"),
    [
        ("BOOLEAN", Atomic("boolean")),
        ("tinyint", Atomic("tinyint")),
        ("BYTE", Atomic("tinyint")),
        ("SMALLINT", Atomic("smallint")),
        ("SHORT", Atomic("smallint")),
        ("INT", Atomic("int")),
        ("Integer", Atomic("int")),
        ("BIGINT", Atomic("bigint")),
        ("LONG", Atomic("bigint")),
        ("FLOAT", Atomic("float")),
        ("REAL", Atomic("float")),
        ("DOUBLE", Atomic("double")),
        ("STRING", Atomic("string")),
        ("BINARY", Atomic("binary")),
        ("DATE", Atomic("date")),
        ("TIMESTAMP", Atomic("timestamp")),
        ("TIMESTAMP_LTZ", Atomic("timestamp")),
        ("TIMESTAMP_NTZ", Atomic("timestamp_ntz")),
        ("DECIMAL", DecimalOf(10, 0)),
        ("DECIMAL(5)", DecimalOf(5, 0)),
        ("DEC(12, 3)", DecimalOf(12, 3)),
        ("NUMERIC(38,38)", DecimalOf(38, 38)),
        ("ARRAY<INT>", ArrayOf(Atomic("int"))),
        ("MAP<STRING, ARRAY<DATE>>", MapOf(Atomic("string"), ArrayOf(Atomic("date")))),
        (
            "STRUCT<a: INT NOT NULL COMMENT 'x', `b c` STRING>",
            StructOf(
                (SchemaField("a", Atomic("int"), False), SchemaField("b c", Atomic("string")))
            ),
        ),
    ],
)
def test_ddl_types(ddl: str, kind: object) -> None:
    assert parse_ddl_schema(f"f {ddl}", "s.ddl").struct.fields == (SchemaField("f", kind),)  # type: ignore[arg-type]


DDL_ERRORS = {
    "unknown type": ("id BIGINT,\nqty INTT", 2, "type 'INTT' is not supported"),
    "trailing comma": ("id BIGINT,\nname STRING,", 2, "ends where a field name belongs"),
    "two commas": ("id BIGINT,\n\nname STRING,,", 3, "expected a field name, found ','"),
    "no comma": ("id BIGINT\nname STRING", 2, "expected ',' between fields"),
    "unclosed": ("id BIGINT,\nitems ARRAY<STRUCT<a: INT>", 2, "ends where"),
    "empty struct": ("a STRUCT<>", 1, "at least one field"),
    "twice": ("id BIGINT,\nID STRING", 2, "field 'ID' is given twice"),
    "NOT alone": ("id BIGINT NOT", 1, "NOT must be followed by NULL"),
    "comment not text": ("id BIGINT COMMENT x", 1, "COMMENT takes a quoted text"),
    "decimal scale": ("p DECIMAL(4, 5)", 1, "the scale at most the precision"),
    "decimal wide": ("p DECIMAL(39, 0)", 1, "precision must be 1 to 38"),
    "varchar": ("s VARCHAR(10)", 1, "'VARCHAR' is not supported"),
    "empty": ("-- nothing\n", 1, "the schema is empty"),
    "a type alone": ("ARRAY<INT>", 1, "expected a type, found '<' (a schema is a list of"),
}


@pytest.mark.parametrize(("text", "line", "says"), DDL_ERRORS.values(), ids=list(DDL_ERRORS))
def test_ddl_errors(text: str, line: int, says: str) -> None:
    with pytest.raises(ValueSchemaError) as info:
        parse_ddl_schema(text, "s.ddl")
    assert str(info.value).startswith(f"s.ddl:{line}: "), str(info.value)
    assert says in str(info.value)
    assert info.value.line == line


def test_the_form_follows_the_extension() -> None:
    doc = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}})
    assert parse_value_schema(doc, "dir.d/s.JSON").struct.names() == ["id"]
    yaml_doc = "type: object\nproperties:\n  id: {type: integer}\n"
    assert parse_value_schema(yaml_doc, "s.yml").struct.names() == ["id"]
    assert parse_value_schema("id BIGINT", "s.sql").struct.names() == ["id"]
    with pytest.raises(ValueSchemaError, match=r"unknown schema file type '\.toml'"):
        parse_value_schema("", "s.toml")
    with pytest.raises(ValueSchemaError, match=r"unknown schema file type '\(none\)'"):
        parse_value_schema("", "schema")


def test_arrow_types() -> None:
    schema = parse_ddl_schema(
        "id BIGINT NOT NULL, t TINYINT, s SMALLINT, i INT, f FLOAT, d DOUBLE, p DECIMAL(9,2), "
        "b BINARY, day DATE, at TIMESTAMP, local TIMESTAMP_NTZ, ok BOOLEAN, "
        "tags ARRAY<STRING>, m MAP<STRING, INT>, c STRUCT<n: STRING NOT NULL>",
        "s.ddl",
    )
    assert schema.to_arrow() == pa.schema(
        [
            pa.field("id", pa.int64(), False),
            ("t", pa.int8()),
            ("s", pa.int16()),
            ("i", pa.int32()),
            ("f", pa.float32()),
            ("d", pa.float64()),
            ("p", pa.decimal128(9, 2)),
            ("b", pa.binary()),
            ("day", pa.date32()),
            ("at", pa.timestamp("us", tz="UTC")),
            ("local", pa.timestamp("us")),
            ("ok", pa.bool_()),
            ("tags", pa.list_(pa.field("element", pa.string()))),
            ("m", pa.map_(pa.string(), pa.int32())),
            ("c", pa.struct([pa.field("n", pa.string(), False)])),
        ]
    )


def test_the_json_schema_gives_the_same_arrow_schema_as_the_ddl() -> None:
    doc = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "at": {"type": "string", "format": "date-time"},
            "items": {
                "type": "array",
                "items": {"type": "object", "properties": {"sku": {"type": "string"}}},
            },
        },
        "required": ["id"],
    }
    from_json = parse_json_schema(json.dumps(doc), "s.json").to_arrow()
    from_ddl = parse_ddl_schema(
        "id BIGINT NOT NULL, at TIMESTAMP, items ARRAY<STRUCT<sku: STRING>>", "s.ddl"
    ).to_arrow()
    assert from_json == from_ddl


# ---- what a columnar topic's schema may hold ------------------------------------------------


@pytest.mark.parametrize(
    ("ddl", "line", "says"),
    [
        ("id BIGINT,\nm MAP<STRING, INT>", 2, "'m' holds a MAP"),
        ("id BIGINT,\nraw BINARY", 2, "'raw' holds BINARY"),
        ("id BIGINT,\nf FLOAT", 2, "'f' holds FLOAT"),
        ("id BIGINT,\nc STRUCT<f: ARRAY<REAL>>", 2, "'c' holds FLOAT"),
        ("id BIGINT,\nkafka_key STRING", 2, "'kafka_key' clashes with a column"),
        ("id BIGINT,\nKafka_Headers STRING", 2, "'Kafka_Headers' clashes"),
        ("id BIGINT,\n\ntopic STRING", 3, "'topic' clashes"),
        ("id BIGINT,\nkafka_partition INT", 2, "'kafka_partition' clashes"),
    ],
)
def test_columnar_schemas_refuse(ddl: str, line: int, says: str) -> None:
    schema = parse_ddl_schema(ddl, "s.ddl")
    with pytest.raises(ValueSchemaError) as info:
        check_columnar_schema(schema)
    assert str(info.value).startswith(f"s.ddl:{line}: ")
    assert says in str(info.value)


def test_columnar_schemas_take_the_rest() -> None:
    check_columnar_schema(
        parse_ddl_schema(
            "id BIGINT NOT NULL, p DECIMAL(10,2), at TIMESTAMP, d DATE, n TIMESTAMP_NTZ, "
            "c STRUCT<tags: ARRAY<STRING>, x SMALLINT>",
            "s.ddl",
        )
    )


def test_a_schema_is_a_plain_value() -> None:
    one = parse_ddl_schema("id BIGINT NOT NULL", "s.ddl")
    assert one == ValueSchema(
        StructOf((SchemaField("id", Atomic("bigint")),)), ("id",), "s.ddl", (("id", 1),)
    )
    assert hash(one.struct) == hash(parse_ddl_schema("id BIGINT", "t.ddl").struct)
