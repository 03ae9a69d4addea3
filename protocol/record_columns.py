"""Records of magic-v2 batches decoded in bulk into columns (NumPy arrays) and back, sans-I/O.

Lake ingestion reads millions of records; one Python object per record would cost more than
everything else together (KIP-1008's point). So a batch's records section is decompressed in
one call (Kafka's codecs through cramjam, into a buffer that never grows past a limit, as
librdkafka's receive.message.max.bytes bounds a decompressed batch) and walked by a compiled
kernel (numba) that writes where every key, value and header lies, and a second kernel gathers
those bytes into contiguous column buffers, ready to become Arrow arrays without a copy. Python
touches each batch, never each record. Record layout (Kafka's DefaultRecord): length,
attributes (int8), timestampDelta, offsetDelta, keyLength, key, valueLength, value, header
count, then per header keyLength, key, valueLength, value; every length and delta a zigzag
varint, -1 meaning null. The way back, :func:`encode_records`, writes columns as a records
section by a third kernel (the columnar carrier's placeholders, and the ordinary batches a
carrier becomes again).

Never does I/O; raises RecordBatchError (with the batch's offset) on anything malformed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import cramjam
import numpy as np
import numpy.typing as npt
from numba import njit

from .records import Compression, RecordBatchError, RecordBatchView, TimestampType

__all__ = [
    "DEFAULT_MAX_DECOMPRESSED_BYTES",
    "Columns",
    "DecompressionLimitError",
    "ScannedBatch",
    "columns_of",
    "decode_batch_records",
    "decode_columns",
    "decompress",
    "encode_records",
    "scan_batch",
]

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER: Final = 16
# Error codes of the scan kernel.
_TRUNCATED: Final = 1
_LENGTH_MISMATCH: Final = 2
_BAD_LENGTH: Final = 3
_NEED_HEADER_SPACE: Final = 4
_MESSAGES: Final = {
    _TRUNCATED: "a record runs past the end of the batch",
    _LENGTH_MISMATCH: "a record's fields do not add up to its length",
    _BAD_LENGTH: "a negative length that is not -1",
}


DEFAULT_MAX_DECOMPRESSED_BYTES: Final = 100_000_000
"""The most one batch's records may decompress to: librdkafka's receive.message.max.bytes
default, which librdkafka applies to a decompressed batch as well as to a response."""
_FIRST_GUESS_RATIO: Final = 4
_MIN_GUESS: Final = 64 * 1024


class DecompressionLimitError(RecordBatchError):
    """A batch's records decompress to more than the limit (a decompression bomb, or data
    bigger than the reader was told to accept)."""

    def __init__(self, message: str, *, base_offset: int, limit: int) -> None:
        super().__init__(message)
        self.base_offset = base_offset
        self.limit = limit


class _TooSmall(Exception):
    """The output buffer was too small for what the input decompresses to."""


_ratios: dict[Compression, float] = {}
"""The last expansion seen per codec: batches of one stream compress alike, so the first
buffer tried is usually big enough."""


def _into(codec: Compression, body: memoryview, out: U8) -> int:
    """Decompress `body` into `out`; the bytes written. _TooSmall if `out` can't hold it."""
    try:
        if codec == Compression.GZIP:
            return int(cramjam.gzip.decompress_into(body, out.data))
        if codec == Compression.SNAPPY:
            if bytes(body[: len(_XERIAL_MAGIC)]) == _XERIAL_MAGIC:
                return _xerial_into(body, out)
            return int(cramjam.snappy.decompress_raw_into(body, out.data))
        if codec == Compression.LZ4:
            return int(cramjam.lz4.decompress_into(body, out.data))
        return int(cramjam.zstd.decompress_into(body, out.data))
    except cramjam.DecompressionError as exc:
        text = str(exc)
        if "whole buffer" in text or "smaller than required" in text:
            raise _TooSmall from None
        raise


def _xerial_into(data: memoryview, out: U8) -> int:
    """Snappy in xerial framing (what Java's producer writes): a header, then
    (int32 length, raw snappy block) chunks."""
    pos = _XERIAL_HEADER
    written = 0
    while pos < len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        pos += 4
        chunk = data[pos : pos + size]
        written += int(cramjam.snappy.decompress_raw_into(chunk, out[written:].data))
        pos += size
    return written


def decompress(batch: RecordBatchView, max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> U8:
    """The batch's records section, decompressed (a view of the batch when uncompressed).

    Never holds more than `max_bytes` of output: a batch that expands past it raises
    DecompressionLimitError before the rest is decompressed. The first buffer tried is sized
    by the codec's last expansion; a bigger one is tried while the output does not fit.
    """
    body = batch.records
    codec = batch.compression
    if codec == Compression.NONE:
        return np.frombuffer(body, dtype=np.uint8)
    ratio = _ratios.get(codec, _FIRST_GUESS_RATIO)
    size = min(max(int(len(body) * ratio * 1.25), _MIN_GUESS), max_bytes)
    while True:
        out = np.empty(size, dtype=np.uint8)
        try:
            written = _into(codec, body, out)
        except _TooSmall:
            if size >= max_bytes:
                raise DecompressionLimitError(
                    f"the {codec.name.lower()} batch at offset {batch.base_offset} decompresses "
                    f"to more than {max_bytes:,} bytes",
                    base_offset=batch.base_offset,
                    limit=max_bytes,
                ) from None
            size = min(size * 4, max_bytes)
            continue
        except Exception as exc:  # cramjam raises its own DecompressionError types
            raise RecordBatchError(
                f"cannot decompress the {codec.name.lower()} batch at offset "
                f"{batch.base_offset}: {exc}"
            ) from exc
        _ratios[codec] = max(written / max(len(body), 1), 1.0)
        return out[:written]


@njit(cache=True, nogil=True)
def _varint(buf: U8, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if pos >= buf.shape[0] or shift > 63:
            return -(1 << 62), pos
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7


@njit(cache=True, nogil=True)
def _scan(buf: U8, count: int, fields: I64, headers: I64) -> tuple[int, int, int]:
    """Walk `count` records. fields[i] = (timestampDelta, offsetDelta, keyStart, keyLength,
    valueStart, valueLength, firstHeader, headerCount); headers[j] = (keyStart, keyLength,
    valueStart, valueLength). Returns (error code, byte position, headers used)."""
    pos = 0
    n_headers = 0
    end_of_buffer = buf.shape[0]
    for i in range(count):
        length, pos = _varint(buf, pos)
        if length < 0 or pos + length > end_of_buffer:
            return 1, pos, n_headers
        end = pos + length
        pos += 1  # attributes
        ts_delta, pos = _varint(buf, pos)
        offset_delta, pos = _varint(buf, pos)
        key_length, pos = _varint(buf, pos)
        if key_length < -1:
            return 3, pos, n_headers
        key_start = pos
        pos += max(key_length, 0)
        value_length, pos = _varint(buf, pos)
        if value_length < -1:
            return 3, pos, n_headers
        value_start = pos
        pos += max(value_length, 0)
        header_count, pos = _varint(buf, pos)
        if header_count < 0 or pos > end:
            return 1, pos, n_headers
        fields[i, 0] = ts_delta
        fields[i, 1] = offset_delta
        fields[i, 2] = key_start
        fields[i, 3] = key_length
        fields[i, 4] = value_start
        fields[i, 5] = value_length
        fields[i, 6] = n_headers
        fields[i, 7] = header_count
        for _ in range(header_count):
            if n_headers >= headers.shape[0]:
                return 4, pos, n_headers
            hk_length, pos = _varint(buf, pos)
            if hk_length < 0:
                return 3, pos, n_headers
            headers[n_headers, 0] = pos
            headers[n_headers, 1] = hk_length
            pos += hk_length
            hv_length, pos = _varint(buf, pos)
            if hv_length < -1:
                return 3, pos, n_headers
            headers[n_headers, 2] = pos
            headers[n_headers, 3] = hv_length
            pos += max(hv_length, 0)
            n_headers += 1
        if pos != end:
            return 2, pos, n_headers
    return 0, pos, n_headers


@njit(cache=True, nogil=True)
def _gather(buf: U8, starts: I64, lengths: I64, offsets: I64, out: U8) -> None:
    """Copy buf[starts[i]:starts[i]+lengths[i]] to out[offsets[i]:], nulls (-1) as empty."""
    for i in range(starts.shape[0]):
        n = lengths[i]
        if n > 0:
            out[offsets[i] : offsets[i] + n] = buf[starts[i] : starts[i] + n]


@dataclass(frozen=True, slots=True)
class Binary:
    """A column of byte strings: Arrow's binary layout (offsets, data, validity)."""

    offsets: npt.NDArray[np.int32]
    data: U8
    valid: npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Columns:
    """The records of one or more batches, column by column."""

    offset: I64
    timestamp: I64
    timestamp_type: npt.NDArray[np.int32]
    key: Binary
    value: Binary
    header_counts: npt.NDArray[np.int32]
    """Headers per record; the header columns list every record's headers in order."""
    header_key: Binary
    header_value: Binary

    def __len__(self) -> int:
        return int(self.offset.shape[0])


@dataclass(frozen=True, slots=True)
class ScannedBatch:
    """One batch's records, decompressed and located: what columns_of gathers from."""

    batch: RecordBatchView
    buffer: U8
    """The decompressed records section."""
    fields: I64
    headers: I64

    @property
    def nbytes(self) -> int:
        """Bytes of decompressed records it holds."""
        return int(self.buffer.shape[0])


def scan_batch(
    batch: RecordBatchView, max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
) -> ScannedBatch:
    """Decompress one batch (at most `max_bytes`, see decompress) and locate its records."""
    buf = decompress(batch, max_bytes)
    count = batch.records_count
    if count < 0 or count > buf.shape[0]:
        raise RecordBatchError(f"batch at offset {batch.base_offset} claims {count} records")
    fields = np.empty((count, 8), dtype=np.int64)
    headers = np.empty((count * 4 + 16, 4), dtype=np.int64)
    code, position, used = _scan(buf, count, fields, headers)
    if code == _NEED_HEADER_SPACE:
        # Many headers per record: every header takes at least two bytes.
        headers = np.empty((buf.shape[0] // 2 + 1, 4), dtype=np.int64)
        code, position, used = _scan(buf, count, fields, headers)
    if code:
        raise RecordBatchError(
            f"batch at offset {batch.base_offset}: {_MESSAGES[code]} (byte {position} of its "
            "decompressed records)"
        )
    return ScannedBatch(batch, buf, fields, headers[:used])


def _binary(parts: Sequence[tuple[U8, I64, I64]]) -> Binary:
    """One binary column gathered from each part's (buffer, starts, lengths) in turn, into one
    output buffer (the parts' buffers are never joined)."""
    lengths = np.concatenate([p[2] for p in parts])
    sizes = np.maximum(lengths, 0)
    offsets = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.uint8)
    first = 0
    for buf, starts, part_lengths in parts:
        n = part_lengths.shape[0]
        _gather(buf, starts, part_lengths, offsets[first : first + n + 1], out)
        first += n
    return Binary(offsets.astype(np.int32), out, lengths >= 0)


def _empty_columns() -> Columns:
    empty = np.zeros(0, dtype=np.int64)
    none = Binary(
        np.zeros(1, dtype=np.int32), np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.bool_)
    )
    no_ints = np.zeros(0, dtype=np.int32)
    return Columns(empty, empty, no_ints, none, none, no_ints, none, none)


def columns_of(scanned: Sequence[ScannedBatch]) -> Columns:
    """Every record of the scanned batches (data batches, in order) as columns; the columns
    own copies of the bytes, so the scanned batches can be dropped afterwards."""
    if not scanned:
        return _empty_columns()
    fields = [s.fields for s in scanned]
    headers = [s.headers for s in scanned]
    offsets = np.concatenate([s.batch.base_offset + s.fields[:, 1] for s in scanned])
    timestamps, types = _timestamps(scanned)
    return Columns(
        offset=offsets,
        timestamp=timestamps,
        timestamp_type=types,
        key=_binary([(s.buffer, f[:, 2], f[:, 3]) for s, f in zip(scanned, fields, strict=True)]),
        value=_binary([(s.buffer, f[:, 4], f[:, 5]) for s, f in zip(scanned, fields, strict=True)]),
        header_counts=np.concatenate([f[:, 7] for f in fields]).astype(np.int32),
        header_key=_binary(
            [(s.buffer, h[:, 0], h[:, 1]) for s, h in zip(scanned, headers, strict=True)]
        ),
        header_value=_binary(
            [(s.buffer, h[:, 2], h[:, 3]) for s, h in zip(scanned, headers, strict=True)]
        ),
    )


def decode_columns(
    batches: Sequence[RecordBatchView], max_batch_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
) -> Columns:
    """Every record of `batches` (data batches, in order) as columns; no batch may decompress
    to more than `max_batch_bytes`."""
    return columns_of([scan_batch(b, max_batch_bytes) for b in batches])


def _timestamps(scanned: Sequence[ScannedBatch]) -> tuple[I64, npt.NDArray[np.int32]]:
    stamps = []
    types = []
    for s in scanned:
        batch, n = s.batch, s.fields.shape[0]
        if batch.timestamp_type == TimestampType.LOG_APPEND_TIME:
            # The broker stamps the batch: every record gets its maxTimestamp.
            stamps.append(np.full(n, batch.max_timestamp, dtype=np.int64))
        else:
            stamps.append(batch.base_timestamp + s.fields[:, 0])
        types.append(np.full(n, int(batch.timestamp_type), dtype=np.int32))
    return np.concatenate(stamps), np.concatenate(types)


def decode_batch_records(batch: RecordBatchView) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of each record of one batch, for small bookkeeping reads (offset syncs)."""
    columns = decode_columns([batch])
    out: list[tuple[bytes | None, bytes | None]] = []
    k, v = columns.key, columns.value
    for i in range(len(columns)):
        key = bytes(k.data[k.offsets[i] : k.offsets[i + 1]]) if k.valid[i] else None
        value = bytes(v.data[v.offsets[i] : v.offsets[i + 1]]) if v.valid[i] else None
        out.append((key, value))
    return out


# ---- the way back: columns to a records section -------------------------------------------


@njit(cache=True, nogil=True)
def _varint_size(value: int) -> int:
    zigzag = (value << 1) ^ (value >> 63)
    size = 1
    while zigzag >= 0x80 or zigzag < 0:
        zigzag = (zigzag >> 7) & 0x01FFFFFFFFFFFFFF
        size += 1
    return size


@njit(cache=True, nogil=True)
def _put_varint(out: U8, pos: int, value: int) -> int:
    zigzag = (value << 1) ^ (value >> 63)
    while zigzag >= 0x80 or zigzag < 0:
        out[pos] = (zigzag & 0x7F) | 0x80
        zigzag = (zigzag >> 7) & 0x01FFFFFFFFFFFFFF
        pos += 1
    out[pos] = zigzag
    return pos + 1


@njit(cache=True, nogil=True)
def _field_size(offsets: I64, valid: npt.NDArray[np.bool_], i: int) -> int:
    if not valid[i]:
        return 1  # -1
    n = int(offsets[i + 1] - offsets[i])
    return _varint_size(n) + n


@njit(cache=True, nogil=True)
def _put_field(
    out: U8, pos: int, offsets: I64, data: U8, valid: npt.NDArray[np.bool_], i: int
) -> int:
    if not valid[i]:
        return _put_varint(out, pos, -1)
    start, end = int(offsets[i]), int(offsets[i + 1])
    pos = _put_varint(out, pos, end - start)
    out[pos : pos + end - start] = data[start:end]
    return pos + end - start


@njit(cache=True, nogil=True)
def _record_sizes(
    ts: I64,
    od: I64,
    k_off: I64,
    k_valid: npt.NDArray[np.bool_],
    v_off: I64,
    v_valid: npt.NDArray[np.bool_],
    h_first: I64,
    hk_off: I64,
    hv_off: I64,
    hv_valid: npt.NDArray[np.bool_],
    sizes: I64,
) -> int:
    """Each record's body size (without its length prefix) into sizes; the section's total."""
    total = 0
    for i in range(ts.shape[0]):
        size = 1 + _varint_size(ts[i]) + _varint_size(od[i])
        size += _field_size(k_off, k_valid, i) + _field_size(v_off, v_valid, i)
        size += _varint_size(h_first[i + 1] - h_first[i])
        for j in range(h_first[i], h_first[i + 1]):
            size += _varint_size(hk_off[j + 1] - hk_off[j]) + hk_off[j + 1] - hk_off[j]
            size += _field_size(hv_off, hv_valid, j)
        sizes[i] = size
        total += _varint_size(size) + size
    return total


@njit(cache=True, nogil=True)
def _write_records(
    ts: I64,
    od: I64,
    k_off: I64,
    k_data: U8,
    k_valid: npt.NDArray[np.bool_],
    v_off: I64,
    v_data: U8,
    v_valid: npt.NDArray[np.bool_],
    h_first: I64,
    hk_off: I64,
    hk_data: U8,
    hv_off: I64,
    hv_data: U8,
    hv_valid: npt.NDArray[np.bool_],
    sizes: I64,
    out: U8,
) -> int:
    pos = 0
    for i in range(ts.shape[0]):
        pos = _put_varint(out, pos, sizes[i])
        out[pos] = 0  # attributes: unused
        pos = _put_varint(out, pos + 1, ts[i])
        pos = _put_varint(out, pos, od[i])
        pos = _put_field(out, pos, k_off, k_data, k_valid, i)
        pos = _put_field(out, pos, v_off, v_data, v_valid, i)
        pos = _put_varint(out, pos, h_first[i + 1] - h_first[i])
        for j in range(h_first[i], h_first[i + 1]):
            start, end = hk_off[j], hk_off[j + 1]
            pos = _put_varint(out, pos, end - start)
            out[pos : pos + end - start] = hk_data[start:end]
            pos += end - start
            pos = _put_field(out, pos, hv_off, hv_data, hv_valid, j)
    return pos


def encode_records(
    timestamp_deltas: I64,
    offset_deltas: I64,
    key: Binary,
    value: Binary,
    header_counts: npt.NDArray[np.int32] | I64,
    header_key: Binary,
    header_value: Binary,
) -> U8:
    """A records section (uncompressed) holding one record per row: Kafka's DefaultRecord
    layout, as decode_columns reads it. Header keys are never null (Kafka's rule)."""
    n = int(timestamp_deltas.shape[0])
    h_first = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(header_counts, out=h_first[1:])
    ts = timestamp_deltas.astype(np.int64, copy=False)
    od = offset_deltas.astype(np.int64, copy=False)
    k_off, v_off = key.offsets.astype(np.int64), value.offsets.astype(np.int64)
    hk_off, hv_off = header_key.offsets.astype(np.int64), header_value.offsets.astype(np.int64)
    sizes = np.empty(n, dtype=np.int64)
    total = _record_sizes(
        ts, od, k_off, key.valid, v_off, value.valid, h_first, hk_off, hv_off,
        header_value.valid, sizes,
    )  # fmt: skip
    out = np.empty(total, dtype=np.uint8)
    _write_records(
        ts, od, k_off, key.data, key.valid, v_off, value.data, value.valid, h_first,
        hk_off, header_key.data, hv_off, header_value.data, header_value.valid, sizes, out,
    )  # fmt: skip
    return out
