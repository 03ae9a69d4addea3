"""A source topic that gains partitions while the mirror runs: the destination topic gains them
too and their records are copied, without a restart (as MirrorMaker 2 does).

Tansu can't add partitions to a topic, so both clusters are behind PartitionGrowthRelay, a
SIMULATION of Apache Kafka's CreatePartitions (tests/pipelines/fault_relays.py): the test
grows the source with confluent-kafka's AdminClient, the mirror grows the destination.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from conftest import unique_name
from testkit.produce import send_all

from kipside.pipeline.mirror.job import MirrorJob, start_query

from .fault_relays import PartitionGrowthRelay, broker_behind
from .kafka_data import consume_all

pytestmark = [pytest.mark.integration, pytest.mark.spark]

DEADLINE = 120.0


def _produce(bootstrap: str, topic: str, partitions: int, start: int, count: int) -> None:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    errors: list[str] = []
    records = [{"value": f"r{n}", "partition": n % partitions} for n in range(start, start + count)]
    send_all(producer, topic, records, errors)
    assert producer.flush(30) == 0 and not errors, errors[:3]


def _expected(partitions: int, start: int, count: int) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    for n in range(start, start + count):
        out.setdefault(n % partitions, []).append(f"r{n}".encode())
    return out


def _wait_for(bootstrap: str, topic: str, want: dict[int, list[bytes]], query: Any) -> None:
    deadline = time.monotonic() + DEADLINE
    got: dict[int, list[bytes]] = {}
    while time.monotonic() < deadline:
        assert query.isActive, f"the mirror stopped: {query.exception()}"
        try:
            consumed = consume_all(bootstrap, topic, max(want) + 1, timeout=5)
        except AssertionError:  # not there yet: the topic or its new partitions
            continue
        got = {p: [r.value or b"" for _, r in rs] for p, rs in consumed.items() if rs}
        if got == want:
            return
        time.sleep(0.5)
    raise AssertionError(f"the destination holds {got}, not {want}")


def test_new_source_partitions_are_created_and_copied_without_a_restart(
    spark: Any, tmp_path: Path
) -> None:
    topic = unique_name("grow")
    with (
        broker_behind(PartitionGrowthRelay()) as source,
        broker_behind(PartitionGrowthRelay()) as dest,
    ):
        admin = AdminClient({"bootstrap.servers": source.bootstrap})
        admin.create_topics([NewTopic(topic, 2)])[topic].result(10)
        _produce(source.bootstrap, topic, 2, 0, 100)
        job = MirrorJob(
            source=source.bootstrap,
            dest=dest.bootstrap,
            topics=re.escape(topic),
            checkpoint=str(tmp_path / "ck"),
            trigger_seconds=0.5,
        )
        query = start_query(spark, job)
        try:
            _wait_for(dest.bootstrap, topic, _expected(2, 0, 100), query)
            admin.create_partitions([NewPartitions(topic, 4)])[topic].result(10)
            _produce(source.bootstrap, topic, 4, 100, 100)
            want = _expected(2, 0, 100)
            for p, values in _expected(4, 100, 100).items():
                want.setdefault(p, []).extend(values)
            _wait_for(dest.bootstrap, topic, want, query)
        finally:
            query.stop()
        relay = dest.relay
        assert isinstance(relay, PartitionGrowthRelay)
        assert relay.grown == [(topic, 4)], "the mirror added the partitions, once"
