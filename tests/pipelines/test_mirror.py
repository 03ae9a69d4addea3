"""`kipside mirror` end to end: two real brokers, a real Spark job, real clients reading both.

One mirror run (module fixture) copies a topic holding every compression codec, keys, headers,
timestamps, a committed and an aborted transaction. The tests then read the destination with
confluent-kafka and compare with what was produced, compare the raw batches byte for byte with
the source's, and check the offset syncs against both clusters.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from conftest import fresh_topic, unique_name
from testkit.broker import Broker
from testkit.ports import free_port

from kipside.pipeline.kafka.client import KafkaClient
from kipside.pipeline.kafka.fetcher import FetchConfig, RangeReader
from kipside.pipeline.kafka.offsets import watermarks
from kipside.pipeline.mirror.job import OBSERVED
from kipside.pipeline.mirror.offset_sync import DEFAULT_TOPIC, decode_sync
from kipside.protocol import Address
from kipside.protocol.records import RecordBatchView

from .conftest import CliResult, mirror_once, run_cli, run_in_process
from .kafka_data import (
    Dataset,
    Rec,
    as_rec,
    by_partition,
    consume_all,
    produce_dataset,
    produce_plain,
    records_of,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PARTITIONS = 3


@dataclass(frozen=True)
class Mirrored:
    data: Dataset
    dest_topic: str
    run: CliResult
    source: Broker
    dest: Broker


def mirror(source: Broker, dest: Broker, topic: str, checkpoint: Path, *extra: str) -> CliResult:
    args = ["--source", source.bootstrap, "--dest", dest.bootstrap, "--topics", re.escape(topic)]
    return run_cli("mirror", *args, "--checkpoint", str(checkpoint), "--once", *extra)


@pytest.fixture(scope="module")
def mirrored(
    source_broker: Broker, dest_broker: Broker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Mirrored]:
    topic = fresh_topic(source_broker.bootstrap, "mirror-src", PARTITIONS)
    data = produce_dataset(source_broker.bootstrap, topic, PARTITIONS)
    checkpoint = tmp_path_factory.mktemp("mirror") / "checkpoint"
    run = mirror(source_broker, dest_broker, topic, checkpoint, "--rename", "dr.")
    assert run.code == 0, run.explain()
    yield Mirrored(data, "dr." + topic, run, source_broker, dest_broker)


def _raw_batches(
    broker: Broker, topic: str, committed_only: bool
) -> dict[int, list[RecordBatchView]]:
    client = KafkaClient([Address(broker.host, broker.port)], role="test reader")
    marks = watermarks(client, {(topic, p): 0 for p in range(PARTITIONS)})
    reader = RangeReader(client, FetchConfig(committed_only=committed_only))
    return {
        p: list(reader.read(topic, p, 0, marks[(topic, p)].high_watermark))
        for p in range(PARTITIONS)
    }


def test_destination_holds_exactly_the_committed_records_in_order(mirrored: Mirrored) -> None:
    got = records_of(consume_all(mirrored.dest.bootstrap, mirrored.dest_topic, PARTITIONS))
    want = by_partition(mirrored.data.committed)
    for p in range(PARTITIONS):
        assert got.get(p, []) == want[p], f"partition {p} differs"
    aborted = {(r.key, r.value) for r in mirrored.data.aborted}
    assert not aborted & {(r.key, r.value) for rs in got.values() for r in rs}


def test_batches_are_copied_byte_for_byte(mirrored: Mirrored) -> None:
    source = _raw_batches(mirrored.source, mirrored.data.topic, committed_only=True)
    dest = _raw_batches(mirrored.dest, mirrored.dest_topic, committed_only=False)
    codecs = set()
    for p in range(PARTITIONS):
        assert len(dest[p]) == len(source[p]), f"partition {p}: batch count differs"
        for s, d in zip(source[p], dest[p], strict=True):
            codecs.add(int(s.compression))
            assert bytes(d.records) == bytes(s.records), f"{p}@{s.base_offset}: records differ"
            assert (d.compression, d.records_count, d.last_offset_delta) == (
                s.compression,
                s.records_count,
                s.last_offset_delta,
            )
            assert (d.base_timestamp, d.max_timestamp) == (s.base_timestamp, s.max_timestamp)
            # Re-stamped for the mirror's idempotent session (producer ids are per cluster).
            assert not d.is_transactional and d.crc_valid() and d.producer_id >= 0
    assert codecs == {0, 1, 2, 3, 4}, "the dataset must exercise every codec"


def test_each_destination_partition_got_one_idempotent_session_in_sequence(
    mirrored: Mirrored,
) -> None:
    dest = _raw_batches(mirrored.dest, mirrored.dest_topic, committed_only=False)
    for p, batches in dest.items():
        by_producer: dict[int, list[RecordBatchView]] = {}
        for b in batches:
            by_producer.setdefault(b.producer_id, []).append(b)
        for pid, mine in by_producer.items():
            expected = 0
            for b in mine:
                assert b.base_sequence == expected, f"partition {p}, producer {pid}: sequence gap"
                expected += b.records_count


def test_progress_and_summary_are_reported(mirrored: Mirrored) -> None:
    stderr = mirrored.run.stderr
    records = len(mirrored.data.committed)
    done = re.search(
        r"kipside mirror: done: ([\d,]+) batches, ([\d,]+) records, ([\d.,]+) MB", stderr
    )
    assert done, mirrored.run.explain()
    assert int(done.group(2).replace(",", "")) == records
    assert "lag 0" in stderr.splitlines()[-1]
    assert "WARN" not in stderr and "Traceback" not in stderr, mirrored.run.explain()


def test_offset_syncs_point_at_the_same_records(mirrored: Mirrored) -> None:
    source = consume_all(
        mirrored.source.bootstrap, mirrored.data.topic, PARTITIONS, isolation="read_uncommitted"
    )
    dest = consume_all(mirrored.dest.bootstrap, mirrored.dest_topic, PARTITIONS)
    src_at = {(p, off): r for p, items in source.items() for off, r in items}
    dst_at = {(p, off): r for p, items in dest.items() for off, r in items}
    syncs = [
        decode_sync(r.key, r.value)
        for r in records_of(consume_all(mirrored.dest.bootstrap, DEFAULT_TOPIC, 1)).get(0, [])
        if r.key is not None and r.value is not None
    ]
    mine = [s for s in syncs if s.topic == mirrored.data.topic]
    assert len(mine) == sum(
        len(v) for v in _raw_batches(mirrored.dest, mirrored.dest_topic, False).values()
    )
    for s in mine:
        assert s.dest_topic == mirrored.dest_topic and s.dest_partition == s.partition
        for delta in (0, s.source_last_offset - s.source_offset):
            assert (
                dst_at[(s.partition, s.dest_offset + delta)]
                == src_at[(s.partition, s.source_offset + delta)]
            )


def test_read_uncommitted_copies_aborted_records(
    spark: Any, source_broker: Broker, dest_broker: Broker, tmp_path: Path
) -> None:
    topic = fresh_topic(source_broker.bootstrap, "mirror-ru", PARTITIONS)
    data = produce_dataset(source_broker.bootstrap, topic, PARTITIONS, per_codec=30)
    job = mirror_once(
        source_broker.bootstrap,
        dest_broker.bootstrap,
        topic,
        tmp_path / "ck",
        rename="ru.",
        read_uncommitted=True,
    )
    run_in_process(spark, job)
    got = records_of(consume_all(dest_broker.bootstrap, "ru." + topic, PARTITIONS))
    copied = {(r.key, r.value) for rs in got.values() for r in rs}
    assert {(r.key, r.value) for r in data.aborted} <= copied
    assert len(copied) == len({(r.key, r.value) for r in data.committed + data.aborted})


def test_read_uncommitted_warns_before_anything_else(dest_broker: Broker, tmp_path: Path) -> None:
    closed = f"127.0.0.1:{free_port()}"
    args = ["--source", closed, "--dest", dest_broker.bootstrap, "--topics", "t"]
    run = run_cli(
        "mirror",
        *args,
        "--checkpoint",
        str(tmp_path / "ck"),
        "--read-uncommitted",
        "--timeout",
        "1",
    )
    assert run.code == 1
    first = run.stderr.splitlines()[0]
    assert first.startswith("kipside mirror: warning: --read-uncommitted copies every data batch")
    assert "aborted or are still open" in first and "reads as committed data" in first


def test_a_second_run_copies_only_what_is_new(
    spark: Any, source_broker: Broker, dest_broker: Broker, tmp_path: Path
) -> None:
    topic = fresh_topic(source_broker.bootstrap, "mirror-inc", 2)
    job = mirror_once(source_broker.bootstrap, dest_broker.bootstrap, topic, tmp_path / "ck")
    first = produce_plain(source_broker.bootstrap, topic, 2, 500)
    run_in_process(spark, job)
    second = produce_plain(source_broker.bootstrap, topic, 2, 300, start=500)
    query = run_in_process(spark, job)
    copied = sum(
        p.observedMetrics[OBSERVED].asDict()["records"]
        for p in query.recentProgress
        if p.numInputRows
    )
    assert copied == 300
    got = records_of(consume_all(dest_broker.bootstrap, topic, 2))
    assert got == by_partition(first + second)


def _first_per_partition(bootstrap: str, topic: str, group: str, partitions: int) -> dict[int, Rec]:
    """What a consumer of `group` reads first in each partition when it (re)joins."""
    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "fetch.wait.max.ms": 100,
        }
    )
    first: dict[int, Rec] = {}
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(first) < partitions:
            assert time.monotonic() < deadline, f"group {group} read only {sorted(first)}"
            m = consumer.poll(0.2)
            if m is None or m.error() is not None or (partition := m.partition()) is None:
                continue
            first.setdefault(partition, as_rec(m))
    finally:
        consumer.close()
    return first


def test_translated_offsets_resume_a_group_at_the_same_record(mirrored: Mirrored) -> None:
    topic = mirrored.data.topic
    source = consume_all(mirrored.source.bootstrap, topic, PARTITIONS, isolation="read_uncommitted")
    aborted = set(mirrored.data.aborted)
    # Where the group stopped on the source, per partition: inside a run of records, on an
    # aborted record (not copied) and on a transaction marker (an offset with no record).
    offsets = {p: [off for off, _ in items] for p, items in source.items()}
    first_aborted = min(off for off, r in source[1] if r in aborted)
    marker = next(o for o in range(offsets[2][0], offsets[2][-1]) if o not in set(offsets[2]))
    stops = {0: offsets[0][len(offsets[0]) // 2], 1: first_aborted, 2: marker}
    group = unique_name("translate")
    committer = ck.Consumer({"bootstrap.servers": mirrored.source.bootstrap, "group.id": group})
    committer.commit(
        offsets=[ck.TopicPartition(topic, p, o) for p, o in stops.items()], asynchronous=False
    )
    committer.close()

    args = ["--source", mirrored.source.bootstrap, "--dest", mirrored.dest.bootstrap]
    run = run_cli("mirror", "translate", *args, "--group", group, "--commit", timeout=120)
    assert run.code == 0, run.explain()
    assert f"committed 3 offsets for group '{group}'" in run.stderr, run.explain()

    expected = {
        p: next(r for off, r in source[p] if off >= stop and r not in aborted)
        for p, stop in stops.items()
    }
    assert _first_per_partition(mirrored.dest.bootstrap, mirrored.dest_topic, group, 3) == expected
