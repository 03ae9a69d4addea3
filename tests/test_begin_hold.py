"""stages.transactions.hold.BeginHold, the trio driver of the begin hold's policy
(core.begin_window), against a simulated coordinator on trio's mock clock.

The coordinator refuses every registration call with CONCURRENT_TRANSACTIONS until its window
closes, answers a DescribeTransactions with whether it has, and answers each request after a
1 ms round trip. The driver must send a registration's calls together (at once, or at the
plan's time, or as soon as an early DescribeTransactions says yes), keep one probe in flight
at a time once refused, never more of them than librdkafka's 20 ms backoff would have sent,
let the other calls go once a probe is accepted, and give up at the deadline.
tests/test_begin_window.py runs the policy itself through changing windows;
tests/integration/test_transactions_hold.py compares it with librdkafka through the
marker-window relay.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing

from kipside.protocol import ApiKey
from kipside.proxy.core.begin_window import (
    AT_ONCE,
    PROBE_GAP_SECONDS,
    RETRY_SECONDS,
    BeginPlan,
    HoldSchedule,
)
from kipside.proxy.stages.transactions.hold import CONCURRENT_TRANSACTIONS, BeginHold
from kipside.proxy.stages.transactions.state import TransactionState
from kipside.proxy.telemetry.stats import Stats

ROUND_TRIP = 0.001
TIMEOUT = 10.0
CALLS = ["AddPartitionsToTxn", "AddOffsetsToTxn"]


@dataclass
class Coordinator:
    closes_at: float
    describes: bool = True
    busy: set[str] = field(default_factory=set)
    """Calls refused once whatever the time (Apache Kafka refuses an add while another of the
    id is being logged)."""
    in_flight: int = 0
    most_in_flight: int = 0
    calls: list[tuple[str, float, int]] = field(default_factory=list)
    """(call, sent at, answer) in sending order; DescribeTransactions: 0 ready, 1 not."""

    async def _request(self, name: str, refused_code: int) -> int:
        sent = trio.current_time()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await trio.sleep(ROUND_TRIP)
        self.in_flight -= 1
        code = refused_code if sent < self.closes_at or name in self.busy else 0
        self.busy.discard(name)
        self.calls.append((name, sent, code))
        return code

    def call(self, name: str) -> object:
        return lambda: self._request(name, CONCURRENT_TRANSACTIONS)

    async def ask(self) -> bool | None:
        if not self.describes:
            return None
        return await self._request("DescribeTransactions", 1) == 0

    def refused(self) -> int:
        return sum(1 for name, _, code in self.calls if code and name in CALLS)

    def sent(self, name: str) -> list[float]:
        return [at for n, at, _ in self.calls if n == name]


def hold_for(
    coordinator: Coordinator,
    *,
    deadline: float = 5.0,
    plan: BeginPlan = AT_ONCE,
    ask: bool = False,
    stats: Stats | None = None,
) -> BeginHold:
    now = trio.current_time()
    schedule = HoldSchedule(now, now + deadline, asking=ask)
    return BeginHold(stats or Stats(), None, schedule, plan, coordinator.ask if ask else None)


async def register(hold: BeginHold, coordinator: Coordinator, names: list[str]) -> list[int]:
    """The registration's calls in parallel, as stages.transactions.registration runs them."""
    results: dict[str, int] = {}

    async def one(name: str) -> None:
        results[name] = await hold.call(
            name,
            coordinator.call(name),  # type: ignore[arg-type]
            lambda code: code == CONCURRENT_TRANSACTIONS,
        )

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold.run, nursery)
            for name in names:
                nursery.start_soon(one, name)
    return [results[name] for name in names]


async def test_no_window_costs_one_round_trip_for_all(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    coordinator = Coordinator(closes_at=start)
    stats = Stats()
    hold = hold_for(coordinator, stats=stats)
    assert await register(hold, coordinator, [*CALLS, "g2"]) == [0, 0, 0]
    assert [at for _, at, _ in coordinator.calls] == [start] * 3
    assert stats.holds == 0
    assert [a.ready for a in hold.attempts] == [True] * 3


async def test_refused_calls_ask_again_together_every_20_ms(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    coordinator = Coordinator(closes_at=start + 0.100)
    stats = Stats()
    hold = hold_for(coordinator, stats=stats)
    assert await register(hold, coordinator, CALLS) == [0, 0]
    # Every round is both calls at once (the registration is one round trip when accepted),
    # one round at a time, 20 ms apart (librdkafka's pace), until the window closed.
    rounds = [start + n * RETRY_SECONDS for n in range(6)]
    assert coordinator.sent(CALLS[0]) == coordinator.sent(CALLS[1]) == pytest.approx(rounds)
    assert coordinator.refused() == 2 * 5
    assert coordinator.most_in_flight == 2
    assert (stats.holds, stats.hold_retries) == (1, 5)  # at 20, 40, 60, 80 and 100 ms


@pytest.mark.parametrize("busy", [0, 1])
async def test_a_call_refused_as_another_is_accepted_goes_again_at_once(
    autojump_clock: trio.testing.MockClock, busy: int
) -> None:
    start = trio.current_time()
    coordinator = Coordinator(closes_at=start, busy={CALLS[busy]})
    hold = hold_for(coordinator)
    assert await register(hold, coordinator, CALLS) == [0, 0]
    assert coordinator.sent(CALLS[1 - busy]) == [start]
    assert coordinator.sent(CALLS[busy]) == [start, start + ROUND_TRIP]


async def test_at_the_deadline_every_call_gets_the_coordinators_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    coordinator = Coordinator(closes_at=start + 10.0)
    stats = Stats()
    hold = hold_for(coordinator, deadline=0.1, stats=stats)
    assert await register(hold, coordinator, CALLS) == [CONCURRENT_TRANSACTIONS] * 2
    assert trio.current_time() - start < 0.1 + RETRY_SECONDS
    # Rounds of both at 0, 20, ..., 100 ms; the last one past the deadline is each call's own.
    assert coordinator.refused() == 2 * 6
    assert stats.holds == 1 and hold.expired
    assert not any(a.ready for a in hold.attempts)


async def test_a_planned_registration_waits_and_goes_together(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    coordinator = Coordinator(closes_at=start + 0.030)
    stats = Stats()
    hold = hold_for(coordinator, plan=BeginPlan(start + 0.030), stats=stats)
    assert await register(hold, coordinator, CALLS) == [0, 0]
    assert [at for _, at, _ in coordinator.calls] == [start + 0.030] * 2
    assert coordinator.refused() == 0 and stats.holds == 1


async def test_a_plan_past_the_deadline_goes_at_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    coordinator = Coordinator(closes_at=start)
    hold = hold_for(coordinator, deadline=0.050, plan=BeginPlan(start + 1.0))
    assert await register(hold, coordinator, CALLS) == [0, 0]
    assert [at for _, at, _ in coordinator.calls] == [start + 0.050] * 2


@pytest.mark.parametrize("ready", [True, False])
async def test_an_early_question_brings_the_registration_forward_when_answered_yes(
    autojump_clock: trio.testing.MockClock, ready: bool
) -> None:
    start = trio.current_time()
    closes = start + (0.010 if ready else 0.025)
    coordinator = Coordinator(closes_at=closes)
    plan = BeginPlan(start + 0.030, ask_at=start + 0.020)
    hold = hold_for(coordinator, plan=plan, ask=True)
    assert await register(hold, coordinator, CALLS) == [0, 0]
    assert coordinator.sent("DescribeTransactions") == [start + 0.020]
    went = start + 0.020 + ROUND_TRIP if ready else start + 0.030
    assert coordinator.sent(CALLS[0]) == coordinator.sent(CALLS[1]) == [went]
    assert (hold.attempts[0].asked, hold.attempts[0].ready) == (True, ready)


async def test_held_with_describe_transactions_the_coordinator_is_asked_instead(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    coordinator = Coordinator(closes_at=start + 0.100)
    stats = Stats()
    hold = hold_for(coordinator, ask=True, stats=stats)
    assert await register(hold, coordinator, CALLS) == [0, 0]
    asked = coordinator.sent("DescribeTransactions")
    # The first round and the first probe (both calls again, 20 ms later) are refused; the
    # coordinator is then asked, 20 ms apart, until it says yes.
    assert coordinator.sent(CALLS[0])[:2] == [start, start + RETRY_SECONDS]
    assert coordinator.refused() == 4
    assert all(b - a >= RETRY_SECONDS - 1e-9 for a, b in itertools.pairwise(asked)), asked
    assert asked[-1] >= start + 0.100 > asked[-2]
    # Both calls go together once it said yes.
    assert coordinator.sent(CALLS[0])[2] == coordinator.sent(CALLS[1])[2] == asked[-1] + ROUND_TRIP
    assert coordinator.most_in_flight == 2
    assert stats.hold_retries == 1 + len(asked)


async def test_a_coordinator_that_does_not_describe_is_probed_with_the_calls(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    coordinator = Coordinator(closes_at=start + 0.060, describes=False)
    hold = hold_for(coordinator, ask=True)
    assert await register(hold, coordinator, CALLS) == [0, 0]
    assert coordinator.sent("DescribeTransactions") == []
    assert coordinator.refused() > 2


@pytest.mark.parametrize("describes", [False, True])
async def test_a_learned_window_begins_transactions_as_the_coordinator_is_ready(
    autojump_clock: trio.testing.MockClock, describes: bool
) -> None:
    """Transactions back to back against a 100 ms window after every EndTxn, the client's
    first add 5 ms after EndTxn's answer, through the state's learned window (what
    registration.py does). librdkafka alone would be refused 5 times for AddPartitionsToTxn
    and twice for AddOffsetsToTxn in each."""
    state = TransactionState("t")
    refused, late, asked = [], [], []
    for _ in range(16):
        state.track(ApiKey.END_TXN, EndTxnAnswer(), trio.current_time(), coordinator=1)
        coordinator = Coordinator(closes_at=trio.current_time() + 0.100)
        await trio.sleep(0.005)
        now = trio.current_time()
        plan = state.window.plan(now, can_ask=describes)
        hold = hold_for(coordinator, plan=plan, ask=describes)
        assert await register(hold, coordinator, CALLS) == [0, 0]
        state.window.learn(hold.attempts)
        late.append(trio.current_time() - (coordinator.closes_at + ROUND_TRIP))
        refused.append(coordinator.refused())
        asked.append(len(coordinator.sent("DescribeTransactions")))
        assert coordinator.sent(CALLS[0])[0] == coordinator.sent(CALLS[1])[0]  # in parallel
    # The first transaction learns the window; after a few more, at most one in four meets
    # a refusal, and each begins within 2 ms of the coordinator being ready.
    assert refused[0] > 0
    assert sum(1 for n in refused[4:] if n) <= len(refused[4:]) / 4, refused
    if describes:
        assert sum(refused[1:]) == 0, refused
        assert max(asked[4:]) <= 1, asked
    assert all(t <= 0.002 for t in late[4:]), late
    assert PROBE_GAP_SECONDS < RETRY_SECONDS


class EndTxnAnswer:
    """A successful EndTxn answer, as state.track reads it."""

    error_code = 0
