"""Destination topics: created on first use with the source's partition count and configs.

Configs are those set on the source topic itself (not broker defaults), minus the ones
MirrorMaker 2 also leaves out because they describe the source cluster's brokers or would
change what the copy means: replication throttles, min.insync.replicas, unclean leader election,
the timestamp type and its allowed skew. An existing destination topic is used as it is, but it
must have at least as many partitions as the source: a batch is copied to the same partition
number, so fewer partitions would have to merge partitions and lose their order.
"""

from __future__ import annotations

from typing import Final

from kipside.pipeline.kafka.admin import (
    NewTopic,
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
        """Make sure dest_topic exists and has `partition`; create it like source_topic."""
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
            existing = self._wait_for(dest_topic)
        if existing < source_count or partition >= existing:
            raise KafkaError(
                f"destination topic {dest_topic} has {existing} partitions but source topic "
                f"{source_topic} has {source_count}: batches keep their partition number, so "
                f"add partitions on the destination (kafka-topics --alter --topic {dest_topic} "
                f"--partitions {source_count})"
            )
        self._partitions[dest_topic] = existing

    def _wait_for(self, topic: str) -> int:
        def attempt() -> int:
            count = partition_counts(self.dest, [topic]).get(topic)
            if count is None:
                raise RetriableError(f"topic {topic} is not in the metadata yet")
            return count

        return self.dest.retrying(f"waiting for the new topic {topic}", attempt)
