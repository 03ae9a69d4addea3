"""Columnar carriers: a client's record batch as one batch holding a Parquet segment, and back.

docs/columnar.md specifies the carrier. In short: a carrier of a client batch of n records is one
magic-v2 batch with the same header fields (base offset, leader epoch, last offset delta, base and
max timestamp, producer id, epoch, base sequence, record count, transactional bit; only the codec
bits become zstd) and n records with the same offset deltas and timestamp deltas. Record 0 carries
a header `kipside.columnar` (value: the version byte) and, as its value, the Parquet segment of
all n records; records 1..n-1 have no key, no value and no headers. So a broker assigns, checks
and stores it as it would the client's batch (record count and offsets, sequence numbers,
per-record timestamps), and rebuilding it (a broker recompressing to the topic's codec) keeps it.

Encoding never raises for what a client sent: a batch it can't or won't turn into a carrier comes
back as :class:`NotEncodable`, for the caller to pass on unchanged. Decoding raises only
:class:`ColumnarError` (a :class:`ProtocolError`) and its :class:`ColumnarKeyError`, and never
allocates more than `max_bytes` for what a carrier claims.

Imports pyarrow, numpy and the record kernels (kipside.protocol loads it on first use).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import cramjam
import crc32c
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from .columnar import (
    COLUMNAR_HEADER,
    COLUMNAR_VERSION,
    DEFAULT_MAX_DECODED_BYTES,
    LAKE_COLUMNS,
    SEGMENT_COLUMNS,
    ColumnarError,
    ColumnarOptions,
    ColumnarRecord,
    Encoded,
    NotEncodable,
    NotEncodableKind,
)
from .columnar_json import JsonPlan, Misfit, json_texts, to_columns
from .columnar_keys import ColumnarKeys
from .columnar_segment import (
    HEADERS_TYPE,
    SegmentMeta,
    SegmentWriter,
    decryption_properties,
    read_segment,
)
from .primitives import Buffer
from .record_columns import Binary, Columns, decode_columns, encode_records
from .records import Compression, RecordBatchError, RecordBatchView, TimestampType

__all__ = [
    "CarrierColumns",
    "ColumnarEncoder",
    "carrier_columns",
    "carrier_positions",
    "columnar_decryption_properties",
    "columnar_version",
    "decode_columnar_batch",
    "decode_columnar_record",
    "decode_producer_columns",
    "encode_columnar_batch",
    "read_columnar_segment",
    "reencode_columnar_batch",
    "reencode_if_carrier",
]

_HEAD: Final = struct.Struct(">qiib")  # baseOffset, batchLength, partitionLeaderEpoch, magic
_COVERED: Final = struct.Struct(">hiqqqhii")  # attributes .. recordsCount
_UINT32: Final = struct.Struct(">I")
_LOG_OVERHEAD: Final = 12
_CODEC_BITS: Final = 0x07
_CARRIER_ZSTD_LEVEL: Final = 3  # librdkafka's and Java's default
_MAX_MS: Final = (2**63 - 1) // 1000  # a millisecond timestamp that fits in microseconds
_MARKER: Final = bytes([COLUMNAR_VERSION])
_COMPRESS: Final = {
    Compression.NONE: None,
    Compression.GZIP: cramjam.gzip.compress,
    Compression.SNAPPY: cramjam.snappy.compress_raw,
    Compression.LZ4: cramjam.lz4.compress,
    Compression.ZSTD: lambda body: cramjam.zstd.compress(body, level=_CARRIER_ZSTD_LEVEL),
}


# ---- Arrow and the record kernels' columns --------------------------------------------------


def _arrow_binary(column: Binary, kind: pa.DataType | None = None) -> pa.Array:
    n = len(column.valid)
    validity = None
    if not column.valid.all():
        validity = pa.py_buffer(np.packbits(column.valid, bitorder="little"))
    offsets = pa.py_buffer(column.offsets.astype(np.int32, copy=False))
    data = pa.py_buffer(column.data)
    return pa.Array.from_buffers(kind or pa.binary(), n, [validity, offsets, data])


def _binary_of(array: pa.Array) -> Binary:
    """An Arrow binary or string array as the kernels' Binary (offsets into its data buffer)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    n = len(array)
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[array.offset : array.offset + n + 1]
    data = (
        np.frombuffer(data_buffer, dtype=np.uint8)
        if data_buffer is not None
        else np.zeros(0, dtype=np.uint8)
    )
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    return Binary(offsets.astype(np.int32), data, valid)


def _first_bad_utf8(column: Binary) -> int | None:
    """The first entry that is not UTF-8 (checked in bulk; only a failure looks one by one)."""
    try:
        _arrow_binary(column, pa.string()).validate(full=True)
        return None
    except pa.ArrowInvalid:
        pass
    for i in range(len(column.valid)):
        try:
            column.data[column.offsets[i] : column.offsets[i + 1]].tobytes().decode("utf-8")
        except UnicodeDecodeError:
            return i
    return None


# ---- the batch around records ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Header:
    base_offset: int
    leader_epoch: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @classmethod
    def of(cls, view: RecordBatchView) -> _Header:
        return cls(
            view.base_offset,
            view.partition_leader_epoch,
            view.attributes,
            view.last_offset_delta,
            view.base_timestamp,
            view.max_timestamp,
            view.producer_id,
            view.producer_epoch,
            view.base_sequence,
            view.records_count,
        )

    def around(self, records: npt.NDArray[np.uint8] | bytes, codec: Compression) -> bytes:
        """A batch of this header around an uncompressed records section, compressed with
        `codec` (the attributes' codec bits set to it), with its length and CRC-32C."""
        compress = _COMPRESS[codec]
        raw = records if isinstance(records, bytes) else records.tobytes()
        body = bytes(compress(raw)) if compress is not None else raw
        attributes = (self.attributes & ~_CODEC_BITS) | int(codec)
        covered = _COVERED.pack(
            attributes,
            self.last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.records_count,
        )
        crc = crc32c.crc32c(body, crc32c.crc32c(covered))
        length = _HEAD.size + 4 + len(covered) + len(body) - _LOG_OVERHEAD
        head = _HEAD.pack(self.base_offset, length, self.leader_epoch, 2)
        return b"".join((head, _UINT32.pack(crc), covered, body))


def _carrier_records(deltas: npt.NDArray[np.int64], segment: bytes) -> npt.NDArray[np.uint8]:
    """Record 0: the marker header and the segment; the others: nothing but their deltas."""
    n = len(deltas)
    none = Binary(np.zeros(n + 1, np.int32), np.zeros(0, np.uint8), np.zeros(n, np.bool_))
    value_offsets = np.full(n + 1, len(segment), dtype=np.int32)
    value_offsets[0] = 0
    value_valid = np.zeros(n, dtype=np.bool_)
    value_valid[0] = True
    value = Binary(value_offsets, np.frombuffer(segment, dtype=np.uint8), value_valid)
    counts = np.zeros(n, dtype=np.int32)
    counts[0] = 1
    marker_key = Binary(
        np.array([0, len(COLUMNAR_HEADER)], np.int32),
        np.frombuffer(COLUMNAR_HEADER.encode(), np.uint8),
        np.ones(1, np.bool_),
    )
    marker_value = Binary(
        np.array([0, 1], np.int32), np.frombuffer(_MARKER, np.uint8), np.ones(1, np.bool_)
    )
    return encode_records(
        deltas,
        np.arange(n, dtype=np.int64),
        none,
        value,
        counts,
        marker_key,
        marker_value,
    )


# ---- encoding -------------------------------------------------------------------------------


class ColumnarEncoder:
    """Turns one columnar topic's client batches into carriers (built once per schema and
    options; `encode` may be called from one thread at a time)."""

    def __init__(self, schema: pa.Schema, options: ColumnarOptions | None = None) -> None:
        """`schema`: the values' fields (ValueSchema.to_arrow(); a field not nullable is
        required). Raises ValueError for a schema or options that can't work."""
        self.options = options or ColumnarOptions()
        taken = {c.lower() for c in (*SEGMENT_COLUMNS, *LAKE_COLUMNS)}
        for name in schema.names:
            if name.lower() in taken:
                raise ValueError(f"field {name!r} clashes with a column the segment or lake adds")
        self.plan = JsonPlan.of(schema)
        allowed = {*schema.names, "kafka_key", "kafka_headers"}
        for name in self.options.encrypt:
            if name not in allowed:
                raise ValueError(
                    f"encrypt names {name!r}, which is not a top-level field of the schema "
                    "(nor kafka_key or kafka_headers)"
                )
        self.writer = SegmentWriter(self.options)

    def encode(
        self, batch: Buffer | RecordBatchView, max_bytes: int = DEFAULT_MAX_DECODED_BYTES
    ) -> Encoded | NotEncodable:
        """The carrier of one client record batch (magic 2, any codec), or why there is none."""
        try:
            view = (
                batch if isinstance(batch, RecordBatchView) else RecordBatchView.from_buffer(batch)
            )
        except RecordBatchError as exc:
            return NotEncodable(NotEncodableKind.MALFORMED, str(exc))
        refused = _refuse(view)
        if refused is not None:
            return refused
        try:
            _check_count(view, max_bytes)
            columns = decode_columns([view], max_bytes)
        except RecordBatchError as exc:
            return NotEncodable(NotEncodableKind.MALFORMED, str(exc))
        n = view.records_count
        if len(columns) != n or not np.array_equal(
            columns.offset - view.base_offset, np.arange(n, dtype=np.int64)
        ):
            return NotEncodable(
                NotEncodableKind.MALFORMED,
                f"the records' offset deltas are not 0 to {n - 1} (Kafka rebuilds such a batch)",
            )
        if _is_carrier(columns):
            return NotEncodable(NotEncodableKind.CARRIER, "the batch already is a columnar carrier")
        if np.abs(columns.timestamp).max() > _MAX_MS:
            row = int(np.argmax(np.abs(columns.timestamp) > _MAX_MS))
            return NotEncodable(NotEncodableKind.MISFIT, "the timestamp is out of range", row)
        bad = _first_bad_utf8(columns.header_key)
        if bad is not None:  # Kafka's header keys are text
            row = int(np.searchsorted(np.cumsum(columns.header_counts), bad, side="right"))
            return NotEncodable(NotEncodableKind.MISFIT, "a header key is not UTF-8", row)
        typed = to_columns(self.plan, columns.value)
        if isinstance(typed, Misfit):
            return NotEncodable(NotEncodableKind.MISFIT, typed.reason, typed.record)
        table = self._segment_table(typed.table, columns, typed.verbatim)
        meta = SegmentMeta(
            len(self.plan.names),
            typed.omit_nulls,
            typed.styles,
            self.writer.encrypted(table.column_names),
            self.options.keys.write_key if self.options.keys and self.options.encrypt else None,
        )
        segment = self.writer.write(table, meta)
        records = _carrier_records(columns.timestamp - view.base_timestamp, segment)
        carrier = _Header.of(view).around(records, Compression.ZSTD)
        verbatim = n if self.options.lossless else int(typed.verbatim.sum())
        return Encoded(carrier, n, view.size, verbatim)

    def _segment_table(
        self, values: pa.Table, columns: Columns, verbatim: npt.NDArray[np.bool_]
    ) -> pa.Table:
        n = len(columns)
        counts = columns.header_counts.astype(np.int32)
        list_offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(counts, out=list_offsets[1:])
        pairs = pa.StructArray.from_arrays(
            [
                _arrow_binary(columns.header_key, pa.string()),
                _arrow_binary(columns.header_value),
            ],
            fields=list(HEADERS_TYPE.value_type),
        )
        # A key column only if some record has a key, a headers column only if some record has a
        # header: in a segment of a few records each column costs more than its data.
        arrays, names = list(values.columns), list(values.column_names)
        if columns.key.valid.any():
            arrays.append(_arrow_binary(columns.key))
            names.append("kafka_key")
        if counts.any():
            arrays.append(
                pa.ListArray.from_arrays(pa.array(list_offsets), pairs, type=HEADERS_TYPE)
            )
            names.append("kafka_headers")
        arrays.append(pa.array(columns.timestamp * 1000, pa.timestamp("us", tz="UTC")))
        arrays.append(pa.array(columns.offset - columns.offset[0], pa.int32()))
        names += ["kafka_timestamp", "kafka_offset_delta"]
        if self.options.lossless or verbatim.any():
            kept = _arrow_binary(columns.value)
            if not self.options.lossless:
                kept = pc.if_else(pa.array(verbatim), kept, pa.nulls(n, pa.binary()))
            arrays.append(kept)
            names.append("kafka_value")
        return pa.Table.from_arrays(arrays, names=names)


# What reading one record costs the kernels at most (its positions, its share of the columns):
# a count beyond max_bytes / this is refused before anything is allocated for it.
_BYTES_PER_RECORD: Final = 96


def _check_count(view: RecordBatchView, max_bytes: int) -> None:
    if view.records_count > max_bytes // _BYTES_PER_RECORD:
        raise RecordBatchError(
            f"the batch at offset {view.base_offset} claims {view.records_count:,} records; "
            f"reading that many would take more than {max_bytes:,} bytes"
        )


def _view(batch: Buffer | RecordBatchView) -> RecordBatchView:
    return batch if isinstance(batch, RecordBatchView) else RecordBatchView.from_buffer(batch)


def _refuse(view: RecordBatchView) -> NotEncodable | None:
    malformed = NotEncodableKind.MALFORMED
    if not view.crc_valid():
        return NotEncodable(malformed, "the batch's CRC does not match its bytes")
    if view.is_control:
        return NotEncodable(malformed, "a control batch (only brokers write those)")
    if view.timestamp_type == TimestampType.LOG_APPEND_TIME:
        return NotEncodable(malformed, "the producer set LogAppendTime (Kafka refuses that)")
    n = view.records_count
    if n < 1 or view.last_offset_delta != n - 1:
        return NotEncodable(
            malformed,
            f"{n} records with lastOffsetDelta {view.last_offset_delta} (Kafka wants count - 1)",
        )
    return None


def _is_carrier(columns: Columns) -> bool:
    if len(columns) == 0 or columns.header_counts[0] == 0:
        return False
    key = columns.header_key
    for j in range(int(columns.header_counts[0])):
        if key.data[key.offsets[j] : key.offsets[j + 1]].tobytes() == COLUMNAR_HEADER.encode():
            return True
    return False


def encode_columnar_batch(
    batch: Buffer | RecordBatchView, schema: pa.Schema, options: ColumnarOptions | None = None
) -> Encoded | NotEncodable:
    """One batch's carrier (ColumnarEncoder(schema, options).encode(batch); keep the encoder
    to encode many)."""
    return ColumnarEncoder(schema, options).encode(batch)


# ---- decoding -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Carrier:
    view: RecordBatchView
    columns: Columns
    segment: bytes


def _open(batch: Buffer | RecordBatchView, max_bytes: int) -> _Carrier:
    carrier = _open_if_carrier(batch, max_bytes)
    if carrier is None:
        raise ColumnarError(
            f"the batch at offset {_view(batch).base_offset} is not a columnar carrier"
        )
    return carrier


def _open_if_carrier(batch: Buffer | RecordBatchView, max_bytes: int) -> _Carrier | None:
    try:
        view = _view(batch)
        if view.is_control:
            return None
        if not view.crc_valid():
            raise ColumnarError(f"the carrier at offset {view.base_offset}: its CRC does not match")
        _check_count(view, max_bytes)
        columns = decode_columns([view], max_bytes)
    except RecordBatchError as exc:
        raise ColumnarError(f"not a readable record batch: {exc}") from None
    where = f"the carrier at offset {view.base_offset}"
    n = view.records_count
    if n < 1 or len(columns) != n:
        raise ColumnarError(f"{where} has {len(columns)} records for a count of {n}")
    version = _version(columns)
    if version is None:
        return None
    if version != COLUMNAR_VERSION:
        raise ColumnarError(
            f"{where} is carrier version {version}; this kipside reads version "
            f"{COLUMNAR_VERSION} (upgrade kipside to read it)"
        )
    if not np.array_equal(columns.offset - view.base_offset, np.arange(n, dtype=np.int64)):
        raise ColumnarError(f"{where}: its records' offset deltas are not 0 to {n - 1}")
    rest = slice(1, n)
    if (
        columns.key.valid.any()
        or columns.value.valid[rest].any()
        or columns.header_counts[rest].any()
        or columns.header_counts[0] != 1
        or not columns.value.valid[0]
    ):
        raise ColumnarError(
            f"{where}: its records are not a segment followed by empty placeholders"
        )
    value = columns.value
    segment = value.data[value.offsets[0] : value.offsets[1]].tobytes()
    return _Carrier(view, columns, segment)


def _version(columns: Columns) -> int | None:
    if len(columns) == 0 or not _is_carrier(columns):
        return None
    values = columns.header_value
    for j in range(int(columns.header_counts[0])):
        key = columns.header_key
        if key.data[key.offsets[j] : key.offsets[j + 1]].tobytes() == COLUMNAR_HEADER.encode():
            raw = values.data[values.offsets[j] : values.offsets[j + 1]].tobytes()
            return raw[0] if len(raw) == 1 and values.valid[j] else -1
    return None


def columnar_version(
    batch: Buffer | RecordBatchView, max_bytes: int = DEFAULT_MAX_DECODED_BYTES
) -> int | None:
    """The carrier version of a batch, or None for an ordinary batch (or a control batch). A
    marker whose value is not one byte gives -1. Raises ColumnarError for an unreadable batch."""
    try:
        view = _view(batch)
        if view.is_control:
            return None
        _check_count(view, max_bytes)
        columns = decode_columns([view], max_bytes)
    except RecordBatchError as exc:
        raise ColumnarError(f"not a readable record batch: {exc}") from None
    return _version(columns)


@dataclass(frozen=True)
class _Decoded:
    """A segment's records as Arrow columns."""

    offsets: npt.NDArray[np.int64]
    timestamps: npt.NDArray[np.int64]
    timestamp_type: TimestampType
    keys: pa.Array
    values: pa.Array
    headers: pa.Array


def _segment_records(
    segment: bytes,
    keys: ColumnarKeys | None,
    max_bytes: int,
    rows: int | None,
    timestamps: npt.NDArray[np.int64] | None,
    timestamp_type: TimestampType,
) -> tuple[pa.Table, SegmentMeta, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The segment's table and metadata, its offset deltas and its records' timestamps (the
    carrier's own when given, checked against the segment's)."""
    table, meta = read_segment(segment, keys, max_bytes, rows)
    n = table.num_rows
    deltas = table.column("kafka_offset_delta").to_numpy().astype(np.int64)
    if not np.array_equal(deltas, np.arange(n, dtype=np.int64)):
        raise ColumnarError("the segment's offset deltas are not 0 to n - 1")
    stored = table.column("kafka_timestamp").cast(pa.int64()).to_numpy() // 1000
    if timestamps is None:
        timestamps = stored.astype(np.int64)
    elif timestamp_type == TimestampType.CREATE_TIME and not np.array_equal(stored, timestamps):
        raise ColumnarError("the segment's timestamps disagree with its carrier's records")
    return table, meta, deltas, timestamps


def _decode_segment(
    segment: bytes,
    keys: ColumnarKeys | None,
    max_bytes: int,
    rows: int | None,
    base_offset: int,
    timestamps: npt.NDArray[np.int64] | None,
    timestamp_type: TimestampType,
) -> _Decoded:
    table, meta, deltas, timestamps = _segment_records(
        segment, keys, max_bytes, rows, timestamps, timestamp_type
    )
    n = table.num_rows
    texts = json_texts(table.select(range(meta.value_columns)), meta.styles, meta.omit_nulls)
    values = texts.cast(pa.binary())
    if "kafka_value" in table.column_names:
        kept = table.column("kafka_value").combine_chunks()
        values = pc.if_else(kept.is_valid(), kept, values)
    size = pc.sum(pc.binary_length(values)).as_py() or 0
    if size > max_bytes:
        raise ColumnarError(f"the segment's values come to {size:,} bytes, over {max_bytes:,}")
    return _Decoded(
        base_offset + deltas,
        timestamps,
        timestamp_type,
        _column_or(table, "kafka_key", pa.nulls(n, pa.binary())),
        values,
        _column_or(table, "kafka_headers", _no_headers(n)),
    )


def _column_or(table: pa.Table, name: str, missing: pa.Array) -> pa.Array:
    if name not in table.column_names:
        return missing
    return table.column(name).combine_chunks()


def _no_headers(n: int) -> pa.Array:
    pairs = pa.StructArray.from_arrays(
        [pa.array([], pa.string()), pa.array([], pa.binary())],
        fields=list(HEADERS_TYPE.value_type),
    )
    return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pairs, type=HEADERS_TYPE)


def _records(decoded: _Decoded) -> list[ColumnarRecord]:
    keys = decoded.keys.to_pylist()
    values = decoded.values.to_pylist()
    headers = decoded.headers.to_pylist()
    return [
        ColumnarRecord(
            int(offset),
            int(timestamp),
            decoded.timestamp_type,
            key,
            value,
            tuple((h["key"], h["value"]) for h in record_headers),
        )
        for offset, timestamp, key, value, record_headers in zip(
            decoded.offsets.tolist(),
            decoded.timestamps.tolist(),
            keys,
            values,
            headers,
            strict=True,
        )
    ]


def _carrier_timestamps(carrier: _Carrier) -> npt.NDArray[np.int64]:
    view = carrier.view
    if view.timestamp_type == TimestampType.LOG_APPEND_TIME:
        # The broker stamped the batch: every record has its maxTimestamp, as for any batch.
        return np.full(view.records_count, view.max_timestamp, dtype=np.int64)
    return carrier.columns.timestamp


def _of_carrier(carrier: _Carrier, keys: ColumnarKeys | None, max_bytes: int) -> _Decoded:
    view = carrier.view
    return _decode_segment(
        carrier.segment,
        keys,
        max_bytes,
        view.records_count,
        view.base_offset,
        _carrier_timestamps(carrier),
        view.timestamp_type,
    )


def decode_columnar_batch(
    batch: Buffer | RecordBatchView,
    keys: ColumnarKeys | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_DECODED_BYTES,
) -> list[ColumnarRecord]:
    """The records a producer sent, from a carrier batch as a broker returns it (a Fetch
    response's records, or a log segment's bytes): offsets, timestamps, keys and headers exact,
    values equal as JSON (byte for byte when written lossless). Encrypted fields need `keys`.

    Raises ColumnarError (ColumnarKeyError for a missing or wrong key).
    """
    carrier = _open(batch, max_bytes)
    return _records(_of_carrier(carrier, keys, max_bytes))


def decode_columnar_record(
    value: bytes,
    headers: list[tuple[str, bytes | None]] | tuple[tuple[str, bytes | None], ...],
    *,
    offset: int,
    timestamp: int,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    keys: ColumnarKeys | None = None,
    max_bytes: int = DEFAULT_MAX_DECODED_BYTES,
) -> list[ColumnarRecord]:
    """The records of a carrier, from its first record as an ordinary Kafka client delivers it
    (its value, headers, offset, timestamp and timestamp type): for consumers that read a
    columnar topic without kipside. The other records of the carrier (no key, no value, no
    headers, at the next offsets) are placeholders to skip. Raises ColumnarError."""
    marker = [v for k, v in headers if k == COLUMNAR_HEADER]
    if not marker:
        raise ColumnarError(f"the record at offset {offset} is not a carrier's first record")
    if marker[0] != _MARKER:
        raise ColumnarError(
            f"the record at offset {offset} is a carrier of version "
            f"{marker[0][0] if marker[0] and len(marker[0]) == 1 else marker[0]!r}; this kipside "
            f"reads version {COLUMNAR_VERSION}"
        )
    log_append = timestamp_type == TimestampType.LOG_APPEND_TIME
    decoded = _decode_segment(value, keys, max_bytes, None, offset, None, timestamp_type)
    if log_append:
        decoded = _Decoded(
            decoded.offsets,
            np.full(len(decoded.offsets), timestamp, dtype=np.int64),
            timestamp_type,
            decoded.keys,
            decoded.values,
            decoded.headers,
        )
    return _records(decoded)


def reencode_columnar_batch(
    batch: Buffer | RecordBatchView,
    keys: ColumnarKeys | None = None,
    *,
    compression: Compression = Compression.NONE,
    max_bytes: int = DEFAULT_MAX_DECODED_BYTES,
) -> bytes:
    """A carrier as the ordinary batch its producer sent: the same header (offsets, leader epoch,
    timestamps, producer id, epoch, sequence, transactional bit), the records back, compressed
    with `compression`, a new CRC. What kipside hands a consumer. Raises ColumnarError."""
    return _reencoded(_open(batch, max_bytes), keys, compression, max_bytes)


def reencode_if_carrier(
    batch: Buffer | RecordBatchView,
    keys: ColumnarKeys | None = None,
    *,
    compression: Compression = Compression.NONE,
    max_bytes: int = DEFAULT_MAX_DECODED_BYTES,
) -> bytes | None:
    """reencode_columnar_batch for a batch that may be ordinary: None for an ordinary batch (or
    a control batch), which a columnar topic holds too (batches left alone). Raises
    ColumnarError for a carrier it can't decode, or a batch it can't read."""
    carrier = _open_if_carrier(batch, max_bytes)
    return None if carrier is None else _reencoded(carrier, keys, compression, max_bytes)


def _reencoded(
    carrier: _Carrier, keys: ColumnarKeys | None, compression: Compression, max_bytes: int
) -> bytes:
    decoded = _of_carrier(carrier, keys, max_bytes)
    view = carrier.view
    headers = decoded.headers
    header_counts = pc.list_value_length(headers).to_numpy(zero_copy_only=False).astype(np.int32)
    pairs = headers.flatten()
    records = encode_records(
        carrier.columns.timestamp - view.base_timestamp,
        decoded.offsets - view.base_offset,
        _binary_of(decoded.keys),
        _binary_of(decoded.values),
        header_counts,
        _binary_of(pairs.field("key")),
        _binary_of(pairs.field("value")),
    )
    return _Header.of(view).around(records, compression)


def decode_producer_columns(
    batches: Sequence[RecordBatchView],
    keys: ColumnarKeys | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_DECODED_BYTES,
    columns: Columns | None = None,
) -> Columns:
    """decode_columns for a topic that may hold carriers: the records as their producers sent
    them, each carrier's in place of its segment and placeholders, ordinary batches as they
    are. `columns` are the batches' columns when the caller has decoded them already. Decodes
    once when there is no carrier among `batches` (the marker is looked up in the columns); a
    chunk with carriers is decoded again with them re-encoded. Raises ColumnarError
    (ColumnarKeyError for encrypted columns without their key)."""
    if columns is None:
        columns = decode_columns(batches, max_bytes)
    carriers = carrier_positions(batches, columns)
    if not carriers:
        return columns
    ordinary = [
        RecordBatchView.from_buffer(reencode_columnar_batch(b, keys, max_bytes=max_bytes))
        if i in carriers
        else b
        for i, b in enumerate(batches)
    ]
    return decode_columns(ordinary, max_bytes)


def carrier_positions(batches: Sequence[RecordBatchView], columns: Columns) -> set[int]:
    """The positions among `batches` (whose records are `columns`, as decode_columns gives
    them) of the carriers: the batches whose first record carries the marker header."""
    header_starts = np.zeros(len(columns) + 1, dtype=np.int64)
    np.cumsum(columns.header_counts, out=header_starts[1:])
    marker = np.frombuffer(COLUMNAR_HEADER.encode(), np.uint8)
    key = columns.header_key
    found, first = set(), 0
    for i, batch in enumerate(batches):
        if first < len(columns) and columns.header_counts[first] > 0 and not batch.is_control:
            for h in range(int(header_starts[first]), int(header_starts[first + 1])):
                name = key.data[key.offsets[h] : key.offsets[h + 1]]
                if len(name) == len(marker) and np.array_equal(name, marker):
                    found.add(i)
                    break
        first += batch.records_count
    return found


@dataclass(frozen=True)
class CarrierColumns:
    """A carrier's records with their values as the segment's typed columns: no record is
    rebuilt and no value rendered as JSON. `values` holds the value's fields as written (the
    rule's schema); `kept` the values kept whole besides (the segment's kafka_value: null for
    a value its fields render back to, all of them on a lossless topic), or None."""

    base_offset: int
    offsets: npt.NDArray[np.int64]
    timestamps: npt.NDArray[np.int64]
    timestamp_type: TimestampType
    keys: pa.Array
    headers: pa.Array
    values: pa.Table
    kept: pa.Array | None


def carrier_columns(
    batch: Buffer | RecordBatchView,
    keys: ColumnarKeys | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_DECODED_BYTES,
) -> CarrierColumns | None:
    """The records of a carrier as columns, the values' fields as the segment holds them; None
    for an ordinary batch (or a control batch). Offsets, timestamps (the carrier's: a
    LogAppendTime batch's maxTimestamp), keys and headers are exact. Encrypted fields need
    `keys`. Raises ColumnarError (ColumnarKeyError for a missing or wrong key)."""
    carrier = _open_if_carrier(batch, max_bytes)
    if carrier is None:
        return None
    view = carrier.view
    table, meta, deltas, timestamps = _segment_records(
        carrier.segment,
        keys,
        max_bytes,
        view.records_count,
        _carrier_timestamps(carrier),
        view.timestamp_type,
    )
    n = table.num_rows
    return CarrierColumns(
        view.base_offset,
        view.base_offset + deltas,
        timestamps,
        view.timestamp_type,
        _column_or(table, "kafka_key", pa.nulls(n, pa.binary())),
        _column_or(table, "kafka_headers", _no_headers(n)),
        table.select(range(meta.value_columns)),
        table.column("kafka_value").combine_chunks()
        if "kafka_value" in table.column_names
        else None,
    )


def read_columnar_segment(
    segment: bytes, keys: ColumnarKeys | None = None, *, max_bytes: int = DEFAULT_MAX_DECODED_BYTES
) -> pa.Table:
    """A segment (a carrier's first value, or a landed file's bytes) as its table: the value's
    fields, then kafka_key (if a record has a key), kafka_headers (if one has a header),
    kafka_timestamp, kafka_offset_delta and kafka_value (if a value is kept whole). Without the
    key its encrypted columns are left out. Raises ColumnarError."""
    table, _ = read_segment(segment, keys, max_bytes, readable_only=True)
    return table


def columnar_decryption_properties(keys: ColumnarKeys) -> object:
    """pyarrow's FileDecryptionProperties for segments encrypted with `keys`, for reading them
    (or the lake's copies) with pyarrow: pq.read_table(f, decryption_properties=...)."""
    return decryption_properties(keys)
