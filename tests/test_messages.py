"""Tests for protocol.messages: kio behind one adapter whose only failure is DecodeError."""

from __future__ import annotations

import datetime
import uuid

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import response as metadata_v12
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i32, i32Timedelta

from protocol.apis import ApiKey
from protocol.errors import DecodeError
from protocol.headers import build_frame, encode_response_header, parse_response_header
from protocol.messages import (
    decode_request,
    decode_response,
    encode_message,
    known_versions,
    request_class,
    response_class,
)

TOPIC_ID = uuid.UUID("9f1c4b7e-2d3a-4c5b-8e6f-0a1b2c3d4e5f")


def metadata_v12_response() -> metadata_v12.MetadataResponse:
    partition = metadata_v12.MetadataResponsePartition(
        error_code=ErrorCode.none,
        partition_index=i32(0),
        leader_id=BrokerId(2),
        leader_epoch=i32(5),
        replica_nodes=(BrokerId(1), BrokerId(2)),
        isr_nodes=(BrokerId(2),),
        offline_replicas=(BrokerId(1),),
    )
    return metadata_v12.MetadataResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(milliseconds=3)),
        brokers=(
            metadata_v12.MetadataResponseBroker(
                node_id=BrokerId(1), host="broker-1", port=i32(9092), rack="r1"
            ),
            metadata_v12.MetadataResponseBroker(
                node_id=BrokerId(2), host="broker-2", port=i32(9093), rack=None
            ),
        ),
        cluster_id="cluster-x",
        controller_id=BrokerId(1),
        topics=(
            metadata_v12.MetadataResponseTopic(
                error_code=ErrorCode.none,
                name=TopicName("orders"),
                topic_id=TOPIC_ID,
                is_internal=False,
                partitions=(partition,),
                topic_authorized_operations=i32(-2147483648),
            ),
        ),
    )


def metadata_v12_frame() -> bytes:
    header = encode_response_header(ApiKey.METADATA, 12, 41)
    return build_frame(header, encode_message(metadata_v12_response()))


BODY_OFFSET = 9  # size prefix, correlation id, empty tag section of response header v1


def test_body_offset() -> None:
    assert parse_response_header(metadata_v12_frame(), ApiKey.METADATA, 12).body_offset == (
        BODY_OFFSET
    )


def test_metadata_v12_round_trip() -> None:
    message = metadata_v12_response()
    body = encode_message(message)
    assert decode_response(ApiKey.METADATA, 12, body, 0) == message
    frame = metadata_v12_frame()
    header = parse_response_header(frame, ApiKey.METADATA, 12)
    decoded = decode_response(ApiKey.METADATA, 12, frame, header.body_offset)
    assert decoded == message
    assert encode_message(decoded) == body


def test_body_ends_with_an_empty_tag_section() -> None:
    # The property the next test relies on: the last byte is the top-level tag count.
    assert encode_message(metadata_v12_response())[-1:] == b"\x00"


@pytest.mark.parametrize(
    "tagged_section",
    [
        "010702abcd",  # one unknown tag (7) with 2 bytes
        "010000",  # tag 0, which Metadata v12 does not define at top level, empty
        "020501ff810100",  # two unknown tags, the second 129
    ],
)
def test_unknown_tagged_field_is_a_decode_error(tagged_section: str) -> None:
    frame = metadata_v12_frame()
    header = parse_response_header(frame, ApiKey.METADATA, 12)
    # Replace the empty tag section at the end of the body with one holding unknown tags.
    body = frame[header.body_offset : -1] + bytes.fromhex(tagged_section)
    tampered = build_frame(frame[4 : header.body_offset], body)
    with pytest.raises(DecodeError, match="Metadata v12") as info:
        decode_response(ApiKey.METADATA, 12, tampered, header.body_offset)
    assert type(info.value) is DecodeError  # not kio's KeyError leaking out


def test_removed_version_is_a_decode_error() -> None:
    # Kafka 4.0 removed Produce v0-v2; kio no longer ships them.
    frame = build_frame(encode_response_header(ApiKey.PRODUCE, 2, 1), b"\x00\x00\x00\x00")
    with pytest.raises(DecodeError, match=r"Produce v2"):
        decode_response(ApiKey.PRODUCE, 2, frame, 8)
    with pytest.raises(DecodeError, match=r"Produce v2"):
        decode_request(ApiKey.PRODUCE, 2, frame, 8)
    with pytest.raises(DecodeError):
        response_class(ApiKey.PRODUCE, 2)


def test_unknown_api_key_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="api key 4000"):
        decode_response(4000, 0, b"", 0)
    assert known_versions(4000) is None


@pytest.mark.parametrize("cut", [1, 2, 5, 17, 40])
def test_truncated_body_is_a_decode_error(cut: int) -> None:
    frame = metadata_v12_frame()
    with pytest.raises(DecodeError, match="Metadata v12"):
        decode_response(ApiKey.METADATA, 12, frame[:-cut], BODY_OFFSET)


def test_truncated_to_the_header_is_a_decode_error() -> None:
    frame = metadata_v12_frame()
    with pytest.raises(DecodeError):
        decode_response(ApiKey.METADATA, 12, frame[:BODY_OFFSET], BODY_OFFSET)


def test_trailing_bytes_are_a_decode_error() -> None:
    frame = metadata_v12_frame() + b"\x00"
    with pytest.raises(DecodeError, match="1 trailing bytes"):
        decode_response(ApiKey.METADATA, 12, frame, BODY_OFFSET)


def test_invalid_utf8_is_a_decode_error() -> None:
    body = bytearray(encode_message(metadata_v12_response()))
    at = body.index(b"broker-1")
    body[at] = 0xFF
    with pytest.raises(DecodeError):
        decode_response(ApiKey.METADATA, 12, bytes(body), 0)


def test_unknown_error_code_is_a_decode_error() -> None:
    # A v0 ApiVersions response whose error code is not one Kafka (or kio) knows.
    with pytest.raises(DecodeError):
        decode_response(ApiKey.API_VERSIONS, 0, bytes.fromhex("7fff00000000"), 0)


def test_classes_and_known_versions() -> None:
    assert response_class(ApiKey.METADATA, 12) is metadata_v12.MetadataResponse
    assert request_class(ApiKey.METADATA, 12).__name__ == "MetadataRequest"
    low, high = known_versions(ApiKey.PRODUCE) or (None, None)
    assert low == 3
    assert high is not None and high >= 12
