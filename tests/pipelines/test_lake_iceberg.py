"""`kipside lake --format iceberg` on the real broker and the shared Spark session: the tables
read back with pyiceberg alone, every committed record once, snapshots that hold whole
micro-batches, a replay that adds nothing, the quarantine table, schema evolution and a
refused schema change."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import fresh_topic
from testkit.broker import Broker

from .conftest import run_cli
from .iceberg_kit import (
    QUARANTINE,
    check_whole_micro_batches,
    duplicates,
    ingest_in_session,
    lake_job,
    rows,
    schema_file,
    table,
)
from .kafka_data import JSON_SCHEMA, JsonDataset, consume_all, produce_json_dataset

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PARTITIONS = 3


@dataclass(frozen=True)
class Landed:
    data: JsonDataset
    tmp: Path
    out: Path
    said: str
    offsets: dict[bytes | None, tuple[int, int]]
    """Where each value is in the topic: (partition, offset)."""

    def place(self, value: dict[str, Any]) -> tuple[int, int]:
        return self.offsets[json.dumps(value).encode()]


@pytest.fixture(scope="module")
def landed(
    source_broker: Broker, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Landed]:
    topic = fresh_topic(source_broker.bootstrap, "lake-ice", PARTITIONS)
    data = produce_json_dataset(source_broker.bootstrap, topic, PARTITIONS, per_codec=120)
    tmp = tmp_path_factory.mktemp("lake-ice")
    job = lake_job(
        source_broker.bootstrap, topic, tmp, schema_file(tmp), max_offsets_per_trigger=250
    )
    said = ingest_in_session(spark, job, PARTITIONS)
    consumed = consume_all(source_broker.bootstrap, topic, PARTITIONS)
    offsets = {r.value: (p, off) for p, items in consumed.items() for off, r in items}
    yield Landed(data, tmp, tmp / "out", said, offsets)


def test_records_read_back_with_pyiceberg_once_each(landed: Landed) -> None:
    found = rows(landed.out)
    assert not duplicates(found), "a record was committed twice"
    by_id = {r["id"]: r for r in found}
    assert sorted(by_id) == sorted(v["id"] for _, v, _ in landed.data.good)
    for partition, value, _ts in landed.data.good:
        row = by_id[value["id"]]
        assert (row["kafka_partition"], row["kafka_offset"]) == landed.place(value)
        assert row["kafka_partition"] == partition
        assert {k: row[k] for k in ("user", "amount", "paid", "items")} == {
            k: value[k] for k in ("user", "amount", "paid", "items")
        }
        assert row["topic"] == landed.data.topic
    aborted = {json.loads(raw)["id"] for raw in landed.data.aborted}
    assert not aborted & set(by_id)
    spec = table(landed.out).spec()
    assert [f.name for f in spec.fields] == ["topic", "date"]
    assert "created Iceberg table kipside.lake" in landed.said


def test_every_snapshot_holds_whole_micro_batches(landed: Landed) -> None:
    """What a reader of any snapshot sees is exactly the good records below that snapshot's
    offsets: no micro-batch is ever visible in part."""
    good = {landed.place(v) for _, v, _ in landed.data.good}
    taken = check_whole_micro_batches(landed.out, landed.data.topic, good)
    assert taken >= 3, "expected several micro-batches (max 250 records each)"


def test_quarantine_table_has_reason_topic_partition_offset(landed: Landed) -> None:
    found = rows(landed.out, QUARANTINE)
    assert not duplicates(found)
    assert len(found) == len(landed.data.bad)
    by_place = {(r["kafka_partition"], r["kafka_offset"]): r for r in found}
    for partition, raw, reason in landed.data.bad:
        if raw is None:
            (row,) = [r for r in found if r["value"] is None]
        else:
            row = by_place[landed.offsets[raw]]
        assert row["kafka_partition"] == partition
        assert row["topic"] == landed.data.topic
        assert reason in row["error"], (reason, row["error"])


def test_a_replayed_micro_batch_adds_nothing(
    landed: Landed, source_broker: Broker, spark: Any
) -> None:
    """The whole topic read again from the earliest offsets with a fresh checkpoint (what a
    replay is, and more): the tables' offsets keep out everything they hold."""
    before = {
        name: len(table(landed.out, name).snapshots()) for name in ("kipside.lake", QUARANTINE)
    }
    job = lake_job(
        source_broker.bootstrap,
        landed.data.topic,
        landed.tmp,
        schema_file(landed.tmp),
        checkpoint=str(landed.tmp / "ck-replay"),
    )
    from kipside.pipeline.lake.job import start_on

    query = start_on(
        spark, job, [(landed.data.topic, p) for p in range(PARTITIONS)], io.StringIO(), "earliest"
    )
    assert query.awaitTermination(120)
    assert query.exception() is None
    after = {name: len(table(landed.out, name).snapshots()) for name in before}
    assert after == before, "a replayed micro-batch was committed again"
    assert not duplicates(rows(landed.out))


def test_an_optional_field_added_to_the_schema_evolves_the_table(
    source_broker: Broker, spark: Any, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    topic = fresh_topic(source_broker.bootstrap, "lake-ice-evolve", 1)
    producer = Producer({"bootstrap.servers": source_broker.bootstrap})
    for i in range(5):
        producer.produce(topic, json.dumps({"id": i, "user": f"u{i}"}).encode(), partition=0)
    producer.flush(30)
    first = lake_job(source_broker.bootstrap, topic, tmp_path, schema_file(tmp_path))
    ingest_in_session(spark, first, 1)
    for i in range(5, 8):
        value = {
            "id": i,
            "user": f"u{i}",
            "coupon": f"C{i}",
            "items": [{"sku": "s", "qty": 1, "size": "L"}],
        }
        producer.produce(topic, json.dumps(value).encode(), partition=0)
    producer.flush(30)
    evolved = json.loads(json.dumps(JSON_SCHEMA))
    evolved["properties"]["coupon"] = {"type": "string"}
    evolved["properties"]["items"]["items"]["properties"]["size"] = {"type": "string"}
    second = lake_job(
        source_broker.bootstrap, topic, tmp_path, schema_file(tmp_path, evolved, "v2.json")
    )
    said = ingest_in_session(spark, second, 1)
    assert "schema evolved: added items[].size, coupon" in said, said
    assert table(tmp_path / "out").schema().find_field("coupon").optional
    found = sorted(rows(tmp_path / "out"), key=lambda r: r["id"])
    assert [r["id"] for r in found] == list(range(8))
    assert [r["coupon"] for r in found] == [None] * 5 + ["C5", "C6", "C7"]
    assert found[7]["items"] == [{"sku": "s", "qty": 1, "size": "L"}]
    assert not duplicates(found)


def test_an_unsafe_schema_change_is_refused_before_anything_is_written(
    source_broker: Broker, landed: Landed, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    shutil.copytree(landed.out, out)  # the landed tables, catalog and files, untouched
    changed = json.loads(json.dumps(JSON_SCHEMA))
    changed["properties"]["amount"] = {"type": "string"}
    del changed["properties"]["paid"]
    changed["properties"]["region"] = {"type": "string"}
    changed["required"] = ["id", "region"]
    schema = schema_file(tmp_path, changed, "v2.json")
    snaps = len(table(out).snapshots())
    files_before = sorted(out.rglob("*.parquet"))
    run = run_cli(
        "lake", "--format", "iceberg", "--bootstrap", source_broker.bootstrap,
        "--topics", landed.data.topic, "--schema", str(schema), "--out", str(out),
        "--checkpoint", str(tmp_path / "ck"), "--once",
    )  # fmt: skip
    assert run.code == 2, run.explain()
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith("kipside lake: error: table kipside.lake: the schema file asks"), line
    for problem in (
        "field 'paid' is not in the schema file",
        "field 'amount' would change type from double to string",
        "new field 'region' is required",
    ):
        assert problem in line, line
    assert len(table(out).snapshots()) == snaps
    assert sorted(out.rglob("*.parquet")) == files_before
    assert not (tmp_path / "ck").exists() or not list((tmp_path / "ck").rglob("*"))


def test_a_fresh_checkpoint_resumes_where_the_table_says(
    landed: Landed, source_broker: Broker, spark: Any
) -> None:
    """(Last: it adds records to the landed topic.) With the checkpoint gone, the source
    starts at the records table's offsets: only what came since is read and committed."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": source_broker.bootstrap})
    extra = [{"id": 10_000 + i, "user": "late"} for i in range(5)]
    for i, value in enumerate(extra):
        producer.produce(landed.data.topic, json.dumps(value).encode(), partition=i % PARTITIONS)
    producer.flush(30)
    job = lake_job(
        source_broker.bootstrap,
        landed.data.topic,
        landed.tmp,
        schema_file(landed.tmp),
        checkpoint=str(landed.tmp / "ck-fresh"),
    )
    from kipside.pipeline.lake.job import start_on

    query = start_on(spark, job, [(landed.data.topic, p) for p in range(PARTITIONS)], io.StringIO())
    assert query.awaitTermination(120)
    assert query.exception() is None
    read = sum(int(p.numInputRows) for p in query.recentProgress)
    assert read == len(extra), f"read {read} records: not resumed from the table's offsets"
    found = rows(landed.out)
    assert not duplicates(found)
    assert len(found) == len(landed.data.good) + len(extra)
