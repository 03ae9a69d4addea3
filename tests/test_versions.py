"""Tests for proxy.versions: the ApiVersions intersection and its rewrite of real responses."""

from __future__ import annotations

import datetime
import logging
from typing import Any

import pytest
from kio.schema.api_versions.v0 import response as v0
from kio.schema.api_versions.v3 import response as v3
from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32Timedelta, i64

from kipside.protocol.apis import ApiKey
from kipside.protocol.errors import DecodeError
from kipside.protocol.headers import build_frame, encode_response_header, parse_response_header
from kipside.protocol.messages import decode_response, encode_message
from kipside.proxy.stages.versions import MAX_API_VERSIONS_VERSION, VersionPolicy, kipside_ranges
from kipside.proxy.upstream.addresses import address_apis

HEARTBEAT = 12
UNKNOWN_KEY = 1000


def entry3(api_key: int, low: int, high: int) -> v3.ApiVersion:
    return v3.ApiVersion(api_key=i16(api_key), min_version=i16(low), max_version=i16(high))


def response3(
    *entries: v3.ApiVersion, throttle_ms: int = 0, **extra: Any
) -> v3.ApiVersionsResponse:
    return v3.ApiVersionsResponse(
        error_code=ErrorCode.none,
        api_keys=entries,
        throttle_time=i32Timedelta.parse(datetime.timedelta(milliseconds=throttle_ms)),
        **extra,
    )


def ranges_of(message: Any) -> dict[int, tuple[int, int]]:
    return {int(e.api_key): (int(e.min_version), int(e.max_version)) for e in message.api_keys}


def frame_of(version: int, message: Any, correlation_id: int = 77) -> bytes:
    header = encode_response_header(ApiKey.API_VERSIONS, version, correlation_id)
    return build_frame(header, encode_message(message))


def rewrite(policy: VersionPolicy, version: int, frame: bytes) -> bytes:
    header = parse_response_header(frame, ApiKey.API_VERSIONS, version)
    return policy.rewrite_response(version, frame, header)


def decode_frame(version: int, frame: bytes) -> Any:
    assert int.from_bytes(frame[:4], "big", signed=True) == len(frame) - 4
    header = parse_response_header(frame, ApiKey.API_VERSIONS, version)
    assert header.body_offset == 8  # response header v0 whatever the version
    return decode_response(ApiKey.API_VERSIONS, version, frame, header.body_offset)


# --------------------------------------------------------------------------- intersect


@pytest.mark.parametrize(
    ("broker", "mine", "advertised"),
    [
        ((0, 13), (0, 11), (0, 11)),  # max = kipside's max when lower
        ((0, 9), (0, 11), (0, 9)),  # max = broker's max when lower
        ((2, 13), (5, 13), (5, 13)),  # min = kipside's min when higher
        ((6, 13), (5, 13), (6, 13)),  # min = broker's min when higher
        ((4, 4), (0, 13), (4, 4)),
        ((4, 9), (9, 13), (9, 9)),  # the ranges touch in one version
    ],
)
def test_intersection(
    broker: tuple[int, int], mine: tuple[int, int], advertised: tuple[int, int]
) -> None:
    policy = VersionPolicy({ApiKey.METADATA: mine})
    out = policy.intersect(response3(entry3(ApiKey.METADATA, *broker)))
    assert ranges_of(out) == {ApiKey.METADATA: advertised}


def test_apis_kipside_does_not_decode_are_untouched() -> None:
    heartbeat = entry3(HEARTBEAT, 0, 4)
    unknown = entry3(UNKNOWN_KEY, 3, 7)
    policy = VersionPolicy({ApiKey.METADATA: (0, 5)})
    out = policy.intersect(response3(heartbeat, entry3(ApiKey.METADATA, 0, 13), unknown))
    assert out.api_keys[0] == heartbeat
    assert out.api_keys[2] == unknown
    assert [int(e.api_key) for e in out.api_keys] == [HEARTBEAT, ApiKey.METADATA, UNKNOWN_KEY]


def test_produce_min_stays_at_the_brokers_min() -> None:
    # KAFKA-18659: librdkafka needs Produce min 0 even though kio starts at v3.
    policy = VersionPolicy({ApiKey.PRODUCE: (3, 11)})
    out = policy.intersect(response3(entry3(ApiKey.PRODUCE, 0, 13)))
    assert ranges_of(out) == {ApiKey.PRODUCE: (0, 11)}


def test_produce_min_with_default_ranges() -> None:
    out = VersionPolicy().intersect(response3(entry3(ApiKey.PRODUCE, 0, 9)))
    assert ranges_of(out)[ApiKey.PRODUCE] == (0, 9)


@pytest.mark.parametrize("broker_max", [4, 5, 9])
def test_api_versions_capped_at_4(broker_max: int) -> None:
    out = VersionPolicy().intersect(response3(entry3(ApiKey.API_VERSIONS, 0, broker_max)))
    assert ranges_of(out) == {ApiKey.API_VERSIONS: (0, MAX_API_VERSIONS_VERSION)}
    assert MAX_API_VERSIONS_VERSION == 4


def test_disjoint_ranges_are_dropped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kipside.versions")
    policy = VersionPolicy({ApiKey.METADATA: (4, 13), ApiKey.FETCH: (0, 11)})
    out = policy.intersect(
        response3(
            entry3(ApiKey.METADATA, 0, 3),
            entry3(ApiKey.FETCH, 12, 17),
            entry3(HEARTBEAT, 0, 4),
        )
    )
    assert ranges_of(out) == {HEARTBEAT: (0, 4)}
    text = caplog.text
    assert "api 3 v0-3" in text
    assert "kipside handles v4-13" in text
    assert "api 1 v12-17" in text


def test_kipside_ranges() -> None:
    ranges = kipside_ranges()
    assert ranges[ApiKey.API_VERSIONS] == (0, 4)
    assert ranges[ApiKey.PRODUCE][0] == 0
    assert ranges[ApiKey.PRODUCE][1] >= 10  # at least one version with NodeEndpoints
    # Versions below the first one carrying addresses are never decoded: min 0 is fine.
    assert ranges[ApiKey.FETCH][0] == 0
    assert ranges[ApiKey.METADATA] == (0, 13)
    assert ranges[ApiKey.FIND_COORDINATOR] == (0, 6)
    for api_key in address_apis():
        assert api_key in ranges
    for low, high in ranges.values():
        assert 0 <= low <= high


# --------------------------------------------------------------------------- rewrite_response

BROKER_KEYS = (
    (ApiKey.PRODUCE, 0, 13),
    (ApiKey.FETCH, 4, 19),
    (ApiKey.METADATA, 0, 13),
    (ApiKey.FIND_COORDINATOR, 0, 6),
    (HEARTBEAT, 0, 4),
    (ApiKey.API_VERSIONS, 0, 5),
    (ApiKey.DESCRIBE_CLUSTER, 0, 2),
    (UNKNOWN_KEY, 0, 3),
)
# kipside may handle fewer Produce versions than kio knows (the coalescer decides).
PRODUCE_MAX = kipside_ranges()[ApiKey.PRODUCE][1]
EXPECTED = {
    ApiKey.PRODUCE: (0, min(13, PRODUCE_MAX)),
    ApiKey.FETCH: (4, 18),
    ApiKey.METADATA: (0, 13),
    ApiKey.FIND_COORDINATOR: (0, 6),
    HEARTBEAT: (0, 4),
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.DESCRIBE_CLUSTER: (0, 2),
    UNKNOWN_KEY: (0, 3),
}


def test_rewrite_v0_response() -> None:
    message = v0.ApiVersionsResponse(
        error_code=ErrorCode.none,
        api_keys=tuple(
            v0.ApiVersion(api_key=i16(k), min_version=i16(lo), max_version=i16(hi))
            for k, lo, hi in BROKER_KEYS
        ),
    )
    out = rewrite(VersionPolicy(), 0, frame_of(0, message, correlation_id=-5))
    assert int.from_bytes(out[4:8], "big", signed=True) == -5
    decoded = decode_frame(0, out)
    assert decoded.error_code == ErrorCode.none
    assert ranges_of(decoded) == EXPECTED


def test_rewrite_v3_response_keeps_features() -> None:
    supported = (
        v3.SupportedFeatureKey(name="metadata.version", min_version=i16(1), max_version=i16(25)),
        v3.SupportedFeatureKey(name="transaction.version", min_version=i16(0), max_version=i16(2)),
    )
    finalized = (
        v3.FinalizedFeatureKey(
            name="metadata.version", max_version_level=i16(25), min_version_level=i16(25)
        ),
        v3.FinalizedFeatureKey(
            name="transaction.version", max_version_level=i16(2), min_version_level=i16(2)
        ),
    )
    message = response3(
        *(entry3(k, lo, hi) for k, lo, hi in BROKER_KEYS),
        throttle_ms=250,
        supported_features=supported,
        finalized_features_epoch=i64(123456789),
        finalized_features=finalized,
    )
    frame = frame_of(3, message, correlation_id=2**31 - 1)
    out = rewrite(VersionPolicy(), 3, frame)
    assert out[4:8] == frame[4:8]
    decoded = decode_frame(3, out)
    assert ranges_of(decoded) == EXPECTED
    assert decoded.supported_features == supported
    assert decoded.finalized_features == finalized
    assert decoded.finalized_features_epoch == 123456789
    assert decoded.throttle_time == datetime.timedelta(milliseconds=250)


def test_rewrite_is_identity_when_nothing_changes() -> None:
    message = response3(entry3(HEARTBEAT, 0, 4), entry3(ApiKey.METADATA, 0, 12))
    frame = frame_of(3, message)
    assert rewrite(VersionPolicy(), 3, frame) == frame


def test_rewrite_falls_back_to_the_v0_error_layout() -> None:
    # The client asked for ApiVersions v4, the broker only knows up to v3 and answers as a
    # broker must: UNSUPPORTED_VERSION in the v0 layout, listing its ApiVersions range.
    frame = bytes.fromhex(
        "00000016"  # size 22
        "00000009"  # correlation id 9 (response header v0)
        "0023"  # error_code 35 UNSUPPORTED_VERSION
        "00000002"  # api_keys: 2 entries (int32 length: v0 is not flexible)
        "001200000003"  # ApiVersions v0-3
        "000300000014"  # Metadata v0-20, more than kipside handles
    )
    out = rewrite(VersionPolicy(), 4, frame)
    # Same layout and correlation id; only Metadata's max changed, to 13.
    assert out == frame[:-2] + bytes.fromhex("000d")


def test_rewrite_v0_garbage_is_a_decode_error() -> None:
    frame = bytes.fromhex("0000000a0000000900000000")
    with pytest.raises(DecodeError):
        rewrite(VersionPolicy(), 0, frame)


def test_rewrite_garbage_of_a_newer_version_is_a_decode_error() -> None:
    frame = bytes.fromhex("0000000a0000000900000000")
    with pytest.raises(DecodeError):
        rewrite(VersionPolicy(), 3, frame)


def test_unsupported_response_v0_layout() -> None:
    out = VersionPolicy().unsupported_response(correlation_id=7)
    assert out == bytes.fromhex(
        "00000010"  # size 16
        "00000007"  # correlation id
        "0023"  # UNSUPPORTED_VERSION
        "00000001"  # one entry
        "001200000004"  # ApiVersions v0-4
    )
    decoded = decode_frame(0, out)
    assert decoded.error_code == ErrorCode.unsupported_version


def test_unsupported_response_keeps_negative_correlation_ids() -> None:
    out = VersionPolicy().unsupported_response(correlation_id=-(2**31))
    assert out[4:8] == bytes.fromhex("80000000")
