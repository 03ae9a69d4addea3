"""Latency percentiles in bounded memory: a histogram of logarithmic buckets 1% wide.

A capture of a gigabyte holds millions of round trips; keeping each would grow with the file.
Buckets 1% wide from 1 microsecond to beyond an hour are a few thousand integers per API,
whatever the capture's size, and a percentile read from them is within 0.5% of the exact one
(the bucket's geometric middle). Percentiles are by nearest rank, as everywhere in kipside.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["LatencyHistogram"]

_GROWTH: Final = 1.01
_LOG_GROWTH: Final = math.log(_GROWTH)
_FLOOR: Final = 1e-6  # seconds: one microsecond, the resolution of a pcap timestamp


class LatencyHistogram:
    """Counts of latencies (seconds) per logarithmic bucket."""

    __slots__ = ("_buckets", "count")

    def __init__(self) -> None:
        self._buckets: dict[int, int] = {}
        self.count = 0

    def add(self, seconds: float) -> None:
        index = -1 if seconds < _FLOOR else int(math.log(seconds / _FLOOR) / _LOG_GROWTH)
        self._buckets[index] = self._buckets.get(index, 0) + 1
        self.count += 1

    def percentile(self, p: float) -> float:
        """The p-th percentile (0 < p <= 100) in seconds, by nearest rank; NaN when empty."""
        if not self.count:
            return math.nan
        rank = max(1, math.ceil(p / 100 * self.count))
        seen = 0
        for index in sorted(self._buckets):
            seen += self._buckets[index]
            if seen >= rank:
                return _middle(index)
        raise AssertionError("unreachable: ranks stop at the count")


def _middle(index: int) -> float:
    if index < 0:
        return 0.0
    middle: float = _FLOOR * _GROWTH ** (index + 0.5)
    return middle
