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

import re
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final, TextIO

from pipeline.kafka.client import ClientConfig, KafkaClient
from pipeline.kafka.connection import Address
from pipeline.kafka.errors import KafkaError, TopicNotFound
from pipeline.kafka.retry import RetryPolicy
from pipeline.notices import NoticeReader
from pipeline.progress import LiveLine, ProgressListener, Totals, describe_lag
from pipeline.source.options import OptionError, parse_source_options
from pipeline.source.planner import Planner
from pipeline.spark import spark_log_path, start_session

from .offset_sync import DEFAULT_TOPIC

__all__ = ["MirrorJob", "root_cause", "run_mirror"]

QUERY_NAME: Final = "kipside_mirror"
OBSERVED: Final = "kipside_mirror"
STOP_GRACE_SECONDS: Final = 60.0
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
            "kipside.stopMarker": self.stop_marker,
            "kipside.noticeFile": self.notice_file,
        }

    @property
    def notice_file(self) -> str:
        """Warnings from Spark's driver-side source for the terminal (beside the checkpoint)."""
        return str(Path(self.checkpoint).parent / f"{Path(self.checkpoint).name}.notices")

    @property
    def stop_marker(self) -> str:
        """Created on SIGINT/SIGTERM so no new micro-batch starts (beside the checkpoint)."""
        return str(Path(self.checkpoint).parent / f"{Path(self.checkpoint).name}.stopping")

    def sink_options(self) -> dict[str, str]:
        return {
            "kafka.bootstrap.servers": self.dest,
            "source.kafka.bootstrap.servers": self.source,
            "rename": self.rename,
            "offsetSyncTopic": self.sync_topic,
            "checkpointLocation": self.checkpoint,
        }


class MirrorFailed(Exception):
    """The mirror stopped on an error; the message is the root cause."""


def preflight(job: MirrorJob) -> list[tuple[str, int]]:
    """Dial both clusters and resolve the pattern; raises KafkaError or ValueError if either
    is unreachable or nothing matches. Returns the partitions to mirror."""
    try:
        options = parse_source_options(job.source_options(), streaming=True)
        config = ClientConfig(
            client_id="kipside-mirror", retry=RetryPolicy(timeout_ms=job.timeout_ms)
        )
        with KafkaClient(options.bootstrap, role="source cluster", config=config) as source:
            partitions = Planner(source, options).partitions()
    except (TopicNotFound, OptionError) as exc:
        # The source names its options as Spark's do; on this command line it is --topics.
        raise type(exc)(str(exc).replace("option subscribePattern:", "--topics")) from None
    dest_bootstrap = [Address.parse(p, what="--dest") for p in job.dest.split(",") if p.strip()]
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


_CAUSE = re.compile(r"^((?:pipeline|protocol)\.[\w.]+\.\w+|[\w.]*OptionError): (.+)$", re.MULTILINE)


def root_cause(exc: BaseException) -> str:
    """The kipside error inside Spark's wrapping (the last one in the Python traceback)."""
    text = str(exc)
    found = _CAUSE.findall(text)
    if found:
        return str(found[-1][1]).strip()
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:500]


def start_query(spark: Any, job: MirrorJob) -> Any:
    """Start the mirror's streaming query on `spark`; returns the StreamingQuery."""
    from pyspark.sql import functions as F

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
    if job.once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{job.trigger_seconds} seconds")
    return writer.start()


def run_mirror(job: MirrorJob, out: TextIO | None = None) -> int:
    """Run the mirror until --once drains the topics, or until SIGINT/SIGTERM."""
    err = out or sys.stderr
    if job.read_uncommitted:
        err.write(READ_UNCOMMITTED_WARNING + "\n")
    try:
        partitions = preflight(job)
    except (KafkaError, ValueError) as exc:
        err.write(f"kipside mirror: error: {exc}\n")
        return 1
    topics = sorted({t for t, _ in partitions})
    err.write(
        f"kipside mirror: {len(topics)} topic(s), {len(partitions)} partition(s) from "
        f"{job.source} to {job.dest}{' as ' + job.rename + '*' if job.rename else ''}; "
        f"checkpoint {job.checkpoint}; Spark's log: {spark_log_path(job.checkpoint)}\n"
    )
    err.flush()
    log_path = spark_log_path(job.checkpoint)
    spark = start_session("kipside mirror", job.master, job.conf, log_path=log_path)
    line = LiveLine(err)
    listener = ProgressListener(QUERY_NAME, OBSERVED, _render, line)
    spark.streams.addListener(listener)
    Path(job.stop_marker).unlink(missing_ok=True)  # left by a stop that was itself killed
    notices = NoticeReader(job.notice_file)

    def show_notices() -> None:
        for text in notices.new():
            line.notice(f"kipside mirror: warning: {text}")

    try:
        query = start_query(spark, job)
    except Exception as exc:  # planning failed: Spark wraps the data source's own error
        error: str | None = root_cause(exc)
        outcome = "stopped"
    else:
        outcome, error = _wait(query, job.stop_marker, show_notices)
        listener.catch_up(query.recentProgress)
    show_notices()
    notices.close()
    summary = _render(listener.totals).split(": ", 1)[1]
    line.finish(f"kipside mirror: {outcome}: {summary}")
    if error:
        err.write(f"kipside mirror: error: {error}\n")
    spark.stop()
    return 1 if error else 0


def _wait(query: Any, stop_marker: str, tick: Callable[[], None]) -> tuple[str, str | None]:
    """Block until the query ends or a signal asks it to: ("done" | "stopped", root cause of a
    failure or None)."""
    stopping = {"asked": False}

    def ask_to_stop(signum: int, _frame: FrameType | None) -> None:
        stopping["asked"] = True

    previous = {s: signal.signal(s, ask_to_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while query.isActive and not stopping["asked"]:
            query.awaitTermination(0.5)
            tick()
        if stopping["asked"] and query.isActive:
            _stop_between_batches(query, stop_marker)
            return "stopped", None
        query.awaitTermination()
        return "done", None
    except Exception as exc:
        return "stopped", root_cause(exc)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _stop_between_batches(query: Any, stop_marker: str) -> None:
    """Let the running micro-batch commit, then stop (within STOP_GRACE_SECONDS).

    The marker file makes the source report no new data, so once the running trigger ends
    no other one starts a micro-batch; stopping then interrupts nothing.
    """
    marker = Path(stop_marker)
    marker.touch()
    try:
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        time.sleep(0.2)
        while time.monotonic() < deadline and query.status.get("isTriggerActive"):
            time.sleep(0.05)
        query.stop()
    finally:
        marker.unlink(missing_ok=True)
