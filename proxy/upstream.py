"""One connection to an upstream broker, shared by any number of requesters.

Requests are written whole (shielded), each under a correlation id this connection assigns, and
answered in order by a reader task; a `Pending` carries each answer back to whoever asked,
under the requester's own correlation id. Used both for a client's own (dedicated) upstream
connection and for the shared "lanes". The broker serves one request at a time per connection,
so everything written here is answered in write order; a correlation id out of order means the
connection can't be trusted and it is closed. When the connection ends, every pending request
fails with the reason; nothing is retried here (retrying is the client's decision).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import trio

from protocol.apis import api_name
from protocol.errors import ProtocolError
from protocol.framing import FrameDecoder
from protocol.headers import (
    request_correlation_id,
    response_correlation_id,
    with_request_correlation_id,
    with_response_correlation_id,
)

from .nodes import Address

log = logging.getLogger("kipside.upstream")

READ_SIZE = 256 * 1024
# A write to a peer that stopped reading must not keep a shielded task alive forever.
WRITE_GRACE_SECONDS = 10.0


class UpstreamFailed(Exception):
    """The upstream connection ended before this request was answered."""


class Pending:
    """The future answer to one request: a response frame or a failure reason."""

    __slots__ = ("_done", "error_name", "failure", "frame")

    def __init__(self) -> None:
        self._done = trio.Event()
        self.frame: bytes | None = None
        self.failure: str | None = None
        self.error_name: str | None = None
        """The Kafka error in the answer, when whoever built it knows (for traces)."""

    @classmethod
    def answered(cls, frame: bytes) -> Pending:
        pending = cls()
        pending.resolve(frame)
        return pending

    def resolve(self, frame: bytes) -> None:
        self.frame = frame
        self._done.set()

    def fail(self, reason: str) -> None:
        if not self._done.is_set():
            self.failure = reason
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def wait(self) -> bytes:
        await self._done.wait()
        if self.frame is None:
            raise UpstreamFailed(self.failure or "no response")
        return self.frame


@dataclass(slots=True)
class _InFlight:
    upstream_correlation_id: int
    client_correlation_id: int
    api_key: int
    api_version: int
    pending: Pending


async def write_whole(stream: trio.abc.SendStream, data: bytes) -> None:
    """Write all of data or fail: shielded so a cancel never leaves half a frame on the wire,
    bounded so a peer that stops reading can't hold shutdown hostage."""
    with trio.move_on_after(WRITE_GRACE_SECONDS, shield=True) as scope:
        await stream.send_all(data)
    if scope.cancelled_caught:
        raise trio.BrokenResourceError("peer did not accept the write in time")


class UpstreamConnection:
    """A connection to one broker, safe to share between tasks."""

    def __init__(
        self,
        address: Address,
        *,
        name: str,
        max_frame_bytes: int,
        on_closed: Callable[[UpstreamConnection, str], None] | None = None,
    ) -> None:
        self.address = address
        self.name = name
        self.max_frame_bytes = max_frame_bytes
        self._on_closed = on_closed
        self._stream: trio.SocketStream | None = None
        self._send_lock = trio.Lock()
        self._in_flight: deque[_InFlight] = deque()
        # Correlation ids of requests sent expecting no answer (acks=0 produce). Apache Kafka
        # never answers them, but some brokers (Tansu) do; such an answer is dropped, not taken
        # for a protocol violation.
        self._unanswered: deque[int] = deque(maxlen=1024)
        self._next_correlation_id = 0
        self.closed = False
        self._closed_event = trio.Event()
        self.close_reason = ""
        self.requests_sent = 0

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    async def start(self, nursery: trio.Nursery, connect_timeout: float = 10.0) -> None:
        """Connect and start the reader in nursery; raises OSError/TooSlowError if unreachable."""
        with trio.fail_after(connect_timeout):
            self._stream = await trio.open_tcp_stream(self.address.host, self.address.port)
        nursery.start_soon(self._read_responses)

    def _take_correlation_id(self) -> int:
        correlation_id = self._next_correlation_id
        self._next_correlation_id = (correlation_id + 1) & 0x7FFFFFFF
        return correlation_id

    async def send(
        self, frame: bytes, api_key: int, api_version: int, *, expects_response: bool = True
    ) -> Pending | None:
        """Send a request frame; its answer comes back under the frame's own correlation id.

        Returns None when no response is expected (acks=0 produce). Raises UpstreamFailed if
        the connection is already closed or breaks while writing.
        """
        if self.closed or self._stream is None:
            raise UpstreamFailed(self.close_reason or f"{self.name} is not connected")
        client_correlation_id = request_correlation_id(frame)
        async with self._send_lock:
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
                    )
                )
            if upstream_correlation_id != client_correlation_id:
                frame = with_request_correlation_id(frame, upstream_correlation_id)
            try:
                await write_whole(self._stream, frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self._close(f"{self.name}: write failed: {exc}")
                raise UpstreamFailed(self.close_reason) from exc
            self.requests_sent += 1
        return pending

    async def _read_responses(self) -> None:
        assert self._stream is not None
        decoder = FrameDecoder(max_frame_bytes=self.max_frame_bytes, min_frame_bytes=4)
        reason = f"{self.name}: broker closed the connection"
        try:
            while True:
                try:
                    data = await self._stream.receive_some(READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    reason = f"{self.name}: connection lost: {exc}"
                    return
                if not data:
                    return
                decoder.receive_data(data)
                while (frame := decoder.next_frame()) is not None:
                    if not self._deliver(frame):
                        reason = f"{self.name}: unexpected response correlation id"
                        return
        except ProtocolError as exc:
            reason = f"{self.name}: broker sent bytes that are not Kafka: {exc}"
        finally:
            self._close(reason)

    def _deliver(self, frame: bytes) -> bool:
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
        while self._in_flight:
            self._in_flight.popleft().pending.fail(reason)
        if self._stream is not None:
            stream = self._stream
            # Closing a socket stream is synchronous at the OS level; aclose_forcefully would
            # need a checkpoint we may not have here (called from finally blocks).
            stream.socket.close()
        if self._on_closed is not None:
            self._on_closed(self, reason)

    async def aclose(self) -> None:
        self._close(f"{self.name}: closed by kipside")

    async def close_after_pending(self, grace_seconds: float) -> None:
        """Half-close, let the broker finish and close its side, then close; bounded.

        A plain close with answers still unread makes the kernel reset the connection, and a
        broker drops requests it had not processed yet: acks=0 produce would be lost.
        """
        if self.closed or self._stream is None:
            return
        with trio.move_on_after(grace_seconds, shield=True):
            try:
                await self._stream.send_eof()
                await self._closed_event.wait()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        self._close(f"{self.name}: closed by kipside")
