"""The trio driver of one broker connection: protocol.ClientConnection's bytes on a Wire.

The sans-I/O ClientConnection decides (correlation ids, answers in request order, the answer
deadline); this driver writes what it gives, reads what the broker sends, and keeps time. Any
task may send (writes are synchronous and whole: transport.wire); a `Pending` carries each
answer back to whoever asked, in the task that reads it. Used for a client's own connection and
for the shared lanes alike.

Every connection has an answer timeout, as a client has request.timeout.ms: when the broker
leaves the oldest request unanswered for longer (or longer than the request's own allowance: a
ProduceRequest's timeout_ms, a Fetch's max_wait_ms, a JoinGroup's rebalance timeout), the
connection is closed and what was in flight fails. A silent broker (a network partition, a hung
process) otherwise holds every request behind it for ever. Nothing is retried here: retrying is
the client's decision.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import trio

from kipside.protocol import (
    Address,
    ApiKey,
    Buffer,
    ClientConnection,
    FrameTooLargeError,
    ProtocolError,
    api_name,
)
from kipside.proxy.core.answers import Pending, UpstreamFailed
from kipside.proxy.core.limits import ReportLimit, answer_too_large
from kipside.proxy.transport.dial import Dial, plain_dial
from kipside.proxy.transport.wire import BACKLOG_LIMIT_BYTES, Wire, WireBroken

log = logging.getLogger("kipside.upstream")

DEFAULT_ANSWER_TIMEOUT_SECONDS: Final = 30.0
"""The answer timeout unless configured (--upstream-request-timeout): Apache Kafka clients'
request.timeout.ms default."""


class UpstreamConnection:
    """A connection to one broker, safe to share between tasks."""

    def __init__(
        self,
        address: Address,
        *,
        name: str,
        max_frame_bytes: int,
        answer_timeout: float = DEFAULT_ANSWER_TIMEOUT_SECONDS,
        keep_correlation_ids: bool = False,
        on_closed: Callable[[UpstreamConnection, str], None] | None = None,
        report: ReportLimit | None = None,
        gate: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`gate`: waited on before each read from the broker (a client's own connection is
        not read while the client has not taken its answers: core.limits)."""
        self.address = address
        self.name = name
        self.protocol = ClientConnection(
            "kipside",
            max_frame_bytes=max_frame_bytes,
            answer_timeout=answer_timeout,
            keep_correlation_ids=keep_correlation_ids,
        )
        self._on_closed = on_closed
        self._report = report
        self._gate = gate
        self._wire: Wire | None = None
        self._watcher = trio.CancelScope()
        self._closed_event = trio.Event()
        self.closed = False
        self.close_reason: str | None = None
        """Why the connection closed; None while it is open."""
        self.shut_down = False
        """Whether it closed because kipside is shutting down (its reader was cancelled)."""
        self.requests_sent = 0

    @classmethod
    async def open(
        cls,
        address: Address,
        nursery: trio.Nursery,
        *,
        connect_timeout: float = 10.0,
        dial: Dial = plain_dial,
        **settings: object,
    ) -> UpstreamConnection:
        """Dial `address` and start the connection's reader, flusher and deadline in `nursery`
        (`settings`: the constructor's). Raises UpstreamFailed ("HOST:PORT: why") if the
        broker can't be reached within connect_timeout."""
        connection = cls(address, **settings)  # type: ignore[arg-type]
        try:
            with trio.fail_after(connect_timeout):
                wire = await dial(address)
        except (OSError, trio.TooSlowError) as exc:
            raise UpstreamFailed(f"{address}: {str(exc) or 'timed out'}") from exc
        wire.on_broken(lambda reason: connection._close(f"{connection.name}: {reason}"))
        connection._wire = wire
        nursery.start_soon(connection._read_responses, wire)
        nursery.start_soon(wire.run_flusher)
        nursery.start_soon(connection._watch_deadline)
        return connection

    @property
    def in_flight(self) -> int:
        return self.protocol.waiting

    def last_in_flight(self) -> Pending | None:
        """The answer to the newest request still in flight; once it is done, every earlier
        one is too (a broker answers a connection in order)."""
        newest = self.protocol.newest()
        return None if newest is None else newest.tag  # type: ignore[return-value]

    @property
    def backlog_bytes(self) -> int:
        """Bytes written but not yet taken by the kernel (the broker is not reading)."""
        return self._wire.backlog_bytes if self._wire is not None else 0

    # Sending ----------------------------------------------------------------------------

    def send_nowait(
        self,
        frame: bytes,
        api_key: int,
        api_version: int,
        *,
        expects_response: bool = True,
        chunks: Sequence[Buffer] | None = None,
        allowance: float = 0.0,
        now: float | None = None,
    ) -> Pending | None:
        """Send a request frame now; its answer comes back under the frame's own correlation
        id. With `chunks`, `frame` is only the frame's head (size prefix and request header)
        and the chunks are the rest, written in one call without being joined. None when no
        response is expected (acks=0). Raises UpstreamFailed if the connection is closed or
        breaks."""
        wire = self._wire
        if self.closed or wire is None:
            raise UpstreamFailed(self.close_reason or f"{self.name} is not connected")
        pending = Pending() if expects_response else None
        frame = self.protocol.send_frame(
            frame,
            api_key,
            api_version,
            expects_response=expects_response,
            tag=pending,
            now=trio.current_time() if now is None else now,
            allowance=allowance,
        )
        self._write((frame,) if chunks is None else (frame, *chunks))
        return pending

    def barrier_nowait(self) -> Pending:
        """Send a request of kipside's own (ApiVersions v0) behind everything sent so far: its
        answer comes once the broker has handled every earlier request, acks=0 ones included
        (a broker handles a connection's requests in order). Raises UpstreamFailed if the
        connection is closed or breaks."""
        if self.closed or self._wire is None:
            raise UpstreamFailed(self.close_reason or f"{self.name} is not connected")
        pending = Pending()
        self._write(
            self.protocol.send_request(
                ApiKey.API_VERSIONS, 0, b"", tag=pending, now=trio.current_time()
            )
        )
        return pending

    def send_raw_nowait(self, frame: bytes) -> Pending:
        """Send a legacy SASL token frame (after SaslHandshake v0) as it is; its answer is the
        broker's next frame, also raw. Raises UpstreamFailed if the connection is closed."""
        if self.closed or self._wire is None:
            raise UpstreamFailed(self.close_reason or f"{self.name} is not connected")
        pending = Pending()
        self._write((self.protocol.send_raw(frame, tag=pending, now=trio.current_time()),))
        return pending

    def _write(self, chunks: Sequence[Buffer]) -> None:
        assert self._wire is not None
        try:
            self._wire.write(chunks)
        except WireBroken as exc:
            raise UpstreamFailed(self.close_reason or str(exc)) from exc
        self.requests_sent += 1

    async def send(
        self, frame: bytes, api_key: int, api_version: int, *, expects_response: bool = True
    ) -> Pending | None:
        """send_nowait, then wait while the broker is not reading what was sent (backpressure)."""
        pending = self.send_nowait(frame, api_key, api_version, expects_response=expects_response)
        if self._wire is not None and self._wire.backlog_bytes > BACKLOG_LIMIT_BYTES:
            await self._wire.drained()
        return pending

    # Receiving --------------------------------------------------------------------------

    async def _read_responses(self, wire: Wire) -> None:
        protocol = self.protocol
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
                protocol.receive_data(data, trio.current_time())
                while (response := protocol.next_response()) is not None:
                    response.tag.resolve(response.frame)  # type: ignore[attr-defined]
        except FrameTooLargeError as exc:
            reason = f"{self.name}: broker sent a response over limits.max_frame_bytes"
            self._frame_too_large(exc)
        except ProtocolError as exc:
            reason = f"{self.name}: broker sent bytes that are not Kafka: {exc}"
            log.error("%s", reason)
        except trio.Cancelled:  # the server is shutting down
            self.shut_down = True
            reason = f"{self.name}: closed by kipside"
            raise
        finally:
            self._close(reason)

    def _frame_too_large(self, exc: FrameTooLargeError) -> None:
        oldest = self.protocol.oldest()
        what = None if oldest is None else f"{api_name(oldest.api_key)} v{oldest.api_version}"
        message = answer_too_large(self.name, what, exc.size, exc.cap)
        if self._report is not None:
            self._report("max_frame_bytes", message)
        else:
            log.warning("%s", message)

    # Time -------------------------------------------------------------------------------

    async def _watch_deadline(self) -> None:
        """Close the connection once its oldest request has waited past its deadline.

        Nothing wakes it per request: with requests in flight it sleeps until the oldest one's
        deadline and asks again (an answer meanwhile only moves the deadline later); idle, it
        sleeps one answer timeout, and a request sent meanwhile has its deadline no sooner
        than that."""
        protocol = self.protocol
        idle_sleep = protocol.answer_timeout or DEFAULT_ANSWER_TIMEOUT_SECONDS
        with self._watcher:
            while not self.closed:
                deadline = protocol.deadline()
                if deadline == math.inf:
                    await trio.sleep(idle_sleep)
                    continue
                await trio.sleep_until(deadline)
                late = protocol.overdue(trio.current_time())
                if late is not None:
                    waited = max(protocol.answer_timeout or 0.0, late.allowance)
                    self._close(
                        f"{self.name}: no answer to {api_name(late.api_key)} "
                        f"v{late.api_version} within {waited:g} s (the upstream answer timeout)"
                    )

    # Closing ----------------------------------------------------------------------------

    def _close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self._closed_event.set()
        self._watcher.cancel()
        self.close_reason = reason
        if self._wire is not None:
            self._wire.close()
        for pending in self.protocol.close():
            if pending is not None:
                pending.fail(reason)  # type: ignore[attr-defined]
        if self._on_closed is not None:
            self._on_closed(self, reason)

    async def aclose(self) -> None:
        self._close(f"{self.name}: closed by kipside")

    async def close_after_pending(self, grace_seconds: float) -> None:
        """Half-close, let the broker finish and close its side, then close; bounded.

        A plain close with requests still unread makes the kernel reset the connection, and a
        broker drops requests it had not processed yet: acks=0 produce would be lost.
        """
        if self.closed or self._wire is None:
            return
        with trio.move_on_after(grace_seconds, shield=True):
            await self._wire.send_eof()
            await self._closed_event.wait()
        self._close(f"{self.name}: closed by kipside")
