"""The Kafka offsets an Iceberg table holds, and what a micro-batch may add to it.

An Iceberg table written by the lake carries, in the summary of each snapshot the lake
commits, the next Kafka offset to read for every partition it has ingested (`kipside.kafka-
offsets`, JSON `{"topic": {"0": 1200}}`) and the micro-batch that made the snapshot. The table
is then its own record of progress, committed in the same atomic step as the data:

- a row is written only if its offset is at or past the table's next offset for its partition,
  so a micro-batch that Spark replays after a crash adds nothing it already added;
- the snapshot's offsets are the table's merged with the micro-batch's (never moving back);
- a commit checks that the table's offsets are still those the rows were filtered against:
  if another writer moved them in between, the commit is refused, not repeated on top;
- a restart with a fresh checkpoint starts reading where the table says.

Snapshots made by others (compaction, maintenance) carry no offsets: the newest snapshot that
does is the one that counts. Plain data, no I/O: the Iceberg shell (pipeline.lake.iceberg)
reads the summaries and commits.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = [
    "BATCH_KEY",
    "OFFSETS_KEY",
    "ConcurrentWriter",
    "TableOffsets",
    "TopicPartition",
]

OFFSETS_KEY: Final = "kipside.kafka-offsets"
BATCH_KEY: Final = "kipside.micro-batch"
EARLIEST: Final = -2  # startingOffsets' "earliest" for one partition

TopicPartition = tuple[str, int]


class ConcurrentWriter(RuntimeError):
    """The table's offsets moved while a micro-batch was being written: another job ingests
    into the same table."""


@dataclass(frozen=True)
class TableOffsets:
    """For each partition the table has ingested, the next offset it expects."""

    next: Mapping[TopicPartition, int] = field(default_factory=dict)

    @classmethod
    def from_summaries(cls, summaries: Iterable[Mapping[str, str | None]]) -> TableOffsets:
        """From the snapshots' summaries, newest first: the first one that has offsets."""
        for summary in summaries:
            text = summary.get(OFFSETS_KEY)
            if text:
                return cls.parse(text)
        return cls()

    @classmethod
    def parse(cls, text: str) -> TableOffsets:
        raw = json.loads(text)
        return cls(
            {
                (topic, int(p)): int(offset)
                for topic, parts in raw.items()
                for p, offset in parts.items()
            }
        )

    def to_json(self) -> str:
        by_topic: dict[str, dict[str, int]] = {}
        for (topic, partition), offset in sorted(self.next.items()):
            by_topic.setdefault(topic, {})[str(partition)] = offset
        return json.dumps(by_topic, separators=(",", ":"), sort_keys=True)

    def floor(self, topic: str, partition: int) -> int:
        """The lowest offset of the partition the table does not hold yet."""
        return self.next.get((topic, partition), 0)

    def keeps(self, topic: str, partition: int, offset: int) -> bool:
        return offset >= self.floor(topic, partition)

    def advanced(self, seen: Mapping[TopicPartition, int]) -> TableOffsets:
        """These offsets moved on by a micro-batch's next offsets (`seen`); never back."""
        merged = dict(self.next)
        for tp, offset in seen.items():
            merged[tp] = max(offset, merged.get(tp, 0))
        return TableOffsets(merged)

    def moves(self, seen: Mapping[TopicPartition, int]) -> bool:
        """Whether a micro-batch that read up to `seen` adds anything to the table."""
        return any(offset > self.floor(*tp) for tp, offset in seen.items())

    def summary(self, batch_id: int) -> dict[str, str]:
        """The snapshot summary properties of a commit leaving the table at these offsets."""
        return {OFFSETS_KEY: self.to_json(), BATCH_KEY: str(batch_id)}

    def check_unchanged(self, now: TableOffsets, table: str) -> None:
        """Before a commit: the table is still at the offsets the rows were filtered against."""
        if dict(now.next) != dict(self.next):
            raise ConcurrentWriter(
                f"table {table}: its Kafka offsets changed while a micro-batch was being written "
                f"(from {self.to_json()} to {now.to_json()}): another job is ingesting into it. "
                "Run one `kipside lake` per table"
            )

    def starting_offsets(self, partitions: Iterable[TopicPartition]) -> str:
        """startingOffsets for the source: every partition read, from the table's offset or
        the earliest."""
        by_topic: dict[str, dict[str, int]] = {}
        for topic, partition in sorted(partitions):
            offset = self.next.get((topic, partition), EARLIEST)
            by_topic.setdefault(topic, {})[str(partition)] = offset
        return json.dumps(by_topic, separators=(",", ":"), sort_keys=True)
