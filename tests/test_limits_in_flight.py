"""The rule file's in-flight limits (limits.max_in_flight_bytes_per_client and
limits.max_in_flight_bytes), enforced by kipside.proxy.core.limits: a client over its limit
is not read until its answers are taken.

Socket-free on trio's autojump clock against a stand-in connection where the behaviour lives
in the accounting; a real Session between loopback sockets (tests/test_session.py's wiring)
where it is what a client sees: not read while it does not read its answers. Every test has an
absolute trio.fail_after (TIMEOUT).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing
from limits_kit import server_limits
from test_session import TIMEOUT, answer_to, heartbeat_request, wired_session

from kipside.protocol import ApiKey, response_correlation_id
from kipside.proxy.core.client_side import ClientSide
from kipside.proxy.core.limits import (
    IN_FLIGHT,
    IN_FLIGHT_PER_CLIENT,
    REQUEST_OVERHEAD_BYTES,
    ClientLimits,
    ServerLimits,
)
from kipside.proxy.session.reading import Room
from kipside.proxy.telemetry.stats import Stats
from kipside.proxy.transport.wire import READ_SIZE
from kipside.rules import Limits, RuleSet

# ------------------------------------------------------------------------- in-flight bytes


@dataclass
class Clients:
    limits: Limits
    stats: Stats = field(default_factory=Stats)
    closed: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.server = ServerLimits(lambda: self.limits, self.stats)

    def client(self, name: str) -> tuple[ClientLimits, Room]:
        """One client's limits, and where its driver waits for room (session.reading)."""
        limits = self.server.client(lambda: f"client {name}", 0.0)
        return limits, Room(limits)


NO_SIDE = ClientSide(
    Clients(Limits()).client("unused")[0], max_frame_bytes=1024, on_ready=lambda: None
)


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
    client, room = clients.client("127.0.0.1:5555")
    with trio.fail_after(TIMEOUT * 10):
        charged = client.took(3000)
        assert charged == 3000 + REQUEST_OVERHEAD_BYTES
        assert client.over() is None
        client.arrived(1000)  # its answer came; not written yet
        assert client.over() == IN_FLIGHT_PER_CLIENT
        assert await paused(lambda: room.requests(NO_SIDE))
        assert clients.stats.limit_reached[IN_FLIGHT_PER_CLIENT] == 1
        assert "client 127.0.0.1:5555" in caplog.text
        assert "limits.max_in_flight_bytes_per_client (4096)" in caplog.text
        client.written(0.0, charged, 1000)
        client.backlog_changed(+9000)  # the socket did not take all of an answer: 9000 bytes unsent
        assert clients.stats.in_flight_bytes == 9000
        async with trio.open_nursery() as nursery:

            async def reader() -> None:
                started = trio.current_time()
                await room.requests(NO_SIDE)
                assert trio.current_time() - started == pytest.approx(2.0, abs=0.01)

            nursery.start_soon(reader)
            await trio.sleep(1)
            assert clients.stats.paused_client_connections == 1
            client.backlog_changed(-2000)  # the client reads a little: 7000, still over
            await trio.sleep(1)
            client.backlog_changed(-3000)  # and more: 4000, the reader goes on at once
            await trio.sleep(1)
            client.backlog_changed(-4000)
        assert clients.stats.paused_client_connections == 0
        assert clients.stats.in_flight_bytes == 0


async def test_its_own_broker_connection_waits_only_on_answers_the_socket_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clients = Clients(Limits(max_in_flight_bytes_per_client=4096))
    client, room = clients.client("a")
    with trio.fail_after(TIMEOUT * 10):
        client.took(8000)
        client.arrived(8000)  # e.g. waiting behind an answer still to come on that connection
        assert client.over() == IN_FLIGHT_PER_CLIENT
        assert not await paused(room.answers)  # else that answer would never come
        client.written(0.0, 8000 + REQUEST_OVERHEAD_BYTES, 8000)
        client.backlog_changed(+8000)  # written, but the client is not reading
        assert await paused(room.answers)
        client.backlog_changed(-8000)
        assert not await paused(room.answers)


async def test_over_the_total_only_clients_above_an_equal_share_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clients = Clients(Limits(max_in_flight_bytes=1 << 20, max_in_flight_bytes_per_client=1 << 30))
    (hog, hog_room), (small, small_room) = clients.client("hog"), clients.client("small")
    # An equal share of the total: 512 KiB.
    with trio.fail_after(TIMEOUT * 10):
        hog_bytes = hog.took(1_200_000)
        small.took(100)
        assert hog.over() == IN_FLIGHT
        assert small.over() is None  # the producer with its request out keeps being read
        assert not await paused(lambda: small_room.requests(NO_SIDE))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hog_room.requests, NO_SIDE)
            await trio.sleep(1)
            assert clients.stats.paused_client_connections == 1
            hog.written(0.0, hog_bytes, 0)  # answered: the total is back under the limit
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
    client, room = clients.client("a")
    with trio.fail_after(TIMEOUT * 10):
        client.took(8000)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(room.requests, NO_SIDE)
            await trio.sleep(1)
            old = RuleSet(limits=clients.limits)
            clients.limits = Limits(max_in_flight_bytes_per_client=1 << 20)
            clients.server.rules_changed(old, RuleSet(limits=clients.limits))
        assert trio.current_time() == pytest.approx(1.0, abs=0.01)
    assert [r.getMessage() for r in caplog.records if "changed" in r.getMessage()] == [
        "limits.max_in_flight_bytes_per_client changed from 4096 to 1048576: in force now"
    ]


# ------------------------------------------------------------------------- a real session


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
