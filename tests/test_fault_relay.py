"""Tests for tests/relaykit/faults.py (FaultRelay) over loopback, against a fake broker on
port 0: a cut refuses and resets, a blackhole swallows both ways and keeps the connections it
darkened dark after restore, stall and spike delay without losing anything. Every network step
has an absolute trio.fail_after deadline."""

from __future__ import annotations

import functools
import time

import pytest
import trio
from relaykit.faults import FaultRelay, Swallowed
from test_relaykit import FakeBroker, read_frames, request

from kipside.protocol.apis import ApiKey
from kipside.protocol.headers import response_correlation_id

TIMEOUT = 10


async def roundtrip(stream: trio.abc.Stream, correlation_id: int) -> int:
    await stream.send_all(request(ApiKey.METADATA, correlation_id))
    [frame] = await read_frames(stream, 1)
    return response_correlation_id(frame)


async def silent(stream: trio.abc.Stream, correlation_id: int, seconds: float = 0.3) -> bool:
    """Whether a request gets no answer for `seconds`."""
    await stream.send_all(request(ApiKey.METADATA, correlation_id))
    with trio.move_on_after(seconds):
        await stream.receive_some(65536)
        return False
    return True


async def test_cut_blackhole_stall_spike_and_restore() -> None:
    broker = FakeBroker()
    with trio.fail_after(TIMEOUT):
        relay = await trio.to_thread.run_sync(FaultRelay().start)
    call = trio.to_thread.run_sync
    try:
        async with trio.open_nursery() as nursery:
            serve = functools.partial(trio.serve_tcp, broker.serve, 0, host="127.0.0.1")
            [listener] = await nursery.start(serve)
            relay.upstream = ("127.0.0.1", listener.socket.getsockname()[1])
            with trio.fail_after(TIMEOUT):
                first = await trio.open_tcp_stream("127.0.0.1", relay.port)
                assert await roundtrip(first, 1) == 1

                # A cut: the open connection is reset, a new one refused.
                assert await call(relay.cut) == 1
                with pytest.raises(trio.BrokenResourceError):
                    await first.receive_some(65536)
                with pytest.raises(OSError):
                    await trio.open_tcp_stream("127.0.0.1", relay.port)
                await call(relay.restore)
                second = await trio.open_tcp_stream("127.0.0.1", relay.port)  # same port
                assert await roundtrip(second, 2) == 2

                # A blackhole: open and new connections alike hear nothing.
                await call(relay.blackhole)
                third = await trio.open_tcp_stream("127.0.0.1", relay.port)
                seen = len(broker.seen)
                assert await silent(second, 3) and await silent(third, 4)
                assert len(broker.seen) == seen, "a blackholed request reached the broker"
                assert await call(relay.swallowed) == Swallowed(2, 0)
                # After restore: new connections work, the darkened ones stay dark.
                await call(relay.restore)
                fourth = await trio.open_tcp_stream("127.0.0.1", relay.port)
                assert await roundtrip(fourth, 5) == 5
                assert await silent(second, 6)

                # A stall: held, then answered; a spike: answered late.
                await call(relay.stall)
                assert await silent(fourth, 7)
                await call(relay.resume)
                [late] = await read_frames(fourth, 1)
                assert response_correlation_id(late) == 7
                await call(relay.spike, 300.0)
                started = time.monotonic()
                assert await roundtrip(fourth, 8) == 8
                assert time.monotonic() - started >= 0.29
                await call(relay.calm)
                for stream in (second, third, fourth):
                    await stream.aclose()
            nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(relay.close)
    assert relay.problems() == []
