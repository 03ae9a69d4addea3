"""ProduceRequest and ProduceResponse, read and written by hand for multi-batch produce.

Coalescing must take requests apart per partition and build new ones without touching a single
record byte, so records are carried as zero-copy memoryviews from the client's frame to the
upstream frame. Versions 3-12 are handled (v13 names topics by id, which kipside doesn't map);
v0-2 carry legacy message sets and are never coalesced. Field presence by version follows
Apache Kafka's ProduceRequest.json / ProduceResponse.json. Never does I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from .apis import ApiKey, check_version, is_flexible
from .errors import DecodeError, LimitExceeded
from .primitives import (
    INT16,
    INT32,
    INT64,
    Buffer,
    DecodeLimits,
    has_tagged_field,
    iter_tagged_fields,
    read_array_length,
    read_bytes_length,
    read_compact_nullable_string,
    read_int16,
    read_int32,
    read_string,
    read_uvarint,
    skip_tagged_fields,
    write_array_length,
    write_string,
    write_uvarint,
)
from .records import count_batches_in

MIN_VERSION: Final = 3
MAX_VERSION: Final = 12
_FIRST_FLEXIBLE: Final = 9
_ACKS_TIMEOUT = struct.Struct(">hi")
_INT32_AT = struct.Struct(">i").unpack_from
_PARTITION_HEAD = struct.Struct(">ihq")  # index, error_code, base_offset
_LEADER = struct.Struct(">ii")  # CurrentLeader (partition tag 0): leader id, leader epoch


@dataclass(frozen=True, slots=True)
class PartitionBatch:
    """One partition's records from a ProduceRequest (a zero-copy view of the client's bytes)."""

    topic: str
    partition: int
    records: memoryview | None
    prefix: bytes = b""
    """Bytes sent before `records` (a re-stamped batch header), so neither is copied."""


@dataclass(frozen=True, slots=True)
class ProduceRequestData:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    partitions: tuple[PartitionBatch, ...]


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """One partition's answer, with every field any version 3-12 carries."""

    topic: str
    partition: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    record_errors: tuple[tuple[int, str | None], ...] = ()
    error_message: str | None = None
    current_leader: tuple[int, int] | None = None  # (leader id, leader epoch), v10+ tag 0


@dataclass(frozen=True, slots=True)
class NodeEndpointData:
    node_id: int
    host: str
    port: int
    rack: str | None


@dataclass(frozen=True, slots=True)
class ProduceResponseData:
    partitions: tuple[PartitionResult, ...]
    throttle_time_ms: int = 0
    node_endpoints: tuple[NodeEndpointData, ...] = field(default=())


def _check_version(version: int) -> None:
    check_version(ApiKey.PRODUCE, version, MIN_VERSION, MAX_VERSION)


def parse_produce_request(
    frame: Buffer, body_offset: int, version: int, limits: DecodeLimits | None = None
) -> ProduceRequestData:
    """Read a ProduceRequest body; records stay views into frame. `limits` caps its topics,
    partitions and tagged fields (LimitExceeded), checked before each array is walked.

    On every coalesced request's path, so the usual shapes are read inline: one-byte varints
    and no tagged fields; anything else goes through the general readers."""
    _check_version(version)
    flexible = version >= _FIRST_FLEXIBLE
    view = memoryview(frame)
    end = len(view)
    offset = body_offset
    transactional_id, offset = read_string(view, offset, flexible)
    if offset + 10 > end:
        raise DecodeError("ProduceRequest is too short for acks, timeout and topics")
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(view, offset)
    offset += 6
    topics, offset = read_array_length(view, offset, flexible)
    cap = limits.max_partitions if limits is not None else None
    if cap is not None and topics > cap:
        raise _too_many("topics", topics, cap)
    batches: list[PartitionBatch] = []
    append = batches.append
    for _ in range(max(topics, 0)):
        topic, offset = read_string(view, offset, flexible)
        if topic is None:
            raise DecodeError("ProduceRequest names a null topic")
        count, offset = read_array_length(view, offset, flexible)
        if cap is not None and len(batches) + count > cap:
            raise _too_many("partitions", len(batches) + count, cap)
        for _ in range(max(count, 0)):
            if offset + 5 > end:
                raise DecodeError("truncated partition of a ProduceRequest")
            partition = _INT32_AT(view, offset)[0]
            offset += 4
            if flexible:
                size = view[offset]
                if size < 0x80:
                    offset += 1
                    size -= 1
                else:
                    size, offset = read_uvarint(view, offset)
                    size -= 1
            else:
                size, offset = read_int32(view, offset)
            records = None
            if size >= 0:
                if offset + size > end:
                    raise DecodeError(f"records of {topic}-{partition} run past the request end")
                records = view[offset : offset + size]
                offset += size
            if flexible:
                if offset < end and view[offset] == 0:
                    offset += 1
                else:
                    offset = skip_tagged_fields(view, offset, limits)
            append(PartitionBatch(topic, partition, records))
        if flexible:
            offset = skip_tagged_fields(view, offset, limits)
    if flexible:
        offset = skip_tagged_fields(view, offset, limits)
    if offset != end:
        raise DecodeError(f"ProduceRequest v{version} has {end - offset} trailing bytes")
    return ProduceRequestData(transactional_id, acks, timeout_ms, tuple(batches))


def _too_many(what: str, count: int, cap: int) -> LimitExceeded:
    return LimitExceeded(
        f"ProduceRequest with {count} {what}, over the cap of {cap}",
        limit="max_partitions",
        value=count,
        cap=cap,
    )


def produce_acks_offset(frame: Buffer, body_offset: int, version: int) -> int:
    """Where a ProduceRequest's acks begins (timeout_ms follows it): v3+ put the transactional
    id before it. Raises DecodeError."""
    offset = body_offset
    if version >= 9:
        length, offset = read_uvarint(frame, offset)
        offset += max(length - 1, 0)
    elif version >= 3:
        length, offset = read_int16(frame, offset)
        offset += max(length, 0)
    return offset


def produce_request_acks(frame: Buffer, body_offset: int, version: int) -> int:
    """A ProduceRequest's acks (whether it is owed an answer), any version, without parsing
    the rest. Raises DecodeError."""
    acks, _ = read_int16(frame, produce_acks_offset(frame, body_offset, version))
    return acks


@dataclass(frozen=True, slots=True)
class ProduceCounts:
    """What a ProduceRequest carries, counted (count_produce_request)."""

    transactional_id: str | None
    acks: int
    partitions: int
    batches: int
    records: int
    batch_bytes: int
    corrupt_batches: int
    """Batches whose CRC-32C does not match their bytes (their records are not counted)."""


def count_produce_request(frame: Buffer, body_offset: int, version: int) -> ProduceCounts:
    """A ProduceRequest body's figures, read as parse_produce_request reads it but without a
    PartitionBatch or a batch view per partition, nor a topic name decoded: for readers of
    packet captures, which count hundreds of thousands of requests. Raises DecodeError and
    RecordBatchError as parsing does."""
    _check_version(version)
    flexible = is_flexible(ApiKey.PRODUCE, version)
    view = memoryview(frame)
    if view.format != "B":
        view = view.cast("B")
    end = len(view)
    transactional_id, offset = read_string(view, body_offset, flexible)
    acks, offset = read_int16(view, offset)
    topics, offset = read_array_length(view, offset + 4, flexible)  # after the timeout
    partitions = batches = records = batch_bytes = corrupt = 0
    for _ in range(max(topics, 0)):
        offset = _skip_topic_name(view, offset, flexible)
        count, offset = read_array_length(view, offset, flexible)
        for _ in range(max(count, 0)):
            size, offset = read_bytes_length(view, offset + 4, flexible)  # after the index
            partitions += 1
            if size >= 0:
                stop = offset + size
                if stop > end:
                    raise DecodeError("a partition's records run past the request end")
                found, counted, bad = count_batches_in(view, offset, stop)
                batches += found
                records += counted
                corrupt += bad
                batch_bytes += size
                offset = stop
            if flexible:
                offset = skip_tagged_fields(view, offset)
        if flexible:
            offset = skip_tagged_fields(view, offset)
    if flexible:
        offset = skip_tagged_fields(view, offset)
    if offset != end:
        raise DecodeError(f"ProduceRequest v{version} has {end - offset} trailing bytes")
    return ProduceCounts(transactional_id, acks, partitions, batches, records, batch_bytes, corrupt)


def _skip_topic_name(view: memoryview, offset: int, flexible: bool) -> int:
    if flexible:
        length, offset = read_uvarint(view, offset)
        length -= 1
    else:
        length, offset = read_int16(view, offset)
    if length < 0:
        raise DecodeError("ProduceRequest names a null topic")
    return offset + length


def _group_by_topic(items: Sequence[PartitionBatch]) -> list[tuple[str, list[PartitionBatch]]]:
    groups: dict[str, list[PartitionBatch]] = {}
    for item in items:
        groups.setdefault(item.topic, []).append(item)
    return list(groups.items())


def encode_produce_request(
    version: int,
    *,
    acks: int,
    timeout_ms: int,
    partitions: Sequence[PartitionBatch],
    transactional_id: str | None = None,
) -> list[bytes | memoryview]:
    """The body of a ProduceRequest as a list of chunks (records are not copied)."""
    _check_version(version)
    flexible = is_flexible(ApiKey.PRODUCE, version)
    chunks: list[bytes | memoryview] = [
        write_string(transactional_id, flexible) + INT16.pack(acks) + INT32.pack(timeout_ms)
    ]
    groups = _group_by_topic(partitions)
    chunks.append(write_array_length(len(groups), flexible))
    for topic, items in groups:
        chunks.append(write_string(topic, flexible) + write_array_length(len(items), flexible))
        for item in items:
            records = item.records
            if records is None:
                size = b"\x00" if flexible else INT32.pack(-1)
                chunks.append(INT32.pack(item.partition) + size)
            else:
                length = len(item.prefix) + len(records)
                size = write_uvarint(length + 1) if flexible else INT32.pack(length)
                chunks.append(INT32.pack(item.partition) + size + item.prefix)
                chunks.append(records)
            if flexible:
                chunks.append(b"\x00")
        if flexible:
            chunks.append(b"\x00")
    if flexible:
        chunks.append(b"\x00")
    return chunks


def parse_produce_response(frame: Buffer, body_offset: int, version: int) -> ProduceResponseData:
    _check_version(version)
    flexible = is_flexible(ApiKey.PRODUCE, version)
    fixed = _PARTITION_HEAD.size + 8 + (8 if version >= 5 else 0)  # + append time, log start
    end = len(frame)
    offset = body_offset
    topics, offset = read_array_length(frame, offset, flexible)
    results: list[PartitionResult] = []
    for _ in range(max(topics, 0)):
        topic, offset = read_string(frame, offset, flexible)
        count, offset = read_array_length(frame, offset, flexible)
        for _ in range(max(count, 0)):
            if offset + fixed > end:
                raise DecodeError("truncated ProduceResponse partition")
            partition, error_code, base_offset = _PARTITION_HEAD.unpack_from(frame, offset)
            log_append_time = INT64.unpack_from(frame, offset + _PARTITION_HEAD.size)[0]
            log_start = INT64.unpack_from(frame, offset + 20)[0] if version >= 5 else -1
            offset += fixed
            record_errors: list[tuple[int, str | None]] = []
            error_message = None
            current_leader = None
            if version >= 8:
                n_errors, offset = read_array_length(frame, offset, flexible)
                for _ in range(max(n_errors, 0)):
                    batch_index, offset = read_int32(frame, offset)
                    message, offset = read_string(frame, offset, flexible)
                    if flexible:
                        offset = skip_tagged_fields(frame, offset)
                    record_errors.append((batch_index, message))
                error_message, offset = read_string(frame, offset, flexible)
            if flexible:
                if offset < end and frame[offset] == 0:  # the usual case: no tagged fields
                    offset += 1
                else:
                    for tag, start, stop in iter_tagged_fields(frame, offset):
                        if tag == 0 and version >= 10 and stop - start >= 8:
                            current_leader = _LEADER.unpack_from(frame, start)
                    offset = skip_tagged_fields(frame, offset)
            results.append(
                PartitionResult(
                    topic or "",
                    partition,
                    error_code,
                    base_offset,
                    log_append_time,
                    log_start,
                    tuple(record_errors),
                    error_message,
                    current_leader,
                )
            )
        if flexible:
            offset = skip_tagged_fields(frame, offset)
    throttle, endpoints = _response_tail(frame, offset, version, flexible)
    return ProduceResponseData(tuple(results), throttle, endpoints)


def _response_tail(
    frame: Buffer, offset: int, version: int, flexible: bool
) -> tuple[int, tuple[NodeEndpointData, ...]]:
    """What follows a ProduceResponse's partitions: the throttle time and (v10+, top-level tag
    0) the node endpoints; nothing may follow them."""
    throttle, offset = read_int32(frame, offset)
    endpoints: list[NodeEndpointData] = []
    if flexible:
        tags_start = offset
        for tag, start, stop in iter_tagged_fields(frame, tags_start):
            if tag == 0 and version >= 10:
                endpoints.extend(_node_endpoints(frame, start, stop))
        offset = skip_tagged_fields(frame, tags_start)
    if offset != len(frame):
        raise DecodeError(f"ProduceResponse v{version} has {len(frame) - offset} trailing bytes")
    return throttle, tuple(endpoints)


def _node_endpoints(frame: Buffer, start: int, stop: int) -> list[NodeEndpointData]:
    """The NodeEndpoints array of a ProduceResponse (top-level tag 0), within its field."""
    count, pos = read_uvarint(frame, start)
    if count - 1 > (stop - pos) // 11:  # id, host, port, rack, tags: 11 bytes at least
        raise DecodeError(
            f"ProduceResponse claims {count - 1} node endpoints in {stop - pos} bytes"
        )
    endpoints = []
    for _ in range(count - 1):
        node_id, pos = read_int32(frame, pos)
        host, pos = read_compact_nullable_string(frame, pos)
        port, pos = read_int32(frame, pos)
        rack, pos = read_compact_nullable_string(frame, pos)
        pos = skip_tagged_fields(frame, pos)
        endpoints.append(NodeEndpointData(node_id, host or "", port, rack))
    if pos != stop:
        raise DecodeError("ProduceResponse node endpoints do not fill their tagged field")
    return endpoints


def produce_response_error_codes(frame: Buffer, body_offset: int, version: int) -> set[int]:
    """The error codes of a ProduceResponse's partitions (each once), read as
    parse_produce_response reads them but without a PartitionResult per partition (see
    count_produce_request). Raises DecodeError as parsing does."""
    _check_version(version)
    flexible = is_flexible(ApiKey.PRODUCE, version)
    codes: set[int] = set()
    offset = body_offset
    end = len(frame)
    fixed = _PARTITION_HEAD.size + 8 + (8 if version >= 5 else 0)  # + append time, log start
    topics, offset = read_array_length(frame, offset, flexible)
    for _ in range(max(topics, 0)):
        _topic, offset = read_string(frame, offset, flexible)
        count, offset = read_array_length(frame, offset, flexible)
        for _ in range(max(count, 0)):
            if offset + fixed > end:
                raise DecodeError("truncated ProduceResponse partition")
            codes.add(INT16.unpack_from(frame, offset + 4)[0])
            offset += fixed
            if version >= 8:
                n_errors, offset = read_array_length(frame, offset, flexible)
                for _ in range(max(n_errors, 0)):
                    offset += 4  # batch index
                    _message, offset = read_string(frame, offset, flexible)
                    if flexible:
                        offset = skip_tagged_fields(frame, offset)
                _message, offset = read_string(frame, offset, flexible)
            if flexible:
                offset = skip_tagged_fields(frame, offset)
        if flexible:
            offset = skip_tagged_fields(frame, offset)
    offset += 4  # throttle time
    if flexible:
        offset = skip_tagged_fields(frame, offset)
    if offset != end:
        raise DecodeError(f"ProduceResponse v{version} has {end - offset} trailing bytes")
    return codes


def produce_response_names_nodes(frame: Buffer, body_offset: int, version: int) -> bool:
    """Whether a ProduceResponse carries node endpoints (v10+, top-level tag 0): broker
    addresses a proxy must rewrite. Skips over everything else without building results."""
    if version < 10:
        return False
    _check_version(version)
    offset = body_offset
    topics, offset = read_uvarint(frame, offset)
    for _ in range(topics - 1):
        _topic, offset = read_compact_nullable_string(frame, offset)
        count, offset = read_uvarint(frame, offset)
        for _ in range(count - 1):
            offset += _PARTITION_HEAD.size + 16  # log append time, log start offset
            n_errors, offset = read_uvarint(frame, offset)
            for _ in range(n_errors - 1):
                offset += 4  # batch index
                _message, offset = read_compact_nullable_string(frame, offset)
                offset = skip_tagged_fields(frame, offset)
            _message, offset = read_compact_nullable_string(frame, offset)
            offset = skip_tagged_fields(frame, offset)
        offset = skip_tagged_fields(frame, offset)
    offset += 4  # throttle time
    end = skip_tagged_fields(frame, offset)
    if end != len(frame):
        raise DecodeError(f"ProduceResponse v{version} has {len(frame) - end} trailing bytes")
    return has_tagged_field(frame, offset, 0)


def encode_produce_response(version: int, response: ProduceResponseData) -> bytes:
    """A ProduceResponse body at `version`, keeping only the fields that version has."""
    _check_version(version)
    flexible = is_flexible(ApiKey.PRODUCE, version)
    out = bytearray()
    groups: dict[str, list[PartitionResult]] = {}
    for result in response.partitions:
        groups.setdefault(result.topic, []).append(result)
    out += write_array_length(len(groups), flexible)
    for topic, results in groups.items():
        out += write_string(topic, flexible)
        out += write_array_length(len(results), flexible)
        for r in results:
            out += _PARTITION_HEAD.pack(r.partition, r.error_code, r.base_offset)
            out += INT64.pack(r.log_append_time_ms)
            if version >= 5:
                out += INT64.pack(r.log_start_offset)
            if version >= 8:
                out += write_array_length(len(r.record_errors), flexible)
                for batch_index, message in r.record_errors:
                    out += INT32.pack(batch_index) + write_string(message, flexible)
                    if flexible:
                        out += b"\x00"
                out += write_string(r.error_message, flexible)
            if flexible:
                if version >= 10 and r.current_leader is not None:
                    out += b"\x01\x00" + write_uvarint(9) + struct.pack(">ii", *r.current_leader)
                    out += b"\x00"
                else:
                    out += b"\x00"
        if flexible:
            out += b"\x00"
    out += INT32.pack(response.throttle_time_ms)
    if flexible:
        if version >= 10 and response.node_endpoints:
            body = bytearray(write_uvarint(len(response.node_endpoints) + 1))
            for e in response.node_endpoints:
                body += INT32.pack(e.node_id) + write_string(e.host, True) + INT32.pack(e.port)
                body += write_string(e.rack, True) + b"\x00"
            out += b"\x01\x00" + write_uvarint(len(body)) + body
        else:
            out += b"\x00"
    return bytes(out)
