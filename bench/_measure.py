"""How the benchmarks measure: client processes, a CPU window around a load, noise, repetitions.

- `run_json()` runs a workload script in its own interpreter (so the benchmark's process never
  competes with the client for the GIL) and returns the JSON object it printed last.
- `Window` takes the CPU of the stack's proxy and broker, of this process and its reaped
  children, and of the whole machine around one load; what the machine did beyond all of those
  is other load (noise), in cores.
- `repeat()` runs every case of a benchmark in every repetition, the order rotated each time,
  and measures a run again when other load disturbed it; `medians()` summarises.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from _harness import REPO, HarnessError, Managed, Stack
from testkit.cpu import TreeSampler, own_cpu_seconds

WORKLOAD = REPO / "bench" / "_workload.py"


def machine_busy_seconds() -> float:
    """CPU seconds (all CPUs) the machine spent in processes or lost to the hypervisor."""
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + getattr(t, "steal", 0.0))


def wait_until_quiet(max_cores: float = 0.3, timeout: float = 10.0, sample: float = 0.5) -> float:
    """Wait (up to `timeout` s) until the machine keeps fewer than `max_cores` busy; returns
    the busy cores of the last sample, so a caller can note that it gave up."""
    deadline = time.monotonic() + timeout
    while True:
        b0, t0 = machine_busy_seconds(), time.monotonic()
        time.sleep(sample)
        busy = (machine_busy_seconds() - b0) / (time.monotonic() - t0)
        if busy < max_cores or time.monotonic() > deadline:
            return busy


@dataclass
class Window:
    """CPU seconds used between `open()` and `close()` by the stack and by the machine."""

    procs: Sequence[Managed]
    cpu_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    _marks: tuple[float, float, float] = (0.0, 0.0, 0.0)
    _busy_s: float = 0.0

    @classmethod
    def of(cls, stack: Stack | None) -> Window:
        procs = [] if stack is None else [p for p in (stack.proxy, stack.broker) if p is not None]
        return cls(procs)

    def open(self) -> Window:
        self.cpu_s = [-p.cpu_seconds() for p in self.procs]
        self._marks = (time.monotonic(), own_cpu_seconds(), machine_busy_seconds())
        return self

    def close(self) -> Window:
        self.cpu_s = [c + p.cpu_seconds() for c, p in zip(self.cpu_s, self.procs, strict=True)]
        t0, own0, busy0 = self._marks
        self.wall_s = time.monotonic() - t0
        self._busy_s = machine_busy_seconds() - busy0 - (own_cpu_seconds() - own0)
        return self

    def noise_cores(self, client_cpu_s: float = 0.0) -> float:
        """Cores kept busy by anything but the stack, this process, its reaped children and
        `client_cpu_s` (CPU of load processes not yet reaped)."""
        ours = sum(self.cpu_s) + client_cpu_s
        return max(0.0, self._busy_s - ours) / max(self.wall_s, 1e-9)

    def proxy_broker(self, stack: Stack) -> tuple[float, float]:
        """(proxy, broker) CPU seconds of the window."""
        return (self.cpu_s[0], self.cpu_s[1]) if stack.proxy is not None else (0.0, self.cpu_s[0])


def run_json(script: Path, *args: str, timeout: float, log: Path | None = None) -> dict[str, Any]:
    """Run `python SCRIPT ARGS...` and return the JSON object it printed last."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    command = [sys.executable, str(script), *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"{script.name} {args[0]} did not finish in {timeout:g} s") from None
    if log is not None:
        log.write_text(done.stderr)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-10:])
        raise HarnessError(f"{script.name} {args[0]} failed (code {done.returncode}):\n{tail}")
    data: dict[str, Any] = json.loads(lines[-1])
    return data


def worker(
    stack: Stack | None, command: str, args: dict[str, Any], timeout: float = 300.0
) -> tuple[dict[str, Any], Window]:
    """One bench/_workload.py command, in a window (a fresh interpreter's start-up is idle
    time for the stack, so it costs the window nothing)."""
    window = Window.of(stack).open()
    try:
        data = run_json(WORKLOAD, command, json.dumps(args), timeout=timeout)
    except HarnessError as exc:
        with contextlib.suppress(HarnessError):
            if stack is not None:
                stack.check_alive()
        tail = stack.proxy.log_tail() if stack is not None and stack.proxy else ""
        raise HarnessError(f"{exc}{tail}") from None
    return data, window.close()


@dataclass
class TreeRun:
    wall_s: float
    cpu_s: float
    """CPU of the command and everything it started (Spark's JVM and Python workers too)."""
    broker_cpu_s: float = 0.0

    def minus(self, other: TreeRun) -> TreeRun:
        """What this run cost beyond `other` (a smaller run of the same job)."""
        return TreeRun(*(a - b for a, b in zip(self.fields(), other.fields(), strict=True)))

    def fields(self) -> tuple[float, float, float]:
        return self.wall_s, self.cpu_s, self.broker_cpu_s

    @staticmethod
    def median(runs: Sequence[TreeRun]) -> TreeRun:
        return TreeRun(*map(statistics.median, zip(*(r.fields() for r in runs), strict=True)))


def timed(
    brokers: Sequence[Managed], what: str, args: Sequence[str], spark: bool = False
) -> TreeRun:
    """run_tree on a quiet machine, with the CPU the brokers spent meanwhile."""
    wait_until_quiet()
    before = sum(b.cpu_seconds() for b in brokers)
    run = run_tree(what, args, spark=spark)
    return TreeRun(run.wall_s, run.cpu_s, sum(b.cpu_seconds() for b in brokers) - before)


def run_tree(what: str, args: Sequence[str], timeout: float = 3600, spark: bool = False) -> TreeRun:
    """Run a command to success, sampling the CPU of its whole process tree every 0.2 s (a
    daemonised Spark worker is never reaped, so only sampling sees it); each pid counts once."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable) if spark else None
    reaped0, t0 = own_cpu_seconds() - own_cpu_seconds(children=False), time.perf_counter()
    proc = subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    sampler, out = TreeSampler(proc.pid), list[bytes]()
    reader = threading.Thread(target=lambda: out.extend(proc.communicate(timeout=timeout)))
    reader.start()
    while reader.is_alive():
        sampler.sample()
        reader.join(0.2)
    wall = time.perf_counter() - t0
    reaped = own_cpu_seconds() - own_cpu_seconds(children=False) - reaped0
    if len(out) < 2 or proc.returncode != 0:
        proc.kill()
        raise HarnessError(f"{what} failed:\n{(out[1] if out else b'').decode()[-3000:]}")
    return TreeRun(wall, max(reaped, sampler.total()))


# --------------------------------------------------------------------------- repetitions


@dataclass
class Run:
    """One case of a benchmark in one repetition: its numbers, or why it has none."""

    case: str
    rep: int = 1
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    problems: list[str] = field(default_factory=list)
    """Warnings and errors the proxy logged."""
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.metrics)

    @property
    def noise(self) -> float:
        return self.metrics.get("noise_cores", 0.0)


def attempt(run: Run, body: Callable[[], dict[str, float]]) -> Run:
    """Fill `run` with body's metrics, or with the error it raised."""
    try:
        run.metrics = body()
    except HarnessError as exc:
        run.error = str(exc)
    except Exception as exc:  # one failed case must not lose the others
        run.error = f"{type(exc).__name__}: {exc}"
    return run


def repeat(
    cases: Sequence[str],
    reps: int,
    measure: Callable[[str, int], Run],
    *,
    noisy: float = 0.25,
    retries: int = 1,
    budget: float = 200.0,
    quiet_wait: float = 3.0,
) -> list[Run]:
    """Every case in every repetition, the order rotated each time so drift hits all alike. A
    run during which other processes kept more than `noisy` cores busy is measured again (at
    most `retries` times, while the whole has run less than `budget` seconds)."""
    started, runs = time.monotonic(), []
    for rep in range(1, reps + 1):
        shift = (rep - 1) % max(1, len(cases))
        for case in [*cases[shift:], *cases[:shift]]:
            for n in range(1, retries + 2):
                wait_until_quiet(timeout=quiet_wait)
                t0 = time.monotonic()
                run = measure(case, rep)
                run.attempts = n
                print(progress(run, time.monotonic() - t0), file=sys.stderr)
                late = time.monotonic() - started > budget
                if not run.ok or run.noise <= noisy or late:
                    break
            runs.append(run)
    return runs


def progress(run: Run, seconds: float) -> str:
    head = f"[rep {run.rep}] {run.case} (attempt {run.attempts})"
    if not run.ok:
        return f"{head}: FAILED ({seconds:.0f} s)\n{run.error}"
    shown = ", ".join(f"{k} {v:,.4g}" for k, v in list(run.metrics.items())[:5])
    return f"{head}: {shown}, other load {run.noise:.2f} cores ({seconds:.0f} s)"


def medians(runs: Sequence[Run], case: str) -> dict[str, float] | None:
    """The median of every metric over the case's successful runs; None if it has none."""
    ok = [r for r in runs if r.case == case and r.ok]
    if not ok:
        return None
    return {k: statistics.median(r.metrics[k] for r in ok) for k in ok[0].metrics}


def per_rep(runs: Sequence[Run], a: str, b: str, fn: Callable[[Run, Run], float]) -> list[float]:
    """fn(run of a, run of b) for each repetition where both cases succeeded."""
    ok = {(r.case, r.rep): r for r in runs if r.ok}
    reps = sorted({r.rep for r in runs})
    return [fn(ok[a, rep], ok[b, rep]) for rep in reps if (a, rep) in ok and (b, rep) in ok]


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank percentile of `values`; NaN when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))])


@contextlib.contextmanager
def sampling(every: float, sample: Callable[[], None]) -> Iterator[None]:
    """Call `sample` every `every` seconds in a thread while the block runs (and once more)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            sample()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        sample()
