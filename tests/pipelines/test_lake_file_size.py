"""`--target-file-size` on the shared Spark session, for both formats: one day of records in
several micro-batches with a small target, then the files' sizes on disk and their rows read
back. Iceberg's writers measure their files and cut them at the target; plain Parquet's rows
per file come from the bytes per row of the micro-batches before (the first has none to go
by, so it writes files of up to --max-records-per-file rows)."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pyarrow.parquet as pq
import pytest
from conftest import fresh_topic
from testkit.broker import Broker
from testkit.produce import send_all

from .iceberg_kit import ingest_in_session, lake_job, rows, schema_file

pytestmark = [pytest.mark.integration, pytest.mark.spark]

RECORDS = 12_000
PER_TRIGGER = 6_000
TARGET = 32 << 10
TIMESTAMP = 1_764_000_000_000  # one day: 2025-11-24 UTC


def _produce(bootstrap: str, topic: str) -> None:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    errors: list[str] = []
    values = (
        json.dumps({"id": i, "user": f"user-{i % 101}", "amount": i * 0.37}).encode()
        for i in range(RECORDS)
    )
    send_all(
        producer,
        topic,
        ({"value": v, "partition": 0, "timestamp": TIMESTAMP + i} for i, v in enumerate(values)),
        errors,
    )
    assert producer.flush(30) == 0 and not errors, errors[:3]


@pytest.mark.parametrize("format", ["parquet", "iceberg"])
def test_files_are_cut_near_the_target_size(
    format: str, source_broker: Broker, spark: Any, tmp_path: Path
) -> None:
    topic = fresh_topic(source_broker.bootstrap, f"lake-size-{format}", 1)
    _produce(source_broker.bootstrap, topic)
    job = lake_job(
        source_broker.bootstrap,
        topic,
        tmp_path,
        schema_file(tmp_path),
        format=format,
        max_offsets_per_trigger=PER_TRIGGER,
        target_file_size=TARGET,
    )
    ingest_in_session(spark, job, 1)
    out = tmp_path / "out"
    files = [p for p in out.rglob("*.parquet") if "_quarantine" not in p.parts]
    if format == "iceberg":
        assert sorted(r["kafka_offset"] for r in rows(out)) == list(range(RECORDS))
    else:
        assert sum(pq.read_metadata(p).num_rows for p in files) == RECORDS
    by_batch: dict[int, list[int]] = defaultdict(list)
    for path in files:
        batch = re.search(r"b(\d{12})-", path.name)
        assert batch, path
        by_batch[int(batch.group(1))].append(path.stat().st_size)
    assert len(by_batch) == RECORDS // PER_TRIGGER
    later = [size for batch, sizes in by_batch.items() for size in sizes if batch > 0]
    # Cut at the target (a file ends with its footer, past the last row group that reached
    # it), and not far below it but for a partition's last file of a task's micro-batch.
    assert max(later) <= 1.5 * TARGET, sorted(later)
    assert sorted(later)[len(later) // 2] >= TARGET / 2, sorted(later)
    first = max(by_batch[0])
    if format == "iceberg":  # measured, so cut from the first micro-batch on
        assert first <= 1.5 * TARGET, sorted(by_batch[0])
    else:  # nothing to go by yet
        assert first > 1.5 * TARGET, sorted(by_batch[0])
