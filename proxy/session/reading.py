"""A session's reader and its clocks: the client's socket into core.ClientSide, each request to
the session, the in-flight pause, and the idle and request-read deadlines.

Before each request it checks what the client makes kipside hold (core.limits): past an
in-flight limit it takes no more requests until that drops, as a broker mutes a connection; the
client's socket buffer fills and TCP pushes back. Before each request, not each read: one read
can hold thousands of small requests. A client that broke the protocol or a cap is logged in
one line here; the caller closes the connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import trio

from kipside.protocol import (
    FrameError,
    FrameTooLargeError,
    LimitExceeded,
    ProtocolError,
    RequestHeader,
)
from kipside.proxy.core.client_side import ClientSide
from kipside.proxy.core.limits import IN_FLIGHT, ClientLimits
from kipside.proxy.security.client_sasl import ClientSasl
from kipside.proxy.transport.wire import Wire

__all__ = ["Reader", "Room", "read_requests", "watch_deadlines"]

log = logging.getLogger("kipside.session")


class Reader(Protocol):
    """The session, as its reader sees it."""

    sasl: ClientSasl

    def describe(self) -> str: ...

    async def handle(self, header: RequestHeader | None, frame: bytes, now: float) -> None:
        """A request (header None: a legacy SASL token, which has no header) read at `now`."""


async def read_requests(session: Reader, side: ClientSide, wire: Wire, room: Room) -> bool:
    """Read and hand on requests until the client closes (True) or breaks the protocol or a
    cap (ProtocolError, logged). Cancelled when the session drains or ends."""
    limits = room.limits
    while True:
        data = await wire.receive()
        if not data:
            return True
        side.receive_data(data)
        now = trio.current_time()
        while True:
            frame = None
            try:
                if limits.over() is not None:
                    await room.requests(side)
                frame = side.next_frame(raw_token_due=session.sasl.raw_token_due)
                if frame is None:
                    break
                raw = session.sasl.raw_token_due
                await session.handle(None if raw else side.header(frame), frame, now)
            except (FrameTooLargeError, LimitExceeded) as exc:
                limits.refused(exc, frame if isinstance(exc, LimitExceeded) else None)
                raise
            except ProtocolError as exc:
                kind = "not Kafka" if isinstance(exc, FrameError) else "a malformed request"
                log.warning("%s sent %s: %s; closing the connection", session.describe(), kind, exc)
                raise
        # Every whole request is taken: what is left starts (or continues) the next one,
        # which must be whole within limits.request_read_timeout_ms.
        limits.read(now, side.buffered)


class Room:
    """Where a client's reader and its own connection's reader wait for what the client holds
    to drop (core.limits calls `wake` through `on_room`)."""

    __slots__ = ("_event", "limits")

    def __init__(self, limits: ClientLimits) -> None:
        self.limits = limits
        self._event: trio.Event | None = None
        limits.on_room = self.wake

    def wake(self) -> None:
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def requests(self, side: ClientSide) -> None:
        """Return once kipside may read more of this client's requests."""
        limits = self.limits
        reason = limits.over()
        if reason is None:
            return
        limits.pausing(reason)
        try:
            await self._until(limits.over)
        finally:
            limits.resuming(trio.current_time(), side.buffered)

    async def answers(self) -> None:
        """Return once kipside may read more answers for this client from its own broker
        connection: while the client's socket has not taken the answers written to it (their
        bytes alone are over a limit), the broker's answers stay in the broker's socket. Only
        those count: unanswered requests, or answers waiting behind an earlier one, might wait
        for this very connection's next answer, and waiting on them would never end."""
        limits = self.limits
        if limits.over(limits.backlog) is None:
            await trio.lowlevel.checkpoint()
            return
        await self._until(lambda: limits.over(limits.backlog))

    async def _until(self, over: Callable[[], str | None]) -> None:
        limits = self.limits
        while (reason := over()) is not None and not limits.closed:
            if self._event is None:
                self._event = trio.Event()
            on_total = reason == IN_FLIGHT
            limits.wait(on_total, True)
            try:
                await self._event.wait()
            finally:
                limits.wait(on_total, False)


async def watch_deadlines(limits: ClientLimits) -> None:
    """The client's idle and request-read deadlines (core.deadlines): sleep until the nearer
    one, then ask; a reload asks again at once, a request starting to arrive brings the sleep's
    end nearer. Returns once one expired (reported)."""
    deadlines = limits.deadlines
    while True:
        changed = trio.Event()
        limits.on_recheck = changed.set
        with trio.move_on_at(deadlines.next_deadline()) as scope:

            def sooner(scope: trio.CancelScope = scope) -> None:
                scope.deadline = min(scope.deadline, deadlines.next_deadline())

            limits.on_deadline_sooner = sooner
            await changed.wait()
        expired = deadlines.expired(trio.current_time())
        if expired is not None:
            limits.expired(*expired)
            return
