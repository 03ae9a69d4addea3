"""The client side of one Kafka connection, sans-I/O: requests out, responses in.

Modelled on h11's connection object: the caller asks for the bytes of a request
(`send_request`), writes them however it likes, feeds whatever the broker sends into
`receive_data`, and takes whole responses out with `next_response`. This object assigns
correlation ids, remembers which API and version each in-flight request used (a response
carries neither), and checks that the broker answers in request order, as it must on one
connection. It never does I/O, never imports trio or sockets, and never decodes a body: that is
for the codec of each API (protocol.messages, protocol.produce, protocol.fetch).

Errors follow h11's split: a broker that breaks the protocol raises ProtocolError (close the
connection); misuse of this object raises LocalProtocolError.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from .apis import api_name
from .errors import ProtocolError, UnsupportedVersionError
from .framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder
from .headers import encode_request_header, parse_response_header
from .messages import Message, decode_response, encode_message
from .primitives import INT32, Buffer

__all__ = [
    "ClientConnection",
    "Response",
    "VersionRange",
    "pick_version",
]

_MAX_CORRELATION_ID: Final = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Response:
    """One whole response, matched to the request it answers."""

    api_key: int
    api_version: int
    correlation_id: int
    frame: bytes
    """The frame as received, size prefix included."""
    body_offset: int
    """Where the body starts in `frame` (after the response header)."""

    def decode(self) -> Message:
        """The body through kio (for the small APIs; Produce and Fetch have their own codecs)."""
        return decode_response(self.api_key, self.api_version, self.frame, self.body_offset)


@dataclass(frozen=True, slots=True)
class _InFlight:
    correlation_id: int
    api_key: int
    api_version: int


class ClientConnection:
    """One connection to one broker, as a client sees it."""

    __slots__ = ("_client_id", "_decoder", "_in_flight", "_next_id", "_ready")

    def __init__(
        self, client_id: str | None, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    ) -> None:
        self._client_id = client_id
        self._decoder = FrameDecoder(max_frame_bytes=max_frame_bytes, from_server=True)
        self._in_flight: deque[_InFlight] = deque()
        self._ready: deque[Response] = deque()
        self._next_id = 0

    @property
    def in_flight(self) -> int:
        """Requests sent whose response has not been taken with next_response yet."""
        return len(self._in_flight) + len(self._ready)

    def send_request(
        self, api_key: int, api_version: int, body: Sequence[Buffer] | Buffer
    ) -> list[Buffer]:
        """The chunks of one request frame (size prefix, header, body), ready to write in order.

        `body` may be a list of chunks so big payloads (record batches) are never copied.
        """
        chunks: list[Buffer] = [body] if isinstance(body, Buffer) else list(body)
        correlation_id = self._next_id
        self._next_id = 0 if correlation_id == _MAX_CORRELATION_ID else correlation_id + 1
        header = encode_request_header(api_key, api_version, correlation_id, self._client_id)
        size = len(header) + sum(len(c) for c in chunks)
        self._in_flight.append(_InFlight(correlation_id, api_key, api_version))
        return [INT32.pack(size) + header, *chunks]

    def send_message(self, message: Message) -> list[Buffer]:
        """The chunks of a request built with kio (its class knows its API key and version)."""
        api_key = int(message.__api_key__)
        api_version = int(message.__version__)
        return self.send_request(api_key, api_version, encode_message(message))

    def receive_data(self, data: Buffer) -> None:
        """Feed bytes read from the broker; raises ProtocolError if they can't be Kafka."""
        self._decoder.receive_data(data)
        while (frame := self._decoder.next_frame()) is not None:
            self._ready.append(self._match(frame))

    def next_response(self) -> Response | None:
        """The oldest whole response not yet taken, or None until more bytes arrive."""
        return self._ready.popleft() if self._ready else None

    def _match(self, frame: bytes) -> Response:
        if not self._in_flight:
            raise ProtocolError(f"the broker sent a {len(frame) - 4}-byte response to no request")
        asked = self._in_flight.popleft()
        header = parse_response_header(frame, asked.api_key, asked.api_version)
        if header.correlation_id != asked.correlation_id:
            raise ProtocolError(
                f"the broker answered correlation id {header.correlation_id} while "
                f"{api_name(asked.api_key)} v{asked.api_version} with correlation id "
                f"{asked.correlation_id} was the oldest request in flight: responses out of "
                "order, the connection can't be trusted"
            )
        return Response(
            asked.api_key, asked.api_version, asked.correlation_id, frame, header.body_offset
        )


@dataclass(frozen=True, slots=True)
class VersionRange:
    min: int
    max: int


def pick_version(
    api_key: int, broker: dict[int, VersionRange], ours: VersionRange, *, broker_name: str
) -> int:
    """The highest version of an API both sides speak, or UnsupportedVersionError saying why.

    `broker` is the broker's ApiVersions answer by API key.
    """
    theirs = broker.get(api_key)
    name = api_name(api_key)
    if theirs is None:
        raise UnsupportedVersionError(
            f"{broker_name} does not offer {name} (api key {api_key}); kipside needs "
            f"v{ours.min}-v{ours.max}"
        )
    version = min(theirs.max, ours.max)
    if version < max(theirs.min, ours.min):
        raise UnsupportedVersionError(
            f"{broker_name} offers {name} v{theirs.min}-v{theirs.max}, kipside speaks "
            f"v{ours.min}-v{ours.max}: no version in common"
        )
    return version
