"""Tests for pipeline.progress: lag from a progress event's offsets, the status line on a
terminal and in a log, and the listener's running totals, with fake progress objects shaped
like pyspark's StreamingQueryProgress (no Spark session).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from kipside.pipeline import progress
from kipside.pipeline.progress import (
    LiveLine,
    ProgressListener,
    Totals,
    describe_lag,
    lag_by_partition,
)

QUERY = "kipside-mirror"
OBSERVED = "copied"
CLEAR = "\r\x1b[K"


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


class Clock:
    """Stands in for the time module in pipeline.progress."""

    def __init__(self, now: float) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


class Row:
    """Like pyspark.sql.Row: the observed metrics of one batch."""

    def __init__(self, **values: float | None) -> None:
        self.values = values

    def asDict(self) -> dict[str, float | None]:
        return dict(self.values)


def event(
    batch_id: int,
    *,
    name: str = QUERY,
    metrics: Mapping[str, float | None] | None = None,
    trigger_ms: int = 2000,
    end: str | None = None,
    latest: str | None = None,
    sources: bool = True,
) -> SimpleNamespace:
    """A StreamingQueryProgress with what the listener reads."""
    source = SimpleNamespace(endOffset=end, latestOffset=latest)
    return SimpleNamespace(
        name=name,
        batchId=batch_id,
        observedMetrics={} if metrics is None else {OBSERVED: Row(**metrics)},
        durationMs={"triggerExecution": trigger_ms},
        sources=[source] if sources else [],
    )


def render(totals: Totals) -> str:
    return f"{totals.batches} batches, {totals.sums.get('records', 0):.0f} records"


def listener(stream: io.StringIO | None = None) -> ProgressListener:
    return ProgressListener(
        QUERY, OBSERVED, render, LiveLine(stream or io.StringIO(), plain_interval=0)
    )


# ---- lag -----------------------------------------------------------------------------------


def test_lag_by_partition() -> None:
    end = '{"orders": {"0": 100, "1": 250}}'
    latest = '{"orders": {"0": 150, "1": 250}}'
    assert lag_by_partition(end, latest) == {("orders", 0): 50, ("orders", 1): 0}


def test_lag_is_never_negative() -> None:
    # A latest offset fetched before the batch read further (or a truncated log).
    assert lag_by_partition('{"t": {"0": 90}}', '{"t": {"0": 80}}') == {("t", 0): 0}


@pytest.mark.parametrize("end", [None, "null", ""])
def test_lag_without_an_end_offset(end: str | None) -> None:
    # No batch has ended yet: nothing is known to be behind.
    assert lag_by_partition(end, '{"t": {"0": 80}}') == {("t", 0): 0}


@pytest.mark.parametrize("latest", [None, "null"])
def test_lag_without_latest_offsets(latest: str | None) -> None:
    assert lag_by_partition('{"t": {"0": 80}}', latest) == {}


def test_lag_of_new_and_gone_partitions() -> None:
    end = '{"t": {"0": 10, "9": 5}}'
    latest = '{"t": {"0": 12, "1": 30}, "u": {"0": 7}}'
    # t-1 and u-0 appeared after the batch was planned: their start is unknown here, so no lag
    # is claimed for them; t-9 is gone, so it has none either.
    assert lag_by_partition(end, latest) == {("t", 0): 2, ("t", 1): 0, ("u", 0): 0}


def test_describe_lag_top_three_with_separators() -> None:
    lag = {("a", 0): 1_500_000, ("b", 1): 20, ("c", 2): 3_000, ("d", 3): 7, ("e", 4): 0}
    assert describe_lag(lag) == "lag 1,503,027 (a-0 1,500,000, c-2 3,000, b-1 20)"


def test_describe_lag_leaves_out_caught_up_partitions() -> None:
    assert describe_lag({("a", 0): 0, ("b", 0): 4}) == "lag 4 (b-0 4)"
    assert describe_lag({("a", 0): 0}) == "lag 0"
    assert describe_lag({}) == "lag 0"


def test_describe_lag_top() -> None:
    lag = {("a", 0): 5, ("b", 0): 4}
    assert describe_lag(lag, top=1) == "lag 9 (a-0 5)"


# ---- LiveLine ------------------------------------------------------------------------------


def test_plain_stream_gets_a_line_at_most_every_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(1000.0)
    monkeypatch.setattr(progress, "time", clock)
    out = io.StringIO()
    line = LiveLine(out, plain_interval=10.0)
    assert not line.tty
    line.update("one")  # the first is shown
    clock.now += 4
    line.update("two")  # too soon
    clock.now += 6
    line.update("three")  # 10 s after the last one shown
    clock.now += 9.9
    line.update("four")
    line.finish("done")  # always shown
    assert out.getvalue() == "one\nthree\ndone\n"


def test_plain_stream_shows_the_first_line_whatever_the_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(progress, "time", Clock(3.0))
    out = io.StringIO()
    LiveLine(out, plain_interval=10.0).update("one")
    assert out.getvalue() == "one\n"


def test_terminal_line_is_rewritten_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "time", Clock(1000.0))  # no rate limit on a terminal
    out = Terminal()
    line = LiveLine(out, plain_interval=10.0)
    assert line.tty
    line.update("one")
    line.update("two")
    assert out.getvalue() == f"{CLEAR}one{CLEAR}two"
    line.finish("done")
    assert out.getvalue() == f"{CLEAR}one{CLEAR}two{CLEAR}done\n"


def test_terminal_finish_without_a_line_shown() -> None:
    out = Terminal()
    line = LiveLine(out)
    line.finish("done")
    line.finish("again")  # a finished line is not cleared twice
    assert out.getvalue() == "done\nagain\n"


# ---- ProgressListener ----------------------------------------------------------------------


def test_record_accumulates_sums_rates_and_lag() -> None:
    lst = listener()
    assert lst.record(
        event(
            0,
            metrics={"records": 100, "bytes": 4000},
            trigger_ms=2000,
            end='{"t": {"0": 100}}',
            latest='{"t": {"0": 150}}',
        )
    )
    assert lst.record(
        event(
            1,
            metrics={"records": 50, "bytes": None},
            trigger_ms=500,
            end='{"t": {"0": 150}}',
            latest='{"t": {"0": 170}}',
        )
    )
    assert lst.totals.batches == 2
    assert lst.totals.sums == {"records": 150.0, "bytes": 4000.0}
    # Rates are the last batch's, per second of its trigger.
    assert lst.totals.rates == {"records": 100.0, "bytes": 0.0}
    assert lst.totals.lag == {("t", 0): 20}


def test_a_batch_without_metrics_or_sources_still_counts() -> None:
    lst = listener()
    assert lst.record(event(0, metrics=None, sources=False, trigger_ms=0))
    assert lst.totals == Totals(batches=1)


def test_a_batch_is_counted_once() -> None:
    lst = listener()
    assert lst.record(event(7, metrics={"records": 10}))
    assert not lst.record(event(7, metrics={"records": 10}))
    assert lst.totals.batches == 1
    assert lst.totals.sums == {"records": 10.0}


def test_catch_up_adds_only_the_batches_missed() -> None:
    lst = listener()
    lst.record(event(0, metrics={"records": 1}))
    lst.record(event(2, metrics={"records": 4}))
    # The query's recentProgress at the end: events 1 and 3 never reached the listener.
    lst.catch_up([event(i, metrics={"records": 1 << i}) for i in range(4)])
    assert lst.totals.batches == 4
    assert lst.totals.sums == {"records": 15.0}


def test_other_queries_are_ignored() -> None:
    lst = listener()
    assert not lst.record(event(0, name="someone-else", metrics={"records": 99}))
    lst.catch_up([event(1, name="someone-else", metrics={"records": 99})])
    assert lst.totals == Totals()
    # Their batch ids don't shadow ours.
    assert lst.record(event(0, metrics={"records": 1}))
    assert lst.totals.sums == {"records": 1.0}


def test_on_query_progress_updates_the_line() -> None:
    out = io.StringIO()
    lst = listener(out)
    lst.onQueryProgress(SimpleNamespace(progress=event(0, metrics={"records": 3})))
    lst.onQueryProgress(SimpleNamespace(progress=event(0, metrics={"records": 3})))  # again
    lst.onQueryProgress(SimpleNamespace(progress=event(1, name="other")))
    lst.onQueryProgress(SimpleNamespace(progress=event(1, metrics={"records": 4})))
    assert out.getvalue() == "1 batches, 3 records\n2 batches, 7 records\n"


class ContendedLock:
    """A lock that tells when a second thread has to wait for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.contended = threading.Event()

    def __enter__(self) -> ContendedLock:
        if not self._lock.acquire(blocking=False):
            self.contended.set()
            self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class Paused(SimpleNamespace):
    """A progress event whose batchId, the second time it is read (inside the listener's
    lock), waits until another thread is waiting for that lock."""

    def __init__(self, lock: ContendedLock, inside: threading.Event, **fields: Any) -> None:
        super().__init__(**fields)
        self._reads = 0
        self._lock = lock
        self._inside = inside

    def __getattribute__(self, name: str) -> Any:
        if name == "batchId":
            self._reads += 1
            if self._reads == 2:
                self._inside.set()
                self._lock.contended.wait(timeout=5)
        return super().__getattribute__(name)


def test_a_batch_is_counted_once_across_threads() -> None:
    lst = listener()
    lock = ContendedLock()
    lst._lock = lock  # type: ignore[assignment]  # to see the second thread reach the lock
    inside = threading.Event()
    late = event(5, metrics={"records": 10})
    paused = Paused(lock, inside, **vars(late))
    delivered = threading.Thread(target=lst.record, args=(paused,))  # the listener bus
    delivered.start()
    assert inside.wait(timeout=5)
    caught_up = threading.Thread(target=lst.catch_up, args=([late],))  # the job, at the end
    caught_up.start()
    delivered.join(timeout=10)
    caught_up.join(timeout=10)
    assert not delivered.is_alive() and not caught_up.is_alive()
    assert lst.totals.batches == 1
    assert lst.totals.sums == {"records": 10.0}
