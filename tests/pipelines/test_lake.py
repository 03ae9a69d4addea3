"""`kipside lake` end to end: JSON records produced by real clients, Parquet read back with
pyarrow outside Spark, quarantine checked value by value, a columnar topic's carriers, bad
input (restarts and kills: test_lake_kill.py)."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
from conftest import fresh_topic
from testkit.broker import Broker
from testkit.ports import free_port

from .columnar_topics import ENCRYPTED, Columnar, key_file, produce_columnar
from .conftest import CliResult, run_cli
from .kafka_data import JSON_SCHEMA, JsonDataset, consume_all, produce_json_dataset

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PARTITIONS = 3


def _schema_file(tmp: Path) -> Path:
    path = tmp / "orders.json"
    path.write_text(json.dumps(JSON_SCHEMA, indent=2))
    return path


def _lake_args(
    bootstrap: str, topic: str, tmp: Path, schema: Path | None = None, *, also: str | None = None
) -> list[str]:
    """`lake` and its required options: the topic (and `also`), the schema (orders.json unless
    given), and the table and checkpoint under `tmp` (out/, ck/)."""
    topics = re.escape(topic) if also is None else f"{re.escape(topic)}|{re.escape(also)}"
    read = ["--bootstrap", bootstrap, "--topics", topics]
    write = ["--schema", str(schema or _schema_file(tmp)), "--out", str(tmp / "out")]
    return ["lake", *read, *write, "--checkpoint", str(tmp / "ck")]


def _lake(bootstrap: str, topic: str, tmp: Path, *extra: str, timeout: float = 240) -> CliResult:
    return run_cli(*_lake_args(bootstrap, topic, tmp), *extra, timeout=timeout)


def _table(path: Path) -> list[dict[str, Any]]:
    """The table as any reader outside Spark sees it (pyarrow, hive partitions)."""
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = (
        ds.dataset(str(path), format="parquet", partitioning="hive").to_table().to_pylist()
    )
    return rows


def _source_offsets(bootstrap: str, topic: str) -> dict[bytes | None, tuple[int, int]]:
    consumed = consume_all(bootstrap, topic, PARTITIONS)
    return {r.value: (p, off) for p, items in consumed.items() for off, r in items}


@dataclass(frozen=True)
class Ingested:
    data: JsonDataset
    columnar: Columnar
    run: CliResult
    out: Path
    offsets: dict[bytes | None, tuple[int, int]]

    def rows(self, topic: str) -> list[dict[str, Any]]:
        return [row for row in _table(self.out) if row["topic"] == topic]


@pytest.fixture(scope="module")
def ingested(source_broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ingested]:
    """One lake run over two topics: JSON records of every kind, and a columnar topic with
    encrypted fields (the key file given)."""
    topic = fresh_topic(source_broker.bootstrap, "lake-src", PARTITIONS)
    data = produce_json_dataset(source_broker.bootstrap, topic, PARTITIONS)
    tmp = tmp_path_factory.mktemp("lake")
    columnar = produce_columnar(source_broker.bootstrap, _schema_file(tmp), ENCRYPTED, misfits=True)
    args = _lake_args(source_broker.bootstrap, topic, tmp, also=columnar.topic)
    run = run_cli(*args, "--columnar-key-file", str(key_file(tmp)), "--once", timeout=240)
    assert run.code == 0, run.explain()
    offsets = _source_offsets(source_broker.bootstrap, topic)
    yield Ingested(data, columnar, run, tmp / "out", offsets)


def test_parquet_rows_equal_the_committed_input(ingested: Ingested) -> None:
    rows = ingested.rows(ingested.data.topic)
    assert len(rows) == len(ingested.data.good)
    by_id = {row["id"]: row for row in rows}
    assert len(by_id) == len(rows), "a record was written twice"
    for partition, value, timestamp in ingested.data.good:
        row = by_id[value["id"]]
        assert {k: row[k] for k in ("user", "amount", "paid")} == {
            k: value[k] for k in ("user", "amount", "paid")
        }
        assert row["items"] == value["items"]
        assert row["at"] == dt.datetime.fromisoformat(value["at"])
        assert row["kafka_partition"] == partition
        assert (row["kafka_partition"], row["kafka_offset"]) == ingested.offsets[
            json.dumps(value).encode()
        ]
        assert row["kafka_timestamp"] == dt.datetime.fromtimestamp(timestamp / 1000, dt.UTC)
        assert row["topic"] == ingested.data.topic
        assert str(row["date"]) == row["kafka_timestamp"].date().isoformat()
    aborted_ids = {json.loads(raw)["id"] for raw in ingested.data.aborted}
    assert not aborted_ids & set(by_id)


def test_malformed_values_land_in_quarantine_with_offset_and_reason(ingested: Ingested) -> None:
    rows = [r for r in _table(ingested.out / "_quarantine") if r["topic"] == ingested.data.topic]
    assert len(rows) == len(ingested.data.bad)
    by_offset = {(r["kafka_partition"], r["kafka_offset"]): r for r in rows}
    for partition, raw, reason in ingested.data.bad:
        where = ingested.offsets[raw] if raw is not None else None
        if where is None:  # the null value: find it by its missing bytes
            matches = [r for r in rows if r["value"] is None]
            assert len(matches) == 1
            row = matches[0]
        else:
            row = by_offset[where]
        assert row["kafka_partition"] == partition
        assert row["value"] == raw
        assert reason in row["error"], (reason, row["error"])
        assert row["topic"] == ingested.data.topic


def test_files_are_few_and_progress_is_reported(ingested: Ingested) -> None:
    files = list(ingested.out.rglob("*.parquet"))
    assert files and all(
        f.name.startswith("part-b") and f.name.endswith(".zstd.parquet") for f in files
    )
    table = f"topic={ingested.data.topic}"
    assert len([f for f in files if table in f.parts]) <= 2 * 2  # tasks x dates
    last = ingested.run.stderr.splitlines()[-1]
    good = len(ingested.data.good) + len(ingested.columnar.good)
    bad = len(ingested.data.bad) + len(ingested.columnar.bad)
    assert re.search(rf"kipside lake: done: {good:,} rows, {bad:,} quarantined, \d+ files", last), (
        last
    )
    assert "lag 0" in last


def test_a_schema_error_names_its_line(source_broker: Broker, tmp_path: Path) -> None:
    topic = fresh_topic(source_broker.bootstrap, "lake-schema", 1)
    schema = tmp_path / "bad.json"
    schema.write_text(
        '{\n  "type": "object",\n  "properties": {\n    "id": {"type": "decimal"}\n  }\n}\n'
    )
    run = run_cli(*_lake_args(source_broker.bootstrap, topic, tmp_path, schema))
    assert run.code == 2  # what the command's files said, as for a usage error
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith(
        f"kipside lake: error: {schema}:4: property 'id': type 'decimal' is not supported"
    ), line


def test_an_unreachable_broker_is_named(tmp_path: Path) -> None:
    port = free_port()
    run = _lake(f"127.0.0.1:{port}", "orders", tmp_path, "--timeout", "2", timeout=60)
    assert run.code == 1
    line = run.stderr.strip().splitlines()[-1]
    assert f"Kafka cluster at 127.0.0.1:{port}" in line and "gave up after" in line, line


def test_a_columnar_topic_lands_as_its_producers_records(ingested: Ingested) -> None:
    """Carriers (fields encrypted, read with the key file) next to ordinary batches: every
    record lands once, with the offset and the timestamp its producer's batch gave it, and the
    ordinary batch's values that don't fit go to quarantine, as for any topic."""
    columnar = ingested.columnar
    rows = sorted(ingested.rows(columnar.topic), key=lambda row: row["kafka_offset"])
    assert [row["kafka_offset"] for row in rows] == [offset for offset, _, _ in columnar.good]
    for row, (_, value, stamp) in zip(rows, columnar.good, strict=True):
        assert {k: row[k] for k in value} == value | {"at": dt.datetime.fromisoformat(value["at"])}
        assert row["kafka_timestamp"] == dt.datetime.fromtimestamp(stamp / 1000, dt.UTC)
        assert row["kafka_partition"] == 0
    quarantined = [r for r in _table(ingested.out / "_quarantine") if r["topic"] == columnar.topic]
    assert sorted(r["kafka_offset"] for r in quarantined) == [o for o, _, _ in columnar.bad]
    for row, (_, raw, why) in zip(
        sorted(quarantined, key=lambda r: r["kafka_offset"]), columnar.bad, strict=True
    ):
        assert row["value"] == raw and why in row["error"], (row, why)
