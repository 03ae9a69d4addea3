"""The carrier's bytes (docs/columnar.md), and carriers that are wrong in every way a broken writer,
a broken disk or a hostile peer could make them: decoding raises ColumnarError (a ProtocolError)
and nothing else, and allocates no more than its cap.

GOLDEN is a version 1 carrier as written by this kipside (tests/columnar_golden.hex): every later
kipside must read it as the same records.
"""

from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path
from typing import Any

import cramjam
import crc32c
import pytest
from columnar_kit import BASE_TIMESTAMP, ClientBatch, ClientRecord, kafka_rebuilds, read_back
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kipside.protocol import (
    COLUMNAR_HEADER,
    ColumnarEncoder,
    ColumnarError,
    Encoded,
    ProtocolError,
    RecordBatchView,
    decode_columnar_batch,
    decode_columnar_record,
    parse_json_schema,
    reencode_columnar_batch,
)

SCHEMA = parse_json_schema(
    json.dumps(
        {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "name": {"type": "string"},
                "at": {"type": "string", "format": "date-time"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["id"],
        }
    ),
    "golden.json",
).to_arrow()
CLIENT = ClientBatch(
    (
        ClientRecord(
            b"order-1",
            b'{"id":1,"name":"Ada","at":"2026-11-23T09:03:00Z","tags":["a","b"]}',
            (("trace", b"abc"),),
        ),
        ClientRecord(None, b'{"id":2,"tags":["x"]}', timestamp_delta=5),
    ),
    producer="idempotent",
)
GOLDEN = bytes.fromhex(
    (Path(__file__).parent / "columnar_golden.hex").read_text().replace("\n", "")
)


def carrier() -> bytes:
    result = ColumnarEncoder(SCHEMA).encode(CLIENT.build())
    assert isinstance(result, Encoded)
    return result.batch


def records_section(batch: bytes) -> bytes:
    return bytes(cramjam.zstd.decompress(RecordBatchView.from_buffer(batch).records))


def test_the_golden_carrier_decodes_to_its_records() -> None:
    records = decode_columnar_batch(GOLDEN)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records] == [
        (
            0,
            BASE_TIMESTAMP,
            b"order-1",
            b'{"id":1,"name":"Ada","at":"2026-11-23T09:03:00Z","tags":["a","b"]}',
            (("trace", b"abc"),),
        ),
        # Null fields are left out, as this producer left them out.
        (1, BASE_TIMESTAMP + 5, None, b'{"id":2,"tags":["x"]}', ()),
    ]


def test_this_kipside_writes_the_golden_carrier() -> None:
    # The Parquet writer is pinned (pyarrow in pyproject.toml): same input, same bytes.
    assert carrier() == GOLDEN


def test_the_carrier_layout_byte_by_byte() -> None:
    view = RecordBatchView.from_buffer(GOLDEN)
    assert GOLDEN[16] == 2  # magic
    assert view.attributes == 0x04  # zstd, CreateTime, not transactional, not control
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (4242, 7, 100)
    assert (view.records_count, view.last_offset_delta) == (2, 1)
    assert (view.base_timestamp, view.max_timestamp) == (BASE_TIMESTAMP, BASE_TIMESTAMP + 5)
    section = records_section(GOLDEN)
    segment = read_back(GOLDEN)[0][3]
    assert segment is not None
    marker = (
        b"\x02"  # one header
        + b"\x20"  # key length 16
        + COLUMNAR_HEADER.encode()
        + b"\x02"  # value length 1
        + b"\x01"  # version 1
    )
    length = len(segment)
    value_length = bytes([((length << 1) & 0x7F) | 0x80, (length << 1) >> 7])
    assert length < 8192  # two varint bytes, as written above
    record0 = (
        b"\x00"  # attributes
        b"\x00"  # timestampDelta 0
        b"\x00"  # offsetDelta 0
        b"\x01" + value_length + segment + marker  # key: null (-1)
    )
    record1 = (
        b"\x00"  # attributes
        b"\x0a"  # timestampDelta 5
        b"\x02"  # offsetDelta 1
        b"\x01"  # key: null
        b"\x01"  # value: null
        b"\x00"  # no headers
    )
    body0_length = len(record0)
    prefix0 = bytes([((body0_length << 1) & 0x7F) | 0x80, (body0_length << 1) >> 7])
    assert section == prefix0 + record0 + b"\x0c" + record1


# ---- what is wrong with a carrier, and what decoding says -----------------------------------


def decode_fails(batch: bytes, *, max_bytes: int | None = None) -> str:
    """The message of the ColumnarError decoding `batch` raises, by every way of decoding it."""
    more: dict[str, Any] = {} if max_bytes is None else {"max_bytes": max_bytes}
    messages = []
    for decode in (decode_columnar_batch, reencode_columnar_batch):
        with pytest.raises(ColumnarError) as info:
            decode(batch, **more)
        assert isinstance(info.value, ProtocolError)
        messages.append(str(info.value))
    return messages[0]


@pytest.mark.parametrize("cut", [0, 1, 16, 60, 61, 80, len(GOLDEN) // 2, len(GOLDEN) - 1])
def test_truncated(cut: int) -> None:
    assert "not a readable record batch" in decode_fails(GOLDEN[:cut])


def test_bad_crc() -> None:
    assert "CRC" in decode_fails(GOLDEN[:-1] + bytes([GOLDEN[-1] ^ 0x40]))


def edited(edit: Any) -> bytes:
    return kafka_rebuilds(GOLDEN, "zstd", edit)


def test_another_version() -> None:
    version_2 = edited(lambda i, k, v, h: (k, v, [(COLUMNAR_HEADER, b"\x02")] if i == 0 else h))
    assert "carrier version 2; this kipside reads version 1" in decode_fails(version_2)
    value, headers = read_back(version_2)[0][3], read_back(version_2)[0][4]
    assert value is not None
    with pytest.raises(ColumnarError, match="version 2"):
        decode_columnar_record(value, headers, offset=0, timestamp=0)


def test_an_ordinary_batch() -> None:
    assert "is not a columnar carrier" in decode_fails(CLIENT.build())


def test_placeholders_with_data() -> None:
    batch = edited(lambda i, k, v, h: (b"key", v, h) if i == 1 else (k, v, h))
    assert "not a segment followed by empty placeholders" in decode_fails(batch)


def test_a_segment_that_is_not_parquet() -> None:
    batch = edited(lambda i, k, v, h: (k, b"PAR1 nothing", h) if i == 0 else (k, v, h))
    assert "not a Parquet file" in decode_fails(batch)


def test_a_segment_of_another_carrier() -> None:
    other = ClientBatch(tuple(ClientRecord(None, b'{"id":%d}' % i) for i in range(3)))
    result = ColumnarEncoder(SCHEMA).encode(other.build())
    assert isinstance(result, Encoded)
    three_rows = read_back(result.batch)[0][3]
    batch = edited(lambda i, k, v, h: (k, three_rows, h) if i == 0 else (k, v, h))
    assert "holds 3 rows for 2 records" in decode_fails(batch)


def test_the_cap_on_decompressed_records() -> None:
    # A carrier whose records section inflates far beyond what it weighs.
    bomb = edited(lambda i, k, v, h: (k, v, h) if i == 0 else (k, v, [("pad", b"\0" * 4_000_000)]))
    message = decode_fails(bomb, max_bytes=1_000_000)
    assert "more than 1,000,000 bytes" in message


def test_the_cap_on_the_segment() -> None:
    message = decode_fails(GOLDEN, max_bytes=200)
    assert "over the 200 allowed" in message or "more than 200 bytes" in message


def test_a_segment_whose_headers_list_reads_as_null() -> None:
    # One flipped bit in the headers' definition levels makes a row's list null.
    segment = read_back(GOLDEN)[0][3]
    assert segment is not None
    broken = bytearray(segment)
    broken[268] ^= 4
    batch = edited(lambda i, k, v, h: (k, bytes(broken), h) if i == 0 else (k, v, h))
    message = decode_fails(batch)
    assert "kafka_headers" in message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_corrupted_segment_raises_only_columnar_error(data: st.DataObject) -> None:
    segment = read_back(GOLDEN)[0][3]
    assert segment is not None
    flips = data.draw(
        st.lists(st.tuples(st.integers(0, len(segment) - 1), st.integers(1, 255)), min_size=1)
    )
    broken = bytearray(segment)
    for position, xor in flips:
        broken[position] ^= xor
    batch = edited(lambda i, k, v, h: (k, bytes(broken), h) if i == 0 else (k, v, h))
    try:
        records = decode_columnar_batch(batch)
    except ColumnarError:
        return
    assert len(records) == 2  # a flip in bytes nothing reads (a statistic, padding)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_corrupted_carrier_raises_only_columnar_error(data: st.DataObject) -> None:
    # Anywhere after the CRC (attributes, counts, timestamps, the compressed records), with the
    # CRC made to match: what a broken writer, not a broken disk, would send.
    batch = bytearray(GOLDEN)
    flips = data.draw(
        st.lists(st.tuples(st.integers(21, len(batch) - 1), st.integers(1, 255)), min_size=1)
    )
    for position, xor in flips:
        batch[position] ^= xor
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    for decode in (decode_columnar_batch, reencode_columnar_batch):
        with contextlib.suppress(ColumnarError):
            decode(bytes(batch))


def test_the_cap_on_the_record_count() -> None:
    # A count far beyond what the bytes hold is refused before the kernels allocate for it.
    batch = bytearray(GOLDEN)
    struct.pack_into(">i", batch, 57, 50_000_000)
    struct.pack_into(">i", batch, 23, 50_000_000 - 1)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    assert "claims 50,000,000 records" in decode_fails(bytes(batch))
