"""The robustness kit: malformed Kafka request frames, built with the scapy layers, for tests and
fuzzing.

Two builders give well-formed frames to start from, as scapy packets whose every length and
count can still be overridden before `bytes()`:

    request(api_key, api_version, body=b"", correlation_id=1, client_id=b"kit")
    produce_request({"topic": {0: batch_bytes}}, version=7, acks=-1, transactional_id=None)

Each malformation returns the bytes of one frame (size prefix included), as a peer would write
it:

    wrong_size(frame, delta)        the size field off by `delta` bytes
    truncated(frame, keep)          only the first `keep` bytes (the size still claims them all)
    unknown_api_key(api_key=32767)  a request for an API key Kafka does not have
    bad_tagged_fields(kind)         a flexible request header whose tagged fields are wrong:
                                    "count" (more announced than present), "size" (a field
                                    running past the frame), "order" (tags not ascending),
                                    "varint" (a varint longer than Kafka's five bytes)
    huge_array(where)               a Produce body announcing 2**31-1 "topics" or "partitions"
    negative_length(field, value)   a negative length other than -1 (null): "client_id",
                                    "transactional_id", "topic" or "records"

MALFORMED names one frame of each kind, for `pytest.mark.parametrize` and as fuzzing seeds.
"""

from __future__ import annotations

from typing import Final

from scapy.packet import Packet, Raw

from kipside.protocol import ApiKey, Record, encode_batch

from .layers import (
    KafkaRequest,
    KafkaTaggedField,
    ProducePartition,
    ProduceRequestBody,
    ProduceTopic,
)

__all__ = [
    "MALFORMED",
    "bad_tagged_fields",
    "huge_array",
    "negative_length",
    "produce_request",
    "request",
    "truncated",
    "unknown_api_key",
    "wrong_size",
]

MAX_INT32: Final = 2**31 - 1
_FLEXIBLE_METADATA: Final = 12  # Metadata v12: request header v2, with tagged fields
_METADATA_V12_BODY: Final = b"\x01\x01\x00\x00"  # all topics (null), no auto create, no tags


def request(
    api_key: int,
    api_version: int,
    body: bytes = b"",
    *,
    correlation_id: int = 1,
    client_id: bytes = b"kit",
) -> KafkaRequest:
    """A request frame with this header and body (the body's bytes as given)."""
    frame = KafkaRequest(
        api_key=api_key,
        api_version=api_version,
        correlation_id=correlation_id,
        client_id=client_id,
    )
    return frame / Raw(body) if body else frame


def produce_request(
    topics: dict[str, dict[int, bytes | None]],
    *,
    version: int = 7,
    acks: int = -1,
    transactional_id: str | None = None,
    correlation_id: int = 1,
) -> Packet:
    """A ProduceRequest v3-v8 frame: each topic's partitions with their record bytes."""
    if not 3 <= version <= 8:
        raise ValueError(f"Produce v{version}: the kit writes v3-v8 (the non-flexible ones)")
    body = ProduceRequestBody(
        transactional_id=(transactional_id or "").encode(),
        acks=acks,
        topics=[
            ProduceTopic(
                topic=name.encode(),
                partitions=[
                    ProducePartition(index=index, records=records or b"", records_length=None)
                    if records is not None
                    else ProducePartition(index=index, records_length=-1)
                    for index, records in partitions.items()
                ],
            )
            for name, partitions in topics.items()
        ],
    )
    return request(ApiKey.PRODUCE, version, correlation_id=correlation_id) / body


def _one_batch() -> bytes:
    return encode_batch([Record(b"key", b"value")], base_timestamp=1_700_000_000_000)


def wrong_size(frame: bytes | Packet, delta: int) -> bytes:
    raw = bytes(frame)
    size = int.from_bytes(raw[:4], "big", signed=True)
    return (size + delta).to_bytes(4, "big", signed=True) + raw[4:]


def truncated(frame: bytes | Packet, keep: int) -> bytes:
    return bytes(frame)[:keep]


def unknown_api_key(api_key: int = 32767) -> bytes:
    return bytes(request(api_key, 0))


def bad_tagged_fields(kind: str) -> bytes:
    base = request(ApiKey.METADATA, _FLEXIBLE_METADATA)
    if kind == "count":
        frame = base / Raw(_METADATA_V12_BODY)
        frame.tag_count = 3
        frame.tags = [KafkaTaggedField(tag=0, data=b"x")]
    elif kind == "size":
        frame = base / Raw(_METADATA_V12_BODY)
        frame.tags = [KafkaTaggedField(tag=0, size=200, data=b"x")]
    elif kind == "order":
        frame = base / Raw(_METADATA_V12_BODY)
        frame.tags = [KafkaTaggedField(tag=5, data=b"a"), KafkaTaggedField(tag=1, data=b"b")]
    elif kind == "varint":
        header = bytes(base)[4:-1]  # without the size and the tag count
        payload = header + b"\xff\xff\xff\xff\xff\x01" + _METADATA_V12_BODY
        return len(payload).to_bytes(4, "big") + payload
    else:
        raise ValueError(f"unknown kind {kind!r}: count, size, order or varint")
    return bytes(frame)


def huge_array(where: str = "topics") -> bytes:
    frame = produce_request({"t": {0: _one_batch()}})
    body = frame[ProduceRequestBody]
    if where == "topics":
        body.topic_count = MAX_INT32
    elif where == "partitions":
        body.topics[0].partition_count = MAX_INT32
    else:
        raise ValueError(f"unknown array {where!r}: topics or partitions")
    return bytes(frame)


def negative_length(field: str = "client_id", value: int = -2) -> bytes:
    frame = produce_request({"t": {0: _one_batch()}}, transactional_id="txn")
    body = frame[ProduceRequestBody]
    if field == "client_id":
        frame.client_id_length = value
        frame.client_id = b""
    elif field == "transactional_id":
        body.transactional_id_length = value
        body.transactional_id = b""
    elif field == "topic":
        body.topics[0].name_length = value
        body.topics[0].topic = b""
    elif field == "records":
        body.topics[0].partitions[0].records_length = value
        body.topics[0].partitions[0].records = b""
    else:
        raise ValueError(f"unknown field {field!r}: client_id, transactional_id, topic or records")
    return bytes(frame)


def _malformed() -> dict[str, bytes]:
    good = bytes(produce_request({"t": {0: _one_batch()}}))
    return {
        "size-too-small": wrong_size(good, -7),
        "size-too-large": wrong_size(good, +7),
        "size-negative": wrong_size(good, -len(good)),
        "truncated-header": truncated(good, 9),
        "truncated-body": truncated(good, len(good) - 20),
        "unknown-api-key": unknown_api_key(),
        "tagged-fields-count": bad_tagged_fields("count"),
        "tagged-fields-size": bad_tagged_fields("size"),
        "tagged-fields-order": bad_tagged_fields("order"),
        "tagged-fields-varint": bad_tagged_fields("varint"),
        "huge-topics-array": huge_array("topics"),
        "huge-partitions-array": huge_array("partitions"),
        "negative-client-id": negative_length("client_id"),
        "negative-transactional-id": negative_length("transactional_id"),
        "negative-topic-name": negative_length("topic"),
        "negative-records": negative_length("records"),
    }


MALFORMED: Final = _malformed()
"""One malformed request frame of each kind, by name."""
