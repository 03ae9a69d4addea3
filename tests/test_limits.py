"""The rule file's limits, enforced by kipside.proxy.network.limits and .deadlines.

Socket-free where the behaviour lives in one object (the reporter, the deadlines on trio's
autojump clock, the in-flight accounting against a stand-in connection, the protocol caps);
a real Session between loopback sockets (tests/test_session.py's wiring) where it is what a
client sees: closed when idle or slow, closed on a hostile header, not read while it does
not read its answers. Every test has an absolute trio.fail_after (TIMEOUT) or runs no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import cast

import pytest
import trio
import trio.testing
from test_session import (
    API_VERSIONS_REQUEST_BODY,
    TIMEOUT,
    answer_to,
    heartbeat_request,
    wired_session,
    without_correlation_id,
)

from kipside.protocol import (
    ApiKey,
    DecodeLimits,
    LimitExceeded,
    PartitionBatch,
    build_frame,
    encode_produce_request,
    encode_request_header,
    parse_produce_request,
    parse_request_header,
    request_body_offset,
    response_correlation_id,
)
from kipside.proxy.features.principals import PrincipalRules
from kipside.proxy.network.deadlines import IDLE, REQUEST_READ, Deadlines
from kipside.proxy.network.hooks import RoutedClient
from kipside.proxy.network.identity import ANONYMOUS, Principal
from kipside.proxy.network.limits import (
    IN_FLIGHT,
    IN_FLIGHT_PER_CLIENT,
    REQUEST_OVERHEAD_BYTES,
    ClientLimits,
    LimitReporter,
    ServerLimits,
)
from kipside.proxy.network.wire import READ_SIZE
from kipside.proxy.telemetry.stats import Stats
from kipside.rules import Limits, RuleSet, parse_rules

# ------------------------------------------------------------------------- the log and count


def test_a_flood_logs_one_line_per_limit_every_interval_and_counts_every_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kipside.limits")
    stats, now = Stats(), [100.0]
    reporter = LimitReporter(stats, interval=10.0, clock=lambda: now[0])
    for i in range(1000):
        reporter.reached("max_connections", f"refusing client {i}")
    reporter.reached("idle_timeout_ms", "idle client", level=logging.INFO)
    now[0] += 9.9
    reporter.reached("max_connections", "refusing client 1000")
    now[0] += 0.2
    reporter.reached("max_connections", "refusing client 1001")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "refusing client 0"),
        (logging.INFO, "idle client"),
        (
            logging.WARNING,
            "refusing client 1001 (1000 more of limits.max_connections in the last 10 s unlogged)",
        ),
    ]
    assert stats.limit_reached == {"max_connections": 1002, "idle_timeout_ms": 1}


# ------------------------------------------------------------------------- deadlines


@dataclass
class Watched:
    """Deadlines under test, with what they reported."""

    limits: Limits
    busy: bool = False
    expired: list[tuple[str, float, int]] = field(default_factory=list)

    def deadlines(self) -> Deadlines:
        def expire(key: str, seconds: float, partial: int) -> None:
            self.expired.append((key, round(trio.current_time() - START, 3), partial))

        return Deadlines(lambda: self.limits, lambda: self.busy, expire)

    @asynccontextmanager
    async def watching(self) -> AsyncIterator[Deadlines]:
        """The deadlines, watched from the block's start until they expire (the block's end
        waits for that)."""
        deadlines = self.deadlines()
        with trio.fail_after(TIMEOUT * 10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(deadlines.watch)
                yield deadlines


START = 0.0  # trio's MockClock starts at 0


async def test_idle_connection_closes_after_the_idle_timeout_and_not_while_it_is_owed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    watched = Watched(Limits(idle_timeout_ms=5000, request_read_timeout_ms=0), busy=True)
    async with watched.watching() as deadlines:
        await trio.sleep(12)  # owed answers all along: never idle
        assert watched.expired == []
        watched.busy = False  # at 12 s; last counted busy at 10 s
        await trio.sleep(1)
        deadlines.read(0, completed=True)  # a request at 13 s
    # Idle from 13 s: closed at 18 s, not at 15 s.
    assert watched.expired == [(IDLE, 18.0, 0)]


async def test_a_request_not_whole_within_the_read_timeout_closes_even_if_bytes_trickle(
    autojump_clock: trio.testing.MockClock,
) -> None:
    watched = Watched(Limits(idle_timeout_ms=0, request_read_timeout_ms=2000))
    async with watched.watching() as deadlines:
        await trio.sleep(1)
        deadlines.read(5, completed=False)  # a request begins at 1 s
        for partial in range(6, 30):  # a byte every 0.1 s: still the same request
            await trio.sleep(0.1)
            deadlines.read(partial, completed=False)
    assert watched.expired == [(REQUEST_READ, 3.0, 24)]


async def test_a_whole_request_restarts_the_clock_and_a_paused_reader_stops_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    watched = Watched(Limits(idle_timeout_ms=0, request_read_timeout_ms=2000))
    async with watched.watching() as deadlines:
        deadlines.read(10, completed=False)  # begins at 0
        await trio.sleep(1.5)
        deadlines.read(4, completed=True)  # whole at 1.5 s; the next begins
        await trio.sleep(1.5)
        deadlines.pause()  # kipside stops reading at 3 s: not the client's fault
        await trio.sleep(30)
        assert watched.expired == []
        deadlines.resume(4)  # reading again at 33 s
    assert watched.expired == [(REQUEST_READ, 35.0, 4)]


async def test_a_reload_applies_a_shorter_timeout_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    watched = Watched(Limits(idle_timeout_ms=600_000, request_read_timeout_ms=0))
    async with watched.watching() as deadlines:
        await trio.sleep(10)
        watched.limits = replace(watched.limits, idle_timeout_ms=3000)
        deadlines.reconsider()
    assert watched.expired == [(IDLE, 10.0, 0)]  # idle for 10 s already: over 3 s


# ------------------------------------------------------------------------- in-flight bytes


class StandIn:
    """A connection's backlog, as the limits see a Wire."""

    def __init__(self) -> None:
        self.report: Callable[[int], None] = lambda _delta: None

    def on_backlog(self, callback: Callable[[int], None]) -> None:
        self.report = callback


@dataclass
class Clients:
    limits: Limits
    stats: Stats = field(default_factory=Stats)
    closed: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.server = ServerLimits(lambda: self.limits, self.stats)

    def client(self, name: str, wire: StandIn | None = None) -> ClientLimits:
        return self.server.client(wire or StandIn(), lambda: f"client {name}", lambda: None)


async def paused(room: Callable[[], object]) -> bool:
    """Whether waiting for room blocks (for a second of trio time)."""
    with trio.move_on_after(1):
        await room()  # type: ignore[misc]
        return False
    return True


async def test_a_client_over_its_limit_is_not_read_until_its_answers_are_taken(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    clients = Clients(Limits(max_in_flight_bytes_per_client=4096))
    wire = StandIn()
    client = clients.client("127.0.0.1:5555", wire)
    with trio.fail_after(TIMEOUT * 10):
        charged = client.took(3000)
        assert charged == 3000 + REQUEST_OVERHEAD_BYTES
        assert client.over() is None
        client.arrived(1000)  # its answer came; not written yet
        assert client.over() == IN_FLIGHT_PER_CLIENT
        assert await paused(lambda: client.room(0))
        assert clients.stats.limit_reached[IN_FLIGHT_PER_CLIENT] == 1
        assert "client 127.0.0.1:5555" in caplog.text
        assert "limits.max_in_flight_bytes_per_client (4096)" in caplog.text
        client.written(charged, 1000)
        wire.report(+9000)  # the socket did not take all of an answer: 9000 bytes unsent
        assert clients.stats.in_flight_bytes == 9000
        async with trio.open_nursery() as nursery:

            async def reader() -> None:
                started = trio.current_time()
                await client.room(0)
                assert trio.current_time() - started == pytest.approx(2.0, abs=0.01)

            nursery.start_soon(reader)
            await trio.sleep(1)
            assert clients.stats.paused_client_connections == 1
            wire.report(-2000)  # the client reads a little: 7000, still over
            await trio.sleep(1)
            wire.report(-3000)  # and more: 4000, the reader goes on at once
            await trio.sleep(1)
            wire.report(-4000)
        assert clients.stats.paused_client_connections == 0
        assert clients.stats.in_flight_bytes == 0


async def test_its_own_broker_connection_waits_only_on_answers_the_socket_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clients = Clients(Limits(max_in_flight_bytes_per_client=4096))
    wire = StandIn()
    client = clients.client("a", wire)
    with trio.fail_after(TIMEOUT * 10):
        client.took(8000)
        client.arrived(8000)  # e.g. waiting behind an answer still to come on that connection
        assert client.over() == IN_FLIGHT_PER_CLIENT
        assert not await paused(client.answers_room)  # else that answer would never come
        client.written(8000 + REQUEST_OVERHEAD_BYTES, 8000)
        wire.report(+8000)  # written, but the client is not reading
        assert await paused(client.answers_room)
        wire.report(-8000)
        assert not await paused(client.answers_room)


async def test_over_the_total_only_clients_above_an_equal_share_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clients = Clients(Limits(max_in_flight_bytes=1 << 20, max_in_flight_bytes_per_client=1 << 30))
    hog, small = clients.client("hog"), clients.client("small")  # an equal share: 512 KiB
    with trio.fail_after(TIMEOUT * 10):
        hog_bytes = hog.took(1_200_000)
        small.took(100)
        assert hog.over() == IN_FLIGHT
        assert small.over() is None  # the producer with its request out keeps being read
        assert not await paused(lambda: small.room(0))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hog.room, 0)
            await trio.sleep(1)
            assert clients.stats.paused_client_connections == 1
            hog.written(hog_bytes, 0)  # answered: the total is back under the limit
        assert clients.stats.limit_reached == {IN_FLIGHT: 1}
        small.close()
        hog.close()
    assert clients.stats.in_flight_bytes == 0
    assert clients.server.peak_in_flight == 1_200_000 + 100 + 2 * REQUEST_OVERHEAD_BYTES


async def test_a_reload_that_raises_the_limit_wakes_a_paused_client(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kipside.limits")
    clients = Clients(Limits(max_in_flight_bytes_per_client=4096))
    client = clients.client("a")
    with trio.fail_after(TIMEOUT * 10):
        client.took(8000)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.room, 0)
            await trio.sleep(1)
            old = RuleSet(limits=clients.limits)
            clients.limits = Limits(max_in_flight_bytes_per_client=1 << 20)
            clients.server.rules_changed(old, RuleSet(limits=clients.limits))
        assert trio.current_time() == pytest.approx(1.0, abs=0.01)
    assert [r.getMessage() for r in caplog.records if "changed" in r.getMessage()] == [
        "limits.max_in_flight_bytes_per_client changed from 4096 to 1048576: in force now"
    ]


# ------------------------------------------------------------------------- protocol caps

CAPS = DecodeLimits(max_tagged_fields=4, max_tagged_field_bytes=64, max_partitions=10)


def api_versions_with_header_tags(tags: list[bytes]) -> bytes:
    """An ApiVersions v3 request (header v2) whose header carries these tagged fields."""
    header = encode_request_header(ApiKey.API_VERSIONS, 3, 9, "tests")[:-1]  # no tag count
    section = bytes([len(tags)]) + b"".join(
        bytes([i, len(value)]) + value for i, value in enumerate(tags)
    )
    return build_frame(header + section, API_VERSIONS_REQUEST_BODY)


@pytest.mark.parametrize(
    ("tags", "limit"),
    [([b""] * 5, "max_tagged_fields"), ([b"x" * 65], "max_tagged_field_bytes"), ([b""] * 4, None)],
    ids=["five-tags", "65-byte-tag", "within"],
)
def test_request_header_tagged_fields_are_capped(tags: list[bytes], limit: str | None) -> None:
    frame = api_versions_with_header_tags(tags)
    if limit is None:
        assert parse_request_header(frame, CAPS).body_offset == request_body_offset(frame)
        return
    with pytest.raises(LimitExceeded) as caught:
        parse_request_header(frame, CAPS)
    assert caught.value.limit == limit
    assert parse_request_header(frame).api_key == ApiKey.API_VERSIONS  # no caps: read as ever


def produce_frame(version: int, topics: int, partitions: int) -> bytes:
    batches = [
        PartitionBatch(f"t{t}", p, memoryview(b""))
        for t in range(topics)
        for p in range(partitions)
    ]
    header = encode_request_header(ApiKey.PRODUCE, version, 1, "tests")
    body = encode_produce_request(version, acks=1, timeout_ms=1000, partitions=batches)
    return build_frame(header, b"".join(bytes(chunk) for chunk in body))


@pytest.mark.parametrize("version", [8, 9])
@pytest.mark.parametrize(
    ("topics", "partitions", "refused"),
    [(1, 10, None), (1, 11, "partitions"), (11, 1, "topics"), (6, 2, "partitions")],
)
def test_produce_topics_and_partitions_are_capped(
    version: int, topics: int, partitions: int, refused: str | None
) -> None:
    frame = produce_frame(version, topics, partitions)
    offset = parse_request_header(frame).body_offset
    if refused is None:
        assert len(parse_produce_request(frame, offset, version, CAPS).partitions) == 10
        return
    with pytest.raises(LimitExceeded, match=refused) as caught:
        parse_produce_request(frame, offset, version, CAPS)
    assert caught.value.limit == "max_partitions"


def test_a_principal_check_does_not_let_a_request_over_a_cap_through() -> None:
    # A request kipside cannot read is let through for the broker to answer; one over a cap
    # must not be, or 11 partitions would slip past a principal's topic restriction.
    rules = parse_rules(
        'limits: {max_partitions_per_request: 10}\nprincipals: [{principal: "*", topics: [t0]}]',
        "p.yaml",
    )
    check = PrincipalRules(lambda: rules)
    client = cast(RoutedClient, _Client())
    within, over = produce_frame(9, 1, 10), produce_frame(9, 1, 11)
    assert check.refusal(client, within, parse_request_header(within)) is None
    with pytest.raises(LimitExceeded):
        check.refusal(client, over, parse_request_header(over))


@dataclass(eq=False)  # hashable, as a session is
class _Client:
    principal: Principal = ANONYMOUS

    def describe(self) -> str:
        return "client 127.0.0.1:1"


# ------------------------------------------------------------------------- a real session


def server_limits(**limits: int) -> ServerLimits:
    chosen = Limits(**limits)
    return ServerLimits(lambda: chosen, Stats())


async def test_an_idle_client_is_closed_and_one_that_is_owed_an_answer_is_not(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kipside.limits")
    limits = server_limits(idle_timeout_ms=2000)
    async with wired_session(limits) as w:
        forwarded = await w.forwarded(heartbeat_request(1))
        await trio.sleep(5)  # the broker takes 5 s: owed an answer, so not idle
        await w.answer(answer_to(forwarded, ApiKey.HEARTBEAT, 0, b"\x00\x00"))
        await w.client.frame()
        answered_at = trio.current_time()
        assert await w.client_closed()
        assert trio.current_time() - answered_at == pytest.approx(2.0, abs=0.05)
    assert limits.stats.limit_reached == {IDLE: 1}
    line = next(r for r in caplog.records if "idle" in r.getMessage())
    assert line.levelno == logging.INFO
    assert "client 127.0.0.1:" in line.getMessage()
    assert "limits.idle_timeout_ms = 2000" in line.getMessage()


async def test_a_client_that_starts_a_request_and_stalls_is_closed(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    limits = server_limits(request_read_timeout_ms=1000)
    async with wired_session(limits) as w:
        frame = heartbeat_request(7)
        await w.send(frame[:7])  # the size and part of the header: then nothing
        started = trio.current_time()
        assert await w.client_closed()
        assert trio.current_time() - started == pytest.approx(1.0, abs=0.05)
        assert await w.nothing_forwarded()
    assert limits.stats.limit_reached == {REQUEST_READ: 1}
    assert "has sent 7 bytes of it" in caplog.text
    assert "limits.request_read_timeout_ms = 1000" in caplog.text


@pytest.mark.parametrize(
    ("tags", "key"),
    [([b""] * 65, "max_tagged_fields"), ([b"x" * 100], "max_tagged_field_bytes")],
    ids=["65-tags", "100-byte-tag"],
)
async def test_a_request_header_over_a_tagged_field_cap_closes_the_client(
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    tags: list[bytes],
    key: str,
) -> None:
    limits = server_limits(max_tagged_field_bytes=64)
    async with wired_session(limits) as w:
        within = api_versions_with_header_tags([b"ok"] * 3)
        forwarded = await w.forwarded(within)  # under the caps: forwarded unchanged
        assert without_correlation_id(forwarded) == without_correlation_id(within)
        await w.send(api_versions_with_header_tags(tags))
        assert await w.client_closed()
    assert limits.stats.limit_reached == {key: 1}
    assert "sent an ApiVersions request over" in caplog.text
    assert f"over limits.{key}" in caplog.text


async def test_an_oversized_request_frame_is_a_limit(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    limits = server_limits()
    async with wired_session(limits) as w:  # its frame cap is 1 MiB
        await w.send((2 << 20).to_bytes(4, "big") + bytes(64))
        assert await w.client_closed()
        assert await w.nothing_forwarded()
    assert limits.stats.limit_reached == {"max_frame_bytes": 1}
    assert "frame size 2097152, over limits.max_frame_bytes" in caplog.text


async def test_a_broker_answer_over_the_frame_cap_closes_that_connection_and_says_so(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    limits = server_limits()
    async with wired_session(limits) as w:  # its frame cap is 1 MiB
        forwarded = await w.forwarded(heartbeat_request(3))
        oversized = (2 << 20).to_bytes(4, "big") + forwarded[8:12]  # size, correlation id
        await w.answer(oversized)
        assert await w.client_closed()  # its broker connection is gone: the client retries
    assert limits.stats.limit_reached == {"max_frame_bytes": 1}
    assert (
        "the broker sent a response to Heartbeat v0 of 2097152 bytes, over "
        "limits.max_frame_bytes (1048576)" in caplog.text
    )


async def test_a_client_that_does_not_read_its_answers_is_not_read_until_it_does(
    autojump_clock: trio.testing.MockClock,
) -> None:
    per_client = 64 * 1024
    answer_body = bytes(16 * 1024)  # the fake broker's answers are big, the requests small
    count = 500
    limits = server_limits(max_in_flight_bytes_per_client=per_client)
    stats = limits.stats
    received = 0
    async with wired_session(limits) as w:

        async def broker_answers() -> None:
            nonlocal received
            broker = await w.broker()
            while received < count:
                forwarded = await broker.frame()
                received += 1
                await w.answer(answer_to(forwarded, ApiKey.HEARTBEAT, 0, answer_body))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(broker_answers)
            await w.send(*(heartbeat_request(i) for i in range(count)))  # the kernel takes all
            await trio.sleep(1)  # everything that can move has moved
            # What kipside held passed the limit by no more than one read of answers from its
            # broker connection and one answer: the rest waits in the sockets, unread.
            assert per_client < limits.peak_in_flight <= per_client + READ_SIZE + len(answer_body)
            assert received < count  # kipside stopped reading the client
            assert stats.paused_client_connections == 1
            assert stats.limit_reached[IN_FLIGHT_PER_CLIENT] >= 1
            # The client reads: every answer comes, in order, and kipside reads again.
            answers = await w.client.frames(count)
            assert [response_correlation_id(a) for a in answers] == list(range(count))
        assert stats.in_flight_bytes == 0 and stats.paused_client_connections == 0
        assert limits.peak_in_flight <= per_client + READ_SIZE + len(answer_body)


def test_every_limit_key_has_a_line_in_the_docs() -> None:
    from pathlib import Path

    docs = Path(__file__).resolve().parent.parent / "docs"
    rules_md, reliability_md = (
        (docs / "rules.md").read_text(),
        (docs / "reliability.md").read_text(),
    )
    for key in (f.name for f in Limits.__dataclass_fields__.values() if f.init):
        assert f"`{key}`" in rules_md, key
        assert f"`limits.{key}`" in reliability_md, key
