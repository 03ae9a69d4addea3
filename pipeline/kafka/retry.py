"""How the pipeline's Kafka client retries: librdkafka's policy, through tenacity.

librdkafka retries retriable errors after refreshing metadata, backing off exponentially from
retry.backoff.ms (100 ms) to retry.backoff.max.ms (1 s) with jitter, until the operation's
timeout. The same knobs keep Kafka's client config names here (see docs/mirror.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

from .errors import ClusterUnreachable, RetriableError

__all__ = ["RetryPolicy", "call_with_retries"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    backoff_ms: int = 100
    backoff_max_ms: int = 1000
    timeout_ms: int = 60_000
    """How long one operation may keep retrying (Kafka's default.api.timeout.ms)."""


def call_with_retries(
    what: str,
    attempt: Callable[[], T],
    policy: RetryPolicy,
    *,
    before_retry: Callable[[RetriableError], None] | None = None,
) -> T:
    """Run `attempt` until it succeeds, retrying RetriableError under `policy`.

    `before_retry` runs after each retriable failure (a metadata refresh, a reconnect). When the
    deadline passes, ClusterUnreachable says what was tried, for how long, and the last reason.
    """
    started = time.monotonic()

    def _before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if before_retry is not None and isinstance(exc, RetriableError):
            before_retry(exc)

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(RetriableError),
        wait=tenacity.wait_exponential_jitter(
            multiplier=policy.backoff_ms / 1000,
            max=policy.backoff_max_ms / 1000,
            jitter=policy.backoff_ms / 1000 / 5,
        ),
        stop=tenacity.stop_after_delay(policy.timeout_ms / 1000),
        before_sleep=_before_sleep,
    )
    try:
        return retrying(attempt)
    except tenacity.RetryError as exc:
        last = exc.last_attempt.exception()
        tries = exc.last_attempt.attempt_number
        elapsed = time.monotonic() - started
        raise ClusterUnreachable(
            f"{what}: gave up after {tries} attempts in {elapsed:.1f} s; last error: {last}"
        ) from last
