"""One captured TCP connection as a Kafka conversation: requests, and the responses answering them.

Each direction is reassembled (reassembly.TcpDirection) and split into frames
(frames.FrameSplitter). Client frames are requests; server frames are responses, matched to
their requests by correlation id. Kafka answers a connection's requests in order, so when a
response arrives, every request still waiting from before it was never answered in the capture
(its response was lost): those are given up at once, which keeps the table of waiting requests
as small as the client's pipeline. Produce requests with acks=0 expect no answer; the last few
are remembered anyway, because some brokers (Tansu) answer them.

What the connection learns goes to a Listener (the summary). A connection whose first client
bytes are a TLS ClientHello (or, for a capture that began mid-connection, TLS records) is
reported as TLS and not read further; one whose client bytes are neither Kafka nor TLS is
reported as not Kafka. Never does I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

from kipside.protocol import INT32, Buffer, sniff_foreign_protocol

from .counts import skipped
from .decode import (
    REQUEST_BODIES,
    RESPONSE_BODIES,
    RequestSeen,
    ResponseSeen,
    correlation_id,
    plausible_first_request,
)
from .frames import (
    Frame,
    FrameCounts,
    FrameSplitter,
    RequestBoundaries,
    ResponseBoundaries,
    tls_records,
)
from .reassembly import ReassemblyCounts, TcpDirection

__all__ = ["Connection", "ConversationCounts", "Endpoint", "Listener"]

MAX_WAITING: Final = 65536
"""Requests waiting for an answer on one connection, at most (older ones are given up)."""
ACKS0_REMEMBERED: Final = 256
REQUEST_MIN_BYTES: Final = 8  # api key, version, correlation id
RESPONSE_MIN_BYTES: Final = 4  # correlation id

KAFKA: Final = "Kafka"
TLS: Final = "TLS"
NOT_KAFKA: Final = "not Kafka"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An IP address (4 or 16 bytes, as captured) and a port."""

    ip: bytes
    port: int

    def __str__(self) -> str:
        import ipaddress

        address = ipaddress.ip_address(self.ip)
        host = str(address) if address.version == 4 else f"[{address}]"
        return f"{host}:{self.port}"


@dataclass
class ConversationCounts:
    """What matching found, added up over every connection of a capture."""

    unanswered: int = skipped("requests whose answer is not in the capture")
    abandoned: int = skipped(
        "requests whose client closed the connection before their answer (not a loss: a "
        "Kafka broker drops the answers of a closed connection too)"
    )
    unmatched_responses: int = skipped("responses to requests not in the capture")
    """Sent before the capture began, or their request was lost."""
    unread_requests: int = skipped("request bodies not read (bytes lost, or they did not decode)")
    unread_responses: int = skipped("response bodies not read (bytes lost, or they did not decode)")
    waiting_dropped: int = skipped("requests given up because too many waited on one connection")
    """MAX_WAITING were already waiting on their connection."""


class Listener(Protocol):
    """What a connection tells the summary."""

    def request(self, connection: Connection, request: RequestSeen) -> None: ...

    def response(
        self, connection: Connection, request: RequestSeen, response: ResponseSeen, ts: float
    ) -> None: ...

    def closed(self, connection: Connection) -> None: ...

    def frame(
        self, connection: Connection, frame: Frame, request: RequestSeen, is_response: bool
    ) -> None:
        """Every frame (only if the listener's `keeps_frames` is true: then every frame is
        kept whole)."""


class _Discard:
    """Where the bytes of a connection that is not Kafka go."""

    def data(self, chunk: Buffer, ts: float) -> None:
        pass

    def lost(self, size: int) -> None:
        pass


_DISCARD: Final = _Discard()


class Connection:
    """Both directions of one TCP connection, and the requests waiting for their answers."""

    __slots__ = (
        "_acks0",
        "_listener",
        "_request_frames",
        "_response_frames",
        "client",
        "client_closed_first",
        "counts",
        "first_ts",
        "keep_frames",
        "kind",
        "last_ts",
        "midstream",
        "requests",
        "responses",
        "server",
        "waiting",
    )

    def __init__(
        self,
        client: Endpoint,
        server: Endpoint,
        listener: Listener,
        counts: ConversationCounts,
        reassembly: ReassemblyCounts,
        frames: FrameCounts,
        ts: float,
    ) -> None:
        self.client = client
        self.server = server
        self.kind: str | None = None  # KAFKA, TLS or NOT_KAFKA once known
        self.first_ts = ts
        self.last_ts = ts
        self.counts = counts
        self._listener = listener
        self.keep_frames = bool(getattr(listener, "keeps_frames", False))
        self.waiting: OrderedDict[int, RequestSeen] = OrderedDict()
        self._acks0: OrderedDict[int, RequestSeen] = OrderedDict()
        self._request_frames = FrameSplitter(
            _Requests(self),
            _RequestsOrTls(self),
            frames,
            min_frame_bytes=REQUEST_MIN_BYTES,
        )
        self._response_frames = FrameSplitter(
            _Responses(self),
            ResponseBoundaries(self.waiting),
            frames,
            min_frame_bytes=RESPONSE_MIN_BYTES,
        )
        self.requests = TcpDirection(self._request_frames, reassembly)
        self.requests.sink = _FirstBytes(self, self.requests, _client_first)
        self.responses = TcpDirection(self._response_frames, reassembly)
        self.responses.sink = _FirstBytes(self, self.responses, _server_first)
        self.midstream = False
        """Whether the capture began after the connection's SYN."""
        self.client_closed_first = False
        """Whether the client sent FIN or RST before the server did."""

    def __repr__(self) -> str:
        return f"<Connection {self.client} -> {self.server} ({self.kind or 'unknown'})>"

    def foreign(self, kind: str) -> None:
        """The connection carries TLS or something else: stop reading it."""
        if self.kind == KAFKA:
            return
        self.kind = kind
        self.requests.sink = _DISCARD
        self.responses.sink = _DISCARD

    def close(self) -> None:
        """The connection ended, or the capture did: flush what is left and report."""
        self.requests.close()
        self.responses.close()
        self._request_frames.end()
        self._response_frames.end()
        if self.client_closed_first:
            self.counts.abandoned += len(self.waiting)
        else:
            self.counts.unanswered += len(self.waiting)
        self.waiting.clear()
        self._listener.closed(self)

    # ---------------------------------------------------------------------- the two readers

    def request(self, frame: Frame) -> None:
        if self.kind is None and not self.midstream and not plausible_first_request(frame):
            self.foreign(NOT_KAFKA)
            return
        self.kind = KAFKA
        request = RequestSeen.read(frame)
        if request.problem is not None:
            self.counts.unread_requests += 1
        self._listener.request(self, request)
        if self.keep_frames:
            self._listener.frame(self, frame, request, False)
        if request.expects_response:
            waiting = self.waiting
            if len(waiting) >= MAX_WAITING:
                waiting.popitem(last=False)
                self.counts.waiting_dropped += 1
            waiting[request.correlation_id] = request
        else:
            self._acks0[request.correlation_id] = request
            if len(self._acks0) > ACKS0_REMEMBERED:
                self._acks0.popitem(last=False)

    def response(self, frame: Frame) -> None:
        cid = correlation_id(frame)
        request = self.waiting.get(cid)
        if request is None:
            request = self._acks0.pop(cid, None)
            if request is None:
                self.counts.unmatched_responses += 1
                return
        else:
            # Answers come in request order: whatever waited from before this one never will.
            waiting = self.waiting
            while True:
                first, _ = waiting.popitem(last=False)
                if first == cid:
                    break
                self.counts.unanswered += 1
        response = ResponseSeen.read(request, frame)
        if response.problem is not None:
            self.counts.unread_responses += 1
        self._listener.response(self, request, response, frame.ts)
        if self.keep_frames:
            self._listener.frame(self, frame, request, True)

    def response_wanted(self, head: bytes) -> bool:
        if len(head) < 8:
            return False
        request = self.waiting.get(INT32.unpack_from(head, 4)[0])
        return request is not None and (self.keep_frames or request.api_key in RESPONSE_BODIES)


class _Requests:
    __slots__ = ("_connection",)

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def wants_body(self, head: bytes) -> bool:
        if self._connection.keep_frames:
            return True
        return len(head) >= 8 and int.from_bytes(head[4:6], "big", signed=True) in REQUEST_BODIES

    def frame(self, frame: Frame) -> None:
        self._connection.request(frame)


class _Responses:
    __slots__ = ("_connection",)

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def wants_body(self, head: bytes) -> bool:
        return self._connection.response_wanted(head)

    def frame(self, frame: Frame) -> None:
        self._connection.response(frame)


class _FirstBytes:
    """A direction's sink until its first bytes were seen: there, before any frame is split,
    the connection may turn out not to be Kafka (`foreign` says what it is instead, or None).
    From then on the direction's bytes go straight to its frames."""

    __slots__ = ("_connection", "_direction", "_foreign", "_frames")

    def __init__(
        self,
        connection: Connection,
        direction: TcpDirection,
        foreign: Callable[[Connection, Buffer], str | None],
    ) -> None:
        self._connection = connection
        self._direction = direction
        self._frames = direction.sink
        self._foreign = foreign

    def data(self, chunk: Buffer, ts: float) -> None:
        self._direction.sink = self._frames
        kind = self._foreign(self._connection, chunk)
        if kind is not None:
            self._connection.foreign(kind)
            return
        self._frames.data(chunk, ts)

    def lost(self, size: int) -> None:
        self._direction.sink = self._frames
        self._frames.lost(size)


def _client_first(connection: Connection, chunk: Buffer) -> str | None:
    """TLS and HTTP are told apart from Kafka by the client's first bytes
    (kipside.protocol.sniff_foreign_protocol)."""
    what = sniff_foreign_protocol(bytes(chunk[:64]))
    if what is None:
        return None
    return TLS if what.startswith("a TLS") else NOT_KAFKA


def _server_first(connection: Connection, chunk: Buffer) -> str | None:
    """A Kafka broker never speaks first, so a server that does, on a connection whose start
    was captured, is not Kafka."""
    return NOT_KAFKA if connection.kind is None and not connection.midstream else None


class _RequestsOrTls(RequestBoundaries):
    """Request boundaries, unless the connection turns out to carry TLS records."""

    __slots__ = ("_connection",)

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def find(self, buf: bytearray, start: int) -> tuple[int | None, int]:
        connection = self._connection
        if connection.kind is None and tls_records(buf):
            connection.foreign(TLS)
            del buf[:]
            return None, 0
        return super().find(buf, start)
