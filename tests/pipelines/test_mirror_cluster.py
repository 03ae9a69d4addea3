"""The mirror where Spark runs it for real: tasks in separate executor JVMs and Python workers
(local-cluster), and the figures it leaves in Spark's own streaming progress events."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import fresh_topic
from testkit.broker import Broker

from kipside.pipeline.mirror.job import OBSERVED, start_query

from .conftest import mirror_once, run_cli
from .kafka_data import by_partition, consume_all, produce_dataset, produce_plain, records_of

pytestmark = [pytest.mark.integration, pytest.mark.spark]


@pytest.mark.slow
def test_mirror_on_a_local_cluster_of_two_executors(
    source_broker: Broker, dest_broker: Broker, tmp_path: Path
) -> None:
    topic = fresh_topic(source_broker.bootstrap, "mirror-cluster", 4)
    data = produce_dataset(source_broker.bootstrap, topic, 4, per_codec=100)
    clusters = ["--source", source_broker.bootstrap, "--dest", dest_broker.bootstrap]
    job = ["--topics", re.escape(topic), "--checkpoint", str(tmp_path / "ck"), "--once"]
    spark = ["--master", "local-cluster[2,1,1024]", "--conf", "spark.executor.memory=512m"]
    run = run_cli("mirror", *clusters, *job, "--rename", "lc.", *spark, timeout=300)
    assert run.code == 0, run.explain()
    got = records_of(consume_all(dest_broker.bootstrap, "lc." + topic, 4))
    assert got == by_partition(data.committed)


def test_progress_events_carry_batches_bytes_and_lag(
    spark: Any, source_broker: Broker, dest_broker: Broker, tmp_path: Path
) -> None:
    topic = fresh_topic(source_broker.bootstrap, "mirror-progress", 2)
    # Ten flushes: at least ten batches per partition whatever the producer's timing (a mirror
    # copies whole batches, so one big batch would make one micro-batch whatever the limit).
    sent = []
    for chunk in range(10):
        sent += produce_plain(source_broker.bootstrap, topic, 2, 200, start=200 * chunk)
    clusters = source_broker.bootstrap, dest_broker.bootstrap
    job = mirror_once(*clusters, topic, tmp_path / "ck", rename="pe.", max_bytes_per_trigger=4096)
    query = start_query(spark, job)
    query.awaitTermination(120)
    assert not query.isActive
    progress = [p for p in query.recentProgress if p.numInputRows > 0]
    assert len(progress) >= 2, "a small maxBytesPerTrigger must give several micro-batches"
    observed = [p.observedMetrics[OBSERVED].asDict() for p in progress]
    assert sum(o["records"] for o in observed) == len(sent)
    assert all(o["batches"] == p.numInputRows for o, p in zip(observed, progress, strict=True))
    assert all(o["bytes"] > 0 for o in observed)
    first = progress[0].sources[0]
    end, latest = json.loads(first.endOffset), json.loads(first.latestOffset)
    lag = sum(latest[topic][p] - end[topic][p] for p in end[topic])
    assert lag > 0, "the first of several micro-batches leaves a lag"
    last = progress[-1].sources[0]
    assert json.loads(last.endOffset) == json.loads(last.latestOffset), "drained: no lag left"
