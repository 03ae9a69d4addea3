"""`kipside lake compact` beside a running `kipside lake --format iceberg`, on the real broker:
records of three past days (their Kafka timestamps) ingested in many small micro-batches,
compacted while the ingestion commits and again once it has caught up, then audited with
pyiceberg alone: every record exactly once in the records table or the quarantine, each
compaction snapshot holding exactly its parent's rows, and in every closed partition at most
one file under a quarter of the target size per target size of data."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from conftest import fresh_topic
from testkit.broker import Broker
from testkit.produce import send_all

from .conftest import run_cli, start_cli
from .iceberg_kit import QUARANTINE, TABLE, duplicates, rows, schema_file, table
from .kafka_data import consume_all

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 3
PER_DAY = 1_500
TARGET = 16 << 10  # small, so that the test's data makes several target-sized files a day
COMPACTED = "kipside.compacted-before"  # the compaction snapshot's summary property


def _produce(bootstrap: str, topic: str, days: list[dt.date]) -> int:
    """PER_DAY records a day, the days interleaved so every micro-batch writes to each; one in
    fifty is not JSON (quarantine). Returns how many were sent."""
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    errors: list[str] = []
    records = []
    for i in range(PER_DAY * len(days)):
        day = days[i % len(days)]
        at = dt.datetime(day.year, day.month, day.day, 12, i % 60, tzinfo=dt.UTC)
        value = (
            f"not json {i}".encode()
            if i % 50 == 7
            else json.dumps(
                {"id": i, "user": f"user-{i % 17}", "amount": i * 1.25, "at": at.isoformat()}
            ).encode()
        )
        records.append(
            {"value": value, "partition": i % PARTITIONS, "timestamp": int(at.timestamp() * 1000)}
        )
    send_all(producer, topic, records, errors)
    assert producer.flush(30) == 0 and not errors, errors[:3]
    return len(records)


def _wait(what: str, ready: Callable[[], bool], ingestion: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while not ready():
        assert ingestion.poll() is None, ingestion.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"no {what} in 120 s"
        time.sleep(0.2)


def _total(out: Path, name: str) -> int:
    """The rows the table's current snapshot holds (0 while the ingestion is starting)."""
    from pyiceberg.exceptions import NoSuchTableError

    if not (out / "catalog.db").exists():
        return 0
    try:
        snapshot = table(out, name).current_snapshot()
    except NoSuchTableError:
        return 0
    return int(snapshot.summary["total-records"] or 0) if snapshot and snapshot.summary else 0


def _places(found: list[dict[str, Any]]) -> set[tuple[int, int]]:
    return {(r["kafka_partition"], r["kafka_offset"]) for r in found}


def _check_compaction_snapshots(out: Path, name: str) -> int:
    """Each compaction snapshot holds exactly the rows of its parent; returns how many."""
    t = table(out, name)
    compactions = [
        s for s in t.snapshots() if s.summary and COMPACTED in s.summary.additional_properties
    ]
    for snap in compactions:
        mine = rows(out, name, snap.snapshot_id)
        parent = rows(out, name, snap.parent_snapshot_id)
        assert not duplicates(mine), f"{name}: compaction snapshot {snap.snapshot_id} repeats rows"
        assert _places(mine) == _places(parent), f"{name}: snapshot {snap.snapshot_id} lost rows"
    return len(compactions)


@pytest.mark.hard_limit(400)
def test_compaction_beside_a_running_ingestion_keeps_every_record_once(
    source_broker: Broker, tmp_path: Path
) -> None:
    today = dt.datetime.now(dt.UTC).date()
    days = [today - dt.timedelta(days=n) for n in (3, 2, 1)]
    topic = fresh_topic(source_broker.bootstrap, "lake-compact", PARTITIONS)
    sent = _produce(source_broker.bootstrap, topic, days)
    out = tmp_path / "out"
    ingestion = start_cli(
        "lake", "--format", "iceberg", "--bootstrap", source_broker.bootstrap,
        "--topics", re.escape(topic), "--schema", str(schema_file(tmp_path)),
        "--out", str(out), "--checkpoint", str(tmp_path / "ck"),
        "--max-offsets-per-trigger", "600", "--trigger-interval", "0.2",
        "--target-file-size", "16KiB",
    )  # fmt: skip
    compact = ["lake", "compact", "--format", "iceberg", "--out", str(out)]
    compact += ["--target-file-size", "16KiB"]
    try:
        # 1. While micro-batches are being committed.
        _wait("second micro-batch", lambda: _total(out, TABLE) >= 1_000, ingestion)
        first = run_cli(*compact, timeout=120)
        assert first.code == 0, first.explain()
        assert first.stderr == "", first.explain()
        assert _total(out, TABLE) < sent, "the ingestion was over before the compaction"
        # 2. Once it has caught up (still running).
        _wait(
            "end of the topic",
            lambda: _total(out, TABLE) + _total(out, QUARANTINE) >= sent,
            ingestion,
        )
        second = run_cli(*compact, timeout=120)
        assert second.code == 0, second.explain()
    finally:
        ingestion.send_signal(signal.SIGTERM)
        _out, err = ingestion.communicate(timeout=120)
    assert ingestion.returncode == 0, err[-3000:]
    said = first.stdout.splitlines() + second.stdout.splitlines()
    assert re.fullmatch(
        r"kipside lake compact: kipside\.lake: 3 partitions, \d+ files -> \d+ files "
        r"\(\d+\.\d MB\), snapshot \d+",
        said[0],
    ), said
    assert said[1].startswith("kipside lake compact: kipside.lake_quarantine: 1 partition, ")

    # Every record once, in the records table or in quarantine.
    consumed = consume_all(source_broker.bootstrap, topic, PARTITIONS)
    everything = {(p, off): r.value for p, items in consumed.items() for off, r in items}
    assert len(everything) == sent
    bad = {place for place, value in everything.items() if value and value.startswith(b"not")}
    good = set(everything) - bad
    found = rows(out)
    assert not duplicates(found), "a record is in the records table twice"
    assert _places(found) == good
    quarantined = rows(out, QUARANTINE)
    assert not duplicates(quarantined), "a value is in quarantine twice"
    assert _places(quarantined) == bad
    by_id = {r["id"]: r for r in found}
    for (p, off), value in everything.items():
        if (p, off) in good:
            row = by_id[json.loads(value or b"")["id"]]
            assert (row["kafka_partition"], row["kafka_offset"]) == (p, off)
    assert _check_compaction_snapshots(out, TABLE) >= 2
    assert _check_compaction_snapshots(out, QUARANTINE) >= 1

    # The file sizes of the closed partitions.
    files = [task.file for task in table(out).scan().plan_files()]
    by_day: dict[str, list[int]] = {}
    for f in files:
        path = f.file_path
        date = re.search(r"date=([0-9-]+)/", path)
        assert date, path
        by_day.setdefault(date.group(1), []).append(int(f.file_size_in_bytes))
    assert sorted(by_day) == [d.isoformat() for d in days]
    for day, sizes in by_day.items():
        small = [s for s in sizes if s < TARGET / 4]
        allowed = max(1, math.ceil(sum(sizes) / TARGET))
        assert len(small) <= allowed, f"{day}: {len(small)} small files of {sorted(sizes)}"
        assert len(sizes) <= allowed + 1, f"{day}: {sorted(sizes)}"
