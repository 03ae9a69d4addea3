"""Per-API request rates over the last few seconds, from samples of Stats' cumulative counters.

Used by the status page (GET /status.json) and `kipside dev`'s live line. Pure arithmetic on
numbers it is given: it never reads a clock or sleeps (the caller samples).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Final

from kipside.proxy.telemetry.stats import Stats

RATE_SAMPLE_SECONDS: Final = 1.0
RATE_WINDOW_SAMPLES: Final = 6
"""Request rates are averaged over the last ~5 s."""


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float
    client: Counter[int]
    upstream: Counter[int]


class RateWindow:
    """Per-API request rates over the last few samples of the cumulative counters."""

    def __init__(self, samples: int = RATE_WINDOW_SAMPLES) -> None:
        self._samples: deque[_Sample] = deque(maxlen=samples)

    def sample(self, now: float, stats: Stats) -> None:
        self._samples.append(
            _Sample(now, Counter(stats.client_requests), Counter(stats.upstream_requests))
        )

    def rates(
        self, now: float, stats: Stats
    ) -> tuple[float, dict[int, float], dict[int, float]] | None:
        """(window seconds, client rates, upstream rates by api key), or None before the
        first sample."""
        if not self._samples:
            return None
        oldest = self._samples[0]
        window = now - oldest.at
        if window <= 0:
            return None
        client = {k: (v - oldest.client[k]) / window for k, v in stats.client_requests.items()}
        upstream = {
            k: (v - oldest.upstream[k]) / window for k, v in stats.upstream_requests.items()
        }
        return window, client, upstream
