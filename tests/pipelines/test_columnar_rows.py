"""Carriers to typed rows (option valueSchema), in memory: what a `format("kipside")` task yields
for a columnar topic, with no Spark session and no broker.

Each carrier's records come from its segment's columns (offsets, timestamps, keys and headers
exact, the value's fields equal to the producer's JSON), ordinary batches keep their value bytes
and a null struct, a range keeps the offsets [start, end) only, and encrypted columns need the
key file.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa
import pytest
from columnar_kit import (
    BASE_TIMESTAMP,
    SCHEMA,
    SCHEMA_DOC,
    ClientBatch,
    ClientRecord,
    with_base_offset,
)

from kipside.pipeline.lake.schema import spark_type
from kipside.pipeline.source.ranges import OffsetRange
from kipside.pipeline.source.record_rows import record_rows
from kipside.pipeline.source.record_schema import VALUE_COLUMNS, value_arrow_type
from kipside.protocol import (
    ColumnarEncoder,
    ColumnarKeyError,
    ColumnarKeys,
    ColumnarOptions,
    Encoded,
    RecordBatchView,
    parse_json_schema,
)

TOPIC = "orders"
LAKE_TYPE = value_arrow_type(spark_type(parse_json_schema(json.dumps(SCHEMA_DOC), "s.json").struct))
KEYS = ColumnarKeys.of({"k1": bytes(range(32))}, "k1", "keys.yaml")
ENCRYPTED = ColumnarOptions(encrypt=("name", "kafka_key"), keys=KEYS)


def value(i: int) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": i,
        "name": f"name-{i}",
        "amount": i * 1.5,
        "ok": i % 2 == 0,
        "at": f"2026-01-02T03:04:{i % 60:02d}.123Z",
        "day": "2026-01-02",
        "tags": ["a", None] if i % 3 else [],
        "items": [{"sku": f"s{i}", "qty": i}],
        "customer": {"name": "c", "zip": str(i)},
    }
    if i % 4 == 1:
        del doc["name"]  # missing fields come back null
    return doc


def typed(doc: dict[str, Any]) -> dict[str, Any]:
    """The value as the struct column holds it: every field of the schema, times parsed."""
    out: dict[str, Any] = {name: doc.get(name) for name in SCHEMA.names}
    out["at"] = dt.datetime.fromisoformat(doc["at"])
    out["day"] = dt.date.fromisoformat(doc["day"])
    out["items"] = [{**item, "seen": None} for item in doc["items"]]
    return out


def client_batch(first: int, count: int) -> ClientBatch:
    records = tuple(
        ClientRecord(
            None if i % 5 == 0 else b"k%d" % i,
            json.dumps(value(i)).encode(),
            (("h", b"%d" % i), ("n", None)) if i % 2 else (),
            timestamp_delta=(i - first) * 7,
        )
        for i in range(first, first + count)
    )
    return ClientBatch(records, codec="lz4", base_timestamp=BASE_TIMESTAMP + first)


# (first offset, records, a carrier?): carriers and ordinary batches, in the log's order.
LOG = ((0, 30, True), (30, 3, False), (33, 12, True), (45, 5, True), (50, 4, False))


def log(encoder: ColumnarEncoder) -> list[RecordBatchView]:
    batches = []
    for first, count, carrier in LOG:
        batch = client_batch(first, count).build()
        if carrier:
            result = encoder.encode(batch)
            assert isinstance(result, Encoded), result
            batch = result.batch
        batches.append(RecordBatchView.from_buffer(with_base_offset(batch, first)))
    return batches


def rows(
    batches: list[RecordBatchView],
    start: int = 0,
    end: int = 54,
    value_type: pa.StructType | None = LAKE_TYPE,
    keys: ColumnarKeys | None = None,
) -> list[dict[str, Any]]:
    got = record_rows(
        OffsetRange(TOPIC, 3, start, end),
        batches,
        include_headers=True,
        value_type=value_type,
        keys=keys,
    )
    return [row for batch in got for row in batch.to_pylist()]


def expected(start: int = 0, end: int = 54) -> list[dict[str, Any]]:
    out = []
    for first, count, carrier in LOG:
        client = client_batch(first, count)
        for i, record in enumerate(client.records, start=first):
            if not start <= i < end:
                continue
            at = client.base_timestamp + record.timestamp_delta
            out.append(
                {
                    "key": record.key,
                    "value": None if carrier else record.value,
                    "topic": TOPIC,
                    "partition": 3,
                    "offset": i,
                    "timestamp": dt.datetime.fromtimestamp(at / 1000, dt.UTC),
                    "timestampType": 0,
                    "headers": [{"key": k, "value": v} for k, v in record.headers],
                    VALUE_COLUMNS: typed(value(i)) if carrier else None,
                }
            )
    return out


def test_carriers_give_typed_values_and_ordinary_batches_their_bytes() -> None:
    assert rows(log(ColumnarEncoder(SCHEMA))) == expected()


def test_a_range_owns_the_offsets_from_start_to_before_end() -> None:
    batches = log(ColumnarEncoder(SCHEMA))
    for start, end in ((5, 40), (31, 33), (30, 46), (33, 34), (53, 54)):
        assert rows(batches, start, end) == expected(start, end), (start, end)


def test_a_field_the_segment_cannot_cast_to_is_read_as_json() -> None:
    """A struct asked for with a type the segment's column doesn't cast to (the lake's schema
    disagrees with the rule's): the carrier's records come as JSON values, for from_json."""
    fields = [pa.field("id", pa.int64()), pa.field("tags", pa.int64())]
    got = rows(log(ColumnarEncoder(SCHEMA)), value_type=pa.struct(fields))
    assert [r[VALUE_COLUMNS] for r in got] == [None] * 54
    values = [json.loads(r["value"]) for r in got]
    assert [v["id"] for v in values] == list(range(54))
    assert values[0] == {k: v for k, v in value(0).items()}


def test_a_missing_field_of_a_lossless_topic_is_read_from_the_kept_json() -> None:
    """A field the rule's schema lacks may be in a value kept whole: then JSON, not null."""
    lake = pa.struct([pa.field("id", pa.int64()), pa.field("extra", pa.string())])
    lossless = log(ColumnarEncoder(SCHEMA, ColumnarOptions(lossless=True)))
    assert all(r[VALUE_COLUMNS] is None for r in rows(lossless, value_type=lake))
    plain = rows(log(ColumnarEncoder(SCHEMA)), value_type=lake)
    assert [r[VALUE_COLUMNS] for r in plain[:30]] == [{"id": i, "extra": None} for i in range(30)]


def test_encrypted_columns_need_the_key_file() -> None:
    batches = log(ColumnarEncoder(SCHEMA, ENCRYPTED))
    assert rows(batches, keys=KEYS) == expected()
    for value_type in (LAKE_TYPE, None):
        with pytest.raises(ColumnarKeyError) as caught:
            rows(batches[1:], 30, 54, value_type=value_type)  # as a fetch from 30 gives
        message = str(caught.value)
        assert message.startswith(f"{TOPIC}-3, the columnar carrier at offset 33 "), message
        assert "columns name, kafka_key are encrypted with key 'k1'" in message
        assert "no key file was given" in message
        assert "option columnarKeyFile" in message and "--columnar-key-file" in message
        assert caught.value.columns == ("name", "kafka_key")
    # Only the range's carriers are read: an ordinary batch alone needs no key.
    assert rows(batches, 30, 33) == expected(30, 33)


def test_the_json_path_gives_the_producers_values_with_the_key() -> None:
    got = rows(log(ColumnarEncoder(SCHEMA, ENCRYPTED)), value_type=None, keys=KEYS)
    assert [json.loads(r["value"]) for r in got] == [value(i) for i in range(54)]
    assert [r["key"] for r in got] == [r["key"] for r in expected()]
