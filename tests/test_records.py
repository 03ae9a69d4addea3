"""Tests for protocol.records against kafka-python's independent RecordBatch code."""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence

import crc32c
import pytest
from batches import assert_same_but_producer
from hypothesis import assume, given
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from kipside.protocol.records import (
    HEADER_SIZE,
    Compression,
    RecordBatchError,
    RecordBatchView,
    TimestampType,
    as_plain_producer,
    iter_batches,
)

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


def test_golden_as_plain_producer() -> None:
    assert as_plain_producer(RecordBatchView.from_buffer(GOLDEN)) == GOLDEN_PLAIN


# ---- hypothesis --------------------------------------------------------------------------

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


@given(
    parts=st.lists(st.tuples(headers(), st.binary(max_size=32)), min_size=1, max_size=5),
    cut=st.integers(1, HEADER_SIZE + 31),
)
def test_iter_batches_round_trip_and_tail(
    parts: list[tuple[dict[str, int], bytes]], cut: int
) -> None:
    batches = [assemble(h, body) for h, body in parts]
    blob = b"".join(batches)

    views = list(iter_batches(blob))
    assert [bytes(v.raw) for v in views] == batches
    assert [v.base_offset for v in views] == [h["base_offset"] for h, _ in parts]

    cut = min(cut, len(batches[-1]))
    truncated = blob[:-cut]
    assert [bytes(v.raw) for v in iter_batches(truncated, allow_partial_tail=True)] == batches[:-1]
    if len(batches[-1]) > cut:
        start = len(truncated) - len(batches[-1]) + cut
        with pytest.raises(RecordBatchError, match=rf"at byte ({start}: |{start + 8} runs past)"):
            list(iter_batches(truncated))
    else:
        # Cutting a whole batch leaves a clean blob behind.
        assert len(list(iter_batches(truncated))) == len(batches) - 1


# ---- errors ------------------------------------------------------------------------------


def test_truncated_header() -> None:
    batch = build()
    with pytest.raises(
        RecordBatchError,
        match=r"^truncated record batch header at byte 0: need 61 bytes, only 40 available$",
    ):
        RecordBatchView.from_buffer(batch[:40])
    # Too short even to see the magic byte.
    with pytest.raises(RecordBatchError, match=r"truncated .* at byte 0: .* only 10 available"):
        RecordBatchView.from_buffer(batch[:10])
    with pytest.raises(RecordBatchError, match=r"truncated .* at byte 0: .* only 0 available"):
        RecordBatchView.from_buffer(b"")


def test_truncated_header_at_offset() -> None:
    batch = build()
    with pytest.raises(RecordBatchError, match=r"truncated record batch header at byte 7: "):
        RecordBatchView.from_buffer(b"\0" * 7 + batch[:50], 7)


@pytest.mark.parametrize("magic", [0, 1, 3, 0xFF])
def test_wrong_magic(magic: int) -> None:
    batch = bytearray(build())
    batch[16] = magic
    with pytest.raises(RecordBatchError, match=rf"^unsupported magic {magic} at byte 16: "):
        RecordBatchView.from_buffer(batch)


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_message_set_rejected(magic: int) -> None:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=1 << 20)
    builder.append(0, timestamp=1_700_000_000_000 if magic else None, key=b"k", value=b"v")
    legacy = bytes(builder.build())
    assert len(legacy) < HEADER_SIZE  # magic is still found before the length is judged
    with pytest.raises(RecordBatchError, match=r"magic 0 and 1 are legacy message sets") as err:
        list(iter_batches(legacy))
    assert f"unsupported magic {magic} at byte 16" in str(err.value)


@pytest.mark.parametrize("batch_length", [-1, -(2**31), 0, 48])
def test_batch_length_too_small(batch_length: int) -> None:
    batch = set_field(build(), 8, ">i", batch_length, fix_crc=False)
    with pytest.raises(
        RecordBatchError,
        match=rf"^invalid batchLength {batch_length} at byte 8: "
        r"a magic 2 batch needs at least 49$",
    ):
        RecordBatchView.from_buffer(batch)


@pytest.mark.parametrize("extra", [1, 1000, None])
def test_batch_length_past_end(extra: int | None) -> None:
    batch = build()
    batch_length = 2**31 - 1 if extra is None else len(batch) - 12 + extra
    batch = set_field(batch, 8, ">i", batch_length, fix_crc=False)
    expected = (
        f"batchLength {batch_length} at byte 8 runs past the end of the buffer: "
        f"batch needs {batch_length + 12} bytes, only {len(batch)} available"
    )
    with pytest.raises(RecordBatchError, match=f"^{re.escape(expected)}$"):
        RecordBatchView.from_buffer(batch)


def test_shorter_batch_length_leaves_trailing_bytes() -> None:
    batch = build()
    shorter = set_field(batch, 8, ">i", len(batch) - 12 - 3, fix_crc=False)
    view = RecordBatchView.from_buffer(shorter)
    assert view.size == len(batch) - 3
    assert not view.crc_valid()
    # The 3 leftover bytes are then an impossibly short second batch.
    with pytest.raises(RecordBatchError, match=rf"truncated .* at byte {len(batch) - 3}: "):
        list(iter_batches(shorter))


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codec(codec: int) -> None:
    batch = set_field(build(), 21, ">h", codec, fix_crc=True)
    with pytest.raises(
        RecordBatchError,
        match=rf"^unknown compression codec {codec} in attributes 0x000{codec} at byte 21$",
    ):
        RecordBatchView.from_buffer(batch)


@pytest.mark.parametrize("offset", [-1, 10_000])
def test_offset_outside_buffer(offset: int) -> None:
    with pytest.raises(RecordBatchError, match=rf"offset {offset} is outside the \d+-byte buffer"):
        RecordBatchView.from_buffer(build(), offset)


def test_error_is_value_error() -> None:
    assert issubclass(RecordBatchError, ValueError)


# ---- iter_batches ------------------------------------------------------------------------


def test_iter_batches_mixed_codecs() -> None:
    batches = [build(codec, producer) for codec in CODECS for producer in PRODUCERS]
    blob = b"".join(batches)
    views = list(iter_batches(memoryview(blob)))

    assert len(views) == len(batches)
    for view, batch in zip(views, batches, strict=True):
        assert_matches_kafka_python(view, batch)
        assert view.raw.obj is blob


def test_iter_batches_empty() -> None:
    assert list(iter_batches(b"")) == []
    assert list(iter_batches(b"", allow_partial_tail=True)) == []


@pytest.mark.parametrize("keep", [1, 11, 12, 16, 17, 40, 61, 62, -1])
def test_partial_tail(keep: int) -> None:
    first, second = build(Compression.GZIP), build(Compression.NONE, "idempotent")
    keep = len(second) - 1 if keep == -1 else keep
    blob = first + second[:keep]

    views = list(iter_batches(blob, allow_partial_tail=True))
    assert [bytes(v.raw) for v in views] == [first]

    start = len(first)
    with pytest.raises(RecordBatchError, match=rf"at byte ({start}: |{start + 8} runs past)"):
        list(iter_batches(blob))


def test_partial_tail_message_strict() -> None:
    first, second = build(), build()
    blob = first + second[:100]
    expected = (
        f"batchLength {len(second) - 12} at byte {len(first) + 8} runs past the end of the "
        f"buffer: batch needs {len(second)} bytes, only 100 available"
    )
    with pytest.raises(RecordBatchError, match=f"^{re.escape(expected)}$"):
        list(iter_batches(blob))


def test_partial_tail_still_rejects_garbage() -> None:
    # Allowing a cut-off tail is not licence to accept bytes that are present but wrong.
    first = build()
    bad_magic = bytearray(build()[:30])
    bad_magic[16] = 1
    with pytest.raises(RecordBatchError, match=rf"unsupported magic 1 at byte {len(first) + 16}"):
        list(iter_batches(first + bad_magic, allow_partial_tail=True))

    bad_length = set_field(build(), 8, ">i", -5, fix_crc=False)[:30]
    with pytest.raises(RecordBatchError, match=rf"invalid batchLength -5 at byte {len(first) + 8}"):
        list(iter_batches(first + bad_length, allow_partial_tail=True))


def test_error_in_middle_batch_reports_blob_offset() -> None:
    first, second, third = build(), bytearray(build(Compression.ZSTD)), build()
    second[16] = 0
    blob = first + second + third
    with pytest.raises(RecordBatchError, match=rf"^unsupported magic 0 at byte {len(first) + 16}:"):
        list(iter_batches(blob, allow_partial_tail=True))


# ---- as_plain_producer -------------------------------------------------------------------


@pytest.mark.parametrize("producer", list(PRODUCERS))
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_as_plain_producer(codec: Compression, producer: str) -> None:
    original = build(codec, producer)
    original = set_field(original, 0, ">q", 777, fix_crc=False)
    view = RecordBatchView.from_buffer(original)
    plain = as_plain_producer(view)

    assert isinstance(plain, bytes)
    assert len(plain) == len(original)
    out = RecordBatchView.from_buffer(plain)
    assert_matches_kafka_python(out, plain)
    assert (out.producer_id, out.producer_epoch, out.base_sequence) == (-1, -1, -1)
    assert not out.is_transactional
    assert out.compression is view.compression is codec
    assert out.attributes == view.attributes & ~0x10
    assert_same_but_producer(out, view)
    assert plain[HEADER_SIZE:] == original[HEADER_SIZE:]
    assert out.crc_valid()
    assert read_back(plain) == read_back(original)
    assert read_back(plain)[2][2:4] == (b"key-2", b"value " * 50 + b"2")
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
    plain = as_plain_producer(RecordBatchView.from_buffer(assemble(h, b"")))
    out = RecordBatchView.from_buffer(plain)
    assert out.attributes == 0x0048 | int(Compression.SNAPPY)
    assert out.has_delete_horizon
    assert out.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert out.crc_valid()


@pytest.mark.parametrize("producer", ["idempotent", "transactional"])
def test_as_plain_producer_rejects_control_batch(producer: str) -> None:
    batch = build(Compression.NONE, producer, count=1)
    attributes = DefaultRecordBatch(batch).attributes | 0x20
    control = RecordBatchView.from_buffer(set_field(batch, 21, ">h", attributes, fix_crc=True))
    assert control.is_control
    assert control.crc_valid()
    with pytest.raises(RecordBatchError, match=r"^refusing to re-produce a control batch"):
        as_plain_producer(control)
