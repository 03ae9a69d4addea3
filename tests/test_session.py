"""Tests for proxy.session: ordering and connection lifetime, against a scripted fake upstream.

Real loopback sockets on port 0 (Session dials upstream itself), but no broker: the fake
upstream in each test reads request frames and writes the response frames the test scripts.
Every test runs under an absolute trio.fail_after.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio

from protocol.apis import ApiKey
from protocol.framing import FrameDecoder
from protocol.headers import (
    build_frame,
    encode_request_header,
    encode_response_header,
    parse_request_header,
    parse_response_header,
    request_correlation_id,
    response_correlation_id,
)
from protocol.messages import decode_response
from proxy.addresses import AddressRewriter
from proxy.nodes import Address, NodeMap
from proxy.session import Session
from proxy.versions import VersionPolicy

TIMEOUT = 10
QUIET = 0.2  # how long "nothing arrives" is watched for


# --------------------------------------------------------------------------- wire helpers


def request(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    return build_frame(encode_request_header(api_key, version, correlation_id, "tests"), body)


def response(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    return build_frame(encode_response_header(api_key, version, correlation_id), body)


def heartbeat_request(correlation_id: int) -> bytes:
    # group "g", generation 1, member "m" (Heartbeat v0, never decoded by kipside)
    return request(ApiKey.HEARTBEAT, 0, correlation_id, bytes.fromhex("000167" "00000001" "00016d"))


def heartbeat_response(correlation_id: int) -> bytes:
    return response(ApiKey.HEARTBEAT, 0, correlation_id, b"\x00\x00")  # error_code NONE


def produce_request(version: int, correlation_id: int, acks: int) -> bytes:
    acks_bytes = acks.to_bytes(2, "big", signed=True)
    timeout = (30000).to_bytes(4, "big")
    if version >= 9:  # flexible: compact null transactional id, compact empty topics, no tags
        body = b"\x00" + acks_bytes + timeout + b"\x01" + b"\x00"
    else:  # v3-v8: int16 null transactional id, int32 empty topics
        body = b"\xff\xff" + acks_bytes + timeout + b"\x00\x00\x00\x00"
    return request(ApiKey.PRODUCE, version, correlation_id, body)


def produce_response(version: int, correlation_id: int) -> bytes:
    if version >= 9:
        body = b"\x01" + b"\x00\x00\x00\x00" + b"\x00"  # no topics, throttle 0, no tags
    else:
        body = b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
    return response(ApiKey.PRODUCE, version, correlation_id, body)


class FrameReader:
    """Whole frames from one end of a connection."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()
        self.eof = False

    async def frame(self) -> bytes:
        while (frame := self.decoder.next_frame()) is None:
            data = await self.stream.receive_some(65536)
            if not data:
                raise AssertionError("connection closed while a frame was expected")
            self.decoder.receive_data(data)
        return frame

    async def frames(self, count: int) -> list[bytes]:
        return [await self.frame() for _ in range(count)]

    async def closed(self) -> bool:
        """Whether the peer closed (FIN or RST) with nothing more sent."""
        if self.decoder.buffered:
            return False
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            return True
        return data == b""

    async def quiet(self) -> bool:
        """Whether nothing arrives for a while."""
        with trio.move_on_after(QUIET):
            await self.frame()
            return False
        return True


@dataclass
class Wiring:
    session: Session
    client: FrameReader  # the client's end of its connection to kipside
    broker: FrameReader  # the fake upstream's end of kipside's upstream connection
    ended: trio.Event  # set when Session.run returned

    async def send(self, *frames: bytes) -> None:
        await self.client.stream.send_all(b"".join(frames))

    async def answer(self, *frames: bytes) -> None:
        await self.broker.stream.send_all(b"".join(frames))


@asynccontextmanager
async def wired_session() -> AsyncIterator[Wiring]:
    """A Session between a loopback client and a loopback fake upstream."""
    (upstream_listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    (front_listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    upstream_port = upstream_listener.socket.getsockname()[1]
    front_port = front_listener.socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", front_port)
    accepted = await front_listener.accept()
    await front_listener.aclose()
    nodes = NodeMap(advertise_host="127.0.0.1", node_port_base=None)
    session = Session(
        accepted,
        [Address("127.0.0.1", upstream_port)],
        rewriter=AddressRewriter(nodes),
        versions=VersionPolicy(),
        max_frame_bytes=1 << 20,
        connect_timeout=5,
    )
    ended = trio.Event()

    async def run() -> None:
        await session.run()
        ended.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        broker = await upstream_listener.accept()
        await upstream_listener.aclose()
        try:
            yield Wiring(session, FrameReader(client), FrameReader(broker), ended)
        finally:
            await trio.aclose_forcefully(client)
            await trio.aclose_forcefully(broker)


def correlation_ids(frames: list[bytes]) -> list[int]:
    return [response_correlation_id(f) for f in frames]


# --------------------------------------------------------------------------- ordering


async def test_responses_in_request_order_around_a_local_answer() -> None:
    with trio.fail_after(TIMEOUT):
        async with wired_session() as w:
            api_versions_v3 = request(ApiKey.API_VERSIONS, 3, 4, bytes.fromhex("00" "00" "00"))
            await w.send(
                heartbeat_request(1),
                request(ApiKey.API_VERSIONS, 5, 2, bytes.fromhex("00" "00" "00")),
                heartbeat_request(-2147483648),
                api_versions_v3,
            )
            # Upstream sees only the forwarded requests, unchanged and in order.
            forwarded = await w.broker.frames(3)
            assert forwarded == [heartbeat_request(1), heartbeat_request(-2147483648), api_versions_v3]
            # The locally answered ApiVersions v5 must wait behind the unanswered request 1.
            assert await w.client.quiet()

            broker_versions = response(
                ApiKey.API_VERSIONS,
                3,
                4,
                bytes.fromhex(
                    "0000"  # error_code
                    "03"  # two entries (compact)
                    "0012" "0000" "0005" "00"  # ApiVersions v0-5
                    "000c" "0000" "0004" "00"  # Heartbeat v0-4
                    "00000000"  # throttle
                    "00"  # no tags
                ),
            )
            await w.answer(heartbeat_response(1))
            await w.answer(heartbeat_response(-2147483648), broker_versions)

            received = await w.client.frames(4)
            assert correlation_ids(received) == [1, 2, -2147483648, 4]
            assert received[0] == heartbeat_response(1)
            assert received[1] == VersionPolicy().unsupported_response(2)
            assert received[2] == heartbeat_response(-2147483648)
            header = parse_response_header(received[3], ApiKey.API_VERSIONS, 3)
            rewritten = decode_response(ApiKey.API_VERSIONS, 3, received[3], header.body_offset)
            assert [(e.api_key, e.min_version, e.max_version) for e in rewritten.api_keys] == [
                (18, 0, 4),
                (12, 0, 4),
            ]
            assert await w.client.quiet()

            # The client leaving ends the session and its upstream connection.
            await w.client.stream.aclose()
            await w.ended.wait()
            assert await w.broker.closed()


async def test_local_answer_first_is_sent_at_once() -> None:
    with trio.fail_after(TIMEOUT):
        async with wired_session() as w:
            await w.send(request(ApiKey.API_VERSIONS, 7, 99, bytes.fromhex("000000")))
            assert await w.client.frame() == VersionPolicy().unsupported_response(99)
            await w.send(heartbeat_request(100))
            assert parse_request_header(await w.broker.frame()).correlation_id == 100
            await w.answer(heartbeat_response(100))
            assert await w.client.frame() == heartbeat_response(100)


# --------------------------------------------------------------------------- acks=0


@pytest.mark.parametrize("version", [3, 8, 9, 11])
async def test_acks0_produce_gets_no_response(version: int) -> None:
    with trio.fail_after(TIMEOUT):
        async with wired_session() as w:
            await w.send(produce_request(version, 1, acks=0), heartbeat_request(2))
            forwarded = await w.broker.frames(2)
            assert [request_correlation_id(f) for f in forwarded] == [1, 2]
            assert forwarded[0] == produce_request(version, 1, acks=0)
            # A broker never answers acks=0; the next response must still reach the client.
            await w.answer(heartbeat_response(2))
            assert await w.client.frame() == heartbeat_response(2)

            # acks=1 and acks=-1 are answered as usual, in order.
            await w.send(produce_request(version, 3, acks=1), produce_request(version, 4, acks=-1))
            assert [request_correlation_id(f) for f in await w.broker.frames(2)] == [3, 4]
            await w.answer(produce_response(version, 3), produce_response(version, 4))
            assert correlation_ids(await w.client.frames(2)) == [3, 4]
            assert await w.client.quiet()
            assert not w.ended.is_set()


# --------------------------------------------------------------------------- upstream EOF


async def test_upstream_closing_mid_flight_closes_the_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kipside")
    with trio.fail_after(TIMEOUT):
        async with wired_session() as w:
            await w.send(heartbeat_request(1), heartbeat_request(2))
            assert correlation_ids(await w.broker.frames(2)) == [1, 2]
            await w.answer(heartbeat_response(1))
            await w.broker.stream.aclose()  # request 2 is never answered

            assert await w.client.frame() == heartbeat_response(1)
            assert await w.client.closed()
            await w.ended.wait()
    assert "closed the connection" in caplog.text


async def test_upstream_closing_before_any_answer_closes_the_client() -> None:
    with trio.fail_after(TIMEOUT):
        async with wired_session() as w:
            await w.send(heartbeat_request(1))
            await w.broker.frame()
            await w.broker.stream.aclose()
            assert await w.client.closed()
            await w.ended.wait()


async def test_upstream_answering_the_wrong_correlation_id_closes_the_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kipside")
    with trio.fail_after(TIMEOUT):
        async with wired_session() as w:
            await w.send(heartbeat_request(1))
            await w.broker.frame()
            await w.answer(heartbeat_response(77))
            assert await w.client.closed()
            await w.ended.wait()
    assert "correlation id 77" in caplog.text


# --------------------------------------------------------------------------- client garbage


@pytest.mark.parametrize(
    ("garbage", "mentions"),
    [
        (b"GET / HTTP/1.1\r\nHost: kafka:9092\r\n\r\n", ["HTTP", "GET / HTTP/1.1"]),
        (bytes.fromhex("160301020001 0001fc0303".replace(" ", "")), ["TLS"]),
        (bytes.fromhex("00000002" "abcd"), ["frame size 2", "8-byte minimum"]),
        (bytes.fromhex("7fffffff" "00"), ["frame size 2147483647", "cap"]),
        (bytes.fromhex("00000008" "ffff0000" "00000001"), ["malformed request", "api key -1"]),
    ],
    ids=["http", "tls", "tiny-frame", "huge-frame", "bad-header"],
)
async def test_client_garbage_closes_with_a_log_line(
    caplog: pytest.LogCaptureFixture, garbage: bytes, mentions: list[str]
) -> None:
    caplog.set_level(logging.INFO, logger="kipside")
    with trio.fail_after(TIMEOUT):
        async with wired_session() as w:
            await w.send(garbage)
            assert await w.client.closed()
            await w.ended.wait()
            assert await w.broker.closed()  # nothing was forwarded
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    matching = [line for line in lines if all(m in line for m in mentions)]
    assert matching, f"no warning mentions {mentions}: {lines}"
    assert "127.0.0.1:" in matching[0]  # who sent it


async def test_garbage_after_a_good_request_still_closes() -> None:
    with trio.fail_after(TIMEOUT):
        async with wired_session() as w:
            await w.send(heartbeat_request(1))
            assert request_correlation_id(await w.broker.frame()) == 1
            await w.send(bytes.fromhex("00000001" "00"))
            assert await w.client.closed()
            await w.ended.wait()
