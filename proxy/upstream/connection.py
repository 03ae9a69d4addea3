"""One connection to an upstream broker, shared by any number of requesters.

Requests are written at once by the requesting task (proxy.wire: synchronous, ordered, whole),
each under a correlation id this connection assigns, and answered in order by a reader task; a
`Pending` carries each answer back to whoever asked, under the requester's own correlation id.
Used both for a client's own (dedicated) upstream connection and for the shared "lanes". The
broker serves one request at a time per connection, so everything written here is answered in
write order; a correlation id out of order means the
connection can't be trusted and it is closed. When the connection ends, every pending request
fails with the reason; nothing is retried here (retrying is the client's decision).

A shared connection (a lane) has an answer timeout, as a client has request.timeout.ms: when the
broker leaves the oldest request unanswered for longer (or for longer than a ProduceRequest's
own timeout_ms, which the broker may use up), the connection is closed and what was in flight
fails. A silent broker (a network partition, a hung process) otherwise holds every request queued
behind it for ever, and every client of the lane with it. A client's own connection has none:
the client times its requests out itself and kipside closes that connection with the client's.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

import trio

from kipside.protocol import (
    Address,
    ApiKey,
    Buffer,
    FrameDecoder,
    FrameTooLargeError,
    ProtocolError,
    api_name,
    request_correlation_id,
    response_correlation_id,
    with_request_correlation_id,
    with_response_correlation_id,
)
from kipside.proxy.core.answers import Pending, UpstreamFailed
from kipside.proxy.transport.dial import Dial, plain_dial
from kipside.proxy.transport.wire import BACKLOG_LIMIT_BYTES, Wire, WireBroken

log = logging.getLogger("kipside.upstream")

DEFAULT_ANSWER_TIMEOUT_SECONDS: Final = 30.0
"""A shared connection's answer timeout unless configured (--upstream-request-timeout): Apache
Kafka clients' request.timeout.ms default."""

ReportLimit = Callable[[str, str], None]
"""(limit key, message): network.limits.LimitReporter.reached, counted and logged."""


async def answer_of(pending: Pending) -> bytes:
    """Wait for `pending` in trio; its frame, or UpstreamFailed."""
    if not pending.done:
        done = trio.Event()
        pending.on_done(done.set)
        await done.wait()
    else:
        await trio.lowlevel.checkpoint()
    return pending.result()


@dataclass(slots=True)
class _InFlight:
    upstream_correlation_id: int
    client_correlation_id: int
    api_key: int
    api_version: int
    pending: Pending
    raw: bool = False  # a legacy SASL token: its answer is a raw frame with no correlation id
    allowance: float = 0.0  # seconds the broker may take by the request's own terms


class UpstreamConnection:
    """A connection to one broker, safe to share between tasks."""

    def __init__(
        self,
        address: Address,
        *,
        name: str,
        max_frame_bytes: int,
        on_closed: Callable[[UpstreamConnection, str], None] | None = None,
        report: ReportLimit | None = None,
        gate: Callable[[], Awaitable[None]] | None = None,
        answer_timeout: float | None = None,
    ) -> None:
        self.address = address
        self.answer_timeout = answer_timeout
        """Seconds the oldest request may wait for its answer before the connection is closed
        (None: no limit; see the module docstring)."""
        self._report = report
        self._gate = gate
        """Waited on before each read from the broker: a client's own connection is not read
        while the client has not taken its answers (network.limits)."""
        self.name = name
        self.max_frame_bytes = max_frame_bytes
        self._on_closed = on_closed
        self._wire: Wire | None = None
        self._in_flight: deque[_InFlight] = deque()
        # Correlation ids of requests sent expecting no answer (acks=0 produce). Apache Kafka
        # never answers them, but some brokers (Tansu) do; such an answer is dropped, not taken
        # for a protocol violation.
        self._unanswered: deque[int] = deque(maxlen=1024)
        self._next_correlation_id = 0
        self.closed = False
        self._closed_event = trio.Event()
        self.close_reason: str | None = None
        """Why the connection closed; None while it is open."""
        self.shut_down = False
        """Whether it closed because kipside is shutting down (its reader was cancelled)."""
        self.requests_sent = 0
        self._decoder = FrameDecoder(
            max_frame_bytes=max_frame_bytes, min_frame_bytes=4, from_server=True
        )
        self._raw_in_flight = 0

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def last_in_flight(self) -> Pending | None:
        """The answer to the newest request still in flight; None if nothing is. A broker
        answers a connection in order, so once it is done every earlier request is too."""
        return self._in_flight[-1].pending if self._in_flight else None

    @property
    def backlog_bytes(self) -> int:
        """Bytes written but not yet taken by the kernel (the broker is not reading)."""
        return self._wire.backlog_bytes if self._wire is not None else 0

    @classmethod
    async def open(
        cls,
        address: Address,
        nursery: trio.Nursery,
        *,
        name: str,
        max_frame_bytes: int,
        on_closed: Callable[[UpstreamConnection, str], None] | None = None,
        connect_timeout: float = 10.0,
        dial: Dial = plain_dial,
        report: ReportLimit | None = None,
        gate: Callable[[], Awaitable[None]] | None = None,
        answer_timeout: float | None = None,
    ) -> UpstreamConnection:
        """Dial `address` (with `dial`) and start the connection's reader and flusher in
        nursery.

        Raises UpstreamFailed ("HOST:PORT: why") if the broker can't be reached within
        connect_timeout.
        """
        connection = cls(
            address,
            name=name,
            max_frame_bytes=max_frame_bytes,
            on_closed=on_closed,
            report=report,
            gate=gate,
            answer_timeout=answer_timeout,
        )
        try:
            with trio.fail_after(connect_timeout):
                wire = await dial(address)
        except (OSError, trio.TooSlowError) as exc:
            raise UpstreamFailed(f"{address}: {exc or 'timed out'}") from exc
        wire.on_broken(lambda reason: connection._close(f"{name}: {reason}"))
        connection._wire = wire
        nursery.start_soon(connection._read_responses, wire)
        nursery.start_soon(wire.run_flusher)
        if answer_timeout is not None:
            nursery.start_soon(connection._watch_answers)
        return connection

    async def _watch_answers(self) -> None:
        """Close the connection once its oldest request has waited longer than the answer
        timeout (or its own allowance). The broker answers in order, so the same request at the
        head for that long means the broker has answered nothing meanwhile. Checked every
        quarter of the timeout: no clock is read per request."""
        timeout = self.answer_timeout
        assert timeout is not None
        tick = max(timeout / 4, 0.01)
        head: _InFlight | None = None
        since = 0.0
        while not self.closed:
            with trio.move_on_after(tick):
                await self._closed_event.wait()
            oldest = self._in_flight[0] if self._in_flight else None
            now = trio.current_time()
            if oldest is None or oldest is not head:
                head, since = oldest, now
                continue
            waited = max(timeout, oldest.allowance)
            if now - since >= waited:
                self._close(
                    f"{self.name}: no answer to {api_name(oldest.api_key)} "
                    f"v{oldest.api_version} within {waited:g} s (the upstream answer timeout)"
                )

    def _take_correlation_id(self) -> int:
        correlation_id = self._next_correlation_id
        self._next_correlation_id = (correlation_id + 1) & 0x7FFFFFFF
        return correlation_id

    def send_nowait(
        self,
        frame: bytes,
        api_key: int,
        api_version: int,
        *,
        expects_response: bool = True,
        chunks: Sequence[Buffer] | None = None,
        allowance: float = 0.0,
    ) -> Pending | None:
        """Send a request frame now; its answer comes back under the frame's own correlation id.

        With `chunks`, `frame` is only the frame's head (size prefix and request header) and
        the chunks are the rest, written in one call without being joined. Returns None when
        no response is expected (acks=0 produce). `allowance`: seconds the broker may take to
        answer by the request's own terms (a ProduceRequest's timeout_ms), if more than the
        answer timeout. Raises UpstreamFailed if the connection is closed or breaks.
        """
        wire = self._wire
        if self.closed or wire is None:
            raise UpstreamFailed(self.close_reason or f"{self.name} is not connected")
        client_correlation_id = request_correlation_id(frame)
        upstream_correlation_id = self._take_correlation_id()
        pending = None
        if not expects_response:
            self._unanswered.append(upstream_correlation_id)
        else:
            pending = Pending()
            self._in_flight.append(
                _InFlight(
                    upstream_correlation_id,
                    client_correlation_id,
                    api_key,
                    api_version,
                    pending,
                    allowance=allowance,
                )
            )
        if upstream_correlation_id != client_correlation_id:
            frame = with_request_correlation_id(frame, upstream_correlation_id)
        try:
            wire.write((frame,) if chunks is None else (frame, *chunks))
        except WireBroken as exc:
            raise UpstreamFailed(self.close_reason or str(exc)) from exc
        self.requests_sent += 1
        return pending

    def send_raw_nowait(self, frame: bytes) -> Pending:
        """Send a legacy SASL token frame (after SaslHandshake v0) as it is; its answer is the
        broker's next frame, also raw. Raises UpstreamFailed if the connection is closed."""
        wire = self._wire
        if self.closed or wire is None:
            raise UpstreamFailed(self.close_reason or f"{self.name} is not connected")
        pending = Pending()
        self._in_flight.append(_InFlight(-1, -1, ApiKey.SASL_AUTHENTICATE, 0, pending, raw=True))
        self._raw_in_flight += 1
        self._decoder.min_frame_bytes = 0  # PLAIN's answer is an empty frame
        try:
            wire.write((frame,))
        except WireBroken as exc:
            raise UpstreamFailed(self.close_reason or str(exc)) from exc
        return pending

    async def send(
        self, frame: bytes, api_key: int, api_version: int, *, expects_response: bool = True
    ) -> Pending | None:
        """send_nowait, then wait while the broker is not reading what was sent (backpressure)."""
        pending = self.send_nowait(frame, api_key, api_version, expects_response=expects_response)
        if self._wire is not None and self._wire.backlog_bytes > BACKLOG_LIMIT_BYTES:
            await self._wire.drained()
        return pending

    async def _read_responses(self, wire: Wire) -> None:
        decoder = self._decoder
        reason = f"{self.name}: broker closed the connection"
        gate = self._gate
        try:
            while True:
                if gate is not None:
                    await gate()
                data = await wire.receive()
                if not data:
                    if wire.broken_reason is not None:
                        reason = f"{self.name}: {wire.broken_reason}"
                    return
                decoder.receive_data(data)
                while (frame := decoder.next_frame()) is not None:
                    if not self._deliver(frame):
                        reason = f"{self.name}: unexpected response correlation id"
                        return
        except FrameTooLargeError as exc:
            reason = f"{self.name}: broker sent a response over limits.max_frame_bytes"
            self._frame_too_large(exc)
        except ProtocolError as exc:
            reason = f"{self.name}: broker sent bytes that are not Kafka: {exc}"
        except trio.Cancelled:  # the server is shutting down
            self.shut_down = True
            reason = f"{self.name}: closed by kipside"
            raise
        finally:
            self._close(reason)

    def _frame_too_large(self, exc: FrameTooLargeError) -> None:
        waiting = self._in_flight[0] if self._in_flight else None
        to = f" to {api_name(waiting.api_key)} v{waiting.api_version}" if waiting else ""
        message = (
            f"{self.name}: the broker sent a response{to} of {exc.size} bytes, over "
            f"limits.max_frame_bytes ({exc.cap}): closing the connection (the requests in "
            "flight on it fail and their clients retry, and would meet it again). Raise "
            "limits.max_frame_bytes above the largest answer the brokers send: a Fetch answer "
            "reaches the consumer's fetch.max.bytes (50 MiB by default) and more"
        )
        if self._report is not None:
            self._report("max_frame_bytes", message)
        else:
            log.warning("%s", message)

    def _deliver(self, frame: bytes) -> bool:
        if self._raw_in_flight and self._in_flight[0].raw:
            self._raw_in_flight -= 1
            if not self._raw_in_flight:
                self._decoder.min_frame_bytes = 4
            self._in_flight.popleft().pending.resolve(frame)
            return True
        correlation_id = response_correlation_id(frame)
        if not self._in_flight or self._in_flight[0].upstream_correlation_id != correlation_id:
            if correlation_id in self._unanswered:
                self._unanswered.remove(correlation_id)
                return True
            expected = self._in_flight[0] if self._in_flight else None
            log.error(
                "%s answered correlation id %d, expected %s; closing the connection",
                self.name,
                correlation_id,
                f"{expected.upstream_correlation_id} ({api_name(expected.api_key)})"
                if expected
                else "nothing",
            )
            return False
        entry = self._in_flight.popleft()
        if entry.client_correlation_id != correlation_id:
            frame = with_response_correlation_id(frame, entry.client_correlation_id)
        entry.pending.resolve(frame)
        return True

    def _close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self._closed_event.set()
        self.close_reason = reason
        if self._wire is not None:
            self._wire.close()
        while self._in_flight:
            self._in_flight.popleft().pending.fail(reason)
        if self._on_closed is not None:
            self._on_closed(self, reason)

    async def aclose(self) -> None:
        self._close(f"{self.name}: closed by kipside")

    async def close_after_pending(self, grace_seconds: float) -> None:
        """Half-close, let the broker finish and close its side, then close; bounded.

        A plain close with answers still unread makes the kernel reset the connection, and a
        broker drops requests it had not processed yet: acks=0 produce would be lost.
        """
        if self.closed or self._wire is None:
            return
        with trio.move_on_after(grace_seconds, shield=True):
            await self._wire.send_eof()
            await self._closed_event.wait()
        self._close(f"{self.name}: closed by kipside")
