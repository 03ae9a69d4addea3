"""One worker process's mirror: batches in, the same batches out on the destination.

A Spark Python worker runs one write task at a time and is reused for the next, so the
idempotent producer session (its producer id and per-partition sequences) lives as long as the
process: one producer id per worker, not per task, as a long-running producer would have. Each
batch row is viewed in place (no copy out of Arrow), re-stamped and queued; queues are flushed
when they hold `buffer_bytes`, so a task's partitions share multi-partition requests. After the
destination acknowledges a batch, its offset sync is queued to the sync topic in the same
session. Any failure discards the session: a retried task starts a new one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from kipside.pipeline.kafka.admin import NewTopic, create_topics, partition_counts
from kipside.pipeline.kafka.client import ClientConfig
from kipside.pipeline.kafka.producer import IdempotentProducer, ProduceConfig, Written
from kipside.pipeline.kafka.shared import drop_client, shared_client
from kipside.protocol import Address, Record, RecordBatchView, encode_batch

from .offset_sync import DEFAULT_TOPIC, TOPIC_CONFIGS, OffsetSync, encode_sync
from .topics import DestinationTopics

__all__ = [
    "BatchRow",
    "MirrorSession",
    "MirrorStats",
    "SinkOptions",
    "SourceRange",
    "batch_rows_of",
    "offset_syncs",
    "sync_batch",
]


@dataclass(frozen=True, slots=True)
class SinkOptions:
    dest: tuple[Address, ...]
    source: tuple[Address, ...]
    rename: str = ""
    sync_topic: str | None = DEFAULT_TOPIC
    buffer_bytes: int = 64 * 1024 * 1024
    exactly_once: bool = False
    """Each source partition's batches of a micro-batch in one transaction (exactly_once)."""
    transactional_prefix: str = "kipside-mirror"
    """The query's transactional ids start with it; its progress group is named it."""
    client: ClientConfig = field(default_factory=ClientConfig)
    """The destination's client settings."""
    source_client: ClientConfig = field(default_factory=ClientConfig)
    produce: ProduceConfig = field(default_factory=ProduceConfig)


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One row of rows=batches: a source batch, viewed in its Arrow buffer (never copied)."""

    topic: str
    partition: int
    base_offset: int
    last_offset: int
    batch: RecordBatchView


def batch_rows_of(rb: pa.RecordBatch) -> Iterator[BatchRow]:
    """The rows of one Arrow record batch; their views point into `rb`, which must be kept
    until they are sent."""
    topics = rb.column("topic").to_pylist()
    partitions = rb.column("partition").to_pylist()
    bases = rb.column("baseOffset").to_pylist()
    lasts = rb.column("lastOffset").to_pylist()
    batch_col = rb.column("batch")
    _validity, offsets_buf, data_buf = batch_col.buffers()
    assert offsets_buf is not None and data_buf is not None
    offsets = np.frombuffer(offsets_buf, dtype=np.int32)[
        batch_col.offset : batch_col.offset + len(batch_col) + 1
    ]
    data = memoryview(data_buf)
    for i, topic in enumerate(topics):
        view = RecordBatchView.from_buffer(data[offsets[i] : offsets[i + 1]])
        yield BatchRow(topic, partitions[i], bases[i], lasts[i], view)


@dataclass(frozen=True, slots=True)
class SourceRange:
    """Where a copied batch came from (its offset sync's source side)."""

    topic: str
    partition: int
    base_offset: int
    last_offset: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition} offsets {self.base_offset}-{self.last_offset}"


@dataclass(slots=True)
class MirrorStats:
    batches: int = 0
    records: int = 0
    bytes: int = 0
    syncs: int = 0
    skipped: int = 0
    """Batches a transaction of an earlier try had committed already (exactly_once)."""
    partitions: dict[str, int] = field(default_factory=dict)
    """Destination "topic-partition" -> batches written to it."""

    def count(self, topic: str, partition: int, batch: RecordBatchView) -> None:
        self.batches += 1
        self.records += batch.records_count
        self.bytes += batch.size
        key = f"{topic}-{partition}"
        self.partitions[key] = self.partitions.get(key, 0) + 1


class MirrorSession:
    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.source = shared_client(options.source, "source cluster", options.source_client)
        self.dest = shared_client(options.dest, "destination cluster", options.client)
        self.producer: IdempotentProducer[SourceRange | None] = IdempotentProducer(
            self.dest, options.produce
        )
        self.topics = DestinationTopics(self.source, self.dest)
        self._cluster: str | None = None
        self._sync_ready = False
        self._stats = MirrorStats()

    def close(self) -> None:
        self.producer.close()
        drop_client(self.source)
        drop_client(self.dest)

    @property
    def cluster(self) -> str:
        """The source cluster's id (the bootstrap list if its brokers report none)."""
        if self._cluster is None:
            meta = self.source.retrying("reading the source cluster id", self.source.metadata)
            self._cluster = meta.cluster_id or ",".join(map(str, self.options.source))
        return self._cluster

    def copy(self, rows: Iterator[pa.RecordBatch]) -> MirrorStats:
        """Write every batch row to the destination; returns what this call wrote."""
        self._stats = MirrorStats()
        # Arrow record batches stay referenced until flushed: the queued views point into them.
        held: list[pa.RecordBatch] = []
        for rb in rows:
            held.append(rb)
            self._queue(rb)
            if self.producer.queued_bytes >= self.options.buffer_bytes:
                self._flush()
                held.clear()
        self._flush()
        return self._stats

    def _queue(self, rb: pa.RecordBatch) -> None:
        rename = self.options.rename
        stats = self._stats
        for row in batch_rows_of(rb):
            dest = rename + row.topic
            self.topics.ensure(row.topic, dest, row.partition)
            source = SourceRange(row.topic, row.partition, row.base_offset, row.last_offset)
            self.producer.add(dest, row.partition, row.batch, source)
            stats.count(dest, row.partition, row.batch)

    def _flush(self) -> None:
        self.producer.flush(self._on_written)

    def _on_written(self, written: list[Written[SourceRange | None]]) -> None:
        topic = self.options.sync_topic
        if topic is None:
            return
        syncs = offset_syncs(self.cluster, written)
        if not syncs:
            return
        self.ensure_sync_topic(topic)
        self.producer.add(topic, 0, sync_batch(syncs), None)
        self._stats.syncs += len(syncs)

    def ensure_sync_topic(self, topic: str) -> None:
        if self._sync_ready:
            return
        if topic not in partition_counts(self.dest, [topic]):
            create_topics(self.dest, [NewTopic(topic, 1, TOPIC_CONFIGS)])
        self.dest.retrying(f"waiting for {topic}", lambda: self.dest.leader(topic, 0))
        self._sync_ready = True


def offset_syncs(cluster: str, written: list[Written[SourceRange | None]]) -> list[OffsetSync]:
    """Where each acknowledged batch landed (duplicates the broker did not place: none)."""
    return [
        OffsetSync(
            cluster,
            w.tag.topic,
            w.tag.partition,
            w.tag.base_offset,
            w.tag.last_offset,
            w.topic,
            w.partition,
            w.base_offset,
        )
        for w in written
        if w.tag is not None and w.base_offset >= 0
    ]


def sync_batch(syncs: list[OffsetSync]) -> RecordBatchView:
    records = [Record(*encode_sync(s)) for s in syncs]
    return RecordBatchView.from_buffer(
        encode_batch(records, base_timestamp=int(time.time() * 1000))
    )
