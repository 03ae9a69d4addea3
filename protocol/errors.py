"""Error vocabulary for protocol/: who broke the rules, the peer or the caller.

Following h11's split: `ProtocolError` means the bytes from the other side are not valid Kafka
(the connection should be closed with a clear log line); `LocalProtocolError` means kipside
misused an API of this package (a bug in kipside). Nothing here does I/O.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """The peer sent bytes that are not valid Kafka protocol."""


class FrameError(ProtocolError):
    """A size-prefixed frame could not be taken from the stream."""


class NotKafkaError(FrameError):
    """The stream carries another protocol (TLS, HTTP) on a plaintext Kafka port, or a server
    answered a Kafka request in another protocol. `protocol` names it ("TLS", "HTTP", ...)."""

    def __init__(self, message: str, *, protocol: str) -> None:
        super().__init__(message)
        self.protocol = protocol


class DecodeError(ProtocolError):
    """A message body could not be decoded (malformed, or a shape kipside does not know)."""


class FrameTooLargeError(FrameError):
    """A frame declares a size over the decoder's cap (`max_frame_bytes`)."""

    def __init__(self, message: str, *, size: int, cap: int) -> None:
        super().__init__(message)
        self.size = size
        self.cap = cap


class LimitExceeded(DecodeError):
    """A message is valid Kafka but passes a cap the caller set (primitives.DecodeLimits):
    more tagged fields, a larger tagged field or a longer array than it accepts. `limit` is
    the DecodeLimits field's name."""

    def __init__(self, message: str, *, limit: str, value: int, cap: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value
        self.cap = cap


class UnsupportedVersionError(ProtocolError):
    """The broker speaks no version of an API that kipside also speaks."""


class LocalProtocolError(Exception):
    """kipside misused this package: a bug in kipside, not in the peer."""
