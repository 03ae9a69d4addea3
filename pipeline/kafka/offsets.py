"""Where partitions start and end: ListOffsets for the earliest offset and for timestamps, and
the Fetch response's watermarks for the end.

The end of a partition is taken from a Fetch response (high watermark, last stable offset), the
figures a consumer's lag is computed from and the ones the broker itself applies to
read_committed reads. ListOffsets(latest) would do on Apache Kafka, but Tansu 0.6.0 answers it
with the last batch's base offset + 1, which cuts multi-record batches (seen here, without
kipside), while its Fetch watermarks are right. The probe fetches at most one batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

from kipside.protocol import (
    FETCH_MAX_VERSION,
    FETCH_MIN_VERSION,
    READ_UNCOMMITTED,
    ApiKey,
    ErrorCode,
    FetchPartition,
    VersionRange,
    batch_extent,
    encode_fetch_request,
    parse_fetch_response,
)

from .client import KafkaClient, body_of, check_error
from .errors import RetriableError

__all__ = [
    "EARLIEST",
    "LATEST",
    "TopicPartition",
    "Watermarks",
    "bytes_per_offset",
    "list_offsets",
    "watermarks",
]

TopicPartition = tuple[str, int]
EARLIEST: Final = -2
LATEST: Final = -1
LIST_OFFSETS: Final = VersionRange(2, 9)
FETCH: Final = VersionRange(FETCH_MIN_VERSION, FETCH_MAX_VERSION)
_OUT_OF_RANGE: Final = int(ErrorCode.offset_out_of_range)
_PROBE_BYTES: Final = 64 * 1024
_V = TypeVar("_V")


@dataclass(frozen=True, slots=True)
class Watermarks:
    log_start: int
    high_watermark: int
    last_stable: int
    bytes_per_offset: float | None = None
    """Bytes per offset of the batches the probe saw from the probed offset on (their headers
    give each one's size and offsets), when it saw any."""

    def end(self, committed_only: bool) -> int:
        """Where a reader stops: the last stable offset for read_committed, else the HW."""
        return self.last_stable if committed_only and self.last_stable >= 0 else self.high_watermark


def _by_leader(
    client: KafkaClient, partitions: Iterable[TopicPartition]
) -> dict[int, list[TopicPartition]]:
    groups: dict[int, list[TopicPartition]] = {}
    for tp in partitions:
        groups.setdefault(client.leader(*tp), []).append(tp)
    return groups


def list_offsets(
    client: KafkaClient, queries: Mapping[TopicPartition, int], *, committed_only: bool = False
) -> dict[TopicPartition, int]:
    """ListOffsets per partition: EARLIEST, LATEST, or a timestamp (ms).

    For a timestamp the answer is the first offset whose timestamp is at or after it, or -1 if
    there is none (as Kafka says).
    """

    def attempt() -> dict[TopicPartition, int]:
        found: dict[TopicPartition, int] = {}
        for leader, tps in _by_leader(client, queries).items():
            body = _list_offsets_body({tp: queries[tp] for tp in tps}, committed_only)
            response = client.request(leader, ApiKey.LIST_OFFSETS, LIST_OFFSETS, body).decode()
            for topic in response.topics:
                for p in topic.partitions:
                    tp = (str(topic.name), int(p.partition_index))
                    check_error(int(p.error_code), f"ListOffsets for {tp[0]}-{tp[1]}", client.where)
                    found[tp] = int(p.offset)
        return answered_all(queries, found, "ListOffsets", client)

    return client.retrying("listing offsets", attempt)


def _list_offsets_body(
    queries: Mapping[TopicPartition, int], committed_only: bool
) -> Callable[[int], bytes]:
    topics: dict[str, list[dict[str, int]]] = {}
    for (topic, partition), timestamp in queries.items():
        topics.setdefault(topic, []).append({"partition_index": partition, "timestamp": timestamp})

    fields = {
        "replica_id": -1,
        "isolation_level": int(committed_only),
        "topics": [{"name": t, "partitions": parts} for t, parts in topics.items()],
    }
    return body_of(ApiKey.LIST_OFFSETS, fields)


def watermarks(
    client: KafkaClient, probe_at: Mapping[TopicPartition, int]
) -> dict[TopicPartition, Watermarks]:
    """Log start, high watermark and last stable offset of each partition, from one Fetch per
    leader at `probe_at` (any offset believed to be in the log; the earliest is used if not)."""

    def attempt() -> dict[TopicPartition, Watermarks]:
        found: dict[TopicPartition, Watermarks] = {}
        retry_at_start: dict[TopicPartition, int] = {}
        for leader, tps in _by_leader(client, probe_at).items():
            found.update(_probe(client, leader, {tp: probe_at[tp] for tp in tps}, retry_at_start))
        if retry_at_start:
            starts = list_offsets(client, {tp: EARLIEST for tp in retry_at_start})
            for leader, tps in _by_leader(client, starts).items():
                found.update(_probe(client, leader, {tp: starts[tp] for tp in tps}, {}))
        return answered_all(probe_at, found, "Fetch", client)

    return client.retrying("reading partition watermarks", attempt)


def _probe(
    client: KafkaClient,
    leader: int,
    offsets: Mapping[TopicPartition, int],
    out_of_range: dict[TopicPartition, int],
) -> dict[TopicPartition, Watermarks]:
    """One leader's partitions, probed at `offsets`: watermarks, and the sizes of a few batches
    of each that has data there. A broker may spend a response's byte limit on the first
    partition's batch (Tansu 0.6.0 does); partitions it left without a batch are asked again,
    without the ones answered, until each has shown one."""
    found: dict[TopicPartition, Watermarks] = {}
    pending = dict(offsets)
    while pending:
        answered = _probe_once(client, leader, pending, out_of_range)
        found.update(answered)
        unsized = {
            tp: pending[tp]
            for tp, m in answered.items()
            if m.bytes_per_offset is None and pending[tp] < m.high_watermark
        }
        if len(unsized) == len(pending):
            break  # nothing shown this time: the broker has nothing more to give
        pending = unsized
    return found


def _probe_once(
    client: KafkaClient,
    leader: int,
    offsets: Mapping[TopicPartition, int],
    out_of_range: dict[TopicPartition, int],
) -> dict[TopicPartition, Watermarks]:
    # Up to _PROBE_BYTES per partition; a batch cut by the limit still shows its header.
    parts = [FetchPartition(t, p, max(o, 0), _PROBE_BYTES) for (t, p), o in offsets.items()]

    def body(version: int) -> bytes:
        return encode_fetch_request(
            version,
            parts,
            max_wait_ms=1,
            min_bytes=1,
            max_bytes=_PROBE_BYTES * len(parts),
            isolation_level=READ_UNCOMMITTED,
        )

    response = client.request(leader, ApiKey.FETCH, FETCH, body)
    data = parse_fetch_response(response.frame, response.body_offset, response.api_version)
    check_error(data.error_code, "Fetch", client.where)
    found = {}
    for p in data.partitions:
        tp = (p.topic, p.partition)
        if p.error_code == _OUT_OF_RANGE:
            out_of_range[tp] = offsets[tp]
            continue
        check_error(p.error_code, f"Fetch for {tp[0]}-{tp[1]}", client.where)
        density = bytes_per_offset(p.records, offsets[tp])
        found[tp] = Watermarks(p.log_start_offset, p.high_watermark, p.last_stable_offset, density)
    return found


def bytes_per_offset(records: memoryview, offset: int) -> float | None:
    """Bytes per offset of the batches whose headers `records` holds (the last may be cut
    short), counting from the one holding `offset`; None if there are none."""
    size = spanned = 0
    view = memoryview(records)
    pos = 0
    while (extent := batch_extent(view[pos:])) is not None:
        base, length, count = extent
        if base + count > offset:
            size += length
            spanned += count
        pos += length
        if pos >= len(view):
            break
    return size / spanned if spanned else None


def answered_all(
    asked: Iterable[TopicPartition], found: dict[TopicPartition, _V], api: str, client: KafkaClient
) -> dict[TopicPartition, _V]:
    """`found`, if every partition asked about is in it; else RetriableError naming the others."""
    missing = set(asked) - set(found)
    if missing:
        names = ", ".join(f"{t}-{p}" for t, p in sorted(missing))
        raise RetriableError(f"{api}: {client.where} did not answer for {names}")
    return found
