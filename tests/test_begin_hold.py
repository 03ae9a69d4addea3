"""features.transactions.hold.BeginHold against a simulated coordinator, on trio's mock clock.

The coordinator refuses every call with CONCURRENT_TRANSACTIONS until its window closes, and
answers each call after a 1 ms round trip. The hold must keep one probe in flight at a time,
never more of them than librdkafka's 20 ms backoff would have sent, let the other calls go
once a probe is accepted, give up at the deadline, and learn a steady window.
tests/integration/test_transactions_hold.py compares it with librdkafka itself through the
marker-window relay.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing

from kipside.protocol import ApiKey
from kipside.proxy.stages.transactions.hold import (
    CONCURRENT_TRANSACTIONS,
    HOLD_PROBE_SECONDS,
    HOLD_RETRY_SECONDS,
    BeginHold,
    first_probe_at,
)
from kipside.proxy.stages.transactions.state import TransactionState
from kipside.proxy.telemetry.stats import Stats

ROUND_TRIP = 0.001
TIMEOUT = 10.0


@dataclass
class Coordinator:
    closes_at: float
    in_flight: int = 0
    most_in_flight: int = 0
    calls: list[tuple[str, float, int]] = field(default_factory=list)
    """(call, sent at, answer) in sending order."""

    def call(self, name: str) -> object:
        async def attempt() -> int:
            sent = trio.current_time()
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            await trio.sleep(ROUND_TRIP)
            self.in_flight -= 1
            code = CONCURRENT_TRANSACTIONS if sent < self.closes_at else 0
            self.calls.append((name, sent, code))
            return code

        return attempt

    def refused(self) -> int:
        return sum(1 for _, _, code in self.calls if code)


async def register(hold: BeginHold, coordinator: Coordinator, names: list[str]) -> list[int]:
    """The registration's calls in parallel, as features.transactions.registration runs them."""
    results: dict[str, int] = {}

    async def one(name: str) -> None:
        results[name] = await hold.call(
            name,
            coordinator.call(name),  # type: ignore[arg-type]
            lambda code: code == CONCURRENT_TRANSACTIONS,
        )

    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(one, name)
    return [results[name] for name in names]


@pytest.mark.parametrize("window_likely", [False, True])
async def test_one_probe_at_a_time_every_20_ms_then_the_others_go(
    autojump_clock: trio.testing.MockClock, window_likely: bool
) -> None:
    start = trio.current_time()
    coordinator = Coordinator(closes_at=start + 0.100)
    stats = Stats()
    hold = BeginHold(stats, None, start + 5.0, probe_at=start if window_likely else None)
    with trio.fail_after(TIMEOUT):
        results = await register(hold, coordinator, ["AddPartitionsToTxn", "AddOffsetsToTxn"])
    assert results == [0, 0]
    first_round = 1 if window_likely else 2
    sent = [at for _, at, _ in coordinator.calls]
    # The first round: both calls at once, or (a window likely) one alone.
    assert sent[:first_round] == [start] * first_round
    # Then one probe at a time, 20 ms apart, until one is accepted...
    probes = [(at, code) for _, at, code in coordinator.calls[first_round:]]
    accepted = next(i for i, (_, code) in enumerate(probes) if code == 0)
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(probes[: accepted + 1])]
    assert gaps and all(gap >= HOLD_RETRY_SECONDS - 1e-9 for gap in gaps), gaps
    # ... and the other call right after it, no more refused.
    assert probes[accepted + 1 :] == [(probes[accepted][0] + ROUND_TRIP, 0)]
    assert coordinator.most_in_flight == first_round
    # 100 ms of window: first round + the probes at 20, 40, 60, 80 ms (+ the 1 ms trips).
    assert coordinator.refused() == first_round + 4
    assert (stats.holds, stats.hold_retries) == (1, 5)
    assert hold.accepted_sent == probes[accepted][0]
    assert hold.window_after(start) == probes[accepted][0] - start


async def test_no_window_costs_one_round_trip_for_all(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    coordinator = Coordinator(closes_at=start)
    stats = Stats()
    hold = BeginHold(stats, None, start + 5.0)
    with trio.fail_after(TIMEOUT):
        results = await register(hold, coordinator, ["AddPartitionsToTxn", "AddOffsetsToTxn", "g2"])
    assert results == [0, 0, 0]
    assert [at for _, at, _ in coordinator.calls] == [start] * 3
    assert (stats.holds, hold.refused_sent, hold.window_after(start)) == (0, None, 0.0)


async def test_at_the_deadline_every_call_gets_the_coordinators_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    coordinator = Coordinator(closes_at=start + 10.0)
    stats = Stats()
    hold = BeginHold(stats, None, start + 0.1, probe_at=start)
    with trio.fail_after(TIMEOUT):
        results = await register(hold, coordinator, ["AddPartitionsToTxn", "AddOffsetsToTxn"])
    assert results == [CONCURRENT_TRANSACTIONS] * 2
    assert trio.current_time() - start < 0.1 + HOLD_RETRY_SECONDS
    assert coordinator.most_in_flight == 1
    # Probes at 0, 20, ..., 100 ms; the call that never probed asks once for its own answer.
    assert coordinator.refused() == 6 + 1
    assert stats.holds == 1 and hold.accepted_sent is None
    assert hold.window_after(start) == hold.refused_sent - start > 0.07  # type: ignore[operator]


async def test_a_learned_window_spares_the_coordinator_the_early_refusals(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Transactions back to back against a 100 ms window after every EndTxn: the client's
    first add comes 5 ms after EndTxn's answer. librdkafka alone would be refused at 5, 25, 45,
    65 and 85 ms (5 times) for AddPartitionsToTxn alone; the hold, once it knows the window,
    probes alone just before it ends, then 5 ms apart."""
    state = TransactionState("t")
    refused, late = [], []
    for _ in range(8):
        state.track(ApiKey.END_TXN, EndTxnAnswer(), trio.current_time())
        assert state.ended_at is not None
        ended = state.ended_at
        await trio.sleep(0.005)
        coordinator = Coordinator(closes_at=ended + 0.100)
        now = trio.current_time()
        hold = BeginHold(Stats(), None, now + 5.0, probe_at=first_probe_at(state.window_end(), now))
        with trio.fail_after(TIMEOUT):
            assert await register(hold, coordinator, ["AddPartitionsToTxn", "AddOffsetsToTxn"]) == [
                0,
                0,
            ]
        late.append(trio.current_time() - coordinator.closes_at)  # both calls answered
        state.windows.append(hold.window_after(ended))
        refused.append(coordinator.refused())
    # The first transaction learns the window (both calls refused, then 20 ms probes). Later
    # ones are refused at most twice (the guess comes down 5 ms when a probe is accepted at
    # once, then climbs back) and begin within a probe step and two round trips of the end.
    assert refused[0] == 2 + 4
    assert all(n <= 2 for n in refused[1:]), refused
    assert sum(refused[1:]) < 5 * len(refused[1:]) / 2, refused
    assert all(t <= HOLD_PROBE_SECONDS + 2 * ROUND_TRIP + 1e-9 for t in late[1:]), late


class EndTxnAnswer:
    """A successful EndTxn answer, as state.track reads it."""

    error_code = 0
