"""proxy.wire: synchronous ordered writes with a backlog, and the reader side, on real sockets.

Each test uses a connected pair of loopback TCP sockets (the proxy's only kind) under an
absolute trio.fail_after; one end is a Wire, the other a plain trio socket the test drives.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
from testkit.ports import loopback_pair

from kipside.proxy.transport import wire as wire_module
from kipside.proxy.transport.wire import Wire, WireBroken

TIMEOUT = 10


@asynccontextmanager
async def pair() -> AsyncIterator[tuple[Wire, trio.socket.SocketType]]:
    near, far = loopback_pair(64 * 1024)  # small buffers: a backlog forms after a few hundred KiB
    w = Wire(near)
    peer = trio.socket.from_stdlib_socket(far)
    try:
        yield w, peer
    finally:
        w.close()
        peer.close()


async def read_exactly(peer: trio.socket.SocketType, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        data = await peer.recv(size - len(out))
        assert data, f"peer closed after {len(out)} of {size} bytes"
        out += data
    return bytes(out)


async def test_writes_arrive_whole_and_in_order_through_a_backlog() -> None:
    """The peer reads nothing until megabytes are written: the kernel takes part, the rest
    waits in the backlog, and later writes queue behind it rather than overtaking."""
    with trio.fail_after(TIMEOUT):
        async with pair() as (w, peer), trio.open_nursery() as nursery:
            nursery.start_soon(w.run_flusher)
            chunks = [bytes([i % 251]) * (200_000 + i) for i in range(12)]
            for i, chunk in enumerate(chunks):
                if i % 3:
                    w.write([chunk[:7], memoryview(chunk)[7:]])  # several buffers, one call
                else:
                    w.write([chunk])
            assert w.backlog_bytes > 0  # the kernel could not take it all at once
            expected = b"".join(chunks)
            assert await read_exactly(peer, len(expected)) == expected
            await w.drained()
            assert w.backlog_bytes == 0
            nursery.cancel_scope.cancel()


async def test_receive_returns_what_was_sent_then_empty_at_the_end() -> None:
    with trio.fail_after(TIMEOUT):
        async with pair() as (w, peer):
            await peer.send(b"hello")
            assert await w.receive(1024) == b"hello"
            peer.shutdown(socket.SHUT_WR)
            assert await w.receive(1024) == b""
            assert w.broken_reason is None  # the peer finished sending: nothing broke


async def test_a_reset_reads_as_the_end_and_the_next_write_reports_it() -> None:
    broken: list[str] = []
    with trio.fail_after(TIMEOUT):
        async with pair() as (w, peer):
            w.on_broken(broken.append)
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            peer.close()  # linger 0: RST
            assert await w.receive(1024) == b""
            assert w.broken_reason is not None and "connection lost" in w.broken_reason
            with pytest.raises(WireBroken):
                for _ in range(3):  # the first write after a reset may still be accepted
                    w.write([b"x" * 1024])
                    await trio.sleep(0.05)
            assert len(broken) == 1
            assert w.closed


async def test_closing_wakes_a_waiting_reader() -> None:
    with trio.fail_after(TIMEOUT):
        async with pair() as (w, _peer), trio.open_nursery() as nursery:
            got: list[bytes] = []

            async def reader() -> None:
                got.append(await w.receive(1024))

            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()  # the reader waits on the socket
            w.close()
        assert got == [b""]
        with pytest.raises(WireBroken):
            w.write([b"late"])


async def test_a_peer_that_stops_reading_breaks_the_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A backlog nobody reads must not hold the flusher (and shutdown) forever: after
    WRITE_GRACE_SECONDS of virtual time (the clock jumps while the socket stays unwritable)."""
    broken: list[str] = []
    with trio.fail_after(wire_module.WRITE_GRACE_SECONDS + TIMEOUT):
        async with pair() as (w, _peer):
            w.on_broken(broken.append)
            w.write([b"x" * 4_000_000])
            assert w.backlog_bytes > 0
            started = trio.current_time()
            await w.run_flusher()  # returns once it gave up and closed the connection
            assert trio.current_time() - started >= wire_module.WRITE_GRACE_SECONDS
    assert w.closed
    assert broken and "read nothing" in broken[0]


async def test_receive_on_a_wire_closed_before_it_waited_reads_as_the_end() -> None:
    """A failed write closes the wire from another task before the reader waits again: the
    reader must see the end of the stream, not an error that would take the proxy down."""
    with trio.fail_after(TIMEOUT):
        async with pair() as (w, _peer):
            w.close()
            assert await w.receive(1024) == b""
            await w.run_flusher()  # returns at once on a closed wire
