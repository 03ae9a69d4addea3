"""Micro-batches as big as the limits say, from the first one on.

`--max-bytes-per-trigger` (the source's maxBytesPerTrigger) plans with the sizes of real
batches, sampled along each partition's range, so every micro-batch of a backlog reads about
the limit: here within 2x either way, on partitions whose batches differ in size by 30x.
maxOffsetsPerTrigger bounds records the way Spark's Kafka source does.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from conftest import fresh_topic
from testkit.broker import Broker
from testkit.produce import send_all

from kipside.pipeline.mirror.job import OBSERVED, start_query

from .conftest import mirror_once
from .kafka_data import consume_all

pytestmark = [pytest.mark.integration, pytest.mark.spark]

LIMIT = 256 * 1024
# Per partition: (value size, codec, records): 100 B to 3 KB values, plain and compressed.
LAYOUT = ((100, "none", 3_000), (1000, "zstd", 750), (3000, "lz4", 250), (400, "gzip", 1_000))


def _produce_layout(bootstrap: str, topic: str) -> dict[int, int]:
    counts = {}
    rng = random.Random(28)
    for partition, (size, codec, count) in enumerate(LAYOUT):
        # Java's default batch.size (librdkafka's is 1 MB): a micro-batch holds whole batches,
        # so none can be smaller than one batch.
        producer = ck.Producer(
            {
                "bootstrap.servers": bootstrap,
                "compression.type": codec,
                "linger.ms": 5,
                "batch.size": 16384,
            }
        )
        errors: list[str] = []
        records = [
            {
                "value": json.dumps({"n": i, "pad": rng.randbytes(size // 2).hex()}),
                "partition": partition,
            }
            for i in range(count)
        ]
        send_all(producer, topic, records, errors)
        producer.flush(30)
        assert not errors, errors[:3]
        counts[partition] = count
    return counts


def test_max_bytes_per_trigger_bounds_every_micro_batch(
    spark: Any, source_broker: Broker, dest_broker: Broker, tmp_path: Path
) -> None:
    topic = fresh_topic(source_broker.bootstrap, "sized", len(LAYOUT))
    counts = _produce_layout(source_broker.bootstrap, topic)
    clusters = source_broker.bootstrap, dest_broker.bootstrap
    job = mirror_once(*clusters, topic, tmp_path / "ck", rename="sz.", max_bytes_per_trigger=LIMIT)
    query = start_query(spark, job)
    assert query.awaitTermination(180), "the mirror did not drain within 180 s"
    progress = [p for p in query.recentProgress if p.numInputRows > 0]
    sizes = [int(p.observedMetrics[OBSERVED].asDict()["bytes"]) for p in progress]
    total = sum(sizes)
    assert total > 5 * LIMIT, f"the data ({total} bytes) must need several micro-batches"
    assert all(s <= 2 * LIMIT for s in sizes), f"micro-batches over 2x {LIMIT}: {sizes}"
    assert all(s >= LIMIT / 2 for s in sizes[:-1]), f"micro-batches under half {LIMIT}: {sizes}"
    print(f"micro-batch bytes at maxBytesPerTrigger {LIMIT}: {sizes}")
    got = consume_all(dest_broker.bootstrap, "sz." + topic, len(LAYOUT))
    assert {p: len(v) for p, v in got.items()} == counts
