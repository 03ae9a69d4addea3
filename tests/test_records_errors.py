"""Tests for protocol.records: a batch header that is wrong (truncated, wrong magic, lying
batchLength, unknown codec) raises RecordBatchError saying what and at which byte.
"""

from __future__ import annotations

import re

import pytest
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from records_kit import build, set_field

from kipside.protocol.records import HEADER_SIZE, RecordBatchError, RecordBatchView, iter_batches

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
