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
    """The stream carries another protocol (TLS, HTTP) on a plaintext Kafka port."""


class DecodeError(ProtocolError):
    """A message body could not be decoded (malformed, or a shape kipside does not know)."""


class UnsupportedVersionError(ProtocolError):
    """The broker speaks no version of an API that kipside also speaks."""


class LocalProtocolError(Exception):
    """kipside misused this package: a bug in kipside, not in the peer."""
