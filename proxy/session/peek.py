"""What a session reads from a request without routing it: a ProduceRequest's acks (whether an
answer is owed) and its topic names (for the request's span).
"""

from __future__ import annotations

from kipside.protocol import (
    PRODUCE_MAX_VERSION,
    PRODUCE_MIN_VERSION,
    ApiKey,
    DecodeError,
    DecodeLimits,
    RequestHeader,
    parse_produce_request,
    produce_request_acks,
)

__all__ = ["produce_acks", "produce_topics"]


def produce_topics(
    frame: bytes, header: RequestHeader, limits: DecodeLimits | None = None
) -> tuple[str, ...]:
    """Topic names of a ProduceRequest, for its span; other requests stay undecoded."""
    if (
        header.api_key != ApiKey.PRODUCE
        or not PRODUCE_MIN_VERSION <= header.api_version <= PRODUCE_MAX_VERSION
    ):
        return ()
    try:
        request = parse_produce_request(frame, header.body_offset, header.api_version, limits)
    except DecodeError:
        return ()
    return tuple(p.topic for p in request.partitions)


def produce_acks(frame: bytes, header: RequestHeader) -> int:
    """The acks field of a ProduceRequest; DecodeError if the request is too short for it."""
    return produce_request_acks(frame, header.body_offset, header.api_version)
