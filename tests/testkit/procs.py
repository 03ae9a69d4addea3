"""The child processes started by a harness, so that one watchdog or exit hook can kill them all.

Processes are only ever added; `kill_all()` kills those still running and never waits on them.
"""

from __future__ import annotations

import subprocess
from typing import Any

_STARTED: list[subprocess.Popen[Any]] = []


def track(proc: subprocess.Popen[Any]) -> subprocess.Popen[Any]:
    """Remember `proc` for kill_all(); returns it unchanged."""
    _STARTED.append(proc)
    return proc


def kill_all() -> None:
    """SIGKILL every tracked process that is still running (a backstop, not a clean stop)."""
    for proc in _STARTED:
        if proc.poll() is None:
            proc.kill()


def stop(proc: subprocess.Popen[Any], timeout: float = 5.0) -> int:
    """SIGTERM, then SIGKILL after `timeout` s; returns the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
    return proc.returncode
