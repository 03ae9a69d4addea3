"""`kipside mirror translate`: a consumer group's source offsets, as destination offsets.

Reads the group's committed offsets on the source (OffsetFetch), every offset sync on the
destination (pipeline.mirror.offset_sync has the format), and prints where each partition's
consumer should resume on the destination. With --commit it commits those offsets to the same
group on the destination, as `kafka-consumer-groups --reset-offsets` would; the group must
have no active members there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TextIO

from kipside.pipeline.kafka.admin import commit_group_offsets, group_offsets, partition_counts
from kipside.pipeline.kafka.client import KafkaClient
from kipside.pipeline.kafka.errors import KafkaError
from kipside.pipeline.kafka.fetcher import FetchConfig, RangeReader
from kipside.pipeline.kafka.offsets import EARLIEST, list_offsets, watermarks
from kipside.pipeline.kafka.properties import ClientProperties, client_config
from kipside.protocol import Address, decode_batch_records

from .offset_sync import OffsetSync, SyncIndex, Translation, decode_sync, translate_all

__all__ = ["TranslateJob", "read_syncs", "run_translate"]


@dataclass(frozen=True)
class TranslateJob:
    source: str
    dest: str
    group: str
    sync_topic: str
    commit: bool = False
    as_json: bool = False
    timeout_ms: int = 30_000
    source_config: ClientProperties | None = None
    dest_config: ClientProperties | None = None


def read_syncs(
    dest: KafkaClient, topic: str, start: int | None = None
) -> tuple[list[OffsetSync], int, int]:
    """The sync records of the topic from `start` (None: its beginning), oldest first, how many
    records there were not syncs (skipped, reported), and where the next read starts. Read
    committed: with --exactly-once, syncs are written in the transactions of their batches."""
    if topic not in partition_counts(dest, [topic]):
        raise KafkaError(
            f"{dest.where} has no offset-sync topic {topic!r}: nothing was mirrored there yet, "
            "or the mirror ran with another --offset-sync-topic"
        )
    if start is None:
        start = list_offsets(dest, {(topic, 0): EARLIEST})[(topic, 0)]
    end = watermarks(dest, {(topic, 0): start})[(topic, 0)].end(committed_only=True)
    reader = RangeReader(dest, FetchConfig(committed_only=True))
    syncs = []
    foreign = 0
    for batch in reader.read(topic, 0, start, max(end, start)):
        for key, value in decode_batch_records(batch):
            try:
                if key is None or value is None:
                    raise ValueError("a sync has a key and a value")
                syncs.append(decode_sync(key, value))
            except ValueError:
                foreign += 1
    return syncs, foreign, max(end, start)


def _clients(job: TranslateJob) -> tuple[KafkaClient, KafkaClient]:
    source = KafkaClient(
        Address.parse_list(job.source, what="--source"),
        role="source cluster",
        config=client_config(job.source_config, "kipside-mirror", job.timeout_ms),
    )
    dest = KafkaClient(
        Address.parse_list(job.dest, what="--dest"),
        role="destination cluster",
        config=client_config(job.dest_config, "kipside-mirror", job.timeout_ms),
    )
    return source, dest


def run_translate(job: TranslateJob, out: TextIO, err: TextIO) -> int:
    try:
        source, dest = _clients(job)
    except ValueError as exc:
        err.write(f"kipside mirror translate: error: {exc}\n")
        return 2
    with source, dest:
        try:
            committed = group_offsets(source, job.group)
            cluster = source.retrying("reading the cluster id", source.metadata).cluster_id
            syncs, foreign, _ = read_syncs(dest, job.sync_topic)
            index = SyncIndex(cluster or job.source, syncs)
            done, missing = translate_all(index, committed)
            if job.commit and done:
                commit_group_offsets(
                    dest, job.group, {(t.dest_topic, t.dest_partition): t.dest_offset for t in done}
                )
        except KafkaError as exc:
            err.write(f"kipside mirror translate: error: {exc}\n")
            return 1
    _print(job, done, missing, out)
    if foreign:
        err.write(
            f"kipside mirror translate: warning: {foreign} records of {job.sync_topic} are not "
            "offset syncs (something else writes to that topic); skipped\n"
        )
    for topic, partition in missing:
        err.write(
            f"kipside mirror translate: warning: {topic}-{partition} has a committed offset but "
            "nothing of it was mirrored; left out\n"
        )
    if any(not t.exact for t in done):
        err.write(
            "kipside mirror translate: warning: some offsets are older than the sync history; "
            "their consumers resume at the oldest mirrored batch and may see records again\n"
        )
    if job.commit:
        err.write(
            f"kipside mirror translate: committed {len(done)} offsets for group {job.group!r} "
            f"on {job.dest}\n"
        )
    return 0


def _print(
    job: TranslateJob, done: Sequence[Translation], missing: Sequence[tuple[str, int]], out: TextIO
) -> None:
    if job.as_json:
        out.write(
            json.dumps({"group": job.group, "translations": [asdict(t) for t in done]}, indent=2)
            + "\n"
        )
        return
    rows = [("SOURCE", "OFFSET", "DESTINATION", "OFFSET", "EXACT")]
    rows += [
        (
            f"{t.topic}-{t.partition}",
            str(t.source_offset),
            f"{t.dest_topic}-{t.dest_partition}",
            str(t.dest_offset),
            "yes" if t.exact else "no",
        )
        for t in done
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")
