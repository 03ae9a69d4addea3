"""core.begin_window, the begin hold's policy, on a model clock in memory (tests/begin_model.py):
a transactional client's loop through kipside against a coordinator whose marker window is
steady, grows, shrinks, varies, or belongs to a coordinator that moves, each compared with
librdkafka's own retries against the same coordinator, with and without DescribeTransactions.

Per scenario: how many CONCURRENT_TRANSACTIONS answers the coordinator gave (at most a quarter
of librdkafka's), how late each registration was answered after the earliest possible moment
(a few ms once the window is learned), and how rarely the window ended between the
registration's two calls (then it took two round trips).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pytest
from begin_model import Coordinator, Run, Scenario, kipside, librdkafka, ramp, steady, step

from kipside.proxy.core.begin_window import (
    CALM_TRANSACTIONS,
    Attempt,
    BeginPlan,
    BeginWindow,
    HoldSchedule,
)

MS = 0.001
TRANSACTIONS = 80
WARM_UP = 5  # the first transactions learn the window


@dataclass(frozen=True)
class Case:
    scenario: Scenario
    jitter: float = 0.0
    mean_late: float = 3 * MS
    """Mean lateness after the warm-up (and after the change)."""
    settled_by: int = WARM_UP
    """From this transaction on, three registrations in four are answered within `within` of
    the earliest possible moment, and none later than `late` (a try that met a refusal)."""
    within: float | None = 2 * MS
    """None: a window that changes every transaction is followed, never met exactly."""
    late: float = 10 * MS
    two_rounds: float = 0.08
    """The most transactions (a share) in which the window ended between the registration's
    two calls (the refused one then goes again: two round trips)."""
    asking_settled_by: int | None = None
    """settled_by where DescribeTransactions is offered (default: the same)."""


NODE_1_RTT_5 = Coordinator(1, 50 * MS, 2.5 * MS)
CASES = {
    "steady, RTT 20 ms": Case(steady(50 * MS, 10 * MS), mean_late=4 * MS, late=45 * MS),
    "steady, RTT 5 ms": Case(steady(50 * MS, 2.5 * MS)),
    "steady with 1 ms of jitter, RTT 20 ms": Case(
        steady(50 * MS, 10 * MS), jitter=1 * MS, mean_late=12 * MS, within=5 * MS, late=45 * MS
    ),
    "steady with 2 ms of jitter, RTT 5 ms": Case(
        steady(50 * MS, 2.5 * MS), jitter=2 * MS, mean_late=6 * MS, within=8 * MS, late=15 * MS
    ),
    "growing 3 ms a transaction": Case(
        ramp(20 * MS, 3 * MS, 2.5 * MS),
        mean_late=8 * MS,
        within=None,
        late=20 * MS,
        two_rounds=0.2,
    ),
    "shrinking 3 ms a transaction": Case(
        ramp(250 * MS, -3 * MS, 2.5 * MS, low=20 * MS), mean_late=30 * MS, within=None, late=45 * MS
    ),
    "grows at once, 50 -> 150 ms": Case(
        step(NODE_1_RTT_5, Coordinator(1, 150 * MS, 2.5 * MS), at=30), settled_by=34, late=15 * MS
    ),
    "shrinks at once, 150 -> 50 ms": Case(
        step(Coordinator(1, 150 * MS, 2.5 * MS), NODE_1_RTT_5, at=30),
        mean_late=25 * MS,
        settled_by=30 + CALM_TRANSACTIONS + 8,
        asking_settled_by=40,
    ),
    "the coordinator moves (RTT 5 -> 20 ms, window 50 -> 120 ms)": Case(
        step(NODE_1_RTT_5, Coordinator(2, 120 * MS, 10 * MS), at=30),
        mean_late=5 * MS,
        settled_by=34,
        late=45 * MS,
    ),
}


def _late(run: Run, start: int) -> list[float]:
    return run.late(start)


@pytest.mark.parametrize("can_ask", [False, True], ids=["registrations", "DescribeTransactions"])
@pytest.mark.parametrize("name", list(CASES))
def test_the_window_is_learned(name: str, can_ask: bool) -> None:
    case = CASES[name]
    ours = kipside(case.scenario, TRANSACTIONS, can_ask=can_ask, jitter=case.jitter)
    theirs = librdkafka(case.scenario, TRANSACTIONS, jitter=case.jitter)
    refused, direct = ours.refused(WARM_UP), theirs.refused(WARM_UP)
    late = _late(ours, WARM_UP)
    settled_by = case.settled_by
    if can_ask and case.asking_settled_by is not None:
        settled_by = case.asking_settled_by
    settled = _late(ours, settled_by)
    print(
        f"\n[{name}, {'asking' if can_ask else 'registrations'}] CONCURRENT_TRANSACTIONS "
        f"{refused} (librdkafka {direct}), DescribeTransactions {ours.asked(WARM_UP)}; late ms "
        f"mean {statistics.mean(late) / MS:.2f}, after transaction {settled_by} at most "
        f"{max(settled) / MS:.2f} (librdkafka mean "
        f"{statistics.mean(theirs.late(WARM_UP)) / MS:.1f})"
    )
    assert refused <= direct / 4
    assert ours.two_rounds(WARM_UP) <= case.two_rounds * (TRANSACTIONS - WARM_UP)
    assert statistics.mean(late) <= case.mean_late
    if case.within is not None:
        early = sum(t <= case.within for t in settled)
        assert early >= len(settled) * 3 / 4, [round(t / MS, 1) for t in settled]
    assert max(settled) <= case.late, [round(t / MS, 1) for t in settled]
    assert statistics.mean(late) < statistics.mean(theirs.late(WARM_UP)) / 2
    # Asking never costs more questions than there are transactions, nor more refusals.
    if can_ask:
        assert ours.asked(WARM_UP) <= 2 * (TRANSACTIONS - WARM_UP)
        plain = kipside(case.scenario, TRANSACTIONS, can_ask=False, jitter=case.jitter)
        assert refused <= plain.refused(WARM_UP)


def test_a_steady_window_asks_nothing_once_learned() -> None:
    """With no jitter, once the bounds meet: no refusal, and at most one question in most
    transactions (to find a window that shrank)."""
    run = kipside(steady(50 * MS, 2.5 * MS), TRANSACTIONS, can_ask=True)
    assert run.refused(WARM_UP) == 0
    assert run.asked(20) <= (TRANSACTIONS - 20) * 3 / 4


def test_nothing_is_planned_without_an_end_transaction() -> None:
    window = BeginWindow()
    assert window.plan(1.0, can_ask=True) == BeginPlan(None)
    window.ended(1.0, coordinator=1)
    assert window.plan(1.001, can_ask=True) == BeginPlan(None)  # nothing learned yet
    window.learn([Attempt(1.001, False), Attempt(1.021, False), Attempt(1.041, True)])
    # Learned: refused 21 ms after EndTxn's answer, accepted 41 ms after.
    assert (window.floor, window.upper) == pytest.approx((0.021, 0.041))
    window.ended(2.0, coordinator=1)
    plan = window.plan(2.001, can_ask=False)
    assert plan.register_at is not None and 2.021 < plan.register_at <= 2.041
    assert plan.ask_at is None
    # A client that comes after the window is never held.
    window.ended(3.0, coordinator=1)
    assert window.plan(3.050, can_ask=False) == BeginPlan(None)
    # InitProducerId (or anything that is not a known EndTxn): no window expected.
    window.no_window()
    assert window.plan(3.060, can_ask=True) == BeginPlan(None)


def test_asking_tries_below_the_known_ready_offset_with_a_question() -> None:
    window = BeginWindow()
    window.ended(1.0, coordinator=1)
    window.learn([Attempt(1.001, False), Attempt(1.021, False, asked=True), Attempt(1.041, True)])
    window.ended(2.0, coordinator=1)
    plan = window.plan(2.001, can_ask=True)
    # The registration goes where the coordinator was seen ready; the question earlier.
    assert plan.register_at == pytest.approx(2.041)
    assert plan.ask_at is not None and 2.021 < plan.ask_at < 2.041


def test_another_coordinator_starts_from_nothing() -> None:
    window = BeginWindow()
    window.ended(1.0, coordinator=1)
    window.learn([Attempt(1.001, False), Attempt(1.041, True)])
    assert window.upper is not None
    window.ended(2.0, coordinator=2)
    assert window.upper is None and window.plan(2.001, can_ask=False) == BeginPlan(None)


def test_the_schedule_never_outpaces_librdkafka() -> None:
    schedule = HoldSchedule(started=0.0, deadline=0.1, asking=True)
    assert schedule.due() == 0.0
    assert not schedule.refused(0.002)  # the first round, answered after 2 ms
    assert schedule.together()  # the first probe is every call again
    assert schedule.due() == pytest.approx(0.020)
    schedule.sent()
    assert not schedule.together()  # then questions
    schedule.asking = False
    assert schedule.together()  # or every call again, each time
    assert not schedule.refused(0.022)
    assert schedule.due() == pytest.approx(0.040)
    # Saved probes are spent 5 ms apart.
    late = HoldSchedule(started=0.0, deadline=1.0)
    late.sent()
    assert not late.refused(0.100)
    assert late.due() == pytest.approx(0.105)
    # The deadline: the next probe would come after it.
    for at in (0.041, 0.061, 0.081, 0.101):
        schedule.sent()
        expired = schedule.refused(at)
    assert expired and schedule.expired
