"""`kipside lake --format iceberg`: two Iceberg tables, the records and the quarantine, each
micro-batch committed once with its Kafka offsets, through pyiceberg (no JVM jars).

Who does what:
- the driver, before the query starts, creates the tables or evolves their schema to the schema
  file's (pipeline.lake.evolution decides; a refused change stops the job before it writes);
- each micro-batch, the driver reads the tables' offsets from their snapshot summaries
  (pipeline.lake.ledger), and the executors write Parquet data files under the tables' data
  locations, only for rows the tables don't hold yet (pipeline.lake.landing splits the rows),
  each file cut once it reaches the target size or the row limit;
  each task returns its files' paths and the next offset of every partition it read;
- the driver then commits the quarantine table's files, then the records table's, each in one
  snapshot whose summary carries the offsets. A snapshot is atomic: readers see a whole
  micro-batch or nothing of it.

A commit that loses a race to another writer (`kipside lake compact`, pipeline.lake.compact)
is retried by pyiceberg on the refreshed table: an append conflicts with nothing, and a
compaction's snapshot carries no offsets, so the offsets checked before the commit still hold.

A crash after the files are written and before the commit leaves files no snapshot names
(readers never see them; Iceberg's orphan file clean-up removes them); Spark replays the
micro-batch and writes them again under new names. A replay after the commit finds the
offsets in the table and adds nothing. Data files are named with a fresh UUID per task, and
pyiceberg refuses to add a path the table already has.

This module moves data and talks to the catalog; it decides nothing the modules above don't.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from .compaction import rows_to_target
from .evolution import Evolution, plan_evolution
from .landing import Landing, split_batch
from .ledger import TableOffsets, TopicPartition

__all__ = [
    "DEFAULT_TABLE",
    "DEFAULT_TARGET_FILE_SIZE",
    "RESULT_DDL",
    "CatalogSpec",
    "IcebergTables",
    "ParquetFile",
    "TaskPlan",
    "quarantine_arrow_schema",
    "write_task",
]

RESULT_DDL: Final = (
    "kind STRING, path STRING, topic STRING, kafka_partition INT, next_offset BIGINT, rows BIGINT, "
    "bytes BIGINT"
)
DEFAULT_TABLE: Final = "kipside.lake"
DEFAULT_TARGET_FILE_SIZE: Final = 128 << 20
_COMMIT_ATTEMPTS: Final = 5
_DATA_PATH: Final = "write.data.path"


@dataclass(frozen=True)
class CatalogSpec:
    """Where the tables are registered: a SQLAlchemy URL (`sqlite:///FILE`, the default, in
    the table's directory) for pyiceberg's SQL catalog, or an http(s) URL of a REST catalog.
    `warehouse` is where new tables' files go; `properties` are passed to pyiceberg as they
    are (a REST catalog's `credential`, `token`, `warehouse`, ...)."""

    uri: str
    warehouse: str
    properties: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def for_lake(cls, out: str, catalog: str | None, properties: Mapping[str, str]) -> CatalogSpec:
        """A lake's catalog: `catalog`, or a SQLite file in `out`; `out` is the warehouse new
        tables go to."""
        given = out
        out = out.rstrip("/").removeprefix("file://")
        local = "://" not in out
        if local:
            out = os.path.abspath(out)
        if catalog is None and not local:
            raise ValueError(
                f"--out {given}: the default catalog is a SQLite file in OUT, which must then "
                "be a local directory; name a catalog with --catalog"
            )
        uri = catalog or f"sqlite:///{out}/catalog.db"
        return cls(uri, f"file://{out}" if local else out, dict(properties))

    @property
    def kind(self) -> str:
        return "rest" if self.uri.startswith(("http://", "https://")) else "sql"

    def open(self) -> Any:
        from pyiceberg.catalog import load_catalog

        if self.uri.startswith("sqlite:///"):  # SQLite makes the file, not its folder
            os.makedirs(os.path.dirname(self.uri.removeprefix("sqlite:///")) or ".", exist_ok=True)
        settings: dict[str, str | None] = {"type": self.kind, "uri": self.uri}
        if self.kind == "sql":
            settings["warehouse"] = self.warehouse
            settings["init_catalog_tables"] = "true"
        settings.update(self.properties)
        return load_catalog("kipside", **settings)


def quarantine_arrow_schema() -> pa.Schema:
    return pa.schema(
        [
            pa.field("kafka_partition", pa.int32()),
            pa.field("kafka_offset", pa.int64()),
            pa.field("kafka_timestamp", pa.timestamp("us", tz="UTC")),
            pa.field("key", pa.binary()),
            pa.field("value", pa.binary()),
            pa.field("error", pa.string()),
            pa.field("topic", pa.string()),
        ]
    )


@dataclass(frozen=True)
class Target:
    """One table as the executors see it: where its data files go (`write.data.path`, by
    default the table's location + /data), and the offsets it already holds."""

    location: str
    offsets: str  # TableOffsets as JSON
    schema: pa.Schema


@dataclass(frozen=True)
class TaskPlan:
    """What a task needs to write its share of a micro-batch (pickled to executors)."""

    batch_id: int
    data: Target
    quarantine: Target
    compression: str
    max_records_per_file: int
    target_file_size: int
    schema_json: str  # the schema file's StructType, for the quarantine's reasons


class ParquetFile:
    """One Parquet file being written under a table's data location, and its size so far
    (what the row groups written take; the footer comes at close)."""

    def __init__(self, location: str, name: str, schema: pa.Schema, compression: str) -> None:
        filesystem, root = pafs.FileSystem.from_uri(location)
        folder = name.rpartition("/")[0]
        if folder:
            filesystem.create_dir(f"{root.rstrip('/')}/{folder}", recursive=True)
        self.path = f"{location.rstrip('/')}/{name}"
        self._stream = filesystem.open_output_stream(f"{root.rstrip('/')}/{name}")
        codec = "none" if compression == "uncompressed" else compression
        self._writer = pq.ParquetWriter(self._stream, schema, compression=codec)
        self.rows = 0

    @property
    def size(self) -> int:
        return int(self._stream.tell())

    def write(self, table: pa.Table) -> None:
        self._writer.write_table(table)
        self.rows += table.num_rows

    def close(self) -> int:
        """Finish the file; returns its size in bytes."""
        self._writer.close()
        size = self.size
        self._stream.close()
        return size


class _Files:
    """Open Parquet writers by partition directory, rolled at a row count or a size."""

    def __init__(self, target: Target, plan: TaskPlan) -> None:
        self.location = target.location.rstrip("/")
        self.plan = plan
        self.schema = target.schema
        self.open: dict[str, ParquetFile] = {}
        self.done: list[tuple[str, int, int]] = []
        self.task = uuid.uuid4().hex

    def write(self, folder: str, table: pa.Table) -> None:
        table = table.cast(self.schema)
        while table.num_rows:
            file = self.open.get(folder) or self._new(folder)
            room = self.plan.max_records_per_file - file.rows
            available = min(room, table.num_rows)
            take = rows_to_target(
                file.size,
                file.rows,
                self.plan.target_file_size,
                available,
                table.slice(0, available).nbytes,
            )
            file.write(table.slice(0, take))
            if file.rows >= self.plan.max_records_per_file or (
                file.size >= self.plan.target_file_size
            ):
                self._close(folder)
            table = table.slice(take)

    def _new(self, folder: str) -> ParquetFile:
        n = len(self.done) + len(self.open)
        name = f"{folder}/b{self.plan.batch_id:012d}-{self.task}-{n:05d}.parquet"
        file = ParquetFile(self.location, name, self.schema, self.plan.compression)
        self.open[folder] = file
        return file

    def _close(self, folder: str) -> None:
        file = self.open.pop(folder)
        size = file.close()
        self.done.append((file.path, file.rows, size))

    def finish(self) -> list[tuple[str, int, int]]:
        for folder in list(self.open):
            self._close(folder)
        return self.done


def write_task(plan: TaskPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow's function on the executors: the task's rows as Parquet files of the two
    tables; yields one row per file and one per Kafka partition read (RESULT_DDL)."""
    from .decode import explain

    data = _Files(plan.data, plan)
    quarantine = _Files(plan.quarantine, plan)
    data_offsets = TableOffsets.parse(plan.data.offsets)
    quarantine_offsets = TableOffsets.parse(plan.quarantine.offsets)
    landing = Landing()

    def reason(value: bytes | None, hint: str) -> str:
        return explain(value, hint, plan.schema_json)

    for batch in batches:
        split_batch(batch, landing, data_offsets, quarantine_offsets, plan.data.schema, reason)
        for (topic, date), part in landing.data:
            data.write(f"topic={topic}/date={date}", part)
        for topic, part in landing.quarantine:
            quarantine.write(f"topic={topic}", part)
    rows: list[dict[str, Any]] = [
        {"kind": kind, "path": path, "rows": count, "bytes": size}
        for kind, files in (("data", data.finish()), ("quarantine", quarantine.finish()))
        for path, count, size in files
    ]
    rows += [
        {"kind": "offset", "topic": t, "kafka_partition": p, "next_offset": o}
        for (t, p), o in landing.seen.items()
    ]
    yield pa.RecordBatch.from_pylist(rows, schema=_RESULT_ARROW)


_RESULT_ARROW: Final = pa.schema(
    [
        pa.field("kind", pa.string()),
        pa.field("path", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("kafka_partition", pa.int32()),
        pa.field("next_offset", pa.int64()),
        pa.field("rows", pa.int64()),
        pa.field("bytes", pa.int64()),
    ]
)


@dataclass(frozen=True)
class BatchResult:
    """What the tasks of one micro-batch wrote, gathered on the driver."""

    data: list[str]
    quarantine: list[str]
    rows: int
    quarantined: int
    bytes: int
    seen: dict[TopicPartition, int]

    @classmethod
    def gather(cls, results: list[Any]) -> BatchResult:
        data: list[str] = []
        quarantine: list[str] = []
        rows = bad = size = 0
        seen: dict[TopicPartition, int] = {}
        for r in results:
            if r["kind"] == "offset":
                tp = (str(r["topic"]), int(r["kafka_partition"]))
                seen[tp] = max(seen.get(tp, 0), int(r["next_offset"]))
                continue
            size += int(r["bytes"])
            if r["kind"] == "data":
                data.append(str(r["path"]))
                rows += int(r["rows"])
            else:
                quarantine.append(str(r["path"]))
                bad += int(r["rows"])
        return cls(sorted(data), sorted(quarantine), rows, bad, size, seen)


class IcebergTables:
    """The lake's two tables in one catalog: created, evolved, read for offsets, committed."""

    def __init__(self, catalog: CatalogSpec, data: str, quarantine: str, compression: str) -> None:
        self.spec = catalog
        self.catalog = catalog.open()
        self.names = {"data": data, "quarantine": quarantine}
        self.compression = compression

    def prepare(self, data_schema: pa.Schema) -> dict[str, Evolution | None]:
        """Create the tables, or evolve them to these schemas (None: created). Every refusal is
        raised before either table is changed."""
        wanted = {"data": data_schema, "quarantine": quarantine_arrow_schema()}
        plans: dict[str, Evolution | None] = {}
        for kind, name in self.names.items():
            if self.catalog.table_exists(name):
                table = self.catalog.load_table(name)
                plans[kind] = plan_evolution(table.schema().as_arrow(), wanted[kind], name)
            else:
                plans[kind] = None
        for kind, name in self.names.items():
            evolution = plans[kind]
            if evolution is None:
                self._create(name, wanted[kind], ["topic", "date"] if kind == "data" else ["topic"])
            elif evolution.changes:
                with self.catalog.load_table(name).update_schema() as update:
                    update.union_by_name(wanted[kind])
        return plans

    def _create(self, name: str, schema: pa.Schema, partition_by: list[str]) -> None:
        namespace = name.rsplit(".", 1)[0] if "." in name else "default"
        self.catalog.create_namespace_if_not_exists(namespace)
        codec = "uncompressed" if self.compression == "none" else self.compression
        properties = {
            "write.parquet.compression-codec": codec,
            # Partition values are read back from the files' statistics: keep them whole.
            **{f"write.metadata.metrics.column.{c}": "full" for c in partition_by},
        }
        with (
            self.catalog.create_table_transaction(
                name, schema=schema, properties=properties
            ) as create,
            create.update_spec() as partitioning,
        ):
            for column in partition_by:
                partitioning.add_identity(column)

    def table(self, kind: str) -> Any:
        return self.catalog.load_table(self.names[kind])

    def target(self, kind: str) -> tuple[Target, TableOffsets]:
        """The table as this micro-batch's tasks write to it (one metadata read), and the
        offsets it holds."""
        table = self.table(kind)
        offsets = _offsets(table)
        location = str(table.metadata.properties.get(_DATA_PATH, f"{table.location()}/data"))
        return Target(location, offsets.to_json(), table.schema().as_arrow()), offsets

    def offsets(self, kind: str) -> TableOffsets:
        return _offsets(self.table(kind))

    def commit(
        self, kind: str, files: list[str], planned: TableOffsets, seen: dict[TopicPartition, int],
        batch_id: int,
    ) -> None:  # fmt: skip
        """One snapshot adding `files` and moving the table's offsets on by `seen`; refused if
        the offsets are no longer `planned` (another writer)."""
        from pyiceberg.exceptions import CommitFailedException

        properties = planned.advanced(seen).summary(batch_id)
        for attempt in range(_COMMIT_ATTEMPTS):
            table = _without_retries(self.table(kind))
            planned.check_unchanged(_offsets(table), self.names[kind])
            try:
                with table.transaction() as tx:
                    tx.add_files(files, snapshot_properties=properties)
                return
            except CommitFailedException:
                if attempt == _COMMIT_ATTEMPTS - 1:
                    raise  # something else commits all the time (maintenance): let Spark retry


def _without_retries(table: Any) -> Any:
    """The table as loaded, but committed without pyiceberg's own retries (a setting of this
    in-memory copy only, never written to the table). pyiceberg retries a failed commit on top of
    whatever committed in between without asking kipside again; the loop in commit() re-checks
    the offsets first, so another job's micro-batch is caught instead of committed on."""
    metadata = table.metadata
    properties = {**metadata.properties, "commit.retry.num-retries": "0"}
    table.metadata = metadata.model_copy(update={"properties": properties})
    return table


def _offsets(table: Any) -> TableOffsets:
    from pyiceberg.table.snapshots import ancestors_of

    return TableOffsets.from_summaries(
        s.summary.additional_properties if s.summary else {}
        for s in ancestors_of(table.current_snapshot(), table.metadata)
    )
