"""`rows=records`: one row per Kafka record, with the columns of Spark's Kafka source.

key, value, topic, partition, offset, timestamp, timestampType, and headers (with
includeHeaders), in Spark's order and types. Records are decoded batch by batch into columns
(protocol.record_columns: one compiled pass over each batch, no Python object per record) and
handed to Spark as pyarrow RecordBatches built straight from those column buffers. A columnar
topic's carriers give the records their producers sent (protocol.decode_producer_columns). A
range owns the records whose offsets lie in [start, end); the batches at its edges are trimmed.

Memory is bounded by decompressed bytes, not by what the broker sent: no batch may decompress
to more than receive.message.max.bytes (librdkafka's name and default, 100 MB), and an Arrow
chunk is cut once the batches in it hold CHUNK_BYTES of decompressed records, so very
compressible data costs no more than any other. A chunk is held about twice while its columns
are built (the decompressed batches, then the columns).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from kipside.pipeline.kafka.errors import BatchTooLarge
from kipside.protocol import (
    DEFAULT_MAX_DECOMPRESSED_BYTES,
    Binary,
    CarrierColumns,
    ColumnarKeyError,
    ColumnarKeys,
    Columns,
    DecompressionLimitError,
    RecordBatchView,
    ScannedBatch,
    carrier_columns,
    carrier_positions,
    columns_of,
    decode_producer_columns,
    scan_batch,
)

from .ranges import OffsetRange
from .record_schema import record_arrow_schema, value_columns_field

__all__ = ["CHUNK_BYTES", "record_rows"]

_CHUNK_RECORDS: Final = 65_536
CHUNK_BYTES: Final = 16 * 1024 * 1024
"""Decompressed records an Arrow chunk is cut at (a single bigger batch is a chunk alone)."""


# The headers column's type: a list of (key, value) structs.
_HEADERS: Final = record_arrow_schema(include_headers=True).field("headers").type


def record_rows(
    r: OffsetRange,
    batches: Iterable[RecordBatchView],
    *,
    include_headers: bool,
    max_batch_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
    source: str = "the cluster",
    value_type: pa.StructType | None = None,
    keys: ColumnarKeys | None = None,
) -> Iterator[pa.RecordBatch]:
    """The records `r` owns, as Arrow record batches of up to ~64K records or CHUNK_BYTES.
    With `value_type` (the Arrow type of option valueSchema) a last column holds carriers'
    values as typed columns; `keys` read encrypted columns of carriers."""
    schema = record_arrow_schema(include_headers=include_headers)
    if value_type is not None:
        schema = schema.append(value_columns_field(value_type))
    emit = _Emit(r, schema, include_headers, value_type, keys, max_batch_bytes, source)
    pending: list[ScannedBatch] = []
    count = size = 0
    for batch in batches:
        try:
            scanned = scan_batch(batch, max_batch_bytes)
        except DecompressionLimitError as exc:
            raise BatchTooLarge(
                f"{r.topic}-{r.partition}: {exc} (read from {source}; the limit is "
                "receive.message.max.bytes, option kafka.receive.message.max.bytes); nothing "
                f"was read past offset {exc.base_offset - 1}. If the data is genuine, raise "
                "that limit; otherwise the batch is a decompression bomb"
            ) from None
        pending.append(scanned)
        count += batch.records_count
        size += scanned.nbytes
        if count >= _CHUNK_RECORDS or size >= CHUNK_BYTES:
            yield from emit(pending)
            pending, count, size = [], 0, 0
    if pending:
        yield from emit(pending)


@dataclass(frozen=True)
class _Emit:
    """Turns a chunk of scanned batches into the range's rows."""

    r: OffsetRange
    schema: pa.Schema
    include_headers: bool
    value_type: pa.StructType | None
    keys: ColumnarKeys | None
    max_bytes: int
    source: str

    def __call__(self, scanned: list[ScannedBatch]) -> Iterator[pa.RecordBatch]:
        r = self.r
        batches = [s.batch for s in scanned]
        counts = np.array([len(s.fields) for s in scanned], dtype=np.int64)
        columns = columns_of(scanned)
        scanned.clear()  # the decompressed batches: the columns hold copies
        if len(columns) == 0:
            return
        if self.value_type is None:
            try:
                columns = decode_producer_columns(batches, self.keys, columns=columns)
            except ColumnarKeyError:
                self._find_key_error(batches, columns)
                raise
            rows = self._ordinary(columns)
        else:
            rows = self._typed(batches, counts, columns, self.value_type)
        offsets = rows.column(self.schema.get_field_index("offset")).to_numpy()
        inside = (offsets >= r.start) & (offsets < r.end)
        if not inside.all():
            rows = rows.filter(pa.array(inside))
        if rows.num_rows:
            yield rows

    def _ordinary(self, columns: Columns) -> pa.RecordBatch:
        """Rows of records as they are: value bytes (and a null struct with a value type)."""
        n = len(columns)
        arrays = [
            _binary(columns.key, n),
            _binary(columns.value, n),
            pa.repeat(pa.scalar(self.r.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.r.partition, pa.int32()), n),
            pa.array(columns.offset, pa.int64()),
            pa.array(columns.timestamp * 1000, pa.timestamp("us", tz="UTC")),
            pa.array(columns.timestamp_type, pa.int32()),
        ]
        if self.include_headers:
            arrays.append(_headers(columns))
        if self.value_type is not None:
            arrays.append(pa.nulls(n, self.value_type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _typed(
        self,
        batches: list[RecordBatchView],
        counts: npt.NDArray[np.int64],
        columns: Columns,
        value_type: pa.StructType,
    ) -> pa.RecordBatch:
        """Ordinary batches' rows as they are, each carrier's from its segment's columns."""
        plain = self._ordinary(columns)
        positions = carrier_positions(batches, columns)
        if not positions:
            return plain
        starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        pieces: list[pa.RecordBatch] = []
        done = 0
        for i in sorted(positions):
            batch = batches[i]
            first, last = batch.base_offset, batch.base_offset + batch.records_count
            if last <= self.r.start or first >= self.r.end:
                continue  # trimmed away: its placeholders go with the rest
            lo, hi = int(starts[i]), int(starts[i + 1])
            pieces.append(plain.slice(done, lo - done))
            pieces.append(self._carrier(batch, value_type))
            done = hi
        if not pieces:
            return plain
        pieces.append(plain.slice(done))
        return pa.Table.from_batches(pieces, self.schema).combine_chunks().to_batches()[0]

    def _carrier(self, batch: RecordBatchView, value_type: pa.StructType) -> pa.RecordBatch:
        try:
            carrier = carrier_columns(batch, self.keys, max_bytes=self.max_bytes)
        except ColumnarKeyError as exc:
            raise self._key_error(batch.base_offset, exc) from None
        assert carrier is not None
        values = _typed_values(carrier, value_type)
        if values is None:  # the segment's fields don't cast to the asked ones: JSON it is
            columns = decode_producer_columns([batch], self.keys, max_bytes=self.max_bytes)
            return self._ordinary(columns)
        n = len(carrier.offsets)
        arrays = [
            carrier.keys,
            pa.nulls(n, pa.binary()),
            pa.repeat(pa.scalar(self.r.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.r.partition, pa.int32()), n),
            pa.array(carrier.offsets, pa.int64()),
            pa.array(carrier.timestamps * 1000, pa.timestamp("us", tz="UTC")),
            pa.repeat(pa.scalar(int(carrier.timestamp_type), pa.int32()), n),
        ]
        if self.include_headers:
            arrays.append(carrier.headers.cast(_HEADERS))
        arrays.append(values)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _find_key_error(self, batches: list[RecordBatchView], columns: Columns) -> None:
        """Raise the key error of the first carrier that has one, with where it is."""
        for i in sorted(carrier_positions(batches, columns)):
            try:
                carrier_columns(batches[i], self.keys, max_bytes=self.max_bytes)
            except ColumnarKeyError as exc:
                raise self._key_error(batches[i].base_offset, exc) from None

    def _key_error(self, offset: int, exc: ColumnarKeyError) -> ColumnarKeyError:
        return ColumnarKeyError(
            f"{self.r.topic}-{self.r.partition}, the columnar carrier at offset {offset} (read "
            f"from {self.source}): {exc}: the source's option columnarKeyFile (kipside lake: "
            "--columnar-key-file FILE)",
            columns=exc.columns,
            key_id=exc.key_id,
        )


def _typed_values(carrier: CarrierColumns, value_type: pa.StructType) -> pa.StructArray | None:
    """The carrier's values as `value_type`: its fields by name, cast where the types differ,
    null where the segment lacks one. None when a field doesn't cast, or is missing while some
    value was kept whole (its JSON may hold it): those records are read as JSON."""
    table = carrier.values
    n = table.num_rows
    kept = carrier.kept is not None and carrier.kept.null_count < len(carrier.kept)
    children: list[pa.Array] = []
    for f in value_type:
        if f.name not in table.column_names:
            if kept:
                return None
            children.append(pa.nulls(n, f.type))
            continue
        column = table.column(f.name).combine_chunks()
        if not column.type.equals(f.type):
            try:
                column = column.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                return None
        children.append(column)
    return pa.StructArray.from_arrays(children, fields=list(value_type))


def _binary(column: Binary, n: int, kind: pa.DataType | None = None) -> pa.Array:
    """An Arrow binary (or string) array over the column's own buffers, nulls included."""
    validity = None
    if not column.valid.all():
        validity = pa.py_buffer(np.packbits(column.valid, bitorder="little"))
    return pa.Array.from_buffers(
        kind or pa.binary(),
        n,
        [validity, pa.py_buffer(column.offsets), pa.py_buffer(column.data)],
    )


def _headers(columns: Columns) -> pa.Array:
    total = int(columns.header_counts.sum())
    keys = _binary(columns.header_key, total, pa.string())
    values = _binary(columns.header_value, total)
    items = pa.StructArray.from_arrays([keys, values], fields=list(_HEADERS.value_type))
    offsets = np.zeros(len(columns) + 1, dtype=np.int32)
    np.cumsum(columns.header_counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), items, type=_HEADERS)
