"""Load processes driven in stages, so a benchmark measures around exactly the loaded phase.

A staged load process (bench/_coalesce_load.py) connects and warms up, prints `READY`, waits for
a line `GO` on stdin, runs its load, prints `FINISHED`, and then prints one JSON object. The
parent reads the CPU of the broker and the proxy (and the proxy's metrics) between GO and
FINISHED, so start-up, warm-up and the clients' final statistics are outside the window.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from _harness import HarnessError, Stack, _own_cpu_seconds, machine_busy_seconds
from _kipside import scrape


class StagedWorker:
    """One staged load process and a thread that queues its stdout lines."""

    def __init__(self, script: Path, args: dict[str, Any], log: Path) -> None:
        self.log = log
        with log.open("wb") as errf:
            self.popen: subprocess.Popen[str] = subprocess.Popen(
                [sys.executable, str(script), json.dumps(args)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errf,
                text=True,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        out: IO[str] | None = self.popen.stdout
        assert out is not None
        for line in out:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, word: str, deadline: float) -> str:
        """The next stdout line, which must be `word` (or any JSON object for word '{')."""
        remaining = deadline - time.monotonic()
        try:
            line = self.lines.get(timeout=max(0.0, remaining))
        except queue.Empty:
            raise HarnessError(f"producer worker did not print {word} in time") from None
        if line is None or not line.startswith(word):
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-10:])
            raise HarnessError(f"producer worker printed {line!r}, expected {word}:\n{tail}")
        return line

    def result(self, deadline: float) -> dict[str, Any]:
        """The JSON object the worker prints last."""
        data: dict[str, Any] = json.loads(self.expect("{", deadline))
        return data

    def send(self, text: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(text + "\n")
        self.popen.stdin.flush()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)


@dataclass
class Window:
    """What happened between GO and the last FINISHED of a set of staged workers."""

    results: list[dict[str, Any]]
    """Each worker's JSON result."""
    wall_s: float
    proxy_cpu_s: float
    broker_cpu_s: float
    noise_cores: float
    """Cores the rest of the machine kept busy meanwhile (not the stack, workers or us)."""
    metrics_before: dict[str, float] = field(default_factory=dict)
    metrics_after: dict[str, float] = field(default_factory=dict)
    """kipside's /metrics at GO and after FINISHED, when an admin port was given."""


def run_staged(
    stack: Stack,
    script: Path,
    loads: Sequence[dict[str, Any]],
    *,
    seconds: float,
    admin_port: int | None = None,
    during: AbstractContextManager[object] | None = None,
) -> Window:
    """Start one staged worker per load, let them all GO at once, and measure the window.

    `during` is entered right after GO and left once every worker finished (a profiler).
    Each worker's `cpu_s` in its result must be its CPU seconds in the window.
    """
    logdir = stack.logdir
    workers = [StagedWorker(script, load, logdir / f"load-{i}.log") for i, load in enumerate(loads)]
    try:
        ready_by = time.monotonic() + 90
        for w in workers:
            w.expect("READY", ready_by)
        stack.check_alive()
        before = scrape(admin_port) if admin_port is not None else {}
        proxy0, broker0 = stack.cpu_seconds()
        own0, busy0, t0 = _own_cpu_seconds(), machine_busy_seconds(), time.monotonic()
        for w in workers:
            w.send("GO")
        with during if during is not None else contextlib.nullcontext():
            finish_by = t0 + seconds * 1.5 + 60
            for w in workers:
                w.expect("FINISHED", finish_by)
        t1, busy1, own1 = time.monotonic(), machine_busy_seconds(), _own_cpu_seconds()
        proxy1, broker1 = stack.cpu_seconds()
        after = scrape(admin_port) if admin_port is not None else {}
        results = [w.result(time.monotonic() + 30) for w in workers]
    finally:
        for w in workers:
            w.stop()
    proxy, broker = proxy1 - proxy0, broker1 - broker0
    ours = proxy + broker + (own1 - own0) + sum(float(r["cpu_s"]) for r in results)
    noise = max(0.0, (busy1 - busy0) - ours) / (t1 - t0)
    return Window(results, t1 - t0, proxy, broker, noise, before, after)
