"""A client connection's two timeouts, watched by one task: idle, and request read.

- **Idle** (`limits.idle_timeout_ms`, Apache Kafka's `connections.max.idle.ms`): nothing was
  read from the client and nothing written to it for that long, and it is owed no answer.
- **Request read** (`limits.request_read_timeout_ms`, against slow senders, "slowloris"): a
  request whose first bytes arrived that long ago is still not whole. The clock stops while
  kipside itself is not reading the client (an in-flight limit), and starts again when it reads.

Sans-I/O: the driver stamps times (one clock read per read from the socket), sleeps until
`next_deadline()` and then asks `expired(now)`. Both timeouts are read from the rules in force
at each decision, so a reload applies at the next one (the driver asks again at once). This
module never closes anything itself: it says which limit expired and after how long.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

from kipside.rules import Limits

__all__ = ["IDLE", "REQUEST_READ", "Deadlines"]

IDLE: Final = "idle_timeout_ms"
REQUEST_READ: Final = "request_read_timeout_ms"


class Deadlines:
    """The idle and request-read deadlines of one client connection."""

    __slots__ = ("_busy", "_limits", "frame_started", "last_active", "partial_bytes")

    def __init__(self, limits: Callable[[], Limits], busy: Callable[[], bool], now: float):
        """`busy()`: whether the client is owed something (it is then not idle)."""
        self._limits = limits
        self._busy = busy
        self.last_active = now
        """Time of the last read from or write to the client."""
        self.frame_started: float | None = None
        """Time the unfinished request began; None when no request is half read."""
        self.partial_bytes = 0

    def read(self, now: float, partial_bytes: int, completed: bool) -> bool:
        """After a read from the socket and every whole request in it: `partial_bytes` of the
        next request are in hand; `completed`: at least one request was whole. True when a
        request's clock started (the next deadline may be sooner)."""
        self.last_active = now
        self.partial_bytes = partial_bytes
        if not partial_bytes:
            self.frame_started = None
        elif completed or self.frame_started is None:
            self.frame_started = now
            return True
        return False

    def wrote(self, now: float) -> None:
        """An answer went to the client."""
        self.last_active = now

    def pause(self) -> None:
        """kipside stops reading the client: an unfinished request is not the client's fault."""
        self.frame_started = None

    def resume(self, now: float, partial_bytes: int) -> None:
        """kipside reads the client again; an unfinished request's clock starts now."""
        if partial_bytes:
            self.read(now, partial_bytes, completed=True)

    def next_deadline(self) -> float:
        """When a timeout may have passed (math.inf: none is set); ask `expired` then."""
        limits = self._limits()
        deadline = math.inf
        if limits.idle_timeout_ms:
            deadline = self.last_active + limits.idle_timeout_ms / 1000
        if limits.request_read_timeout_ms and self.frame_started is not None:
            deadline = min(deadline, self.frame_started + limits.request_read_timeout_ms / 1000)
        return deadline

    def expired(self, now: float) -> tuple[str, float] | None:
        """The limit that expired and how long it lasted, if one did."""
        limits = self._limits()
        read_timeout = limits.request_read_timeout_ms / 1000
        started = self.frame_started
        if read_timeout and started is not None and now >= started + read_timeout:
            return REQUEST_READ, now - started
        idle = limits.idle_timeout_ms / 1000
        if idle and now >= self.last_active + idle:
            if self._busy():
                # Waiting for its answers is not idle: count from now.
                self.last_active = now
                return None
            return IDLE, now - self.last_active
        return None
