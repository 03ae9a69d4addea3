"""Destination topics: created on first use with the source's partition count and configs, and
given the source's new partitions as it gains them.

Configs are those set on the source topic itself (not broker defaults), minus the ones
MirrorMaker 2 also leaves out because they describe the source cluster's brokers or would
change what the copy means: replication throttles, min.insync.replicas, unclean leader election,
the timestamp type and its allowed skew. A batch is copied to the same partition number, so the
destination needs at least the source's partitions: when it has fewer (the source grew, or an
existing topic was made smaller), partitions are added to it (CreatePartitions), as
MirrorMaker 2 does; a destination that refuses is an error saying which command adds them.
"""

from __future__ import annotations

from typing import Final

from kipside.pipeline.kafka.admin import (
    NewTopic,
    create_partitions,
    create_topics,
    describe_topic_configs,
    partition_counts,
)
from kipside.pipeline.kafka.client import KafkaClient
from kipside.pipeline.kafka.errors import KafkaError, RetriableError, TopicNotFound

__all__ = ["EXCLUDED_CONFIGS", "DestinationTopics"]

EXCLUDED_CONFIGS: Final = frozenset(
    {
        "follower.replication.throttled.replicas",
        "leader.replication.throttled.replicas",
        "message.timestamp.difference.max.ms",
        "message.timestamp.type",
        "unclean.leader.election.enable",
        "min.insync.replicas",
    }
)


class DestinationTopics:
    """Knows which destination topics exist; creates the missing ones."""

    def __init__(self, source: KafkaClient, dest: KafkaClient) -> None:
        self.source = source
        self.dest = dest
        self._partitions: dict[str, int] = {}

    def ensure(self, source_topic: str, dest_topic: str, partition: int) -> None:
        """Make sure dest_topic exists and has `partition`: create it like source_topic, or add
        the partitions source_topic has and it lacks."""
        known = self._partitions.get(dest_topic)
        if known is not None and partition < known:
            return
        existing = partition_counts(self.dest, [dest_topic]).get(dest_topic)
        source_count = partition_counts(self.source, [source_topic]).get(source_topic)
        if source_count is None:
            raise TopicNotFound(f"source topic {source_topic} disappeared from {self.source.where}")
        if existing is None:
            configs = describe_topic_configs(self.source, [source_topic]).get(source_topic, {})
            kept = {k: v for k, v in configs.items() if k not in EXCLUDED_CONFIGS}
            create_topics(self.dest, [NewTopic(dest_topic, source_count, kept)])
            existing = self._wait_for(dest_topic, source_count)
        elif existing < source_count:
            create_partitions(self.dest, {dest_topic: source_count})
            existing = self._wait_for(dest_topic, source_count)
        if existing < source_count or partition >= existing:
            raise KafkaError(
                f"destination topic {dest_topic} has {existing} partitions but source topic "
                f"{source_topic} has {source_count}: batches keep their partition number, so "
                f"add partitions on the destination (kafka-topics --alter --topic {dest_topic} "
                f"--partitions {source_count})"
            )
        self._partitions[dest_topic] = existing

    def _wait_for(self, topic: str, partitions: int) -> int:
        def attempt() -> int:
            count = partition_counts(self.dest, [topic]).get(topic)
            if count is None or count < partitions:
                raise RetriableError(
                    f"{topic} with {partitions} partitions is not in the metadata yet"
                )
            return count

        return self.dest.retrying(f"waiting for {topic}'s partitions", attempt)
