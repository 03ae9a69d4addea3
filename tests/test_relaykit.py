"""Tests for tests/relaykit: the base every test relay (filter) is built on.

The pumping (order of local answers and forwarded responses, rewriting, dropping, delays,
problems) runs on trio memory streams with a scripted fake broker, under the autojump clock
where time matters. One test runs the whole relay (its thread, a listener on 127.0.0.1:0, hold,
release, cut_all, close) over loopback against a fake broker on port 0. Every network step has
an absolute trio.fail_after deadline.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing
from relaykit.base import Relay
from relaykit.base import response_frame as answer_frame
from relaykit.decisions import DROP, FORWARD, Answer, Conn, Decision, Forward, Request

from kipside.protocol.apis import ApiKey
from kipside.protocol.framing import FrameDecoder
from kipside.protocol.headers import (
    build_frame,
    encode_request_header,
    parse_request_header,
    response_correlation_id,
)

TIMEOUT = 10


def request(api_key: int, correlation_id: int, body: bytes = b"") -> bytes:
    version = 1  # request header v1, response header v0 for every key used here
    return build_frame(encode_request_header(api_key, version, correlation_id, "t"), body)


def body(frame: bytes) -> bytes:
    return frame[8:]  # response header v0: correlation id only


async def read_frames(stream: trio.abc.Stream, count: int) -> list[bytes]:
    decoder, frames = FrameDecoder(), list[bytes]()
    with trio.fail_after(TIMEOUT):
        while len(frames) < count:
            data = await stream.receive_some(65536)
            assert data, f"stream closed after {len(frames)} of {count} frames"
            decoder.receive_data(data)
            frames.extend(iter(decoder.next_frame, None))
    return frames


async def poll(predicate: Callable[[], bool]) -> None:
    while not predicate():  # noqa: ASYNC110 (the relay's thread has no trio.Event for us)
        await trio.sleep(0.01)


class FakeBroker:
    """Answers each request with its correlation id and body b"broker", in order, after
    `delays[correlation_id]` seconds; `reverse` answers each pair of requests backwards."""

    def __init__(self, delays: dict[int, float] | None = None, *, reverse: bool = False) -> None:
        self.delays = delays or {}
        self.reverse = reverse
        self.seen: list[bytes] = []

    async def serve(self, stream: trio.abc.Stream) -> None:
        decoder, waiting = FrameDecoder(), list[bytes]()
        while data := await stream.receive_some(65536):
            decoder.receive_data(data)
            for frame in iter(decoder.next_frame, None):
                self.seen.append(frame)
                header = parse_request_header(frame)
                waiting.append(answer_frame(header, b"broker"))
                if self.reverse and len(waiting) < 2:
                    continue
                await trio.sleep(self.delays.get(header.correlation_id, 0))
                for answer in reversed(waiting) if self.reverse else waiting:
                    await stream.send_all(answer)
                waiting.clear()


async def relayed(
    relay: Relay, broker: FakeBroker, test: Callable[[trio.abc.Stream], Awaitable[None]]
) -> None:
    """Run `test` with a client stream carried by `relay` to `broker` (memory streams)."""
    client, relay_client = trio.testing.memory_stream_pair()
    relay_broker, broker_end = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay.carry, relay_client, relay_broker)
        nursery.start_soon(broker.serve, broker_end)
        await test(client)
        nursery.cancel_scope.cancel()


class LocalApiVersions(Relay):
    """Answers ApiVersions itself, swallows Heartbeats, forwards the rest."""

    def on_request(self, conn: Conn, request: Request) -> Decision:
        if request.header.api_key == ApiKey.API_VERSIONS:
            return Answer(answer_frame(request.header, b"local"))
        if request.header.api_key == ApiKey.HEARTBEAT:
            return DROP
        return FORWARD


async def test_local_answer_waits_behind_the_response_still_owed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = FakeBroker({1: 5.0})
    relay = LocalApiVersions()

    async def client(stream: trio.abc.Stream) -> None:
        await stream.send_all(
            request(ApiKey.METADATA, 1)
            + request(ApiKey.API_VERSIONS, 2)
            + request(ApiKey.HEARTBEAT, 3)
            + request(ApiKey.METADATA, 4)
        )
        frames = await read_frames(stream, 3)
        assert [response_correlation_id(f) for f in frames] == [1, 2, 4]
        assert [body(f) for f in frames] == [b"broker", b"local", b"broker"]
        assert trio.current_time() >= 5.0  # the local answer waited for the slow one

    await relayed(relay, broker, client)
    assert [parse_request_header(f).correlation_id for f in broker.seen] == [1, 4]
    assert relay.problems() == []


async def test_responses_reach_the_client_in_request_order() -> None:
    broker = FakeBroker(reverse=True)  # answers 2 before 1, 4 before 3

    async def client(stream: trio.abc.Stream) -> None:
        await stream.send_all(b"".join(request(ApiKey.METADATA, c) for c in (1, 2, 3, 4)))
        frames = await read_frames(stream, 4)
        assert [response_correlation_id(f) for f in frames] == [1, 2, 3, 4]

    await relayed(Relay(), broker, client)


class RewriteResponses(Relay):
    """Rewrites the broker's answers, drops the one to correlation id 3, remembers which
    request each answer was matched to, and forwards Fetch with a rewritten body."""

    def __init__(self) -> None:
        super().__init__()
        self.matched: list[tuple[int, int, int]] = []

    def on_request(self, conn: Conn, request: Request) -> Decision:
        if request.header.api_key == ApiKey.FETCH:
            return Forward(build_frame(request.frame[4 : request.header.body_offset], b"rewritten"))
        return FORWARD

    def on_response(self, conn: Conn, request: Request, frame: bytes) -> bytes | None:
        header = request.header
        self.matched.append((header.api_key, header.correlation_id, response_correlation_id(frame)))
        if header.correlation_id == 3:
            return None
        return answer_frame(header, body(frame) + b" (rewritten)")


async def test_on_response_rewrites_or_drops_and_on_request_rewrites(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = FakeBroker()
    relay = RewriteResponses()

    async def client(stream: trio.abc.Stream) -> None:
        keys = {1: ApiKey.METADATA, 2: ApiKey.FETCH, 3: ApiKey.PRODUCE, 4: ApiKey.METADATA}
        await stream.send_all(b"".join(request(k, c, b"body") for c, k in keys.items()))
        frames = await read_frames(stream, 3)
        assert [response_correlation_id(f) for f in frames] == [1, 2, 4]
        assert {body(f) for f in frames} == {b"broker (rewritten)"}
        with trio.move_on_after(60):  # nothing else comes (virtual time): 3's answer was dropped
            assert await stream.receive_some(65536) == b"", "an answer nobody should get"

    await relayed(relay, broker, client)
    assert relay.matched == [
        (ApiKey.METADATA, 1, 1),
        (ApiKey.FETCH, 2, 2),
        (ApiKey.PRODUCE, 3, 3),
        (ApiKey.METADATA, 4, 4),
    ]
    fetch = broker.seen[1]
    assert fetch[parse_request_header(fetch).body_offset :] == b"rewritten"
    assert relay.problems() == []


async def test_delay_per_direction(autojump_clock: trio.testing.MockClock) -> None:
    relay = LocalApiVersions()
    relay.request_delay_ms, relay.response_delay_ms = 100.0, 250.0

    async def client(stream: trio.abc.Stream) -> None:
        for correlation_id, api_key in ((1, ApiKey.METADATA), (2, ApiKey.API_VERSIONS)):
            sent = trio.current_time()
            await stream.send_all(request(api_key, correlation_id))
            [frame] = await read_frames(stream, 1)
            assert response_correlation_id(frame) == correlation_id
            assert abs(trio.current_time() - sent - 0.35) < 1e-6  # local answers too

    await relayed(relay, FakeBroker(), client)


class Unasked(FakeBroker):
    async def serve(self, stream: trio.abc.Stream) -> None:
        await stream.send_all(answer_frame(parse_request_header(request(0, 99)), b"unasked"))
        await trio.sleep_forever()


class Buggy(Relay):
    def on_request(self, conn: Conn, request: Request) -> Decision:
        raise ValueError("a bug in the filter")


async def test_an_unasked_response_or_a_filter_bug_is_a_problem_and_ends_the_connection() -> None:
    async def closed(stream: trio.abc.Stream) -> None:
        with contextlib.suppress(trio.BrokenResourceError):  # the relay may have closed already
            await stream.send_all(request(ApiKey.METADATA, 1))
        with trio.fail_after(TIMEOUT):
            assert await stream.receive_some(65536) == b""

    relay = Relay()
    await relayed(relay, Unasked(), closed)
    [problem] = relay.problems()
    assert "correlation id 99, which no request in flight has" in problem

    buggy = Buggy()
    await relayed(buggy, FakeBroker(), closed)
    [problem] = buggy.problems()
    assert "Buggy failed: ValueError('a bug in the filter')" in problem
    assert "Traceback" in problem


async def test_over_loopback_hold_release_cut_and_close() -> None:
    broker = FakeBroker()
    with trio.fail_after(TIMEOUT):
        relay = await trio.to_thread.run_sync(Relay().start)
    try:
        async with trio.open_nursery() as nursery:
            serve = functools.partial(trio.serve_tcp, broker.serve, 0, host="127.0.0.1")
            [listener] = await nursery.start(serve)
            relay.upstream = ("127.0.0.1", listener.socket.getsockname()[1])  # after start()
            with trio.fail_after(TIMEOUT):
                client = await trio.open_tcp_stream("127.0.0.1", relay.port)
                await client.send_all(request(ApiKey.METADATA, 1))
                assert [response_correlation_id(f) for f in await read_frames(client, 1)] == [1]

                await trio.to_thread.run_sync(relay.hold)
                await client.send_all(request(ApiKey.METADATA, 2))
                await poll(lambda: relay.link_counts().held_now == 1)
                await trio.sleep(0.2)
                assert len(broker.seen) == 1, "a held request reached the broker"
                await trio.to_thread.run_sync(relay.release)
                assert [response_correlation_id(f) for f in await read_frames(client, 1)] == [2]

                assert await trio.to_thread.run_sync(relay.cut_all) == 1
                with pytest.raises(trio.BrokenResourceError):  # the RST: ECONNRESET
                    await client.receive_some(65536)
                counts = relay.link_counts()
                assert (counts.accepted, counts.cut, counts.held_now) == (1, 1, 0)
                await poll(lambda: relay.link_counts().open == 0)
            nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(relay.close)
    assert relay.problems() == []
