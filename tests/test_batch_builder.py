"""Tests for protocol.batch_builder: batches kipside writes, read back by kafka-python's decoder."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from kipside.protocol.batch_builder import Record, encode_batch
from kipside.protocol.records import HEADER_SIZE, Compression, RecordBatchView, TimestampType

BASE = 1_700_000_000_000

Header = tuple[str, bytes | None]
ReadBack = tuple[int, int, bytes | None, bytes | None, list[Header]]


def read_back(batch: bytes) -> list[ReadBack]:
    theirs = DefaultRecordBatch(batch)
    assert theirs.validate_crc()  # must be asked before iterating
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in theirs]


def expected(records: list[Record], base_timestamp: int) -> list[ReadBack]:
    return [
        (i, base_timestamp + r.timestamp_delta, r.key, r.value, list(r.headers))
        for i, r in enumerate(records)
    ]


CASES: dict[str, list[Record]] = {
    "one": [Record(b"k", b"v")],
    "null key and value": [Record(None, None)],
    "empty key and value": [Record(b"", b"")],
    "headers": [
        Record(b"k", b"v", headers=(("trace", b"abc"), ("none", None), ("empty", b""))),
        Record(None, b"v2", headers=(("ünï", b"\xff" * 3),)),
    ],
    "long fields": [Record(b"k" * 200, b"v" * 70_000, headers=(("h" * 130, b"x" * 300),))],
    "timestamps": [
        Record(b"a", b"1", timestamp_delta=0),
        Record(b"b", b"2", timestamp_delta=-5_000),
        Record(b"c", b"3", timestamp_delta=90_000),
        Record(b"d", b"4", timestamp_delta=64),
    ],
    "many": [Record(b"%d" % i, b"value %d" % i) for i in range(300)],
}


@pytest.mark.parametrize("records", list(CASES.values()), ids=list(CASES))
def test_kafka_python_reads_what_was_written(records: list[Record]) -> None:
    batch = encode_batch(records, base_timestamp=BASE)
    theirs = DefaultRecordBatch(batch)

    assert read_back(batch) == expected(records, BASE)
    assert theirs.magic == 2
    assert theirs.base_offset == 0
    assert theirs.size_in_bytes == len(batch)
    assert theirs.records_count == len(records)
    assert theirs.last_offset_delta == len(records) - 1
    assert theirs.compression_type == 0
    assert theirs.timestamp_type == 0
    assert not theirs.is_transactional
    assert not theirs.is_control_batch
    assert theirs.first_timestamp == BASE
    assert theirs.max_timestamp == BASE + max(r.timestamp_delta for r in records)
    assert (theirs.producer_id, theirs.producer_epoch, theirs.base_sequence) == (-1, -1, -1)


@pytest.mark.parametrize("records", list(CASES.values()), ids=list(CASES))
def test_record_batch_view_reads_what_was_written(records: list[Record]) -> None:
    batch = encode_batch(
        records, base_timestamp=BASE, producer_id=2**40, producer_epoch=3, base_sequence=17
    )
    view = RecordBatchView.from_buffer(batch)

    assert view.crc_valid()
    assert view.size == len(batch)
    assert view.batch_length == len(batch) - 12
    assert view.partition_leader_epoch == -1  # the broker assigns it
    assert view.compression is Compression.NONE
    assert view.timestamp_type is TimestampType.CREATE_TIME
    assert not view.is_transactional and not view.is_control
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (2**40, 3, 17)
    assert view.records_count == len(records)
    assert view.last_offset_delta == len(records) - 1
    assert view.base_timestamp == BASE
    assert view.max_timestamp == BASE + max(r.timestamp_delta for r in records)
    theirs = DefaultRecordBatch(batch)
    assert (theirs.producer_id, theirs.producer_epoch, theirs.base_sequence) == (2**40, 3, 17)
    assert read_back(batch) == expected(records, BASE)


def test_same_bytes_as_kafka_pythons_builder() -> None:
    # With the first record at delta 0 both builders must agree byte for byte, except the
    # partition leader epoch (outside the CRC): kafka-python writes 0, the Java producer -1.
    records = CASES["headers"] + CASES["timestamps"]
    theirs = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=7,
        producer_epoch=1,
        base_sequence=40,
        batch_size=1 << 20,
    )
    for i, r in enumerate(records):
        theirs.append(
            i, timestamp=BASE + r.timestamp_delta, key=r.key, value=r.value, headers=r.headers
        )
    ours = encode_batch(
        records, base_timestamp=BASE, producer_id=7, producer_epoch=1, base_sequence=40
    )
    reference = bytes(theirs.build())
    assert ours[:12] + ours[16:] == reference[:12] + reference[16:]
    assert ours[12:16] == b"\xff\xff\xff\xff"


def test_no_records_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        encode_batch([], base_timestamp=BASE)


def test_records_follow_the_header() -> None:
    batch = encode_batch([Record(b"k", b"v")], base_timestamp=BASE)
    # length 8 (zigzag 0x10), attributes, timestampDelta 0, offsetDelta 0, key "k", value "v",
    # no headers: the same record Kafka's own golden batch in records_kit.py (GOLDEN) holds.
    assert batch[HEADER_SIZE:] == bytes.fromhex("10000000026b027600")


header_names = st.text(max_size=8)
maybe_bytes = st.none() | st.binary(max_size=40)


@given(
    records=st.lists(
        st.builds(
            Record,
            key=maybe_bytes,
            value=maybe_bytes,
            headers=st.lists(st.tuples(header_names, maybe_bytes), max_size=3).map(tuple),
            timestamp_delta=st.integers(-(2**40), 2**40),
        ),
        min_size=1,
        max_size=8,
    ),
    base_timestamp=st.integers(0, 2**50),
    producer_id=st.integers(-1, 2**63 - 1),
    producer_epoch=st.integers(-1, 2**15 - 1),
    base_sequence=st.integers(-1, 2**31 - 1),
)
def test_any_batch_reads_back(
    records: list[Record],
    base_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
) -> None:
    batch = encode_batch(
        records,
        base_timestamp=base_timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )
    assert read_back(batch) == expected(records, base_timestamp)
    view = RecordBatchView.from_buffer(batch)
    assert view.crc_valid()
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (
        producer_id,
        producer_epoch,
        base_sequence,
    )
    assert view.max_timestamp == base_timestamp + max(r.timestamp_delta for r in records)
