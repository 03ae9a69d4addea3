"""What the pipeline benchmarks (mirror, lake) share: a run's wall time and CPU, measured with
the brokers' CPU apart, the median of repeated runs, and one-shot workload processes."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from _harness import Managed, kipside_bin, run_tree, wait_until_quiet


@dataclass
class Run:
    wall_s: float
    cpu_s: float
    broker_cpu_s: float

    def minus(self, other: Run) -> Run:
        """The cost of what this run did beyond `other` (a smaller run of the same job)."""
        return Run(
            self.wall_s - other.wall_s,
            self.cpu_s - other.cpu_s,
            self.broker_cpu_s - other.broker_cpu_s,
        )


def load_worker(
    script: Path, command: str, args: dict[str, object], timeout: float
) -> dict[str, int]:
    """Run `python SCRIPT COMMAND 'JSON'` and return the JSON it printed last."""
    done = subprocess.run(
        [sys.executable, str(script), command, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise SystemExit(f"{command} failed:\n{done.stderr[-3000:]}")
    result: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(brokers: list[Managed], step: Callable[[], tuple[float, float]]) -> Run:
    """Run `step` (returning its wall and CPU seconds) on a quiet machine; add the brokers' CPU."""
    wait_until_quiet()
    before = sum(b.cpu_seconds() for b in brokers)
    wall, cpu = step()
    return Run(wall, cpu, sum(b.cpu_seconds() for b in brokers) - before)


def median(runs: list[Run]) -> Run:
    return Run(
        *(
            statistics.median(getattr(r, f) for r in runs)
            for f in ("wall_s", "cpu_s", "broker_cpu_s")
        )
    )


def timed_tree(what: str, args: Sequence[str], *, spark: bool = False) -> tuple[float, float]:
    """Wall and CPU seconds of a command's whole process tree; it must succeed."""
    env = {"PYSPARK_PYTHON": sys.executable} if spark else None
    run = run_tree(list(args), timeout=3600, env=env)
    if run.code != 0:
        raise SystemExit(f"{what} failed:\n{run.stderr[-3000:]}")
    return run.wall_s, run.cpu_s


def kipside(*args: str) -> list[str]:
    return [str(kipside_bin()), *args]
