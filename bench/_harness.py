"""Process management shared by the benchmarks: brokers, proxies, CPU accounting, workers.

Everything here targets loopback only. A *stack* is one path from a client to a fresh in-memory
Tansu broker: directly, through kipside, through `tansu proxy`, through haproxy in plain TCP
mode (the floor for proxy overhead), or through a bare trio relay (the floor for a proxy written
in Python on trio). `open_stack()` starts it and tears it down again; while it
runs, `Stack.cpu_seconds()` reports the CPU time used so far by the broker and by the proxy so a
benchmark can take the difference around one measurement.

Workloads run in a separate Python process (`bench/_workload.py`, see `run_worker()`) so the
benchmark's own process does not compete with the client for CPU or the GIL.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kipside.proxy.devbroker import free_port, tansu_path, wait_for_port  # noqa: E402

HOST = "127.0.0.1"
TANSU_NODE_ID = 111
HAPROXY = "/usr/sbin/haproxy"
KIPSIDE_READY = "kipside: ready"
WORKLOAD = Path(__file__).resolve().parent / "_workload.py"
RELAY = Path(__file__).resolve().parent / "_relay.py"

PATHS: tuple[str, ...] = ("direct", "kipside", "tansu-proxy", "haproxy")
# Paths open_stack() also knows: "relay", the bare trio relay (bench/_relay.py), a Python floor.
STACK_PATHS: tuple[str, ...] = (*PATHS, "relay")


class HarnessError(RuntimeError):
    """A process of the benchmark could not be started or misbehaved."""


def kipside_bin() -> Path:
    """The `kipside` console script next to the running interpreter (the project's venv)."""
    candidate = Path(sys.executable).parent / "kipside"
    if candidate.exists():
        return candidate
    found = shutil.which("kipside")
    if found is None:
        raise HarnessError("the kipside console script is not installed in this environment")
    return Path(found)


# --------------------------------------------------------------------------- processes


@dataclass
class Managed:
    """A started process with a name, its log file and CPU accounting."""

    name: str
    popen: subprocess.Popen[Any]
    log: Path | None = None
    _ps: psutil.Process | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        try:
            self._ps = psutil.Process(self.popen.pid)
        except psutil.Error:
            self._ps = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the process and of its live and reaped children."""
        if self._ps is None:
            return 0.0
        try:
            with self._ps.oneshot():
                times = self._ps.cpu_times()
                total = times.user + times.system + times.children_user + times.children_system
                children = self._ps.children(recursive=True)
        except psutil.Error:
            return 0.0
        for child in children:
            with contextlib.suppress(psutil.Error):
                ct = child.cpu_times()
                total += ct.user + ct.system
        return total

    def rss_bytes(self) -> int:
        if self._ps is None:
            return 0
        try:
            return int(self._ps.memory_info().rss)
        except psutil.Error:
            return 0

    def check_alive(self) -> None:
        code = self.popen.poll()
        if code is not None:
            raise HarnessError(f"{self.name} exited with code {code}{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        if self.log is None or not self.log.exists():
            return ""
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return ("\n--- " + self.name + " log tail ---\n" + "\n".join(text)) if text else ""

    def log_problems(
        self, words: tuple[str, ...] = ("ERROR", "CRITICAL", "WARNING", "Traceback", "panicked")
    ) -> list[str]:
        """Lines of the process's log (stderr) that mention any of `words`."""
        if self.log is None or not self.log.exists():
            return []
        return [
            line
            for line in self.log.read_text(errors="replace").splitlines()
            if any(w in line for w in words)
        ]

    def stop(self, timeout: float = 5.0) -> None:
        if self.popen.poll() is not None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout)


def _spawn(
    name: str,
    args: Sequence[str],
    logdir: Path,
    *,
    stdout_pipe: bool = False,
    env: dict[str, str] | None = None,
) -> Managed:
    log = logdir / f"{name}.log"
    with log.open("wb") as logf:
        popen: subprocess.Popen[Any] = subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout_pipe else logf,
            stderr=logf,
            text=stdout_pipe,
            env=env,
        )
    return Managed(name, popen, log)


def start_tansu(
    logdir: Path, *, port: int = 0, advertised_port: int | None = None, name: str = "tansu"
) -> tuple[Managed, int]:
    """An in-memory Tansu on HOST:port; it advertises `advertised_port` (default: its own)."""
    port = port or free_port(HOST)
    advertised = advertised_port or port
    proc = _spawn(
        name,
        [
            str(tansu_path()),
            "broker",
            "--listener-url",
            f"tcp://{HOST}:{port}",
            "--advertised-listener-url",
            f"tcp://{HOST}:{advertised}",
            "--storage-engine",
            "memory://tansu/",
            "--silent",
        ],
        logdir,
    )
    _await_port(proc, port)
    return proc, port


def start_tansu_proxy(logdir: Path, origin_port: int) -> tuple[Managed, int]:
    """Tansu's own Rust Kafka proxy in front of HOST:origin_port."""
    port = free_port(HOST)
    proc = _spawn(
        "tansu-proxy",
        [
            str(tansu_path()),
            "proxy",
            "--listener-url",
            f"tcp://{HOST}:{port}",
            "--advertised-listener-url",
            f"tcp://{HOST}:{port}",
            "--origin-url",
            f"tcp://{HOST}:{origin_port}",
        ],
        logdir,
    )
    _await_port(proc, port)
    return proc, port


HAPROXY_CONFIG = """\
global
    maxconn 4096

defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h

frontend kafka
    bind {host}:{listen}
    default_backend broker

backend broker
    server tansu {host}:{backend}
"""


def start_haproxy(logdir: Path, listen_port: int, backend_port: int) -> tuple[Managed, int]:
    """haproxy as a plain TCP relay HOST:listen_port -> HOST:backend_port (no Kafka awareness)."""
    cfg = logdir / "haproxy.cfg"
    cfg.write_text(HAPROXY_CONFIG.format(host=HOST, listen=listen_port, backend=backend_port))
    proc = _spawn("haproxy", [HAPROXY, "-db", "-f", str(cfg)], logdir)
    _await_port(proc, listen_port)
    return proc, listen_port


def start_relay(logdir: Path, listen_port: int, backend_port: int) -> tuple[Managed, int]:
    """The bare trio relay (bench/_relay.py) HOST:listen_port -> HOST:backend_port."""
    args = [sys.executable, str(RELAY), str(listen_port), str(backend_port)]
    proc = _spawn("relay", args, logdir)
    _await_port(proc, listen_port)
    return proc, listen_port


def kipside_env(source: Path | None) -> dict[str, str] | None:
    """The environment that makes `kipside` import its packages from `source` (None: as is).

    The console script finds `proxy` through sys.path, where PYTHONPATH comes before the
    editable install.
    """
    if source is None:
        return None
    old = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=str(source) + (os.pathsep + old if old else ""))


def start_kipside(
    logdir: Path,
    upstream_port: int,
    *,
    extra_args: Sequence[str] = (),
    timeout: float = 20.0,
    source: Path | None = None,
) -> tuple[Managed, int]:
    """`kipside serve` in front of HOST:upstream_port; returns once it prints `kipside: ready`.

    Tansu's only node (111) gets the local listener node_port_base + 111. With `source`, a
    directory holding another tree's `protocol`, `proxy` and `rules`, that code runs instead.
    """
    listen = free_port(HOST)
    node_port = free_port(HOST)
    args = [
        str(kipside_bin()),
        "serve",
        "--upstream",
        f"{HOST}:{upstream_port}",
        "--listen",
        f"{HOST}:{listen}",
        "--node-port-base",
        str(node_port - TANSU_NODE_ID),
        *extra_args,
    ]
    proc = _spawn("kipside", args, logdir, stdout_pipe=True, env=kipside_env(source))
    lines: queue.Queue[str | None] = queue.Queue()
    stdout_log = logdir / "kipside.stdout"

    def drain() -> None:
        assert proc.popen.stdout is not None
        with stdout_log.open("w") as out:
            for line in proc.popen.stdout:
                out.write(line)
                out.flush()
                lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=drain, name="kipside-stdout", daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            proc.stop()
            raise HarnessError(
                f"kipside did not print {KIPSIDE_READY!r} within {timeout} s: "
                f"{' '.join(args)}{proc.log_tail()}"
            )
        try:
            line = lines.get(timeout=min(remaining, 0.5))
        except queue.Empty:
            continue
        if line is None:
            proc.popen.wait(5)
            raise HarnessError(
                f"kipside exited (code {proc.popen.returncode}) before it was ready: "
                f"{' '.join(args)}{proc.log_tail()}"
            )
        if line.strip() == KIPSIDE_READY:
            break
    wait_for_port(HOST, listen, timeout=5)
    return proc, listen


def _await_port(proc: Managed, port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        proc.check_alive()
        try:
            wait_for_port(HOST, port, timeout=0.2)
            return
        except Exception as exc:  # DevBrokerError: not yet listening
            if time.monotonic() > deadline:
                proc.stop()
                raise HarnessError(
                    f"{proc.name} is not listening on {port}{proc.log_tail()}"
                ) from exc


def exit_cleanly_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so `open_stack()` and workers are torn down on a kill."""

    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def kipside_available(source: Path | None = None) -> tuple[bool, str]:
    """Whether `kipside serve --help` works yet, and the error text when it does not."""
    try:
        exe = kipside_bin()
    except HarnessError as exc:
        return False, str(exc)
    try:
        done = subprocess.run(
            [str(exe), "serve", "--help"],
            capture_output=True,
            text=True,
            timeout=30,
            env=kipside_env(source),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    if done.returncode != 0:
        err = (done.stderr or done.stdout).strip().splitlines()
        return False, err[-1] if err else f"exit code {done.returncode}"
    return True, ""


# --------------------------------------------------------------------------- stacks


@dataclass
class Stack:
    """One client path to a fresh broker: what to bootstrap from and which processes to watch."""

    path: str
    bootstrap: str
    broker: Managed
    broker_port: int
    proxy: Managed | None
    logdir: Path

    def cpu_seconds(self) -> tuple[float, float]:
        """(proxy, broker) CPU seconds so far; the proxy's is 0 for the direct path."""
        proxy = self.proxy.cpu_seconds() if self.proxy is not None else 0.0
        return proxy, self.broker.cpu_seconds()

    def check_alive(self) -> None:
        self.broker.check_alive()
        if self.proxy is not None:
            self.proxy.check_alive()


@contextlib.contextmanager
def open_stack(
    path: str,
    *,
    logdir: Path | None = None,
    kipside_args: Sequence[str] = (),
    kipside_source: Path | None = None,
) -> Iterator[Stack]:
    """Start a fresh Tansu and, for the proxied paths, the proxy in front of it.

    `kipside_args` are appended to `kipside serve` (e.g. `--rules FILE`, `--admin H:P`,
    `--one-to-one`) on the kipside path and ignored on the others; `kipside_source` runs
    kipside from another tree (see `start_kipside`).
    """
    if path not in STACK_PATHS:
        raise ValueError(f"unknown path {path!r}; choose from {', '.join(STACK_PATHS)}")
    with contextlib.ExitStack() as stack:
        if logdir is None:
            logdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kipbench-")))
        started: list[Managed] = []

        def stop_all() -> None:
            for proc in reversed(started):
                proc.stop()

        stack.callback(stop_all)
        proxy: Managed | None = None
        if path in ("haproxy", "relay"):
            # A plain TCP relay cannot rewrite metadata: make Tansu advertise the relay's port
            # so the client's every connection goes through it.
            listen = free_port(HOST)
            broker, broker_port = start_tansu(logdir, advertised_port=listen)
            started.append(broker)
            start = start_haproxy if path == "haproxy" else start_relay
            proxy, bootstrap_port = start(logdir, listen, broker_port)
            started.append(proxy)
        else:
            broker, broker_port = start_tansu(logdir)
            started.append(broker)
            bootstrap_port = broker_port
            if path == "kipside":
                proxy, bootstrap_port = start_kipside(
                    logdir, broker_port, extra_args=kipside_args, source=kipside_source
                )
                started.append(proxy)
            elif path == "tansu-proxy":
                proxy, bootstrap_port = start_tansu_proxy(logdir, broker_port)
                started.append(proxy)
        yield Stack(path, f"{HOST}:{bootstrap_port}", broker, broker_port, proxy, logdir)


T = TypeVar("T")


def on_stack(
    path: str,
    body: Callable[[Stack], T],
    *,
    logdir: Path,
    kipside_args: Sequence[str] = (),
    kipside_source: Path | None = None,
) -> tuple[T | None, str | None, list[str]]:
    """Run `body` on a fresh stack and check the stack survived it.

    Returns body's result (None if anything failed), the error if the stack or body failed with
    a HarnessError, and the warnings and errors the proxy logged (its shutdown included).
    """
    stack: Stack | None = None
    result: T | None = None
    error: str | None = None
    try:
        with open_stack(
            path, logdir=logdir, kipside_args=kipside_args, kipside_source=kipside_source
        ) as stack:
            result = body(stack)
            stack.check_alive()
    except HarnessError as exc:
        result, error = None, str(exc)
    problems = stack.proxy.log_problems() if stack is not None and stack.proxy is not None else []
    return result, error, problems


# --------------------------------------------------------------------------- CPU noise


def machine_busy_seconds() -> float:
    """CPU seconds since boot (all CPUs) the machine spent in processes or lost to the host.

    User, nice and system time, plus steal (time the hypervisor ran something else while this
    VM wanted the CPU): both are noise for a benchmark when they are not its own processes.
    """
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + getattr(t, "steal", 0.0))


def _own_cpu_seconds() -> float:
    """CPU of this process plus its reaped children (the workers)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def wait_until_quiet(
    max_busy_cores: float = 0.3, timeout: float = 10.0, sample: float = 0.5
) -> float:
    """Wait (up to `timeout` s) until the machine's CPU use drops below `max_busy_cores`.

    Returns the busy cores of the last sample, so a caller can record that it gave up.
    """
    deadline = time.monotonic() + timeout
    while True:
        b0, t0 = machine_busy_seconds(), time.monotonic()
        time.sleep(sample)
        busy = (machine_busy_seconds() - b0) / (time.monotonic() - t0)
        if busy < max_busy_cores or time.monotonic() > deadline:
            return busy


# --------------------------------------------------------------------------- workers


@dataclass
class WorkerResult:
    """What a worker printed (its JSON result) plus the CPU the stack spent meanwhile."""

    data: dict[str, Any]
    proxy_cpu_s: float
    broker_cpu_s: float
    wall_s: float
    other_cpu_s: float = 0.0
    """CPU the rest of the machine used meanwhile (not this benchmark's processes): noise."""


def run_worker(
    stack: Stack | None, command: str, args: dict[str, Any], *, timeout: float = 300.0
) -> WorkerResult:
    """Run `_workload.py COMMAND` with JSON args in a fresh interpreter; return its JSON result.

    With a stack, the CPU seconds of its proxy and broker over the worker's lifetime are
    attached (the interpreter's start-up is idle time for them, so it costs nothing).
    """
    before = stack.cpu_seconds() if stack is not None else (0.0, 0.0)
    own_before = _own_cpu_seconds()
    busy_before = machine_busy_seconds()
    started = time.perf_counter()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        done = subprocess.run(
            [sys.executable, str(WORKLOAD), command, json.dumps(args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"worker {command} timed out after {timeout} s") from exc
    wall = time.perf_counter() - started
    after = stack.cpu_seconds() if stack is not None else (0.0, 0.0)
    busy = machine_busy_seconds() - busy_before
    ours = _own_cpu_seconds() - own_before + sum(after) - sum(before)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        extra = ""
        if stack is not None:
            with contextlib.suppress(HarnessError):
                stack.check_alive()
            extra = stack.proxy.log_tail() if stack.proxy is not None else ""
        raise HarnessError(f"worker {command} failed (code {done.returncode}):\n{tail}{extra}")
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise HarnessError(f"worker {command} printed no result:\n{done.stdout}\n{done.stderr}")
    data: dict[str, Any] = json.loads(lines[-1])
    return WorkerResult(
        data, after[0] - before[0], after[1] - before[1], wall, max(0.0, busy - ours)
    )


# --------------------------------------------------------------------------- whole process trees


@dataclass
class TreeRun:
    """A command run to completion with the CPU of everything it started."""

    code: int
    wall_s: float
    cpu_s: float
    """User + system seconds of the command and all its descendants (Spark's JVM and Python
    workers included): the larger of what their parents reaped and what sampling saw."""
    stdout: str
    stderr: str


def run_tree(args: Sequence[str], *, timeout: float, env: dict[str, str] | None = None) -> TreeRun:
    """Run `args`, sampling the CPU of its whole process tree every 0.2 s.

    A process whose parent never reaps it (Spark's daemonised Python workers) is only seen by
    sampling; everything reaped up the tree shows in this process's RUSAGE_CHILDREN. Each pid
    counts once, at the last value seen, so the total is a lower bound within one sample.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen(
        list(args),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    seen: dict[int, float] = {}
    outputs: list[str] = []

    def drain() -> None:
        out, err = proc.communicate(timeout=timeout)
        outputs.extend([out, err])

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    root = psutil.Process(proc.pid)
    while reader.is_alive():
        with contextlib.suppress(psutil.Error):
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    seen[p.pid] = t.user + t.system
        reader.join(0.2)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if len(outputs) < 2:
        proc.kill()
        raise HarnessError(f"{args[0]} did not finish within {timeout} s")
    return TreeRun(proc.returncode, wall, max(reaped, sum(seen.values())), outputs[0], outputs[1])
