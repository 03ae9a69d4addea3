"""The rule file's timeouts (limits.idle_timeout_ms, limits.request_read_timeout_ms), decided by
kipside.proxy.core.deadlines.

Socket-free on a model clock where the behaviour lives, in the sans-I/O Deadlines object; a real
Session between loopback sockets (tests/test_session.py's wiring), on trio's autojump clock,
where it is what a client sees: closed when idle or slow, not while it is owed an answer. Every
socket test has an absolute trio.fail_after (TIMEOUT).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import pytest
import trio
import trio.testing
from limits_kit import server_limits
from test_session import answer_to, heartbeat_request, wired_session

from kipside.protocol import ApiKey
from kipside.proxy.core.deadlines import IDLE, REQUEST_READ, Deadlines
from kipside.rules import Limits

# ------------------------------------------------------------------------- deadlines


@dataclass
class Watched:
    """Deadlines under test on a model clock, watched as the session's driver watches them:
    at each deadline (or when told the limits changed) it asks whether one expired."""

    limits: Limits
    busy: bool = False
    now: float = 0.0
    expired: list[tuple[str, float, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.deadlines = Deadlines(lambda: self.limits, lambda: self.busy, self.now)

    def ask(self) -> None:
        if self.expired:
            return
        found = self.deadlines.expired(self.now)
        if found is not None:
            self.expired.append((found[0], round(self.now, 3), self.deadlines.partial_bytes))

    def sleep(self, seconds: float) -> None:
        """Let `seconds` of model time pass, stopping at every deadline on the way."""
        until = self.now + seconds
        while not self.expired and (deadline := self.deadlines.next_deadline()) <= until:
            self.now = max(self.now, deadline)
            self.ask()
        self.now = until


def test_idle_connection_closes_after_the_idle_timeout_and_not_while_it_is_owed() -> None:
    watched = Watched(Limits(idle_timeout_ms=5000, request_read_timeout_ms=0), busy=True)
    watched.sleep(12)  # owed answers all along: never idle
    assert watched.expired == []
    watched.busy = False  # at 12 s; last counted busy at 10 s
    watched.sleep(1)
    watched.deadlines.read(watched.now, 0, completed=True)  # a request at 13 s
    watched.sleep(60)
    # Idle from 13 s: closed at 18 s, not at 15 s.
    assert watched.expired == [(IDLE, 18.0, 0)]


def test_a_request_not_whole_within_the_read_timeout_closes_even_if_bytes_trickle() -> None:
    watched = Watched(Limits(idle_timeout_ms=0, request_read_timeout_ms=2000))
    watched.sleep(1)
    watched.deadlines.read(watched.now, 5, completed=False)  # a request begins at 1 s
    for partial in range(6, 30):  # a byte every 0.1 s: still the same request
        watched.sleep(0.1)
        watched.deadlines.read(watched.now, partial, completed=False)
    watched.sleep(60)
    assert watched.expired == [(REQUEST_READ, 3.0, 24)]


def test_a_whole_request_restarts_the_clock_and_a_paused_reader_stops_it() -> None:
    watched = Watched(Limits(idle_timeout_ms=0, request_read_timeout_ms=2000))
    deadlines = watched.deadlines
    deadlines.read(0.0, 10, completed=False)  # begins at 0
    watched.sleep(1.5)
    deadlines.read(watched.now, 4, completed=True)  # whole at 1.5 s; the next begins
    watched.sleep(1.5)
    deadlines.pause()  # kipside stops reading at 3 s: not the client's fault
    watched.sleep(30)
    assert watched.expired == []
    deadlines.resume(watched.now, 4)  # reading again at 33 s
    watched.sleep(60)
    assert watched.expired == [(REQUEST_READ, 35.0, 4)]


def test_a_reload_applies_a_shorter_timeout_at_once() -> None:
    watched = Watched(Limits(idle_timeout_ms=600_000, request_read_timeout_ms=0))
    watched.sleep(10)
    watched.limits = replace(watched.limits, idle_timeout_ms=3000)
    watched.ask()  # the driver asks again when the rules change
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
