"""Tests for pipeline.lake.decode: why a record value doesn't fit the schema (`explain`, pure
Python), and the split of the source's record rows into table rows and quarantine rows (Spark).

The reasons are one table: the value's bytes, and the exact sentence quarantine must show.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
)

from kipside.pipeline.lake.decode import decode, explain, good_rows, quarantine_rows
from kipside.pipeline.lake.schema import LakeSchema

from .spark_schema import ITEM, SCALARS, struct

SCHEMA = struct(
    *SCALARS,
    ("count", IntegerType()),
    ("items", ArrayType(ITEM, True)),
    ("customer", struct(("name", StringType()), ("address", struct(("zip", IntegerType()))))),
)
SCHEMA_JSON = SCHEMA.json()
HINT = "the value does not match the schema"
NULL_HINT = "the value is null (a tombstone or an empty record)"
REQUIRED_HINT = "required field 'id' is missing or null"


# ---- explain: the reason, without Spark ----------------------------------------------------

REASONS: list[tuple[str, bytes, str]] = [
    ("not-utf8-first-byte", b"\xff{}", "the value is not UTF-8 text (byte 0)"),
    ("not-utf8-inside", b'{"a": "\xe9"}', "the value is not UTF-8 text (byte 7)"),
    (
        "not-json",
        b'{"id": 1,\n "price": }',
        "the value is not JSON: Expecting value at line 2 column 11",
    ),
    ("empty", b"", "the value is not JSON: Expecting value at line 1 column 1"),
    ("trailing-data", b'{"id": 1} x', "the value is not JSON: Extra data at line 1 column 11"),
    ("array", b'[{"id": 1}]', "the value is a JSON array, not an object"),
    ("number", b"42", "the value is a JSON number, not an object"),
    ("string", b'"42"', "the value is a JSON string, not an object"),
    ("boolean", b"true", "the value is a JSON boolean, not an object"),
    ("null", b"null", "the value is a JSON null, not an object"),
    ("string-for-bigint", b'{"id": "7"}', "field 'id': expected bigint, got string \"7\""),
    ("boolean-for-bigint", b'{"id": true}', "field 'id': expected bigint, got boolean true"),
    ("fraction-for-bigint", b'{"id": 1.0}', "field 'id': expected bigint, got number 1.0"),
    (
        "above-bigint",
        b'{"id": 9223372036854775808}',
        "field 'id': expected bigint, got number 9223372036854775808",
    ),
    (
        "below-bigint",
        b'{"id": -9223372036854775809}',
        "field 'id': expected bigint, got number -9223372036854775809",
    ),
    ("above-int", b'{"count": 2147483648}', "field 'count': expected int, got number 2147483648"),
    (
        "string-for-double",
        b'{"price": "3.5"}',
        "field 'price': expected double, got string \"3.5\"",
    ),
    (
        "boolean-for-double",
        b'{"price": false}',
        "field 'price': expected double, got boolean false",
    ),
    ("number-for-boolean", b'{"ok": 1}', "field 'ok': expected boolean, got number 1"),
    ("string-for-boolean", b'{"ok": "true"}', "field 'ok': expected boolean, got string \"true\""),
    (
        "bad-timestamp",
        b'{"at": "yesterday"}',
        "field 'at': expected timestamp, got string \"yesterday\"",
    ),
    (
        "hour-25",
        b'{"at": "2026-01-01T25:00:00"}',
        "field 'at': expected timestamp, got string \"2026-01-01T25:00:00\"",
    ),
    ("bad-date", b'{"day": "2026-02-30"}', "field 'day': expected date, got string \"2026-02-30\""),
    ("number-for-date", b'{"day": 20260101}', "field 'day': expected date, got number 20260101"),
    (
        "in-an-array",
        b'{"items": [{"qty": 1}, {"qty": 2}, {"sku": "a", "qty": "3"}]}',
        "field 'items[2].qty': expected bigint, got string \"3\"",
    ),
    (
        "object-for-array",
        b'{"items": {"qty": 1}}',
        "field 'items': expected array<struct<sku:string,qty:bigint>>, got object {\"qty\": 1}",
    ),
    (
        "in-a-nested-struct",
        b'{"customer": {"name": "Ann", "address": {"zip": "SW1A"}}}',
        "field 'customer.address.zip': expected int, got string \"SW1A\"",
    ),
    (
        "string-for-struct",
        b'{"customer": "Ann"}',
        "field 'customer': expected struct<name:string,address:struct<zip:int>>, "
        'got string "Ann"',
    ),
    (
        "long-value-shortened",
        b'{"ok": "' + b"x" * 60 + b'"}',
        "field 'ok': expected boolean, got string \"" + "x" * 36 + "...",
    ),
    (
        "first-mismatch-wins",
        b'{"id": "a", "ok": 2}',
        "field 'id': expected bigint, got string \"a\"",
    ),
]


@pytest.mark.parametrize(
    ("value", "reason"), [case[1:] for case in REASONS], ids=[case[0] for case in REASONS]
)
def test_explain(value: bytes, reason: str) -> None:
    assert explain(value, HINT, SCHEMA_JSON) == reason


FITS: list[tuple[str, bytes]] = [
    ("everything", b'{"id": 1, "count": -2147483648, "price": 2, "ok": false, "name": "a"}'),
    ("bigint-bounds", b'{"id": 9223372036854775807, "count": 2147483647}'),
    ("min-bigint", b'{"id": -9223372036854775808}'),
    ("dates", b'{"at": "2026-01-01T10:00:00Z", "day": "2026-01-01"}'),
    ("fractional-timestamp", b'{"at": "2026-01-01T10:00:00.123+02:00"}'),
    ("any-json-as-string", b'{"name": {"first": "Ann"}}'),
    ("nulls-anywhere", b'{"id": null, "items": [null, {"qty": null}], "customer": null}'),
    ("unknown-fields", b'{"colour": "red", "id": 3}'),
    ("array-of-structs", b'{"items": [{"sku": "a", "qty": 1}]}'),
]


@pytest.mark.parametrize("value", [case[1] for case in FITS], ids=[case[0] for case in FITS])
def test_a_value_that_fits_keeps_spark_s_verdict(value: bytes) -> None:
    assert explain(value, HINT, SCHEMA_JSON) == HINT
    assert explain(bytearray(value), "other hint", SCHEMA_JSON) == "other hint"


def test_hints_that_are_already_precise_pass_through() -> None:
    assert explain(None, NULL_HINT, SCHEMA_JSON) == NULL_HINT
    # Spark knew the field is missing; parsing the value again would add nothing.
    assert explain(b'{"name": "a"}', REQUIRED_HINT, SCHEMA_JSON) == REQUIRED_HINT
    assert explain(b"not json", REQUIRED_HINT, SCHEMA_JSON) == REQUIRED_HINT


@pytest.mark.parametrize(
    "value",
    [b'{"at": 1767225600, "id": "one"}', b'{"price": "NaN", "id": "one"}'],
    ids=["epoch-seconds-timestamp", "nan-double"],
)
def test_explain_agrees_with_spark_on_what_fits(value: bytes) -> None:
    schema = struct(("at", TimestampType()), ("price", DoubleType()), ("id", LongType()))
    assert explain(value, HINT, schema.json()) == "field 'id': expected bigint, got string \"one\""


# ---- decode, good_rows, quarantine_rows on Spark -------------------------------------------

RECORDS = (
    "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
    "timestamp TIMESTAMP, timestampType INT"
)
LATE = dt.datetime(2026, 1, 1, 23, 30, tzinfo=dt.UTC)  # 2026-01-02 east of UTC
EARLY = dt.datetime(2026, 1, 2, 0, 15, tzinfo=dt.UTC)  # 2026-01-01 west of UTC
ROWS: list[tuple[int, int, bytes | None, dt.datetime]] = [
    (
        0,
        10,
        b'{"id": 1, "name": "a", "at": "2026-01-01T10:00:00Z", "items": [{"sku": "x", '
        b'"qty": 2}], "extra": true}',
        LATE,
    ),
    (1, 11, b'{"id": 2}', EARLY),
    (0, 12, None, LATE),
    (1, 13, b'{"id": 3', LATE),
    (0, 14, b'{"id": "seven"}', LATE),
    (1, 15, b'{"id": 4, "items": [{"sku": "x", "qty": 1}, {"qty": "two"}]}', EARLY),
    (0, 16, b'{"name": "no id"}', LATE),
    (1, 17, b'{"id": null}', LATE),
    (0, 18, b'[{"id": 5}]', LATE),
]
LAKE = LakeSchema(
    struct(
        ("id", LongType()),
        ("name", StringType()),
        ("at", TimestampType()),
        ("items", ArrayType(ITEM, True)),
    ),
    ("id",),
    "orders.json",
)


def local(moment: dt.datetime) -> dt.datetime:
    """How pyspark returns a TIMESTAMP: naive, in this process's time zone."""
    return dt.datetime.fromtimestamp(moment.timestamp())


@pytest.fixture
def utc_spark(spark: Any) -> Iterator[Any]:
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        yield spark
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)


@pytest.mark.spark
def test_good_and_quarantined_rows(utc_spark: Any) -> None:
    df = utc_spark.createDataFrame(
        [(b"k%d" % off, value, "orders", part, off, ts, 0) for part, off, value, ts in ROWS],
        RECORDS,
    )
    decoded = decode(df, LAKE).cache()
    try:
        good = [r.asDict(recursive=True) for r in good_rows(decoded, LAKE).collect()]
        bad = [r.asDict() for r in quarantine_rows(decoded, LAKE).collect()]
    finally:
        decoded.unpersist()

    assert sorted(good, key=lambda r: r["kafka_offset"]) == [
        {
            "id": 1,
            "name": "a",
            "at": local(dt.datetime(2026, 1, 1, 10, tzinfo=dt.UTC)),
            "items": [{"sku": "x", "qty": 2}],
            "kafka_partition": 0,
            "kafka_offset": 10,
            "kafka_timestamp": local(LATE),
            "topic": "orders",
            "date": dt.date(2026, 1, 1),
        },
        {
            "id": 2,
            "name": None,
            "at": None,
            "items": None,
            "kafka_partition": 1,
            "kafka_offset": 11,
            "kafka_timestamp": local(EARLY),
            "topic": "orders",
            "date": dt.date(2026, 1, 2),
        },
    ]

    reasons = {
        12: NULL_HINT,
        13: "the value is not JSON: Expecting ',' delimiter at line 1 column 9",
        14: "field 'id': expected bigint, got string \"seven\"",
        15: "field 'items[1].qty': expected bigint, got string \"two\"",
        16: REQUIRED_HINT,
        17: REQUIRED_HINT,
        18: "the value is a JSON array, not an object",
    }
    sent = {off: (part, value, ts) for part, off, value, ts in ROWS}
    assert sorted(r["kafka_offset"] for r in bad) == sorted(reasons)
    for row in bad:
        offset = row["kafka_offset"]
        part, value, ts = sent[offset]
        assert row == {
            "kafka_partition": part,
            "kafka_offset": offset,
            "kafka_timestamp": local(ts),
            "key": bytearray(b"k%d" % offset),
            "value": None if value is None else bytearray(value),
            "error": reasons[offset],
            "topic": "orders",
        }
