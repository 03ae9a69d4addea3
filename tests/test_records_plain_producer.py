"""Tests for protocol.records.as_plain_producer: a batch re-headed as a plain producer's (no
producer id, epoch, sequence or transactional bit), records and other attribute bits kept, a
fresh CRC, the source view untouched; control batches refused.
"""

from __future__ import annotations

import pytest
import records_kit as kit
from batches import assert_same_but_producer
from kafka.record.default_records import DefaultRecordBatch

from kipside.protocol.records import (
    HEADER_SIZE,
    Compression,
    RecordBatchError,
    RecordBatchView,
    TimestampType,
    as_plain_producer,
)

GOLDEN_PLAIN = bytes.fromhex(
    "0000000000000005"
    "0000003a"
    "00000007"
    "02"
    "08d365f8"  # recomputed crc
    "0008"  # transactional bit gone, LogAppendTime kept
    "00000000"
    "0000018bcfe56800"
    "0000018bcfe56800"
    "ffffffffffffffff"  # producerId -1
    "ffff"  # producerEpoch -1
    "ffffffff"  # baseSequence -1
    "00000001"
    "10000000026b027600"
)


def test_golden_as_plain_producer() -> None:
    assert as_plain_producer(RecordBatchView.from_buffer(kit.GOLDEN)) == GOLDEN_PLAIN


@pytest.mark.parametrize("producer", list(kit.PRODUCERS))
@pytest.mark.parametrize("codec", kit.CODECS, ids=lambda c: c.name)
def test_as_plain_producer(codec: Compression, producer: str) -> None:
    original = kit.build(codec, producer)
    original = kit.set_field(original, 0, ">q", 777, fix_crc=False)
    view = RecordBatchView.from_buffer(original)
    plain = as_plain_producer(view)

    assert isinstance(plain, bytes)
    assert len(plain) == len(original)
    out = RecordBatchView.from_buffer(plain)
    kit.assert_matches_kafka_python(out, plain)
    assert (out.producer_id, out.producer_epoch, out.base_sequence) == (-1, -1, -1)
    assert not out.is_transactional
    assert out.compression is view.compression is codec
    assert out.attributes == view.attributes & ~0x10
    assert_same_but_producer(out, view)
    assert plain[HEADER_SIZE:] == original[HEADER_SIZE:]
    assert out.crc_valid()
    assert kit.read_back(plain) == kit.read_back(original)
    assert kit.read_back(plain)[2][2:4] == (b"key-2", b"value " * 50 + b"2")
    # The source batch is a view; re-heading must not have written through it.
    assert bytes(view.raw) == original
    assert view.crc_valid()


def test_as_plain_producer_keeps_other_attribute_bits() -> None:
    h = {
        "base_offset": 1,
        "partition_leader_epoch": 2,
        "attributes": 0x0058 | int(Compression.SNAPPY),  # delete horizon, txn, LogAppendTime
        "last_offset_delta": 0,
        "base_timestamp": 3,
        "max_timestamp": 4,
        "producer_id": 5,
        "producer_epoch": 6,
        "base_sequence": 7,
        "records_count": 0,
    }
    plain = as_plain_producer(RecordBatchView.from_buffer(kit.assemble(h, b"")))
    out = RecordBatchView.from_buffer(plain)
    assert out.attributes == 0x0048 | int(Compression.SNAPPY)
    assert out.has_delete_horizon
    assert out.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert out.crc_valid()


@pytest.mark.parametrize("producer", ["idempotent", "transactional"])
def test_as_plain_producer_rejects_control_batch(producer: str) -> None:
    batch = kit.build(Compression.NONE, producer, count=1)
    attributes = DefaultRecordBatch(batch).attributes | 0x20
    control = RecordBatchView.from_buffer(kit.set_field(batch, 21, ">h", attributes, fix_crc=True))
    assert control.is_control
    assert control.crc_valid()
    with pytest.raises(RecordBatchError, match=r"^refusing to re-produce a control batch"):
        as_plain_producer(control)
