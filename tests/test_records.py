"""Tests for protocol.records' RecordBatchView against kafka-python's independent RecordBatch
code: real batches of every codec and producer kind, golden bytes, and hypothesis-drawn
headers (every field read back; the CRC covers exactly what Kafka says it covers).

Its neighbours: test_records_errors (a header that is wrong), test_records_iteration (a blob
of batches), test_records_plain_producer (re-heading a batch as a plain producer's).
"""

from __future__ import annotations

import crc32c
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from records_kit import (
    CODECS,
    GOLDEN,
    PRODUCERS,
    assemble,
    assert_matches_kafka_python,
    build,
    headers,
    read_back,
    set_field,
)

from kipside.protocol.records import HEADER_SIZE, Compression, RecordBatchView, TimestampType

# ---- real batches from kafka-python ------------------------------------------------------


@pytest.mark.parametrize("producer", list(PRODUCERS))
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_view_matches_kafka_python(codec: Compression, producer: str) -> None:
    batch = build(codec, producer)
    view = RecordBatchView.from_buffer(batch)

    assert_matches_kafka_python(view, batch)
    is_txn, pid, epoch, seq = PRODUCERS[producer]
    assert view.compression is codec
    assert view.is_transactional is is_txn
    assert (view.producer_id, view.producer_epoch, view.base_sequence) == (pid, epoch, seq)
    assert view.records_count == 5
    assert view.last_offset_delta == 4
    assert view.base_timestamp == 1_700_000_000_500
    assert view.max_timestamp == 1_700_000_009_000
    assert view.timestamp_type is TimestampType.CREATE_TIME
    assert not view.is_control
    assert not view.has_delete_horizon
    assert bytes(view.records) == batch[HEADER_SIZE:]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_broker_assigned_fields_outside_crc(codec: Compression) -> None:
    # The broker rewrites baseOffset and partitionLeaderEpoch without touching the CRC.
    batch = build(codec, "idempotent")
    batch = set_field(batch, 0, ">q", 10**12 + 17, fix_crc=False)
    batch = set_field(batch, 12, ">i", 9, fix_crc=False)
    view = RecordBatchView.from_buffer(batch)

    assert_matches_kafka_python(view, batch)
    assert view.base_offset == 10**12 + 17
    assert view.partition_leader_epoch == 9


def test_view_does_not_copy() -> None:
    buf = bytearray(b"\xee" * 3 + build() + b"\xee" * 2)
    view = RecordBatchView.from_buffer(buf, 3)

    assert view.raw.obj is buf
    assert view.raw.readonly is False
    buf[3 + 60] ^= 0xFF  # last byte of the records count: visible through the view
    assert view.raw[60] == buf[3 + 60]
    assert not view.crc_valid()


def test_from_memoryview_slice() -> None:
    batch = build(Compression.LZ4, "transactional")
    view = RecordBatchView.from_buffer(memoryview(b"xx" + batch)[2:])
    assert_matches_kafka_python(view, batch)


# ---- golden bytes ------------------------------------------------------------------------


def test_golden_batch() -> None:
    view = RecordBatchView.from_buffer(GOLDEN)

    assert view.base_offset == 5
    assert view.batch_length == 58
    assert view.size == len(GOLDEN) == 70
    assert view.partition_leader_epoch == 7
    assert view.magic == 2
    assert view.crc == 0xB3A501D7
    assert view.attributes == 0x0018
    assert view.compression is Compression.NONE
    assert view.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert view.is_transactional
    assert not view.is_control
    assert not view.has_delete_horizon
    assert view.last_offset_delta == 0
    assert view.base_timestamp == view.max_timestamp == 1_700_000_000_000
    assert view.producer_id == 1234
    assert view.producer_epoch == 3
    assert view.base_sequence == 42
    assert view.records_count == 1
    assert bytes(view.records) == bytes.fromhex("10000000026b027600")
    assert view.compute_crc() == 0xB3A501D7
    assert view.crc_valid()
    assert read_back(GOLDEN) == [(5, 1_700_000_000_000, b"k", b"v", [])]


def test_crc32c_is_castagnoli() -> None:
    # The standard CRC-32C check value; plain CRC-32 would give 0xCBF43926.
    assert crc32c.crc32c(b"123456789") == 0xE3069283


# ---- hypothesis --------------------------------------------------------------------------


@given(h=headers(), body=st.binary(max_size=64))
def test_header_round_trip(h: dict[str, int], body: bytes) -> None:
    batch = assemble(h, body)
    view = RecordBatchView.from_buffer(batch)

    for name, value in h.items():
        assert getattr(view, name) == value, name
    attrs = h["attributes"]
    assert view.compression == attrs & 0x07
    assert view.timestamp_type == (1 if attrs & 0x08 else 0)
    assert view.is_transactional == bool(attrs & 0x10)
    assert view.is_control == bool(attrs & 0x20)
    assert view.has_delete_horizon == bool(attrs & 0x40)
    assert view.magic == 2
    assert view.size == len(batch) == HEADER_SIZE + len(body)
    assert view.batch_length == len(batch) - 12
    assert bytes(view.records) == body
    assert view.crc_valid()


@given(h=headers(), body=st.binary(max_size=64), data=st.data())
def test_flip_in_crc_region_detected(h: dict[str, int], body: bytes, data: st.DataObject) -> None:
    batch = bytearray(assemble(h, body))
    # The stored CRC (17..20) plus everything it covers (21..end).
    index = data.draw(st.integers(17, len(batch) - 1), label="index")
    batch[index] ^= data.draw(st.integers(1, 255), label="mask")
    # An unknown codec is rejected before the CRC is ever looked at.
    assume(batch[22] & 0x07 <= 4)
    assert not RecordBatchView.from_buffer(batch).crc_valid()


@given(h=headers(), body=st.binary(max_size=64), data=st.data())
def test_flip_outside_crc_region_ignored(
    h: dict[str, int], body: bytes, data: st.DataObject
) -> None:
    batch = bytearray(assemble(h, body))
    # baseOffset and partitionLeaderEpoch; batchLength is framing, not content.
    index = data.draw(st.sampled_from([*range(0, 8), *range(12, 16)]), label="index")
    batch[index] ^= data.draw(st.integers(1, 255), label="mask")
    view = RecordBatchView.from_buffer(batch)
    assert view.crc_valid()
    assert (view.base_offset, view.partition_leader_epoch) != (
        h["base_offset"],
        h["partition_leader_epoch"],
    )
