"""Offsets and offset ranges: the `kipside` source's plan, free of Spark and of I/O.

Offsets travel through Spark's checkpoint as JSON `{"topic": {"partition": next_offset}}`
(partition numbers are JSON keys, so strings), the format of Spark's Kafka source. A micro-batch
reads, per partition, the range [start, end). Admission control follows Spark's
KafkaMicroBatchStream: a limit is shared among partitions in proportion to their backlog, a
small partition is never starved to zero, and no partition goes past its latest offset.
minPartitions splits big ranges as Spark's KafkaOffsetRangeCalculator does.

What a range owns: in `rows=records` every record whose offset is in [start, end); in
`rows=batches` every batch whose *last* offset is in [start, end). Batches can't be split, so a
batch cut by a range end belongs to the range holding its last record; every batch belongs to
exactly one of a run of adjacent ranges, whatever the cut points.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "OffsetRange",
    "Offsets",
    "byte_limit",
    "decode_offsets",
    "densities",
    "encode_offsets",
    "owns_batch",
    "plan_ranges",
    "rate_limit",
]

TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, int]


@dataclass(frozen=True, slots=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def owns_batch(r: OffsetRange, base_offset: int, last_offset: int) -> bool:
    """Whether a whole batch belongs to this range (rows=batches)."""
    return r.start <= last_offset < r.end


def encode_offsets(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def decode_offsets(value: Mapping[str, Mapping[str, int]] | str) -> Offsets:
    """The dict (or its JSON text) Spark hands back: what encode_offsets made."""
    data = json.loads(value) if isinstance(value, str) else value
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in data.items()
        for partition, offset in partitions.items()
    }


def rate_limit(start: Offsets, latest: Offsets, limit: int) -> Offsets:
    """End offsets that read at most about `limit` offsets in all, shared by backlog."""
    return byte_limit(start, latest, limit, {})  # every offset costs one


def byte_limit(
    start: Offsets, latest: Offsets, limit: int, bytes_per_offset: Mapping[TopicPartition, float]
) -> Offsets:
    """End offsets that read about `limit` bytes in all; each partition's size per offset is
    an estimate (from the batch at its start; 1.0 if unknown), so the limit is approximate."""
    backlog = {
        tp: max(latest[tp] - start.get(tp, latest[tp]), 0) * bytes_per_offset.get(tp, 1.0)
        for tp in latest
    }
    total = sum(backlog.values())
    if total <= limit:
        return dict(latest)
    out = {}
    for tp, end in latest.items():
        begin = start.get(tp, end)
        share_bytes = limit * backlog[tp] / total
        offsets = share_bytes / max(bytes_per_offset.get(tp, 1.0), 1e-9)
        # Don't starve small partitions: a share below one offset still reads one.
        take = math.ceil(offsets) if offsets < 1 else math.floor(offsets)
        out[tp] = min(end, begin + take)
    return out


def densities(
    samples: Mapping[TopicPartition, Sequence[float | None]], partitions: Iterable[TopicPartition]
) -> dict[TopicPartition, float]:
    """Each partition's bytes per offset: the mean of its samples (sizes of real batches, read
    from their headers at points of its range). A partition with none takes the mean of the
    others, so no partition is ever planned at one byte per offset while others are known."""
    means = {
        tp: sum(known) / len(known)
        for tp, values in samples.items()
        if (known := [v for v in values if v is not None and v > 0])
    }
    overall = sum(means.values()) / len(means) if means else 1.0
    return {tp: means.get(tp, overall) for tp in partitions}


def plan_ranges(
    start: Offsets, end: Offsets, min_partitions: int | None = None
) -> list[OffsetRange]:
    """The non-empty ranges from start to end, split so there are at least min_partitions."""
    ranges = [
        OffsetRange(topic, partition, start[(topic, partition)], stop)
        for (topic, partition), stop in sorted(end.items())
        if (topic, partition) in start and stop > start[(topic, partition)]
    ]
    if min_partitions is None or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    out = []
    for r in ranges:
        # Half up, as Scala's math.round in Spark (Python's round() goes to even).
        parts = max(math.floor(r.size / total * min_partitions + 0.5), 1)
        remaining = r.size
        begin = r.start
        for part in range(parts):
            # Whole-number division: the last piece takes the remainder.
            piece = remaining // (parts - part)
            remaining -= piece
            stop = min(begin + piece, r.end)
            if stop > begin:
                out.append(OffsetRange(r.topic, r.partition, begin, stop))
            begin = stop
    return out
