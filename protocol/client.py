"""The client side of one Kafka connection, sans-I/O: requests out, responses in.

Modelled on h11's connection object: the caller asks for the bytes of a request
(`send_request`, or `send_frame` for a request frame made elsewhere, such as a client's that a
proxy forwards), writes them however it likes, feeds whatever the broker sends into
`receive_data`, and takes whole responses out with `next_response`. This object assigns
correlation ids, remembers which API and version each in-flight request used (a response
carries neither), checks that the broker answers in request order, as it must on one
connection, and says when the oldest request has waited too long for its answer (`deadline`,
`overdue`: the caller passes the time in, from whatever clock it runs on). It never does I/O,
never imports trio or sockets, and never decodes a body: that is for the codec of each API
(protocol.messages, protocol.produce, protocol.fetch).

Errors follow h11's split: a broker that breaks the protocol raises ProtocolError (close the
connection); misuse of this object raises LocalProtocolError.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from .apis import api_name
from .errors import ProtocolError, UnsupportedVersionError
from .framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder
from .headers import (
    encode_request_header,
    parse_response_header,
    request_correlation_id,
    response_correlation_id,
    with_request_correlation_id,
    with_response_correlation_id,
)
from .messages import Message, decode_response, encode_message
from .primitives import INT32, Buffer

__all__ = [
    "ClientConnection",
    "InFlightRequest",
    "Response",
    "VersionRange",
    "pick_version",
]

_MAX_CORRELATION_ID: Final = 2**31 - 1
RAW: Final = -1
"""The api key of a legacy SASL token in flight (after SaslHandshake v0): no Kafka header."""
UNANSWERED_MEMORY: Final = 1024
"""Correlation ids of requests that expect no answer, remembered in case a broker answers."""


class Response:
    """One whole response, matched to the request it answers."""

    __slots__ = ("_body_offset", "api_key", "api_version", "correlation_id", "frame", "tag")

    def __init__(
        self, api_key: int, api_version: int, correlation_id: int, frame: bytes, tag: object
    ) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.frame = frame
        """The frame as received (size prefix included); for a request sent with
        `send_frame`, under that frame's own correlation id again."""
        self.tag = tag
        """What the caller attached to the request (`send_request`, `send_frame`)."""
        self._body_offset = 4 if api_key == RAW else -1

    def __repr__(self) -> str:
        return (
            f"Response({api_name(self.api_key) if self.api_key >= 0 else 'raw'} "
            f"v{self.api_version}, correlation id {self.correlation_id}, {len(self.frame)} bytes)"
        )

    @property
    def body_offset(self) -> int:
        """Where the body starts in `frame` (after the response header; 4 for a raw token).
        Read on first use: a proxy that only passes the frame on never needs it."""
        if self._body_offset < 0:
            header = parse_response_header(self.frame, self.api_key, self.api_version)
            self._body_offset = header.body_offset
        return self._body_offset

    def decode(self) -> Message:
        """The body through kio (for the small APIs; Produce and Fetch have their own codecs)."""
        return decode_response(self.api_key, self.api_version, self.frame, self.body_offset)


@dataclass(slots=True)
class InFlightRequest:
    """A request sent and not yet answered."""

    correlation_id: int
    """The id it went to the broker under."""
    api_key: int
    api_version: int
    tag: object
    original_id: int
    """The id of the frame as given to `send_frame` (the same as `correlation_id` otherwise)."""
    allowance: float
    """Seconds the broker may take by the request's own terms, if more than the timeout."""


class ClientConnection:
    """One connection to one broker, as a client sees it.

    `answer_timeout`: seconds the oldest request in flight may wait for its answer, counted
    from when it became the oldest (the broker answers in order, so nothing answered meanwhile
    means the broker answered nothing), or for its own allowance if longer; None: no limit.
    `keep_correlation_ids`: `send_frame` keeps each frame's own id instead of assigning one
    (for a connection that carries one client's requests only, whose ids are already unique);
    the connection's own requests (`send_request`) then take ids counting down from the
    highest, away from the client's, which count up from 0.
    """

    __slots__ = (
        "_answer_timeout",
        "_client_id",
        "_decoder",
        "_head_since",
        "_in_flight",
        "_keep_ids",
        "_next_id",
        "_raw_due",
        "_ready",
        "_unanswered",
    )

    def __init__(
        self,
        client_id: str | None,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        answer_timeout: float | None = None,
        keep_correlation_ids: bool = False,
    ) -> None:
        self._client_id = client_id
        self._decoder = FrameDecoder(max_frame_bytes=max_frame_bytes, from_server=True)
        self._in_flight: deque[InFlightRequest] = deque()
        self._ready: deque[Response] = deque()
        self._unanswered: deque[int] = deque(maxlen=UNANSWERED_MEMORY)
        self._next_id = _MAX_CORRELATION_ID if keep_correlation_ids else 0
        self._answer_timeout = answer_timeout
        self._head_since = 0.0
        self._keep_ids = keep_correlation_ids
        self._raw_due = 0

    @property
    def in_flight(self) -> int:
        """Requests sent whose response has not been taken with next_response yet."""
        return len(self._in_flight) + len(self._ready)

    @property
    def answer_timeout(self) -> float | None:
        return self._answer_timeout

    @property
    def waiting(self) -> int:
        """Requests sent whose response has not arrived yet."""
        return len(self._in_flight)

    def oldest(self) -> InFlightRequest | None:
        """The request sent longest ago whose answer has not arrived."""
        return self._in_flight[0] if self._in_flight else None

    def newest(self) -> InFlightRequest | None:
        """The request sent last whose answer has not arrived: once it has, every earlier one
        has too."""
        return self._in_flight[-1] if self._in_flight else None

    # Sending ----------------------------------------------------------------------------

    def _take_id(self) -> int:
        correlation_id = self._next_id
        if self._keep_ids:
            self._next_id = _MAX_CORRELATION_ID if correlation_id == 0 else correlation_id - 1
        else:
            self._next_id = 0 if correlation_id == _MAX_CORRELATION_ID else correlation_id + 1
        return correlation_id

    def _sent(self, entry: InFlightRequest, now: float) -> None:
        if not self._in_flight:
            self._head_since = now
        self._in_flight.append(entry)

    def send_request(
        self,
        api_key: int,
        api_version: int,
        body: Sequence[Buffer] | Buffer,
        *,
        tag: object = None,
        now: float = 0.0,
        allowance: float = 0.0,
    ) -> list[Buffer]:
        """The chunks of one request frame (size prefix, header, body), ready to write in order.

        `body` may be a list of chunks so big payloads (record batches) are never copied.
        """
        chunks: list[Buffer] = [body] if isinstance(body, Buffer) else list(body)
        correlation_id = self._take_id()
        header = encode_request_header(api_key, api_version, correlation_id, self._client_id)
        size = len(header) + sum(len(c) for c in chunks)
        entry = InFlightRequest(
            correlation_id, api_key, api_version, tag, correlation_id, allowance
        )
        self._sent(entry, now)
        return [INT32.pack(size) + header, *chunks]

    def send_message(self, message: Message) -> list[Buffer]:
        """The chunks of a request built with kio (its class knows its API key and version)."""
        api_key = int(message.__api_key__)
        api_version = int(message.__version__)
        return self.send_request(api_key, api_version, encode_message(message))

    def send_frame(
        self,
        frame: bytes,
        api_key: int,
        api_version: int,
        *,
        expects_response: bool = True,
        tag: object = None,
        now: float = 0.0,
        allowance: float = 0.0,
    ) -> bytes:
        """A whole request frame made elsewhere (size prefix and header included), to send as
        it is but for its correlation id, which becomes this connection's (unless it keeps
        ids); its response comes back under the frame's own id again. A request that expects no
        response (acks=0 Produce) is not in flight, but an answer to it is dropped if a broker
        sends one."""
        original = request_correlation_id(frame)
        correlation_id = original if self._keep_ids else self._take_id()
        if not expects_response:
            self._unanswered.append(correlation_id)
        else:
            self._sent(
                InFlightRequest(correlation_id, api_key, api_version, tag, original, allowance),
                now,
            )
        if correlation_id != original:
            return with_request_correlation_id(frame, correlation_id)
        return frame

    def send_raw(self, frame: bytes, *, tag: object = None, now: float = 0.0) -> bytes:
        """A legacy SASL token frame (after SaslHandshake v0), sent as it is: its answer is the
        broker's next frame, also raw (no header, no correlation id)."""
        self._sent(InFlightRequest(RAW, RAW, 0, tag, RAW, 0.0), now)
        self._raw_due += 1
        self._decoder.min_frame_bytes = 0  # PLAIN's answer is an empty frame
        return frame

    # Receiving --------------------------------------------------------------------------

    def receive_data(self, data: Buffer, now: float = 0.0) -> None:
        """Feed bytes read from the broker; raises ProtocolError if they can't be Kafka."""
        self._decoder.receive_data(data)
        while (frame := self._decoder.next_frame()) is not None:
            response = self._match(frame)
            if response is not None:
                self._ready.append(response)
                self._head_since = now

    def next_response(self) -> Response | None:
        """The oldest whole response not yet taken, or None until more bytes arrive."""
        return self._ready.popleft() if self._ready else None

    def _match(self, frame: bytes) -> Response | None:
        if self._raw_due and self._in_flight and self._in_flight[0].api_key == RAW:
            self._raw_due -= 1
            if not self._raw_due:
                self._decoder.min_frame_bytes = 4
            raw = self._in_flight.popleft()
            return Response(RAW, 0, RAW, frame, raw.tag)
        correlation_id = response_correlation_id(frame)
        if not self._in_flight or self._in_flight[0].correlation_id != correlation_id:
            if correlation_id in self._unanswered:
                self._unanswered.remove(correlation_id)
                return None
            if not self._in_flight:
                raise ProtocolError(
                    f"the broker sent a {len(frame) - 4}-byte response to no request "
                    f"(correlation id {correlation_id})"
                )
            asked = self._in_flight[0]
            raise ProtocolError(
                f"the broker answered correlation id {correlation_id} while "
                f"{api_name(asked.api_key)} v{asked.api_version} with correlation id "
                f"{asked.correlation_id} was the oldest request in flight: responses out of "
                "order, the connection can't be trusted"
            )
        asked = self._in_flight.popleft()
        if asked.original_id != correlation_id:
            frame = with_response_correlation_id(frame, asked.original_id)
        return Response(asked.api_key, asked.api_version, asked.original_id, frame, asked.tag)

    # Time -------------------------------------------------------------------------------

    def deadline(self) -> float:
        """When the oldest request in flight will have waited too long (math.inf: never)."""
        if self._answer_timeout is None or not self._in_flight:
            return math.inf
        return self._head_since + max(self._answer_timeout, self._in_flight[0].allowance)

    def overdue(self, now: float) -> InFlightRequest | None:
        """The oldest request in flight if it has waited past its deadline (the connection
        should then be closed: a broker that answers nothing for that long is gone)."""
        if now >= self.deadline():
            return self._in_flight[0]
        return None

    def close(self) -> list[object]:
        """The connection is gone: the tags of every request whose answer will never come,
        oldest first. Responses already received stay to be taken."""
        tags = [entry.tag for entry in self._in_flight]
        self._in_flight.clear()
        self._raw_due = 0
        return tags


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
