"""Shared pieces of the Iceberg lake tests: the job on the test session, and the tables read
back with pyiceberg alone (a SQL catalog on the SQLite file the job made), as any reader
outside Spark would."""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table

from .kafka_data import JSON_SCHEMA

TABLE = "kipside.lake"
QUARANTINE = "kipside.lake_quarantine"
OFFSETS_KEY = "kipside.kafka-offsets"  # the snapshot summary property, as documented

# A records table with one value field, for tests that write the tables without Spark.
DATA_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("kafka_partition", pa.int32()),
        pa.field("kafka_offset", pa.int64()),
        pa.field("kafka_timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("topic", pa.string()),
        pa.field("date", pa.date32()),
    ]
)


def schema_file(tmp: Path, schema: dict[str, Any] | None = None, name: str = "orders.json") -> Path:
    path = tmp / name
    path.write_text(json.dumps(schema or JSON_SCHEMA, indent=2))
    return path


def lake_job(bootstrap: str, topic: str, tmp: Path, schema: Path, **extra: Any) -> Any:
    from kipside.pipeline.lake.job import LakeJob

    fields: dict[str, Any] = {
        "bootstrap": bootstrap,
        "topics": re.escape(topic),
        "schema": str(schema),
        "out": str(tmp / "out"),
        "checkpoint": str(tmp / "ck"),
        "format": "iceberg",
        "once": True,
    }
    return LakeJob(**(fields | extra))


def ingest_in_session(spark: Any, job: Any, partitions: int, timeout: float = 180) -> str:
    """Run the lake's query to its end on the shared session; returns what it said."""
    from kipside.pipeline.lake.job import start_on

    spark.conf.set("spark.sql.session.timeZone", "UTC")
    topic = job.topics.replace("\\", "")
    said = io.StringIO()
    query = start_on(spark, job, [(topic, p) for p in range(partitions)], said)
    if not query.awaitTermination(timeout):
        query.stop()
        raise AssertionError(f"the lake query did not finish within {timeout} s")
    if query.exception() is not None:
        raise AssertionError(str(query.exception()))
    return said.getvalue()


def catalog(out: Path) -> Catalog:
    return load_catalog(
        "kipside", type="sql", uri=f"sqlite:///{out}/catalog.db", warehouse=f"file://{out}"
    )


def table(out: Path, name: str = TABLE) -> Table:
    return catalog(out).load_table(name)


def rows(out: Path, name: str = TABLE, snapshot_id: int | None = None) -> list[dict[str, Any]]:
    scan = table(out, name).scan(snapshot_id=snapshot_id)
    found: list[dict[str, Any]] = scan.to_arrow().to_pylist()
    return found


def offsets_of(summary: Any) -> dict[tuple[str, int], int]:
    raw = json.loads(summary[OFFSETS_KEY]) if summary and summary[OFFSETS_KEY] else {}
    return {(t, int(p)): int(o) for t, parts in raw.items() for p, o in parts.items()}


def duplicates(found: list[dict[str, Any]]) -> list[tuple[int, int]]:
    places = Counter((r["kafka_partition"], r["kafka_offset"]) for r in found)
    return [k for k, n in places.items() if n > 1]


@dataclass(frozen=True)
class Snapshot:
    id: int
    offsets: dict[tuple[str, int], int]
    rows: list[dict[str, Any]]


def snapshots(out: Path, name: str = TABLE) -> list[Snapshot]:
    """Every snapshot the lake committed, oldest first, with its offsets and what a reader of
    it sees."""
    t = table(out, name)
    return [
        Snapshot(s.snapshot_id, offsets_of(s.summary), rows(out, name, s.snapshot_id))
        for s in sorted(t.snapshots(), key=lambda s: s.sequence_number or 0)
    ]


def check_whole_micro_batches(out: Path, topic: str, good: set[tuple[int, int]]) -> int:
    """Each snapshot's reader sees exactly the good records (partition, offset) below that
    snapshot's offsets, and the offsets never move back; the last snapshot holds them all.
    Returns how many snapshots there were."""
    taken = snapshots(out)
    previous: dict[tuple[str, int], int] = {}
    for snap in taken:
        assert snap.offsets, f"snapshot {snap.id} has no Kafka offsets in its summary"
        assert all(o >= previous.get(tp, 0) for tp, o in snap.offsets.items())
        previous = snap.offsets
        expected = {(p, o) for p, o in good if o < snap.offsets.get((topic, p), 0)}
        seen = [(r["kafka_partition"], r["kafka_offset"]) for r in snap.rows]
        assert len(seen) == len(set(seen)), f"snapshot {snap.id} holds a record twice"
        assert set(seen) == expected, f"snapshot {snap.id} holds part of a micro-batch"
    assert taken and {(r["kafka_partition"], r["kafka_offset"]) for r in taken[-1].rows} == good
    return len(taken)
