"""Tests for pipeline.lake.commit: a micro-batch's staged Parquet files published exactly once,
and what an interrupted attempt left behind removed before the batch is written again.

Staged files are written here with pyarrow, named and laid out as Spark's writer does; the
publisher moves them through Hadoop's FileSystem, so it needs the test session's JVM. Results
are read back the way any reader outside Spark reads the lake: pyarrow, hive partitions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from kipside.pipeline.lake.commit import BatchPublisher, Published

pytestmark = pytest.mark.spark

A1 = "topic=a/date=2026-01-01"
A2 = "topic=a/date=2026-01-02"
B1 = "topic=b/date=2026-01-01"
SPARK_NAME = "part-{n:05d}-5e0f0c6e-3f4c-4b7b-9d1c-000000000000.c000.snappy.parquet"


@pytest.fixture
def publisher(spark: Any, tmp_path: Path) -> BatchPublisher:
    return BatchPublisher(spark, f"{tmp_path}/out/", str(tmp_path / "quarantine"))


def write_parquet(path: Path, ids: list[int]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), str(path))
    return path.stat().st_size


def stage(publisher: BatchPublisher, batch_id: int, files: dict[str, list[int]]) -> int:
    """Write `files` (path under the batch's staging dir -> ids) as Spark would; their bytes."""
    total = 0
    for relative, ids in files.items():
        kind, _, rest = relative.partition("/")
        total += write_parquet(Path(publisher.staging(batch_id, kind)) / rest, ids)
    # What Spark's writer leaves next to the data, which is no part of the table.
    for kind in ("data", "quarantine"):
        root = Path(publisher.staging(batch_id, kind))
        if root.exists():
            (root / "_SUCCESS").write_text("")
    return total


def table(root: Path) -> list[tuple[str, str, int]]:
    """(topic, date, id) for every row under root, as pyarrow sees the hive-partitioned table."""
    rows = ds.dataset(str(root), format="parquet", partitioning="hive").to_table().to_pylist()
    return sorted((str(r["topic"]), str(r["date"]), r["id"]) for r in rows)


def ids(root: Path) -> list[int]:
    return sorted(ds.dataset(str(root), format="parquet").to_table().column("id").to_pylist())


def files_under(root: Path) -> list[str]:
    """Every visible file under root (not Hadoop's .crc files), relative."""
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    )


def test_publish_moves_the_staged_files_into_place(
    publisher: BatchPublisher, tmp_path: Path
) -> None:
    out, quarantine = tmp_path / "out", tmp_path / "quarantine"
    size = stage(
        publisher,
        7,
        {
            f"data/{A1}/{SPARK_NAME.format(n=0)}": [1, 2],
            f"data/{A1}/{SPARK_NAME.format(n=1)}": [3],
            f"data/{B1}/{SPARK_NAME.format(n=0)}": [4],
            f"data/{A2}/{SPARK_NAME.format(n=1)}": [5],
            "quarantine/part-00000-5e0f0c6e-c000.snappy.parquet": [6],
        },
    )
    assert not publisher.done(7)

    published = publisher.publish(7)

    expected_data = [
        f"{A1}/part-b000000000007-00000.c000.snappy.parquet",
        f"{A1}/part-b000000000007-00001.c000.snappy.parquet",
        f"{A2}/part-b000000000007-00002.c000.snappy.parquet",
        f"{B1}/part-b000000000007-00003.c000.snappy.parquet",
    ]
    expected_quarantine = ["part-b000000000007-00000.snappy.parquet"]
    assert published == Published(
        [f"{out}/{f}" for f in expected_data] + [f"{quarantine}/{f}" for f in expected_quarantine],
        size,
    )
    assert files_under(out) == sorted(["_kipside/commits/7", *expected_data])
    assert files_under(quarantine) == expected_quarantine
    assert table(out) == [
        ("a", "2026-01-01", 1),
        ("a", "2026-01-01", 2),
        ("a", "2026-01-01", 3),
        ("a", "2026-01-02", 5),
        ("b", "2026-01-01", 4),
    ]
    assert ids(quarantine) == [6]
    assert publisher.done(7)
    assert not publisher.done(8)
    assert not (out / "_kipside" / "staging" / "7").exists()
    assert not (out / "_kipside" / "manifests" / "7").exists()


def test_a_batch_with_nothing_to_publish_is_still_done(
    publisher: BatchPublisher, tmp_path: Path
) -> None:
    assert publisher.publish(0) == Published([], 0)
    assert publisher.done(0)
    assert files_under(tmp_path / "out") == ["_kipside/commits/0"]
    assert not (tmp_path / "quarantine").exists()


def test_clean_undoes_an_interrupted_attempt_and_nothing_else(
    publisher: BatchPublisher, tmp_path: Path
) -> None:
    out, quarantine = tmp_path / "out", tmp_path / "quarantine"
    stage(publisher, 7, {f"data/{A1}/{SPARK_NAME.format(n=0)}": [1], "quarantine/q.parquet": [2]})
    publisher.publish(7)
    before = files_under(out) + files_under(quarantine)

    # Batch 8 crashed while moving: its manifest lists three final paths, the first two were
    # moved (one of them into quarantine), the third is still staged.
    moved = f"{out}/{A1}/part-b000000000008-00000.c000.snappy.parquet"
    moved_quarantine = f"{quarantine}/part-b000000000008-00000.snappy.parquet"
    not_moved = f"{out}/{B1}/part-b000000000008-00001.c000.snappy.parquet"
    write_parquet(Path(moved), [10])
    write_parquet(Path(moved_quarantine), [11])
    stage(publisher, 8, {f"data/{B1}/{SPARK_NAME.format(n=0)}": [12]})
    manifest = Path(publisher.meta) / "manifests" / "8"
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(f"{moved}\n{moved_quarantine}\n{not_moved}\n")
    assert ids(out) == [1, 10]

    publisher.clean(8)

    assert files_under(out) + files_under(quarantine) == before
    assert not manifest.exists()
    assert not Path(publisher.staging(8, "data")).parent.exists()
    assert publisher.done(7) and not publisher.done(8)
    assert table(out) == [("a", "2026-01-01", 1)]

    # The batch written again lands once.
    stage(
        publisher,
        8,
        {f"data/{B1}/{SPARK_NAME.format(n=0)}": [10, 12], "quarantine/q.parquet": [11]},
    )
    publisher.publish(8)
    assert table(out) == [("a", "2026-01-01", 1), ("b", "2026-01-01", 10), ("b", "2026-01-01", 12)]
    assert ids(quarantine) == [2, 11]


def test_tidy_removes_what_a_crash_after_the_commit_marker_left_and_keeps_the_batch(
    publisher: BatchPublisher, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    stage(publisher, 5, {f"data/{A1}/{SPARK_NAME.format(n=0)}": [1], f"data/{B1}/x.parquet": [2]})
    published = publisher.publish(5)
    # Killed after the marker, before the clean-up: the staging directory and manifest remain.
    manifest = Path(publisher.meta) / "manifests" / "5"
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text("\n".join(published.files) + "\n")
    (Path(publisher.staging(5, "data")) / "_SUCCESS").parent.mkdir(parents=True, exist_ok=True)
    (Path(publisher.staging(5, "data")) / "_SUCCESS").write_text("")

    publisher.tidy(5)

    assert publisher.done(5)
    assert not manifest.exists()
    assert not Path(publisher.staging(5, "data")).parent.exists()
    assert table(out) == [("a", "2026-01-01", 1), ("b", "2026-01-01", 2)]


def test_clean_without_leftovers_changes_nothing(publisher: BatchPublisher, tmp_path: Path) -> None:
    stage(publisher, 3, {f"data/{A1}/{SPARK_NAME.format(n=0)}": [1]})
    publisher.publish(3)
    before = files_under(tmp_path)
    publisher.clean(4)
    publisher.clean(3)  # published batches keep their files: only a manifest names files
    assert files_under(tmp_path) == before


def test_old_commit_markers_are_dropped(publisher: BatchPublisher) -> None:
    for batch_id in (4, 5, 6):
        publisher.publish(batch_id)
    publisher.publish(105)
    assert [publisher.done(b) for b in (4, 5, 6, 105)] == [True, False, True, True]
    publisher.publish(106)
    assert [publisher.done(b) for b in (4, 5, 6, 105, 106)] == [True, False, False, True, True]
