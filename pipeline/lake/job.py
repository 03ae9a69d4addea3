"""`kipside lake`: Kafka topics to Parquet tables, as a Spark Structured Streaming job.

source:  format("kipside") (records, read_committed, from the earliest offsets, at most
         --max-offsets-per-trigger records per micro-batch, option valueSchema set to the
         schema file's struct, so columnar carriers come as typed columns), observed
each micro-batch (foreachBatch, on the driver):
         carriers' typed values taken as they are, other JSON values decoded by Spark's
         from_json against the schema file (pipeline.lake.decode)
         -> the table under OUT, partitioned by topic and date (the Kafka timestamp's day, UTC),
            Parquet compressed with --compression, files of about --target-file-size (at
            most --max-records-per-file rows)
         -> values that don't fit, with why, under OUT/_quarantine (or --quarantine)
         -> published exactly once (pipeline.lake.commit), keyed by the micro-batch id that
            Spark's checkpoint keeps.
With --format iceberg the two tables are Iceberg tables instead (pipeline.lake.iceberg):
executors write the data files, the driver commits each table's in one snapshot with the
micro-batch's Kafka offsets, and the tables, not the staging protocol, say what was published.
The progress line shows rows and quarantined values written, files, rows/s and the lag.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, TextIO

from kipside.pipeline import jobrun
from kipside.pipeline.jobrun import JobFiles
from kipside.pipeline.kafka.errors import KafkaError
from kipside.pipeline.kafka.properties import ClientProperties
from kipside.pipeline.progress import Totals, describe_lag
from kipside.pipeline.spark import start_session

from .commit import BatchPublisher
from .compaction import RowsPerFile
from .decode import ERROR, decode, good_rows, landing_rows, quarantine_rows, table_struct
from .evolution import SchemaChangeRefused
from .faults import crash_point
from .iceberg import (
    DEFAULT_TABLE,
    DEFAULT_TARGET_FILE_SIZE,
    RESULT_DDL,
    BatchResult,
    CatalogSpec,
    IcebergTables,
    TaskPlan,
    write_task,
)
from .schema import DDL_SUFFIXES, LakeSchema, SchemaError, load_schema

__all__ = ["LakeJob", "prepare_tables", "run_lake", "start_on", "start_query"]

QUERY_NAME: Final = "kipside_lake"
OBSERVED: Final = QUERY_NAME  # the observed metrics are named as the query
COMPRESSIONS: Final = ("zstd", "snappy", "none")
FORMATS: Final = ("parquet", "iceberg")


@dataclass(frozen=True)
class LakeJob:
    bootstrap: str
    topics: str
    schema: str
    out: str
    checkpoint: str
    quarantine: str | None = None
    once: bool = False
    compression: str = "zstd"
    master: str = "local[*]"
    max_offsets_per_trigger: int = 5_000_000
    max_records_per_file: int = 1_000_000
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    trigger_seconds: float = 60.0
    fail_on_data_loss: bool = True
    timeout_ms: int = 60_000
    conf: Mapping[str, str] = field(default_factory=dict)
    source_config: ClientProperties | None = None
    format: str = "parquet"
    catalog: str | None = None
    table: str = DEFAULT_TABLE
    catalog_properties: Mapping[str, str] = field(default_factory=dict)
    columnar_key_file: str | None = None

    @property
    def files(self) -> JobFiles:
        return JobFiles(self.checkpoint)

    @property
    def quarantine_dir(self) -> str:
        return self.quarantine or f"{self.out.rstrip('/')}/_quarantine"

    @property
    def iceberg(self) -> bool:
        return self.format == "iceberg"

    @property
    def quarantine_table(self) -> str:
        return self.quarantine or f"{self.table}_quarantine"

    def catalog_spec(self) -> CatalogSpec:
        """--catalog, or a SQLite file in OUT; OUT is the warehouse new tables go to."""
        return CatalogSpec.for_lake(self.out, self.catalog, self.catalog_properties)

    def source_options(self) -> dict[str, str]:
        return {
            "kafka.bootstrap.servers": self.bootstrap,
            "subscribePattern": self.topics,
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": str(self.max_offsets_per_trigger),
            "failOnDataLoss": str(self.fail_on_data_loss).lower(),
            "kafka.default.api.timeout.ms": str(self.timeout_ms),
            "kafka.client.id": "kipside-lake",
            "kipside.stopMarker": self.files.stop_marker,
            "kipside.noticeFile": self.files.notices,
            "kipside.role": "Kafka cluster",
            **_key_file(self.columnar_key_file),
            **_from_file(self.source_config),
        }


def _key_file(path: str | None) -> dict[str, str]:
    """--columnar-key-file as the source's option (absolute: tasks read it where they run)."""
    return {} if path is None else {"columnarKeyFile": os.path.abspath(path)}


def _from_file(config: ClientProperties | None) -> dict[str, str]:
    """--source-config's settings as the source's options (kafka.KEY)."""
    if config is None:
        return {}
    options = config.prefixed("kafka.", without=frozenset({"bootstrap.servers"}))
    options["kipside.settingsHint"] = config.hint
    return options


@dataclass
class _Written:
    """Running totals of what the micro-batches published (driver side, thread-safe)."""

    rows: int = 0
    quarantined: int = 0
    files: int = 0
    bytes: int = 0
    rows_per_second: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


class BatchWriter:
    """The foreachBatch function: decode, write to staging, publish exactly once."""

    def __init__(self, spark: Any, job: LakeJob, schema: LakeSchema, written: _Written) -> None:
        self.spark = spark
        self.job = job
        self.schema = schema
        self.written = written
        self.publisher = BatchPublisher(spark, job.out, job.quarantine_dir)
        # Spark's writer cuts files by rows only: rows per file come from the bytes per row
        # of the files published so far.
        self.rows_per_file = RowsPerFile(job.target_file_size, job.max_records_per_file)

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        if self.publisher.done(batch_id):
            self.publisher.tidy(batch_id)  # the crash may have come before the clean-up too
            return  # published before a crash that came ahead of Spark's own commit
        started = time.monotonic()
        self.publisher.clean(batch_id)
        decoded = decode(df, self.schema)
        counts = Observation(f"kipside_lake_{batch_id}")
        observed = decoded.observe(
            counts,
            F.count_if(F.col(ERROR).isNull()).alias("rows"),
            F.count_if(F.col(ERROR).isNotNull()).alias("bad"),
        )
        compression = "uncompressed" if self.job.compression == "none" else self.job.compression
        (
            good_rows(observed, self.schema)
            .coalesce(self.spark.sparkContext.defaultParallelism)
            .write.partitionBy("topic", "date")
            .option("compression", compression)
            .option("maxRecordsPerFile", self.rows_per_file())
            .mode("overwrite")
            .parquet(self.publisher.staging(batch_id, "data"))
        )
        seen = counts.get
        rows, bad = int(seen.get("rows", 0)), int(seen.get("bad", 0))
        if bad:
            (
                quarantine_rows(decoded, self.schema)
                .coalesce(1)
                .write.partitionBy("topic")
                .option("compression", compression)
                .mode("overwrite")
                .parquet(self.publisher.staging(batch_id, "quarantine"))
            )
        published = self.publisher.publish(batch_id)
        self.rows_per_file.observe(rows + bad, published.bytes)
        took = max(time.monotonic() - started, 1e-3)
        with self.written.lock:
            self.written.rows += rows
            self.written.quarantined += bad
            self.written.files += len(published.files)
            self.written.bytes += published.bytes
            self.written.rows_per_second = (rows + bad) / took


class IcebergBatchWriter:
    """The foreachBatch function with --format iceberg: the executors write both tables' data
    files, then each table gets one snapshot with the micro-batch's offsets (quarantine first,
    so the records table's offsets are always a safe place to resume)."""

    def __init__(self, job: LakeJob, schema: LakeSchema, tables: IcebergTables, written: _Written):
        self.job = job
        self.schema = schema
        self.tables = tables
        self.written = written

    def __call__(self, df: Any, batch_id: int) -> None:
        started = time.monotonic()
        data, data_before = self.tables.target("data")
        quarantine, quarantine_before = self.tables.target("quarantine")
        plan = TaskPlan(
            batch_id=batch_id,
            data=data,
            quarantine=quarantine,
            compression=self.job.compression,
            max_records_per_file=self.job.max_records_per_file,
            target_file_size=self.job.target_file_size,
            schema_json=self.schema.struct.json(),
        )
        rows = landing_rows(decode(df, self.schema), self.schema)
        result = BatchResult.gather(
            rows.mapInArrow(partial(write_task, plan), RESULT_DDL).collect()
        )
        crash_point(batch_id)
        if result.quarantine:
            self.tables.commit(
                "quarantine", result.quarantine, quarantine_before, result.seen, batch_id
            )
        if data_before.moves(result.seen):
            self.tables.commit("data", result.data, data_before, result.seen, batch_id)
        took = max(time.monotonic() - started, 1e-3)
        with self.written.lock:
            self.written.rows += result.rows
            self.written.quarantined += result.quarantined
            self.written.files += len(result.data) + len(result.quarantine)
            self.written.bytes += result.bytes
            self.written.rows_per_second = (result.rows + result.quarantined) / took


def start_query(
    spark: Any,
    job: LakeJob,
    schema: LakeSchema,
    written: _Written,
    tables: IcebergTables | None = None,
    starting: str | None = None,
) -> Any:
    from pyspark.sql import functions as F

    options = job.source_options()
    options["valueSchema"] = schema.struct.json()
    if starting is not None:
        options["startingOffsets"] = starting
    stream = (
        spark.readStream.format("kipside")
        .options(**options)
        .load()
        .observe(OBSERVED, F.count(F.lit(1)).alias("records"))
    )
    batches = (
        BatchWriter(spark, job, schema, written)
        if tables is None
        else IcebergBatchWriter(job, schema, tables, written)
    )
    writer = (
        stream.writeStream.foreachBatch(batches)
        .option("checkpointLocation", job.checkpoint)
        .queryName(QUERY_NAME)
    )
    return jobrun.start_stream(writer, once=job.once, trigger_seconds=job.trigger_seconds)


def _renderer(written: _Written) -> Any:
    def render(totals: Totals) -> str:
        with written.lock:
            return (
                f"kipside lake: {written.rows:,} rows, {written.quarantined:,} quarantined, "
                f"{written.files:,} files ({written.bytes / 1e6:,.1f} MB) | "
                f"{written.rows_per_second:,.0f} rows/s | {describe_lag(totals.lag)}"
            )

    return render


def _schema(job: LakeJob, spark: Any | None) -> LakeSchema:
    from pyspark.sql.types import StructType

    return load_schema(job.schema, StructType.fromDDL if spark is not None else None)


def prepare_tables(
    job: LakeJob, schema: LakeSchema, partitions: list[tuple[str, int]], err: TextIO
) -> tuple[IcebergTables, str]:
    """The Iceberg tables, created or evolved to the schema file's (SchemaChangeRefused before
    anything is changed), and where a fresh checkpoint starts: the records table's offsets."""
    from pyspark.sql.pandas.types import to_arrow_schema

    tables = IcebergTables(job.catalog_spec(), job.table, job.quarantine_table, job.compression)
    plans = tables.prepare(to_arrow_schema(table_struct(schema), timezone="UTC"))
    for kind, plan in plans.items():
        name = tables.names[kind]
        if plan is None:
            err.write(f"kipside lake: created Iceberg table {name}\n")
        elif plan.changes:
            err.write(f"kipside lake: Iceberg table {name}: schema evolved: {plan.describe()}\n")
    return tables, tables.offsets("data").starting_offsets(partitions)


def run_lake(job: LakeJob, out: TextIO | None = None) -> int:
    err = out or sys.stderr
    is_ddl = job.schema.lower().endswith(DDL_SUFFIXES)
    schema: LakeSchema | None = None
    try:
        if not is_ddl:
            schema = _schema(job, None)  # a JSON Schema is checked before anything starts
        catalog = job.catalog_spec().uri if job.iceberg else ""
        partitions = jobrun.preflight(
            job.source_options(),
            timeout_ms=job.timeout_ms,
            flag="--topics",
            client_id="kipside-lake",
        )
    except (KafkaError, ValueError) as exc:
        err.write(f"kipside lake: error: {exc}\n")
        return jobrun.exit_status(exc)
    if job.iceberg:
        route = (
            f"from {job.bootstrap} to Iceberg table {job.table} (quarantine: "
            f"{job.quarantine_table}; catalog {catalog})"
        )
    else:
        route = f"from {job.bootstrap} to {job.out} (quarantine: {job.quarantine_dir})"
    jobrun.announce(err, "kipside lake", partitions, route, job.files)
    tables: IcebergTables | None = None
    starting: str | None = None
    if job.iceberg and schema is not None:
        try:  # a JSON Schema's tables are ready, or refused, before Spark starts
            tables, starting = prepare_tables(job, schema, partitions, err)
        except SchemaChangeRefused as exc:
            err.write(f"kipside lake: error: {exc}\n")
            return jobrun.exit_status(exc)
    # Dates and timestamps in UTC; timestamps as Parquet's TIMESTAMP_MICROS, which every
    # reader understands (Spark's default, INT96, is deprecated in Parquet).
    conf = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        **job.conf,
    }
    spark = start_session("kipside lake", job.master, conf, log_path=job.files.spark_log)
    try:
        schema = _schema(job, spark)
        if job.iceberg and tables is None:
            tables, starting = prepare_tables(job, schema, partitions, err)
    except (SchemaError, SchemaChangeRefused) as exc:
        err.write(f"kipside lake: error: {exc}\n")
        spark.stop()
        return jobrun.exit_status(exc)
    written = _Written()
    start = partial(start_query, spark, job, schema, written, tables, starting)
    render = _renderer(written)
    return jobrun.run_with_progress(
        spark, start, job.files, err, "kipside lake", QUERY_NAME, render
    )


def start_on(
    spark: Any,
    job: LakeJob,
    partitions: list[tuple[str, int]],
    err: TextIO,
    starting: str | None = None,
) -> Any:
    """The lake's query on a session already running (the tests share one): the schema read,
    the Iceberg tables ready, the query started; the caller waits for it. `starting` replaces
    the startingOffsets the tables give (a test replaying what they hold)."""
    schema = _schema(job, spark)
    tables, resume = prepare_tables(job, schema, partitions, err) if job.iceberg else (None, None)
    return start_query(spark, job, schema, _Written(), tables, starting or resume)
