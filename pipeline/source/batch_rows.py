"""`rows=batches`: each Kafka record batch becomes one row, its bytes untouched.

Columns: topic, partition, baseOffset, lastOffset, recordCount, batch. The batch column holds
the whole batch as read (header, CRC and compressed records), which is what the shallow mirror
copies. Rows are handed to Spark as pyarrow RecordBatches of a bounded size. Nothing here
decompresses.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final

import numpy as np
import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from kipside.protocol import RecordBatchView

from .ranges import OffsetRange, owns_batch

__all__ = ["BATCH_SCHEMA", "BATCH_STRUCT", "batch_rows"]

BATCH_STRUCT: Final = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("baseOffset", LongType()),
        StructField("lastOffset", LongType()),
        StructField("recordCount", IntegerType()),
        StructField("batch", BinaryType()),
    ]
)
# The same columns in Arrow's types, by Spark's own conversion (the one it checks the data
# source's batches with).
BATCH_SCHEMA: Final = to_arrow_schema(BATCH_STRUCT)
_MAX_ROWS: Final = 4096
_MAX_BYTES: Final = 16 * 1024 * 1024


def batch_rows(r: OffsetRange, batches: Iterable[RecordBatchView]) -> Iterator[pa.RecordBatch]:
    """The batches `r` owns, as Arrow record batches of at most ~16 MiB each."""
    base: list[int] = []
    last: list[int] = []
    count: list[int] = []
    raw: list[memoryview] = []
    size = 0
    for batch in batches:
        end = batch.base_offset + batch.last_offset_delta
        if not owns_batch(r, batch.base_offset, end):
            continue
        base.append(batch.base_offset)
        last.append(end)
        count.append(batch.records_count)
        raw.append(batch.raw)
        size += batch.size
        if len(raw) >= _MAX_ROWS or size >= _MAX_BYTES:
            yield _arrow(r, base, last, count, raw)
            base, last, count, raw, size = [], [], [], [], 0
    if raw:
        yield _arrow(r, base, last, count, raw)


def _arrow(
    r: OffsetRange, base: list[int], last: list[int], count: list[int], raw: list[memoryview]
) -> pa.RecordBatch:
    n = len(raw)
    # One join and one cumulative sum instead of converting batch by batch.
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum([len(b) for b in raw], out=offsets[1:])
    data = pa.py_buffer(b"".join(raw))
    batches = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), data])
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r.topic] * n, pa.string()),
            pa.array([r.partition] * n, pa.int32()),
            pa.array(base, pa.int64()),
            pa.array(last, pa.int64()),
            pa.array(count, pa.int32()),
            batches,
        ],
        schema=BATCH_SCHEMA,
    )
