"""One client connection as kipside serves it, sans-I/O: frames in, requests out, answers out in
request order.

A Kafka client requires its answers in the order of its requests on a connection, however
they are produced: by the broker on the client's own connection, on a shared lane, by kipside
itself, later by a background task. `ClientSide` keeps one `Slot` per request that expects an
answer, in request order, and gives back (`ready`) every answered slot at the head, stopping
at the first not answered yet: one slow answer holds the later ones exactly as a broker
connection would. A `Marker` ends the answers owed at a point (the client drained, refused,
its own broker connection gone).

What the client makes kipside hold is counted as it goes (core.limits.ClientLimits): a
request's bytes from when it is read, an answer's from when it arrives, both until written.

Like h11's Connection, it never does I/O: the driver (session.session) feeds it the bytes it
reads, writes what it gives back, and says when it wrote.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from kipside.protocol import (
    FrameDecoder,
    RequestHeader,
    parse_request_header,
)
from kipside.proxy.core.answers import Pending
from kipside.proxy.core.limits import ClientLimits

__all__ = ["DRAINED", "REFUSED", "UPSTREAM_GONE", "ClientSide", "Marker", "Slot"]

RAW_TOKEN_CORRELATION_ID: Final = -1
"""A raw SASL token has no Kafka header: kipside's answer to it is owed under this id."""


@dataclass(slots=True, eq=False)
class Slot:
    """An answer the client is owed, in request order."""

    api_key: int
    api_version: int
    correlation_id: int
    pending: Pending
    raw: bool
    """A broker's answer, which still needs kipside's rewrites; kipside's own need none."""
    started: float
    """When the request was read (the driver's clock): its latency is counted from then."""
    span: object
    """The request's trace span (the driver's), finished when the answer is written."""
    merge: Callable[[bytes], bytes] | None = None
    """Turns the broker's answer to a narrowed request into the client's (refused partitions
    added), before any rewrite."""
    request_bytes: int = 0
    """Bytes of the request, held (core.limits) until the answer is written."""
    answer_bytes: int = 0
    """Bytes of the answer as it came, held from then until it is written."""


@dataclass(frozen=True, slots=True)
class Marker:
    """A point in the owed answers after which none will be given."""

    reason: str


UPSTREAM_GONE: Final = Marker("upstream gone")
"""The client's own broker connection ended: nothing after this point can be answered."""
DRAINED: Final = Marker("drained")
"""kipside is shutting down: no request was read after this point; close once answered."""
REFUSED: Final = Marker("refused")
"""kipside refused the client: close once the answers before this point are written."""


class ClientSide:
    """The answers one client connection is owed, and its requests as they arrive."""

    __slots__ = ("_decoder", "_on_ready", "_owed", "client_id", "limits")

    def __init__(
        self, limits: ClientLimits, *, max_frame_bytes: int, on_ready: Callable[[], None]
    ) -> None:
        """`on_ready`: called whenever the head of the owed answers may have become ready (the
        driver then takes them with `ready`)."""
        self.limits = limits
        self._decoder = FrameDecoder(max_frame_bytes=max_frame_bytes, min_frame_bytes=8)
        self._owed: deque[Slot | Marker] = deque()
        self._on_ready = on_ready
        self.client_id: str | None = None
        """The client.id of the first request that named one."""

    # Requests ---------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Bytes read from the client."""
        self._decoder.receive_data(data)

    @property
    def buffered(self) -> int:
        """Bytes of a request not yet whole."""
        return self._decoder.buffered

    def next_frame(self, *, raw_token_due: bool = False) -> bytes | None:
        """The next whole frame: a request, or a raw SASL token when one is due (such a frame
        has no Kafka header); None until more bytes arrive. Raises kipside.protocol's
        FrameError (FrameTooLargeError, NotKafkaError) when the bytes can't be Kafka: the
        connection must then be closed."""
        decoder = self._decoder
        if raw_token_due:
            decoder.min_frame_bytes = 0
            frame = decoder.next_frame()
            decoder.min_frame_bytes = 8
            return frame
        return decoder.next_frame()

    def header(self, frame: bytes) -> RequestHeader:
        """A request frame's header (DecodeError, LimitExceeded if it breaks the protocol or
        the decode caps)."""
        header = parse_request_header(frame, self.limits.decode)
        if header.client_id and self.client_id is None:
            self.client_id = header.client_id
        return header

    # Answers ----------------------------------------------------------------------------

    def owe(self, slot: Slot) -> Slot:
        """Owe the client `slot`'s answer after every one owed before it."""
        self._owed.append(slot)
        slot.pending.on_done(lambda: self._arrived(slot))
        return slot

    def end(self, marker: Marker) -> None:
        """No answer will be owed after this point."""
        self._owed.append(marker)
        self._on_ready()

    def _arrived(self, slot: Slot) -> None:
        frame = slot.pending.frame
        if frame is not None:
            slot.answer_bytes = len(frame)
            self.limits.arrived(len(frame))
        self._on_ready()

    def ready(self) -> tuple[list[Slot], Marker | None]:
        """Every slot answered (or failed) at the head, in order, taken off; and the marker
        that stopped them, if one did (it is taken off too)."""
        owed = self._owed
        taken: list[Slot] = []
        while owed:
            head = owed[0]
            if isinstance(head, Marker):
                owed.popleft()
                return taken, head
            if not head.pending.done:
                break
            owed.popleft()
            taken.append(head)
        return taken, None

    @property
    def owed(self) -> int:
        """Answers still owed (markers not counted)."""
        return sum(1 for slot in self._owed if isinstance(slot, Slot))

    def forget(self) -> list[Slot]:
        """The client is gone: every answer owed is dropped (returned, for their spans)."""
        dropped = [slot for slot in self._owed if isinstance(slot, Slot)]
        self._owed.clear()
        return dropped
