"""The transaction-begin hold: retry a registration the coordinator answers with
CONCURRENT_TRANSACTIONS, every few ms, until the rule's deadline.

While the previous transaction's markers are still being written the coordinator refuses the
next transaction's first registration; holding here spares the client its own backoff (20 ms
to 1 s, kafka-rules.md). The client's slot waits in its connection's response order meanwhile.
Once the deadline passes the client gets the coordinator's own answer.
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
HOLD_FIRST_RETRY_SECONDS: Final = 0.002
HOLD_MAX_RETRY_SECONDS: Final = 0.010


async def held(
    stats: Stats,
    span: Span | None,
    upstream_call: str,
    deadline: float,
    attempt: Callable[[], Awaitable[T]],
    concurrent: Callable[[T], bool],
) -> T:
    """Run attempt() until it isn't CONCURRENT_TRANSACTIONS or the deadline passes."""
    started = time.monotonic()
    delay = HOLD_FIRST_RETRY_SECONDS
    retries = 0
    while True:
        result = await attempt()
        if not concurrent(result) or trio.current_time() + delay > deadline:
            if retries:
                held_for = time.monotonic() - started
                stats.hold_seconds.observe(held_for)
                event(
                    span,
                    "kipside.txn.hold.release",
                    upstream_call=upstream_call,
                    held_ms=round(held_for * 1000, 3),
                    retries=retries,
                    outcome="timed_out" if concurrent(result) else "ready",
                )
            return result
        if not retries:
            stats.holds += 1
            event(span, "kipside.txn.hold.begin", upstream_call=upstream_call)
        retries += 1
        stats.hold_retries += 1
        await trio.sleep(delay)
        delay = min(delay * 2, HOLD_MAX_RETRY_SECONDS)
