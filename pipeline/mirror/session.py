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

__all__ = ["MirrorSession", "MirrorStats", "SinkOptions", "discard_session", "session_for"]


@dataclass(frozen=True, slots=True)
class SinkOptions:
    dest: tuple[Address, ...]
    source: tuple[Address, ...]
    rename: str = ""
    sync_topic: str | None = DEFAULT_TOPIC
    buffer_bytes: int = 64 * 1024 * 1024
    client: ClientConfig = field(default_factory=ClientConfig)
    """The destination's client settings."""
    source_client: ClientConfig = field(default_factory=ClientConfig)
    produce: ProduceConfig = field(default_factory=ProduceConfig)


@dataclass(frozen=True, slots=True)
class _Source:
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
    partitions: dict[str, int] = field(default_factory=dict)
    """Destination "topic-partition" -> batches written to it."""


class MirrorSession:
    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.source = shared_client(options.source, "source cluster", options.source_client)
        self.dest = shared_client(options.dest, "destination cluster", options.client)
        self.producer: IdempotentProducer[_Source | None] = IdempotentProducer(
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
        rename = self.options.rename
        for i, topic in enumerate(topics):
            view = RecordBatchView.from_buffer(data[offsets[i] : offsets[i + 1]])
            dest = rename + topic
            partition = partitions[i]
            self.topics.ensure(topic, dest, partition)
            self.producer.add(dest, partition, view, _Source(topic, partition, bases[i], lasts[i]))
            stats = self._stats
            stats.batches += 1
            stats.records += view.records_count
            stats.bytes += view.size
            key = f"{dest}-{partition}"
            stats.partitions[key] = stats.partitions.get(key, 0) + 1

    def _flush(self) -> None:
        self.producer.flush(self._on_written)

    def _on_written(self, written: list[Written[_Source | None]]) -> None:
        topic = self.options.sync_topic
        if topic is None:
            return
        syncs = [
            OffsetSync(
                self.cluster,
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
        if not syncs:
            return
        self._ensure_sync_topic(topic)
        records = [Record(*encode_sync(s)) for s in syncs]
        batch = encode_batch(records, base_timestamp=int(time.time() * 1000))
        self.producer.add(topic, 0, RecordBatchView.from_buffer(batch), None)
        self._stats.syncs += len(syncs)

    def _ensure_sync_topic(self, topic: str) -> None:
        if self._sync_ready:
            return
        if topic not in partition_counts(self.dest, [topic]):
            create_topics(self.dest, [NewTopic(topic, 1, TOPIC_CONFIGS)])
        self.dest.retrying(f"waiting for {topic}", lambda: self.dest.leader(topic, 0))
        self._sync_ready = True


_sessions: dict[SinkOptions, MirrorSession] = {}


def session_for(options: SinkOptions) -> MirrorSession:
    session = _sessions.get(options)
    if session is None:
        session = _sessions[options] = MirrorSession(options)
    return session


def discard_session(options: SinkOptions) -> None:
    """After a failure: close the clients and forget the producer session."""
    session = _sessions.pop(options, None)
    if session is not None:
        session.close()
