"""Harness of the pipeline tests: two real brokers, Spark, and the `kipside` CLI with deadlines.

Fixtures:
  source_broker, dest_broker  session: two in-memory Tansu brokers (the mirror's two clusters).
  spark                       session: a local[2] SparkSession with kipside's sources registered
  spark_log                   session: where that session's JVM and Python workers write stderr
                              (Java 17 needed; `make system-deps` installs it).
  topic_name                  function: a topic name unique to the test.
  kipside_cli                 function: runs `kipside ARGS...` to completion within a deadline
                              (run_cli; start_cli starts it in the background).

Tests that start Spark (a session or a CLI job) are marked `spark`; the slowest are `slow`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from conftest import HARD_LIMIT, _watchdog_fire, running_tansu, unique_name
from testkit import procs
from testkit.broker import Broker

if TYPE_CHECKING:
    from kipside.pipeline.mirror.job import MirrorJob

REPO = Path(__file__).resolve().parents[2]
KIPSIDE = REPO / ".venv" / "bin" / "kipside"
CLI_TIMEOUT = 240.0


@pytest.fixture(autouse=True)
def _hard_deadline(request: pytest.FixtureRequest) -> Iterator[None]:
    """The suite's backstop against hangs (tests/conftest.py), with the limit a test marked
    hard_limit(SECONDS) asks for: those that start a Spark job again and again."""
    marker = request.node.get_closest_marker("hard_limit")
    seconds = float(marker.args[0]) if marker is not None else HARD_LIMIT
    timer = threading.Timer(seconds, _watchdog_fire, args=(request.node.nodeid,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@pytest.fixture(scope="session")
def source_broker() -> Iterator[Broker]:
    yield from running_tansu()


@pytest.fixture(scope="session")
def dest_broker() -> Iterator[Broker]:
    yield from running_tansu()


def require_java() -> None:
    if shutil.which("java") is None:
        raise RuntimeError(
            "Spark needs Java 17 and `java` is not on PATH: run `make system-deps` (it installs "
            "openjdk-17-jre-headless from Debian)"
        )


@pytest.fixture(scope="session")
def spark_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spark") / "spark.log"


@pytest.fixture(scope="session")
def spark(spark_log: Path) -> Iterator[Any]:
    require_java()
    from kipside.pipeline.spark import start_session

    session = start_session("kipside-tests", "local[2]", log_path=str(spark_log))
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    def make(prefix: str = "t") -> str:
        return unique_name(prefix, request)[:200]

    return make


@dataclass(frozen=True)
class CliResult:
    args: tuple[str, ...]
    code: int
    stdout: str
    stderr: str
    seconds: float

    def explain(self) -> str:
        return (
            f"kipside {' '.join(self.args)} exited {self.code} after {self.seconds:.1f} s\n"
            f"--- stdout ---\n{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-4000:]}"
        )


def start_cli(
    *args: str, stdout: int = subprocess.PIPE, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """`kipside ARGS` in the background (tracked, so a failed test leaves no Spark behind);
    stderr piped. Spark's Python is the one kipside picks (this venv's)."""
    require_java()
    proc = subprocess.Popen(
        [str(KIPSIDE), *args],
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    procs.track(proc)
    return proc


def run_cli(
    *args: str, timeout: float = CLI_TIMEOUT, env: dict[str, str] | None = None
) -> CliResult:
    """`kipside ARGS` to completion; a hang past `timeout` fails the test with its output."""
    started = time.monotonic()
    proc = start_cli(*args, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=10)
        raise AssertionError(
            f"kipside {' '.join(args)} still running after {timeout} s\n"
            f"--- stderr ---\n{err[-4000:]}"
        ) from None
    return CliResult(tuple(args), proc.returncode, out, err, time.monotonic() - started)


@pytest.fixture
def kipside_cli() -> Callable[..., CliResult]:
    return run_cli


def mirror_once(source: str, dest: str, topic: str, checkpoint: Path, **extra: Any) -> MirrorJob:
    """A MirrorJob that copies `topic` (exactly that name) from the `source` bootstrap to the
    `dest` one, once (availableNow), its progress in `checkpoint`; `extra` sets other fields."""
    from kipside.pipeline.mirror.job import MirrorJob

    return MirrorJob(
        source=source,
        dest=dest,
        topics=re.escape(topic),
        checkpoint=str(checkpoint),
        once=True,
        **extra,
    )


def run_in_process(spark: Any, job: Any, timeout: float = 180.0) -> Any:
    """Run a MirrorJob's query on the test session's Spark (no JVM start per test); returns
    the finished query, or raises the query's exception (what the CLI reports the root cause
    of) or AssertionError if it outlives `timeout`."""
    from kipside.pipeline.mirror.job import start_query

    query = start_query(spark, job)
    try:
        finished = query.awaitTermination(timeout)
    except Exception:
        raise
    if not finished:
        query.stop()
        raise AssertionError(f"the mirror query did not finish within {timeout} s")
    return query
