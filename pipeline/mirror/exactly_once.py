"""The mirror's exactly-once mode (--exactly-once): each source partition's batches of a
micro-batch are copied in one Kafka transaction on the destination, with their offset syncs and
the partition's progress.

Per source partition P of topic T, in each micro-batch (a write task holds P's whole range):

1. The transaction of transactional id PREFIX-T-P starts: InitProducerId bumps the id's epoch,
   which fences any older writer of P (a killed run's task, a retried task still running) and
   aborts what it left open. PREFIX derives from the query (its checkpoint), so a restarted
   mirror fences the writers of the run it replaces.
2. The partition's progress is read: the committed offset of the destination partition in the
   consumer group named PREFIX, which only committed transactions move (read with
   require_stable). Batches that end below it were copied by a transaction that committed
   before a crash, and are skipped (`Resume`).
3. The other batches are written in the transaction, then their offset syncs, then the
   progress (the next source offset) as the group's offset (TxnOffsetCommit); EndTxn commits
   all of it at once.

So read_committed consumers of the destination see each source record once, whatever is
killed when: an uncommitted transaction is aborted by the next writer of its partition, and a
committed one is never copied again. Spark's checkpoint still decides what a micro-batch
covers; the group decides what of it is already on the destination.

What it must never do: write a partition's batches outside a transaction, commit progress
without the batches (or the reverse), or skip a batch no committed transaction holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from kipside.pipeline.kafka.admin import committed_offsets
from kipside.pipeline.kafka.client import DedicatedConnection
from kipside.pipeline.kafka.producer import Written
from kipside.pipeline.kafka.transaction import Transaction

from .session import (
    BatchRow,
    MirrorSession,
    MirrorStats,
    SinkOptions,
    SourceRange,
    batch_rows_of,
    offset_syncs,
    sync_batch,
)

__all__ = ["ExactlyOnceSession", "Resume", "query_prefix", "transactional_id"]


def query_prefix(query_id: str) -> str:
    """The transactional-id prefix and progress group of the query named `query_id`."""
    return f"kipside-mirror-{hashlib.sha256(query_id.encode()).hexdigest()[:16]}"


def transactional_id(prefix: str, topic: str, partition: int) -> str:
    return f"{prefix}-{topic}-{partition}"


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a partition's copy resumes: the next source offset a committed transaction has
    not copied (None: nothing of it was ever committed)."""

    committed: int | None

    def copies(self, last_offset: int) -> bool:
        """Whether the batch ending at `last_offset` still has to be copied."""
        return self.committed is None or last_offset >= self.committed


@dataclass
class _PartitionCopy:
    topic: str
    partition: int
    dest_topic: str
    transaction: Transaction[SourceRange | None]
    resume: Resume
    next_offset: int | None = None
    """The next source offset once the batches added so far are committed."""
    syncs: int = 0
    held: list[pa.RecordBatch] = field(default_factory=list)


class ExactlyOnceSession(MirrorSession):
    """A worker's mirror in exactly-once mode: one transaction per source partition per task."""

    def __init__(self, options: SinkOptions) -> None:
        super().__init__(options)
        self.group = options.transactional_prefix
        # One partition's transaction at a time: their producers share these connections.
        self._connections: dict[int, DedicatedConnection] = {}

    def close(self) -> None:
        for dedicated in self._connections.values():
            dedicated.connection.close()
        self._connections.clear()
        super().close()

    def copy(self, rows: Iterator[pa.RecordBatch]) -> MirrorStats:
        self._stats = MirrorStats()
        current: _PartitionCopy | None = None
        for rb in rows:
            for row in batch_rows_of(rb):
                if current is None or (current.topic, current.partition) != (
                    row.topic,
                    row.partition,
                ):
                    if current is not None:
                        self._finish(current)
                    current = self._start(row.topic, row.partition)
                if not current.held or current.held[-1] is not rb:
                    current.held.append(rb)  # the queued views point into it
                self._add(current, row)
        if current is not None:
            self._finish(current)
        return self._stats

    def _start(self, topic: str, partition: int) -> _PartitionCopy:
        dest_topic = self.options.rename + topic
        # The partition exists before its progress is asked for (a broker may refuse to
        # answer for one it does not know).
        self.topics.ensure(topic, dest_topic, partition)
        transaction: Transaction[SourceRange | None] = Transaction(
            self.dest,
            transactional_id(self.options.transactional_prefix, topic, partition),
            self.options.produce,
            connections=self._connections,
        )
        committed = committed_offsets(self.dest, self.group, [(dest_topic, partition)])
        resume = Resume(committed.get((dest_topic, partition)))
        return _PartitionCopy(topic, partition, dest_topic, transaction, resume)

    def _add(self, copy: _PartitionCopy, row: BatchRow) -> None:
        if not copy.resume.copies(row.last_offset):
            self._stats.skipped += 1
            return
        self.topics.ensure(row.topic, copy.dest_topic, row.partition)
        source = SourceRange(row.topic, row.partition, row.base_offset, row.last_offset)
        copy.transaction.add(copy.dest_topic, row.partition, row.batch, source)
        copy.next_offset = row.last_offset + 1
        self._stats.count(copy.dest_topic, row.partition, row.batch)
        if copy.transaction.producer.queued_bytes >= self.options.buffer_bytes:
            copy.transaction.flush(lambda written: self._syncs(copy, written))
            copy.held = copy.held[-1:]

    def _syncs(self, copy: _PartitionCopy, written: list[Written[SourceRange | None]]) -> None:
        topic = self.options.sync_topic
        syncs = offset_syncs(self.cluster, written)
        if topic is None or not syncs:
            return
        self.ensure_sync_topic(topic)
        copy.transaction.add(topic, 0, sync_batch(syncs), None)
        self._stats.syncs += len(syncs)

    def _finish(self, copy: _PartitionCopy) -> None:
        transaction = copy.transaction
        try:
            if copy.next_offset is None:
                return  # every batch was committed before: nothing to write
            transaction.flush(lambda written: self._syncs(copy, written))
            offsets = {(copy.dest_topic, copy.partition): copy.next_offset}
            transaction.send_offsets(self.group, offsets)
            transaction.commit()
        finally:
            transaction.release()
            copy.held.clear()
