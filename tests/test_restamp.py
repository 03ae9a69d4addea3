"""Tests for protocol.records' restamp and control_type, and restamped batches on the wire.

restamp re-heads a fetched batch for another producer without copying its records; the result
goes out through PartitionBatch.prefix. Both are checked with kafka-python's decoder. Control
batches are written by hand (tests/batches.py) and cross-checked with kafka-python too.
(Split from test_records.py, which covers the batch view itself.)
"""

from __future__ import annotations

import struct

import pytest
from batches import (
    ABORT,
    COMMIT,
    CONTROL,
    TRANSACTIONAL,
    Header,
    assert_same_but_producer,
    control_batch,
    control_record,
    data_batch,
)
from hypothesis import given
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from kipside.protocol.apis import ApiKey
from kipside.protocol.messages import decode_request
from kipside.protocol.produce import PartitionBatch, encode_produce_request, parse_produce_request
from kipside.protocol.records import (
    HEADER_SIZE,
    Compression,
    ControlType,
    RecordBatchError,
    RecordBatchView,
    control_type,
    restamp,
)

CODECS = list(Compression)
int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)


def kafka_python_batch(codec: Compression, *, transactional: bool) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=transactional,
        producer_id=90 if transactional else -1,
        producer_epoch=4 if transactional else -1,
        base_sequence=12 if transactional else -1,
        batch_size=1 << 20,
    )
    for i in range(4):
        builder.append(
            i,
            timestamp=1_700_000_000_000 + i,
            key=b"key-%d" % i,
            value=b"value " * 40 + b"%d" % i,
            headers=[("h", b"%d" % i)],
        )
    batch = bytearray(builder.build())
    # A broker-assigned base offset and leader epoch, as in a Fetch response.
    struct.pack_into(">q", batch, 0, 5_000)
    struct.pack_into(">i", batch, 12, 11)
    return bytes(batch)


def records_of(batch: bytes) -> list[tuple[int, bytes | None, bytes | None, object]]:
    theirs = DefaultRecordBatch(batch)
    assert theirs.validate_crc()
    return [(r.offset, r.key, r.value, r.headers) for r in theirs]


# ---- restamp ------------------------------------------------------------------------------


@pytest.mark.parametrize("transactional", [False, True], ids=["idempotent", "transactional"])
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_restamp(codec: Compression, transactional: bool) -> None:
    original = kafka_python_batch(codec, transactional=transactional)
    buffer = bytearray(b"\x00" * 7 + original)  # as if inside a Fetch response frame
    view = RecordBatchView.from_buffer(buffer, 7)

    header, body = restamp(view, 2**50 + 1, 300, 2**31 - 5)

    assert isinstance(header, bytes) and len(header) == HEADER_SIZE
    assert isinstance(body, memoryview)
    assert body.obj is buffer  # the records are the fetched bytes, not a copy
    assert bytes(body) == original[HEADER_SIZE:]
    out = header + bytes(body)
    new = RecordBatchView.from_buffer(out)
    assert (new.producer_id, new.producer_epoch, new.base_sequence) == (2**50 + 1, 300, 2**31 - 5)
    assert not new.is_transactional
    assert new.attributes == view.attributes & ~TRANSACTIONAL
    assert new.compression is codec
    assert_same_but_producer(new, view)
    assert (new.base_offset, new.partition_leader_epoch) == (5_000, 11)
    assert new.crc_valid() and new.crc != view.crc
    theirs = DefaultRecordBatch(out)
    assert theirs.validate_crc()
    assert (theirs.producer_id, theirs.producer_epoch, theirs.base_sequence) == (
        2**50 + 1,
        300,
        2**31 - 5,
    )
    assert records_of(out) == records_of(original)
    assert bytes(buffer[7:]) == original  # nothing written through the source view


@given(
    attributes=int16.filter(lambda a: not a & CONTROL and a & 0x07 <= 4),
    body=st.binary(max_size=64),
    producer_id=int64,
    producer_epoch=int16,
    base_sequence=int32,
)
def test_restamp_any_header(
    attributes: int, body: bytes, producer_id: int, producer_epoch: int, base_sequence: int
) -> None:
    source = Header(records_count=3, attributes=attributes, producer_id=8).around(body)
    view = RecordBatchView.from_buffer(source)
    header, records = restamp(view, producer_id, producer_epoch, base_sequence)
    new = RecordBatchView.from_buffer(header + bytes(records))
    assert new.crc_valid()
    assert new.attributes == attributes & ~TRANSACTIONAL
    assert (new.producer_id, new.producer_epoch, new.base_sequence) == (
        producer_id,
        producer_epoch,
        base_sequence,
    )
    assert bytes(new.records) == body
    assert new.records_count == 3


@pytest.mark.parametrize("kind", [ABORT, COMMIT])
def test_restamp_refuses_control_batches(kind: int) -> None:
    marker = RecordBatchView.from_buffer(control_batch(kind, producer_id=3))
    with pytest.raises(RecordBatchError, match=r"^refusing to re-produce a control batch"):
        restamp(marker, 1, 0, 0)


# ---- restamped batches in a ProduceRequest (PartitionBatch.prefix) ------------------------


@pytest.mark.parametrize("version", range(3, 13))
def test_restamped_batch_goes_out_with_its_prefix(version: int) -> None:
    frame = bytearray(b"\x00" * 3 + data_batch(base_offset=40, producer_id=9, transactional=True))
    header, body = restamp(RecordBatchView.from_buffer(frame, 3), 77, 1, 0)
    chunks = encode_produce_request(
        version,
        acks=-1,
        timeout_ms=30_000,
        partitions=[
            PartitionBatch("t", 0, body, prefix=header),
            PartitionBatch("t", 1, memoryview(data_batch(base_offset=0))),
        ],
    )
    assert any(chunk is body for chunk in chunks)  # the records themselves are never copied
    wire = b"".join(bytes(c) for c in chunks)
    expected = header + bytes(body)

    ours = parse_produce_request(wire, 0, version)
    assert bytes(ours.partitions[0].records or b"") == expected
    kio = decode_request(ApiKey.PRODUCE, version, wire, 0)
    assert kio.topic_data[0].partition_data[0].records == expected
    assert records_of(expected) == [(40, b"k", b"v", [])]  # the broker reassigns offsets
    assert RecordBatchView.from_buffer(expected).producer_id == 77


# ---- control_type -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "expected"), [(ABORT, ControlType.ABORT), (COMMIT, ControlType.COMMIT)]
)
@pytest.mark.parametrize("coordinator_epoch", [0, 7, 2**31 - 1])
def test_control_type(kind: int, expected: ControlType, coordinator_epoch: int) -> None:
    batch = control_batch(
        kind,
        producer_id=2**33,
        producer_epoch=5,
        base_offset=99,
        coordinator_epoch=coordinator_epoch,
    )
    view = RecordBatchView.from_buffer(batch)
    assert view.is_control and view.is_transactional and view.crc_valid()
    assert control_type(view) is expected
    # The same bytes as kafka-python reads them, so the hand-built batch is Kafka's format.
    (record,) = list(DefaultRecordBatch(batch))
    assert (record.type, record.abort, record.commit) == (kind, kind == ABORT, kind == COMMIT)
    assert struct.unpack(">hi", record.value) == (0, coordinator_epoch)


def control_with_records(
    records: bytes, *, attributes: int = TRANSACTIONAL | CONTROL, count: int = 1
) -> RecordBatchView:
    return RecordBatchView.from_buffer(
        Header(records_count=count, attributes=attributes, producer_id=1).around(records)
    )


GOOD = control_record(COMMIT)


@pytest.mark.parametrize(
    ("records", "message"),
    [
        (b"", r"truncated varint at byte 0"),
        (GOOD[:1], r"truncated varint at byte 2"),  # the attributes byte is missing too
        (GOOD[:3], r"truncated varint at byte 3"),
        (GOOD[:4], r"truncated varint at byte 4"),
        (GOOD[:7], r"4-byte key; a control key has 4"),  # key cut short
        (b"\x20\x00\x00\x00\x04\x00\x01", r"has a 2-byte key"),
        (b"\x20\x00\x00\x00\x01", r"has a -1-byte key"),  # a null key
        (b"\x20\x00\x00\x00" + b"\xff" * 10, r"truncated varint"),  # a varint with no end
    ],
)
def test_malformed_control_records(records: bytes, message: str) -> None:
    with pytest.raises(RecordBatchError, match=message) as info:
        control_type(control_with_records(records))
    assert "control batch at offset 0" in str(info.value)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (2, ControlType.LEADER_CHANGE),
        (6, ControlType.KRAFT_VOTERS),
        (-1, ControlType.UNKNOWN),
        (99, ControlType.UNKNOWN),
    ],
)
def test_other_control_types_are_named_not_refused(kind: int, expected: ControlType) -> None:
    # KRaft's control records, and types a newer Kafka may add, are skipped by readers as
    # Java's consumer skips them: they must not fail the read.
    assert control_type(control_with_records(control_record(kind))) is expected


def test_control_type_needs_an_uncompressed_nonempty_control_batch() -> None:
    with pytest.raises(RecordBatchError, match="is not a control batch"):
        control_type(RecordBatchView.from_buffer(data_batch(base_offset=3, transactional=True)))
    gzip = TRANSACTIONAL | CONTROL | int(Compression.GZIP)
    with pytest.raises(RecordBatchError, match="compressed or empty"):
        control_type(control_with_records(GOOD, attributes=gzip))
    with pytest.raises(RecordBatchError, match="compressed or empty"):
        control_type(control_with_records(GOOD, count=0))


@given(records=st.binary(max_size=40))
def test_control_type_of_any_bytes(records: bytes) -> None:
    view = control_with_records(records)
    try:
        kind = control_type(view)
    except RecordBatchError:
        return
    # Whatever is accepted came from the type field of a key of 4+ bytes.
    assert isinstance(kind, ControlType)
    assert len(records) >= 9
