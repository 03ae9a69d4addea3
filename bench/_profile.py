"""Sampling profiles of a running process with py-spy, summarised by function.

`py_spy_record()` samples a Python process (`py-spy record --format raw`) while a benchmark's
load runs; `summarise()` turns the raw stacks into the functions with the most own samples (the
innermost frame of a sample: where the CPU actually was). py-spy leaves idle threads out by
default, so the samples are the process's busy time. Never attaches to anything but the pid it
is given.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from _harness import HarnessError

RATE_HZ = 100
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def py_spy_bin() -> Path:
    candidate = Path(sys.executable).parent / "py-spy"
    found = str(candidate) if candidate.exists() else shutil.which("py-spy")
    if found is None:
        raise HarnessError("py-spy is not installed (pip install -e '.[bench]')")
    return Path(found)


@contextlib.contextmanager
def py_spy_record(pid: int, seconds: float, raw: Path) -> Iterator[None]:
    """Sample `pid` for `seconds` (whole seconds, at least 1) into `raw`; wait for it on exit."""
    log = raw.with_suffix(".log")
    args = [str(py_spy_bin()), "record", "--pid", str(pid), "--format", "raw"]
    args += ["--output", str(raw), "--duration", str(max(1, int(seconds))), "--rate"]
    args += [str(RATE_HZ)]
    with log.open("wb") as logf:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf)
    try:
        yield
    finally:
        try:
            proc.wait(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    if proc.returncode != 0 or not raw.exists():
        text = log.read_text(errors="replace").strip().splitlines()
        raise HarnessError(f"py-spy failed (code {proc.returncode}): {' '.join(text[:3])}")


@dataclass
class FunctionRow:
    function: str
    file: str
    own: int
    """Samples with this function innermost."""
    total: int
    """Samples with this function anywhere on the stack."""


@dataclass
class Profile:
    samples: int
    rows: list[FunctionRow]


def _frame(text: str) -> tuple[str, str]:
    match = FRAME.match(text)
    return (match["function"], match["file"]) if match else (text, "")


def summarise(raw: Path, top: int = 15) -> Profile:
    """The `top` functions by own samples in a `py-spy record --format raw` file."""
    own: Counter[tuple[str, str]] = Counter()
    total: Counter[tuple[str, str]] = Counter()
    samples = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_frame(f) for f in stack.split(";")]
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    rows = [FunctionRow(fn, file, n, total[(fn, file)]) for (fn, file), n in own.most_common(top)]
    return Profile(samples, rows)


PROFILE_HEADERS = ["#", "function", "file", "own samples", "own %", "incl. %"]


def profile_rows(profile: Profile) -> list[list[str]]:
    total = max(profile.samples, 1)
    return [
        [
            str(i),
            f"`{row.function}`",
            row.file,
            str(row.own),
            f"{100 * row.own / total:.1f}",
            f"{100 * row.total / total:.1f}",
        ]
        for i, row in enumerate(profile.rows, 1)
    ]
