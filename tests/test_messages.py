"""Tests for protocol.messages: kio behind one adapter whose only failure is DecodeError."""

from __future__ import annotations

import dataclasses
import datetime
import sys
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import response as metadata_v12
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i32, i32Timedelta

from kipside.protocol import messages
from kipside.protocol.apis import ApiKey
from kipside.protocol.errors import DecodeError
from kipside.protocol.headers import build_frame, encode_response_header, parse_response_header

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
    return build_frame(header, messages.encode_message(metadata_v12_response()))


BODY_OFFSET = 9  # size prefix, correlation id, empty tag section of response header v1


def test_body_offset() -> None:
    assert parse_response_header(metadata_v12_frame(), ApiKey.METADATA, 12).body_offset == (
        BODY_OFFSET
    )


def test_metadata_v12_round_trip() -> None:
    message = metadata_v12_response()
    body = messages.encode_message(message)
    assert messages.decode_response(ApiKey.METADATA, 12, body, 0) == message
    frame = metadata_v12_frame()
    header = parse_response_header(frame, ApiKey.METADATA, 12)
    decoded = messages.decode_response(ApiKey.METADATA, 12, frame, header.body_offset)
    assert decoded == message
    assert messages.encode_message(decoded) == body


def test_body_ends_with_an_empty_tag_section() -> None:
    # The property the next test relies on: the last byte is the top-level tag count.
    assert messages.encode_message(metadata_v12_response())[-1:] == b"\x00"


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
        messages.decode_response(ApiKey.METADATA, 12, tampered, header.body_offset)
    assert type(info.value) is DecodeError  # not kio's KeyError leaking out


def test_removed_version_is_a_decode_error() -> None:
    # Kafka 4.0 removed Produce v0-v2; kio no longer ships them.
    frame = build_frame(encode_response_header(ApiKey.PRODUCE, 2, 1), b"\x00\x00\x00\x00")
    with pytest.raises(DecodeError, match=r"Produce v2"):
        messages.decode_response(ApiKey.PRODUCE, 2, frame, 8)
    with pytest.raises(DecodeError, match=r"Produce v2"):
        messages.decode_request(ApiKey.PRODUCE, 2, frame, 8)
    with pytest.raises(DecodeError):
        messages.response_class(ApiKey.PRODUCE, 2)


def test_unknown_api_key_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="api key 4000"):
        messages.decode_response(4000, 0, b"", 0)
    assert messages.known_versions(4000) is None


@pytest.mark.parametrize("cut", [1, 2, 5, 17, 40])
def test_truncated_body_is_a_decode_error(cut: int) -> None:
    frame = metadata_v12_frame()
    with pytest.raises(DecodeError, match="Metadata v12"):
        messages.decode_response(ApiKey.METADATA, 12, frame[:-cut], BODY_OFFSET)


def test_truncated_to_the_header_is_a_decode_error() -> None:
    frame = metadata_v12_frame()
    with pytest.raises(DecodeError):
        messages.decode_response(ApiKey.METADATA, 12, frame[:BODY_OFFSET], BODY_OFFSET)


def test_trailing_bytes_are_a_decode_error() -> None:
    frame = metadata_v12_frame() + b"\x00"
    with pytest.raises(DecodeError, match="1 trailing bytes"):
        messages.decode_response(ApiKey.METADATA, 12, frame, BODY_OFFSET)


def test_invalid_utf8_is_a_decode_error() -> None:
    body = bytearray(messages.encode_message(metadata_v12_response()))
    at = body.index(b"broker-1")
    body[at] = 0xFF
    with pytest.raises(DecodeError):
        messages.decode_response(ApiKey.METADATA, 12, bytes(body), 0)


def test_unknown_error_code_is_a_decode_error() -> None:
    # A v0 ApiVersions response whose error code is not one Kafka (or kio) knows.
    with pytest.raises(DecodeError):
        messages.decode_response(ApiKey.API_VERSIONS, 0, bytes.fromhex("7fff00000000"), 0)


def test_classes_and_known_versions() -> None:
    assert messages.response_class(ApiKey.METADATA, 12) is metadata_v12.MetadataResponse
    assert messages.request_class(ApiKey.METADATA, 12).__name__ == "MetadataRequest"
    low, high = messages.known_versions(ApiKey.PRODUCE) or (None, None)
    assert low == 3
    assert high is not None and high >= 12


# ---- build: kio entities from plain values ------------------------------------------------


def fetch_fields() -> dict[str, Any]:
    """One description of a FetchRequest for every version, with fields only later ones have."""
    return {
        "replica_id": -1,
        "max_wait": 500,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 1,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": "orders",
                "partitions": [
                    {
                        "partition": 3,
                        "current_leader_epoch": 7,
                        "fetch_offset": 100,
                        "last_fetched_epoch": 6,
                        "log_start_offset": -1,
                        "partition_max_bytes": 4096,
                    }
                ],
            }
        ],
        "forgotten_topics_data": [{"topic": "old", "partitions": [1, 2]}],
        "rack_id": "rack-a",
        "no_such_field": "dropped everywhere",
    }


@pytest.mark.parametrize("version", range(4, 13))
def test_build_nested_entities(version: int) -> None:
    message = messages.build_request(ApiKey.FETCH, version, fetch_fields())
    cls = messages.request_class(ApiKey.FETCH, version)
    assert type(message) is cls
    (topic,) = message.topics
    (partition,) = topic.partitions
    module = sys.modules[cls.__module__]
    assert type(topic) is module.FetchTopic
    assert type(partition) is module.FetchPartition
    assert (topic.topic, partition.partition, partition.fetch_offset) == ("orders", 3, 100)
    assert message.max_wait == datetime.timedelta(milliseconds=500)
    # Keys the version lacks are left out; the ones it has are kept.
    have = {f.name for f in dataclasses.fields(partition)}
    assert ("current_leader_epoch" in have) is (version >= 9)
    assert ("last_fetched_epoch" in have) is (version >= 12)
    if version >= 9:
        assert partition.current_leader_epoch == 7
    assert getattr(message, "rack_id", None) == ("rack-a" if version >= 11 else None)
    if version >= 7:
        (forgotten,) = message.forgotten_topics_data
        assert type(forgotten) is module.ForgottenTopic
        assert forgotten.partitions == (1, 2)  # a list of ints becomes a tuple
    else:
        assert not hasattr(message, "forgotten_topics_data")
    assert not hasattr(message, "no_such_field")


@pytest.mark.parametrize("version", range(4, 13))
def test_build_encodes_and_decodes_back(version: int) -> None:
    message = messages.build_request(ApiKey.FETCH, version, fetch_fields())
    body = messages.encode_message(message)
    assert messages.decode_request(ApiKey.FETCH, version, body, 0) == message


def test_build_response_with_nullable_and_durations() -> None:
    cls = messages.response_class(ApiKey.FETCH, 12)
    partition = {
        "partition_index": 0,
        "error_code": 6,  # an int becomes kio's ErrorCode
        "high_watermark": 5,
        "aborted_transactions": None,
        "records": None,
        "current_leader": {"leader_id": 2, "leader_epoch": 9},
    }
    message = messages.build(
        cls,
        {
            "throttle_time": 1500,
            "error_code": 0,
            "responses": [{"topic": "t", "partitions": [partition]}],
        },
    )
    assert message.throttle_time == datetime.timedelta(seconds=1.5)
    (data,) = message.responses[0].partitions
    assert data.error_code is ErrorCode.not_leader_or_follower
    assert data.aborted_transactions is None and data.records is None
    assert (data.current_leader.leader_id, data.current_leader.leader_epoch) == (2, 9)
    assert (
        messages.decode_response(ApiKey.FETCH, 12, messages.encode_message(message), 0) == message
    )


def test_build_keeps_values_already_typed() -> None:
    delay = datetime.timedelta(milliseconds=250)
    message = messages.build(
        messages.response_class(ApiKey.API_VERSIONS, 3),
        {"error_code": ErrorCode.none, "api_keys": (), "throttle_time": delay},
    )
    assert message.throttle_time is delay
    assert message.error_code is ErrorCode.none


def test_build_metadata_round_trip() -> None:
    fields = {
        "topics": [{"topic_id": TOPIC_ID, "name": None}, {"topic_id": None, "name": "orders"}],
        "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": True,
    }
    message = messages.build_request(ApiKey.METADATA, 12, fields)
    assert message.topics[0].topic_id == TOPIC_ID
    assert (
        messages.decode_request(ApiKey.METADATA, 12, messages.encode_message(message), 0) == message
    )
    every_topic = messages.build_request(ApiKey.METADATA, 12, {**fields, "topics": None})
    assert every_topic.topics is None  # a null array stays null


def test_build_refuses_what_kio_refuses() -> None:
    # A field the version needs is never silently defaulted.
    with pytest.raises(TypeError, match="min_bytes"):
        messages.build_request(ApiKey.FETCH, 4, {"max_wait": 1, "topics": []})
    with pytest.raises(ValueError, match="12345"):
        messages.build(
            messages.response_class(ApiKey.API_VERSIONS, 0), {"error_code": 12345, "api_keys": []}
        )
