"""`kipside lake compact`: the small files of an Iceberg lake's closed partitions rewritten
into files of about the target size, in one snapshot per table, beside a running `kipside lake`.

What it must never do: lose or duplicate a row, or need a JVM. It runs in one Python process
with pyarrow and pyiceberg; pipeline.lake.compaction decides which files become which, this
module lists, reads, writes and commits:

- each table's snapshot (pyiceberg's overwrite) deletes exactly the data files the plan read,
  named one by one, and adds the files written from them; a late record that the ingestion
  commits into a closed partition meanwhile is in a file the plan does not name, and stays;
- a commit that loses the race to another writer (the ingestion committing a micro-batch) is
  tried again on the refreshed table with the same new files while every file it replaces is
  still there, else planned again, a bounded number of times. pyiceberg checks, on the table
  as it is at the commit, that the files to delete are still live; a file deleted twice or a
  row added twice cannot pass;
- the snapshot carries no Kafka offsets: the lake reads them from the newest snapshot that
  has them (pipeline.lake.ledger), so a compaction between an ingestion's planning and its
  commit changes nothing it checks, and the ingestion's own commit, an append, is rebased by
  pyiceberg on top of the compaction.

A crash before the commit leaves new files no snapshot names (readers never see them; Iceberg's
orphan file clean-up removes them), and the table as it was.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TextIO

import pyarrow as pa

from .compaction import CompactionPlan, FileEntry, plan_compaction
from .iceberg import DEFAULT_TABLE, DEFAULT_TARGET_FILE_SIZE, CatalogSpec, ParquetFile

__all__ = [
    "COMPACTED_KEY",
    "CompactError",
    "CompactJob",
    "Compacted",
    "compact_table",
    "run_compact",
]

COMPACTED_KEY: Final = "kipside.compacted-before"  # the snapshot summary's mark of a compaction
_ATTEMPTS: Final = 8
_DATA_PATH: Final = "write.data.path"
_CODEC: Final = "write.parquet.compression-codec"
_ROW_GROUP_ROWS: Final = 1 << 20  # as pyarrow's default row group
_ROW_GROUP_BYTES: Final = 64 << 20  # Arrow bytes buffered before a row group is written
_COMMAND: Final = "kipside lake compact"


@dataclass(frozen=True)
class CompactJob:
    out: str
    format: str = "parquet"
    catalog: str | None = None
    catalog_properties: Mapping[str, str] = field(default_factory=dict)
    table: str = DEFAULT_TABLE
    quarantine: str | None = None
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    before: str | None = None  # YYYY-MM-DD; None: the current UTC day

    @property
    def quarantine_table(self) -> str:
        return self.quarantine or f"{self.table}_quarantine"


class CompactError(Exception):
    """Why compaction could not run, as the user can act on it; `status` is the exit status."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Compacted:
    """What one table's compaction did."""

    table: str
    partitions: int = 0
    files_in: int = 0
    files_out: int = 0
    bytes_out: int = 0
    snapshot: int | None = None

    def describe(self) -> str:
        if self.snapshot is None:
            return f"{self.table}: nothing to compact"
        return (
            f"{self.table}: {_count(self.partitions, 'partition')}, "
            f"{_count(self.files_in, 'file')} -> {_count(self.files_out, 'file')} "
            f"({self.bytes_out / 1e6:,.1f} MB), snapshot {self.snapshot}"
        )


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


@dataclass(frozen=True)
class _Live:
    entry: FileEntry
    task: Any  # pyiceberg's FileScanTask
    folder: str  # the partition's folder under the data location: topic=T/date=D


_EPOCH: Final = dt.date(1970, 1, 1)


def _day_of(micros: int) -> str:
    return (_EPOCH + dt.timedelta(microseconds=micros)).isoformat()


def _partition_text(value: Any, kind: Any) -> str:
    """A partition value as the lake names its folders (a date as YYYY-MM-DD)."""
    from pyiceberg.types import DateType

    if isinstance(kind, DateType) and isinstance(value, int):
        return (_EPOCH + dt.timedelta(days=value)).isoformat()
    return str(value)


def _live_files(table: Any) -> dict[str, _Live]:
    """The current snapshot's data files by path. The day of a records table's file is its
    `date` partition; of a quarantine file, the day of its newest `kafka_timestamp`."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import TimestamptzType

    schema = table.schema()
    stamp = schema.find_field("kafka_timestamp").field_id
    specs = table.specs()
    live: dict[str, _Live] = {}
    for task in table.scan().plan_files():
        if task.delete_files:
            continue  # the lake writes no delete files; leave such a file as it is
        data = task.file
        spec = specs[data.spec_id]
        names = [f.name for f in spec.fields]
        kinds = [f.field_type for f in spec.partition_type(schema).fields]
        values = tuple(_partition_text(data.partition[i], kinds[i]) for i in range(len(names)))
        day: str | None = dict(zip(names, values, strict=True)).get("date")
        if "date" not in names and (upper := (data.upper_bounds or {}).get(stamp)) is not None:
            day = _day_of(int(from_bytes(TimestamptzType(), upper)))
        entry = FileEntry(
            data.file_path, int(data.file_size_in_bytes), int(data.record_count), values, day
        )
        folder = "/".join(f"{k}={v}" for k, v in zip(names, values, strict=True))
        live[data.file_path] = _Live(entry, task, folder)
    return live


def _write(table: Any, plan: CompactionPlan, live: dict[str, _Live]) -> list[Any]:
    """Each rewrite's rows as one new Parquet file in its partition's folder; returns their
    pyiceberg DataFiles (partition and statistics read back from the files)."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan, parquet_file_to_data_file

    schema = table.schema()
    arrow = schema.as_arrow()
    properties = table.metadata.properties
    location = str(properties.get(_DATA_PATH, f"{table.location()}/data"))
    codec = str(properties.get(_CODEC, "zstd"))
    run = uuid.uuid4().hex
    written: list[str] = []
    try:
        for n, rewrite in enumerate(plan.rewrites):
            folder = live[rewrite.inputs[0].path].folder
            file = ParquetFile(location, f"{folder}/c-{run}-{n:05d}.parquet", arrow, codec)
            written.append(file.path)
            scan = ArrowScan(table.metadata, table.io, schema, AlwaysTrue())
            buffered: list[pa.RecordBatch] = []
            for batch in scan.to_record_batches([live[f.path].task for f in rewrite.inputs]):
                buffered.append(batch)
                if sum(b.num_rows for b in buffered) >= _ROW_GROUP_ROWS or (
                    sum(b.nbytes for b in buffered) >= _ROW_GROUP_BYTES
                ):
                    file.write(pa.Table.from_batches(buffered).cast(arrow))
                    buffered = []
            if buffered:
                file.write(pa.Table.from_batches(buffered).cast(arrow))
            file.close()
            if file.rows != rewrite.rows:
                raise CompactError(
                    f"table {table.name()}: {rewrite.rows} rows in {len(rewrite.inputs)} files "
                    f"of partition {'/'.join(rewrite.partition)} read back as {file.rows}; "
                    "nothing was changed",
                    status=1,
                )
        return [parquet_file_to_data_file(table.io, table.metadata, path) for path in written]
    except BaseException:
        _delete(table.io, written)
        raise


def _delete(io: Any, paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):  # else an orphan file: no snapshot names it
            io.delete(path)


def _commit(
    table: Any, plan: CompactionPlan, live: dict[str, _Live], added: list[Any], before: str
) -> int:
    """One snapshot: the plan's input files out, `added` in."""
    with (
        table.transaction() as tx,
        tx.update_snapshot(snapshot_properties={COMPACTED_KEY: before}).overwrite() as rewrite,
    ):
        for entry in plan.inputs:
            rewrite.delete_data_file(live[entry.path].task.file)
        for data_file in added:
            rewrite.append_data_file(data_file)
    return int(rewrite.snapshot_id)


def compact_table(catalog: Any, name: str, before: str, target: int) -> Compacted:
    """Compact one table's closed partitions (days before `before`) in one snapshot."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    plan: CompactionPlan | None = None
    added: list[Any] = []
    table = catalog.load_table(name)
    for _attempt in range(_ATTEMPTS):
        live = _live_files(table)
        if plan is None or any(entry.path not in live for entry in plan.inputs):
            _delete(table.io, [d.file_path for d in added])  # replaced by someone else
            added = []
            plan = plan_compaction([v.entry for v in live.values()], before=before, target=target)
            if not plan:
                return Compacted(name)
            added = _write(table, plan, live)
        try:
            snapshot = _commit(table, plan, live, added, before)
        except (CommitFailedException, ValidationException):
            table = catalog.load_table(name)  # another writer committed first
            continue
        return Compacted(
            name,
            plan.partitions,
            len(plan.inputs),
            len(added),
            sum(int(d.file_size_in_bytes) for d in added),
            snapshot,
        )
    _delete(table.io, [d.file_path for d in added])
    raise CompactError(
        f"table {name}: {_ATTEMPTS} commits in a row lost the race to other writers; nothing "
        "was changed: run it again",
        status=1,
    )


def _open_catalog(job: CompactJob) -> Any:
    if job.format != "iceberg":
        hint = ""
        if os.path.exists(os.path.join(job.out, "catalog.db")):
            hint = f" ({job.out} has an Iceberg catalog: add --format iceberg)"
        raise CompactError(
            f"--out {job.out}: plain Parquet has no snapshots, so files can't be replaced "
            "while readers and the ingestion see the folder; compaction needs an Iceberg lake "
            f"(--format iceberg){hint}"
        )
    try:
        spec = CatalogSpec.for_lake(job.out, job.catalog, job.catalog_properties)
    except ValueError as exc:
        raise CompactError(str(exc)) from None
    if spec.uri.startswith("sqlite:///"):
        path = spec.uri.removeprefix("sqlite:///")
        if not os.path.isfile(path):
            where = "--out " + job.out if job.catalog is None else "--catalog " + job.catalog
            raise CompactError(
                f"{where}: no Iceberg catalog at {path}: compact works on the tables of "
                "`kipside lake --format iceberg` (give its --out, or its --catalog)"
            )
    if spec.kind == "sql":  # look, never make: an SQL catalog without its tables is not a lake's
        spec = CatalogSpec(
            spec.uri, spec.warehouse, {"init_catalog_tables": "false", **spec.properties}
        )
    try:
        return spec.open()
    except Exception as exc:  # any client error of any catalog type
        raise CompactError(
            f"cannot open the Iceberg catalog {spec.uri}: {_first_line(exc)} (check --catalog and "
            "--catalog-property)",
            status=1,
        ) from None


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _check_tables(catalog: Any, names: list[str], uri: str) -> None:
    try:
        missing = [name for name in names if not catalog.table_exists(name)]
    except Exception as exc:  # e.g. an SQLite file without the catalog's tables
        raise CompactError(
            f"the Iceberg catalog {uri} can't be read: {_first_line(exc)} (is it the catalog of a "
            "`kipside lake --format iceberg`?)",
            status=1,
        ) from None
    if not missing:
        return
    try:
        there = sorted(
            ".".join(identifier)
            for namespace in catalog.list_namespaces()
            for identifier in catalog.list_tables(namespace)
        )
    except Exception:  # only a hint
        there = []
    which = f"table {missing[0]} is" if len(missing) == 1 else f"tables {' and '.join(missing)} are"
    raise CompactError(
        f"{which} not in the Iceberg catalog {uri} (tables there: "
        f"{', '.join(there) or 'none'}); name the records table with --table and the "
        "quarantine table with --quarantine"
    )


def run_compact(job: CompactJob, out: TextIO, err: TextIO, today: dt.date | None = None) -> int:
    from pyiceberg.exceptions import RESTError

    before = job.before or (today or dt.datetime.now(dt.UTC).date()).isoformat()
    # A commit that lost a race is retried here; pyiceberg's warning about it is noise.
    logging.getLogger("pyiceberg.table").setLevel(logging.ERROR)
    try:
        catalog = _open_catalog(job)
        names = [job.table, job.quarantine_table]
        try:
            _check_tables(catalog, names, catalog.properties.get("uri", job.catalog or job.out))
            for name in names:
                done = compact_table(catalog, name, before, job.target_file_size)
                out.write(f"{_COMMAND}: {done.describe()}\n")
                out.flush()
        except (RESTError, OSError) as exc:
            raise CompactError(f"the Iceberg catalog or its files: {exc}", status=1) from None
    except CompactError as exc:
        err.write(f"{_COMMAND}: error: {exc}\n")
        return exc.status
    return 0
