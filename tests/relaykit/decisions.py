"""What a relay filter sees and what it decides, per connection and per request.

A filter (a subclass of relaykit.base.Relay) gets each client connection as a `Conn` and each
request as a `Request`, and answers `on_request` with a Decision: `FORWARD` (or `Forward(frame)`
with a rewritten request), `Answer(frame)` from the relay itself, `DROP` or `CLOSE`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from kipside.protocol.headers import RequestHeader

__all__ = [
    "CLOSE",
    "DROP",
    "FORWARD",
    "Answer",
    "Close",
    "Conn",
    "Decision",
    "Drop",
    "Forward",
    "Request",
]


@dataclass(frozen=True, slots=True)
class Conn:
    """One client connection the relay carries."""

    number: int  # 1, 2, ... in accepting order
    opened_at: float  # time.monotonic()


@dataclass(frozen=True, slots=True)
class Request:
    """A request as the client sent it: its parsed header and its frame (size prefix included)."""

    header: RequestHeader
    frame: bytes
    due: float = 0.0
    """When (trio clock) it reached the simulated broker: when the relay read it, plus the
    delay (or when a hold released it), whenever the relay's task got to it."""


@dataclass(frozen=True, slots=True)
class Forward:
    """Send the request to the broker: `frame` (a rewritten request) or, if None, as received.

    The broker's answer is matched by the correlation id of the frame sent; on_response gets
    the client's request and returns what the client is to see."""

    frame: bytes | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer the client from the relay; written after every response still owed before it."""

    frame: bytes


@dataclass(frozen=True, slots=True)
class Drop:
    """Swallow the request: the broker never sees it and the client gets no answer."""


@dataclass(frozen=True, slots=True)
class Close:
    """End the connection once the answers owed before this request are written, as a broker
    does with a request it refuses (an unauthenticated request on a SASL listener)."""


FORWARD: Final = Forward()
DROP: Final = Drop()
CLOSE: Final = Close()
Decision = Forward | Answer | Drop | Close
