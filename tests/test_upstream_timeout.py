"""network.upstream's answer timeout (a lane's --upstream-request-timeout), against a scripted
broker on a loopback socket: a silent broker closes the connection and fails what is in flight
with the timeout named; a request's own allowance (a ProduceRequest's timeout_ms) is waited
out; an idle connection is never closed; a slow but answering broker is never cut. Real time,
sub-second timeouts; every test under an absolute trio.fail_after."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from kipside.protocol import Address, ApiKey, FrameDecoder, build_frame, encode_request_header
from kipside.protocol.headers import parse_request_header
from kipside.proxy.core.answers import UpstreamFailed
from kipside.proxy.transport.waiting import answer_of
from kipside.proxy.upstream.connection import UpstreamConnection

TIMEOUT = 10
ANSWER_TIMEOUT = 0.3


def metadata_request(correlation_id: int) -> bytes:
    return build_frame(encode_request_header(ApiKey.METADATA, 1, correlation_id, "t"), b"")


class ScriptedBroker:
    """Answers request number i (0, 1, ...) delays[i] seconds after the previous answer (or
    after it arrived, if later), in order, as a broker serves a connection; None: never."""

    def __init__(self, delays: list[float | None]) -> None:
        self.delays = delays
        self.seen = 0

    async def serve(self, stream: trio.SocketStream) -> None:
        decoder = FrameDecoder()
        send, receive = trio.open_memory_channel[tuple[int, float | None]](100)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._answer, stream, receive)
            while data := await stream.receive_some(65536):
                decoder.receive_data(data)
                for frame in iter(decoder.next_frame, None):
                    delay = self.delays[self.seen] if self.seen < len(self.delays) else 0.0
                    self.seen += 1
                    await send.send((parse_request_header(frame).correlation_id, delay))
            nursery.cancel_scope.cancel()

    @staticmethod
    async def _answer(
        stream: trio.SocketStream, requests: trio.MemoryReceiveChannel[tuple[int, float | None]]
    ) -> None:
        async for correlation_id, delay in requests:
            if delay is None:
                await trio.sleep_forever()
            await trio.sleep(delay)
            await stream.send_all(build_frame(correlation_id.to_bytes(4, "big"), b""))


@asynccontextmanager
async def connected(broker: ScriptedBroker) -> AsyncIterator[UpstreamConnection]:
    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, broker.serve, 0, host="127.0.0.1")
        [listener] = await nursery.start(serve)
        address = Address("127.0.0.1", listener.socket.getsockname()[1])
        connection = await UpstreamConnection.open(
            address,
            nursery,
            name="lane 0 to node 1",
            max_frame_bytes=1 << 20,
            answer_timeout=ANSWER_TIMEOUT,
        )
        try:
            yield connection
        finally:
            await connection.aclose()
            nursery.cancel_scope.cancel()


async def test_a_silent_broker_fails_the_requests_in_flight_and_closes() -> None:
    with trio.fail_after(TIMEOUT):
        async with connected(ScriptedBroker([0.0, None, None])) as connection:
            first = connection.send_nowait(metadata_request(1), ApiKey.METADATA, 1)
            assert first is not None
            await answer_of(first)
            started = trio.current_time()
            second = connection.send_nowait(metadata_request(2), ApiKey.METADATA, 1)
            third = connection.send_nowait(metadata_request(3), ApiKey.METADATA, 1)
            assert second is not None and third is not None
            with pytest.raises(UpstreamFailed) as failed:
                await answer_of(second)
            waited = trio.current_time() - started
            assert ANSWER_TIMEOUT <= waited < ANSWER_TIMEOUT * 1.25 + 0.2, waited
            assert str(failed.value) == (
                "lane 0 to node 1: no answer to Metadata v1 within 0.3 s "
                "(the upstream answer timeout)"
            )
            assert third.failure == str(failed.value)
            assert connection.closed


async def test_a_request_allowance_and_a_slow_broker_are_waited_out() -> None:
    with trio.fail_after(TIMEOUT):
        async with connected(ScriptedBroker([0.6, 0.2, 0.2, 0.2])) as connection:
            # Allowed 1 s by its own terms: answered at 0.6 s, past the 0.3 s timeout.
            allowed = connection.send_nowait(metadata_request(1), ApiKey.METADATA, 1, allowance=1.0)
            assert allowed is not None
            await answer_of(allowed)
            # Idle for longer than the timeout: nothing is in flight, nothing is cut.
            await trio.sleep(ANSWER_TIMEOUT * 2)
            # Each answer takes 0.2 s; three in a row keep the head moving, so none waits
            # 0.3 s at the head even though the last is answered 0.6 s after it was sent.
            pending = [
                connection.send_nowait(metadata_request(n), ApiKey.METADATA, 1) for n in (2, 3, 4)
            ]
            for p in pending:
                assert p is not None
                await answer_of(p)
            assert not connection.closed
