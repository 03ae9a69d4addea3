"""A client connection's two timeouts, watched by one task: idle, and request read.

- **Idle** (`limits.idle_timeout_ms`, Apache Kafka's `connections.max.idle.ms`): nothing was
  read from the client and nothing written to it for that long, and it is owed no answer.
- **Request read** (`limits.request_read_timeout_ms`, against slow senders, "slowloris"): a
  request whose first bytes arrived that long ago is still not whole. The clock stops while
  kipside itself is not reading the client (an in-flight limit), and starts again when it reads.

The reader only stamps times, one clock read per read from the socket; the watcher sleeps
until the nearer deadline, then decides. Both timeouts are read from the rules in force at
each decision, so a reload applies at the next one (`reconsider` makes it now). This module
never closes anything itself: it calls `expire` with the limit's key and what happened.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

import trio

from kipside.rules import Limits

__all__ = ["IDLE", "REQUEST_READ", "Deadlines"]

IDLE: Final = "idle_timeout_ms"
REQUEST_READ: Final = "request_read_timeout_ms"

Expire = Callable[[str, float, int], None]
"""(limit key, seconds it lasted, bytes of the unfinished request) -> None."""


class Deadlines:
    """The idle and request-read deadlines of one client connection."""

    __slots__ = (
        "_busy",
        "_expire",
        "_limits",
        "_scope",
        "frame_started",
        "last_active",
        "partial_bytes",
    )

    def __init__(self, limits: Callable[[], Limits], busy: Callable[[], bool], expire: Expire):
        """`busy()`: whether the client is owed something (it is then not idle)."""
        self._limits = limits
        self._busy = busy
        self._expire = expire
        self._scope: trio.CancelScope | None = None
        self.last_active = -math.inf
        """trio time of the last read from or write to the client (set when watch starts)."""
        self.frame_started: float | None = None
        """trio time the unfinished request began; None when no request is half read."""
        self.partial_bytes = 0

    def read(self, partial_bytes: int, completed: bool) -> None:
        """After a read from the socket and every whole request in it: `partial_bytes` of the
        next request are in hand; `completed`: at least one request was whole."""
        now = trio.current_time()
        self.last_active = now
        self.partial_bytes = partial_bytes
        if not partial_bytes:
            self.frame_started = None
        elif completed or self.frame_started is None:
            self.frame_started = now
            self._wake_by(self._limits().request_read_timeout_ms, now)

    def wrote(self) -> None:
        """An answer went to the client."""
        self.last_active = trio.current_time()

    def pause(self) -> None:
        """kipside stops reading the client: an unfinished request is not the client's fault."""
        self.frame_started = None

    def resume(self, partial_bytes: int) -> None:
        """kipside reads the client again; an unfinished request's clock starts now."""
        if partial_bytes:
            self.read(partial_bytes, completed=True)

    def reconsider(self) -> None:
        """The timeouts may have changed (a rule reload): decide again now."""
        if self._scope is not None:
            self._scope.cancel()

    def _wake_by(self, timeout_ms: int, now: float) -> None:
        scope = self._scope
        if scope is not None and timeout_ms and now + timeout_ms / 1000 < scope.deadline:
            scope.deadline = now + timeout_ms / 1000

    def _next_deadline(self) -> float:
        limits = self._limits()
        deadline = math.inf
        if limits.idle_timeout_ms:
            deadline = self.last_active + limits.idle_timeout_ms / 1000
        if limits.request_read_timeout_ms and self.frame_started is not None:
            deadline = min(deadline, self.frame_started + limits.request_read_timeout_ms / 1000)
        return deadline

    def _expired(self) -> tuple[str, float] | None:
        limits = self._limits()
        now = trio.current_time()
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

    async def watch(self) -> None:
        """Run for the connection's life; returns after calling `expire`."""
        self.last_active = trio.current_time()
        while True:
            with trio.CancelScope(deadline=self._next_deadline()) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None
            expired = self._expired()
            if expired is not None:
                self._expire(*expired, self.partial_bytes)
                return
