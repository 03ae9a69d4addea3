"""The end-to-end harness: a real broker (Tansu), kipside in front of it, real clients.

Fixtures:
  tansu       session: the in-memory Tansu broker (node id 111), killed at session end.
  kipside     session: `kipside serve` in front of tansu (testkit.kipside.start_kipside), stopped
              with SIGTERM at session end (it must exit 0 within 10 s). Skips the test when
              KIPSIDE_TEST_DIRECT=1.
  target      session: the endpoint clients dial: kipside by default, Tansu itself when
              KIPSIDE_TEST_DIRECT=1 (to tell a broker limitation from a proxy bug).
  bootstrap   function: target.bootstrap, after checking kipside is still running.
  new_topic   function: a factory creating a topic whose name is unique to the test.
  direct_probe session: asks the broker itself (no kipside) whether it can do something, so a
              failure through kipside can be told apart from a broker limitation.

KIPSIDE_TEST_SERVE_ARGS adds arguments to `kipside serve` (e.g. "--one-to-one");
KIPSIDE_TEST_KEEP_LOG=PATH copies kipside's stderr log there at the end of the session.

No test may hang: every network step in the tests has its own deadline, and `_hard_deadline`
is a backstop that dumps every thread's stack, kills the broker and kipside and exits if one
test runs longer than KIPSIDE_TEST_HARD_LIMIT seconds (default 180).
"""

from __future__ import annotations

import faulthandler
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from testkit import procs, tools
from testkit.broker import Broker, start_tansu
from testkit.kipside import Kipside, start_kipside, started_logs, tail

HARD_LIMIT = float(os.environ.get("KIPSIDE_TEST_HARD_LIMIT", "180"))
DIRECT = os.environ.get("KIPSIDE_TEST_DIRECT", "") not in ("", "0")
ONE_TO_ONE = "--one-to-one" in shlex.split(os.environ.get("KIPSIDE_TEST_SERVE_ARGS", ""))

# Every JVM the suite starts (the Spark session, each CLI job's driver, executors, standalone
# workers) compiles with the JIT's first tier only: the suite starts dozens of short-lived
# Spark JVMs, and the optimising compiler spends more CPU on each than it saves on test-sized
# data. The java launcher reads this variable and notes it on the JVM's stderr, which kipside
# sends to the Spark log. Benchmarks do not load this file, so their JVMs run as users' do.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")

# --------------------------------------------------------------------------- broker


@pytest.fixture(scope="session")
def tansu() -> Iterator[Broker]:
    yield from running_tansu()


def running_tansu() -> Iterator[Broker]:
    """A Tansu broker on loopback for as long as the generator runs (fixtures yield from it)."""
    with start_tansu() as broker:
        yield broker


# --------------------------------------------------------------------------- kipside


@pytest.fixture(scope="session")
def kipside(tansu: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kipside]:
    if DIRECT:
        pytest.skip("KIPSIDE_TEST_DIRECT=1: clients talk to Tansu directly, no kipside")
    ks = start_kipside(tansu, tmp_path_factory.mktemp("kipside"))
    try:
        yield ks
    finally:
        code = ks.stop()
        keep = os.environ.get("KIPSIDE_TEST_KEEP_LOG")
        if keep:
            shutil.copy(ks.log_path, keep)
        assert code == 0, f"kipside exited with {code} after SIGTERM; log tail:\n{tail(ks.log())}"


# --------------------------------------------------------------------------- what clients dial


@dataclass(frozen=True)
class Target:
    """What the clients under test connect to."""

    bootstrap: str
    via_kipside: bool
    broker: Broker
    kipside: Kipside | None


@pytest.fixture(scope="session")
def target(request: pytest.FixtureRequest, tansu: Broker) -> Target:
    if DIRECT:
        return Target(bootstrap=tansu.bootstrap, via_kipside=False, broker=tansu, kipside=None)
    ks: Kipside = request.getfixturevalue("kipside")
    return Target(bootstrap=ks.bootstrap, via_kipside=True, broker=tansu, kipside=ks)


@pytest.fixture
def bootstrap(target: Target) -> str:
    if target.kipside is not None:
        target.kipside.assert_alive()
    return target.bootstrap


# --------------------------------------------------------------------------- broker probe

PROBE_SCRIPT = Path(__file__).resolve().parent / "integration" / "broker_probe.py"


class DirectProbe:
    """Asks the broker itself (no kipside) whether it can do something; cached per session."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._cache: dict[str, tuple[bool, str]] = {}

    def __call__(self, check: str) -> tuple[bool, str]:
        if check not in self._cache:
            self._cache[check] = self._run(check)
        return self._cache[check]

    def _run(self, check: str) -> tuple[bool, str]:
        import json

        if check == "kcat-metadata":
            kcat = tools.require("kcat", "the direct kcat probe")
            proc = subprocess.run(
                [kcat, "-b", self.broker.bootstrap, "-L", "-m", "5"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            return proc.returncode == 0, tail(proc.stderr, 1)
        proc = subprocess.run(
            [sys.executable, str(PROBE_SCRIPT), check, self.broker.bootstrap],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"probe {check} crashed: {tail(proc.stderr)}")
        result = json.loads(lines[-1])
        return bool(result["ok"]), str(result["detail"])


@pytest.fixture(scope="session")
def direct_probe(tansu: Broker) -> DirectProbe:
    return DirectProbe(tansu)


# --------------------------------------------------------------------------- topics

_topic_seq = itertools.count()


def skip_unless_shared_lanes(feature: str) -> None:
    """Skip a test of what only kipside's shared lanes do: nothing to see with
    KIPSIDE_TEST_DIRECT=1 (no kipside) or with `kipside serve --one-to-one` (no lanes)."""
    if DIRECT:
        pytest.skip(f"KIPSIDE_TEST_DIRECT=1: {feature} is kipside's; nothing to test directly")
    if ONE_TO_ONE:
        pytest.skip(f"kipside runs with --one-to-one: no shared lanes, no {feature}")


def needs_kipside(why: str) -> pytest.MarkDecorator:
    """The mark of a test module about kipside itself: KIPSIDE_TEST_DIRECT=1 skips it, saying
    why."""
    return pytest.mark.skipif(DIRECT, reason=f"KIPSIDE_TEST_DIRECT=1: {why}")


def unique_name(prefix: str, request: pytest.FixtureRequest | None = None) -> str:
    """A Kafka-legal name unique to this test run (test name + counter + random suffix)."""
    base = request.node.name if request is not None else "x"
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-.")[:120]
    return f"{prefix}-{base}-{next(_topic_seq)}-{uuid.uuid4().hex[:8]}"


def create_topics(
    bootstrap: str,
    names: list[str],
    partitions: int,
    timeout: float = 10.0,
    conf: dict[str, Any] | None = None,
) -> None:
    """Create topics with confluent-kafka's AdminClient and wait until metadata shows them.
    `conf`: more client settings (TLS, SASL)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "socket.timeout.ms": 5000,
            "client.id": "kipside-tests",
            **(conf or {}),
        }
    )
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    for name, fut in futures.items():
        try:
            fut.result(timeout=timeout)
        except Exception as exc:
            raise RuntimeError(f"creating topic {name} via {bootstrap} failed: {exc!r}") from exc
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(timeout=timeout)
        if all(n in md.topics and len(md.topics[n].partitions) == partitions for n in names):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics {names} not in metadata via {bootstrap} after {timeout} s")
        time.sleep(0.05)


def fresh_topic(
    bootstrap: str,
    prefix: str,
    partitions: int,
    request: pytest.FixtureRequest | None = None,
    conf: dict[str, Any] | None = None,
) -> str:
    """Create a topic with a name unique to this test run (see unique_name); return the name.
    `conf`: more client settings (TLS, SASL)."""
    name = unique_name(prefix, request)
    create_topics(bootstrap, [name], partitions, conf=conf)
    return name


NewTopicFactory = Callable[..., str]


@pytest.fixture
def new_topic(request: pytest.FixtureRequest, bootstrap: str) -> NewTopicFactory:
    """new_topic(partitions=3, prefix="t") creates a topic named after the test; returns it.

    Topics are created through `bootstrap` (kipside by default) so that the test process
    never opens a connection to the broker itself (the socket-table test relies on that).
    """

    def make(partitions: int = 3, prefix: str = "t") -> str:
        return fresh_topic(bootstrap, prefix, partitions, request)

    return make


# --------------------------------------------------------------------------- hard deadline


def _watchdog_fire(nodeid: str) -> None:
    # pytest captures fd 2 during a test: suspend that so the message survives os._exit.
    capman = _CONFIG[0].pluginmanager.getplugin("capturemanager") if _CONFIG else None
    if capman is not None:
        capman.suspend_global_capture(in_=False)
    err = sys.stderr
    err.write(
        f"\n\n*** {nodeid} ran longer than {HARD_LIMIT} s: a network step has no deadline. "
        "Stacks of all threads follow; killing broker and kipside, then exiting. ***\n"
    )
    err.flush()
    faulthandler.dump_traceback(file=err, all_threads=True)
    for path in started_logs():
        err.write(f"\n--- tail of {path} ---\n{tail(path.read_text(errors='replace'))}\n")
    err.flush()
    procs.kill_all()
    os._exit(3)


@pytest.fixture(autouse=True)
def _hard_deadline(request: pytest.FixtureRequest) -> Iterator[None]:
    timer = threading.Timer(HARD_LIMIT, _watchdog_fire, args=(request.node.nodeid,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


_CONFIG: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG.append(config)
    # kafka-python 3.0 loads its protocol schemas with importlib.resources' legacy API.
    for text in ("read_text is deprecated", "open_text is deprecated"):
        config.addinivalue_line("filterwarnings", f"ignore:{text}:DeprecationWarning")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    procs.kill_all()


# Folders whose tests share a session-wide Spark session, brokers or fresh venvs: under
# pytest-xdist (`make test` runs two workers with --dist loadgroup) each goes whole to one
# worker, so those start once, and the heavy Spark work runs beside the lighter tests instead of
# against itself. Every other test is a unit of its own. (xdist's own loadgroup marks a test by
# rewriting its node id, which this pytest no longer reads; the scheduler below groups by folder.)
# The SIGKILL tests are the exception: they drive the CLI alone (Spark jobs in subprocesses, the
# session-scoped brokers each worker starts for itself), so each is a unit of its own and runs on
# the other worker, beside the Spark group, instead of after it.
_WORKER_GROUPS: Final = {"tests/pipelines/": "spark", "tests/install/": "install"}
_OWN_UNITS: Final = (
    "tests/pipelines/test_lake_kill.py::",
    "tests/pipelines/test_mirror_exactly_once.py::test_sigkill_",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class FolderGroups(LoadScopeScheduling):  # type: ignore[misc]
        """Largest groups first (xdist's scope reordering), so Spark's starts at once."""

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(_OWN_UNITS):
                return nodeid
            for folder, group in _WORKER_GROUPS.items():
                if nodeid.startswith(folder):
                    return group
            return nodeid

    return FolderGroups(config, log)


# kipside inside the test process (spans, Stats); see tests/inprocess.py.
from inprocess import start_kipside_in_process  # noqa: E402, F401
