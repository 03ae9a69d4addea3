"""FetchRequest and FetchResponse, written and read by hand so records are never copied.

A Fetch response can carry megabytes of record batches per partition. Readers of whole batches
(the shallow mirror) and of records (the lake) both want them as views of the received frame,
so the records of each partition come back as a memoryview slice of it; kio would copy them.
Versions 4-12 are handled: v4 is the first with an isolation level and aborted transactions,
v13 names topics by id, which the pipeline doesn't map. Field presence by version follows
Apache Kafka's FetchRequest.json / FetchResponse.json. Never does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from .apis import ApiKey, check_version, is_flexible
from .errors import DecodeError
from .primitives import (
    INT8,
    INT32,
    INT64,
    Buffer,
    has_tagged_field,
    iter_tagged_fields,
    read_array_length,
    read_bytes_length,
    read_int16,
    read_int32,
    read_string,
    skip_tagged_fields,
    write_array_length,
    write_string,
    write_uvarint,
)

__all__ = [
    "MAX_VERSION",
    "MIN_VERSION",
    "READ_COMMITTED",
    "READ_UNCOMMITTED",
    "AbortedTransaction",
    "FetchPartition",
    "FetchResponseData",
    "PartitionData",
    "encode_fetch_request",
    "fetch_request_max_bytes",
    "parse_fetch_response",
    "replace_fetch_records",
]

MIN_VERSION: Final = 4
MAX_VERSION: Final = 12
# fetch_response_names_nodes reads answers up to this version (their layout is v12's, with topic
# ids from v13 and node endpoints from v16).
NODE_ENDPOINTS_MAX_VERSION: Final = 17
READ_UNCOMMITTED: Final = 0
READ_COMMITTED: Final = 1
_CONSUMER_REPLICA_ID: Final = -1
_NO_SESSION: Final = 0
_FULL_FETCH_EPOCH: Final = -1  # sessionless fetch (KIP-227)
_NO_LEADER_EPOCH: Final = -1


@dataclass(frozen=True, slots=True)
class FetchPartition:
    """One partition to fetch, in a request."""

    topic: str
    partition: int
    fetch_offset: int
    partition_max_bytes: int


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    producer_id: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class PartitionData:
    """One partition's answer; `records` is a view into the response frame."""

    topic: str
    partition: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted_transactions: tuple[AbortedTransaction, ...] | None
    """None when the broker sent no list (read_uncommitted, or a broker that keeps none)."""
    records: memoryview
    current_leader: tuple[int, int] | None = None
    """(leader id, leader epoch) from tag 1 (v12+), when the broker names a new leader."""


@dataclass(frozen=True, slots=True)
class FetchResponseData:
    throttle_time_ms: int
    error_code: int
    partitions: tuple[PartitionData, ...]


def _check_version(version: int) -> None:
    check_version(ApiKey.FETCH, version, MIN_VERSION, MAX_VERSION)


def encode_fetch_request(
    version: int,
    partitions: Sequence[FetchPartition],
    *,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    isolation_level: int,
    rack_id: str = "",
) -> bytes:
    """A sessionless FetchRequest body (no header) as a consumer (replica id -1) sends it."""
    _check_version(version)
    flexible = is_flexible(ApiKey.FETCH, version)
    out = bytearray()
    out += INT32.pack(_CONSUMER_REPLICA_ID) + INT32.pack(max_wait_ms) + INT32.pack(min_bytes)
    out += INT32.pack(max_bytes) + INT8.pack(isolation_level)
    if version >= 7:
        out += INT32.pack(_NO_SESSION) + INT32.pack(_FULL_FETCH_EPOCH)
    topics: dict[str, list[FetchPartition]] = {}
    for p in partitions:
        topics.setdefault(p.topic, []).append(p)
    out += write_array_length(len(topics), flexible)
    for topic, items in topics.items():
        out += write_string(topic, flexible) + write_array_length(len(items), flexible)
        for p in items:
            out += INT32.pack(p.partition)
            if version >= 9:
                out += INT32.pack(_NO_LEADER_EPOCH)
            out += INT64.pack(p.fetch_offset)
            if version >= 12:
                out += INT32.pack(_NO_LEADER_EPOCH)  # last fetched epoch: unknown
            if version >= 5:
                out += INT64.pack(-1)  # log start offset: only followers send one
            out += INT32.pack(p.partition_max_bytes)
            if flexible:
                out += b"\x00"
        if flexible:
            out += b"\x00"
    if version >= 7:
        out += write_array_length(0, flexible)  # forgotten topics: none, sessionless
    if version >= 11:
        out += write_string(rack_id, flexible)
    if flexible:
        out += b"\x00"
    return bytes(out)


def _read_int64(buf: Buffer, offset: int) -> tuple[int, int]:
    if offset + 8 > len(buf):
        raise DecodeError("truncated int64 in FetchResponse")
    return INT64.unpack_from(buf, offset)[0], offset + 8


def _checked_count(count: int, offset: int, end: int, min_size: int, what: str) -> int:
    # Only AbortedTransactions is nullable (read before this check); Kafka rejects a null
    # Responses or Partitions array, so a negative count here is a malformed response.
    if count < 0:
        raise DecodeError(f"FetchResponse sends {what} as a null array ({count})")
    # Reject counts the remaining bytes can't hold before looping over them.
    if count > (end - offset) // min_size:
        raise DecodeError(f"FetchResponse claims {count} {what} in {end - offset} bytes")
    return count


def _read_aborted(
    view: memoryview, offset: int, flexible: bool
) -> tuple[tuple[AbortedTransaction, ...] | None, int]:
    count, offset = read_array_length(view, offset, flexible)
    if count < 0:
        return None, offset
    count = _checked_count(count, offset, len(view), 16, "aborted transactions")
    out = []
    for _ in range(count):
        producer_id, offset = _read_int64(view, offset)
        first_offset, offset = _read_int64(view, offset)
        if flexible:
            offset = skip_tagged_fields(view, offset)
        out.append(AbortedTransaction(producer_id, first_offset))
    return tuple(out), offset


# Where one partition's records are in a response: the length field's start, the records'
# start and end.
_Span = tuple[int, int, int]


def _read_partition(
    view: memoryview,
    offset: int,
    topic: str,
    version: int,
    flexible: bool,
    spans: list[_Span] | None = None,
) -> tuple[PartitionData, int]:
    partition, offset = read_int32(view, offset)
    error_code, offset = read_int16(view, offset)
    high_watermark, offset = _read_int64(view, offset)
    last_stable_offset, offset = _read_int64(view, offset)
    log_start_offset = -1
    if version >= 5:
        log_start_offset, offset = _read_int64(view, offset)
    aborted, offset = _read_aborted(view, offset, flexible)
    if version >= 11:
        _preferred_read_replica, offset = read_int32(view, offset)
    length_at = offset
    size, offset = read_bytes_length(view, offset, flexible)
    if size > len(view) - offset:
        raise DecodeError(f"records of {topic}-{partition} run past the end of the response")
    records = view[offset : offset + max(size, 0)]
    if spans is not None:
        spans.append((length_at, offset, offset + max(size, 0)))
    offset += max(size, 0)
    current_leader = None
    if flexible:
        for tag, start, end in iter_tagged_fields(view, offset):
            if tag == 1 and end - start >= 8:  # CurrentLeader: leader id, leader epoch
                leader_id, pos = read_int32(view, start)
                leader_epoch, _ = read_int32(view, pos)
                current_leader = (leader_id, leader_epoch)
        offset = skip_tagged_fields(view, offset)
    data = PartitionData(
        topic,
        partition,
        error_code,
        high_watermark,
        last_stable_offset,
        log_start_offset,
        aborted,
        records,
        current_leader,
    )
    return data, offset


def parse_fetch_response(frame: Buffer, body_offset: int, version: int) -> FetchResponseData:
    """Read a FetchResponse body that runs from body_offset to the end of frame."""
    _check_version(version)
    data, offset = _read_body(frame, body_offset, version)
    view = memoryview(frame)
    if is_flexible(ApiKey.FETCH, version):
        offset = skip_tagged_fields(view, offset)
    if offset != len(view):
        raise DecodeError(f"FetchResponse v{version} has {len(view) - offset} trailing bytes")
    return data


def fetch_response_names_nodes(frame: Buffer, body_offset: int, version: int) -> bool:
    """Whether a FetchResponse carries node endpoints (v16+, top-level tag 0), i.e. broker
    addresses a proxy must rewrite. Most answers carry none. Raises DecodeError for a
    version this reader does not know (v18 and later)."""
    if version < 16:
        return False
    if version > NODE_ENDPOINTS_MAX_VERSION:
        raise DecodeError(f"Fetch v{version} is newer than kipside's reader")
    _, offset = _read_body(frame, body_offset, version)
    view = memoryview(frame)
    if skip_tagged_fields(view, offset) != len(view):
        raise DecodeError(f"FetchResponse v{version} has trailing bytes")
    return has_tagged_field(view, offset, 0)


def _read_body(
    frame: Buffer, body_offset: int, version: int, spans: list[_Span] | None = None
) -> tuple[FetchResponseData, int]:
    """The response up to its top-level tagged fields, and where they start (v4-v17; from
    v13 a topic is named by its id, kept as hex in PartitionData.topic)."""
    flexible = is_flexible(ApiKey.FETCH, version)
    view = memoryview(frame)
    offset = body_offset
    throttle, offset = read_int32(view, offset)
    error_code = 0
    if version >= 7:
        error_code, offset = read_int16(view, offset)
        _session_id, offset = read_int32(view, offset)
    n_topics, offset = read_array_length(view, offset, flexible)
    n_topics = _checked_count(n_topics, offset, len(view), 2, "topics")
    partitions: list[PartitionData] = []
    for _ in range(n_topics):
        if version >= 13:
            topic: str | None = bytes(view[offset : offset + 16]).hex()
            offset += 16
        else:
            topic, offset = read_string(view, offset, flexible)
        if topic is None:
            raise DecodeError("FetchResponse names a null topic")
        count, offset = read_array_length(view, offset, flexible)
        count = _checked_count(count, offset, len(view), 30, f"partitions of {topic}")
        for _ in range(count):
            data, offset = _read_partition(view, offset, topic, version, flexible, spans)
            partitions.append(data)
        if flexible:
            offset = skip_tagged_fields(view, offset)
    return FetchResponseData(throttle, error_code, tuple(partitions)), offset


def fetch_request_max_bytes(frame: Buffer, body_offset: int, version: int) -> int:
    """A FetchRequest's max_bytes: what the client takes in one answer (v3 to v14, where it
    follows replica id, max wait and min bytes). Raises DecodeError for another version or a
    request too short to hold it."""
    if not 3 <= version <= 14:
        raise DecodeError(f"Fetch v{version} keeps max_bytes elsewhere")
    value, _ = read_int32(memoryview(frame), body_offset + 12)
    return value


def replace_fetch_records(
    frame: Buffer, body_offset: int, version: int, records: Mapping[int, Buffer]
) -> bytes:
    """The FetchResponse `frame` (size prefix included) with some partitions' records replaced:
    `records` maps a partition's position in the answer (parse_fetch_response's order) to its
    new records. Every other byte is kept as it came; the frame's size is the new one."""
    _check_version(version)
    spans: list[_Span] = []
    _read_body(frame, body_offset, version, spans)
    flexible = is_flexible(ApiKey.FETCH, version)
    view = memoryview(frame)
    chunks: list[Buffer] = []
    position = 4
    for index in sorted(records):
        length_at, _start, end = spans[index]
        new = records[index]
        size = write_uvarint(len(new) + 1) if flexible else INT32.pack(len(new))
        chunks += [view[position:length_at], size, new]
        position = end
    chunks.append(view[position:])
    body = b"".join(chunks)
    return INT32.pack(len(body)) + body
