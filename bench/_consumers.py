"""The consumer a baseline pipeline in a bench worker reads its input with."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition


def from_the_start(bootstrap: str, group_id: str, topics: Iterable[str]) -> Consumer:
    """A read_committed consumer assigned to every partition of `topics` at their start, with
    fetch sizes for bulk reading (no group offsets are used or committed)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.max.bytes": 64 * 1024 * 1024,
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
        }
    )
    meta = consumer.list_topics(timeout=30)
    consumer.assign(
        [TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in meta.topics[t].partitions]
    )
    return consumer
