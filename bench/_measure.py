"""How the benchmarks measure: client processes, a CPU window around a load, noise, repetitions.

- `run_json()` runs a load script in its own interpreter (so the benchmark's process never
  competes with the client for the GIL) and returns the JSON object it printed last; `worker()`
  runs a bench/_workload.py command so, in a window.
- `Window` takes the CPU of the stack's proxy and broker, of this process and its reaped
  children, and of the whole machine around one load; what the machine did beyond all of those
  is other load (noise), in cores.
- `fleet()` runs producers in staged processes: they connect and warm up, print READY, wait for
  GO, run, print FINISHED, then their JSON; its window is from GO to the last FINISHED.
- `repeat()` runs every case of a benchmark in every repetition, each in a fresh log directory,
  the order rotated each time, and measures a run again when it failed or other load disturbed
  it; `medians()` summarises.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from _harness import PROXY_LOG, REPO, HarnessError, Managed, Stack, problems
from testkit import procs
from testkit.cpu import own_cpu_seconds
from testkit.metrics import scrape

WORKLOAD = REPO / "bench" / "_workload.py"
NAN = float("nan")


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
    def of(cls, stack: Stack) -> Window:
        return cls([p for p in (stack.proxy, stack.broker) if p is not None]).open()

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

    def proxy_broker(self) -> tuple[float, float]:
        """(proxy, broker) CPU seconds of the window; the proxy's is NaN on a direct stack."""
        return (self.cpu_s[0], self.cpu_s[1]) if len(self.cpu_s) == 2 else (NAN, self.cpu_s[0])


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


def worker(stack: Stack, command: str, args: dict[str, Any]) -> tuple[dict[str, Any], Window]:
    """One bench/_workload.py command, in a window (a fresh interpreter's start-up is idle
    time for the stack, so it costs the window nothing)."""
    window = Window.of(stack)
    try:
        spec = json.dumps({"client": stack.client, **args})
        data = run_json(WORKLOAD, command, spec, timeout=300)
    except HarnessError as exc:
        raise HarnessError(f"{exc}{stack.proxy.log_tail() if stack.proxy else ''}") from None
    return data, window.close()


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank percentile of `values`; NaN when there are none."""
    if not values:
        return NAN
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))])


# --------------------------------------------------------------------------- fleets


@dataclass
class Staged:
    """A `_workload.py produce` process: READY, GO, FINISHED, then its JSON."""

    popen: subprocess.Popen[str]
    log: Path

    @classmethod
    def start(cls, spec: dict[str, Any], log: Path) -> Staged:
        command = [sys.executable, str(WORKLOAD), "produce", json.dumps(spec)]
        env, pipe = dict(os.environ, PYTHONUNBUFFERED="1"), subprocess.PIPE
        with log.open("wb") as err:
            popen = subprocess.Popen(
                command, stdin=pipe, stdout=pipe, stderr=err, text=True, env=env
            )
        return cls(procs.track(popen), log)

    def expect(self, word: str, timeout: float) -> str:
        """The next line it prints, which must start with `word`."""
        assert self.popen.stdout is not None
        ready, _, _ = select.select([self.popen.stdout], [], [], timeout)
        line = self.popen.stdout.readline().strip() if ready else "nothing in time"
        if not line.startswith(word):
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-10:])
            raise HarnessError(f"a load process printed {line!r}, expected {word}:\n{tail}")
        return line

    def go(self) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write("GO\n")
        self.popen.stdin.flush()


def produce_requests(admin: int | None) -> tuple[float, float]:
    """Produce requests kipside received from clients and sent upstream so far."""
    if admin is None:
        return 0.0, 0.0
    m = scrape(admin)
    client = m.value("kipside_client_requests_total", 0.0, api="Produce")
    return client, m.value("kipside_upstream_requests_total", 0.0, api="Produce")


def fleet(
    stack: Stack,
    load: dict[str, Any],
    counts: list[int],
    *,
    partitions: int,
    during: AbstractContextManager[object] | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """`counts[i]` producers in staged process i, on a fresh topic `load["topic"]`: the numbers
    of the window and each process's result. The stack's admin port gives kipside's counts of
    Produce requests (which include the warm-up). `during` is entered at GO and left once all
    have finished (a profiler)."""
    topics = {"bootstrap": stack.bootstrap, "topics": [load["topic"]], "partitions": partitions}
    worker(stack, "create-topics", topics)
    common = {"bootstrap": stack.bootstrap, "client": stack.client, "size": 100, **load}
    common.setdefault("go_timeout", 120)
    before, staged = produce_requests(stack.admin), []
    try:
        for i, n in enumerate(counts):
            spec = {**common, "producers": n, "first_index": sum(counts[:i])}
            staged.append(Staged.start(spec, stack.logdir / f"load-{i}.log"))
        for s in staged:
            s.expect("READY", 90)
        w = Window.of(stack)
        for s in staged:
            s.go()
        with during if during is not None else contextlib.nullcontext():
            for s in staged:
                s.expect("FINISHED", float(load["seconds"]) * 1.5 + 60)
        w.close()
        after = produce_requests(stack.admin)
        results = [json.loads(s.expect("{", 30)) for s in staged]
    finally:
        for s in staged:
            procs.stop(s.popen, 1.0)
    total = {k: sum(r[k] for r in results) for k in ("offered", "delivered", "errors", "cpu_s")}
    stats = float(sum(r["client_produce_requests"] for r in results))
    client, upstream = (
        (after[0] - before[0], after[1] - before[1]) if stack.admin else (stats, stats)
    )
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    latencies = [v / 1000 for r in results for v in r["latencies_us"]]
    proxy, broker = w.proxy_broker()
    per_m = 1e6 / max(total["delivered"], 1)
    found = {k: float(v) for k, v in total.items()}
    found |= {"msgs_per_s": total["delivered"] / span if span > 0 else 0.0}
    found |= {"mb_per_s": found["msgs_per_s"] * 100 / 1e6}
    found |= {"p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99)}
    found |= {"client_reqs": client, "client_reqs_stats": stats, "upstream_reqs": upstream}
    found |= {"ratio": client / upstream if upstream else NAN}
    found |= {"msgs_per_upstream_req": total["delivered"] / upstream if upstream else NAN}
    found |= {"broker_cpu_s": broker, "broker_cpu_per_m": broker * per_m}
    found |= {"proxy_cpu_s": proxy, "proxy_cpu_per_m": proxy * per_m}
    found |= {"both_cpu_per_m": (proxy + broker if stack.proxy else broker) * per_m}
    found |= {"client_cpu_per_m": total["cpu_s"] * per_m, "reqs_per_record": stats * per_m / 1e6}
    found |= {"noise_cores": w.noise_cores(total["cpu_s"]), "wall_s": w.wall_s}
    found |= {"capped": float(any(r["capped"] for r in results))}
    return found, results


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


# --------------------------------------------------------------------------- repetitions


@dataclass
class Run:
    """One case of a benchmark in one repetition: its numbers, or why it has none."""

    case: str
    rep: int = 1
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    problems: list[str] = field(default_factory=list)
    """Warnings and errors in the proxy's log."""
    attempts: int = 1

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.metrics)

    @property
    def noise(self) -> float:
        return self.metrics.get("noise_cores", 0.0)


Body = Callable[[Path], dict[str, float]]
"""One case's measurement, given a fresh log directory (where a proxy logs to PROXY_LOG)."""


def measure(case: str, rep: int, body: Body, logroot: Path) -> Run:
    """Run `body` in a fresh log directory: its numbers, or the error it raised."""
    logdir = Path(tempfile.mkdtemp(prefix=f"{rep}-", dir=logroot))
    run = Run(case, rep)
    try:
        run.metrics = body(logdir)
    except HarnessError as exc:
        run.error = str(exc)
    except Exception as exc:  # one failed case must not lose the others
        run.error = f"{type(exc).__name__}: {exc}"
    run.problems = problems(logdir / PROXY_LOG)
    return run


def repeat(
    cases: Mapping[str, Body],
    reps: int,
    *,
    noisy: float = 0.25,
    retries: int = 1,
    budget: float = 200.0,
    quiet_wait: float = 3.0,
) -> list[Run]:
    """Every case in every repetition, the order rotated each time so drift hits all alike. A
    run that failed, or during which other processes kept more than `noisy` cores busy, is
    measured again (at most `retries` times, while the whole has run less than `budget` s)."""
    started, runs, names = time.monotonic(), [], list(cases)
    logroot = Path(tempfile.mkdtemp(prefix="kipbench-"))
    for rep in range(1, reps + 1):
        shift = (rep - 1) % max(1, len(names))
        for case in [*names[shift:], *names[:shift]]:
            for attempt in range(1, retries + 2):
                wait_until_quiet(timeout=quiet_wait)
                t0 = time.monotonic()
                run = measure(case, rep, cases[case], logroot)
                run.attempts = attempt
                head = f"[rep {rep}] {case} (attempt {attempt}, {time.monotonic() - t0:.0f} s)"
                shown = ", ".join(f"{k} {v:,.4g}" for k, v in list(run.metrics.items())[:5])
                print(f"{head}: {shown or run.error}, other load {run.noise:.2f}", file=sys.stderr)
                if (run.ok and run.noise <= noisy) or time.monotonic() - started > budget:
                    break
            runs.append(run)
    shutil.rmtree(logroot, ignore_errors=True)
    return runs


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
