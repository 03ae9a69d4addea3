"""Live progress of a pipeline job, from Spark's own streaming progress events.

Each micro-batch's StreamingQueryProgress carries what the job observed (DataFrame.observe:
counts and bytes), the source's end offsets and its latest offsets. From those this listener
keeps running totals, rates and the lag per partition, and shows them on one line: rewritten in
place when stderr is a terminal, printed at most every `plain_interval` seconds otherwise (so
logs stay readable), and once more at the end. Anything reading the same events (a Spark
listener, the query's recentProgress) sees the same figures.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from pyspark.sql.streaming.listener import StreamingQueryListener

__all__ = ["LiveLine", "ProgressListener", "Totals", "lag_by_partition"]

TopicPartition = tuple[str, int]
_SEEN_KEPT = 10_000


class LiveLine:
    """One status line on a stream."""

    def __init__(self, stream: TextIO | None = None, *, plain_interval: float = 10.0) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.plain_interval = plain_interval
        self._last_plain = -math.inf
        self._lock = threading.Lock()
        self._shown = False

    def update(self, text: str) -> None:
        with self._lock:
            if self.tty:
                self.stream.write("\r\x1b[K" + text)
                self._shown = True
            elif time.monotonic() - self._last_plain >= self.plain_interval:
                self.stream.write(text + "\n")
                self._last_plain = time.monotonic()
            self.stream.flush()

    def notice(self, text: str) -> None:
        """A line of its own, above the live line (which the next update redraws)."""
        with self._lock:
            if self.tty and self._shown:
                self.stream.write("\r\x1b[K")
                self._shown = False
            self.stream.write(text + "\n")
            self.stream.flush()

    def finish(self, text: str) -> None:
        with self._lock:
            if self.tty and self._shown:
                self.stream.write("\r\x1b[K")
            self.stream.write(text + "\n")
            self.stream.flush()
            self._shown = False


def _offsets(text: str | None) -> dict[TopicPartition, int]:
    if not text or text == "null":
        return {}
    data = json.loads(text)
    return {(t, int(p)): int(o) for t, parts in data.items() for p, o in parts.items()}


def lag_by_partition(end: str | None, latest: str | None) -> dict[TopicPartition, int]:
    """Offsets not yet read per partition: the source's latest offset minus the batch's end."""
    ends = _offsets(end)
    return {tp: max(off - ends.get(tp, off), 0) for tp, off in _offsets(latest).items()}


@dataclass
class Totals:
    """Running sums of one observed-metrics row, plus the latest rates and lag."""

    sums: dict[str, float] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)
    lag: dict[TopicPartition, int] = field(default_factory=dict)
    batches: int = 0


class ProgressListener(StreamingQueryListener):
    """Accumulates `observed` metrics of the query named `query_name` and shows them with
    `render(totals)`; `on_progress` (optional) sees every raw progress event too."""

    def __init__(
        self,
        query_name: str,
        observed: str,
        render: Callable[[Totals], str],
        line: LiveLine | None = None,
    ) -> None:
        self.query_name = query_name
        self.observed = observed
        self.render = render
        self.line = line or LiveLine()
        self.totals = Totals()
        self._seen: set[int] = set()
        self._order: deque[int] = deque()
        self._lock = threading.Lock()

    def onQueryStarted(self, event: Any) -> None:
        """Nothing to show until the first micro-batch ends."""

    def onQueryProgress(self, event: Any) -> None:
        if self.record(event.progress):
            self.line.update(self.render(self.totals))

    def record(self, progress: Any) -> bool:
        """Add one micro-batch's figures (once per batch id); False if not ours or seen."""
        if progress.name != self.query_name:
            return False
        with self._lock:
            if progress.batchId in self._seen:
                return False
            self._seen.add(progress.batchId)
            self._order.append(progress.batchId)
            if len(self._order) > _SEEN_KEPT:
                self._seen.discard(self._order.popleft())
            self.totals.batches += 1
            row = progress.observedMetrics.get(self.observed)
            values: Mapping[str, Any] = row.asDict() if row is not None else {}
            seconds = max(progress.durationMs.get("triggerExecution", 0), 1) / 1000
            for key, value in values.items():
                number = float(value or 0)
                self.totals.sums[key] = self.totals.sums.get(key, 0.0) + number
                self.totals.rates[key] = number / seconds
            source = progress.sources[0] if progress.sources else None
            if source is not None:
                self.totals.lag = lag_by_partition(source.endOffset, source.latestOffset)
        return True

    def catch_up(self, progresses: Iterable[Any]) -> None:
        """Events are delivered asynchronously: at the end, take any the listener missed
        from the query's recentProgress."""
        for progress in progresses:
            self.record(progress)

    def onQueryIdle(self, event: Any) -> None:
        """An idle trigger reads nothing; the line keeps the last figures."""

    def onQueryTerminated(self, event: Any) -> None:
        """The job prints its own summary."""


def describe_lag(lag: Mapping[TopicPartition, int], top: int = 3) -> str:
    total = sum(lag.values())
    worst = sorted(((n, tp) for tp, n in lag.items() if n > 0), reverse=True)[:top]
    detail = ", ".join(f"{t}-{p} {n:,}" for n, (t, p) in worst)
    return f"lag {total:,}" + (f" ({detail})" if detail else "")
