"""Tests for protocol.records.iter_batches: a blob of batches read as views in place, a cut-off
tail allowed only when asked for, and errors placed at their byte in the blob.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from records_kit import (
    CODECS,
    PRODUCERS,
    assemble,
    assert_matches_kafka_python,
    build,
    headers,
    set_field,
)

from kipside.protocol.records import HEADER_SIZE, Compression, RecordBatchError, iter_batches

# ---- iter_batches ------------------------------------------------------------------------


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
