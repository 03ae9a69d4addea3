"""Tests for the columnar carrier (protocol.columnar_codec): client batches from kafka-python
become carriers Apache Kafka's checks accept, and come back as the records the producer sent.

What a round trip must keep: every record's offset, timestamp, key and headers exactly, its value
equal as JSON (byte for byte with `lossless`), and the carrier's header fields that idempotence,
retries and transactions rely on (record count, last offset delta, producer id, epoch, base
sequence, transactional bit).

KIPSIDE_COLUMNAR_EXAMPLES=N runs the hypothesis round trips with N examples each (default 60).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import crc32c
import pyarrow as pa
import pytest
from columnar_kit import (
    BASE_TIMESTAMP,
    CODECS,
    NARROW,
    PRODUCERS,
    SCHEMA,
    ClientBatch,
    ClientRecord,
    client_batches,
    json_equal,
    kafka_rebuilds,
    kafka_validates,
    read_back,
    with_base_offset,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from kipside.protocol import (
    COLUMNAR_HEADER,
    ColumnarEncoder,
    ColumnarKeys,
    ColumnarOptions,
    ColumnarRecord,
    Encoded,
    NotEncodable,
    NotEncodableKind,
    RecordBatchView,
    TimestampType,
    columnar_version,
    decode_columnar_batch,
    decode_columnar_record,
    read_columnar_segment,
    reencode_columnar_batch,
)

ENCODER = ColumnarEncoder(SCHEMA)
LOSSLESS = ColumnarEncoder(SCHEMA, ColumnarOptions(lossless=True))
SLOW = settings(
    max_examples=int(os.environ.get("KIPSIDE_COLUMNAR_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def encoded(batch: bytes, encoder: ColumnarEncoder = ENCODER) -> bytes:
    result = encoder.encode(batch)
    assert isinstance(result, Encoded), result
    return result.batch


def assert_same_records(
    records: list[ColumnarRecord], client: ClientBatch, base_offset: int, exact: bool = False
) -> None:
    assert len(records) == len(client.records)
    for i, (got, sent) in enumerate(zip(records, client.records, strict=True)):
        assert got.offset == base_offset + i
        assert got.timestamp == client.base_timestamp + sent.timestamp_delta
        assert got.timestamp_type == TimestampType.CREATE_TIME
        assert got.key == sent.key
        assert got.headers == sent.headers
        if exact:
            assert got.value == sent.value
        else:
            assert json_equal(got.value, sent.value), (got.value, sent.value)


def as_json(records: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [(o, t, k, json.loads(v or b"null"), h) for o, t, k, v, h in records]


HEADER_FIELDS = (
    "partition_leader_epoch",
    "last_offset_delta",
    "base_timestamp",
    "max_timestamp",
    "producer_id",
    "producer_epoch",
    "base_sequence",
    "records_count",
    "is_transactional",
    "is_control",
    "timestamp_type",
    "base_offset",
)


def header(batch: bytes) -> dict[str, Any]:
    view = RecordBatchView.from_buffer(batch)
    return {name: getattr(view, name) for name in HEADER_FIELDS}


# ---- round trips ----------------------------------------------------------------------------


@SLOW
@given(client=client_batches(), base_offset=st.integers(0, 2**40))
def test_round_trip(client: ClientBatch, base_offset: int) -> None:
    sent = client.build()
    carrier = encoded(sent)
    view = RecordBatchView.from_buffer(carrier)
    assert header(carrier) == header(sent)
    assert view.compression == CODECS["zstd"] and view.crc_valid()
    stored = with_base_offset(carrier, base_offset)
    assert_same_records(decode_columnar_batch(stored), client, base_offset)

    ordinary = reencode_columnar_batch(stored)
    assert header(ordinary) == header(with_base_offset(sent, base_offset))
    assert as_json(read_back(ordinary)) == as_json(read_back(with_base_offset(sent, base_offset)))


@SLOW
@given(client=client_batches())
def test_lossless_round_trip_is_byte_exact(client: ClientBatch) -> None:
    carrier = encoded(client.build(), LOSSLESS)
    assert_same_records(decode_columnar_batch(carrier), client, 0, exact=True)
    assert read_back(reencode_columnar_batch(carrier)) == read_back(client.build())


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("producer", list(PRODUCERS))
def test_every_codec_and_producer(codec: str, producer: str) -> None:
    records = tuple(
        ClientRecord(
            b"order-%d" % i,
            json.dumps({"id": i, "name": f"n{i}", "at": f"2026-11-23T09:03:0{i % 10}Z"}).encode(),
            (("trace", b"t%d" % i),) if i % 2 else (),
            timestamp_delta=i * 3,
        )
        for i in range(50)
    )
    client = ClientBatch(records, codec=codec, producer=producer)
    sent = client.build()
    carrier = encoded(sent)
    assert header(carrier) == header(sent)
    assert_same_records(decode_columnar_batch(carrier), client, 0)


def test_narrow_types_from_ddl() -> None:
    encoder = ColumnarEncoder(NARROW)
    values = [
        {"n": 1, "small": -128, "price": 12.5, "local": "2026-11-23T09:03:00"},
        {"n": 2, "small": 127, "price": 0.01, "local": "2026-11-23T09:03:00.250"},
        {"n": 3, "small": None, "price": "3.30"},
    ]
    client = ClientBatch(tuple(ClientRecord(None, json.dumps(v).encode()) for v in values))
    result = encoder.encode(client.build())
    assert isinstance(result, Encoded)
    got = [json.loads(r.value) for r in decode_columnar_batch(result.batch)]
    assert got[:2] == values[:2]
    assert got[2] == {"n": 3, "small": None, "price": 3.3} or result.verbatim == 1
    assert [r.value for r in decode_columnar_batch(result.batch)][2] == client.records[2].value


def test_the_lake_data_keeps_its_bytes() -> None:
    # Compact JSON, every field present, one timestamp style: nothing is kept whole, and the
    # values come back byte for byte without `lossless`.
    values = [
        b'{"id":%d,"name":"user-%d","amount":%d.25,"ok":true,"at":"2026-11-%02dT09:03:00.%03dZ",'
        b'"items":[{"sku":"SKU-1","qty":2}]}' % (i, i, i, 1 + i % 28, i % 1000)
        for i in range(300)
    ]
    client = ClientBatch(tuple(ClientRecord(b"k", v) for v in values), codec="zstd")
    result = ENCODER.encode(client.build())
    assert isinstance(result, Encoded) and result.verbatim == 0
    assert [r.value for r in decode_columnar_batch(result.batch)] == values


# ---- what Apache Kafka's broker does with a carrier -----------------------------------------


@SLOW
@given(client=client_batches(), topic_codec=st.sampled_from(["producer", *CODECS]))
def test_kafka_accepts_the_carrier_and_a_rebuild_keeps_it(
    client: ClientBatch, topic_codec: str
) -> None:
    carrier = encoded(client.build())
    in_place, why = kafka_validates(carrier)
    assert in_place, why  # sequential inner offsets: never rebuilt for its own sake
    if topic_codec not in ("producer", "zstd"):
        # compression.type of the topic differs: Kafka rebuilds the batch record by record.
        carrier = kafka_rebuilds(carrier, topic_codec)
        kafka_validates(carrier)
    assert_same_records(decode_columnar_batch(carrier), client, 0)


def test_per_record_timestamps_are_the_producer_s() -> None:
    # message.timestamp.before.max.ms / after.max.ms judge each record, as for the client batch.
    deltas = [0, -50_000, 3_600_000]
    client = ClientBatch(
        tuple(ClientRecord(None, b'{"id":%d}' % d, timestamp_delta=d) for d in deltas)
    )
    carrier = encoded(client.build())
    assert [t for _, t, *_ in read_back(carrier)] == [BASE_TIMESTAMP + d for d in deltas]
    kafka_validates(carrier, now=BASE_TIMESTAMP, before_max_ms=60_000, after_max_ms=3_600_000)
    with pytest.raises(AssertionError, match="INVALID_TIMESTAMP"):
        kafka_validates(carrier, now=BASE_TIMESTAMP, before_max_ms=10_000)


def test_a_compacted_topic_refuses_carriers() -> None:
    # The placeholders have no key; docs/columnar.md: columnar topics must not be compacted.
    client = ClientBatch((ClientRecord(b"k", b'{"id":1}'), ClientRecord(b"k", b'{"id":2}')))
    kafka_validates(client.build(), compacted=True)
    with pytest.raises(AssertionError, match="has no key"):
        kafka_validates(encoded(client.build()), compacted=True)


# ---- what a consumer without kipside sees ---------------------------------------------------


def test_a_plain_consumer_decodes_the_first_record() -> None:
    client = ClientBatch(
        tuple(ClientRecord(b"%d" % i, b'{"id":%d}' % i, timestamp_delta=i) for i in range(4))
    )
    stored = with_base_offset(encoded(client.build()), 700)
    seen = read_back(stored)  # what any Kafka client delivers
    assert [s[0] for s in seen] == [700, 701, 702, 703]
    assert seen[0][4] == [(COLUMNAR_HEADER, b"\x01")] and seen[0][2] is None
    assert all(s[2:] == (None, None, []) for s in seen[1:])
    offset, timestamp, _, value, headers = seen[0]
    assert value is not None
    records = decode_columnar_record(value, headers, offset=offset, timestamp=timestamp)
    assert_same_records(records, client, 700)
    appended = decode_columnar_record(
        value, headers, offset=offset, timestamp=5, timestamp_type=TimestampType.LOG_APPEND_TIME
    )
    assert {r.timestamp for r in appended} == {5}


def test_log_append_time_stamps_every_record_with_the_batch_s() -> None:
    client = ClientBatch((ClientRecord(None, b'{"id":1}'), ClientRecord(None, b'{"id":2}')))
    carrier = bytearray(encoded(client.build()))
    # What the broker does for message.timestamp.type=LogAppendTime: attribute bit 3 and
    # maxTimestamp set, CRC recomputed.
    attributes = struct.unpack_from(">h", carrier, 21)[0] | 0x08
    struct.pack_into(">h", carrier, 21, attributes)
    struct.pack_into(">q", carrier, 35, 1_800_000_000_000)
    struct.pack_into(">I", carrier, 17, crc32c.crc32c(bytes(carrier[21:])))
    records = decode_columnar_batch(bytes(carrier))
    assert {(r.timestamp, r.timestamp_type) for r in records} == {
        (1_800_000_000_000, TimestampType.LOG_APPEND_TIME)
    }
    assert [t for _, t, *_ in read_back(reencode_columnar_batch(bytes(carrier)))] == [
        1_800_000_000_000
    ] * 2


def test_the_segment_is_a_parquet_file_with_the_records() -> None:
    client = ClientBatch(
        (
            ClientRecord(b"a", b'{"id":1,"name":"x","at":"2026-11-23T09:03:00Z"}', (("h", b"1"),)),
            ClientRecord(None, b'{"id":2}', timestamp_delta=7),
        )
    )
    carrier = encoded(client.build())
    value = read_back(carrier)[0][3]
    assert value is not None and value[:4] == b"PAR1" and value[-4:] == b"PAR1"
    table = read_columnar_segment(value)
    assert table.column_names[-4:] == [
        "kafka_key",
        "kafka_headers",
        "kafka_timestamp",
        "kafka_offset_delta",
    ]
    assert table.column("kafka_key").to_pylist() == [b"a", None]
    assert table.column("kafka_offset_delta").to_pylist() == [0, 1]
    assert table.column("kafka_headers").to_pylist() == [[{"key": "h", "value": b"1"}], []]
    assert table.column("kafka_timestamp").cast(pa.int64()).to_pylist() == [
        BASE_TIMESTAMP * 1000,
        (BASE_TIMESTAMP + 7) * 1000,
    ]
    assert table.schema.field("at").type == pa.timestamp("us", tz="UTC")


# ---- batches left alone ---------------------------------------------------------------------


MISFITS = {
    "not json": (b"not json {", "not JSON"),
    "not an object": (b"[1, 2]", "not a JSON object"),
    "wrong type": (b'{"id": "seven"}', "id"),
    "required missing": (b'{"name": "x"}', "required field 'id'"),
    "required null": (b'{"id": null}', "required field 'id'"),
    "two documents": (b'{"id": 1}{"id": 2}', "more than one"),
    "not utf-8": (b'{"id": 1, "name": "\xff"}', "UTF-8"),
    "bad timestamp": (b'{"id": 1, "at": "yesterday"}', "at"),
    "bad date": (b'{"id": 1, "day": "2026-13-45"}', "day"),
    "nested wrong type": (b'{"id": 1, "items": [{"qty": "x"}]}', "qty"),
    "NaN": (b'{"id": 1, "amount": NaN}', ""),
    "empty": (b"", "not JSON"),
}


@pytest.mark.parametrize(("value", "says"), list(MISFITS.values()), ids=list(MISFITS))
def test_a_value_that_does_not_fit_leaves_the_batch_alone(value: bytes, says: str) -> None:
    values = [b'{"id": 1}'] * 5 + [value] + [b'{"id": 2}'] * 3
    result = ENCODER.encode(ClientBatch(tuple(ClientRecord(None, v) for v in values)).build())
    assert isinstance(result, NotEncodable)
    assert result.kind == NotEncodableKind.MISFIT
    assert result.record == 5, result
    assert says in result.reason, result


def test_a_null_value_is_a_misfit() -> None:
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    builder.append(0, timestamp=BASE_TIMESTAMP, key=b"k", value=b'{"id":1}', headers=[])
    builder.append(1, timestamp=BASE_TIMESTAMP, key=b"k", value=None, headers=[])
    result = ENCODER.encode(bytes(builder.build()))
    assert isinstance(result, NotEncodable) and result.record == 1 and "null" in result.reason


def test_a_carrier_is_not_encoded_again() -> None:
    carrier = encoded(ClientBatch((ClientRecord(None, b'{"id":1}'),)).build())
    result = ENCODER.encode(carrier)
    assert isinstance(result, NotEncodable) and result.kind == NotEncodableKind.CARRIER


def test_a_malformed_batch_is_left_for_the_broker() -> None:
    good = ClientBatch((ClientRecord(None, b'{"id":1}'),) * 3).build()
    bad_crc = good[:-1] + bytes([good[-1] ^ 1])
    for batch, says in [(bad_crc, "CRC"), (good[:40], "truncated"), (b"", "truncated")]:
        result = ENCODER.encode(batch)
        assert isinstance(result, NotEncodable) and result.kind == NotEncodableKind.MALFORMED
        assert says in result.reason


# ---- carriers and ordinary batches ----------------------------------------------------------


def test_columnar_version_tells_carriers_from_ordinary_batches() -> None:
    ordinary = ClientBatch((ClientRecord(None, b'{"id":1}'),)).build()
    assert columnar_version(ordinary) is None
    assert columnar_version(encoded(ordinary)) == 1


@pytest.mark.parametrize("n", [1, 2, 1000])
def test_counts(n: int) -> None:
    client = ClientBatch(tuple(ClientRecord(None, b'{"id":%d}' % i) for i in range(n)))
    carrier = RecordBatchView.from_buffer(encoded(client.build()))
    assert (carrier.records_count, carrier.last_offset_delta) == (n, n - 1)


def test_an_encoder_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="kafka_key"):
        ColumnarEncoder(pa.schema([("kafka_key", pa.string())]))
    with pytest.raises(ValueError, match="float"):
        ColumnarEncoder(pa.schema([("f", pa.float32())]))
    with pytest.raises(ValueError, match="map"):
        ColumnarEncoder(pa.schema([("m", pa.map_(pa.string(), pa.int64()))]))
    keys = ColumnarKeys.of({"k": b"0" * 16}, "k")
    with pytest.raises(ValueError, match="not a top-level field"):
        ColumnarEncoder(SCHEMA, ColumnarOptions(encrypt=("nope",), keys=keys))


# ---- nulls: written, left out, and text that looks like them ---------------------------------

SMALL = pa.schema(
    [
        pa.field("id", pa.int64(), False),
        ("name", pa.string()),
        ("amount", pa.float64()),
        ("customer", pa.struct([("name", pa.string()), ("zip", pa.string())])),
        ("tags", pa.list_(pa.field("element", pa.string()))),
        ("items", pa.list_(pa.field("element", pa.struct([("sku", pa.string())])))),
        ("sku", pa.string()),
    ]
)
ALL_NULL = b'"name":null,"amount":null,"customer":null,"tags":null,"items":null,"sku":null}'
NULL_STYLES = {
    # A producer that writes every field (Jackson's default): nulls written, nothing kept whole.
    "written": ([b'{"id":%d,' % i + ALL_NULL for i in range(20)], 0),
    # One that leaves empty fields out (Go's omitempty): nothing kept whole either.
    "left out": ([b'{"id":%d,"amount":1.5}' % i for i in range(20)], 0),
    # Both in one batch: the batch takes the commoner way, the others are kept whole.
    "mixed": ([b'{"id":1,' + ALL_NULL, b'{"id":2,' + ALL_NULL, b'{"id":3}'], 1),
    # `null` inside a string is no null: the row is decided by the json module.
    "null in a string": ([b'{"id":1,"name":"null"}', b'{"id":2,"name":"x"}'], 0),
    # A nested field named like a missing top-level one must not pass for it.
    "nested namesake": (
        [b'{"id":1,"items":[{"sku":null}]}', b'{"id":2,"items":[{"sku":"a"}],"sku":null}'],
        None,
    ),
    "nested nulls": (
        [b'{"id":1,"customer":{"name":null,"zip":"1"}}', b'{"id":2,"customer":{"zip":"2"}}'],
        1,
    ),
    "null list element": ([b'{"id":1,"tags":["a",null]}', b'{"id":2,"tags":[]}'], 0),
    "spaces": ([b'{"id": 1, "name" :  null, "amount":\tnull}'], None),
}


@pytest.mark.parametrize(("values", "kept"), NULL_STYLES.values(), ids=list(NULL_STYLES))
def test_nulls_come_back_as_they_were_written(values: list[bytes], kept: int | None) -> None:
    client = ClientBatch(tuple(ClientRecord(None, v) for v in values))
    result = ColumnarEncoder(SMALL).encode(client.build())
    assert isinstance(result, Encoded), result
    records = decode_columnar_batch(result.batch)
    assert [json.loads(r.value) for r in records] == [json.loads(v) for v in values]
    if kept is not None:
        assert result.verbatim == kept
