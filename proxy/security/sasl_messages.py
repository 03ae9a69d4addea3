"""The Kafka messages SASL travels in: SaslHandshake, SaslAuthenticate and raw token frames.

Decoding and encoding through kipside.protocol's kio adapter, for both sides: the session
answering clients (termination) or watching their handshake (passthrough), and kipside logging
in to a broker. After a successful SaslHandshake v0 the tokens are raw frames: a size prefix
and the token, no Kafka header, answered the same way (no correlation id).
"""

from __future__ import annotations

import datetime

from kipside.protocol import (
    INT16,
    INT32,
    ApiKey,
    DecodeError,
    ErrorCode,
    RequestHeader,
    build_frame,
    decode_request,
    decode_response,
    encode_message,
    encode_request_header,
    parse_response_header,
    request_class,
    response_class,
    response_frame,
)

SASL_APIS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
HANDSHAKE_VERSIONS = (0, 1)
AUTHENTICATE_VERSIONS = (0, 2)


def handshake_mechanism(frame: bytes, header: RequestHeader) -> str:
    """The mechanism a SaslHandshake request asks for. Raises DecodeError."""
    message = decode_request(ApiKey.SASL_HANDSHAKE, header.api_version, frame, header.body_offset)
    return str(message.mechanism)


def handshake_answer(header: RequestHeader, error: ErrorCode, mechanisms: tuple[str, ...]) -> bytes:
    cls = response_class(ApiKey.SASL_HANDSHAKE, header.api_version)
    body = encode_message(cls(error_code=error, mechanisms=mechanisms))
    return response_frame(header, body)


def handshake_accepted(frame: bytes) -> bool:
    """Whether a SaslHandshake response (any version: the error code comes first) says yes."""
    if len(frame) < 10:
        raise DecodeError("SaslHandshake response is too short")
    return int(INT16.unpack_from(frame, 8)[0]) == ErrorCode.none


def authenticate_token(frame: bytes, header: RequestHeader) -> bytes:
    """The token a SaslAuthenticate request carries. Raises DecodeError."""
    message = decode_request(
        ApiKey.SASL_AUTHENTICATE, header.api_version, frame, header.body_offset
    )
    return bytes(message.auth_bytes)


def authenticate_answer(
    header: RequestHeader,
    token: bytes,
    error: ErrorCode = ErrorCode.none,
    message: str | None = None,
) -> bytes:
    cls = response_class(ApiKey.SASL_AUTHENTICATE, header.api_version)
    fields: dict[str, object] = {"error_code": error, "error_message": message, "auth_bytes": token}
    if header.api_version >= 1:
        fields["session_lifetime"] = datetime.timedelta(0)  # no re-authentication required
    return response_frame(header, encode_message(cls(**fields)))


def raw_frame(token: bytes) -> bytes:
    """A legacy (SaslHandshake v0) token frame: the size, then the token."""
    return INT32.pack(len(token)) + token


# kipside as the client of a broker ----------------------------------------------------------


def api_versions_request(correlation_id: int) -> bytes:
    return build_frame(
        encode_request_header(ApiKey.API_VERSIONS, 0, correlation_id, "kipside"), b""
    )


def offers_authenticate(frame: bytes) -> bool:
    """Whether an ApiVersions v0 response lists SaslAuthenticate (Kafka 1.0+): if not, the
    broker speaks only the legacy flow (SaslHandshake v0, raw tokens)."""
    head = parse_response_header(frame, ApiKey.API_VERSIONS, 0)
    message = decode_response(ApiKey.API_VERSIONS, 0, frame, head.body_offset)
    return any(entry.api_key == ApiKey.SASL_AUTHENTICATE for entry in message.api_keys)


def handshake_request(mechanism: str, correlation_id: int, version: int = 1) -> bytes:
    body = encode_message(request_class(ApiKey.SASL_HANDSHAKE, version)(mechanism=mechanism))
    head = encode_request_header(ApiKey.SASL_HANDSHAKE, version, correlation_id, "kipside")
    return build_frame(head, body)


def authenticate_request(token: bytes, correlation_id: int) -> bytes:
    body = encode_message(request_class(ApiKey.SASL_AUTHENTICATE, 1)(auth_bytes=token))
    head = encode_request_header(ApiKey.SASL_AUTHENTICATE, 1, correlation_id, "kipside")
    return build_frame(head, body)


def handshake_response(frame: bytes, version: int = 1) -> tuple[int, tuple[str, ...]]:
    """(error code, mechanisms the broker enables) of a SaslHandshake response."""
    head = parse_response_header(frame, ApiKey.SASL_HANDSHAKE, version)
    message = decode_response(ApiKey.SASL_HANDSHAKE, version, frame, head.body_offset)
    return int(message.error_code), tuple(message.mechanisms)


def authenticate_response(frame: bytes) -> tuple[int, str | None, bytes]:
    """(error code, error message, token) of a SaslAuthenticate v1 response."""
    head = parse_response_header(frame, ApiKey.SASL_AUTHENTICATE, 1)
    message = decode_response(ApiKey.SASL_AUTHENTICATE, 1, frame, head.body_offset)
    return int(message.error_code), message.error_message, bytes(message.auth_bytes)
