"""A model of a transactional client's loop, kipside's begin hold and a coordinator with a
marker window, on a model clock in memory: what tests/test_begin_window.py runs the begin
hold's policy (kipside.proxy.core.begin_window) through, and librdkafka's own retries against
the same coordinator for comparison.

The coordinator refuses a transactional id's registrations that reach it before `window`
seconds after it answered EndTxn (CONCURRENT_TRANSACTIONS), and says so to a
DescribeTransactions. Every message takes `one_way` seconds each way; of a registration's two
calls, sent together, the second reaches the coordinator `spread` after the first, so the
window may end between them. kipside sits beside the
client (no delay between them); the client's first add of a transaction reaches kipside
`think` seconds after the EndTxn answer did. After its registration is answered, the
transaction takes `body` seconds (produce, offsets) before its EndTxn goes.

The driver here does what kipside.proxy.stages.transactions.hold does with the policy's
answers: every call of the registration at the plan's time (or at once after a
DescribeTransactions asked before it said yes); once refused, one probe at a time when the
HoldSchedule allows: every call again, or, where the broker offers DescribeTransactions,
every call again the first time and a DescribeTransactions after that.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from kipside.proxy.core.begin_window import Attempt, BeginWindow, HoldSchedule

HOLD_MAX = 5.0
SPREAD = 0.0005
"""How much later the registration's second call reaches the coordinator than its first."""
LIBRDKAFKA_ADD_PARTITIONS_BACKOFF = 0.020
LIBRDKAFKA_ADD_OFFSETS_BACKOFF = 0.100  # its AddOffsetsToTxn retry (retry.backoff.ms)


@dataclass(frozen=True)
class Coordinator:
    """One transaction's coordinator: its node, marker window and network delay."""

    node: int
    window: float
    one_way: float


@dataclass
class Transaction:
    """What one transaction's registration cost and how late it began."""

    refused: int = 0
    """CONCURRENT_TRANSACTIONS answers (each call counts)."""
    asked: int = 0
    """DescribeTransactions sent."""
    late: float = 0.0
    """How long after the earliest possible moment the registration was answered."""
    rounds: int = 1
    """Round trips from the first call the coordinator accepted to the last: 2 when the
    window ended between the two calls of one round (the refused one goes again)."""


@dataclass
class Run:
    transactions: list[Transaction] = field(default_factory=list)

    def refused(self, start: int = 0) -> int:
        return sum(t.refused for t in self.transactions[start:])

    def asked(self, start: int = 0) -> int:
        return sum(t.asked for t in self.transactions[start:])

    def late(self, start: int = 0) -> list[float]:
        return [t.late for t in self.transactions[start:]]

    def two_rounds(self, start: int = 0) -> int:
        return sum(t.rounds > 1 for t in self.transactions[start:])


Scenario = Callable[[int], Coordinator]
"""The coordinator of transaction n (0, 1, ...)."""


def kipside(
    scenario: Scenario,
    transactions: int,
    *,
    can_ask: bool,
    think: float = 0.001,
    body: float = 0.040,
    jitter: float = 0.0,
    spread: float = SPREAD,
    seed: int = 1,
) -> Run:
    """`transactions` transactions back to back through the begin hold's policy."""
    rng = random.Random(seed)
    window = BeginWindow()
    run = Run()
    now = 0.0
    for n in range(transactions):
        coordinator = scenario(n)
        d = coordinator.one_way
        # The coordinator answered EndTxn at `now`: its window runs until `ready_at`.
        ready_at = now + coordinator.window + rng.uniform(-jitter, jitter)
        window.ended(now + d + rng.uniform(0, jitter), coordinator.node)
        arrival = now + d + think
        txn, answered = _register(window, coordinator, ready_at, arrival, can_ask, spread)
        txn.late = answered - (max(ready_at, arrival + d) + d)
        run.transactions.append(txn)
        now = answered + body + d  # its EndTxn reaches the coordinator
    return run


def _register(
    window: BeginWindow,
    c: Coordinator,
    ready_at: float,
    arrival: float,
    can_ask: bool,
    spread: float,
) -> tuple[Transaction, float]:
    """One registration through the policy; returns what it cost and when its last call was
    answered."""
    d = c.one_way
    txn = Transaction()
    attempts: list[Attempt] = []
    plan = window.plan(arrival, can_ask=can_ask)
    schedule = HoldSchedule(arrival, arrival + HOLD_MAX, asking=can_ask)
    go = arrival if plan.register_at is None else plan.register_at
    if plan.ask_at is not None:
        txn.asked += 1
        ready = plan.ask_at + d >= ready_at
        attempts.append(Attempt(plan.ask_at, ready, asked=True))
        if ready:
            go = min(go, plan.ask_at + 2 * d)
    go = min(go, schedule.deadline)
    while True:  # every call together: the second reaches the coordinator `spread` later
        if go + d >= ready_at:
            attempts.append(Attempt(go, True))
            window.learn(attempts)
            return txn, go + 2 * d
        if go + d + spread >= ready_at:  # the window ended between the two
            txn.refused, txn.rounds = txn.refused + 1, 2
            attempts += [Attempt(go, False), Attempt(go, True)]
            window.learn(attempts)
            return txn, go + 4 * d
        txn.refused += 2
        attempts += [Attempt(go, False), Attempt(go, False)]
        if schedule.refused(go + 2 * d):
            window.learn(attempts)
            return txn, go + 2 * d
        while True:  # held: one probe at a time
            at = schedule.due()
            together = schedule.together()
            schedule.sent()
            if together:
                go = at
                break
            txn.asked += 1
            ready = at + d >= ready_at
            attempts.append(Attempt(at, ready, asked=True))
            if ready:
                go = at + 2 * d
                break
            if schedule.refused(at + 2 * d):
                window.learn(attempts)
                return txn, at + 2 * d


def librdkafka(
    scenario: Scenario,
    transactions: int,
    *,
    think: float = 0.001,
    body: float = 0.040,
    jitter: float = 0.0,
    seed: int = 1,
) -> Run:
    """The same loop straight to the coordinator: AddPartitionsToTxn and AddOffsetsToTxn at
    once, each retried after its own backoff while refused."""
    rng = random.Random(seed)
    run = Run()
    now = 0.0
    for n in range(transactions):
        c = scenario(n)
        d = c.one_way
        ready_at = now + c.window + rng.uniform(-jitter, jitter)
        arrival = now + d + think
        txn = Transaction()
        done = []
        for backoff in (LIBRDKAFKA_ADD_PARTITIONS_BACKOFF, LIBRDKAFKA_ADD_OFFSETS_BACKOFF):
            sent = arrival
            while sent + d < ready_at:
                txn.refused += 1
                sent += 2 * d + backoff
            done.append(sent + 2 * d)
        txn.late = max(done) - (max(ready_at, arrival + d) + d)
        run.transactions.append(txn)
        now = max(done) + body + d
    return run


def steady(window: float, one_way: float, node: int = 1) -> Scenario:
    return lambda n: Coordinator(node, window, one_way)


def step(before: Coordinator, after: Coordinator, at: int) -> Scenario:
    return lambda n: before if n < at else after


def ramp(first: float, per_transaction: float, one_way: float, low: float = 0.0) -> Scenario:
    return lambda n: Coordinator(1, max(low, first + n * per_transaction), one_way)
