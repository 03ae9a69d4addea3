"""The pipelines on a real Spark cluster: a standalone master and two workers, each its own JVM
started with spark-class from the PySpark install (tests/pipelines/spark_cluster.py), and the
jobs started with `--master spark://...`.

- `kipside mirror --exactly-once` keeps copying while a producer writes and workers are
  SIGKILLed (with their executors and Python workers) at random moments, a fresh worker
  joining after each: Spark runs the lost tasks again elsewhere, their transactions fence the
  killed ones, and the destination's log, audited with its markers, holds every source record
  once.
- `kipside lake --once`, started by spark-submit (kipside.pipeline.submit), writes every record
  to Parquet from the same cluster.
"""

from __future__ import annotations

import random
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from conftest import fresh_topic
from testkit.broker import Broker

import kipside.pipeline.submit as kipside_submit

from . import eos_kit as kit
from .conftest import start_cli
from .kafka_data import produce_plain
from .spark_cluster import Cluster, spark_home, standalone_cluster

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

KILLS = 5
SPARK = ["--conf", "spark.executor.memory=512m"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as started:
        yield started


@pytest.mark.hard_limit(600)
def test_the_mirror_loses_and_duplicates_nothing_while_workers_are_killed(
    cluster: Cluster, source_broker: Broker, dest_broker: Broker, tmp_path: Path
) -> None:
    topic = fresh_topic(source_broker.bootstrap, "cluster-eos", 4)
    checkpoint = tmp_path / "ck"
    args = ["--source", source_broker.bootstrap, "--dest", dest_broker.bootstrap]
    args += ["--topics", re.escape(topic), "--rename", "sc.", "--checkpoint", str(checkpoint)]
    args += ["--exactly-once", "--max-bytes-per-trigger", "64K", "--master", cluster.url, *SPARK]
    rng = random.Random()
    writer = kit.Writer(source_broker.bootstrap, topic, 4)
    mirror = start_cli("mirror", *args)
    try:
        for kill in range(KILLS):
            before = kit.committed_batches(checkpoint)
            kit.wait(mirror, lambda: kit.committed_batches(checkpoint) > before, "copying")  # noqa: B023
            time.sleep(rng.uniform(0, 3))
            live = [i for i, w in enumerate(cluster.workers) if w.poll() is None]
            victim = rng.choice(live)
            executors = len(cluster.executors())
            cluster.kill_worker(victim)
            cluster.add_worker()
            print(f"kill {kill + 1}: worker {victim} ({executors} executors running)")
    finally:
        sent = writer.stop()
    ends = {p: len(values) for p, values in sent.items()}

    kit.wait(mirror, lambda: kit.drained(checkpoint, topic, ends), "drained")
    mirror.send_signal(signal.SIGTERM)
    _out, err = mirror.communicate(timeout=120)
    assert mirror.returncode == 0, err[-3000:]
    audit = kit.audit(dest_broker.bootstrap, "sc." + topic, 4)
    for p in range(4):
        copies = audit[p]
        lost = [v for v in sent[p] if v not in copies]
        twice = [v for v, n in copies.items() if n > 1]
        assert not lost and not twice and sum(copies.values()) == len(sent[p]), (
            f"partition {p}: {len(lost)} lost, {len(twice)} duplicated of {len(sent[p])}"
        )
    cluster.wait_for_workers(2)


def test_the_lake_runs_on_the_cluster_under_spark_submit(
    cluster: Cluster, source_broker: Broker, tmp_path: Path
) -> None:
    """The recipe of docs/deploy.md: spark-submit runs kipside's submit module."""
    topic = fresh_topic(source_broker.bootstrap, "cluster-lake", 2)
    produce_plain(source_broker.bootstrap, topic, 2, 2000, codec="zstd")
    schema = tmp_path / "rows.ddl"
    schema.write_text("n BIGINT, tag STRING")
    submit = [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.url, *SPARK]
    lake = ["lake", "--bootstrap", source_broker.bootstrap, "--topics", re.escape(topic)]
    lake += ["--schema", str(schema), "--out", str(tmp_path / "out")]
    lake += ["--checkpoint", str(tmp_path / "ck"), "--once"]
    done = subprocess.run(
        [*submit, str(kipside_submit.__file__), *lake],
        capture_output=True,
        text=True,
        timeout=240,
        env=cluster.env(),
    )
    # spark-submit runs the driver's Python with its stderr joined to its own stdout.
    assert done.returncode == 0, done.stdout[-4000:]
    assert "kipside lake: done: " in done.stdout, done.stdout[-3000:]
    table = ds.dataset(str(tmp_path / "out"), format="parquet", partitioning="hive").to_table()
    quarantine = tmp_path / "out" / "_quarantine"
    bad = ds.dataset(str(quarantine), format="parquet").count_rows() if quarantine.exists() else 0
    assert table.num_rows + bad == 2000
    assert sorted(table.column("n").to_pylist()) == sorted(
        n
        for n in range(2000)
        if n % 13 != 5  # kafka_data's null values go to quarantine
    )
