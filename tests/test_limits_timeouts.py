"""The rule file's timeouts (limits.idle_timeout_ms, limits.request_read_timeout_ms), enforced
by kipside.proxy.core.deadlines.

Socket-free on trio's autojump clock where the behaviour lives in the Deadlines object; a real
Session between loopback sockets (tests/test_session.py's wiring) where it is what a client
sees: closed when idle or slow, not while it is owed an answer. Every test has an absolute
trio.fail_after (TIMEOUT).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

import pytest
import trio
import trio.testing
from limits_kit import server_limits
from test_session import TIMEOUT, answer_to, heartbeat_request, wired_session

from kipside.protocol import ApiKey
from kipside.proxy.core.deadlines import IDLE, REQUEST_READ, Deadlines
from kipside.rules import Limits

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


# ------------------------------------------------------------------------- a real session


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
