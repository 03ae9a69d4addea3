"""Kafka request and response headers, read and written on framed bytes.

Frames here include their 4-byte size prefix (as protocol.framing returns them). Request header
v1: api_key, api_version, correlation_id, client_id; v2 adds a tagged-field section. Response
header v0: correlation_id; v1 adds tagged fields. Which version applies comes from
protocol.apis. Parsing is by hand (a few struct reads) because it runs on every frame.
Never does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from .apis import request_header_version, response_header_version
from .errors import DecodeError
from .primitives import (
    INT16,
    INT32,
    Buffer,
    DecodeLimits,
    read_nullable_string,
    skip_tagged_fields,
    write_uvarint,
)

_PREFIX = 4  # the frame's size field
_REQUEST_FIXED = 8  # api_key, api_version, correlation_id


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_version: int
    body_offset: int
    """Offset of the request body within the frame (size prefix included)."""


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    correlation_id: int
    header_version: int
    body_offset: int
    """Offset of the response body within the frame (size prefix included)."""


def parse_request_header(frame: Buffer, limits: DecodeLimits | None = None) -> RequestHeader:
    """The header of a request frame; `limits` caps its tagged fields (LimitExceeded)."""
    if len(frame) < _PREFIX + _REQUEST_FIXED:
        raise DecodeError(
            f"request of {len(frame) - _PREFIX} bytes is shorter than a Kafka request header"
        )
    api_key = INT16.unpack_from(frame, 4)[0]
    api_version = INT16.unpack_from(frame, 6)[0]
    correlation_id = INT32.unpack_from(frame, 8)[0]
    if api_key < 0 or api_version < 0:
        raise DecodeError(f"request header has api key {api_key}, version {api_version}")
    client_id, offset = read_nullable_string(frame, 12)
    version = request_header_version(api_key, api_version)
    if version >= 2:
        offset = skip_tagged_fields(frame, offset, limits)
    return RequestHeader(api_key, api_version, correlation_id, client_id, version, offset)


def request_body_offset(frame: Buffer) -> int:
    """parse_request_header's body_offset alone, the client id skipped rather than decoded: for
    readers of packet captures, which see hundreds of thousands of requests."""
    if len(frame) < _PREFIX + _REQUEST_FIXED + 2:
        raise DecodeError(
            f"request of {len(frame) - _PREFIX} bytes is shorter than a Kafka request header"
        )
    api_key = INT16.unpack_from(frame, 4)[0]
    api_version = INT16.unpack_from(frame, 6)[0]
    offset: int = 14 + max(INT16.unpack_from(frame, 12)[0], 0)
    if offset > len(frame):
        raise DecodeError("truncated client id")
    if request_header_version(api_key, api_version) >= 2:
        offset = skip_tagged_fields(frame, offset)
    return offset


def request_correlation_id(frame: Buffer) -> int:
    return int(INT32.unpack_from(frame, 8)[0])


def with_request_correlation_id(frame: bytes, correlation_id: int) -> bytes:
    """The same request frame under another correlation id (for multiplexed connections)."""
    return frame[:8] + INT32.pack(correlation_id) + frame[12:]


def parse_response_header(frame: Buffer, api_key: int, api_version: int) -> ResponseHeader:
    if len(frame) < _PREFIX + 4:
        raise DecodeError("response is shorter than a Kafka response header")
    correlation_id = INT32.unpack_from(frame, 4)[0]
    version = response_header_version(api_key, api_version)
    offset = 8
    if version >= 1:
        offset = skip_tagged_fields(frame, offset)
    return ResponseHeader(correlation_id, version, offset)


def response_correlation_id(frame: Buffer) -> int:
    return int(INT32.unpack_from(frame, 4)[0])


def with_response_correlation_id(frame: bytes, correlation_id: int) -> bytes:
    return frame[:4] + INT32.pack(correlation_id) + frame[8:]


def encode_request_header(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None
) -> bytes:
    """Header bytes (no size prefix) in the version the API version calls for."""
    out = INT16.pack(api_key) + INT16.pack(api_version) + INT32.pack(correlation_id)
    if client_id is None:
        out += INT16.pack(-1)
    else:
        raw = client_id.encode("utf-8")
        out += INT16.pack(len(raw)) + raw
    if request_header_version(api_key, api_version) >= 2:
        out += write_uvarint(0)
    return out


def encode_response_header(api_key: int, api_version: int, correlation_id: int) -> bytes:
    """Header bytes (no size prefix) in the version the API version calls for."""
    out = INT32.pack(correlation_id)
    if response_header_version(api_key, api_version) >= 1:
        out += write_uvarint(0)
    return out


def build_frame(header: bytes, body: Buffer) -> bytes:
    return INT32.pack(len(header) + len(body)) + header + bytes(body)


def response_frame(request: RequestHeader, body: Buffer) -> bytes:
    """A response frame answering `request`: its correlation id, in the response header version
    its API version calls for, around `body` (an encoded response message)."""
    head = encode_response_header(request.api_key, request.api_version, request.correlation_id)
    return build_frame(head, body)
