"""One TCP connection driven straight from trio's I/O loop, for the per-request hot path.

trio's stream layer costs a scheduler round trip on every send (a checkpoint even when the
kernel takes the bytes at once) and a lock-like conflict check on every call. A proxy that
forwards one small frame per request pays that on every hop, so kipside's connections use this
instead: the socket stays non-blocking, reads wait with `trio.lowlevel.wait_readable` and then
take everything the kernel holds, and writes are plain synchronous calls that any task may make:

- `write(chunks)` hands the kernel every chunk in one `sendmsg` call. Whatever it does not take
  (a full socket buffer) is kept, in order, in a backlog that the connection's `run_flusher`
  task writes out as the peer reads. Later writes queue behind the backlog, so bytes leave in
  the order they were written and a frame is never interleaved with another: writes are whole
  by construction, with no shield needed.
- A peer that stops reading for `WRITE_GRACE_SECONDS` with a backlog pending breaks the
  connection, so it can't hold a task or shutdown hostage. `backlog_bytes` lets a reader stop
  taking requests while its answers pile up (backpressure); `on_backlog` reports each change
  of it to whoever counts what kipside holds for a client (core.limits).

Failures are reported once, to the `on_broken` callback, and every later write raises
`WireBroken`. Closing wakes any task waiting on the socket (trio's notify_closing).
"""

from __future__ import annotations

import errno
import socket
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final

import trio

from kipside.protocol import Buffer

# A write to a peer that stopped reading must not keep the connection alive forever.
WRITE_GRACE_SECONDS: Final = 10.0
# sendmsg takes at most IOV_MAX (1024 on Linux) buffers per call.
MAX_CHUNKS_PER_CALL: Final = 512
# What one read takes from the kernel at most; every whole frame in it is handled before the
# next read.
READ_SIZE: Final = 256 * 1024
# Past this much unsent backlog, UpstreamConnection.send waits for the broker to read before it
# returns. (Client connections are bounded by the in-flight limits instead: core.limits.)
BACKLOG_LIMIT_BYTES: Final = 4 * 1024 * 1024


class WireBroken(Exception):
    """The connection is closed or failed; nothing more can be written to it."""


def connect_error(host: str, port: int, exc: OSError) -> OSError:
    """trio's "all attempts to connect to HOST:PORT failed", with each attempt's reason:
    "refused" when nothing listens there, which is what a user most needs to read."""
    cause = exc.__cause__
    attempts = list(cause.exceptions) if isinstance(cause, BaseExceptionGroup) else [exc]
    if attempts and all(isinstance(a, ConnectionRefusedError) for a in attempts):
        return ConnectionRefusedError(
            errno.ECONNREFUSED,
            f"connection to {host}:{port} refused: nothing listens there (is the broker "
            "running, and is that its port?)",
        )
    reasons = sorted({a.strerror or str(a) for a in attempts if isinstance(a, OSError)})
    if not reasons:
        return exc
    return OSError(exc.errno, f"cannot connect to {host}:{port}: {'; '.join(reasons)}")


class Wire:
    """A non-blocking TCP socket with synchronous ordered writes and an async reader side."""

    __slots__ = (
        "_backlog",
        "_drained",
        "_flush_wanted",
        "_on_backlog",
        "_on_broken",
        "_sock",
        "backlog_bytes",
        "broken_reason",
        "closed",
    )

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._backlog: deque[memoryview] = deque()
        self.backlog_bytes = 0
        self._flush_wanted: trio.Event | None = None
        self._drained: trio.Event | None = None
        self._on_broken: Callable[[str], None] | None = None
        self._on_backlog: Callable[[int], None] | None = None
        self.closed = False
        self.broken_reason: str | None = None
        """Why the connection broke or closed; None while it works."""

    @classmethod
    def from_stream(cls, stream: trio.SocketStream) -> Wire:
        """Take over the socket of a trio SocketStream (the stream is left holding nothing)."""
        fd = stream.socket.detach()
        return cls(socket.socket(fileno=fd))

    @classmethod
    async def connect(cls, host: str, port: int) -> Wire:
        """Dial like trio.open_tcp_stream (happy eyeballs); raises OSError saying why."""
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise connect_error(host, port, exc) from exc
        return cls.from_stream(stream)

    def on_broken(self, callback: Callable[[str], None]) -> None:
        self._on_broken = callback

    def on_backlog(self, callback: Callable[[int], None]) -> None:
        """Call callback with each change of `backlog_bytes` (+ queued, - written or dropped).
        Only a write the kernel does not take whole queues anything, so the hot path never
        calls it."""
        self._on_backlog = callback

    def peername(self) -> str:
        try:
            host, port = self._sock.getpeername()[:2]
        except OSError:
            return "<unknown>"
        return f"{host}:{port}"

    # Reading ---------------------------------------------------------------------------

    async def receive(self, max_bytes: int = READ_SIZE) -> bytes:
        """The next bytes from the peer; b"" once it has finished sending or the connection
        is closed or reset (then `broken_reason` says which). Waits first: a proxy reads
        after the peer had time to send."""
        while True:
            if self.closed:  # closed by a failed write or by its owner, maybe before we waited
                await trio.lowlevel.checkpoint()
                return b""
            try:
                await trio.lowlevel.wait_readable(self._sock)
            except trio.ClosedResourceError:
                return b""
            try:
                return self._sock.recv(max_bytes)
            except BlockingIOError:
                continue
            except OSError as exc:
                # Like the end of the stream to the reader (what was already read still gets
                # answered if it can be); the next write reports the break.
                self.broken_reason = f"connection lost: {exc.strerror or exc}"
                return b""

    # Writing ---------------------------------------------------------------------------

    def write(self, chunks: Sequence[Buffer]) -> None:
        """Send the chunks in order, now as far as the kernel takes them, the rest later.

        Raises WireBroken if the connection is closed or fails (on_broken has been told).
        """
        if self.closed:
            raise WireBroken(self.broken_reason or "connection closed")
        if self._backlog:
            self._queue(chunks, 0)
            return
        if len(chunks) == 1:
            data = chunks[0]
            try:
                sent = self._sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                raise self._write_failed(exc) from exc
            if sent < len(data):
                self._queue([memoryview(data)[sent:]], 0)
            return
        try:
            sent = self._sock.sendmsg(chunks[:MAX_CHUNKS_PER_CALL])
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise self._write_failed(exc) from exc
        total = 0
        for chunk in chunks:
            total += len(chunk)
        if sent < total:
            self._queue(chunks, sent)

    def _queue(self, chunks: Sequence[Buffer], skip: int) -> None:
        before = self.backlog_bytes
        for chunk in chunks:
            size = len(chunk)
            if skip >= size:
                skip -= size
                continue
            view = memoryview(chunk)[skip:] if skip else memoryview(chunk)
            skip = 0
            self._backlog.append(view)
            self.backlog_bytes += len(view)
        if self._on_backlog is not None:
            self._on_backlog(self.backlog_bytes - before)
        if self._flush_wanted is not None:
            self._flush_wanted.set()

    def _write_failed(self, exc: OSError) -> WireBroken:
        reason = f"write failed: {exc.strerror or exc}"
        self._break(reason)
        return WireBroken(reason)

    async def run_flusher(self) -> None:
        """Write the backlog out as the peer reads it; runs for the connection's life."""
        while not self.closed:
            if not self._backlog:
                self._flush_wanted = trio.Event()
                await self._flush_wanted.wait()
                continue
            with trio.move_on_after(WRITE_GRACE_SECONDS) as scope:
                await self._flush_some()
            if scope.cancelled_caught:
                self._break(f"the peer read nothing for {WRITE_GRACE_SECONDS:g} s")

    async def _flush_some(self) -> None:
        if self.closed:
            return
        try:
            await trio.lowlevel.wait_writable(self._sock)
        except trio.ClosedResourceError:
            return
        try:
            sent = self._sock.sendmsg(list(self._backlog)[:MAX_CHUNKS_PER_CALL])
        except BlockingIOError:
            return
        except OSError as exc:
            self._break(f"write failed: {exc.strerror or exc}")
            return
        self.backlog_bytes -= sent
        if self._on_backlog is not None and sent:
            self._on_backlog(-sent)
        while sent:
            head = self._backlog[0]
            if sent >= len(head):
                sent -= len(head)
                self._backlog.popleft()
            else:
                self._backlog[0] = head[sent:]
                sent = 0
        if not self._backlog and self._drained is not None:
            self._drained.set()
            self._drained = None

    async def drained(self) -> None:
        """Wait until the backlog is written (or the connection is gone)."""
        if self._backlog and not self.closed:
            if self._drained is None:
                self._drained = trio.Event()
            await self._drained.wait()
        else:
            await trio.lowlevel.checkpoint()

    # Closing ---------------------------------------------------------------------------

    async def send_eof(self) -> None:
        """Half-close once the backlog is out: the peer sees the end of what we send."""
        await self.drained()
        if not self.closed:
            try:
                self._sock.shutdown(socket.SHUT_WR)
            except OSError as exc:
                if exc.errno != errno.ENOTCONN:
                    self._break(f"shutdown failed: {exc.strerror or exc}")

    def _break(self, reason: str) -> None:
        if self.closed:
            return
        self.broken_reason = reason
        self.close()
        if self._on_broken is not None:
            self._on_broken(reason)

    def close(self) -> None:
        """Close now (synchronous); tasks waiting on the socket wake up."""
        if self.closed:
            return
        self.closed = True
        self.broken_reason = self.broken_reason or "connection closed"
        self._backlog.clear()
        dropped, self.backlog_bytes = self.backlog_bytes, 0
        if self._on_backlog is not None and dropped:
            self._on_backlog(-dropped)
        trio.lowlevel.notify_closing(self._sock)
        self._sock.close()
        for event in (self._flush_wanted, self._drained):
            if event is not None:
                event.set()
