"""Records of magic-v2 batches decoded in bulk into columns (NumPy arrays) and back, sans-I/O.

Lake ingestion reads millions of records; one Python object per record would cost more than
everything else together (KIP-1008's point). So a batch's records section is decompressed in
one call (Kafka's codecs through cramjam) and walked by a compiled kernel (numba) that writes
where every key, value and header lies, and a second kernel gathers those bytes into contiguous
column buffers, ready to become Arrow arrays without a copy. Python touches each batch, never
each record. Record layout (Kafka's DefaultRecord): length, attributes (int8), timestampDelta,
offsetDelta, keyLength, key, valueLength, value, header count, then per header keyLength, key,
valueLength, value; every length and delta a zigzag varint, -1 meaning null. The way back,
:func:`encode_records`, writes columns as a records section by a third kernel (the columnar
carrier's placeholders, and the ordinary batches a carrier becomes again).

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
    "Binary",
    "Columns",
    "DecompressionLimit",
    "decode_batch_records",
    "decode_columns",
    "decompress",
    "encode_records",
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


class DecompressionLimit(RecordBatchError):
    """A batch's records decompress to more bytes than the caller's cap."""


# cramjam's words when an output buffer is too small (as opposed to corrupt input).
_BUFFER_FULL: Final = "failed to write whole buffer"


def _xerial(data: bytes | memoryview, cap: int | None) -> bytes:
    """Snappy in xerial framing (what Java's producer writes): a header, then
    (int32 length, raw snappy block) chunks."""
    view = memoryview(data)
    out = bytearray()
    pos = _XERIAL_HEADER
    while pos < len(view):
        size = int.from_bytes(view[pos : pos + 4], "big")
        pos += 4
        out += _capped(cramjam.snappy, view[pos : pos + size], _cap_left(cap, len(out)), raw=True)
        pos += size
    return bytes(out)


def _cap_left(cap: int | None, used: int) -> int | None:
    return None if cap is None else cap - used


def _capped(module: object, body: bytes | memoryview, cap: int | None, raw: bool = False) -> bytes:
    """`module`'s decompression of `body`, refusing to produce more than `cap` bytes: into a
    buffer that doubles from a guess up to the cap, so a small batch that claims, or expands to,
    gigabytes costs at most the cap."""
    name = "decompress_raw" if raw else "decompress"
    if cap is None:
        return bytes(getattr(module, name)(body))
    into = getattr(module, name + "_into")
    size = min(cap + 1, max(4096, 8 * len(body)))
    while True:
        out = np.empty(size, dtype=np.uint8)
        try:
            written = int(into(body, out))
        except Exception as exc:
            if _BUFFER_FULL not in str(exc) or size > cap:
                raise
            size = min(cap + 1, size * 4)
            continue
        if written > cap:
            raise DecompressionLimit(f"decompresses to more than {cap:,} bytes")
        return out[:written].tobytes()


def decompress(batch: RecordBatchView, max_bytes: int | None = None) -> bytes | memoryview:
    """The batch's records section, decompressed (the view itself when uncompressed).

    With `max_bytes`, a batch whose records would decompress to more raises DecompressionLimit
    (a RecordBatchError) having allocated at most about that much.
    """
    body = batch.records
    codec = batch.compression
    try:
        if codec == Compression.NONE:
            return body
        if codec == Compression.GZIP:
            return _capped(cramjam.gzip, body, max_bytes)
        if codec == Compression.SNAPPY:
            if bytes(body[: len(_XERIAL_MAGIC)]) == _XERIAL_MAGIC:
                return _xerial(body, max_bytes)
            return _capped(cramjam.snappy, body, max_bytes, raw=True)
        if codec == Compression.LZ4:
            return _capped(cramjam.lz4, body, max_bytes)
        return _capped(cramjam.zstd, body, max_bytes)
    except DecompressionLimit as exc:
        raise DecompressionLimit(
            f"the {codec.name.lower()} batch at offset {batch.base_offset} {exc}"
        ) from None
    except Exception as exc:  # cramjam raises its own DecompressionError types
        if _BUFFER_FULL in str(exc):
            raise DecompressionLimit(
                f"the {codec.name.lower()} batch at offset {batch.base_offset} decompresses to "
                f"more than {max_bytes:,} bytes"
            ) from None
        raise RecordBatchError(
            f"cannot decompress the {codec.name.lower()} batch at offset {batch.base_offset}: {exc}"
        ) from exc


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


def _binary(buf: U8, starts: I64, lengths: I64) -> Binary:
    sizes = np.maximum(lengths, 0)
    offsets = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    out = np.empty(int(offsets[-1]), dtype=np.uint8)
    _gather(buf, starts, lengths, offsets, out)
    return Binary(offsets.astype(np.int32), out, lengths >= 0)


def _scan_batch(batch: RecordBatchView, max_bytes: int | None = None) -> tuple[U8, I64, I64]:
    raw = decompress(batch, max_bytes)
    buf = np.frombuffer(raw, dtype=np.uint8)
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
    return buf, fields, headers[:used]


def decode_columns(
    batches: Sequence[RecordBatchView], max_bytes: int | None = None
) -> tuple[Columns, list[U8]]:
    """Every record of `batches` (data batches, in order) as columns.

    Also returns the decompressed buffers, which callers may drop: the columns own copies.
    `max_bytes` caps each batch's decompressed records (see decompress).
    """
    parts = [_scan_batch(b, max_bytes) for b in batches]
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        none = Binary(
            np.zeros(1, dtype=np.int32), np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.bool_)
        )
        return Columns(
            empty,
            empty,
            np.zeros(0, dtype=np.int32),
            none,
            none,
            np.zeros(0, dtype=np.int32),
            none,
            none,
        ), []
    # One buffer for all batches, so each column is gathered by one kernel call.
    sizes = [p[0].shape[0] for p in parts]
    shifts = np.cumsum([0, *sizes[:-1]])
    buf = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
    fields = np.concatenate([p[1] + _shift_fields(s) for p, s in zip(parts, shifts, strict=True)])
    headers = np.concatenate([p[2] + _shift_headers(s) for p, s in zip(parts, shifts, strict=True)])
    offsets = np.concatenate(
        [b.base_offset + p[1][:, 1] for b, p in zip(batches, parts, strict=True)]
    )
    timestamps, types = _timestamps(batches, parts)
    columns = Columns(
        offset=offsets,
        timestamp=timestamps,
        timestamp_type=types,
        key=_binary(buf, fields[:, 2], fields[:, 3]),
        value=_binary(buf, fields[:, 4], fields[:, 5]),
        header_counts=fields[:, 7].astype(np.int32),
        header_key=_binary(buf, headers[:, 0], headers[:, 1]),
        header_value=_binary(buf, headers[:, 2], headers[:, 3]),
    )
    return columns, [p[0] for p in parts]


def _shift_fields(shift: int) -> I64:
    # Positions (keyStart, valueStart) move with the buffer; everything else stays.
    return np.array([0, 0, shift, 0, shift, 0, 0, 0], dtype=np.int64)


def _shift_headers(shift: int) -> I64:
    return np.array([shift, 0, shift, 0], dtype=np.int64)


def _timestamps(
    batches: Sequence[RecordBatchView], parts: Sequence[tuple[U8, I64, I64]]
) -> tuple[I64, npt.NDArray[np.int32]]:
    stamps = []
    types = []
    for batch, (_, fields, _) in zip(batches, parts, strict=True):
        n = fields.shape[0]
        if batch.timestamp_type == TimestampType.LOG_APPEND_TIME:
            # The broker stamps the batch: every record gets its maxTimestamp.
            stamps.append(np.full(n, batch.max_timestamp, dtype=np.int64))
        else:
            stamps.append(batch.base_timestamp + fields[:, 0])
        types.append(np.full(n, int(batch.timestamp_type), dtype=np.int32))
    return np.concatenate(stamps), np.concatenate(types)


def decode_batch_records(batch: RecordBatchView) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of each record of one batch, for small bookkeeping reads (offset syncs)."""
    columns, _ = decode_columns([batch])
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
