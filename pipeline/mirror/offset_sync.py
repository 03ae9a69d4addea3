"""Offset syncs: where each mirrored batch landed, so consumers can fail over.

After the destination acknowledges a batch, the mirror writes one record to a compacted topic on
the destination (default `kipside-mirror-offset-syncs`, one partition):

    key   {"cluster": "<source cluster id>", "topic": "orders", "partition": 3}
    value {"source_offset": 1200, "source_last_offset": 1299,
           "dest_topic": "dr.orders", "dest_partition": 3, "dest_offset": 1180}

Offsets inside a batch keep their distance, so source offset o in [source_offset,
source_last_offset] is destination offset dest_offset + (o - source_offset). Offsets that were
never copied (control batches, aborted transactions) map to where the next copied batch
landed. The topic is compacted per key with min.compaction.lag.ms of 7 days, so a week of exact
history is kept for lagging groups (MirrorMaker 2's offset-syncs topic works the same way).
`translate` turns a group's committed source offsets into destination offsets with that
history; this module is pure, the I/O is in pipeline.mirror.translate.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_TOPIC",
    "TOPIC_CONFIGS",
    "OffsetSync",
    "SyncIndex",
    "Translation",
    "decode_sync",
    "encode_sync",
]

DEFAULT_TOPIC: Final = "kipside-mirror-offset-syncs"
TOPIC_CONFIGS: Final = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": str(7 * 24 * 3600 * 1000),
}


@dataclass(frozen=True, slots=True)
class OffsetSync:
    cluster: str
    topic: str
    partition: int
    source_offset: int
    source_last_offset: int
    dest_topic: str
    dest_partition: int
    dest_offset: int


def encode_sync(sync: OffsetSync) -> tuple[bytes, bytes]:
    """(key, value) of the sync record."""
    key = {"cluster": sync.cluster, "topic": sync.topic, "partition": sync.partition}
    value = {
        "source_offset": sync.source_offset,
        "source_last_offset": sync.source_last_offset,
        "dest_topic": sync.dest_topic,
        "dest_partition": sync.dest_partition,
        "dest_offset": sync.dest_offset,
    }
    return (
        json.dumps(key, separators=(",", ":"), sort_keys=True).encode(),
        json.dumps(value, separators=(",", ":"), sort_keys=True).encode(),
    )


def decode_sync(key: bytes, value: bytes) -> OffsetSync:
    """The sync in a record; ValueError if it isn't one."""
    try:
        k = json.loads(key)
        v = json.loads(value)
        return OffsetSync(
            str(k["cluster"]),
            str(k["topic"]),
            int(k["partition"]),
            int(v["source_offset"]),
            int(v["source_last_offset"]),
            str(v["dest_topic"]),
            int(v["dest_partition"]),
            int(v["dest_offset"]),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not an offset sync record: {exc!r}") from None


@dataclass(frozen=True, slots=True)
class Translation:
    topic: str
    partition: int
    source_offset: int
    dest_topic: str
    dest_partition: int
    dest_offset: int
    exact: bool
    """False when the offset was older than the history kept: the destination offset is the
    earliest known one, so a consumer may see records again (never miss one)."""


class SyncIndex:
    """Every sync of one source cluster, by source partition, ordered by source offset."""

    def __init__(self, cluster: str, syncs: Iterable[OffsetSync] = ()) -> None:
        self.cluster = cluster
        self._by_partition: dict[tuple[str, int], dict[int, OffsetSync]] = {}
        self._syncs: dict[tuple[str, int], list[OffsetSync]] = {}
        self._starts: dict[tuple[str, int], list[int]] = {}
        self.extend(syncs)

    def extend(self, syncs: Iterable[OffsetSync]) -> None:
        """Take in more syncs (read later from the topic, oldest first)."""
        touched = set()
        for s in syncs:
            if s.cluster == self.cluster:
                # A batch copied twice (a retried task) keeps its latest landing.
                tp = (s.topic, s.partition)
                self._by_partition.setdefault(tp, {})[s.source_offset] = s
                touched.add(tp)
        for tp in touched:
            ordered = sorted(self._by_partition[tp].values(), key=lambda s: s.source_offset)
            self._syncs[tp] = ordered
            self._starts[tp] = [s.source_offset for s in ordered]

    def partitions(self) -> list[tuple[str, int]]:
        return sorted(self._syncs)

    def translate(self, topic: str, partition: int, offset: int) -> Translation | None:
        """Where a consumer at source `offset` (the next record to read) resumes on the
        destination; None if nothing of that partition was mirrored."""
        syncs = self._syncs.get((topic, partition))
        if not syncs:
            return None
        i = bisect.bisect_right(self._starts[(topic, partition)], offset) - 1
        if i < 0:
            first = syncs[0]
            return Translation(
                topic,
                partition,
                offset,
                first.dest_topic,
                first.dest_partition,
                first.dest_offset,
                exact=False,
            )
        s = syncs[i]
        if offset <= s.source_last_offset:
            dest = s.dest_offset + (offset - s.source_offset)
        elif i + 1 < len(syncs):
            # In a gap (markers, aborted records): resume where the next copied batch landed.
            dest = syncs[i + 1].dest_offset
        else:
            # Past the last copied batch: the next one will land right after it.
            dest = s.dest_offset + (s.source_last_offset - s.source_offset) + 1
        return Translation(
            topic, partition, offset, s.dest_topic, s.dest_partition, dest, exact=True
        )


def translate_all(
    index: SyncIndex, committed: Mapping[tuple[str, int], int]
) -> tuple[list[Translation], list[tuple[str, int]]]:
    """Translations for a group's committed offsets, and the partitions with no sync."""
    done, missing = [], []
    for (topic, partition), offset in sorted(committed.items()):
        t = index.translate(topic, partition, offset)
        if t is None:
            missing.append((topic, partition))
        else:
            done.append(t)
    return done, missing
