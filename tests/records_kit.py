"""The record batches the protocol.records tests read: built by kafka-python (an independent
RecordBatch writer), written out byte by byte (GOLDEN), or assembled from hypothesis-drawn
headers; and the one check of a view against kafka-python's own reading of the same bytes.

Shared by test_records (the view), test_records_errors, test_records_iteration and
test_records_plain_producer. It holds no tests.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import crc32c
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from kipside.protocol.records import Compression, RecordBatchView

CODECS = [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]

# (is_transactional, producer_id, producer_epoch, base_sequence)
PRODUCERS = {
    "plain": (False, -1, -1, -1),
    "idempotent": (False, 4242, 7, 100),
    "transactional": (True, 2**40 + 3, 32000, 2**31 - 10),
}

# Written out field by field so a mistake in the module's struct layout cannot hide here.
GOLDEN = bytes.fromhex(
    "0000000000000005"  # baseOffset 5
    "0000003a"  # batchLength 58
    "00000007"  # partitionLeaderEpoch 7
    "02"  # magic
    "b3a501d7"  # crc
    "0018"  # attributes: transactional, LogAppendTime, uncompressed
    "00000000"  # lastOffsetDelta
    "0000018bcfe56800"  # baseTimestamp 1700000000000
    "0000018bcfe56800"  # maxTimestamp
    "00000000000004d2"  # producerId 1234
    "0003"  # producerEpoch
    "0000002a"  # baseSequence 42
    "00000001"  # records count
    # The one record: length 8, attributes, timestampDelta 0, offsetDelta 0,
    # key "k", value "v", no headers (varints are zigzag encoded).
    "10000000026b027600"
)


def build(
    codec: Compression = Compression.NONE,
    producer: str = "plain",
    count: int = 5,
) -> bytes:
    is_txn, pid, epoch, seq = PRODUCERS[producer]
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=is_txn,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        batch_size=1 << 20,
    )
    # Out-of-order timestamps so baseTimestamp, maxTimestamp and the last one all differ.
    timestamps = [1_700_000_000_500, 1_700_000_000_000, 1_700_000_009_000, 1_700_000_001_000]
    for i in range(count):
        # Repetitive values so every codec actually wins and the builder keeps it.
        builder.append(
            i,
            timestamp=timestamps[i % len(timestamps)],
            key=b"key-%d" % i,
            value=b"value " * 50 + b"%d" % i,
            headers=[("h", b"x" * i)],
        )
    return bytes(builder.build())


def set_field(batch: bytes, offset: int, fmt: str, value: int, *, fix_crc: bool) -> bytes:
    out = bytearray(batch)
    struct.pack_into(fmt, out, offset, value)
    if fix_crc:
        struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def read_back(batch: bytes) -> list[tuple[int, int, bytes | None, bytes | None, Sequence[object]]]:
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in DefaultRecordBatch(batch)]


# Each batch header field: our name for it, and kafka-python's.
FIELDS_AS_KAFKA_PYTHON = [
    ("base_offset", "base_offset"),
    ("partition_leader_epoch", "leader_epoch"),
    ("magic", "magic"),
    ("crc", "crc"),
    ("attributes", "attributes"),
    ("compression", "compression_type"),
    ("timestamp_type", "timestamp_type"),
    ("is_transactional", "is_transactional"),
    ("is_control", "is_control_batch"),
    ("last_offset_delta", "last_offset_delta"),
    ("base_timestamp", "first_timestamp"),
    ("max_timestamp", "max_timestamp"),
    ("producer_id", "producer_id"),
    ("producer_epoch", "producer_epoch"),
    ("base_sequence", "base_sequence"),
    ("records_count", "records_count"),
    ("size", "size_in_bytes"),
]


def assert_matches_kafka_python(view: RecordBatchView, batch: bytes) -> None:
    theirs = DefaultRecordBatch(batch)
    # Keyed by our name, so a failure shows which fields differ.
    assert {ours: getattr(view, ours) for ours, _ in FIELDS_AS_KAFKA_PYTHON} == {
        ours: getattr(theirs, name) for ours, name in FIELDS_AS_KAFKA_PYTHON
    }
    assert view.batch_length == len(batch) - 12
    assert view.magic == 2
    assert view.size == len(batch)
    assert bytes(view.raw) == batch
    assert view.compute_crc() == theirs.crc
    assert view.crc_valid() is True
    assert theirs.validate_crc() is True


int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def headers(draw: st.DrawFn) -> dict[str, int]:
    codec = draw(st.integers(0, 4))
    high_bits = draw(int16) & ~0x07
    return {
        "base_offset": draw(int64),
        "partition_leader_epoch": draw(int32),
        "attributes": high_bits | codec,
        "last_offset_delta": draw(int32),
        "base_timestamp": draw(int64),
        "max_timestamp": draw(int64),
        "producer_id": draw(int64),
        "producer_epoch": draw(int16),
        "base_sequence": draw(int32),
        "records_count": draw(int32),
    }


def assemble(h: dict[str, int], body: bytes, crc: int | None = None) -> bytes:
    def be(value: int, width: int, signed: bool = True) -> bytes:
        return value.to_bytes(width, "big", signed=signed)

    covered = (
        be(h["attributes"], 2)
        + be(h["last_offset_delta"], 4)
        + be(h["base_timestamp"], 8)
        + be(h["max_timestamp"], 8)
        + be(h["producer_id"], 8)
        + be(h["producer_epoch"], 2)
        + be(h["base_sequence"], 4)
        + be(h["records_count"], 4)
        + body
    )
    if crc is None:
        crc = crc32c.crc32c(covered)
    batch_length = 4 + 1 + 4 + len(covered)
    return (
        be(h["base_offset"], 8)
        + be(batch_length, 4)
        + be(h["partition_leader_epoch"], 4)
        + b"\x02"
        + be(crc, 4, signed=False)
        + covered
    )
