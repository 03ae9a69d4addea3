"""The transaction-begin hold: while the coordinator answers a transactional id's registration
with CONCURRENT_TRANSACTIONS, keep probing it, one request at a time, until it is ready or the
rule's deadline passes.

While the previous transaction's markers are still being written the coordinator refuses the
next transaction's first registration; holding here spares the client its own backoff (20 ms
to 1 s, kafka-rules.md) and the error. The client's slot waits in its connection's response
order meanwhile. Once the deadline passes the client gets the coordinator's own answer.

The hold must cost the coordinator no more than the client would have: a registration's calls
(AddPartitionsToTxn, and AddOffsetsToTxn for each group) share one BeginHold, which keeps one
probe in flight per transactional id and sends it every HOLD_RETRY_SECONDS, librdkafka's own
backoff on CONCURRENT_TRANSACTIONS; a call that is not probing waits for the probe, and goes
the moment one is accepted. When the previous transaction of the id met a window that is still
likely open, only one call goes first (features.transactions.state.TransactionState).
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
use it for a transaction's first add too."""


class BeginHold:
    """The hold of one registration: its calls share one probe of the coordinator.

    `window_likely` starts it held, so the first call probes alone; otherwise every call goes
    at once (no window expected: one round trip for all) and the first CONCURRENT_TRANSACTIONS
    starts the hold.
    """

    def __init__(
        self, stats: Stats, span: Span | None, deadline: float, *, window_likely: bool = False
    ) -> None:
        self.stats = stats
        self.span = span
        self.deadline = deadline
        self._held = window_likely
        self._expired = False
        self._probe = trio.Lock()
        self._next_probe = trio.current_time()
        self._began: float | None = None
        self.retries = 0
        self.last_refusal: float | None = None
        """When (trio clock) the coordinator last answered CONCURRENT_TRANSACTIONS."""
        self.closed_at: float | None = None
        """When it first accepted a call after refusing one (the window closed)."""

    async def call(
        self, upstream_call: str, attempt: Callable[[], Awaitable[T]], refused: Callable[[T], bool]
    ) -> T:
        """attempt()'s first answer that `refused` does not call CONCURRENT_TRANSACTIONS, or
        the refusal once the deadline has passed."""
        while True:
            if not self._held or self._expired:
                result = await attempt()
                if not refused(result):
                    self._release(upstream_call)
                    return result
                if self._expired:
                    return result
                self._hold(upstream_call)
                if self._expired:
                    return result
                continue
            async with self._probe:
                if self._held and not self._expired:
                    await trio.sleep_until(self._next_probe)
                if not self._held or self._expired:
                    continue  # the window closed (or the hold ended) while this call waited
                if self._began is not None:
                    self.retries += 1
                    self.stats.hold_retries += 1
                result = await attempt()
                if not refused(result):
                    self._release(upstream_call)
                    return result
                self._hold(upstream_call)
                if self._expired:
                    return result

    def _hold(self, upstream_call: str) -> None:
        """The coordinator refused a call: probe again in HOLD_RETRY_SECONDS, unless that is
        past the deadline (then every call returns what it gets)."""
        now = self.last_refusal = trio.current_time()
        if self._began is None:
            self._began = time.monotonic()
            self.stats.holds += 1
            event(self.span, "kipside.txn.hold.begin", upstream_call=upstream_call)
        if now + HOLD_RETRY_SECONDS > self.deadline:
            if not self._expired:
                self._expired = True
                self._finish(upstream_call, "timed_out")
            return
        if not self._held:
            self._held = True
            self._next_probe = now + HOLD_RETRY_SECONDS
        else:
            self._next_probe = max(self._next_probe, now + HOLD_RETRY_SECONDS)

    def _release(self, upstream_call: str) -> None:
        self._held = False
        if self._began is not None and self.closed_at is None:
            self.closed_at = trio.current_time()
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
