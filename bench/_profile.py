"""Sampling profiles of a running process with py-spy, summarised by function.

`py_spy_record()` samples one pid (`py-spy record --format raw`) while a load runs; `summarise()`
ranks the functions by own samples (the innermost frame: where the CPU was). py-spy leaves idle
threads out by default, so the samples are the busy time. Attaches to nothing but that pid.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from _harness import HarnessError

RATE_HZ = 100
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
HEADERS = ["#", "function", "file", "own samples", "own %", "incl. %"]


@contextlib.contextmanager
def py_spy_record(pid: int, seconds: float, raw: Path) -> Iterator[None]:
    """Sample `pid` for `seconds` (whole, at least 1) into `raw`; wait for py-spy on exit."""
    args = [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid)]
    args += ["--format", "raw", "--output", str(raw), "--rate", str(RATE_HZ)]
    args += ["--duration", str(max(1, int(seconds)))]
    with raw.with_suffix(".log").open("wb") as log:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        yield
    finally:
        try:
            proc.wait(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
    if proc.returncode != 0 or not raw.exists():
        why = raw.with_suffix(".log").read_text(errors="replace").strip()[:300]
        raise HarnessError(f"py-spy failed (code {proc.returncode}): {why}")


def summarise(raw: Path, top: int = 15) -> tuple[int, list[list[str]]]:
    """Busy samples in all, and a table row for each of the `top` functions by own samples."""
    own: Counter[tuple[str, str]] = Counter()
    total: Counter[tuple[str, str]] = Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            frames = [
                (m["function"], m["file"]) if (m := FRAME.match(f)) else (f, "")
                for f in stack.split(";")
            ]
            own[frames[-1]] += int(count)
            for frame in set(frames):
                total[frame] += int(count)
    samples = max(1, sum(own.values()))
    rows = [
        [
            str(i),
            f"`{fn}`",
            file,
            str(n),
            f"{100 * n / samples:.1f}",
            f"{100 * total[fn, file] / samples:.1f}",
        ]
        for i, ((fn, file), n) in enumerate(own.most_common(top), 1)
    ]
    return sum(own.values()), rows
