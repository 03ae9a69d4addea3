"""The transaction-begin hold: a transaction's first registration sent when the coordinator is
expected to accept it, and, while it answers CONCURRENT_TRANSACTIONS, held and asked again one
question at a time until it is ready or the rule's deadline passes.

While the previous transaction's markers are still being written the coordinator refuses the
next transaction's first registration; holding here spares the client its own backoff
(librdkafka 20 ms; Java and kafka-python 20 or 100 ms; franz-go 20 ms rising to 1 s) and the
error. The client's slot waits in its connection's response order meanwhile. Once the deadline
passes the client gets the coordinator's own answer.

The policy (when the registration goes, when a held one may ask again, what is learned from
each answer) is kipside.proxy.core.begin_window, sans-I/O; this module carries it out with
trio: a registration's calls (AddPartitionsToTxn, and AddOffsetsToTxn for each group) share
one BeginHold. They go together at the planned time, or at once when a DescribeTransactions
asked before it says the markers are written. Once refused, one question at a time is in
flight per registration: every call again (so the registration is one round trip whenever it
is accepted), or, where the broker offers DescribeTransactions, every call again the first
time and a DescribeTransactions after that.

It never makes up an answer: the client gets the coordinator's own, accepted or (at the
deadline) refused.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import trio
from opentelemetry.trace import Span

from kipside.protocol import ErrorCode
from kipside.proxy.core.begin_window import AT_ONCE, Attempt, BeginPlan, HoldSchedule
from kipside.proxy.telemetry.stats import Stats
from kipside.proxy.telemetry.tracing import event

T = TypeVar("T")

CONCURRENT_TRANSACTIONS: Final = int(ErrorCode.concurrent_transactions)

Ask = Callable[[], Awaitable[bool | None]]
"""A DescribeTransactions of the registration's transactional id: True when the markers of
its last transaction are written, False while they are being written, None when the
coordinator would not say (the hold then probes with its calls)."""


class BeginHold:
    """The hold of one registration: its calls go together at the plan's time and then share
    one probe of the coordinator."""

    def __init__(
        self,
        stats: Stats,
        span: Span | None,
        schedule: HoldSchedule,
        plan: BeginPlan = AT_ONCE,
        ask: Ask | None = None,
    ) -> None:
        self.stats = stats
        self.span = span
        self.schedule = schedule
        self.plan = plan
        self._ask = ask
        self._go = trio.Event()
        """Set when the calls may go: at the plan's time, or when an early question said
        the coordinator is ready."""
        self._held = False
        self._accepted = False
        self._ready = trio.Event()
        """Set when a call is accepted while others are held: they go at once."""
        self._probe = trio.Lock()
        self._began: float | None = None
        self._finished = False
        self.retries = 0
        self.attempts: list[Attempt] = []
        """What the coordinator answered, in sending order (for BeginWindow.learn)."""

    @property
    def expired(self) -> bool:
        return self.schedule.expired

    async def run(self, nursery: trio.Nursery) -> None:
        """Open the gate at the plan's time; ask the coordinator first if the plan says so."""
        plan = self.plan
        if plan.register_at is None:
            self._go.set()
            return
        self._begin("registration")  # every call waits for the plan
        if plan.ask_at is not None and self._ask is not None:
            nursery.start_soon(self._ask_early, plan.ask_at)
        with trio.move_on_at(min(plan.register_at, self.schedule.deadline)):
            await self._go.wait()
        self._go.set()

    async def _ask_early(self, at: float) -> None:
        await trio.sleep_until(at)
        if self._go.is_set() or self._ask is None:
            return
        sent = trio.current_time()
        ready = await self._ask()
        if ready is None:
            self._ask = None
            return
        self.attempts.append(Attempt(sent, ready, asked=True))
        if ready:
            self._go.set()

    async def call(
        self, upstream_call: str, attempt: Callable[[], Awaitable[T]], refused: Callable[[T], bool]
    ) -> T:
        """attempt()'s first answer that `refused` does not call CONCURRENT_TRANSACTIONS, or
        the refusal once the deadline has passed."""
        await self._go.wait()
        while True:
            if not self._held or self.expired:
                result = await self._attempt(upstream_call, attempt, refused)
                if not refused(result) or self.expired:
                    return result
                continue
            async with self._probe:
                if self._held and not self.expired:
                    with trio.move_on_at(self.schedule.due()):
                        await self._ready.wait()
                if not self._held or self.expired:
                    continue  # the coordinator became ready (or the hold ended) meanwhile
                self.retries += 1
                self.stats.hold_retries += 1
                self.schedule.asking = self._ask is not None
                together = self.schedule.together()
                self.schedule.sent()
                if together or self._ask is None:
                    self._held = False  # every call asks again, at once
                    continue
                await self._ask_held(upstream_call)

    async def _attempt(
        self, upstream_call: str, attempt: Callable[[], Awaitable[T]], refused: Callable[[T], bool]
    ) -> T:
        sent = trio.current_time()
        result = await attempt()
        ready = not refused(result)
        self.attempts.append(Attempt(sent, ready))
        if ready:
            self._release(upstream_call)
        elif not self.expired:
            self._hold(upstream_call)
        return result

    async def _ask_held(self, upstream_call: str) -> None:
        """The held registration's probe where the broker offers DescribeTransactions."""
        assert self._ask is not None
        sent = trio.current_time()
        ready = await self._ask()
        if ready is None:
            self._ask = None  # probe with the calls from now on
            return
        self.attempts.append(Attempt(sent, ready, asked=True))
        if ready:
            self._held = False  # every call goes again, together
            self._ready.set()
        elif self.schedule.refused(trio.current_time()):
            self._finish(upstream_call, "timed_out")

    def _begin(self, upstream_call: str) -> None:
        if self._began is None:
            self._began = time.monotonic()
            self.stats.holds += 1
            event(self.span, "kipside.txn.hold.begin", upstream_call=upstream_call)

    def _hold(self, upstream_call: str) -> None:
        """The coordinator refused a call: probe again when the schedule allows, unless that
        is past the deadline (then every call returns what it gets)."""
        self._begin(upstream_call)
        self._held = True
        if self._ready.is_set() and not self._accepted:
            # (Once a call was accepted the coordinator is ready: a call it refuses after that
            # met another being logged, and goes again at once.)
            self._ready = trio.Event()
        if self.schedule.refused(trio.current_time()):
            self._finish(upstream_call, "timed_out")

    def _release(self, upstream_call: str) -> None:
        self._held = False
        self._accepted = True
        self._ready.set()
        self._finish(upstream_call, "ready")

    def _finish(self, upstream_call: str, outcome: str) -> None:
        if self._began is None or self._finished:
            return
        self._finished = True
        held_for = time.monotonic() - self._began
        self.stats.hold_seconds.observe(held_for)
        event(
            self.span,
            "kipside.txn.hold.release",
            upstream_call=upstream_call,
            held_ms=round(held_for * 1000, 3),
            retries=self.retries,
            outcome=outcome,
        )
