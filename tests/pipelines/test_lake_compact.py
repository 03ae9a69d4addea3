"""File sizes in the lake and `kipside lake compact`, without Spark or a broker: the plan's
decisions in memory (closed partitions, small files, how they are grouped), the writers' cut
at a size, and the compaction shell on real pyiceberg tables in a temporary folder, with an
ingestion micro-batch committed in the middle of a compaction and the other way round. Every
case reads the rows back."""

from __future__ import annotations

import datetime as dt
import io
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kipside.pipeline.lake import compact
from kipside.pipeline.lake.compact import CompactJob, compact_table, run_compact
from kipside.pipeline.lake.compaction import (
    FileEntry,
    RowsPerFile,
    plan_compaction,
    rows_to_target,
)
from kipside.pipeline.lake.iceberg import (
    BatchResult,
    CatalogSpec,
    IcebergTables,
    Target,
    TaskPlan,
    quarantine_arrow_schema,
    write_task,
)
from kipside.pipeline.lake.ledger import ConcurrentWriter
from kipside.proxy.cli import main

from .iceberg_kit import DATA_SCHEMA

MiB = 1 << 20
TARGET = 128 * MiB


def entry(name: str, size: int, day: str | None = "2026-11-20", topic: str = "orders") -> FileEntry:
    partition = (topic, day) if day is not None else (topic,)
    return FileEntry(f"/t/{topic}/{day}/{name}", size, size // 100, partition, day)


# The plan, in memory ---------------------------------------------------------------------------


def test_only_closed_partitions_are_compacted() -> None:
    files = [entry(f"a{i}", MiB, "2026-11-20") for i in range(3)]
    files += [entry(f"b{i}", MiB, "2026-11-21") for i in range(3)]  # the cut-off day: open
    files += [entry(f"c{i}", MiB, None) for i in range(3)]  # day unknown: never closed
    plan = plan_compaction(files, before="2026-11-21", target=TARGET)
    assert [r.partition for r in plan.rewrites] == [("orders", "2026-11-20")]
    assert sorted(f.path for f in plan.inputs) == sorted(f.path for f in files[:3])


def test_big_files_stay_and_small_ones_are_merged() -> None:
    big = entry("big", 100 * MiB)  # above three quarters of the target
    small = [entry(f"s{i}", 10 * MiB) for i in range(5)]
    plan = plan_compaction([big, *small], before="2026-11-21", target=TARGET)
    (rewrite,) = plan.rewrites
    assert set(rewrite.inputs) == set(small)
    assert rewrite.size == 50 * MiB and rewrite.rows == sum(f.rows for f in small)


def test_a_lone_small_file_is_left_alone() -> None:
    files = [entry("big", 120 * MiB), entry("small", MiB)]
    assert not plan_compaction(files, before="2026-11-21", target=TARGET)


def test_many_small_files_become_files_of_about_the_target() -> None:
    files = [entry(f"f{i:03d}", (1 + i % 7) * MiB) for i in range(150)]  # 600 MiB in all
    plan = plan_compaction(files, before="2026-11-21", target=TARGET)
    assert len(plan.rewrites) == 5  # round(600 / 128)
    assert sorted(f.path for f in plan.inputs) == sorted(f.path for f in files)
    for rewrite in plan.rewrites:
        assert 0.75 * TARGET <= rewrite.size <= 1.25 * TARGET, rewrite.size


def test_each_partition_is_planned_on_its_own() -> None:
    files = [entry(f"a{i}", MiB, "2026-11-19") for i in range(4)]
    files += [entry(f"b{i}", MiB, "2026-11-20", topic="payments") for i in range(4)]
    plan = plan_compaction(files, before="2026-11-21", target=TARGET)
    assert plan.partitions == 2
    for rewrite in plan.rewrites:
        assert {f.partition for f in rewrite.inputs} == {rewrite.partition}


def test_the_target_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        plan_compaction([], before="2026-11-21", target=0)


@pytest.mark.parametrize(
    ("size", "rows", "target", "available", "incoming", "expected"),
    [
        (0, 0, 1000, 500, 5000, 100),  # nothing written yet: by the Arrow size, 10 B a row
        (0, 0, 1000, 500, 500, 500),  # all of it fits
        (0, 0, 1000, 500, 0, 500),  # no size known at all
        (0, 0, 1, 500, 5000, 1),  # at least one row
        (100, 10, 1000, 500, 5000, 90),  # 10 bytes a row in the file, 900 bytes to go
        (100, 10, 1000, 50, 500, 50),  # fewer rows than that
        (1000, 10, 1000, 500, 5000, 1),  # at the target: at least one row
        (1200, 10, 1000, 500, 5000, 1),
    ],
)
def test_rows_to_target(
    size: int, rows: int, target: int, available: int, incoming: int, expected: int
) -> None:
    assert rows_to_target(size, rows, target, available, incoming) == expected


def test_rows_per_file_follow_the_bytes_per_row_seen() -> None:
    rows = RowsPerFile(target=64 * MiB, limit=1_000_000)
    assert rows() == 1_000_000  # nothing seen: the row limit
    rows.observe(10_000, 1_000_000)  # 100 bytes a row
    assert rows() == 64 * MiB // 100
    rows.observe(0, 0)
    assert rows() == 64 * MiB // 100
    rows.observe(10_000, 63_000_000)  # now 3,200 bytes a row on average
    assert rows() == 64 * MiB * 20_000 // 64_000_000
    tiny = RowsPerFile(target=1, limit=10)
    tiny.observe(10, 1000)
    assert tiny() == 1


# The compaction shell on real tables --------------------------------------------------------

VALUE = pa.struct([("id", pa.int64())])
SMALL_TARGET = 64 << 10
TODAY = dt.date(2026, 11, 28)


def _decoded(rows: list[tuple[int, int, bool]]) -> pa.RecordBatch:
    """(offset, day of November, good) per row of partition 0; id = offset."""
    return pa.RecordBatch.from_pydict(
        {
            "_value": pa.array([{"id": o} for o, _, _ in rows], VALUE),
            "kafka_partition": pa.array([0] * len(rows), pa.int32()),
            "kafka_offset": pa.array([o for o, _, _ in rows], pa.int64()),
            "kafka_timestamp": pa.array(
                [dt.datetime(2026, 11, d, 12, tzinfo=dt.UTC) for _, d, _ in rows],
                pa.timestamp("us", tz="UTC"),
            ),
            "topic": ["orders"] * len(rows),
            "date": pa.array([dt.date(2026, 11, d) for _, d, _ in rows], pa.date32()),
            "key": pa.array([None] * len(rows), pa.binary()),
            "value": pa.array([b"x" * (o % 40) for o, _, _ in rows], pa.binary()),
            "_error": pa.array([None if g else "bad" for _, _, g in rows], pa.string()),
        }
    )


class Lake:
    """The two tables in a folder, fed micro-batches the way IcebergBatchWriter does (the
    executors' write_task, then the quarantine commit, then the records commit)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.tables = IcebergTables(
            CatalogSpec.for_lake(str(out), None, {}),
            "kipside.lake",
            "kipside.lake_quarantine",
            "zstd",
        )
        self.tables.prepare(DATA_SCHEMA)
        self.next = 0
        self.batch = 0

    def plan(self, rows: list[tuple[int, bool]]) -> tuple[Any, ...]:
        """A micro-batch of `rows` (day of November, good), written but not committed."""
        data, data_before = self.tables.target("data")
        bad, bad_before = self.tables.target("quarantine")
        plan = TaskPlan(self.batch, data, bad, "zstd", 1_000_000, 128 << 20, "{}")
        batch = _decoded([(self.next + i, d, g) for i, (d, g) in enumerate(rows)])
        self.next += len(rows)
        result = BatchResult.gather(write_task(plan, iter([batch])).__next__().to_pylist())
        self.batch += 1
        return result, data_before, bad_before, self.batch - 1

    def commit(self, planned: tuple[Any, ...]) -> None:
        result, data_before, bad_before, batch = planned
        if result.quarantine:
            self.tables.commit("quarantine", result.quarantine, bad_before, result.seen, batch)
        self.tables.commit("data", result.data, data_before, result.seen, batch)

    def ingest(self, rows: list[tuple[int, bool]]) -> None:
        self.commit(self.plan(rows))

    def rows(self, name: str = "kipside.lake") -> list[tuple[int, int]]:
        found = self.tables.catalog.load_table(name).scan().to_arrow()
        return [
            (int(p), int(o))
            for p, o in zip(
                found["kafka_partition"].to_pylist(), found["kafka_offset"].to_pylist(), strict=True
            )
        ]

    def files(self, name: str = "kipside.lake") -> list[Any]:
        table = self.tables.catalog.load_table(name)
        return [task.file for task in table.scan().plan_files()]


def _once_each(found: list[tuple[int, int]], expected: set[tuple[int, int]]) -> None:
    assert not [k for k, n in Counter(found).items() if n > 1], "a row is there twice"
    assert set(found) == expected


def _feed(lake: Lake, batches: int, days: list[int]) -> dict[int, bool]:
    """`batches` micro-batches of rows over `days`, one row in nine malformed; returns each
    offset's kind (good or not)."""
    kinds: dict[int, bool] = {}
    for _ in range(batches):
        rows = [(days[i % len(days)], (lake.next + i) % 9 != 4) for i in range(30)]
        for i, (_, good) in enumerate(rows):
            kinds[lake.next + i] = good
        lake.ingest(rows)
    return kinds


def _check_sizes(files: list[Any], target: int, before: str) -> None:
    """In every closed partition: at most one file under target/4 per target of data."""
    by_partition: dict[str, list[int]] = {}
    for f in files:
        key = str(f.partition)
        by_partition.setdefault(key, []).append(int(f.file_size_in_bytes))
    for key, sizes in by_partition.items():
        small = [s for s in sizes if s < target / 4]
        allowed = max(1, math.ceil(sum(sizes) / target))
        assert len(small) <= allowed, (key, sizes)


def test_compaction_rewrites_closed_days_in_one_snapshot_per_table(tmp_path: Path) -> None:
    lake = Lake(tmp_path / "out")
    kinds = _feed(lake, 12, [25, 26, 28])  # the 28th is today: left open
    good = {(0, o) for o, g in kinds.items() if g}
    bad = {(0, o) for o, g in kinds.items() if not g}
    before = {n: len(lake.files(n)) for n in ("kipside.lake", "kipside.lake_quarantine")}
    snaps = len(lake.tables.table("data").snapshots())
    said, err = io.StringIO(), io.StringIO()
    job = CompactJob(str(tmp_path / "out"), format="iceberg", target_file_size=SMALL_TARGET)
    assert run_compact(job, said, err, today=TODAY) == 0, err.getvalue()
    lines = said.getvalue().splitlines()
    assert lines[0].startswith("kipside lake compact: kipside.lake: 2 partitions, 24 files -> ")
    assert ", snapshot " in lines[0] and lines[1].startswith(
        "kipside lake compact: kipside.lake_quarantine: 1 partition, "
    )
    assert err.getvalue() == ""
    _once_each(lake.rows(), good)
    _once_each(lake.rows("kipside.lake_quarantine"), bad)
    table = lake.tables.table("data")
    assert len(table.snapshots()) == snaps + 1
    summary = table.current_snapshot().summary
    assert summary["kipside.compacted-before"] == "2026-11-28"
    assert "kipside.kafka-offsets" not in summary.additional_properties
    after = lake.files()
    closed = [f for f in after if "2026-11-28" not in f.file_path]
    open_ = [f for f in after if "2026-11-28" in f.file_path]
    assert len(open_) == 12, "today's partition was compacted"
    assert len(closed) == 2 and len(after) < before["kipside.lake"]
    _check_sizes(closed, SMALL_TARGET, "2026-11-28")
    assert len(lake.files("kipside.lake_quarantine")) < before["kipside.lake_quarantine"]
    # The offsets are still the ingestion's: the next micro-batch goes on from them.
    assert lake.tables.offsets("data").next == {("orders", 0): lake.next}
    lake.ingest([(25, True)])
    _once_each(lake.rows(), good | {(0, lake.next - 1)})
    # A second run merges the late file into its partition's (still small) file; a third has
    # nothing left to do.
    said = io.StringIO()
    assert run_compact(job, said, err, today=TODAY) == 0
    assert said.getvalue().startswith(
        "kipside lake compact: kipside.lake: 1 partition, 2 files -> 1 file ("
    )
    assert said.getvalue().endswith(
        "kipside lake compact: kipside.lake_quarantine: nothing to compact\n"
    )
    _once_each(lake.rows(), good | {(0, lake.next - 1)})
    said = io.StringIO()
    assert run_compact(job, said, err, today=TODAY) == 0
    assert said.getvalue() == (
        "kipside lake compact: kipside.lake: nothing to compact\n"
        "kipside lake compact: kipside.lake_quarantine: nothing to compact\n"
    )


def test_an_ingestion_commit_during_a_compaction_keeps_its_late_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A micro-batch lands a late record in a closed partition after the compaction planned
    and wrote its files, before it commits: the compaction's commit fails, is tried again on
    the new table with the same files, and the late record stays."""
    lake = Lake(tmp_path / "out")
    kinds = _feed(lake, 8, [25, 26])
    real = compact._commit
    calls: list[int] = []

    def commit_after_an_ingestion(*args: Any) -> int:
        if not calls:
            lake.ingest([(25, True), (26, True), (26, False)])
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(compact, "_commit", commit_after_an_ingestion)
    writes: list[int] = []
    real_write = compact._write

    def counted_write(*args: Any) -> list[Any]:
        writes.append(1)
        return real_write(*args)

    monkeypatch.setattr(compact, "_write", counted_write)
    catalog = lake.tables.catalog
    done = compact_table(catalog, "kipside.lake", "2026-11-28", SMALL_TARGET)
    assert done.files_in == 16 and done.snapshot is not None
    assert len(calls) == 2 and len(writes) == 1, "retried by writing everything again"
    good = {(0, o) for o, g in kinds.items() if g} | {(0, lake.next - 3), (0, lake.next - 2)}
    _once_each(lake.rows(), good)
    late = [f for f in lake.files() if f.record_count in (1, 2) and "/b" in f.file_path]
    assert len(late) == 2, "the late micro-batch's files were replaced"
    # The ingestion still finds its own offsets and goes on.
    assert lake.tables.offsets("data").next == {("orders", 0): lake.next}
    lake.ingest([(26, True)])
    assert (0, lake.next - 1) in set(lake.rows())


def test_a_compaction_between_an_ingestions_planning_and_commit_is_no_concurrent_writer(
    tmp_path: Path,
) -> None:
    lake = Lake(tmp_path / "out")
    kinds = _feed(lake, 6, [25])
    planned = lake.plan([(25, True), (27, True)])
    done = compact_table(lake.tables.catalog, "kipside.lake", "2026-11-28", SMALL_TARGET)
    assert done.snapshot is not None
    lake.commit(planned)  # no ConcurrentWriter: the compaction moved no offsets
    good = {(0, o) for o, g in kinds.items() if g} | {(0, lake.next - 2), (0, lake.next - 1)}
    _once_each(lake.rows(), good)
    assert lake.tables.offsets("data").next == {("orders", 0): lake.next}


def test_a_compaction_committed_under_an_ingestions_commit_is_rebased_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compaction commits after the ingestion's commit loaded the table and checked its
    offsets, before its snapshot lands: pyiceberg's commit fails, is refreshed and lands the
    micro-batch's files on top of the compaction, with the micro-batch's offsets."""
    lake = Lake(tmp_path / "out")
    kinds = _feed(lake, 6, [25, 26])
    planned = lake.plan([(25, True), (26, True)])
    real = lake.tables.table
    compactions: list[Any] = []

    def table_then_compaction(kind: str) -> Any:
        loaded = real(kind)
        if kind == "data" and not compactions:
            compactions.append(None)
            compactions[0] = compact_table(
                lake.tables.catalog, "kipside.lake", "2026-11-28", SMALL_TARGET
            )
        return loaded

    monkeypatch.setattr(lake.tables, "table", table_then_compaction)
    lake.commit(planned)
    assert compactions[0].snapshot is not None
    table = real("data")
    snapshot = table.current_snapshot()
    assert snapshot.parent_snapshot_id == compactions[0].snapshot, "not committed on top"
    good = {(0, o) for o, g in kinds.items() if g} | {(0, lake.next - 2), (0, lake.next - 1)}
    _once_each(lake.rows(), good)
    assert lake.tables.offsets("data").next == {("orders", 0): lake.next}


def test_another_ingestion_committed_under_a_commit_stops_it_instead_of_duplicating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second job commits the same Kafka offsets after the first job's commit loaded the
    table and checked its offsets: the first job's commit fails, and its retry finds the offsets
    moved and stops, instead of being rebased onto the other job's rows."""
    first = Lake(tmp_path / "out")
    kinds = _feed(first, 2, [25])
    start = first.next
    planned = first.plan([(26, True), (26, True)])
    second = Lake(tmp_path / "out")
    second.next = start  # the same records, read by the other job
    real = first.tables.table
    raced: list[bool] = []

    def table_then_other_job(kind: str) -> Any:
        loaded = real(kind)
        if kind == "data" and not raced:
            raced.append(True)
            second.ingest([(26, True), (26, True)])
        return loaded

    monkeypatch.setattr(first.tables, "table", table_then_other_job)
    with pytest.raises(ConcurrentWriter, match="another job is ingesting into it"):
        first.commit(planned)
    good = {(0, o) for o, g in kinds.items() if g} | {(0, start), (0, start + 1)}
    _once_each(first.rows(), good)


def test_files_replaced_by_someone_else_meanwhile_are_planned_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two compactions at once: the second to commit finds its files gone, plans again on the
    table as it is, and removes the files it wrote for nothing."""
    lake = Lake(tmp_path / "out")
    kinds = _feed(lake, 8, [25])
    real = compact._commit
    other: list[Any] = []

    def another_compaction_first(*args: Any) -> int:
        if not other:
            other.append(None)  # the other compaction's own commit goes straight through
            other[0] = compact_table(
                lake.tables.catalog, "kipside.lake", "2026-11-28", SMALL_TARGET
            )
        return real(*args)

    monkeypatch.setattr(compact, "_commit", another_compaction_first)
    done = compact_table(lake.tables.catalog, "kipside.lake", "2026-11-28", SMALL_TARGET)
    assert other[0].snapshot is not None
    assert done.snapshot is None, "the files it read were already replaced"
    _once_each(lake.rows(), {(0, o) for o, g in kinds.items() if g})
    on_disk = {f"file://{p}" for p in (tmp_path / "out").rglob("c-*.parquet")}
    assert on_disk == {f.file_path for f in lake.files() if "/c-" in f.file_path}


def test_the_iceberg_writer_cuts_files_at_the_target_size(tmp_path: Path) -> None:
    """write_task (the executors' side) with a small target: every file but the last of a
    partition reaches it, none overshoots by much."""
    target = 16 << 10
    rows = [(o, 25, True) for o in range(20_000)]
    plan = TaskPlan(
        batch_id=1,
        data=Target((tmp_path / "data").as_uri(), "{}", DATA_SCHEMA),
        quarantine=Target((tmp_path / "bad").as_uri(), "{}", quarantine_arrow_schema()),
        compression="zstd",
        max_records_per_file=1_000_000,
        target_file_size=target,
        schema_json="{}",
    )
    batches = [_decoded(rows[i : i + 2000]) for i in range(0, len(rows), 2000)]
    (result,) = list(write_task(plan, iter(batches)))
    files = [r for r in result.to_pylist() if r["kind"] == "data"]
    assert len(files) > 3
    assert sum(r["rows"] for r in files) == len(rows)
    sizes = [Path(r["path"].removeprefix("file://")).stat().st_size for r in files]
    assert [r["bytes"] for r in files] == sizes
    for size in sizes[:-1]:
        assert target <= size <= 1.5 * target, sizes
    read = sum(pq.read_table(r["path"].removeprefix("file://")).num_rows for r in files)
    assert read == len(rows)


# The command's errors --------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_plain_parquet_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "lake", "compact", "--out", str(tmp_path))
    assert code == 2 and out == ""
    assert err == (
        f"kipside lake compact: error: --out {tmp_path}: plain Parquet has no snapshots, so "
        "files can't be replaced while readers and the ingestion see the folder; compaction "
        "needs an Iceberg lake (--format iceberg)\n"
    )


def test_a_folder_without_a_catalog_is_not_an_iceberg_lake(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, "lake", "compact", "--format", "iceberg", "--out", str(tmp_path))
    assert code == 2
    assert err == (
        f"kipside lake compact: error: --out {tmp_path}: no Iceberg catalog at "
        f"{tmp_path}/catalog.db: compact works on the tables of `kipside lake --format "
        "iceberg` (give its --out, or its --catalog)\n"
    )
    assert not (tmp_path / "catalog.db").exists(), "a catalog was made"


def test_a_missing_table_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    Lake(tmp_path)
    argv = ("lake", "compact", "--format", "iceberg", "--out", str(tmp_path), "--table", "x.y")
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("kipside lake compact: error: tables x.y and x.y_quarantine are not in ")
    assert "(tables there: kipside.lake, kipside.lake_quarantine)" in err


def test_an_unreachable_catalog_is_an_error_without_a_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ("lake", "compact", "--format", "iceberg", "--out", str(tmp_path))
    code, _, err = run(capsys, *argv, "--catalog", "http://127.0.0.1:9/catalog")
    assert code == 1
    assert err.startswith(
        "kipside lake compact: error: cannot open the Iceberg catalog http://127.0.0.1:9/catalog"
    )
    assert "Traceback" not in err and err.endswith("(check --catalog and --catalog-property)\n")


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("--target-file-size", "0"), "argument --target-file-size: '0' must be positive"),
        (("--target-file-size", "big"), "'big' is not a size like 268435456, 256M or 1G"),
        (("--before", "yesterday"), "argument --before: 'yesterday' is not a date"),
    ],
)
def test_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], fragment: str
) -> None:
    code, _, err = run(capsys, "lake", "compact", "--format", "iceberg", "--out", "o", *argv)
    assert code == 2 and fragment in err, err


def test_help_is_tidy(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "lake", "compact", "--help")
    assert code == 0
    assert out.startswith("usage: kipside lake compact --format iceberg --out DIR [options]")
    for option in ("--out", "--format", "--catalog", "--catalog-property", "--table",
                   "--quarantine", "--target-file-size", "--before"):  # fmt: skip
        assert option in out, option
    assert "--checkpoint" not in out and "--bootstrap" not in out


def test_an_sqlite_file_that_is_no_catalog_is_left_as_it_is(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import sqlite3

    with sqlite3.connect(tmp_path / "catalog.db") as db:
        db.execute("CREATE TABLE notes (text)")
    code, _, err = run(capsys, "lake", "compact", "--format", "iceberg", "--out", str(tmp_path))
    assert code == 1 and "Traceback" not in err
    assert err.startswith(
        f"kipside lake compact: error: the Iceberg catalog sqlite:///{tmp_path}/catalog.db can't "
        "be read: (sqlite3.OperationalError) no such table: iceberg_tables"
    ), err
    with sqlite3.connect(tmp_path / "catalog.db") as db:
        tables = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    assert tables == [("notes",)], "compact made catalog tables in a file that had none"
