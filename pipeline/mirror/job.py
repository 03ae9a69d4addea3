"""`kipside mirror`: the shallow mirror as a Spark Structured Streaming query.

source: format("kipside") with rows=batches and subscribePattern, from the earliest offsets
   -> observe batches, records and bytes (Spark's progress events carry them)
   -> coalesce to the session's parallelism, so a write task carries several partitions
      and its ProduceRequests are multi-partition
sink:   format("kipside-mirror"), checkpointed in --checkpoint.

Before Spark starts, both clusters are dialled and the pattern must match a topic, so the
common mistakes fail in a second with a clear line instead of a stack trace. A failed query
is reported by its root cause (the kipside error in the Python traceback), not by Spark's
wrapping. SIGINT/SIGTERM let the running micro-batch finish before stopping, so a restart
copies as little again as possible.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final, TextIO

from kipside.pipeline import jobrun
from kipside.pipeline.jobrun import JobFiles
from kipside.pipeline.kafka.client import KafkaClient
from kipside.pipeline.kafka.errors import KafkaError
from kipside.pipeline.kafka.properties import ClientProperties, client_config
from kipside.pipeline.notices import post_notice
from kipside.pipeline.progress import Totals, describe_lag
from kipside.pipeline.spark import start_session
from kipside.protocol import Address

from .exactly_once import query_prefix
from .group_syncer import GroupSyncer
from .offset_sync import DEFAULT_TOPIC
from .sink import MirrorSink

__all__ = ["MirrorJob", "run_mirror", "start_query"]

QUERY_NAME: Final = "kipside_mirror"
JAVA_OPTIONS: Final = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The mirror's JVMs only hand batches between Python workers: C1 alone compiles all they run,
at a fraction of C2's CPU, and one GC thread is plenty (docs/performance.md, fixed cost)."""
OBSERVED: Final = QUERY_NAME  # the observed metrics are named as the query
READ_UNCOMMITTED_WARNING: Final = (
    "kipside mirror: warning: --read-uncommitted copies every data batch, including those of "
    "transactions that were aborted or are still open; on the destination they become "
    "ordinary records that every consumer reads as committed data"
)


@dataclass(frozen=True)
class MirrorJob:
    source: str
    dest: str
    topics: str
    checkpoint: str
    rename: str = ""
    read_uncommitted: bool = False
    max_bytes_per_trigger: int = 256 * 1024 * 1024
    once: bool = False
    master: str = "local[*]"
    fail_on_data_loss: bool = True
    trigger_seconds: float = 1.0
    sync_topic: str = DEFAULT_TOPIC
    timeout_ms: int = 60_000
    conf: Mapping[str, str] = field(default_factory=dict)
    source_config: ClientProperties | None = None
    dest_config: ClientProperties | None = None
    exactly_once: bool = False
    sync_groups: str | None = None
    sync_groups_interval: float = 60.0

    def source_options(self) -> dict[str, str]:
        return {
            "kafka.bootstrap.servers": self.source,
            "subscribePattern": self.topics,
            "rows": "batches",
            "startingOffsets": "earliest",
            "maxBytesPerTrigger": str(self.max_bytes_per_trigger),
            "failOnDataLoss": str(self.fail_on_data_loss).lower(),
            "kafka.isolation.level": "read_uncommitted"
            if self.read_uncommitted
            else "read_committed",
            "kafka.default.api.timeout.ms": str(self.timeout_ms),
            "kafka.client.id": "kipside-mirror",
            "kipside.stopMarker": self.files.stop_marker,
            "kipside.noticeFile": self.files.notices,
            "kipside.role": "source cluster",
            **_from_file(self.source_config, "kafka."),
        }

    @property
    def files(self) -> JobFiles:
        return JobFiles(self.checkpoint)

    def sink_options(self) -> dict[str, str]:
        return {
            "kafka.bootstrap.servers": self.dest,
            "source.kafka.bootstrap.servers": self.source,
            "rename": self.rename,
            "offsetSyncTopic": self.sync_topic,
            "checkpointLocation": self.checkpoint,
            **self._exactly_once_options(),
            **_from_file(self.dest_config, "kafka."),
            **_from_file(self.source_config, "source.kafka."),
        }

    def _exactly_once_options(self) -> dict[str, str]:
        if not self.exactly_once:
            return {}
        return {
            "exactlyOnce": "true",
            "transactionalIdPrefix": query_prefix(query_id(self.checkpoint)),
        }


def query_id(checkpoint: str) -> str:
    """The streaming query's id: the one Spark keeps in CHECKPOINT/metadata, written there
    first (in Spark's format) if the query has never run, so that Spark takes it as its own.
    A checkpoint elsewhere than on this machine's disk is named by its location instead."""
    if "://" in checkpoint and not checkpoint.startswith("file:"):
        return checkpoint
    folder = Path(checkpoint.removeprefix("file://").removeprefix("file:"))
    metadata = folder / "metadata"
    try:
        return str(json.loads(metadata.read_text().splitlines()[0])["id"])
    except (OSError, ValueError, KeyError, IndexError):
        pass
    folder.mkdir(parents=True, exist_ok=True)
    made = str(uuid.uuid4())
    metadata.write_text(json.dumps({"id": made}) + "\n")
    return made


def _from_file(config: ClientProperties | None, prefix: str) -> dict[str, str]:
    """A property file's configs as options named `prefix` + key, and where a failed login's
    message should send the user."""
    if config is None:
        return {}
    options = config.prefixed(prefix, without=frozenset({"bootstrap.servers"}))
    options[f"{prefix.removesuffix('kafka.')}kipside.settingsHint"] = config.hint
    return options


def preflight(job: MirrorJob) -> list[tuple[str, int]]:
    """Dial both clusters and resolve the pattern; raises KafkaError or ValueError if either
    is unreachable or nothing matches. Returns the partitions to mirror."""
    partitions = jobrun.preflight(
        job.source_options(), timeout_ms=job.timeout_ms, flag="--topics", client_id="kipside-mirror"
    )
    config = client_config(job.dest_config, "kipside-mirror", job.timeout_ms)
    dest_bootstrap = Address.parse_list(job.dest, what="--dest")
    with KafkaClient(dest_bootstrap, role="destination cluster", config=config) as dest:
        dest.retrying("reading the destination's metadata", dest.metadata)
    return partitions


def _render(totals: Totals) -> str:
    s, r = totals.sums, totals.rates
    copied = (
        f"{int(s.get('batches', 0)):,} batches, {int(s.get('records', 0)):,} records, "
        f"{s.get('bytes', 0) / 1e6:,.1f} MB copied"
    )
    rates = f"{r.get('batches', 0):,.0f} batches/s, {r.get('bytes', 0) / 1e6:,.1f} MB/s"
    return f"kipside mirror: {copied} | {rates} | {describe_lag(totals.lag)}"


def start_query(spark: Any, job: MirrorJob) -> Any:
    """Start the mirror's streaming query on `spark`; returns the StreamingQuery."""
    from pyspark.sql import functions as F

    spark.dataSource.register(MirrorSink)  # idempotent: the name maps to the class

    stream = (
        spark.readStream.format("kipside")
        .options(**job.source_options())
        .load()
        .observe(
            OBSERVED,
            F.count(F.lit(1)).alias("batches"),
            F.sum("recordCount").alias("records"),
            F.sum(F.length("batch")).alias("bytes"),
        )
        .coalesce(spark.sparkContext.defaultParallelism)
    )
    writer = (
        stream.writeStream.format("kipside-mirror")
        .options(**job.sink_options())
        .queryName(QUERY_NAME)
    )
    return jobrun.start_stream(writer, once=job.once, trigger_seconds=job.trigger_seconds)


def group_syncer(job: MirrorJob) -> GroupSyncer | None:
    """--sync-groups' thread, with clients of its own (a client is not thread-safe)."""
    if job.sync_groups is None:
        return None
    source_bootstrap = Address.parse_list(job.source, what="--source")
    source = KafkaClient(
        source_bootstrap,
        role="source cluster",
        config=client_config(job.source_config, "kipside-mirror-groups", job.timeout_ms),
    )
    dest = KafkaClient(
        Address.parse_list(job.dest, what="--dest"),
        role="destination cluster",
        config=client_config(job.dest_config, "kipside-mirror-groups", job.timeout_ms),
    )
    # The cluster id the offset syncs carry (as the sink names the source).
    meta = source.retrying("reading the source cluster id", source.metadata)
    cluster = meta.cluster_id or ",".join(map(str, source_bootstrap))
    return GroupSyncer(
        job.sync_groups,
        job.sync_groups_interval,
        source,
        dest,
        job.sync_topic,
        cluster,
        warn=partial(post_notice, job.files.notices),
    )


def run_mirror(job: MirrorJob, out: TextIO | None = None) -> int:
    """Run the mirror until --once drains the topics, or until SIGINT/SIGTERM."""
    err = out or sys.stderr
    if job.read_uncommitted:
        err.write(READ_UNCOMMITTED_WARNING + "\n")
    try:
        partitions = preflight(job)
        syncer = group_syncer(job)
    except (KafkaError, ValueError) as exc:
        err.write(f"kipside mirror: error: {exc}\n")
        return jobrun.exit_status(exc)
    renamed = f" as {job.rename}*" if job.rename else ""
    route = f"from {job.source} to {job.dest}{renamed}"
    jobrun.announce(err, "kipside mirror", partitions, route, job.files)
    spark = start_session(
        "kipside mirror",
        job.master,
        job.conf,
        log_path=job.files.spark_log,
        java_options=JAVA_OPTIONS,
    )
    start = partial(start_query, spark, job)
    status = jobrun.run_with_progress(
        spark, start, job.files, err, "kipside mirror", QUERY_NAME, _render, syncer
    )
    if syncer is not None:
        t = syncer.totals
        err.write(
            f"kipside mirror: --sync-groups: {t.commits:,} offsets of {t.groups:,} group(s) "
            f"committed on the destination in {t.rounds:,} round(s)\n"
        )
    return status
