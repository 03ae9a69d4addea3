"""What `kipside mirror` and `kipside lake` share as long-running Spark jobs.

- `preflight`: dial the source and resolve the topic pattern before Spark starts, so an
  unreachable cluster or a pattern that matches nothing fails in a second with one line.
- `JobFiles`: the files a job keeps beside its checkpoint (Spark's log, the stop marker, the
  notices from the driver's source process).
- `start_stream`: start a query's writer, draining what is there (--once) or on a timer.
- `run_query`: start the streaming query, wait for it while printing notices, stop it between
  micro-batches on SIGINT/SIGTERM, and report a failure by its root cause: the kipside error
  inside Spark's wrapping, not Spark's stack trace.
- `announce`: the one line a job prints before Spark starts: what it reads, where it goes.
- `run_with_progress`: `run_query` under a live line of the query's figures, then the final
  figures, the error if any, and the command's exit status.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any, Final, Protocol, TextIO

from kipside.pipeline.kafka.client import KafkaClient
from kipside.pipeline.kafka.errors import KafkaError, TopicNotFound
from kipside.pipeline.kafka.retry import RetryPolicy
from kipside.pipeline.notices import NoticeReader
from kipside.pipeline.progress import LiveLine, ProgressListener, Totals
from kipside.pipeline.source.options import OptionError, parse_source_options
from kipside.pipeline.source.planner import Planner

__all__ = [
    "Companion",
    "JobFiles",
    "announce",
    "preflight",
    "root_cause",
    "run_query",
    "run_with_progress",
    "start_stream",
]

STOP_GRACE_SECONDS: Final = 60.0
_EXCEPTION_LINE: Final = re.compile(r"^[A-Za-z_][\w.]*(?::|$)")
_SPARK_PREFIX: Final = re.compile(r"^\[[A-Z_]+\] Query \[[^\]]*\] terminated with exception: ")
_CAUSE: Final = re.compile(
    r"^(kipside\.(?:pipeline|protocol)\.[\w.]+\.\w+|[\w.]*OptionError|[\w.]*SchemaError): (.+)$",
    re.MULTILINE,
)


@dataclass(frozen=True)
class JobFiles:
    """Files beside the checkpoint `DIR`: `DIR.spark.log`, `DIR.stopping`, `DIR.notices`."""

    checkpoint: str

    def _beside(self, suffix: str) -> str:
        path = Path(self.checkpoint)
        return str(path.parent / f"{path.name}.{suffix}")

    @property
    def spark_log(self) -> str:
        return self._beside("spark.log")

    @property
    def stop_marker(self) -> str:
        return self._beside("stopping")

    @property
    def notices(self) -> str:
        return self._beside("notices")


def preflight(
    source_options: dict[str, str], *, timeout_ms: int, flag: str, client_id: str
) -> list[tuple[str, int]]:
    """The partitions the job will read; KafkaError/OptionError if the source can't be used.

    Messages name the command's `flag` where the source would name subscribePattern.
    """
    try:
        options = parse_source_options(source_options, streaming=True)
        config = replace(
            options.client, client_id=client_id, retry=RetryPolicy(timeout_ms=timeout_ms)
        )
        with KafkaClient(options.bootstrap, role=options.role, config=config) as source:
            return Planner(source, options).partitions()
    except (TopicNotFound, OptionError) as exc:
        raise type(exc)(str(exc).replace("option subscribePattern:", flag)) from None


def exit_status(exc: Exception) -> int:
    """A job's exit status for an error found before it started: 2 for what the command line
    or its files said (an option, a schema), as for argparse's own usage errors; 1 for what
    the clusters said."""
    return 1 if isinstance(exc, KafkaError) else 2


def announce(
    err: TextIO, command: str, partitions: list[tuple[str, int]], route: str, files: JobFiles
) -> None:
    """Say on `err` how much the job reads, `route` (from where to where), and where its
    checkpoint and Spark's log are."""
    topics = {topic for topic, _ in partitions}
    err.write(
        f"{command}: {len(topics)} topic(s), {len(partitions)} partition(s) {route}; "
        f"checkpoint {files.checkpoint}; Spark's log: {files.spark_log}\n"
    )
    err.flush()


def root_cause(exc: BaseException) -> str:
    """What failed, in one line, from inside Spark's wrapping: the exception that ended the
    last Python traceback in the text (a kipside error by its message alone, any other as
    `ModuleNotFoundError: No module named ...`), else the kipside error Spark quotes, else
    Spark's own first line."""
    text = str(exc)
    raised = _python_exceptions(text)
    if raised:
        last = raised[-1]
        found = _CAUSE.match(last)
        return str(found.group(2)).strip() if found else last[:500]
    found_all = _CAUSE.findall(text)
    if found_all:
        return str(found_all[-1][1]).strip()
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return _SPARK_PREFIX.sub("", first)[:500]


def _python_exceptions(text: str) -> list[str]:
    """The line naming the exception at the end of each Python traceback in `text`."""
    out = []
    in_traceback = False
    for line in text.splitlines():
        if line.startswith("Traceback (most recent call last):") or line.endswith(
            "Traceback (most recent call last):"
        ):
            in_traceback = True
        elif in_traceback and line and not line[0].isspace():
            if _EXCEPTION_LINE.match(line):
                out.append(line.strip())
            in_traceback = False
    return out


def start_stream(writer: Any, *, once: bool, trigger_seconds: float) -> Any:
    """Start a DataStreamWriter: with `once`, on what is there now and then stop; otherwise a
    micro-batch every `trigger_seconds`. Returns the StreamingQuery."""
    if once:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime=f"{trigger_seconds} seconds").start()


class Companion(Protocol):
    """Work a job runs beside its query on the driver (the mirror's group sync)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


def run_query(
    start: Callable[[], Any],
    files: JobFiles,
    line: LiveLine,
    command: str,
    companion: Companion | None = None,
) -> tuple[str, str | None, Any]:
    """Start a query and wait for it: ("done" | "stopped", root cause or None, query)."""
    Path(files.stop_marker).unlink(missing_ok=True)  # left by a stop that was itself killed
    notices = NoticeReader(files.notices)
    if companion is not None:
        companion.start()

    def show_notices() -> None:
        for text in notices.new():
            line.notice(f"{command}: warning: {text}")

    query = None
    error: str | None
    try:
        query = start()
    except Exception as exc:  # planning failed: Spark wraps the data source's own error
        outcome, error = "stopped", root_cause(exc)
    else:
        outcome, error = _wait(query, files.stop_marker, show_notices)
    if companion is not None:
        companion.stop()
    show_notices()
    notices.close()
    return outcome, error, query


def run_with_progress(
    spark: Any,
    start: Callable[[], Any],
    files: JobFiles,
    err: TextIO,
    command: str,
    query_name: str,
    render: Callable[[Totals], str],
    companion: Companion | None = None,
) -> int:
    """Run the query named `query_name` (its observed metrics carry the same name) under a live
    line of `render(totals)` on `err`; print the final figures and the error if any, stop Spark,
    and return the exit status."""
    line = LiveLine(err)
    listener = ProgressListener(query_name, query_name, render, line)
    spark.streams.addListener(listener)
    outcome, error, query = run_query(start, files, line, command, companion)
    if query is not None:
        listener.catch_up(query.recentProgress)
    line.finish(f"{command}: {outcome}: {render(listener.totals).split(': ', 1)[1]}")
    if error:
        err.write(f"{command}: error: {error}\n")
    spark.stop()
    return 1 if error else 0


def _wait(query: Any, stop_marker: str, tick: Callable[[], None]) -> tuple[str, str | None]:
    stopping = {"asked": False}

    def ask_to_stop(signum: int, _frame: FrameType | None) -> None:
        stopping["asked"] = True

    previous = {s: signal.signal(s, ask_to_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while query.isActive and not stopping["asked"]:
            query.awaitTermination(0.5)
            tick()
        if stopping["asked"] and query.isActive:
            _stop_between_batches(query, stop_marker)
            return "stopped", None
        query.awaitTermination()
        return "done", None
    except Exception as exc:
        return "stopped", root_cause(exc)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _stop_between_batches(query: Any, stop_marker: str) -> None:
    """Let the running micro-batch commit, then stop (within STOP_GRACE_SECONDS).

    The marker file makes the source report no new data, so once the running trigger ends
    no other one starts a micro-batch; stopping then interrupts nothing.
    """
    marker = Path(stop_marker)
    marker.touch()
    try:
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        time.sleep(0.2)
        while time.monotonic() < deadline and query.status.get("isTriggerActive"):
            time.sleep(0.05)
        query.stop()
    finally:
        marker.unlink(missing_ok=True)
