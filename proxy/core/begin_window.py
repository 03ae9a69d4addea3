"""When a transaction's first registration goes to the coordinator, and how often a held one
asks again: the transaction-begin hold's policy.

After EndTxn the coordinator writes the transaction's markers, and until they are written it
answers the transactional id's next AddPartitionsToTxn/AddOffsetsToTxn with
CONCURRENT_TRANSACTIONS (the marker window: a few to hundreds of ms, longer with more
partitions). A client that starts its next transaction at once meets it and sleeps in its own
backoff. kipside instead learns, per transactional id, how soon after EndTxn's answer a
registration is accepted, and sends the next transaction's registration then, every call of
it (AddPartitionsToTxn and AddOffsetsToTxn) together.

What one transactional id's `BeginWindow` knows, as offsets after its last EndTxn answer:

- `upper`: the earliest offset at which the coordinator was seen ready lately (a registration
  accepted, or DescribeTransactions saying the markers are written);
- `floor`: the latest at which it was seen still writing them (a refusal, or
  DescribeTransactions saying PrepareCommit/PrepareAbort);
- `margin`: how close to the floor a registration may go (it grows with each refusal where
  the coordinator was believed ready, and shrinks while none comes).

The registration goes at `upper`, never closer than the margin to the floor. Tries below that:

- while the bounds are further apart than the margin (they came from a hold, whose accepted
  probe may be late by its pace), the middle of them (a bisection), or just above a refusal
  that surprised (`hint`);
- once the floor is older than CALM_TRANSACTIONS transactions, a step below `upper`, starting
  at FIRST_STEP_SECONDS and doubling with each success, until one is refused: so a window that
  shrank is found.

Without DescribeTransactions a try is the registration itself, and a refused step down stops
the narrowing at that step (each try may cost a refusal). Where the broker offers it (Apache
Kafka 3.0+), a try is a DescribeTransactions ("are this id's markers written?"), which costs no
refusal: the registration still goes at `upper`, or as soon as such a question is answered yes,
and the tries come every CALM_TRANSACTIONS_ASKING transactions.

Calls of one round refused and accepted at once mean the window ended between their arrivals:
it is learned as ending just after they went. A coordinator on another node starts from
nothing.

`HoldSchedule` paces one held (refused) registration's probes: one at a time, at least
PROBE_GAP_SECONDS apart, and never more of them than librdkafka's own 20 ms backoff would
have sent since the client's call arrived, until the rule's deadline. A probe is every call of
the registration again, so an accepted registration is always one round trip; where the broker
offers DescribeTransactions, every probe after the first is a question instead (the first: a
refusal where the coordinator was believed ready is most often the window's jitter, so asking
again at once usually finds it ready).

Sans-I/O: plain objects fed times (seconds on any one monotonic clock) and outcomes. They never
sleep, send or read a clock; the trio driver is kipside.proxy.stages.transactions.hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "AT_ONCE",
    "CALM_TRANSACTIONS",
    "CALM_TRANSACTIONS_ASKING",
    "FIRST_STEP_SECONDS",
    "MAX_EXPLORE_SECONDS",
    "PROBE_GAP_SECONDS",
    "RETRY_SECONDS",
    "TOLERANCE_SECONDS",
    "Attempt",
    "BeginPlan",
    "BeginWindow",
    "HoldSchedule",
]

RETRY_SECONDS: Final = 0.020
"""librdkafka's backoff after CONCURRENT_TRANSACTIONS (Java and kafka-python use it for a
transaction's first add too): a hold's n-th probe goes no earlier than n of these after the
client's call arrived, so it never asks more often than the client would have."""
PROBE_GAP_SECONDS: Final = 0.005
"""The closest two probes may follow each other (spending probes saved while the hold waited
for the expected end of a window)."""
TOLERANCE_SECONDS: Final = 0.001
"""How close the learned bounds must be for the guess to stop moving."""
CALM_TRANSACTIONS: Final = 12
"""Transactions for which a refusal keeps bounding the window from below; after that many
transactions without one, the guess moves down again to find a window that shrank (each try
may cost a refusal)."""
CALM_TRANSACTIONS_ASKING: Final = 2
"""The same where the broker offers DescribeTransactions: a try is a question there, never a
refusal, so the guess follows a shrinking window more closely."""
FIRST_STEP_SECONDS: Final = 0.004
"""The first step down once the floor is old: a try just below where the coordinator was last
ready would often land as the window ends, between the registration's two calls."""
MAX_EXPLORE_SECONDS: Final = 0.064
"""The largest step down in one transaction."""
MAX_MARGIN_SECONDS: Final = 0.016
"""The most the guess keeps above a refusal for a coordinator whose windows vary."""
MARGIN_DECAY: Final = 0.9
"""How much of the margin is left after a transaction that met no refusal."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One question the coordinator answered during a registration: a registration call, or
    a DescribeTransactions (`asked`)."""

    sent: float
    """When it went (the driver's clock)."""
    ready: bool
    """Accepted (a registration), or the markers were written (DescribeTransactions)."""
    asked: bool = False
    """A DescribeTransactions, not a registration call."""


@dataclass(frozen=True, slots=True)
class BeginPlan:
    """When a transaction's first registration goes, and whether to ask before it."""

    register_at: float | None
    """When every call of the registration goes together; None: now."""
    ask_at: float | None = None
    """When to send a DescribeTransactions first (only when the broker offers it): if it
    answers that the markers are written, the registration goes at once."""


AT_ONCE: Final = BeginPlan(None)
"""Every call of the registration at once: no window expected."""


class BeginWindow:
    """What kipside learned of one transactional id's marker window."""

    __slots__ = (
        "_asking",
        "_narrowing",
        "_trying",
        "calm",
        "coordinator",
        "ended_at",
        "floor",
        "hint",
        "margin",
        "step",
        "upper",
    )

    def __init__(self) -> None:
        self.ended_at: float | None = None
        """When the broker answered the id's last EndTxn without error (None: the next
        registration follows no known EndTxn)."""
        self.coordinator: int | None = None
        """The node whose windows these are."""
        self.upper: float | None = None
        """The earliest offset at which the coordinator was seen ready lately."""
        self.floor: float | None = None
        """The latest offset at which it was seen still writing markers."""
        self.hint: float | None = None
        """Just above a refusal where the coordinator was believed ready: tried next."""
        self.calm = 0
        """Transactions since the floor was learned."""
        self.step = FIRST_STEP_SECONDS
        """The next step down once the floor is old."""
        self.margin = TOLERANCE_SECONDS
        """How close to the floor the guess must come: doubled by each refusal of a
        registration sent when the coordinator was believed ready (its windows vary, or one
        grew), shrinking again while none is refused."""
        self._trying = False
        """The planned registration tries below `upper` (without DescribeTransactions)."""
        self._asking = False
        """The last plan could ask with DescribeTransactions."""
        self._narrowing = True
        """The bounds came from a hold (the ready one may be late by a probe's pace): halve
        the gap between them down to the margin. After a step down was refused, without
        DescribeTransactions (where each try may cost a refusal), only down to the first
        step."""

    def ended(self, at: float, coordinator: int) -> None:
        """The broker answered EndTxn without error at `at`: the coordinator now writes the
        markers. Another coordinator's windows are not this one's: they are forgotten."""
        if coordinator != self.coordinator:
            self.forget()
            self.coordinator = coordinator
        self.ended_at = at

    def forget(self) -> None:
        self.ended_at = self.upper = self.floor = self.hint = None
        self.calm, self.step, self.margin = 0, FIRST_STEP_SECONDS, TOLERANCE_SECONDS
        self._narrowing = True

    def no_window(self) -> None:
        """The next registration follows no EndTxn kipside saw (InitProducerId, a failure)."""
        self.ended_at = None

    def _fresh_floor(self) -> float | None:
        calm = CALM_TRANSACTIONS_ASKING if self._asking else CALM_TRANSACTIONS
        return self.floor if self.calm < calm else None

    def _guess(self) -> tuple[float | None, float | None]:
        """(safe, trial) offsets after EndTxn's answer: where the coordinator is believed
        ready, and an earlier one worth trying now (None: none). Safe is never closer than the
        margin to a fresh floor: a coordinator whose windows vary is given that much."""
        upper, floor = self.upper, self._fresh_floor()
        if upper is None:
            return (None, None) if self.floor is None else (self.floor + self.margin, None)
        safe = upper if self.floor is None else max(upper, self.floor + self.margin)
        if self.hint is not None and self.hint < safe:
            return safe, self.hint
        if floor is not None:
            close = self.margin if self._narrowing or self._asking else FIRST_STEP_SECONDS
            if upper - floor <= close:
                return safe, None
            return safe, max((upper + floor) / 2, floor + self.margin)
        trial = upper - self.step
        return safe, (trial if trial > 0 else None)

    def plan(self, now: float, *, can_ask: bool) -> BeginPlan:
        """When the next transaction's first registration goes, its call arriving at `now`.
        `can_ask`: the broker offers DescribeTransactions for this id."""
        self._trying = False
        if self.ended_at is None:
            return AT_ONCE
        self._asking = can_ask
        safe, trial = self._guess()
        if safe is None:
            return AT_ONCE
        register = self.ended_at + safe
        ask = None
        if trial is not None:
            if can_ask:
                ask = self.ended_at + trial
            else:
                register = self.ended_at + trial
                self._trying = register > now
        return BeginPlan(
            register if register > now else None,
            ask if ask is not None and now <= ask < register else None,
        )

    def learn(self, attempts: list[Attempt]) -> None:
        """What a transaction's first registration met, in sending order; called once it was
        accepted or given up. Learns from the window after the last EndTxn only."""
        if self.ended_at is None:
            return
        ended, self.ended_at = self.ended_at, None
        trying, self._trying = self._trying, False
        self.hint = None
        refused = [a.sent - ended for a in attempts if not a.ready]
        ready = [a.sent - ended for a in attempts if a.ready]
        first_ready = min(ready, default=None)
        if refused:
            highest = max(refused)
            if first_ready is not None and first_ready <= highest:
                # Calls sent together, one refused and one accepted: the window ended between
                # their arrivals, just after they went.
                first_ready = min(
                    [o for o in ready if o > highest] or [highest + TOLERANCE_SECONDS]
                )
            # A registration refused although it went where the coordinator was believed
            # ready (not a try below that): its windows vary more, or this one grew.
            surprise = not trying and any(not a.ready and not a.asked for a in attempts)
            if surprise and self.upper is not None:
                self.margin = min(self.margin * 2, MAX_MARGIN_SECONDS)
            # A refused step down leaves `upper` within that step; a refusal where the
            # coordinator was believed ready leaves it unsure.
            self._narrowing = surprise or self._fresh_floor() is not None
            self.floor, self.calm, self.step = highest, 0, FIRST_STEP_SECONDS
            if surprise or (self.upper is not None and self.upper <= highest):
                self.upper = None  # contradicted by a later refusal
            if surprise and (first_ready is None or highest + self.margin < first_ready):
                self.hint = highest + self.margin
        else:
            self.calm += 1
            self.margin = max(TOLERANCE_SECONDS, self.margin * MARGIN_DECAY)
            upper, stale = self.upper, self._fresh_floor() is None
            if stale and first_ready is not None and upper is not None and first_ready < upper:
                # A step down that held: a bigger one next.
                self.step = min(self.step * 2, MAX_EXPLORE_SECONDS)
        if first_ready is not None:
            if self.upper is None or first_ready < self.upper:
                self.upper = first_ready
            if self.floor is not None and self.floor >= self.upper:
                self.floor = None  # older than this acceptance, and contradicted by it


class HoldSchedule:
    """One held registration's pace: when its next probe may go, what it is, and when the
    hold gives up.

    `started` is when the client's call arrived; the first round (every call together) counts
    as the first probe. `asking`: the coordinator answers DescribeTransactions."""

    __slots__ = ("asking", "deadline", "expired", "next_at", "probes", "started")

    def __init__(self, started: float, deadline: float, *, asking: bool = False) -> None:
        self.started = started
        self.deadline = deadline
        self.asking = asking
        self.probes = 0
        self.next_at = started
        self.expired = False

    def due(self) -> float:
        """When the next probe may go: not before the pace allows, nor before librdkafka's
        schedule would have sent as many."""
        return max(self.next_at, self.started + self.probes * RETRY_SECONDS)

    def together(self) -> bool:
        """Whether the next probe is every call of the registration again rather than a
        DescribeTransactions. The first one after the first refusal is: a refusal where the
        coordinator was believed ready is most often the window's jitter, so it usually finds
        the coordinator ready and every call answered in that one round trip. Without
        DescribeTransactions every probe is, so that the one that is accepted registers
        everything at once."""
        return not self.asking or self.probes == 1

    def sent(self) -> None:
        self.probes += 1

    def refused(self, now: float) -> bool:
        """The coordinator refused (or said its markers are still being written), answered at
        `now`. True once the hold is over: the next probe would come after the deadline."""
        self.probes = max(self.probes, 1)
        self.next_at = max(self.next_at, now + PROBE_GAP_SECONDS)
        if self.due() > self.deadline:
            self.expired = True
        return self.expired
