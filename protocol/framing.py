"""Split a Kafka byte stream into size-prefixed frames, sans-I/O.

Feed bytes in with `receive_data`, take whole frames out with `next_frame`. A frame is returned
with its 4-byte size prefix so a proxy can forward it as one write. Anything buffered is capped:
a frame larger than `max_frame_bytes` is refused before its body is read. The first bytes of a
connection are checked for TLS and HTTP, in either direction, so a client or a broker address
that is not a plaintext Kafka listener gets a useful error instead of "frame too large". Never
does I/O, never imports trio.
"""

from __future__ import annotations

import struct
from typing import Final

from .apis import ApiKey, api_name
from .errors import FrameError, FrameTooLargeError, LocalProtocolError, NotKafkaError
from .primitives import Buffer

DEFAULT_MAX_FRAME_BYTES: Final = 100 * 1024 * 1024
_SIZE = struct.Struct(">i")
_REQUEST_START = struct.Struct(">ihh")  # size, api key, api version
_API_KEYS: Final = frozenset(ApiKey)
_HTTP_METHODS: Final = (
    b"GET ",
    b"POST",
    b"PUT ",
    b"HEAD",
    b"DELE",
    b"OPTI",
    b"PATC",
    b"CONN",
    b"TRAC",
    b"PRI ",
)


def sniff_foreign_protocol(head: bytes) -> str | None:
    """Name the protocol if the first bytes of a stream are TLS or HTTP rather than Kafka."""
    if len(head) >= 3 and head[0] == 0x16 and head[1] == 0x03 and head[2] <= 0x04:
        return "a TLS ClientHello"
    if len(head) >= 3 and head[0] == 0x15 and head[1] == 0x03 and head[2] <= 0x04:
        # A TLS client may open with an alert (librdkafka did, retrying, seen here).
        return "a TLS alert"
    if head[:4] in _HTTP_METHODS:
        line = head.split(b"\r\n", 1)[0][:60]
        return f"an HTTP request ({line.decode('latin-1')!r})"
    return None


def sniff_foreign_response(head: bytes) -> str | None:
    """Name the protocol if the first bytes a server sent back to a Kafka request are not
    Kafka: an HTTP response (a web port), a TLS record (a TLS listener answering plaintext with
    an alert), an SSH banner."""
    if len(head) >= 3 and head[0] in (0x15, 0x16) and head[1] == 0x03 and head[2] <= 0x04:
        return "a TLS alert" if head[0] == 0x15 else "a TLS handshake"
    if head[:5] == b"HTTP/":
        line = head.split(b"\r\n", 1)[0][:60]
        return f"an HTTP response ({line.decode('latin-1')!r})"
    if head[:4] == b"SSH-":
        return "an SSH banner"
    return None


def sniff_kafka_request(head: bytes) -> str | None:
    """Name the request if the first bytes of a stream look like a plaintext Kafka request
    ("an ApiVersions v3 request"): a plausible size, a known API key, a small version. For a
    TLS listener that received plaintext instead of a ClientHello."""
    if len(head) < 8:
        return None
    size, api_key, api_version = _REQUEST_START.unpack_from(head)
    if not 8 <= size <= DEFAULT_MAX_FRAME_BYTES or api_key not in _API_KEYS:
        return None
    if not 0 <= api_version <= 64:
        return None
    name = api_name(api_key)
    article = "an" if name[0] in "AEIOU" else "a"
    return f"{article} {name} v{api_version} request"


class FrameDecoder:
    """Accumulates bytes of one direction of one connection and yields complete frames."""

    __slots__ = ("_buf", "_first", "_from_server", "_max", "_min", "_pos")

    def __init__(
        self,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        min_frame_bytes: int = 4,
        from_server: bool = False,
    ):
        """`from_server`: the bytes are a server's answers (a broker's), not a client's
        requests; it decides what the first bytes are checked for."""
        if max_frame_bytes < min_frame_bytes:
            raise LocalProtocolError("max_frame_bytes must be at least min_frame_bytes")
        self._from_server = from_server
        self._buf = bytearray()
        self._pos = 0
        self._max = max_frame_bytes
        self._min = min_frame_bytes
        self._first = True

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a frame."""
        return len(self._buf) - self._pos

    @property
    def min_frame_bytes(self) -> int:
        return self._min

    @min_frame_bytes.setter
    def min_frame_bytes(self, size: int) -> None:
        """Lowered while raw SASL tokens (after SaslHandshake v0) are due: they carry no Kafka
        header, and PLAIN's answer is an empty frame."""
        self._min = size

    def receive_data(self, data: Buffer) -> None:
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    def next_frame(self) -> bytes | None:
        """The next whole frame (size prefix included), or None until more bytes arrive.

        Raises FrameError (or NotKafkaError) when the stream can't be Kafka; the connection
        must then be closed.
        """
        buf = self._buf
        pos = self._pos
        available = len(buf) - pos
        if available < 4:
            if self._first and available:
                self._check_foreign(bytes(buf[pos:]), partial=True)
            return None
        (size,) = _SIZE.unpack_from(buf, pos)
        if self._first:
            if not self._min <= size <= self._max:
                self._check_foreign(bytes(buf[pos : pos + 64]), partial=False)
            self._first = False
        if size < self._min:
            raise FrameError(
                f"frame size {size} is below the {self._min}-byte minimum of a Kafka message; "
                "the peer is not speaking Kafka or the stream is corrupt"
            )
        if size > self._max:
            raise FrameTooLargeError(
                f"frame size {size} exceeds the {self._max}-byte cap (limits.max_frame_bytes); "
                "raise the cap in the rule file if such large messages are intended",
                size=size,
                cap=self._max,
            )
        end = pos + 4 + size
        if len(buf) < end:
            return None
        frame = bytes(buf[pos:end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        elif end > 1 << 20:
            del buf[:end]
            self._pos = 0
        else:
            self._pos = end
        return frame

    def _check_foreign(self, head: bytes, *, partial: bool) -> None:
        if self._from_server:
            answer = sniff_foreign_response(head)
            if answer is not None:
                raise NotKafkaError(
                    f"received {answer} where a Kafka response was due: the server is not a "
                    "plaintext Kafka listener",
                    protocol=answer.split()[1],
                )
            return
        what = sniff_foreign_protocol(head)
        if what is None:
            return
        if what.startswith("a TLS"):
            advice = (
                "this listener is plaintext: set the client's security.protocol=PLAINTEXT, "
                "or start kipside with --tls-cert FILE --tls-key FILE to serve TLS"
            )
        else:
            advice = "this is a Kafka port: HTTP belongs on the admin endpoint (--admin)"
        raise NotKafkaError(
            f"received {what} on a plaintext Kafka port; {advice}", protocol=what.split()[1]
        )


def encode_frame(payload: Buffer) -> bytes:
    """Prefix a payload with its size."""
    return _SIZE.pack(len(payload)) + bytes(payload)
