"""The session driver (proxy.session) on real sockets: ordering and connection lifetime, against a
scripted fake upstream.

Real loopback sockets on port 0 (Session dials its upstream itself, with
trio.open_tcp_stream), but no broker: the fake upstream in each test reads request frames and
writes the responses the test scripts, echoing the correlation ids it was sent (kipside may
remap them upstream). Every test runs under an absolute trio.fail_after.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio
import trio.testing

from kipside.protocol import (
    Address,
    ApiKey,
    FrameDecoder,
    decode_response,
    parse_request_header,
    parse_response_header,
    request_correlation_id,
    response_correlation_id,
)
from kipside.protocol.headers import build_frame, encode_request_header, encode_response_header
from kipside.proxy.core.limits import ServerLimits
from kipside.proxy.session.answers import AnswerWriter
from kipside.proxy.session.own_connection import OwnConnection
from kipside.proxy.session.session import Session
from kipside.proxy.stages.pipeline import Stages
from kipside.proxy.stages.versions import VersionPolicy
from kipside.proxy.telemetry.stats import Stats
from kipside.proxy.transport.wire import Wire
from kipside.proxy.upstream.addresses import AddressRewriter
from kipside.proxy.upstream.nodes import NodeMap
from kipside.rules import RuleSet

# Every test runs on trio's autojump clock (the autojump_clock fixture): once every task waits,
# on a socket or a timer, the clock jumps to the next deadline, so "nothing arrives for QUIET"
# costs no real time. Loopback bytes written in this process are readable before it can jump.
TIMEOUT = 10
QUIET = 0.2  # how long "nothing arrives" is watched for


# --------------------------------------------------------------------------- wire helpers


def request(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    return build_frame(encode_request_header(api_key, version, correlation_id, "tests"), body)


def response(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    return build_frame(encode_response_header(api_key, version, correlation_id), body)


def heartbeat_request(correlation_id: int) -> bytes:
    body = bytes.fromhex(
        "000167"  # group id "g"
        "00000001"  # generation 1
        "00016d"  # member id "m"
    )
    return request(ApiKey.HEARTBEAT, 0, correlation_id, body)  # never decoded by kipside


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


def produce_response_body(version: int) -> bytes:
    if version >= 9:
        return b"\x01" + b"\x00\x00\x00\x00" + b"\x00"  # no topics, throttle 0, no tags
    return b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"  # no topics, throttle 0


def produce_response(version: int, correlation_id: int) -> bytes:
    return response(ApiKey.PRODUCE, version, correlation_id, produce_response_body(version))


class FrameReader:
    """Whole frames from one end of a connection."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()

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


def answer_to(forwarded: bytes, api_key: int, version: int, body: bytes) -> bytes:
    """The fake broker's response to a request it received (kipside may remap correlation
    ids upstream, so the broker echoes whatever id it was sent)."""
    return response(api_key, version, request_correlation_id(forwarded), body)


def without_correlation_id(frame: bytes) -> bytes:
    return frame[:8] + frame[12:]


def correlation_ids(frames: list[bytes]) -> list[int]:
    return [response_correlation_id(f) for f in frames]


@dataclass
class Wiring:
    session: Session
    client: FrameReader  # the client's end of its connection to kipside
    upstream_listener: trio.SocketListener  # where the fake broker accepts kipside
    ended: trio.Event  # set when Session.run returned
    _broker: FrameReader | None = None

    async def send(self, *frames: bytes) -> None:
        await self.client.stream.send_all(b"".join(frames))

    async def broker(self) -> FrameReader:
        """The fake broker's end of kipside's upstream connection (accepted on first use)."""
        if self._broker is None:
            self._broker = FrameReader(await self.upstream_listener.accept())
        return self._broker

    async def answer(self, *frames: bytes) -> None:
        await (await self.broker()).stream.send_all(b"".join(frames))

    async def forwarded(self, frame: bytes) -> bytes:
        """Send one request from the client; the frame the fake broker receives for it."""
        await self.send(frame)
        return await (await self.broker()).frame()

    async def client_closed(self) -> bool:
        """Whether kipside closed the client's connection; waits for the session to end."""
        closed = await self.client.closed()
        await self.ended.wait()
        return closed

    async def nothing_forwarded(self) -> bool:
        """Whether kipside sent no request upstream (connected or not)."""
        if self._broker is None:
            with trio.move_on_after(QUIET):
                self._broker = FrameReader(await self.upstream_listener.accept())
            if self._broker is None:
                return True
        return await self._broker.closed()

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.client.stream)
        if self._broker is not None:
            await trio.aclose_forcefully(self._broker.stream)
        await self.upstream_listener.aclose()


@asynccontextmanager
async def wired_session(limits: ServerLimits | None = None) -> AsyncIterator[Wiring]:
    """A Session between a loopback client and a loopback fake upstream, all of it under an
    absolute deadline of TIMEOUT s; `limits`: the server's (the defaults if None)."""
    with trio.fail_after(TIMEOUT):
        (upstream_listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
        (front_listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
        upstream_port = upstream_listener.socket.getsockname()[1]
        front_port = front_listener.socket.getsockname()[1]
        client = await trio.open_tcp_stream("127.0.0.1", front_port)
        accepted = await front_listener.accept()
        await front_listener.aclose()
        nodes = NodeMap(advertise_host="127.0.0.1", node_port_base=None)
        limits = limits or ServerLimits(lambda: RuleSet().limits, Stats())
        versions = VersionPolicy()
        pipeline = Stages.build(RuleSet, versions, None).pipeline(RuleSet())
        session = Session(
            Wire.from_stream(accepted),
            pipeline=lambda: pipeline,
            own=OwnConnection(
                [Address("127.0.0.1", upstream_port)],
                max_frame_bytes=1 << 20,
                stats=limits.stats,
                connect_timeout=5,
            ),
            writer=AnswerWriter(versions, AddressRewriter(nodes), limits.stats),
            limits=limits,
            max_frame_bytes=1 << 20,
        )
        ended = trio.Event()

        async def run() -> None:
            await session.run()
            ended.set()

        wiring = Wiring(session, FrameReader(client), upstream_listener, ended)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            try:
                yield wiring
            finally:
                await wiring.aclose()


# --------------------------------------------------------------------------- ordering

API_VERSIONS_REQUEST_BODY = bytes.fromhex("000000")  # compact empty name and version, no tags


async def test_responses_in_request_order_around_a_local_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with wired_session() as w:
        api_versions_v3 = request(ApiKey.API_VERSIONS, 3, 4, API_VERSIONS_REQUEST_BODY)
        await w.send(
            heartbeat_request(1),
            request(ApiKey.API_VERSIONS, 5, 2, API_VERSIONS_REQUEST_BODY),
            heartbeat_request(-2147483648),
            api_versions_v3,
        )
        # Upstream sees only the forwarded requests, otherwise unchanged, in order.
        broker = await w.broker()
        forwarded = await broker.frames(3)
        assert [without_correlation_id(f) for f in forwarded] == [
            without_correlation_id(f)
            for f in (heartbeat_request(1), heartbeat_request(-2147483648), api_versions_v3)
        ]
        assert len({request_correlation_id(f) for f in forwarded}) == 3
        # The locally answered ApiVersions v5 must wait behind the unanswered request 1.
        assert await w.client.quiet()

        broker_versions = answer_to(
            forwarded[2],
            ApiKey.API_VERSIONS,
            3,
            bytes.fromhex(
                "0000"  # error_code
                "03"  # two entries (compact array)
                "00120000000500"  # ApiVersions v0-5, no tags
                "000c0000000400"  # Heartbeat v0-4, no tags
                "00000000"  # throttle
                "00"  # no tags
            ),
        )
        await w.answer(answer_to(forwarded[0], ApiKey.HEARTBEAT, 0, b"\x00\x00"))
        await w.answer(answer_to(forwarded[1], ApiKey.HEARTBEAT, 0, b"\x00\x00"), broker_versions)

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
        assert await broker.closed()


async def test_local_answer_first_is_sent_at_once(autojump_clock: trio.testing.MockClock) -> None:
    async with wired_session() as w:
        await w.send(request(ApiKey.API_VERSIONS, 7, 99, API_VERSIONS_REQUEST_BODY))
        assert await w.client.frame() == VersionPolicy().unsupported_response(99)
        await w.send(heartbeat_request(100))
        forwarded = await (await w.broker()).frame()
        assert parse_request_header(forwarded).api_key == ApiKey.HEARTBEAT
        await w.answer(answer_to(forwarded, ApiKey.HEARTBEAT, 0, b"\x00\x00"))
        assert await w.client.frame() == heartbeat_response(100)


# --------------------------------------------------------------------------- acks=0


@pytest.mark.parametrize("version", [3, 8, 9, 11])
async def test_acks0_produce_gets_no_response(
    version: int, autojump_clock: trio.testing.MockClock
) -> None:
    async with wired_session() as w:
        await w.send(produce_request(version, 1, acks=0), heartbeat_request(2))
        broker = await w.broker()
        produce, heartbeat = await broker.frames(2)
        assert without_correlation_id(produce) == without_correlation_id(
            produce_request(version, 1, acks=0)
        )
        assert parse_request_header(heartbeat).api_key == ApiKey.HEARTBEAT
        # A broker never answers acks=0; the next response must still reach the client.
        await w.answer(answer_to(heartbeat, ApiKey.HEARTBEAT, 0, b"\x00\x00"))
        assert await w.client.frame() == heartbeat_response(2)

        # acks=1 and acks=-1 are answered as usual, in order.
        await w.send(produce_request(version, 3, acks=1), produce_request(version, 4, acks=-1))
        first, second = await broker.frames(2)
        await w.answer(
            answer_to(first, ApiKey.PRODUCE, version, produce_response_body(version)),
            answer_to(second, ApiKey.PRODUCE, version, produce_response_body(version)),
        )
        assert await w.client.frames(2) == [
            produce_response(version, 3),
            produce_response(version, 4),
        ]
        assert await w.client.quiet()
        assert not w.ended.is_set()


# --------------------------------------------------------------------------- upstream EOF


async def test_upstream_closing_mid_flight_closes_the_client(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    caplog.set_level(logging.INFO, logger="kipside")
    async with wired_session() as w:
        await w.send(heartbeat_request(1), heartbeat_request(2))
        broker = await w.broker()
        first, _second = await broker.frames(2)
        await w.answer(answer_to(first, ApiKey.HEARTBEAT, 0, b"\x00\x00"))
        await broker.stream.aclose()  # request 2 is never answered

        assert await w.client.frame() == heartbeat_response(1)
        assert await w.client_closed()
    assert "closed the connection" in caplog.text


async def test_upstream_closing_before_any_answer_closes_the_client(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with wired_session() as w:
        await w.forwarded(heartbeat_request(1))
        await (await w.broker()).stream.aclose()
        assert await w.client_closed()


async def test_upstream_lost_under_many_requests_logs_one_line(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    """A client with 20 requests in flight when its broker connection drops is closed with
    one log line, not one per request (a slow reader's 64 Fetches logged 64)."""
    caplog.set_level(logging.INFO, logger="kipside")
    async with wired_session() as w:
        await w.send(*(heartbeat_request(i) for i in range(20)))
        broker = await w.broker()
        await broker.frames(20)
        await broker.stream.aclose()
        assert await w.client_closed()
    lines = [r.getMessage() for r in caplog.records if "closing so the client" in r.getMessage()]
    assert len(lines) == 1, lines


async def test_upstream_answering_the_wrong_correlation_id_closes_the_client(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    caplog.set_level(logging.INFO, logger="kipside")
    async with wired_session() as w:
        forwarded = await w.forwarded(heartbeat_request(1))
        wrong = request_correlation_id(forwarded) + 77
        await w.answer(heartbeat_response(wrong))
        assert await w.client_closed()
    assert f"correlation id {wrong}" in caplog.text


# --------------------------------------------------------------------------- client garbage


@pytest.mark.parametrize(
    ("garbage", "mentions"),
    [
        (b"GET / HTTP/1.1\r\nHost: kafka:9092\r\n\r\n", ["HTTP", "GET / HTTP/1.1"]),
        (bytes.fromhex("1603010200010001fc0303"), ["TLS"]),  # a ClientHello's first bytes
        (bytes.fromhex("00000002abcd"), ["frame size 2", "8-byte minimum"]),
        (bytes.fromhex("7fffffff00"), ["frame size 2147483647", "cap"]),
        # size 8, api key -1, version 0, correlation id 1
        (bytes.fromhex("00000008ffff000000000001"), ["malformed request", "api key -1"]),
    ],
    ids=["http", "tls", "tiny-frame", "huge-frame", "bad-header"],
)
async def test_client_garbage_closes_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
    garbage: bytes,
    mentions: list[str],
    autojump_clock: trio.testing.MockClock,
) -> None:
    caplog.set_level(logging.INFO, logger="kipside")
    async with wired_session() as w:
        await w.send(garbage)
        assert await w.client_closed()
        assert await w.nothing_forwarded()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    matching = [line for line in lines if all(m in line for m in mentions)]
    assert matching, f"no warning mentions {mentions}: {lines}"
    assert "127.0.0.1:" in matching[0]  # who sent it


async def test_garbage_after_a_good_request_still_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with wired_session() as w:
        forwarded = await w.forwarded(heartbeat_request(1))
        assert parse_request_header(forwarded).api_key == ApiKey.HEARTBEAT
        await w.send(bytes.fromhex("0000000100"))
        assert await w.client_closed()
        assert await (await w.broker()).closed()
