"""Fresh venvs, each holding kipside's wheel with one extra (or none), as a user installs it.

    venvs = FreshVenvs(wheel, root)     # one install per extra, all started at once
    base = venvs.get("")                # waits for that one; also "pcap", "pipeline"
    subprocess.run([base.kipside, "--help"], env=base.env())

Each venv is `python -m venv` with exactly the wheel and the extra's pins in it, nothing of the
dev venv. pip itself is not put inside: the dev venv's pip installs into it (`pip --python`),
reading the same configuration, indexes and cache that a user's `pip install` here reads.
`--no-compile`: bytecode is written on first import instead of for every module at install,
which makes the installs about three times faster and changes nothing that runs.

`env()` is the environment a user has: nothing of the dev venv on PATH or in PYTHONPATH, no
PYSPARK_PYTHON, bytecode written as Python does by default; `activated=True` puts the venv's
bin/ first on PATH as `bin/activate` does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EXTRAS", "INSTALL_TIMEOUT", "FreshVenv", "FreshVenvs"]

EXTRAS = ("", "pcap", "pipeline")
"""What a user installs alone: the sidecar (no extra), and each user-facing extra."""
INSTALL_TIMEOUT = 600.0
# What would make a venv run other than a user's: modules from elsewhere, another Python for
# Spark's workers, and no bytecode ever written (the venvs are installed without it, so every
# Python process Spark starts would compile every module it imports again).
_LEAKS = (
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONDONTWRITEBYTECODE",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "SPARK_HOME",
)


@dataclass(frozen=True)
class FreshVenv:
    extra: str
    """"" for kipside alone."""
    path: Path
    seconds: float
    """How long the install took."""

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def kipside(self) -> Path:
        return self.path / "bin" / "kipside"

    @property
    def requirement(self) -> str:
        return f"kipside[{self.extra}]" if self.extra else "kipside"

    def env(self, *, activated: bool = False) -> dict[str, str]:
        """This process's environment without the dev venv; `activated`: as after
        `source bin/activate`."""
        env = {k: v for k, v in os.environ.items() if k not in _LEAKS}
        dev = Path(sys.prefix)
        path = [p for p in env.get("PATH", "").split(os.pathsep) if p and not _inside(p, dev)]
        env.pop("VIRTUAL_ENV", None)
        if activated:
            path.insert(0, str(self.path / "bin"))
            env["VIRTUAL_ENV"] = str(self.path)
        env["PATH"] = os.pathsep.join(path)
        return env


def _inside(entry: str, folder: Path) -> bool:
    return Path(entry).resolve().is_relative_to(folder.resolve())


def install(wheel: Path, extra: str, path: Path) -> FreshVenv:
    """A new venv at `path` holding `wheel` with `extra` ("" for none) and its dependencies."""
    started = time.monotonic()
    _run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    target = f"{wheel}[{extra}]" if extra else str(wheel)
    pip = [sys.executable, "-m", "pip", "--python", str(path / "bin" / "python"), "install"]
    _run([*pip, "--quiet", "--no-compile", target])
    return FreshVenv(extra, path, time.monotonic() - started)


def _run(args: list[str]) -> None:
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args)} exited {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )


class FreshVenvs:
    """One fresh venv per extra of EXTRAS under `root`, installed concurrently from `wheel`.
    They stay where they are (about 1.2 GB together) for pytest's own clean-up of old temporary
    folders: removing them costs tens of seconds of a busy disk."""

    def __init__(self, wheel: Path, root: Path) -> None:
        self._pool = ThreadPoolExecutor(max_workers=len(EXTRAS), thread_name_prefix="venv")
        self._installs: dict[str, Future[FreshVenv]] = {
            extra: self._pool.submit(install, wheel, extra, root / (extra or "base"))
            for extra in EXTRAS
        }

    def get(self, extra: str) -> FreshVenv:
        """The venv of `extra` ("" for none), once installed; its install's error otherwise."""
        return self._installs[extra].result(timeout=INSTALL_TIMEOUT)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
