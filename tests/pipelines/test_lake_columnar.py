"""`kipside lake --format iceberg` on a columnar topic whose carriers have encrypted fields, on the
shared Spark session: without the key file the job stops and says where and what to do; given it,
a rerun lands every record once from the segments' typed columns, the ordinary batch's misfits in
the quarantine table, as pyiceberg reads them back."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from testkit.broker import Broker

from .columnar_topics import ENCRYPTED, key_file, produce_columnar
from .iceberg_kit import QUARANTINE, duplicates, ingest_in_session, lake_job, rows, schema_file

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_an_encrypted_columnar_topic_needs_the_key_file_then_lands_once(
    source_broker: Broker, spark: Any, tmp_path: Path
) -> None:
    schema = schema_file(tmp_path)
    columnar = produce_columnar(source_broker.bootstrap, schema, ENCRYPTED, misfits=True)
    job = lake_job(source_broker.bootstrap, columnar.topic, tmp_path, schema)
    with pytest.raises(Exception) as caught:
        ingest_in_session(spark, job, 1)
    said = str(caught.value)
    assert f"{columnar.topic}-0, the columnar carrier at offset 0 " in said, said
    assert "columns user, amount are encrypted with key 'lake-1'" in said, said
    assert "no key file was given" in said and "--columnar-key-file FILE" in said, said
    assert rows(tmp_path / "out") == []

    rerun = lake_job(
        source_broker.bootstrap,
        columnar.topic,
        tmp_path,
        schema,
        columnar_key_file=str(key_file(tmp_path)),
    )
    ingest_in_session(spark, rerun, 1)
    found = sorted(rows(tmp_path / "out"), key=lambda r: r["kafka_offset"])
    assert not duplicates(found)
    assert [r["kafka_offset"] for r in found] == [offset for offset, _, _ in columnar.good]
    for row, (_, value, stamp) in zip(found, columnar.good, strict=True):
        assert {k: row[k] for k in value} == value | {"at": dt.datetime.fromisoformat(value["at"])}
        assert row["kafka_timestamp"] == dt.datetime.fromtimestamp(stamp / 1000, dt.UTC)
        assert (row["kafka_partition"], row["topic"]) == (0, columnar.topic)
    bad = sorted(rows(tmp_path / "out", QUARANTINE), key=lambda r: r["kafka_offset"])
    assert [(r["kafka_offset"], r["value"]) for r in bad] == [(o, v) for o, v, _ in columnar.bad]
    for row, (_, _, why) in zip(bad, columnar.bad, strict=True):
        assert why in row["error"], (row, why)
