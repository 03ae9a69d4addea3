"""One task's share of a micro-batch, split into what each Iceberg table gets.

A Spark task hands over Arrow record batches of decoded rows (the parsed value as a struct, where
the record came from, its raw key and value, and the decoder's error, null when it fit). This
module decides, row by row but in Arrow's vector kernels, what the two tables get:

- rows already in the table (offset below the table's next offset for their partition, a
  micro-batch Spark replays) are dropped: each table keeps its own offsets;
- good rows go to the main table, grouped by its partition (topic, date);
- the others go to the quarantine table, grouped by topic, with the precise reason;
- for every Kafka partition seen, the next offset after the last record of the task.

Plain Arrow in, plain Arrow out, no I/O: the Iceberg shell writes the groups as Parquet files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from .ledger import TableOffsets, TopicPartition

__all__ = ["PARSED", "Landing", "split_batch"]

PARSED: Final = "_value"
ERROR: Final = "_error"
_META: Final = ("kafka_partition", "kafka_offset", "kafka_timestamp")


@dataclass
class Landing:
    """What one Arrow batch of a task adds to the two tables; `seen` accumulates over the
    task's batches (the shell writes each batch's groups as they come, so a task holds one
    batch at a time)."""

    data: list[tuple[tuple[str, Any], pa.Table]] = field(default_factory=list)
    quarantine: list[tuple[str, pa.Table]] = field(default_factory=list)
    seen: dict[TopicPartition, int] = field(default_factory=dict)

    def next_batch(self) -> None:
        self.data = []
        self.quarantine = []


def _fresh(batch: pa.RecordBatch, offsets: TableOffsets, present: list[TopicPartition]) -> pa.Array:
    """True for the rows whose offsets the table does not hold yet (`present`: the batch's
    partitions, so the work is per partition read, not per partition the table knows)."""
    keep = pc.greater_equal(batch["kafka_offset"], 0)
    for topic, partition in present:
        floor = offsets.floor(topic, partition)
        if floor <= 0:
            continue
        here = pc.and_(
            pc.equal(batch["topic"], topic), pc.equal(batch["kafka_partition"], partition)
        )
        keep = pc.and_(
            keep, pc.or_(pc.invert(here), pc.greater_equal(batch["kafka_offset"], floor))
        )
    return keep


def _note_seen(batch: pa.RecordBatch, seen: dict[TopicPartition, int]) -> list[TopicPartition]:
    """Add the batch's next offset per partition to `seen`; returns the batch's partitions."""
    if batch.num_rows == 0:
        return []
    grouped = (
        pa.table({"t": batch["topic"], "p": batch["kafka_partition"], "o": batch["kafka_offset"]})
        .group_by(["t", "p"])
        .aggregate([("o", "max")])
    )
    present = []
    for topic, partition, last in zip(
        grouped["t"].to_pylist(),
        grouped["p"].to_pylist(),
        grouped["o_max"].to_pylist(),
        strict=True,
    ):
        tp = (str(topic), int(partition))
        seen[tp] = max(seen.get(tp, 0), int(last) + 1)
        present.append(tp)
    return present


def _groups(table: pa.Table, keys: list[str]) -> Iterable[tuple[tuple[Any, ...], pa.Table]]:
    if table.num_rows == 0:
        return
    distinct = table.select(keys).group_by(keys).aggregate([])
    for row in distinct.to_pylist():
        mask = None
        for key in keys:
            hit = pc.equal(table[key], pa.scalar(row[key], table.schema.field(key).type))
            mask = hit if mask is None else pc.and_(mask, hit)
        yield tuple(row[k] for k in keys), table.filter(mask)


def split_batch(
    batch: pa.RecordBatch,
    landing: Landing,
    data_offsets: TableOffsets,
    quarantine_offsets: TableOffsets,
    data_schema: pa.Schema,
    explain: Callable[[bytes | None, str], str],
) -> None:
    """Split one Arrow batch of decoded rows into `landing` (its groups replaced, its offsets
    seen added to); `data_schema` is the main table's columns as written, `explain(value,
    hint)` the reason a value didn't fit."""
    landing.next_batch()
    present = _note_seen(batch, landing.seen)
    fits = pc.is_null(batch[ERROR])
    good = pa.Table.from_batches([batch]).filter(
        pc.and_(fits, _fresh(batch, data_offsets, present))
    )
    if good.num_rows:
        values = good[PARSED].combine_chunks().flatten()
        names = [f.name for f in good.schema.field(PARSED).type]
        columns = dict(zip(names, values, strict=True))
        for name in (*_META, "topic", "date"):
            columns[name] = good[name]
        # The table's column order: fields a schema change added come after the lake's own.
        rows = pa.table(columns).select(data_schema.names).cast(data_schema)
        for (topic, date), part in _groups(rows, ["topic", "date"]):
            landing.data.append(((topic, date), part))
    bad = pa.Table.from_batches([batch]).filter(
        pc.and_(pc.invert(fits), _fresh(batch, quarantine_offsets, present))
    )
    if bad.num_rows:
        reasons = [
            explain(value, hint)
            for value, hint in zip(bad["value"].to_pylist(), bad[ERROR].to_pylist(), strict=True)
        ]
        rows = pa.table(
            {
                **{name: bad[name] for name in _META},
                "key": bad["key"],
                "value": bad["value"],
                "error": pa.array(reasons, pa.string()),
                "topic": bad["topic"],
            }
        )
        for (topic,), part in _groups(rows, ["topic"]):
            landing.quarantine.append((topic, part))
