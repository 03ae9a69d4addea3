"""Tests for protocol.headers against request/response header bytes written out from the spec."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kipside.protocol import headers
from kipside.protocol.apis import ApiKey, is_flexible
from kipside.protocol.errors import DecodeError

# Metadata v1 request (not flexible: request header v1), correlation id 7, client id "kip",
# body = an empty topics array.
METADATA_V1_REQUEST = bytes.fromhex(
    "00000011"  # size 17 = 13 header + 4 body
    "0003"  # api key 3 (Metadata)
    "0001"  # api version 1
    "00000007"  # correlation id 7
    "00036b6970"  # client id "kip" (int16 length 3)
    "00000000"  # body: topics = []
)

# Metadata v12 request (flexible: request header v2), correlation id 0x01020304, client id
# "c" (still an int16-length string in v2), and a tagged-field section with two tags kipside
# does not know, which must be skipped by their sizes.
METADATA_V12_REQUEST = bytes.fromhex(
    "00000019"  # size 25 = 21 header + 4 body
    "0003"  # api key 3
    "000c"  # api version 12
    "01020304"  # correlation id
    "000163"  # client id "c" (int16 length 1)
    "02"  # two tagged fields
    "0503aabbcc"  # tag 5, size 3, data
    "810101ff"  # tag 129 (uvarint 0x81 0x01), size 1, data
    "00"  # body: topics = null (compact)
    "01"  # allow_auto_topic_creation = true
    "00"  # include_topic_authorized_operations = false
    "00"  # no tagged fields
)

# Heartbeat v0 request with a null client id.
HEARTBEAT_V0_NULL_CLIENT = bytes.fromhex(
    "0000000a"  # size 10 = header only
    "000c"  # api key 12
    "0000"  # version 0
    "fffffffe"  # correlation id -2
    "ffff"  # client id null
)

# Metadata v1 response, header v0: correlation id only.
METADATA_V1_RESPONSE = bytes.fromhex(
    "0000000c"  # size 12
    "00000007"  # correlation id 7
    "00000000ffffffff"  # body bytes, opaque here
)

# Metadata v12 response, header v1: correlation id, then a tagged-field section holding one
# unknown tag.
METADATA_V12_RESPONSE = bytes.fromhex(
    "0000000b"  # size 11
    "00000007"  # correlation id 7
    "01"  # one tagged field
    "0002beef"  # tag 0, size 2, data
    "0000"  # body bytes, opaque here
)

client_ids = st.none() | st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
api_keys = st.sampled_from(list(ApiKey)) | st.integers(min_value=93, max_value=32767)
api_versions = st.integers(min_value=0, max_value=30)
correlation_ids = st.integers(min_value=-(2**31), max_value=2**31 - 1)


# Each golden request frame and its header: api key, version, correlation id, client id,
# header version, body offset.
GOLDEN_REQUESTS = {
    "metadata-v1": (METADATA_V1_REQUEST, headers.RequestHeader(3, 1, 7, "kip", 1, 17)),
    "heartbeat-v0-null-client": (
        HEARTBEAT_V0_NULL_CLIENT,
        headers.RequestHeader(12, 0, -2, None, 1, 14),
    ),
    "metadata-v12-unknown-tags": (
        METADATA_V12_REQUEST,
        headers.RequestHeader(3, 12, 0x01020304, "c", 2, 25),
    ),
}


@pytest.mark.parametrize("name", GOLDEN_REQUESTS)
def test_request_header_golden(name: str) -> None:
    frame, expected = GOLDEN_REQUESTS[name]
    assert headers.parse_request_header(frame) == expected


@pytest.mark.parametrize("name", GOLDEN_REQUESTS)
def test_request_body_offset_is_the_headers(name: str) -> None:
    frame, expected = GOLDEN_REQUESTS[name]
    assert headers.request_body_offset(frame) == expected.body_offset
    with pytest.raises(DecodeError):
        headers.request_body_offset(frame[:13])


@pytest.mark.parametrize("name", ["metadata-v1", "heartbeat-v0-null-client"])
def test_request_header_v1_encodes_its_golden_frame(name: str) -> None:
    frame, h = GOLDEN_REQUESTS[name]
    head = headers.encode_request_header(h.api_key, h.api_version, h.correlation_id, h.client_id)
    assert head == frame[4 : h.body_offset]
    assert headers.build_frame(head, frame[h.body_offset :]) == frame


def test_request_bodies_follow_their_headers() -> None:
    assert METADATA_V1_REQUEST[17:] == bytes(4)
    assert len(HEARTBEAT_V0_NULL_CLIENT) == 14  # a header and no body
    # The unknown tags were skipped by their sizes: what follows is the body.
    assert METADATA_V12_REQUEST[25:] == bytes.fromhex("00010000")


def test_request_header_v2_encoded_with_empty_tag_section() -> None:
    assert headers.encode_request_header(3, 12, 0x01020304, "c") == bytes.fromhex(
        "0003"  # api key
        "000c"  # version 12
        "01020304"  # correlation id
        "000163"  # client id "c"
        "00"  # empty tagged-field section
    )


def test_response_header_v0_golden() -> None:
    header = headers.parse_response_header(METADATA_V1_RESPONSE, ApiKey.METADATA, 1)
    assert header == headers.ResponseHeader(correlation_id=7, header_version=0, body_offset=8)
    assert headers.encode_response_header(ApiKey.METADATA, 1, 7) == bytes.fromhex("00000007")
    assert headers.build_frame(
        headers.encode_response_header(3, 1, 7), METADATA_V1_RESPONSE[8:]
    ) == (METADATA_V1_RESPONSE)


def test_response_header_v1_golden_skips_unknown_tags() -> None:
    header = headers.parse_response_header(METADATA_V12_RESPONSE, ApiKey.METADATA, 12)
    assert header == headers.ResponseHeader(correlation_id=7, header_version=1, body_offset=13)
    assert METADATA_V12_RESPONSE[header.body_offset :] == b"\x00\x00"
    assert headers.encode_response_header(ApiKey.METADATA, 12, 7) == bytes.fromhex("0000000700")


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4, 5])
def test_api_versions_response_header_is_always_v0(version: int) -> None:
    # KIP-511: a client that sent a too-new ApiVersions must still be able to read the answer,
    # so the response header never has a tagged-field section, even for flexible v3+.
    assert headers.encode_response_header(ApiKey.API_VERSIONS, version, 7) == bytes.fromhex(
        "00000007"
    )
    # The body of a v3 response starts with error_code 0x0000: not a tag section to skip.
    body = bytes.fromhex(
        "0000"  # error_code
        "01"  # api_keys: empty compact array
        "00000000"  # throttle_time_ms
        "00"  # no tagged fields
    )
    frame = headers.build_frame(bytes.fromhex("00000007"), body)
    header = headers.parse_response_header(frame, ApiKey.API_VERSIONS, version)
    assert header == headers.ResponseHeader(correlation_id=7, header_version=0, body_offset=8)


def test_api_versions_v3_request_header_is_v2() -> None:
    # Only the response is special: the request header follows flexibility as usual.
    frame = headers.build_frame(headers.encode_request_header(ApiKey.API_VERSIONS, 3, 1, "x"), b"")
    assert frame.endswith(b"\x00")
    assert headers.parse_request_header(frame).header_version == 2


@given(api_keys, api_versions, correlation_ids, client_ids, st.binary(max_size=20))
def test_request_header_round_trip(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None, body: bytes
) -> None:
    head = headers.encode_request_header(api_key, api_version, correlation_id, client_id)
    frame = headers.build_frame(head, body)
    header = headers.parse_request_header(frame)
    assert header == headers.RequestHeader(
        api_key=api_key,
        api_version=api_version,
        correlation_id=correlation_id,
        client_id=client_id,
        header_version=2 if is_flexible(api_key, api_version) else 1,
        body_offset=4 + len(head),
    )
    assert frame[header.body_offset :] == body
    assert headers.request_correlation_id(frame) == correlation_id


@given(api_keys, api_versions, correlation_ids, st.binary(max_size=20))
def test_response_header_round_trip(
    api_key: int, api_version: int, correlation_id: int, body: bytes
) -> None:
    head = headers.encode_response_header(api_key, api_version, correlation_id)
    frame = headers.build_frame(head, body)
    header = headers.parse_response_header(frame, api_key, api_version)
    flexible = is_flexible(api_key, api_version) and api_key != ApiKey.API_VERSIONS
    assert header == headers.ResponseHeader(
        correlation_id=correlation_id,
        header_version=1 if flexible else 0,
        body_offset=4 + len(head),
    )
    assert frame[header.body_offset :] == body
    assert headers.response_correlation_id(frame) == correlation_id


@given(correlation_ids, correlation_ids)
def test_correlation_id_rewrites(original: int, replacement: int) -> None:
    request = headers.build_frame(
        headers.encode_request_header(ApiKey.PRODUCE, 9, original, "p"), b"body"
    )
    moved = headers.with_request_correlation_id(request, replacement)
    assert headers.request_correlation_id(moved) == replacement
    assert len(moved) == len(request)
    assert headers.with_request_correlation_id(moved, original) == request

    response = headers.build_frame(
        headers.encode_response_header(ApiKey.PRODUCE, 9, original), b"body"
    )
    moved = headers.with_response_correlation_id(response, replacement)
    assert headers.response_correlation_id(moved) == replacement
    assert headers.with_response_correlation_id(moved, original) == response


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        # 3 bytes: not even api key, version and correlation id
        (bytes.fromhex("00000003000300"), "shorter than"),
        # api key -1
        (bytes.fromhex("0000000affff000000000001ffff"), "api key -1"),
        # version 0x8000
        (bytes.fromhex("0000000a0003800000000001ffff"), "version -32768"),
        # client id of length 5 with 2 bytes present
        (bytes.fromhex("0000000c000300010000000100056b69"), "truncated string"),
        # Metadata v12 (header v2) that ends before its tag count
        (bytes.fromhex("0000000a0003000c00000001ffff"), "truncated"),
        # header v2 whose one tagged field claims 5 bytes, 1 present
        (bytes.fromhex("0000000e0003000c00000001ffff010005aa"), "past the end"),
    ],
    ids=["short", "negative-key", "negative-version", "client-id", "no-tags", "tag-size"],
)
def test_malformed_request_headers(frame: bytes, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        headers.parse_request_header(frame)


def test_malformed_response_headers() -> None:
    with pytest.raises(DecodeError, match="shorter than"):
        headers.parse_response_header(bytes.fromhex("000000020000"), ApiKey.METADATA, 1)
    with pytest.raises(DecodeError, match="past the end"):
        headers.parse_response_header(bytes.fromhex("0000000700000001010009"), ApiKey.METADATA, 12)
