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
from typing import Final

import numpy as np
import pyarrow as pa

from kipside.pipeline.kafka.errors import BatchTooLarge
from kipside.protocol import (
    DEFAULT_MAX_DECOMPRESSED_BYTES,
    Binary,
    Columns,
    DecompressionLimitError,
    RecordBatchView,
    ScannedBatch,
    columns_of,
    decode_producer_columns,
    scan_batch,
)

from .ranges import OffsetRange
from .record_schema import record_arrow_schema

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
) -> Iterator[pa.RecordBatch]:
    """The records `r` owns, as Arrow record batches of up to ~64K records or CHUNK_BYTES."""
    schema = record_arrow_schema(include_headers=include_headers)
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
            yield from _emit(r, pending, schema, include_headers)
            pending, count, size = [], 0, 0
    if pending:
        yield from _emit(r, pending, schema, include_headers)


def _emit(
    r: OffsetRange, scanned: list[ScannedBatch], schema: pa.Schema, include_headers: bool
) -> Iterator[pa.RecordBatch]:
    batches = [s.batch for s in scanned]
    columns = columns_of(scanned)
    scanned.clear()  # the decompressed batches: the columns hold copies
    columns = decode_producer_columns(batches, columns=columns)
    n = len(columns)
    if n == 0:
        return
    arrays = [
        _binary(columns.key, n),
        _binary(columns.value, n),
        pa.repeat(pa.scalar(r.topic, pa.string()), n),
        pa.repeat(pa.scalar(r.partition, pa.int32()), n),
        pa.array(columns.offset, pa.int64()),
        pa.array(columns.timestamp * 1000, pa.timestamp("us", tz="UTC")),
        pa.array(columns.timestamp_type, pa.int32()),
    ]
    if include_headers:
        arrays.append(_headers(columns))
    rows = pa.RecordBatch.from_arrays(arrays, schema=schema)
    inside = (columns.offset >= r.start) & (columns.offset < r.end)
    if not inside.all():
        rows = rows.filter(pa.array(inside))
    if rows.num_rows:
        yield rows


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
