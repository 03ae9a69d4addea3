"""`spark.read.format("kipside")` and `spark.readStream.format("kipside")` against a real broker:
exactly the committed records with their offsets, keys, headers and timestamps, in batch and
streaming reads; minPartitions splitting; and bad options, each named in its error."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import fresh_topic
from testkit.broker import Broker
from testkit.ports import free_port

from kipside.pipeline.jobrun import root_cause

from .conftest import require_java
from .kafka_data import Dataset, Rec, consume_all, produce_dataset, produce_plain

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PARTITIONS = 3


@dataclass(frozen=True)
class Source:
    data: Dataset
    expected: dict[tuple[int, int], Rec]
    """(partition, offset) -> record, for every committed record."""


@pytest.fixture(scope="module")
def source(source_broker: Broker) -> Iterator[Source]:
    topic = fresh_topic(source_broker.bootstrap, "source", PARTITIONS)
    data = produce_dataset(source_broker.bootstrap, topic, PARTITIONS, per_codec=150)
    consumed = consume_all(source_broker.bootstrap, topic, PARTITIONS)
    aborted = set(data.aborted)
    expected = {
        (p, off): r for p, items in consumed.items() for off, r in items if r not in aborted
    }
    assert len(expected) == len(data.committed)
    yield Source(data, expected)


def _options(source: Source, **extra: str) -> dict[str, str]:
    data = source.data
    return {"kafka.bootstrap.servers": data.bootstrap, "subscribe": data.topic, **extra}


def _as_recs(rows: list[Any]) -> dict[tuple[int, int], Rec]:
    out = {}
    for row in rows:
        headers = tuple((h.key, h.value) for h in (row.headers or []))
        stamp = int(row.timestamp.replace(tzinfo=dt.UTC).timestamp() * 1000)
        assert row.timestampType == 0
        out[(row.partition, row.offset)] = Rec(row.partition, row.key, row.value, headers, stamp)
    return out


@pytest.fixture
def utc(spark: Any) -> Iterator[None]:
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    yield
    spark.conf.set("spark.sql.session.timeZone", previous)


def test_batch_read_returns_exactly_the_committed_records(
    spark: Any, source: Source, utc: None
) -> None:
    df = spark.read.format("kipside").options(**_options(source, includeHeaders="true")).load()
    rows = df.collect()
    assert len(rows) == len(source.expected), "a record is missing or repeated"
    assert _as_recs(rows) == source.expected
    assert {row.topic for row in rows} == {source.data.topic}


# A user's own session: no kipside code runs in it, so Spark must find the source by itself
# (the installed pyspark_kipside module, at the session's first use of a Python data source).
_PLAIN_SESSION = """
import json, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
options = json.loads(sys.argv[1])
rows = spark.read.format("kipside").options(**options).load().select("partition", "offset")
print(json.dumps(sorted([r.partition, r.offset] for r in rows.collect())))
"""


def test_a_plain_pyspark_session_finds_the_source_without_registering_it(
    source: Source, tmp_path: Any
) -> None:
    require_java()
    done = subprocess.run(
        [sys.executable, "-c", _PLAIN_SESSION, json.dumps(_options(source))],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    read = [tuple(pair) for pair in json.loads(done.stdout.strip().splitlines()[-1])]
    assert read == sorted(source.expected)


def test_streaming_read_in_several_micro_batches_returns_the_same(
    spark: Any, source: Source, utc: None, tmp_path: Any
) -> None:
    name = "kipside_stream_test"
    options = _options(
        source, includeHeaders="true", startingOffsets="earliest", maxOffsetsPerTrigger="400"
    )
    stream = spark.readStream.format("kipside").options(**options).load()
    writer = stream.writeStream.format("memory").queryName(name)
    writer = writer.option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
    query = writer.start()
    try:
        assert query.awaitTermination(120), "the streaming read did not finish"
        batches = [p for p in query.recentProgress if p.numInputRows > 0]
        assert len(batches) >= 3, "maxOffsetsPerTrigger must split the read"
        assert all(p.numInputRows <= 400 + PARTITIONS for p in batches)
        rows = spark.sql(f"SELECT * FROM {name}").collect()
    finally:
        query.stop()
    assert len(rows) == len(source.expected)
    assert _as_recs(rows) == source.expected


def test_read_uncommitted_also_returns_aborted_records(spark: Any, source: Source) -> None:
    options = _options(source, **{"kafka.isolation.level": "read_uncommitted"})
    rows = spark.read.format("kipside").options(**options).load().collect()
    assert len(rows) == len(source.data.committed) + len(source.data.aborted)
    assert {r.value for r in source.data.aborted} <= {row.value for row in rows}


def test_min_partitions_splits_one_big_partition_without_loss(
    spark: Any, source_broker: Broker
) -> None:
    topic = fresh_topic(source_broker.bootstrap, "source-split", 1)
    for chunk in range(10):  # many batches, so cuts fall inside and between them
        produce_plain(source_broker.bootstrap, topic, 1, 300, start=chunk * 300)
    options = {
        "kafka.bootstrap.servers": source_broker.bootstrap,
        "subscribe": topic,
        "minPartitions": "7",
    }
    records = spark.read.format("kipside").options(**options).load()
    assert records.rdd.getNumPartitions() == 7
    offsets = sorted(row.offset for row in records.select("offset").collect())
    assert offsets == list(range(3000))
    batches = spark.read.format("kipside").options(**options, rows="batches").load()
    assert batches.rdd.getNumPartitions() == 7
    rows = batches.select("baseOffset", "lastOffset", "recordCount").collect()
    assert sum(row.recordCount for row in rows) == 3000
    assert len({row.baseOffset for row in rows}) == len(rows), "a batch read by two tasks"
    assert sorted((row.baseOffset, row.lastOffset) for row in rows)[-1][1] == 2999


def _failure(spark: Any, options: dict[str, str]) -> str:
    with pytest.raises(Exception) as failure:
        spark.read.format("kipside").options(**options).load().collect()
    return root_cause(failure.value)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"subscribe": "no-such-topic"}, "option subscribe: topic no-such-topic does not exist"),
        ({"startingOffsets": '{"orders": {0: 5}'}, "option startingOffsets: "),
        (
            {"startingOffset": "earliest"},
            "unknown option startingoffset; did you mean startingOffsets?",
        ),
        ({"maxRatePerPartition": "5"}, "unknown option maxrateperpartition"),
        (
            {"kafka.auto.offset.reset": "earliest"},
            "set startingOffsets to earliest or latest instead",
        ),
        ({"includeHeaders": "yes"}, "option includeHeaders: 'yes' must be true or false"),
    ],
)
def test_bad_options_name_the_option(
    spark: Any, source: Source, change: dict[str, str], expected: str
) -> None:
    cause = _failure(spark, _options(source) | change)
    assert expected in cause, cause
    if "startingOffsets" in change:
        assert "is not valid JSON" in cause and "at character" in cause, cause


def test_an_unreachable_broker_is_named(spark: Any) -> None:
    port = free_port()
    options = {
        "kafka.bootstrap.servers": f"127.0.0.1:{port}",
        "subscribe": "orders",
        "kafka.default.api.timeout.ms": "2000",
    }
    cause = _failure(spark, options)
    assert f"Kafka cluster of option kafka.bootstrap.servers at 127.0.0.1:{port}" in cause, cause
    assert "gave up after" in cause and "Connection refused" in cause, cause


def test_a_custom_schema_is_refused(spark: Any, source: Source) -> None:
    with pytest.raises(Exception) as failure:
        spark.read.format("kipside").schema("value STRING").options(
            **_options(source)
        ).load().collect()
    assert "the kipside source has a fixed schema" in root_cause(failure.value)
