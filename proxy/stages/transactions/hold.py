"""The transaction-begin hold: while the coordinator answers a transactional id's registration
with CONCURRENT_TRANSACTIONS, keep probing it, one request at a time, until it is ready or the
rule's deadline passes.

While the previous transaction's markers are still being written the coordinator refuses the next
transaction's first registration; holding here spares the client its own backoff (librdkafka 20 ms;
Java and kafka-python 20 or 100 ms; franz-go 20 ms rising to 1 s) and the error. The client's slot
waits in its connection's response order meanwhile. Once the deadline passes the client gets the
coordinator's own answer.

The hold must cost the coordinator no more than the client would have: a registration's calls
(AddPartitionsToTxn, and AddOffsetsToTxn for each group) share one BeginHold, which keeps one
probe in flight per transactional id and never sends more probes than librdkafka's own
backoff on CONCURRENT_TRANSACTIONS (HOLD_RETRY_SECONDS) would have retried since the hold
began; a call that is not probing waits for the probe, and goes the moment one is accepted.
The coordinator's windows of a transactional id tend to last alike, so the hold also learns
them (features.transactions.state.TransactionState keeps the last few): while the shortest of
them, counted from the last EndTxn, has not passed, a transaction's first registration waits
until just before it ends and then probes alone, sparing the coordinator the refusals a client
collects on the way, and spends the probes it saved HOLD_PROBE_SECONDS apart, so the
transaction begins within a few ms of the coordinator being ready.

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
from kipside.proxy.telemetry.stats import Stats
from kipside.proxy.telemetry.tracing import event

T = TypeVar("T")

CONCURRENT_TRANSACTIONS: Final = int(ErrorCode.concurrent_transactions)
HOLD_RETRY_SECONDS: Final = 0.020
"""librdkafka's backoff after CONCURRENT_TRANSACTIONS (rdkafka_txnmgr.c); Java and kafka-python
use it for a transaction's first add too. A hold's n-th probe goes no earlier than n of these
after the hold started: never more probes than librdkafka would have retried by then."""
HOLD_PROBE_SECONDS: Final = 0.005
"""The closest two probes may follow each other, spending probes a hold saved while it waited
for an expected window's end."""


class BeginHold:
    """The hold of one registration: its calls share one probe of the coordinator.

    Without `probe_at`, every call goes at once (no window expected: one round trip for all)
    and the first CONCURRENT_TRANSACTIONS starts the hold. With it (the coordinator is expected
    to refuse until about then), the hold starts at once: one call probes alone, at `probe_at`.
    """

    def __init__(
        self, stats: Stats, span: Span | None, deadline: float, *, probe_at: float | None = None
    ) -> None:
        self.stats = stats
        self.span = span
        self.deadline = deadline
        self.probed_alone = probe_at is not None
        self._held = self.probed_alone
        self._expired = False
        self._probe = trio.Lock()
        self._started = trio.current_time()
        self._next_probe = self._started if probe_at is None else min(probe_at, deadline)
        self._probes = 0
        """Probes sent so far (a first round of calls sent together counts as one)."""
        self._began: float | None = None
        self.retries = 0
        self.refused_sent: float | None = None
        """When (trio clock) the last call the coordinator refused was sent."""
        self.accepted_sent: float | None = None
        """When the first call it accepted was sent."""

    def window_after(self, ended_at: float) -> float:
        """How long after `ended_at` (the last EndTxn's answer) the coordinator refused this
        registration, as far as the hold can tell: until the accepted call was sent (or the
        last refused one, if none was accepted). A probe sent alone and accepted at once only
        says the window was shorter: a little less than that is what the next transaction
        expects, so the guess comes down until it meets the window again. 0: no window."""
        if self.refused_sent is not None:
            until = self.refused_sent if self.accepted_sent is None else self.accepted_sent
            return max(until - ended_at, 0.0)
        if self.probed_alone and self.accepted_sent is not None:
            return max(self.accepted_sent - ended_at - HOLD_PROBE_SECONDS, 0.0)
        return 0.0

    async def call(
        self, upstream_call: str, attempt: Callable[[], Awaitable[T]], refused: Callable[[T], bool]
    ) -> T:
        """attempt()'s first answer that `refused` does not call CONCURRENT_TRANSACTIONS, or
        the refusal once the deadline has passed."""
        while True:
            if not self._held or self._expired:
                sent = trio.current_time()
                result = await attempt()
                if not refused(result):
                    self._release(upstream_call, sent)
                    return result
                if self._expired:
                    return result
                self._hold(upstream_call, sent)
                if self._expired:
                    return result
                continue
            async with self._probe:
                if self._held and not self._expired:
                    due = self._probe_due()
                    if self._began is None and due > trio.current_time():
                        self._begin(upstream_call)  # held for an expected window
                    await trio.sleep_until(due)
                if not self._held or self._expired:
                    continue  # the window closed (or the hold ended) while this call waited
                if self.refused_sent is not None:
                    self.retries += 1
                    self.stats.hold_retries += 1
                self._probes += 1
                sent = trio.current_time()
                result = await attempt()
                if not refused(result):
                    self._release(upstream_call, sent)
                    return result
                self._hold(upstream_call, sent)
                if self._expired:
                    return result

    def _probe_due(self) -> float:
        """When the next probe may go: not before the pace allows, nor before librdkafka's
        schedule would have sent as many."""
        return max(self._next_probe, self._started + self._probes * HOLD_RETRY_SECONDS)

    def _begin(self, upstream_call: str) -> None:
        self._began = time.monotonic()
        self.stats.holds += 1
        event(self.span, "kipside.txn.hold.begin", upstream_call=upstream_call)

    def _hold(self, upstream_call: str, sent: float) -> None:
        """The coordinator refused a call: probe again in HOLD_RETRY_SECONDS, unless that is
        past the deadline (then every call returns what it gets)."""
        self.refused_sent = sent
        if self._began is None:
            self._begin(upstream_call)
        if not self._held:  # the first round's refusal: it counts as one probe
            self._held = True
            self._probes = max(self._probes, 1)
        self._next_probe = max(self._next_probe, trio.current_time() + HOLD_PROBE_SECONDS)
        if self._probe_due() > self.deadline and not self._expired:
            self._expired = True
            self._finish(upstream_call, "timed_out")

    def _release(self, upstream_call: str, sent: float) -> None:
        self._held = False
        if self.accepted_sent is None:
            self.accepted_sent = sent
            if self._began is not None:
                self._finish(upstream_call, "ready")

    def _finish(self, upstream_call: str, outcome: str) -> None:
        assert self._began is not None
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


def first_probe_at(window_end: float | None, now: float) -> float | None:
    """When a transaction's first registration goes, held alone, if the coordinator is
    expected to refuse it until `window_end` (trio clock): just before that, or now; None when
    no window is expected (every call goes at once)."""
    if window_end is None or now >= window_end:
        return None
    return max(now, window_end - HOLD_PROBE_SECONDS)
