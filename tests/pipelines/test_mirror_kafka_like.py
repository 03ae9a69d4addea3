"""The mirror against clusters that behave as Apache Kafka does where Tansu does not: topic
configs reported with their real source, and leaders that move (NOT_LEADER_OR_FOLLOWER), on
both sides. The destination topic must get the source's partition count and its own configs,
not broker defaults nor the ones MirrorMaker 2 also leaves out, and every retriable refusal
must be retried, with nothing lost, duplicated or reordered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from conftest import unique_name

from .conftest import mirror_once, run_in_process
from .fault_relays import KafkaLikeSource, LeaderElectionRelay, broker_behind
from .kafka_data import by_partition, consume_all, produce_dataset, records_of

pytestmark = [pytest.mark.integration, pytest.mark.spark]

CONFIGS = {
    "retention.ms": "3600000",
    "max.message.bytes": "2000000",
    "cleanup.policy": "delete",
    "min.insync.replicas": "1",  # describes the source's brokers: not copied (as MirrorMaker 2)
}


def _topic_configs(bootstrap: str, topic: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.describe_configs([ConfigResource("topic", topic)])
    entries = next(iter(future.values())).result(timeout=10)
    return {name: entry.value for name, entry in entries.items()}


def test_mirror_through_kafka_like_clusters(spark: Any, tmp_path: Path) -> None:
    topic = unique_name("mirror-like")
    with (
        broker_behind(KafkaLikeSource(refusals=2)) as source,
        broker_behind(LeaderElectionRelay(refusals=2)) as dest,
    ):
        admin = AdminClient({"bootstrap.servers": source.bootstrap})
        for future in admin.create_topics([NewTopic(topic, 5, 1, config=CONFIGS)]).values():
            future.result(timeout=10)
        data = produce_dataset(source.bootstrap, topic, 5, per_codec=60)
        job = mirror_once(source.bootstrap, dest.bootstrap, topic, tmp_path / "ck", rename="like.")
        run_in_process(spark, job)
        assert isinstance(source.relay, KafkaLikeSource) and source.relay.refused >= 5
        assert isinstance(dest.relay, LeaderElectionRelay) and dest.relay.refused >= 5
        assert source.relay.problems() == [] and dest.relay.problems() == []
        copied = _topic_configs(dest.bootstrap, "like." + topic)
        got = records_of(consume_all(dest.bootstrap, "like." + topic, 5))
    assert got == by_partition(data.committed)
    wanted = {k: v for k, v in CONFIGS.items() if k != "min.insync.replicas"}
    assert {k: copied.get(k) for k in wanted} == wanted
    assert "min.insync.replicas" not in copied and "compression.type" not in copied, copied
